/*
 * kvtier — a persistent prompt cache for LLM inference engines.
 *
 * Saves the KV/SSM state of prompts to disk crash-safely in the `.mlxkv` v3 format,
 * finds the longest cached prefix of a new prompt, and restores it at device speed.
 *
 * Caveats
 *  - Returns: every `int` function returns 0 on success, `-errno` for an OS failure,
 *    or a negative KVT_E_* code. Out-params are set to NULL (or zeroed) on failure.
 *    Destructors accept NULL. A failing call leaves a message for the calling thread
 *    in kvt_last_error(); the library itself never prints.
 *  - Threads: value objects (tensors, caches, entries) are not locked: one thread at a
 *    time per object. Buffer refcounts are atomic, so objects that share buffers may
 *    live on different threads. kvt_store and kvt_pcache are safe from any thread.
 *  - Files on disk are untrusted: every header is validated before anything it sizes is
 *    allocated; tensor hashes are checked during the restore copy unless turned off.
 *  - A store directory must be on a local filesystem (advisory locks guard writers).
 */
#ifndef KVTIER_H
#define KVTIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KVT_API __attribute__((visibility("default")))
#define KVT_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define KVT_API
#define KVT_PRINTF(f, a)
#endif

#define KVT_VERSION_MAJOR 0
#define KVT_VERSION_MINOR 1
#define KVT_VERSION_PATCH 0

/** The library's version, "MAJOR.MINOR.PATCH", of the library linked (not the header). */
KVT_API const char *kvt_version(void);

/* ------------------------------------------------------------------------------------------
 * Errors. Library codes are stable and never renumbered; they lie below -1000 so they never
 * collide with -errno.
 */
#define KVT_E_FORMAT (-1001)      /* not an .mlxkv file (unknown magic) */
#define KVT_E_CORRUPT (-1002)     /* integrity or structural failure */
#define KVT_E_MISMATCH (-1003)    /* intact, but for another model/tokenizer/ns/layout */
#define KVT_E_UNSUPPORTED (-1004) /* other format version, kind, dtype or feature */
#define KVT_E_TOO_LARGE (-1005)   /* the entry exceeds a configured byte cap */
#define KVT_E_STATE (-1006)       /* operation not allowed in the object's state */
#define KVT_E_REFUSED (-1007)     /* the engine's exclusion callback refused a step */
#define KVT_E_TIMEOUT (-1008)     /* a bounded wait ran out */

/** A static description of @p code (any value); never NULL. */
KVT_API const char *kvt_strerror(int code);

/**
 * The message of the last failed call on this thread: what failed and where (file, offset,
 * field, check ID). Never NULL ("" when none). Valid until the next kvtier call on this thread.
 */
KVT_API const char *kvt_last_error(void);

/**
 * Set this thread's kvt_last_error() message (printf format) and return @p code: for
 * adapters built on the library (the llama.cpp integration), so that their callers read
 * every failure in one place.
 */
KVT_API int kvt_set_error(int code, const char *fmt, ...) KVT_PRINTF(2, 3);

/** Diagnostics sink: @p level is one of KVT_LOG_*; @p msg is valid only during the call. */
enum { KVT_LOG_DEBUG = 0, KVT_LOG_INFO = 1, KVT_LOG_WARN = 2, KVT_LOG_ERROR = 3 };
typedef void (*kvt_log_fn)(void *ud, int level, const char *msg);

/* ------------------------------------------------------------------------------------------
 * Hash: Wyhash exactly as Zig std.hash.Wyhash (the reference's Bun.hash).
 */
KVT_API uint64_t kvt_wyhash(uint64_t seed, const void *data, size_t len);

/**
 * Streaming form; gives the same value as kvt_wyhash() over the concatenated input, however it
 * is split into updates. The state is a plain value the caller owns (no allocation, nothing to
 * free); one thread at a time per state.
 */
struct kvt_wyhash_state {
    uint64_t s[3];
    uint64_t total;
    uint8_t buf[48];
    uint8_t last[16]; /* the 16 bytes before buf, once a block has been consumed */
    size_t nbuf;
};
/** Start hashing with @p seed (kvtier's files use seed 0). */
KVT_API void kvt_wyhash_init(struct kvt_wyhash_state *st, uint64_t seed);
/** Add the @p len bytes at @p data. */
KVT_API void kvt_wyhash_update(struct kvt_wyhash_state *st, const void *data, size_t len);
/** The hash of everything added so far; leaves @p st unchanged, so updates may continue. */
KVT_API uint64_t kvt_wyhash_final(const struct kvt_wyhash_state *st);

/* ------------------------------------------------------------------------------------------
 * Tensors: dtypes with mlx-c codes, refcounted buffers, strided views.
 */
enum kvt_dtype {
    KVT_BOOL = 0,
    KVT_UINT8 = 1,
    KVT_UINT16 = 2,
    KVT_UINT32 = 3,
    KVT_UINT64 = 4,
    KVT_INT8 = 5,
    KVT_INT16 = 6,
    KVT_INT32 = 7,
    KVT_INT64 = 8,
    KVT_FLOAT16 = 9,
    KVT_FLOAT32 = 10,
    KVT_FLOAT64 = 11,
    KVT_BFLOAT16 = 12,
    KVT_COMPLEX64 = 13,
};
#define KVT_DTYPE_COUNT 14

/** Item size in bytes of @p dtype, or 0 for an unknown code. */
KVT_API size_t kvt_dtype_size(int dtype);
/** Whether @p dtype is float16, float32 or bfloat16. */
KVT_API bool kvt_dtype_is_activation(int dtype);
/** "bfloat16", "float16", …; "unknown" for an unknown code. */
KVT_API const char *kvt_dtype_name(int dtype);

/**
 * A refcounted byte buffer: host memory owned by the library, or engine memory wrapped with a
 * release callback. Holders treat the bytes as immutable while another holder may see them
 * (CACHES.md §13); the cache layer copies before writing into shared regions.
 */
typedef struct kvt_buf kvt_buf;
typedef void (*kvt_release_fn)(void *ud, void *data);

/** A new zero-filled host buffer of @p bytes (64-byte aligned, page aligned from 64 KiB on;
 * from 1 MiB on a mapping of its own, possibly a cleared one from the buffer cache, and from
 * 2 MiB on 2 MiB aligned, with transparent huge pages asked for unless
 * kvt_mem_opts.no_hugepages is set; 0 bytes is allowed). The caller holds the one reference
 * (kvt_buf_unref()). @return 0, -EINVAL (@p out NULL) or -ENOMEM. Any thread. */
KVT_API int kvt_buf_new(size_t bytes, kvt_buf **out);
/** A new host buffer of @p bytes whose contents are unspecified (for immediate overwrite). From
 * 1 MiB on it may come from the buffer cache (below). Returns and errors as kvt_buf_new(). */
KVT_API int kvt_buf_new_uninit(size_t bytes, kvt_buf **out);
/**
 * The buffer cache: host buffers of 1 MiB and more are kept when their last reference drops,
 * up to a limit in bytes, and handed out again by kvt_buf_new_uninit() (restores allocate their
 * tensors with it) and, cleared, by kvt_buf_new(). A restore that follows an eviction then
 * reads into memory the process already holds instead of faulting in and zeroing fresh pages;
 * a request that no kept buffer fits first gives back as much of the longest-kept memory, so
 * that the fresh mapping reuses it (PERFORMANCE.md). The default limit is an eighth of
 * physical memory, at most 8 GiB (struct kvt_mem_opts sets another). Sets the limit to
 * @p bytes, unmapping the longest-kept buffers beyond it (0: keep none and release all), and
 * returns the previous one.
 */
KVT_API size_t kvt_buf_cache_limit(size_t bytes);
/** Bytes the buffer cache holds now (memory the process keeps for later buffers). */
KVT_API size_t kvt_buf_cache_bytes(void);
/**
 * The memory and I/O settings of the process, one set for the buffer cache above, huge pages,
 * the helper threads of restores and saves and the read path. Zero (kvt_mem_opts_init()) is
 * the default everywhere. They apply to every later call of the process: set them with
 * kvt_mem_configure(), or through the `mem` member of struct kvt_store_opts (a prompt
 * cache's `cold` among them) once an open succeeds. The library reads no environment
 * variable (the kvtier CLI maps its KVT_* variables onto these).
 *
 * Threads: a restore of a large entry may start one helper thread (faulting destination pages
 * in and hashing ahead; no_helper turns it off), its reads a few I/O threads (when io_uring
 * is not used), a warm restore up to 4 threads copying slots at once (no_parallel turns it
 * off), and kvt_store_open() a few threads reading headers. All of them end before the call
 * that started them returns and run on helper_cpus when it is set.
 */
struct kvt_mem_opts {
    int64_t buf_cache_bytes; /* buffer cache limit: 0 = leave it (the default, or what
                                kvt_buf_cache_limit() set), < 0 = keep nothing */
    bool no_hugepages;       /* no huge pages for large buffers and the streams' staging */
    bool no_helper;          /* no restore helper thread */
    bool no_parallel;        /* warm restores one slot at a time */
    bool no_direct;          /* no O_DIRECT: reads and writes through the page cache */
    const char *io_engine;   /* reads: "io_uring", "threads", or NULL = the best available */
    const char *helper_cpus; /* CPU list ("2-7,12") for the helper threads; NULL = the caller's */
};

/** Fill @p o with the defaults (all zero). */
KVT_API void kvt_mem_opts_init(struct kvt_mem_opts *o);
/**
 * Apply @p o to the process (NULL: the defaults). @return 0, or -EINVAL (an unknown engine, a
 * bad CPU list; nothing changed).
 * Threads: safe from any thread; calls already running keep the settings they started with.
 */
KVT_API int kvt_mem_configure(const struct kvt_mem_opts *o);

/**
 * Wrap engine memory without copying. @p release (may be NULL) runs exactly once, on the thread
 * that drops the last reference, including when this call itself fails (-ENOMEM, -EINVAL).
 * Caches never write into wrapped memory: a cache built over it copies on its first write.
 */
KVT_API int kvt_buf_wrap(void *data, size_t bytes, kvt_release_fn release, void *ud, kvt_buf **out);
/** Take another reference; returns @p b. */
KVT_API kvt_buf *kvt_buf_ref(kvt_buf *b);
/** Drop a reference; the last one frees the buffer (or calls its release). */
KVT_API void kvt_buf_unref(kvt_buf *b);
/** The buffer's bytes, borrowed: valid while the caller holds a reference. NULL for NULL and
 * for device memory (kvt_buf_wrap_device()), which host code cannot address. */
KVT_API void *kvt_buf_data(const kvt_buf *b);
/** The buffer's size in bytes as created or wrapped; 0 for NULL. */
KVT_API size_t kvt_buf_size(const kvt_buf *b);
/** Current number of references (for tests and diagnostics; racy by nature). */
KVT_API int kvt_buf_refcount(const kvt_buf *b);

#define KVT_MAX_RANK 8

/**
 * A strided view of a buffer. The struct holds one reference on @p buf when it is "owned"
 * (returned by the library); release it with kvt_tensor_release(). Strides are in elements.
 */
struct kvt_tensor {
    kvt_buf *buf;
    size_t offset; /* byte offset of element [0, …, 0] within buf */
    int dtype;
    int rank;
    int64_t shape[KVT_MAX_RANK];
    int64_t strides[KVT_MAX_RANK];
};

/**
 * Describe a C-contiguous tensor of @p shape over @p buf at byte @p offset; takes a new
 * reference on @p buf. Fails with -EINVAL if the view does not fit in the buffer.
 */
KVT_API int kvt_tensor_init(struct kvt_tensor *t, kvt_buf *buf, size_t offset, int dtype, int rank,
                            const int64_t *shape);
/** A new zero-filled contiguous tensor of its own buffer; @p t owns it (kvt_tensor_release()).
 * @return 0, -EINVAL (NULL @p t, rank outside 0-8, unknown dtype, a size that overflows) or
 * -ENOMEM; on failure @p t is cleared. */
KVT_API int kvt_tensor_zeros(struct kvt_tensor *t, int dtype, int rank, const int64_t *shape);
/** Drop the reference held by @p t and clear it. */
KVT_API void kvt_tensor_release(struct kvt_tensor *t);
/** A second owned view of the same bytes (takes a reference). */
KVT_API void kvt_tensor_share(struct kvt_tensor *dst, const struct kvt_tensor *src);
/** Number of elements (the product of the shape; 1 for rank 0, 0 for NULL). */
KVT_API size_t kvt_tensor_numel(const struct kvt_tensor *t);
/** Bytes of the elements, numel × item size (0 for NULL or an unknown dtype); what
 * kvt_tensor_copy_out() writes, not the span of a strided view in its buffer. */
KVT_API size_t kvt_tensor_nbytes(const struct kvt_tensor *t);
/** Whether the strides are row-major with no gaps (axes of size 1 and empty tensors count as
 * contiguous); false for NULL. */
KVT_API bool kvt_tensor_is_contiguous(const struct kvt_tensor *t);
/** An owned view of rows [start, end) along @p axis of @p src, sharing its bytes (takes a
 * reference; @p dst may be @p src). @return 0 or -EINVAL (a bad axis or range; @p dst cleared
 * unless it is @p src). */
KVT_API int kvt_tensor_slice(struct kvt_tensor *dst, const struct kvt_tensor *src, int axis,
                             int64_t start, int64_t end);
/** Copy the elements of @p src in row-major order into @p dst (kvt_tensor_nbytes() bytes). */
KVT_API void kvt_tensor_copy_out(const struct kvt_tensor *src, void *dst);
/** A new contiguous owned copy of @p src in a buffer of its own. @return 0, -EINVAL or
 * -ENOMEM. */
KVT_API int kvt_tensor_contiguous(struct kvt_tensor *dst, const struct kvt_tensor *src);

/* ------------------------------------------------------------------------------------------
 * Caches: one per donor layer, six kinds (CACHES.md). Quantization math is the engine's: the
 * library moves already-quantized rows verbatim.
 */
enum kvt_kind {
    KVT_KIND_KV = 0,
    KVT_KIND_ROTATING = 1,
    KVT_KIND_QKV = 2,
    KVT_KIND_ROTATING_QKV = 3,
    KVT_KIND_SSM = 4,
    KVT_KIND_TURBOQUANT = 5,
};
#define KVT_KIND_COUNT 6
#define KVT_STEP 256
#define KVT_MAX_CACHE_TENSORS 6

/** "kv", "rotating", "qkv", "rotating-qkv", "ssm", "turboquant"; NULL for unknown. */
KVT_API const char *kvt_kind_name(int kind);
/** The kind named @p name, or -1. */
KVT_API int kvt_kind_from_name(const char *name);
/** Tensors a cache of @p kind persists (2, 2, 6, 6, 2, 5), or 0. */
KVT_API int kvt_kind_tensor_count(int kind);
/**
 * Trimmability from scalars alone (CACHES.md §9), the one rule used for live caches and for
 * headers: kv/qkv/turboquant always, rings iff offset < max_size, ssm never.
 */
KVT_API bool kvt_kind_is_trimmable(int kind, int64_t offset, int64_t max_size);

/** Scalars of a cache; fields that a kind does not have are 0. */
struct kvt_cache_info {
    int kind;
    int64_t offset;     /* tokens covered (rings: tokens ever seen) */
    int64_t idx;        /* rings: next write slot */
    int64_t max_size;   /* rings: window size */
    int64_t group_size; /* qkv kinds */
    int64_t bits;       /* qkv kinds */
    int64_t k_bits;     /* turboquant */
    int64_t v_bits;     /* turboquant */
    int64_t head_dim;   /* turboquant (0 until the first append) */
};

typedef struct kvt_cache kvt_cache;

/**
 * A new empty cache. @p params gives the kind and its fixed parameters (max_size for rings,
 * group_size/bits for qkv kinds, k_bits/v_bits for turboquant); offset/idx are ignored.
 * @return 0, -EINVAL (bad kind or parameter) or -ENOMEM.
 */
KVT_API int kvt_cache_new(const struct kvt_cache_info *params, kvt_cache **out);

/**
 * Build a cache that takes new references on @p t (the kind's tensors in FORMAT.md §5 order,
 * @p nt of them) and the scalars of @p info, as a restore does. For token-axis kinds the
 * tensors may carry capacity beyond the live rows (axis 2 > offset); for rings they are the
 * whole ring. Validates counts, ranks, dtypes and shapes (-EINVAL).
 */
KVT_API int kvt_cache_from_state(const struct kvt_cache_info *info, const struct kvt_tensor *t,
                                 int nt, kvt_cache **out);
/** Free @p c and drop its references on its buffers (NULL allowed); clones and tensors that
 * share those buffers stay valid. */
KVT_API void kvt_cache_free(kvt_cache *c);

/**
 * Append L = in[0].shape[2] tokens: @p in holds the kind's tensors in FORMAT.md §5 order, each
 * [B, H, L, ·] (already quantized for qkv kinds and turboquant). Growth follows CACHES.md §2
 * (STEP 256) and §4 (rings). Bytes are copied; the caller keeps its tensors.
 * For ssm use kvt_cache_ssm_update(). @return 0, -EINVAL (shape/dtype), KVT_E_STATE, -ENOMEM.
 */
KVT_API int kvt_cache_append(kvt_cache *c, const struct kvt_tensor *in, int nin);
/** ssm: replace conv and recurrent (copied; the caller keeps its tensors) and advance offset by
 * @p n_tokens. @return 0, -EINVAL (not an ssm cache, NULL or ill-shaped tensors, a negative
 * count), KVT_E_UNSUPPORTED (device memory) or -ENOMEM; the cache is unchanged on failure. */
KVT_API int kvt_cache_ssm_update(kvt_cache *c, const struct kvt_tensor *conv,
                                 const struct kvt_tensor *recurrent, int64_t n_tokens);
/**
 * The window attention reads after the last append (CACHES.md §2 step 3, §4 step 5): owned
 * views into @p out (kind's tensor count entries); ssm: conv and recurrent.
 * @return the count, or KVT_E_STATE for an empty cache.
 */
KVT_API int kvt_cache_window(const kvt_cache *c, struct kvt_tensor *out);
/** Drop the last @p n tokens. KVT_E_STATE when n > 0 and the cache is not trimmable. */
KVT_API int kvt_cache_trim(kvt_cache *c, int64_t n);
/** Whether kvt_cache_trim() with n > 0 would succeed now (CACHES.md §9); false for NULL. */
KVT_API bool kvt_cache_is_trimmable(const kvt_cache *c);
/** Copy the cache's kind and scalars into @p info (all zero for a NULL cache; NULL @p info:
 * nothing). */
KVT_API void kvt_cache_get_info(const kvt_cache *c, struct kvt_cache_info *info);
/** Tokens the cache covers (rings: tokens ever appended); 0 for NULL. */
KVT_API int64_t kvt_cache_offset(const kvt_cache *c);
/** Sum of state bytes (kv kinds: the full capacity buffers; clones: the region referenced). */
KVT_API size_t kvt_cache_bytes(const kvt_cache *c);
/** Rows allocated on the token axis (capacity), or 0 for ssm / an empty cache. */
KVT_API int64_t kvt_cache_capacity(const kvt_cache *c);
/**
 * What is persisted (CACHES.md §10): owned views into @p out — rows [0, offset) for kv, qkv,
 * turboquant; whole buffers for rings and ssm. @return the count, or KVT_E_STATE for an empty
 * cache ("cannot persist an empty cache").
 */
KVT_API int kvt_cache_state(const kvt_cache *c, struct kvt_tensor *out);
/**
 * A clone sharing the donor's bytes, immune to later writes to either (CACHES.md §13). The
 * caller owns *@p out (kvt_cache_free()); donor and clone may then live on different threads.
 * @return 0, -EINVAL, KVT_E_STATE (an empty cache: "cannot clone an empty cache") or -ENOMEM.
 */
KVT_API int kvt_cache_clone(const kvt_cache *c, kvt_cache **out);

/* ------------------------------------------------------------------------------------------
 * Entries and files (.mlxkv v3, FORMAT.md).
 */

/** Identity metadata; NULL = absent. */
struct kvt_meta {
    const char *model_id;
    const char *config_fingerprint;
    const char *tokenizer_hash;
    const char *ns;
};

/**
 * One cache entry: the exact token prefix and one cache per donor layer. An entry returned by
 * the library owns everything it points to; free it with kvt_entry_free(). A caller may also
 * fill one on the stack to save borrowed caches.
 */
struct kvt_entry {
    int32_t *tokens;
    size_t n_tokens;
    kvt_cache **caches;
    size_t n_caches;
    struct kvt_meta meta; /* owned copies in library-made entries */
    int64_t created_at;   /* ms since the epoch; -1 when the header had none */
};

/**
 * A library-owned entry: copies @p tok and @p ns, takes ownership of @p caches' objects.
 * On failure (-EINVAL, -ENOMEM) the caches stay the caller's. meta other than ns is NULL and
 * created_at is -1; the caller may set them (owned, malloc'd strings).
 */
KVT_API int kvt_entry_new(const int32_t *tok, size_t n, kvt_cache *const *caches, size_t n_caches,
                          const char *ns, struct kvt_entry **out);
/** Free a library-made entry and everything it owns. */
KVT_API void kvt_entry_free(struct kvt_entry *e);
/** Clone every cache of @p e into a new library-owned entry (tokens and meta copied; free it
 * with kvt_entry_free()). @return 0, -EINVAL, KVT_E_STATE (an empty cache) or -ENOMEM; on
 * failure no clone is left behind. */
KVT_API int kvt_entry_clone(const struct kvt_entry *e, struct kvt_entry **out);
/** Sum of kvt_cache_bytes() over the caches. */
KVT_API size_t kvt_entry_bytes(const struct kvt_entry *e);
/** Whether every cache of @p e is trimmable (an entry without caches is); false for NULL. */
KVT_API bool kvt_entry_is_trimmable(const struct kvt_entry *e);

/**
 * The engine's exclusion (TIER.md §6): run @p step(@p arg) while no model step runs and return
 * its result, or refuse without running it (return KVT_E_REFUSED). May be called from the
 * library's writer or timer thread; the engine may run the step on its own thread.
 */
typedef int (*kvt_step_fn)(void *arg);
typedef int (*kvt_run_exclusive_fn)(void *engine, kvt_step_fn step, void *arg);

struct kvt_save_opts {
    int64_t created_at;                 /* ms since the epoch; 0 = now */
    uint64_t max_file_bytes;            /* refuse (KVT_E_TOO_LARGE) from the plan; 0 = no limit */
    kvt_run_exclusive_fn run_exclusive; /* optional: each of the N + 1 write steps inside it */
    void *engine;                       /* passed to run_exclusive */
    bool no_sync;                       /* skip fsync of file and directory (tests, benchmarks) */
    bool drop_cache;                    /* after fsync, drop the file's pages from the page cache */
    bool keep_cache;                    /* write through the page cache (not O_DIRECT) and leave the
                                           pages there, so that a restore reads them at memory speed;
                                           overrides drop_cache */
};

/**
 * Write @p e to @p path crash-safely: `<path>.tmp` created exclusively and locked, tensors
 * streamed one at a time (hashed from zero-copy views when contiguous), header patched last,
 * fsync, rename, fsync of the directory. Metadata comes from e->meta (absent keys omitted).
 * On any failure nothing under @p path changes and no `.tmp` remains, with one exception: a
 * failing directory fsync (or directory open for it) is reported after the rename, so the new,
 * complete file is in place but not known to be durable. An existing `<path>.tmp` (another
 * writer) fails with -EEXIST and is left alone. With o->run_exclusive the write runs as N + 1
 * steps for N tensors (1: plan, first tensor; one per further tensor; last: send the staged
 * tail), each inside run_exclusive(); a refusal or a non-zero result aborts with full
 * cleanup. A step only copies engine memory into staging: creating the .tmp before the steps,
 * waiting for the device between and after them, the header, the fsync, the rename and the
 * directory fsync run outside the exclusion, where they cannot stall the engine. The whole
 * file is allocated before the tensor writes go out, so a disk without room fails early.
 * Peak extra memory: the write staging (64 MiB, kept for reuse) plus the header.
 * @p out_bytes (may be NULL) receives the file size (0 on failure).
 * @return 0, -errno, KVT_E_STATE (empty cache), KVT_E_TOO_LARGE, KVT_E_REFUSED, -EINVAL.
 */
KVT_API int kvt_file_save(const char *path, const struct kvt_entry *e,
                          const struct kvt_save_opts *o, uint64_t *out_bytes);
/** The file size kvt_file_save() would write for @p e, from the plan alone (no file touched).
 * @return 0, or the plan's errors of kvt_file_save() (-EINVAL, KVT_E_STATE, KVT_E_TOO_LARGE,
 * -ENOMEM) with *@p out_bytes 0. */
KVT_API int kvt_file_plan_size(const struct kvt_entry *e, uint64_t *out_bytes);

/** One tensor slot of a header. */
struct kvt_slot {
    uint64_t off; /* relative to data_start */
    uint64_t bytes;
    int dtype;
    int rank;
    int64_t shape[KVT_MAX_RANK];
    uint64_t hash;
};

struct kvt_cache_header {
    struct kvt_cache_info info;
    int n_slots;
    struct kvt_slot slots[KVT_MAX_CACHE_TENSORS];
};

/** A validated header (FORMAT.md V1–V20 passed). Free with kvt_header_free(). */
struct kvt_header {
    int format_version;
    int64_t created_at;                                        /* -1 when absent */
    char *model_id, *config_fingerprint, *tokenizer_hash, *ns; /* NULL when absent */
    int32_t *tokens;
    size_t n_tokens;
    struct kvt_cache_header *caches;
    size_t n_caches;
    uint32_t header_len;
    uint32_t data_start;
    uint64_t header_hash;
    uint64_t file_size;
};

struct kvt_read_opts {
    size_t max_header_bytes; /* V4; 0 = 64 MiB */
};

/**
 * Read and validate the prefix and header only (no tensor bytes).
 * @return 0, KVT_E_FORMAT, KVT_E_UNSUPPORTED, KVT_E_CORRUPT or -errno; the message names the
 *         check ID (V1…V20), the field and the offset.
 */
KVT_API int kvt_file_read_header(const char *path, const struct kvt_read_opts *o,
                                 struct kvt_header **out);
/** Free a header the library returned and the strings and arrays it holds (NULL allowed). */
KVT_API void kvt_header_free(struct kvt_header *h);
/** Every cache trimmable, from the header's scalars (CACHES.md §9). */
KVT_API bool kvt_header_is_trimmable(const struct kvt_header *h);
/** V21: every non-ssm cache has offset == n_tokens (the store indexes only those). */
KVT_API bool kvt_header_is_indexable(const struct kvt_header *h);

/** Caller expectations for a load (FORMAT.md §11.3). NULL / 0 fields are not checked. */
struct kvt_expect {
    const char *model_id, *config_fingerprint, *tokenizer_hash, *ns;
    size_t n_layers;         /* L2: donor-layer count; 0 = not checked */
    bool no_verify;          /* skip tensor hash checks (L3) */
    size_t max_header_bytes; /* V4; 0 = 64 MiB */
    bool keep_cache;         /* do not drop the file's pages after reading */
};

/**
 * Load an entry: validate the header, check expectations, read every tensor straight into
 * owned buffers (token-axis kinds get STEP capacity with at least one zero row of slack,
 * CACHES.md §12) checking hashes in the same pass. No mapping survives the call; on failure
 * everything built is freed. @p out_header (may be NULL) receives the header.
 * L1: an expected key the header lacks does not match, except ns (absent reads as "").
 * Threads: the call may run short-lived helper threads on the caller's CPUs (a prefault
 * helper; for a file wholly in the page cache, workers that copy slots in parallel), all
 * joined before it returns.
 * @return 0, KVT_E_FORMAT / KVT_E_UNSUPPORTED / KVT_E_CORRUPT (V1-V20; L3 hash mismatch),
 *         KVT_E_MISMATCH (L1, L2) or -errno; the message names the check ("<path>: V15: ...").
 */
KVT_API int kvt_file_load(const char *path, const struct kvt_expect *x, struct kvt_entry **out,
                          struct kvt_header **out_header);
/** Full structural and hash check without building caches: the header (V1-V20), the
 * expectations of @p x (may be NULL) and, unless x->no_verify, every tensor hash (L3).
 * @return as kvt_file_load(). */
KVT_API int kvt_file_verify(const char *path, const struct kvt_expect *x);

/**
 * Where a restore into caller memory puts the tensors, asked once per restore on the calling
 * thread, after the header has passed V1-V20 and the expectations, before any tensor byte is
 * read: set @p dst[k] for the k-th slot of @p h (caches in order, each cache's slots in order)
 * to writable memory of at least slot.bytes, which receives the slot's bytes exactly as the
 * file holds them (C-contiguous, no capacity rows); NULL skips delivering that slot (its
 * bytes are still read and checked). Any alignment works; memory that is 4096-aligned at the
 * same offset modulo 4096 as the slot in the file is read into directly, without staging.
 * @p h is valid only during the call. Return 0, or a negative code to refuse the entry.
 */
typedef int (*kvt_place_fn)(void *ud, const struct kvt_header *h, void **dst);

/**
 * kvt_file_load() into memory the caller owns (an engine's KV buffers, a state blob): the
 * same checks, hashes verified in the same pass, no cache objects and no full-entry copy of
 * the library's own. On success *@p out_header receives the header (free with
 * kvt_header_free()). On any failure the destination memory may hold part of the bytes and
 * must not be used.
 * @return 0, the codes of kvt_file_load(), or @p place's refusal.
 */
KVT_API int kvt_file_load_into(const char *path, const struct kvt_expect *x, kvt_place_fn place,
                               void *ud, struct kvt_header **out_header);

/* ------------------------------------------------------------------------------------------
 * Store: one directory of entries with a prefix index (STORE.md).
 *
 * Threads: every kvt_store call is safe from any thread. find and has_durable_prefix never
 * wait for file I/O; restore and put do theirs outside the store's lock. open and refresh
 * read the headers of a large directory on up to 8 short-lived worker threads.
 */
typedef struct kvt_store kvt_store;

/*
 * Store options (STORE.md §1). Start from kvt_store_opts_init(), which sets every default;
 * after that every value is literal (0 means 0). A zero max_bytes or max_header_bytes and a
 * negative tmp_grace_ms are no usable values: kvt_store_open() refuses them (-EINVAL).
 */
struct kvt_store_opts {
    const char *model_id;           /* required */
    const char *config_fingerprint; /* required: the directory key */
    const char *tokenizer_hash;     /* required */
    uint64_t max_bytes;             /* byte cap; default 32 GiB */
    size_t n_layers;                /* donor-layer count checked on restore; 0 = not checked */
    bool no_verify;                 /* skip tensor hash checks on restore */
    bool quarantine;                /* rename corrupt files to *.corrupt instead of deleting */
    bool keep_saved_cached;         /* saves leave their files in the page cache (written
                                       through it, kvt_save_opts.keep_cache), so that a
                                       restarted process restores them at memory speed */
    size_t max_header_bytes;        /* default 64 MiB */
    int64_t tmp_grace_ms;           /* min age of an unlocked .tmp before reaping; default
                                       60000. It covers the instant between a writer's
                                       create and lock: 0 (reap at once) is safe only with
                                       no other live writer */
    bool read_only; /* inspect only: no directory creation, reaping, removal, eviction, LRU
                       bump on disk; corrupt files are counted and left; put: KVT_E_STATE */
    kvt_log_fn log; /* one call at a time, on the calling thread or a scan worker thread */
    void *log_ud;
    const struct kvt_mem_opts *mem; /* applied to the process once open succeeds
                                       (kvt_mem_configure()); NULL = leave the settings */
    bool share_prefixes; /* put entries of over 256 tokens as shared 256-token chunks plus a
                            tail of their own (docs/SHARING.md); default off. Stores read
                            shared entries either way */
};

/**
 * A find result: valid until kvt_store_close(); prefix_len == 0 means a miss. Restore a hit
 * only in the store that found it: @c store tells them apart, and a restore of another
 * store's hit (or of one no find made) returns -EINVAL. (@c store fills padding the struct
 * already had: its size and the other fields' offsets are those of 0.1.0.)
 */
struct kvt_hit {
    size_t prefix_len;
    size_t n_tokens; /* tokens of the matched entry */
    uint64_t id;     /* the record (opaque) */
    bool trimmable;
    uint32_t store; /* the store or remote tier that found it: a nonzero number unique in the
                       process */
};

struct kvt_store_stats {
    uint64_t entries, total_bytes, max_bytes;
    uint64_t restores, spills, store_failures, evictions;
    uint64_t skipped_files, skipped_bytes, corrupt_files, restore_misses;
    double restore_ms_last;
    uint64_t longest_durable_prefix_tokens;
    uint64_t tmp_reaped;                  /* abandoned .tmp files removed (STORE.md §12.4) */
    uint64_t shared_chunks, shared_bytes; /* chunks indexed entries need, and their bytes
                                             (in total_bytes, once each; docs/SHARING.md) */
};

/** One indexed entry as kvt_store_list() reports it. */
struct kvt_store_record {
    uint64_t id;      /* as in kvt_hit */
    const char *path; /* <root>/<nsHash>/<uuid>.mlxkv */
    const char *ns;
    size_t n_tokens;
    uint64_t bytes;
    int64_t mtime_ms; /* the LRU clock: file mtime at scan, bumped by restores */
    bool trimmable;
};

/**
 * Fill @p o with the defaults (STORE.md §1): max_bytes 32 GiB, max_header_bytes 64 MiB,
 * tmp_grace_ms 60000, the identity fields NULL, every other field 0 / false / NULL.
 */
KVT_API void kvt_store_opts_init(struct kvt_store_opts *o);

/** What kvt_store_check() finds to act on, one kind per file. */
enum kvt_check_kind {
    KVT_CHECK_TMP,         /* an abandoned .tmp (STORE.md §12.4, the store's grace) */
    KVT_CHECK_CORRUPT,     /* a .mlxkv whose header fails as KVT_E_CORRUPT */
    KVT_CHECK_QUARANTINED, /* a .mlxkv.corrupt (with remove_skipped) */
    KVT_CHECK_SKIPPED,     /* a file no identity here can use (with remove_skipped) */
    KVT_CHECK_EVICT,       /* an entry beyond max_bytes, in the store's eviction order */
    KVT_CHECK_ORPHAN,      /* a shared chunk no entry needs (docs/SHARING.md §6, the grace) */
    KVT_CHECK_KINDS
};

struct kvt_check_opts {
    bool repair;         /* act; false = a dry run that only reports */
    bool files;          /* look at every file of the fingerprint directory */
    bool remove_skipped; /* files: also quarantined and skipped files */
    uint64_t max_bytes;  /* evict the store's entries down to this; 0 = no eviction */
    /* remove_skipped: whether a readable entry of another model or tokenizer belongs to an
     * identity kept here (NULL: only the store's own identity is kept) */
    bool (*keep)(void *ud, const struct kvt_header *h);
    /* Called for every file acted on (or, in a dry run, that would be): @p why may be NULL;
     * @p rc is 0, or the -errno of a removal that failed. */
    void (*report)(void *ud, enum kvt_check_kind k, const char *path, uint64_t bytes,
                   const char *why, int rc);
    void *ud;
};

/**
 * Check the store @p dir / @p so (the identity, tmp_grace_ms) as kvt_store_open() would see
 * it, and repair it on request: remove abandoned .tmp files and corrupt entries, optionally
 * quarantined and unusable ones, and evict to a cap (the `kvtier gc` command). Never touches
 * another fingerprint's directory. @return 0, or -errno / KVT_E_* of a listing or an open.
 * Threads: the store may be open in this and other processes meanwhile.
 */
KVT_API int kvt_store_check(const char *dir, const struct kvt_store_opts *so,
                            const struct kvt_check_opts *co);

/**
 * Open (creating if needed) and recover @p dir: index headers, reap dead .tmp, evict to cap.
 * Outside @p dir, the one change open makes to the process is applying o->mem
 * (kvt_mem_configure()), and only once the store is open: a failed open leaves the settings
 * as they were (open's own header reads run with those).
 * @return 0, -EINVAL (a missing identity field, a bad fingerprint, bad memory settings or an
 * unusable value, see struct kvt_store_opts), -errno or KVT_E_* of the directory.
 */
KVT_API int kvt_store_open(const char *dir, const struct kvt_store_opts *o, kvt_store **out);
/**
 * Free the store's index and handles (NULL allowed); files on disk stay as they are. Call it
 * once no other thread uses @p s: hits, roots and records taken from it become invalid. A
 * prompt cache's store (kvt_pcache_store()) is closed by kvt_pcache_close(), never directly.
 */
KVT_API void kvt_store_close(kvt_store *s);
/** Longest usable prefix (STORE.md §7); index only. @return 0 (a miss is prefix_len 0). */
KVT_API int kvt_store_find(kvt_store *s, const int32_t *tok, size_t n, const char *ns,
                           struct kvt_hit *hit);
/**
 * Restore a hit. @return 0 with *out set, or 0 with *out NULL on a miss (vanished, corrupt,
 * foreign: handled per STORE.md §12.1). Negative only for bad arguments: -EINVAL, also for a
 * hit that another store found.
 */
KVT_API int kvt_store_restore(kvt_store *s, const struct kvt_hit *hit, struct kvt_entry **out);
/**
 * kvt_store_restore() into memory the caller owns (kvt_file_load_into()). An entry kept as
 * shared chunks plus a tail (docs/SHARING.md) is placed as the whole entry: @p place and
 * *@p out_header see its n tokens and each cut layer's slots as [B, H, n, D] (their hashes 0,
 * as no file holds them so). @return 0 with *@p out_header set (free with kvt_header_free());
 * 0 with it NULL on a miss (handled as kvt_store_restore() handles it; the destination must
 * not be used); @p place's refusal (the record stays); or -EINVAL for bad arguments.
 */
KVT_API int kvt_store_restore_into(kvt_store *s, const struct kvt_hit *hit, kvt_place_fn place,
                                   void *ud, struct kvt_header **out_header);
/**
 * Store @p e under namespace e->meta.ns (NULL = ""), synchronously, on the calling thread
 * (STORE.md §9); the entry stays the caller's. The identity written is the store's, whatever
 * e->meta holds. @p run_exclusive may be NULL. Soft failure: returns a negative code, removes
 * partial files, counts a store_failure (once the arguments are valid), the store stays usable.
 * @return 0, -EINVAL (no entry or caches; a non-ssm cache whose offset is not the token count,
 * V21), KVT_E_STATE (a read-only store, an empty cache), KVT_E_TOO_LARGE (the planned file is
 * over max_bytes, nothing written), KVT_E_REFUSED, or the -errno of the write.
 */
KVT_API int kvt_store_put(kvt_store *s, const struct kvt_entry *e,
                          kvt_run_exclusive_fn run_exclusive, void *engine);
/**
 * Whether an indexed entry of namespace @p ns (NULL = "") starts with the @p n tokens and is
 * either exactly that long or trimmable (STORE.md §4): whether a restart could serve them
 * from disk. Index only, no I/O. False for a NULL store or NULL tokens with n > 0.
 */
KVT_API bool kvt_store_has_durable_prefix(kvt_store *s, const int32_t *tok, size_t n,
                                          const char *ns);
/** Pick up entries published (or removed) by other processes, then evict to cap (STORE.md
 * §12.4, §12.6): ns directories that are new or changed are listed again. @return 0, -EINVAL,
 * or the -errno of listing the store's directory (nothing new is indexed then). */
KVT_API int kvt_store_refresh(kvt_store *s);
/** Fill @p st (required) with the counters of STORE.md §11, read together under the store's
 * lock; all zero for a NULL store. */
KVT_API void kvt_store_get_stats(kvt_store *s, struct kvt_store_stats *st);
/**
 * A snapshot of the index in index order (ascending id): one allocation holding the array and
 * its strings; release it with kvt_store_list_free(). @return 0 or -ENOMEM (*out NULL).
 */
KVT_API int kvt_store_list(kvt_store *s, struct kvt_store_record **out, size_t *n);
/** Free what kvt_store_list() or kvt_remote_list() returned, strings included (NULL allowed). */
KVT_API void kvt_store_list_free(struct kvt_store_record *v);
/** The directory this store owns (<dir>/<config_fingerprint>). */
KVT_API const char *kvt_store_root(const kvt_store *s);
/** Write nsHash(@p ns) ("base" or unpadded hex) into @p out (at least 17 bytes). */
KVT_API void kvt_ns_hash(const char *ns, char out[17]);

/* ------------------------------------------------------------------------------------------
 * Tier: RAM prompt cache over the store, write-behind queue, idle demotion (TIER.md).
 *
 * Threads: every kvt_pcache call is safe from any thread; one internal lock makes them
 * atomic with respect to each other and is never held across disk I/O or engine callbacks.
 * With a cold tier the pcache runs two library threads: the writer (queued writes, FIFO,
 * one at a time) and the timer thread (debounced snapshots, idle demotion). Engine code
 * runs on them only through: cache/buffer release callbacks, retain hooks, run_exclusive
 * and busy. kvt_pcache_flush() runs its forced snapshots on the calling thread.
 * Never call kvt_pcache_flush() or kvt_pcache_close() while holding the engine exclusion
 * (they wait for steps that need it).
 */
typedef struct kvt_pcache kvt_pcache;
typedef struct kvt_device kvt_device;
struct kvt_remote_opts;

/**
 * A ref-counted hold on engine backing memory (TIER.md §2.6). kvt_retain_new() returns the
 * first reference; @p hook (may be NULL) runs exactly once, on the thread that releases the
 * last one — including when kvt_retain_new() itself fails (-ENOMEM).
 */
typedef struct kvt_retain kvt_retain;
/** @return 0 with *@p out (required) set, or -ENOMEM with *@p out NULL after running @p hook.
 * Any thread; the references may be released on any thread. */
KVT_API int kvt_retain_new(void (*hook)(void *ud), void *ud, kvt_retain **out);
/** Another reference to @p r; returns @p r (NULL stays NULL). */
KVT_API kvt_retain *kvt_retain_acquire(kvt_retain *r);
/** Release one reference (NULL allowed). Each reference is released once. */
KVT_API void kvt_retain_release(kvt_retain *r);

/*
 * Options (TIER.md §8). Start from kvt_pcache_opts_init(), which sets every default; after
 * that every value is literal (0 means 0).
 */
/*
 * Threads: with cold_dir, kvt_pcache_open() starts the writer thread ("kvt-writer") and, when
 * write_behind is on or demote_idle_ms > 0, the timer thread ("kvt-timer"), both on
 * background_cpus; they run until kvt_pcache_close(). cold.mem places the short-lived helper
 * threads of restores and saves (struct kvt_mem_opts).
 */
struct kvt_pcache_opts {
    uint64_t ram_max_bytes;             /* RAM tier cap; default 8e9. 0 = caches nothing, and
                                           is an error (-EINVAL) together with a cold tier */
    const char *cold_dir;               /* NULL = no cold tier (default) */
    struct kvt_store_opts cold;         /* store options when cold_dir is set, initialised by
                                           kvt_pcache_opts_init() with kvt_store_opts_init();
                                           model_id, config_fingerprint and tokenizer_hash are
                                           required */
    int64_t spill_queue_max_bytes;      /* soft cap of the write-behind queue; default 2 GiB;
                                           0 = only the newest item and the one in flight;
                                           < 0 = -EINVAL */
    bool write_behind;                  /* snapshot fresh entries to disk; default on.
                                           Spill-on-evict works either way */
    int64_t demote_idle_ms;             /* demote RAM entries idle this long; default 300000;
                                           0 = off; ignored without a cold tier; < 0 = -EINVAL */
    int64_t snapshot_debounce_ms;       /* default 1000 */
    int64_t snapshot_busy_retry_ms;     /* default 5000 */
    int64_t flush_timeout_ms;           /* used by kvt_pcache_flush(timeout < 0); default 120000 */
    const char *background_cpus;        /* CPU list ("2-7,12") for the writer and timer threads,
                                           to keep them off the engine's decode cores; NULL =
                                           the CPUs of the thread calling kvt_pcache_open() */
    kvt_run_exclusive_fn run_exclusive; /* optional engine exclusion; NULL = steps run directly */
    bool (*busy)(void *engine); /* optional: postpones snapshots and demotion (policy only) */
    void *engine;
    /* Optional: called after every stored put (any thread, outside the lock). */
    void (*on_put)(void *ud, const int32_t *tok, size_t n, const char *ns);
    void *on_put_ud;
    kvt_log_fn log; /* also the store's, unless cold.log is set */
    void *log_ud;
    /* Optional remote tier below the cold tier (requires cold_dir; NULL = none): puts are
     * uploaded behind the local write, takes consult it last, restored entries are promoted
     * into the store. Its identity defaults to cold's. */
    const struct kvt_remote_opts *remote;
    /* Hold prefixes that entries share once, in whole 256-token chunks (docs/SHARING.md): in
     * RAM, whose byte count (ram_max_bytes, stats) counts them once, and with cold_dir on disk
     * (it sets cold.share_prefixes). Also on when cold.share_prefixes is set. Default off. */
    bool share_prefixes;
    /* Optional device (NULL = none; must outlive the prompt cache and the entries taken from
     * it): entries in its memory are put into page-locked host memory of the RAM tier (one
     * region of ram_max_bytes + spill_queue_max_bytes, allocated at the first such put, freed
     * at close), and kvt_pcache_take_to_device() lands takes in its memory. */
    kvt_device *device;
};

/** Fill @p o with the defaults of TIER.md §8 (no cold tier; `cold` as kvt_store_opts_init()
 * leaves it). */
KVT_API void kvt_pcache_opts_init(struct kvt_pcache_opts *o);

/** A taken prefix: owned caches trimmed to entry->n_tokens tokens. */
struct kvt_take {
    struct kvt_entry *entry; /* NULL on a miss */
    kvt_retain *retain;      /* pass to kvt_pcache_put() or release (NULL = no hold) */
    bool from_disk;
    bool from_remote; /* restored from the remote tier (from_disk is set too) */
};

/** Where kvt_pcache_take_into() puts a disk hit's bytes, and what it put there. */
struct kvt_take_into {
    kvt_place_fn place; /* required: as for kvt_store_restore_into() */
    void *ud;
    struct kvt_header *header; /* out: the disk's entry when it served, else NULL; the
                                  caller frees it (kvt_header_free()) */
    size_t prefix_len;         /* out: its tokens that match; below header->n_tokens, the
                                  entry is trimmable and the caller trims the rest */
};

struct kvt_flush_report {
    bool durable; /* no dirty keys, no pending spills, no drop/failure/missing in the flush */
    uint64_t pending_snapshots, pending_spills, pending_spill_bytes;
    uint64_t dropped, failed, missing;               /* during this flush */
    uint64_t entries, longest_durable_prefix_tokens; /* store state at the end */
};

struct kvt_pcache_stats {
    uint64_t records, total_bytes, hits, misses, demotions;
    uint64_t pending_spills, pending_spill_bytes, dropped_spills, failed_spills;
    uint64_t pending_snapshots; /* dirty keys, armed timers included */
    bool has_cold;
    struct kvt_store_stats cold; /* zeroed without a cold tier */
};

/**
 * Open a prompt cache (and, with cold_dir, its store, writer and timer threads). Logs
 * "[ssd-cache] <dir> — N entries recovered, X.XX GiB of Y GiB cap" when a store is opened.
 * Outside the cache and its directory, an open with cold_dir changes the process only once it
 * has succeeded: it applies cold.mem (kvt_mem_configure()) and faults in the streams' staging
 * memory. A failed open leaves the settings as they were (the store's own reads at open run
 * with those).
 * @return 0, -EINVAL (bad option; message in kvt_last_error()), a store error, -ENOMEM.
 */
KVT_API int kvt_pcache_open(const struct kvt_pcache_opts *o, kvt_pcache **out);
/**
 * Stop the timers, let the writer finish the write in flight, discard the queued spills,
 * release every RAM entry without spilling, close the store. Does not flush: call
 * kvt_pcache_flush() first for durability. NULL allowed.
 */
KVT_API void kvt_pcache_close(kvt_pcache *pc);
/**
 * The longest usable cached prefix of @p tok (TIER.md §2.2): a trimmed clone of a RAM entry
 * (which stays in RAM), or an entry restored from disk when the disk prefix is strictly
 * longer. A miss is 0 with out->entry NULL. The caller owns out->entry and out->retain.
 * Failures of the cold or remote tier are misses, never errors.
 * @return 0, -EINVAL (NULL @p pc or @p out, NULL tokens with n > 0), or the error of cloning or
 * trimming a RAM hit (-ENOMEM, KVT_E_STATE; nothing is returned then).
 */
KVT_API int kvt_pcache_take(kvt_pcache *pc, const int32_t *tok, size_t n, const char *ns,
                            struct kvt_take *out);
/**
 * kvt_pcache_take() for a caller that restores into memory of its own (an engine's state
 * buffer): the same decision (RAM, then the disk when strictly longer, then the remote tier
 * when strictly longer still), each tier tried at most once, but a disk hit is restored with
 * kvt_store_restore_into(into->place, into->ud), not into an entry. Exactly one of these
 * holds after a 0 return: into->header is set (the disk served: the bytes are in the placed
 * memory, out->from_disk is set, out->entry is NULL); out->entry is set (RAM or remote, as
 * kvt_pcache_take() returns it); or both are NULL (a miss). A disk restore that fails (the
 * file vanished or is corrupt, the placement refused it) falls back to RAM, never to the disk
 * again; the placed memory then holds nothing usable.
 * @return as kvt_pcache_take(); -EINVAL also for a NULL @p into or into->place.
 */
KVT_API int kvt_pcache_take_into(kvt_pcache *pc, const int32_t *tok, size_t n, const char *ns,
                                 struct kvt_take_into *into, struct kvt_take *out);
/**
 * Insert @p e under e->meta.ns (NULL = "") (TIER.md §2.3); takes ownership of @p e and
 * @p retain (may be NULL) on every path. Evicted entries spill to the cold tier.
 * @return 0 (also when @p e alone exceeds ram_max_bytes: it goes straight to the spill),
 * -EINVAL (NULL @p pc or @p e, NULL tokens), KVT_E_UNSUPPORTED (device memory, see
 * kvt_buf_wrap_device()) or -ENOMEM; on failure @p e is freed and @p retain released.
 */
KVT_API int kvt_pcache_put(kvt_pcache *pc, struct kvt_entry *e, kvt_retain *retain);
/** The RAM prefix length take() would find; changes nothing (no counters, no LRU). */
KVT_API size_t kvt_pcache_peek_prefix_len(kvt_pcache *pc, const int32_t *tok, size_t n,
                                          const char *ns);
/**
 * The longest prefix a take would be offered over every tier: RAM, the disk store and the
 * remote tier, by the index lookups take() itself makes (a tier below RAM counts only when
 * strictly longer). No restore, no counters, no LRU; any thread. 0 for a NULL @p pc. A take
 * may still serve less: an entry found here can be corrupt or gone by then.
 */
KVT_API size_t kvt_pcache_peek_longest(kvt_pcache *pc, const int32_t *tok, size_t n,
                                       const char *ns);
/** Whether RAM holds an entry with exactly these tokens in @p ns. */
KVT_API bool kvt_pcache_find_exact(kvt_pcache *pc, const int32_t *tok, size_t n, const char *ns);
/**
 * Move every entry idle for at least @p idle_ms (at @p now_ms wall ms; <= 0 = now) to the
 * cold tier; returns the count. Without a cold tier: 0, nothing done. Call inside the engine
 * exclusion (a host "drain" is demote_idle(0)).
 */
KVT_API size_t kvt_pcache_demote_idle(kvt_pcache *pc, int64_t idle_ms, int64_t now_ms);
/** Release every RAM entry without spilling. */
KVT_API void kvt_pcache_clear(kvt_pcache *pc);
/**
 * Make everything in RAM durable (TIER.md §5): wait for running snapshots and the queue,
 * then force a snapshot of every dirty key until a pass clears nothing. Concurrent callers
 * share one run and its report. @p timeout_ms < 0 = the flush_timeout_ms option.
 * @return 0 (see r->durable) or KVT_E_TIMEOUT (r filled, durable false).
 */
KVT_API int kvt_pcache_flush(kvt_pcache *pc, int64_t timeout_ms, struct kvt_flush_report *r);
/**
 * Fill @p st (required) with the counters of TIER.md §9: the RAM tier's, the write-behind
 * queue's, the dirty snapshot keys and, with a cold tier, the store's (kvt_store_get_stats()).
 * Each part is read under its own lock: together they are no atomic snapshot. All zero for NULL.
 */
KVT_API void kvt_pcache_get_stats(kvt_pcache *pc, struct kvt_pcache_stats *st);
/** The cold tier, or NULL (borrowed; valid until kvt_pcache_close()). */
KVT_API kvt_store *kvt_pcache_store(kvt_pcache *pc);

/* ------------------------------------------------------------------------------------------
 * Remote tier: entries shared by many hosts through Redis or Redis Cluster (REMOTE.md).
 *
 * Entries travel as their .mlxkv bytes in chunks; an index record per entry, written after
 * its chunks, makes it visible. Bytes from the server are untrusted: a restore validates them
 * exactly as a file (header checks, tensor hashes while reading). Every call has one deadline
 * (timeout_ms); a server that is absent, dead or paused turns remote finds into misses and
 * remote writes into counted failures, never into errors of the local tiers.
 *
 * Threads: every kvt_remote call is safe from any thread. kvt_remote_open() starts two
 * library threads, which run until kvt_remote_close(): the poll thread (connects, merges the
 * remote index every poll_ms) and an upload writer (the write-behind uploads, FIFO, one at a
 * time). kvt_remote_find() never does network I/O; restores run on the calling thread, and
 * restores on one handle from several threads run at once (each on a connection of its own,
 * up to 4 kept idle between restores). The log callback may be called from any of these
 * threads.
 */
typedef struct kvt_remote kvt_remote;

struct kvt_remote_opts {
    /* "redis://[[user]:password@]host[:port][,host:port...][/prefix]" (more cluster seeds) or
     * "unix://[[user]:password@]/path/to.sock[?prefix=P]"; prefix default "kvtier" */
    const char *url;
    const char *user, *password; /* override the URL's (keep secrets out of URLs) */
    const char *model_id, *config_fingerprint, *tokenizer_hash; /* the identity; required
                                      (kvt_pcache_open(): NULL = the cold store's) */
    int timeout_ms;           /* one deadline for each whole call (a restore, an upload, an
                                 index sync, gc's check of one record), across every
                                 connect and partial read and write, plus 1 s per 64 MiB
                                 the call moves; default 2000 */
    int poll_ms;              /* remote index poll period; default 500 */
    uint64_t max_bytes;       /* this identity's share of the server; default 8 GiB, 0 = none:
                                 oldest entries are deleted to stay below it */
    uint64_t max_entry_bytes; /* larger records are ignored; default 64 GiB */
    uint64_t chunk_bytes;     /* value size of the chunks written; default 1 MiB - 64 B
                                 (Redis's allocator holds a value of exactly 1 MiB in
                                 1.25 MiB) */
    int64_t queue_max_bytes;  /* write-behind cap, as spill_queue_max_bytes; 2 GiB */
    bool no_verify;           /* skip tensor hash checks on restore (not advised) */
    bool share_prefixes;      /* upload the whole 256-token chunks of an entry's prefix as
                                 objects shared by every entry that starts with them
                                 (SHARING.md "The remote tier"); off by default. Readers
                                 restore shared entries either way */
    kvt_log_fn log;
    void *log_ud;
};

struct kvt_remote_stats {
    bool connected;                        /* the poll thread's connection is up */
    uint64_t entries, bytes;               /* the local view of this identity's remote index (bytes:
                                              the records' and each shared object's once) */
    uint64_t shared_objects, shared_bytes; /* the shared prefix objects the view's records need */
    uint64_t puts, put_bytes, put_failures, put_skipped, dropped, pending;
    uint64_t restores, restore_bytes, misses, corrupt, errors, evictions, syncs;
    int64_t version; /* last index version merged; -1 = never */
};

/** Fill @p o with the defaults (url and identity NULL). */
KVT_API void kvt_remote_opts_init(struct kvt_remote_opts *o);
/**
 * Connect to the server named by o->url and start the poll and upload threads. A server that
 * cannot be reached is not an error (the remote is retried in the background); a refused
 * AUTH is (-EACCES, with the server's message in kvt_last_error()).
 * @return 0, -EINVAL (bad URL or option), -EACCES, -ENOMEM.
 */
KVT_API int kvt_remote_open(const struct kvt_remote_opts *o, kvt_remote **out);
/** Stop the threads (the upload in flight finishes; queued ones are dropped). NULL allowed. */
KVT_API void kvt_remote_close(kvt_remote *r);
/** Longest usable remote prefix (STORE.md §7 rules) from the local view; no I/O. @return 0
 * (a miss is prefix_len 0) or -EINVAL. A hit stays valid until kvt_remote_close(). */
KVT_API int kvt_remote_find(kvt_remote *r, const int32_t *tok, size_t n, const char *ns,
                            struct kvt_hit *hit);
/**
 * Fetch and validate a hit. @return 0 with *out set, or 0 with *out NULL on a miss (the entry
 * vanished, was evicted, or is corrupt: its record is removed and counted); -EINVAL (also
 * for a hit that another remote tier or a store found).
 */
KVT_API int kvt_remote_restore(kvt_remote *r, const struct kvt_hit *hit, struct kvt_entry **out);
/**
 * Upload @p e now, on the calling thread (the entry stays the caller's); then drop the remote
 * records it supersedes. Skips an entry whose tokens the index already holds (put_skipped).
 * @return 0, -EINVAL, KVT_E_TOO_LARGE (over max_entry_bytes), -ENOMEM, or the connection's
 * error (-ETIMEDOUT, -ECONNREFUSED, -ECONNRESET, -EIO, -EPROTO, -EAGAIN, -EACCES; counted in
 * put_failures).
 */
KVT_API int kvt_remote_put(kvt_remote *r, const struct kvt_entry *e);
/** Queue a clone of @p e for upload (write-behind; never blocks on the network; @p e stays the
 * caller's). @return 0, -EINVAL, or the clone's errors (KVT_E_STATE, -ENOMEM). Upload failures
 * are counted, not returned. */
KVT_API int kvt_remote_put_async(kvt_remote *r, const struct kvt_entry *e);
/** Wait for the uploads queued before the call; 0 or KVT_E_TIMEOUT. */
KVT_API int kvt_remote_drain(kvt_remote *r, int64_t timeout_ms);
/** Merge the remote index now (as the poll thread does), on the calling thread; 0, -EINVAL or a
 * connection error (as kvt_remote_put()). */
KVT_API int kvt_remote_refresh(kvt_remote *r);
/** Fill @p st (required) with the remote's counters and the size of its local view of the
 * index; no network I/O. All zero for NULL. */
KVT_API void kvt_remote_get_stats(kvt_remote *r, struct kvt_remote_stats *st);
/** The index as kvt_store_list() reports it (path = the entry's uuid; mtime = publication),
 * from the local view, no I/O; free with kvt_store_list_free(). @return 0, -EINVAL or -ENOMEM. */
KVT_API int kvt_remote_list(kvt_remote *r, struct kvt_store_record **out, size_t *n);
/**
 * Check every record of this identity: drop records whose chunks are gone, then delete the
 * oldest entries beyond @p max_bytes (0 = the max_bytes option). @p dry_run only counts.
 * *@p dropped (may be NULL) receives the number of records dropped (or that would be).
 * Runs on the calling thread. @return 0, -EINVAL, -ENOMEM or a connection error.
 */
KVT_API int kvt_remote_gc(kvt_remote *r, uint64_t max_bytes, bool dry_run, size_t *dropped);
/** The remote attached to a prompt cache (kvt_pcache_opts.remote), or NULL (borrowed). */
KVT_API kvt_remote *kvt_pcache_remote(kvt_pcache *pc);

/* ------------------------------------------------------------------------------------------
 * Devices: GPU memory as a restore destination. CUDA is loaded at run time (the driver API of
 * libcuda.so.1): the library builds without a toolkit and runs without a GPU, where opening a
 * CUDA device fails with KVT_E_UNSUPPORTED ("unavailable"). A host-memory stand-in with the
 * same asynchronous behaviour runs everywhere (tests, development).
 *
 * Threads: a device may be used from several threads; its loads, saves and copies take turns
 * (a load may start helper threads of its own, kvt_mem_opts permitting). Close it from one
 * thread once nothing uses it. CUDA copies run on a stream of their own that waits for work
 * queued before on the legacy default stream; work on other streams that writes what a save
 * reads, or uses what a restore overwrites, must be finished first (torch: hand tensors over
 * with __dlpack__(stream=1), as the Python package does). Device addresses are uint64_t
 * (CUdeviceptr for CUDA; host pointers for the stand-in).
 */
typedef struct kvt_device kvt_device;

struct kvt_device_opts {
    size_t staging_chunk;   /* bytes per page-locked staging slot; 0 = 8 MiB */
    unsigned staging_depth; /* staging slots; 0 = 8, at most 16. Loads of 8 chunks or more
                               run on up to depth / 2 threads, each with its own reads */
    unsigned copy_delay_us; /* stand-in only: every copy takes at least this long */
};

/** Open CUDA device @p ordinal (its primary context, one copy stream, page-locked staging).
 * @return 0, KVT_E_UNSUPPORTED (no driver or no such device: "unavailable"), -EIO, -ENOMEM. */
KVT_API int kvt_device_open_cuda(int ordinal, const struct kvt_device_opts *o, kvt_device **out);
/** Open the host-memory stand-in: its copies run on a worker thread, in order; close it with
 * kvt_device_close(). @return 0, -EINVAL (@p out NULL), -ENOMEM or -EAGAIN (the worker thread
 * could not start). */
KVT_API int kvt_device_open_host(const struct kvt_device_opts *o, kvt_device **out);
/** Close a device (NULL allowed); memory allocated on it must be freed first. */
KVT_API void kvt_device_close(kvt_device *d);
/** "cuda:0 NVIDIA H200", "host stand-in". */
KVT_API const char *kvt_device_name(const kvt_device *d);
/**
 * Allocate @p bytes of device memory (0 allowed: a valid, unique address) and set *@p addr.
 * The caller owns it and frees it with kvt_device_free() before kvt_device_close().
 * @return 0, -EINVAL (no device or @p addr), -EIO (CUDA refused, out of memory included; the
 * driver's message in kvt_last_error()) or -ENOMEM (the host stand-in). Any thread.
 */
KVT_API int kvt_device_alloc(kvt_device *d, size_t bytes, uint64_t *addr);
/**
 * Free memory kvt_device_alloc() returned on @p d (0 and a NULL device: nothing). No load,
 * save, copy or wrapping buffer (kvt_buf_wrap_device()) may still use it. Any thread.
 */
KVT_API void kvt_device_free(kvt_device *d, uint64_t addr);
/**
 * Synchronous copies of @p n bytes between host memory and device memory, through the staging
 * ring (allocated on first use): the copy is complete when the call returns. The device range
 * must lie in memory of @p d (not checked: CUDA reports -EIO, the stand-in would touch the
 * wrong memory). Copies, loads and saves of one device take turns; any thread.
 * @return 0, -EINVAL (no device, or a NULL host pointer with n > 0), -EIO (a CUDA failure,
 * the staging allocation included) or -ENOMEM (the stand-in's staging could not be allocated).
 */
KVT_API int kvt_device_upload(kvt_device *d, uint64_t dst, const void *src, size_t n);
KVT_API int kvt_device_download(kvt_device *d, void *dst, uint64_t src, size_t n);

/**
 * Wrap @p bytes of device memory at @p addr without copying, as kvt_buf_wrap() does host
 * memory (@p release(ud, NULL) runs exactly once). Caches over such buffers (contiguous views,
 * kvt_cache_from_state()) make entries that kvt_file_save() and kvt_store_put() write straight
 * from the device: each piece is copied into the device's staging ring, hashed and written
 * while the next pieces are copied. Nothing else reads or changes them: appends and updates
 * fail with KVT_E_UNSUPPORTED, and so does kvt_pcache_put() unless the prompt cache was opened
 * with this device (kvt_pcache_opts.device), which copies the entry into host memory.
 * The device must stay open, and the memory unchanged, until the buffer's release runs.
 */
KVT_API int kvt_buf_wrap_device(kvt_device *d, uint64_t addr, size_t bytes, kvt_release_fn release,
                                void *ud, kvt_buf **out);
/** The device whose memory @p b wraps (setting *@p addr), or NULL for host memory. */
KVT_API kvt_device *kvt_buf_device(const kvt_buf *b, uint64_t *addr);
/** The CUDA ordinal of @p d; -1 for the host stand-in. */
KVT_API int kvt_device_ordinal(const kvt_device *d);

/** As kvt_place_fn, for device memory: set @p dst[k] to the device address of slot k (0:
 * only check it). */
typedef int (*kvt_device_place_fn)(void *ud, const struct kvt_header *h, uint64_t *dst);

/**
 * kvt_file_load_into() into device memory: the file streams through the device's staging
 * ring, each chunk hashed there and copied to the device while the next is read. Every copy
 * has finished when the call returns; on failure the device memory must not be used.
 * @return the codes of kvt_file_load_into(), and -EIO for a CUDA failure.
 */
KVT_API int kvt_file_load_to_device(const char *path, const struct kvt_expect *x, kvt_device *d,
                                    kvt_device_place_fn place, void *ud,
                                    struct kvt_header **out_header);
/** kvt_store_restore_into() into device memory (kvt_file_load_to_device()): 0 with
 * *@p out_header set, 0 with it NULL on a miss (the device memory must not be used), @p place's
 * refusal, or -EINVAL. */
KVT_API int kvt_store_restore_to_device(kvt_store *s, const struct kvt_hit *hit, kvt_device *d,
                                        kvt_device_place_fn place, void *ud,
                                        struct kvt_header **out_header);
/**
 * kvt_pcache_take() into the memory of the prompt cache's device (kvt_pcache_opts.device):
 * the taken prefix is described to @p place as a header (its tokens, each cache's state cut to
 * the prefix, tensors contiguous), which sets the device address of each tensor; the bytes are
 * copied there from the RAM tier's page-locked memory, or streamed from the file of a disk hit
 * (kvt_store_restore_prefix_to_device()). On return every copy is done; *@p out_header (free
 * with kvt_header_free()) is that header, NULL on a miss. @p out tells the tier (from_disk,
 * from_remote); its entry and retain are NULL. The RAM donor stays in RAM. A disk or remote
 * hit that fits the RAM tier is copied back from the landed memory into page-locked memory on
 * the device's stream after the call returns (work queued later on the legacy default stream
 * waits for it; work on other streams must not write that memory before the next prompt
 * cache call), and joins RAM at the next take or put.
 * @return 0 (hit or miss), the placement's refusal, -EINVAL (no device), -EIO, -ENOMEM.
 */
KVT_API int kvt_pcache_take_to_device(kvt_pcache *pc, const int32_t *tok, size_t n, const char *ns,
                                      kvt_device_place_fn place, void *ud, struct kvt_take *out,
                                      struct kvt_header **out_header);

/**
 * A take into device memory whose copies may still run: kvt_pcache_take_to_device_async().
 * Slot k is the k-th tensor of the header (for a kv cache of L layers: 2i keys, 2i+1 values
 * of layer i).
 */
typedef struct kvt_dtake kvt_dtake;
/**
 * kvt_pcache_take_to_device() that returns once the copies of a RAM hit are queued, on a
 * stream of the device's own that first waits for the work queued so far on the legacy
 * default stream, with an event after each slot's copies: a model waits for layer i only
 * when it reaches it (kvt_dtake_wait()), and the restore overlaps its first layers. A disk
 * or remote hit has landed on return, as with kvt_pcache_take_to_device(). On a hit,
 * *@p pending (NULL on a miss or failure) must be ended with kvt_dtake_end(), the device still
 * open; the memory must not be read before a wait for its slot, nor freed before that wait or
 * the end.
 */
KVT_API int kvt_pcache_take_to_device_async(kvt_pcache *pc, const int32_t *tok, size_t n,
                                            const char *ns, kvt_device_place_fn place, void *ud,
                                            struct kvt_take *out, struct kvt_header **out_header,
                                            kvt_dtake **pending);
/** Make CUDA stream @p stream (a CUstream; 0: the legacy default stream) wait, without the
 * host waiting, until slot @p slot has landed; the host stand-in waits on the host. -EINVAL
 * for a slot the take does not have, -EIO for a CUDA failure. */
KVT_API int kvt_dtake_wait(kvt_dtake *p, size_t slot, uint64_t stream);
/** Wait (on the host) for every copy of the take, then free it. 0, or -EIO. NULL allowed. */
KVT_API int kvt_dtake_end(kvt_dtake *p);

/**
 * kvt_store_restore_to_device() of only the hit's prefix (hit->prefix_len tokens, when the
 * entry holds more): the placement is given the header cut to it (token axis of every tensor
 * shortened, bytes to match), and only those rows are copied, straight into its memory; the
 * whole file is still read and checked. *@p out_header is the cut header. Kv caches of
 * [B, H, T, D] tensors only: KVT_E_UNSUPPORTED for other kinds.
 */
KVT_API int kvt_store_restore_prefix_to_device(kvt_store *s, const struct kvt_hit *hit,
                                               kvt_device *d, kvt_device_place_fn place, void *ud,
                                               struct kvt_header **out_header);

#ifdef __cplusplus
}
#endif
#endif /* KVTIER_H */
