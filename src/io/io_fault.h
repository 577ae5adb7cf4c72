/*
 * A fault-injecting io backend for tests and the reliability suite. It forwards every call to
 * the POSIX backend and counts it; armed rules make the Nth matching call fail with a chosen
 * errno (ENOSPC, EIO, ...) or transfer fewer bytes than asked (short reads and writes), and an
 * optional hook sees every call first (crash points: the hook may _exit()).
 *
 * Two tables: kvt_io_fault() makes the streams take the plain path (pread/pwrite one after
 * the other); kvt_io_fault_fast() keeps the fast path — the O_DIRECT descriptor (a reopen,
 * counted and failed as an open) and the asynchronous queue (io_uring or threads), whose
 * requests are counted and failed as preads and pwrites: a failed request completes with the
 * error, a short one completes short (at least 512 bytes, as a direct transfer stops).
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
    KVT_FAULT_STAT,    /* stat by name (not part of ANY: armed by name only) */
    KVT_FAULT_UTIMES,  /* setting a file's times (idem) */
    KVT_FAULT_LISTDIR, /* listing a directory (idem) */
    KVT_FAULT_ANY,     /* in a rule: every op above but close and the three lookups; as a counter:
                          those calls */
    KVT_FAULT_OP_COUNT
};

struct kvt_fault_rule {
    enum kvt_fault_op op;
    uint64_t nth;     /* 1-based index among the matching calls made after arming; 0 = off */
    int err;          /* positive errno the call returns (as -err) */
    bool sticky;      /* fail every later matching call as well (a disk that stays full) */
    size_t short_max; /* pread/pwrite: instead of failing, move at most this many bytes (> 0) */
};

/** The backend over the plain path; install it with kvt_io_set(kvt_io_fault()). */
const struct kvt_io *kvt_io_fault(void);
/** The backend over the fast path (O_DIRECT descriptors and the asynchronous queue). */
const struct kvt_io *kvt_io_fault_fast(void);

/** Remove every rule and the hook, and zero all counters. */
void kvt_fault_reset(void);
/** Add a rule (at most 16 at a time); its count starts now. @return 0 or -EINVAL / -ENOSPC. */
int kvt_fault_arm(const struct kvt_fault_rule *rule);
/** Remove every rule; counters and the hook stay. */
void kvt_fault_disarm(void);
/** Calls of @p op seen since the last reset (KVT_FAULT_ANY: the calls a rule of it matches). */
uint64_t kvt_fault_calls(enum kvt_fault_op op);
/** Failures and short transfers injected since the last reset. */
uint64_t kvt_fault_injected(void);
/** Of those, the ones injected into requests of an asynchronous queue. */
uint64_t kvt_fault_injected_async(void);

/**
 * Called before every operation with its kind, its 1-based count since the last reset and the
 * path for name operations (NULL for descriptor operations). A positive return value fails
 * the call with that errno; 0 lets it proceed.
 */
typedef int (*kvt_fault_hook_fn)(void *ud, enum kvt_fault_op op, uint64_t count, const char *path);
void kvt_fault_set_hook(kvt_fault_hook_fn hook, void *ud);

/* Between the backend's two files (io_fault.c, fault_aq.c): count and decide one call, as
 * the rules and the hook say (@p async: a request of an asynchronous queue); and the
 * backend's aq_open, which wraps a queue of the OS engines. */
int kvt_fault_decide(enum kvt_fault_op op, const char *path, size_t *limit, bool async);
struct kvt_aq;
int kvt_fault_aq_open(struct kvt_aq *q, unsigned depth, const char *engine);

/** "open", "pwrite", "dir-fsync", "any", ... */
const char *kvt_fault_op_name(enum kvt_fault_op op);
/** The op named @p name (as kvt_fault_op_name() spells it), or -1. */
int kvt_fault_op_from_name(const char *name);

#endif
