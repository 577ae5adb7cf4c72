/*
 * What the fuzz targets share: the libFuzzer entry point each fuzz_<name>.c defines (also
 * driven by replay.c for corpus replay without libFuzzer) and an in-memory file to hand an
 * input to the path-based loaders.
 */
#ifndef KVT_FUZZ_H
#define KVT_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/** Run one input; returns 0. Defined once per target. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/**
 * Make the process's in-memory file (created on first use) hold exactly @p data and return a
 * path that opens it ("/proc/self/fd/N"). The path stays valid for the life of the process;
 * each call replaces the contents. Returns NULL (with errno) when the file cannot be set up.
 */
const char *fuzz_memfile(const uint8_t *data, size_t size);

/** Stop the run: a property that must hold for every input did not (the fuzzer reports it). */
void fuzz_fail(const char *what) __attribute__((noreturn));

#endif
