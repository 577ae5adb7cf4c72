/*
 * A fault-injecting io backend for tests and the reliability suite. It forwards every call to
 * the POSIX backend and counts it; armed rules make the Nth matching call fail with a chosen
 * errno (ENOSPC, EIO, ...) or transfer fewer bytes than asked (short reads and writes), and an
 * optional hook sees every call first (crash points: the hook may _exit()).
 *
 * Use: kvt_fault_reset(); kvt_fault_arm(&rule); kvt_io_set(kvt_io_fault()); ... run the code
 * under test ...; kvt_io_set(NULL). All functions are thread-safe.
 */
#ifndef KVT_IO_FAULT_H
#define KVT_IO_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/io.h"

enum kvt_fault_op {
    KVT_FAULT_OPEN = 0,
    KVT_FAULT_CLOSE, /* counted, never failed (the descriptor is always released) */
    KVT_FAULT_PREAD,
    KVT_FAULT_PWRITE,
    KVT_FAULT_FSYNC,     /* fsync of a descriptor not opened with O_DIRECTORY */
    KVT_FAULT_DIR_FSYNC, /* fsync of a descriptor opened with O_DIRECTORY */
    KVT_FAULT_FTRUNCATE,
    KVT_FAULT_FSTAT,
    KVT_FAULT_RENAME,
    KVT_FAULT_UNLINK,
    KVT_FAULT_MKDIR,
    KVT_FAULT_FLOCK,
    KVT_FAULT_FADVISE,
    KVT_FAULT_FALLOCATE,
    KVT_FAULT_ANY, /* in a rule: every op except close; as a counter: all calls but close */
    KVT_FAULT_OP_COUNT
};

struct kvt_fault_rule {
    enum kvt_fault_op op;
    uint64_t nth;     /* 1-based index among the matching calls made after arming; 0 = off */
    int err;          /* positive errno the call returns (as -err) */
    bool sticky;      /* fail every later matching call as well (a disk that stays full) */
    size_t short_max; /* pread/pwrite: instead of failing, move at most this many bytes (> 0) */
};

/** The backend; install it with kvt_io_set(kvt_io_fault()). */
const struct kvt_io *kvt_io_fault(void);

/** Remove every rule and the hook, and zero all counters. */
void kvt_fault_reset(void);
/** Add a rule (at most 16 at a time); its count starts now. @return 0 or -EINVAL / -ENOSPC. */
int kvt_fault_arm(const struct kvt_fault_rule *rule);
/** Remove every rule; counters and the hook stay. */
void kvt_fault_disarm(void);
/** Calls of @p op seen since the last reset (KVT_FAULT_ANY: all calls except close). */
uint64_t kvt_fault_calls(enum kvt_fault_op op);
/** Failures and short transfers injected since the last reset. */
uint64_t kvt_fault_injected(void);

/**
 * Called before every operation with its kind, its 1-based count since the last reset and the
 * path for name operations (NULL for descriptor operations). A positive return value fails
 * the call with that errno; 0 lets it proceed.
 */
typedef int (*kvt_fault_hook_fn)(void *ud, enum kvt_fault_op op, uint64_t count, const char *path);
void kvt_fault_set_hook(kvt_fault_hook_fn hook, void *ud);

/** "open", "pwrite", "dir-fsync", "any", ... */
const char *kvt_fault_op_name(enum kvt_fault_op op);
/** The op named @p name (as kvt_fault_op_name() spells it), or -1. */
int kvt_fault_op_from_name(const char *name);

#endif
