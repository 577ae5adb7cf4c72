/*
 * Helpers shared by the test suites: paths of test data, scratch directories, whole-file
 * reads, and deterministic pseudo-random bytes.
 */
#ifndef KVT_TEST_SUPPORT_H
#define KVT_TEST_SUPPORT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs these before its header */
#include <setjmp.h>
#include <cmocka.h>

#include "kvtier.h"

/** "<tests>/golden/<name>" in a static buffer (valid until the next call). */
const char *golden_path(const char *name);
/** A fresh empty directory under the suite's scratch dir; caller frees. */
char *scratch_dir(const char *tag);
/** The directory test_dir_setup() makes and test_dir_teardown() removes. */
extern char *test_dir;
/** cmocka setup (group or test): a fresh scratch directory in test_dir. */
int test_dir_setup(void **state);
/** cmocka teardown: remove test_dir and everything in it. */
int test_dir_teardown(void **state);
/** Read a whole file; *n receives its size. Caller frees. NULL on error. */
uint8_t *read_file(const char *path, size_t *n);
/** Write a whole file. 0 or -errno. */
int write_file(const char *path, const void *data, size_t n);
/** Parse a JSON file with jansson (json_t *, returned as void * to keep jansson optional). */
void *load_json(const char *path);
/** xorshift64* stream as the golden files use (golden/README.md). */
uint64_t xs64(uint64_t *state);
void fill_random(void *dst, size_t n, uint64_t *state);
/** The VmFlags line of /proc/self/smaps for the mapping holding @p p ("" if not found). */
void vma_flags(const void *p, char *out, size_t n);
/** Remove a directory tree (best effort). */
void rm_rf(const char *path);
/**
 * Run the built CLI with @p args (shell-quoted) and return its exit status; its stdout (and
 * stderr with @p with_stderr) goes to *out unless @p out is NULL (caller frees).
 */
int run_cli(const char *args, bool with_stderr, char **out);
/** Run the shell command @p cmd; its standard output goes to *@p out (NUL-terminated, malloc'd)
 * unless @p out is NULL. Returns the exit status (-1 when killed by a signal). */
int run_capture(const char *cmd, char **out);
/** printf into a malloc'd string. */
char *strf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/** A new tensor of @p dtype, rank @p rank and @p shape, filled from the xs64 stream @p rng. */
void synth_random_tensor(struct kvt_tensor *t, int dtype, int rank, const int64_t *shape,
                         uint64_t *rng);
/** A kv cache of @p rows rows: [1, @p heads, rows, @p dim] @p dtype keys, then values, filled
 * from @p rng and appended to a new cache (so it has restore capacity, as after a prefill). */
kvt_cache *synth_random_kv(int dtype, int64_t heads, int64_t rows, int64_t dim, uint64_t *rng);
/** Whether caches @p a and @p b hold the same state tensors (count, size and bytes). */
bool synth_same_state(const kvt_cache *a, const kvt_cache *b);
/** A library-owned entry of two [1, 4, n, 96] float16 kv layers and an ssm layer, random bytes
 * from @p seed, with the given identity (ns ""). */
struct kvt_entry *synth_random_entry(const int32_t *tok, size_t n, uint64_t seed, const char *model,
                                     const char *fp, const char *tok_hash);
/** The bytes of every persisted tensor of @p e in slot order (malloc'd; *@p total their count). */
uint8_t *synth_entry_bytes(const struct kvt_entry *e, size_t *total);
/** Whether entries @p a and @p b persist the same tensor bytes (synth_entry_bytes()). */
bool synth_same_entry_bytes(const struct kvt_entry *a, const struct kvt_entry *b);
/** XOR byte @p at of slot @p sj of cache @p ci of the file at @p path with @p mask, in place
 * (a corruption the slot's hash must catch). */
void flip_slot_byte(const char *path, size_t ci, int sj, uint64_t at, uint8_t mask);

/** Whether a load with hash checks protects byte @p off of a file with header @p h: the
 * prefix, the JSON and every slot's bytes (a flip there must make the load fail). */
bool loader_checks_byte(const struct kvt_header *h, uint64_t off);

/** Device allocations wrapped by synth_device_buf() and not yet released. */
extern int synth_device_live;
/** The release argument of device memory at @p addr (counted in synth_device_live). */
void *synth_device_hold(kvt_device *d, uint64_t addr);
/** Frees the allocation held by @p ud (a kvt_release_fn for synth_device_hold()). */
void synth_device_release(void *ud, void *data);
/** @p n bytes of device memory at @p addr, wrapped; the buffer's release frees them. */
kvt_buf *synth_device_buf(kvt_device *d, uint64_t addr, size_t n);
/** @p e copied into device memory of @p d (every state tensor its own allocation), with the
 * identity @p model, @p fp, @p tok_hash. */
struct kvt_entry *synth_device_twin(kvt_device *d, const struct kvt_entry *e, const char *model,
                                    const char *fp, const char *tok_hash);

/** kvt_store_opts_init(@p o) and the identity @p model, @p fp, @p tok. */
void store_opts_for(struct kvt_store_opts *o, const char *model, const char *fp, const char *tok);

/** kvt_mem_configure() with these switches and every other setting at its default. */
void set_mem(bool no_hugepages, bool no_parallel);

/* Memory settings that differ from the process's current ones (the buffer cache limit and the
 * O_DIRECT switch), so that a test sees whether an open applied them. */
struct mem_probe {
    size_t limit;
    bool direct;
    struct kvt_mem_opts m;
};
/** Note the process's settings and fill @p p->m with others. */
void mem_probe_init(struct mem_probe *p);
/** Assert that the process has @p p->m's settings (@p applied; they are then reset to the
 * defaults) or still those of mem_probe_init(). */
void mem_probe_check(const struct mem_probe *p, bool applied);

#endif
