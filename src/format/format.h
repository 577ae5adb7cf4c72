/*
 * Internal interface of the .mlxkv v3 format layer (FORMAT.md): constants, the exact
 * JSON.stringify serializer of headers, the validating header reader that works on bytes in
 * memory (for the store, the CLI and the fuzz targets), and the check passes the writer reuses
 * on its own plan so that it never writes a file the reader would reject.
 */
#ifndef KVT_FORMAT_H
#define KVT_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "kvtier.h"

#define KVT_ALIGN 16384u
#define KVT_PREFIX_LEN 26u
#define KVT_MAGIC "MLXBUNKV2\n"
#define KVT_MAGIC_V1 "MLXBUNKV1\n"
#define KVT_MAGIC_LEN 10u
#define KVT_FORMAT_VERSION 3
#define KVT_DEFAULT_MAX_HEADER ((size_t)64 << 20)
#define KVT_SAFE_INT_LIMIT ((uint64_t)1 << 53) /* every header number is below this */
#define KVT_PLACEHOLDER_HASH 0                 /* renders as "0000000000000000" */

/** Chunk of streamed tensor I/O (bounded buffers in the writer, loader and verifier). */
#define KVT_IO_CHUNK ((size_t)8 << 20)

static inline uint64_t kvt_align_up(uint64_t n)
{
    return (n + (KVT_ALIGN - 1)) / KVT_ALIGN * KVT_ALIGN;
}

/* ---- growable text buffer for the serializer ---- */

struct kvt_sbuf {
    char *data;
    size_t len, cap;
    bool oom; /* sticky: an append failed */
};

void kvt_sbuf_free(struct kvt_sbuf *b);
void kvt_sbuf_put(struct kvt_sbuf *b, const void *s, size_t n);
void kvt_sbuf_puts(struct kvt_sbuf *b, const char *s);
void kvt_sbuf_put_u64(struct kvt_sbuf *b, uint64_t v);

/* ---- serializer (header_json.c) ---- */

/** Whether @p s (NUL-terminated) is valid UTF-8: no overlongs, surrogates or code points
 *  above U+10FFFF. On failure *bad_at (may be NULL) receives the offset of the bad byte. */
bool kvt_utf8_valid(const char *s, size_t *bad_at);

/** Append @p s as JavaScript JSON.stringify writes it (quotes included). Must be valid UTF-8. */
void kvt_json_put_string(struct kvt_sbuf *b, const char *s);

/**
 * Serialize @p h exactly as JSON.stringify writes the header object of FORMAT.md §3 (key order
 * §3.2-§3.4; created_at < 0 and NULL metadata are omitted). Numbers must be below 2^53 and the
 * strings valid UTF-8 (checked by kvt_header_check_writable()). @return 0 or -ENOMEM.
 */
int kvt_header_to_json(const struct kvt_header *h, struct kvt_sbuf *out);
/** kvt_header_to_json(), and @p hash_at (one per slot, all caches' slots in header order)
 * receives where each slot's 16 hex hash digits are in @p out, to patch them in place. */
int kvt_header_to_json_at(const struct kvt_header *h, struct kvt_sbuf *out, size_t *hash_at);
/** The 16 lowercase hex digits of @p v, as the header writes a hash. */
void kvt_json_hex64(char out[16], uint64_t v);

/* ---- writer (file_save.c) ---- */

/**
 * A save planned ahead of its path: the entry's state views taken, slots laid out, the header
 * rendered and the file sized once; kvt_file_save_planned() then writes it without planning
 * again (its first write step only writes). @p e and the memory its metadata points to must
 * stay valid until kvt_save_plan_free(); @p o as kvt_file_save() takes it (may be NULL).
 * Messages name the entry "entry". @return 0 or what kvt_file_plan_size() returns.
 */
struct kvt_save_plan;
int kvt_save_plan_new(const struct kvt_entry *e, const struct kvt_save_opts *o,
                      struct kvt_save_plan **out);
/** The bytes of the planned file. */
uint64_t kvt_save_plan_bytes(const struct kvt_save_plan *p);
/** kvt_file_save() of plan @p p to @p path (at most once per plan); frees nothing. */
int kvt_file_save_planned(const char *path, struct kvt_save_plan *p, uint64_t *out_bytes);
/**
 * The plan's state views in file order, the slot each belongs to (its hash is the
 * placeholder until set) and the planned header; *@p views and *@p slots have the returned
 * count. All stay the plan's.
 */
size_t kvt_save_plan_views(struct kvt_save_plan *p, const struct kvt_tensor **views,
                           struct kvt_slot *const **slots, const struct kvt_header **h);
/** The planned file's first data_start bytes with the slots' hashes as set now (malloc'd;
 *  NULL when out of memory); *@p hash (may be NULL) receives the header hash. */
uint8_t *kvt_save_plan_head(struct kvt_save_plan *p, uint64_t *hash);
/** Release the plan (its state views). Accepts NULL. */
void kvt_save_plan_free(struct kvt_save_plan *p);

/* ---- an entry's file bytes in memory (file_image.c) ---- */

/**
 * The .mlxkv bytes of @p e (as kvt_file_save() with @p o would write them, o->created_at
 * included) without writing them anywhere: every tensor is hashed once, and the bytes are
 * handed out as pieces of the entry's own memory (kvt_image_iov()), for a sender. The
 * entry's tensor memory must stay unchanged until kvt_image_free(). Host memory only.
 * @return 0, the plan's errors, or KVT_E_UNSUPPORTED for a tensor in device memory.
 */
struct kvt_image;
int kvt_image_new(const struct kvt_entry *e, const struct kvt_save_opts *o, struct kvt_image **out);
uint64_t kvt_image_bytes(const struct kvt_image *im);
uint64_t kvt_image_header_hash(const struct kvt_image *im);
/**
 * Pieces of the image's bytes [@p off, @p off + @p len) (within the image), in order: at most
 * @p max of them in @p iov; *@p covered receives the bytes they hold (less than @p len when
 * @p max ran out). The memory stays valid until kvt_image_free(). @return the count.
 */
size_t kvt_image_iov(const struct kvt_image *im, uint64_t off, uint64_t len, struct iovec *iov,
                     size_t max, uint64_t *covered);
void kvt_image_free(struct kvt_image *im);

/**
 * The checks a writer applies to a header it built: metadata is valid UTF-8, tokens are in
 * [0, 2^31), and V10 values plus V12-V20 hold (F = h->file_size). @return 0 or -EINVAL with a
 * message naming the check.
 */
int kvt_header_check_writable(const struct kvt_header *h);

/* ---- reader (header_read.c, header_parse.c, header_check.c) ---- */

/** The fixed prefix, decoded (V1-V5 passed). */
struct kvt_prefix {
    uint32_t header_len;
    uint32_t data_start;
    uint64_t header_hash;
};

/**
 * V1-V5 on the first @p n bytes of a file of @p file_size bytes (@p n may be less than 26 only
 * when the file is). @p name prefixes messages. @return 0, KVT_E_FORMAT, KVT_E_UNSUPPORTED or
 * KVT_E_CORRUPT.
 */
int kvt_prefix_check(const uint8_t *buf, size_t n, uint64_t file_size, size_t max_header_bytes,
                     const char *name, struct kvt_prefix *out);

/* The header JSON with its token list parsed apart (header_tokens.c). */
struct kvt_token_split {
    uint8_t *json; /* a copy of the JSON with the array's contents cut out */
    size_t len;    /* its length */
    size_t cut_at; /* where the contents were: bytes from here on came from cut_len later */
    size_t cut_len;
    int32_t *tok; /* the n_tok tokens */
    size_t n_tok;
};

/**
 * Fast path for the top-level "tokens" array: 1 with *@p out filled when it is a plain array
 * of integers in [0, 2^31); 0 (*@p out zeroed) when the general parser must read it; -ENOMEM.
 * The caller frees out->json and out->tok.
 */
int kvt_header_split_tokens(const uint8_t *json, size_t n, struct kvt_token_split *out);

/**
 * V6-V20 on the @p p->header_len JSON bytes at @p json, for a file of @p file_size bytes whose
 * prefix passed kvt_prefix_check(). @return 0 with *out set, KVT_E_UNSUPPORTED, KVT_E_CORRUPT
 * or -ENOMEM.
 */
int kvt_header_parse_json(const uint8_t *json, const struct kvt_prefix *p, uint64_t file_size,
                          const char *name, struct kvt_header **out);

/**
 * The whole header check from memory: @p buf holds the first @p n bytes of a file of
 * @p file_size bytes (n <= file_size). It must cover the prefix and the JSON when the file
 * has them (else -EINVAL). Fuzz targets pass (data, size, size). @p name (NULL = "header")
 * prefixes messages. @return as kvt_file_read_header().
 */
int kvt_header_parse(const uint8_t *buf, size_t n, uint64_t file_size,
                     const struct kvt_read_opts *o, const char *name, struct kvt_header **out);

/**
 * Read and validate the header of an open file (V1-V20), using the installed io backend.
 * @p name prefixes messages. @return as kvt_file_read_header().
 */
int kvt_header_read_fd(int fd, const struct kvt_read_opts *o, const char *name,
                       struct kvt_header **out);

/** V10 on parsed values (kinds, dtypes, quantization parameters); header_check.c. */
int kvt_header_check_values(const struct kvt_header *h, const char *name);
/** V14-V20 on a header whose fields passed V11-V13; header_check.c. */
int kvt_header_check_layout(const struct kvt_header *h, const char *name);

/* Parameter sets of V10. */
bool kvt_qkv_bits_ok(int64_t bits);
bool kvt_qkv_group_ok(int64_t group_size);
bool kvt_tq_bits_ok(int64_t bits);
bool kvt_tq_head_dim_ok(int64_t head_dim);

/** Whether @p kind's slot @p slot holds a rank-3 tensor (ssm conv) rather than rank 4. */
int kvt_slot_rank(int kind, int slot);

/** A scalar of a cache entry object: its JSON key and its field in struct kvt_cache_info. */
struct kvt_scalar {
    const char *key;
    size_t field; /* offsetof(struct kvt_cache_info, <field>), an int64_t */
};
/** The scalars of @p kind after "offset", in §3.3 key order; *n receives their count. */
const struct kvt_scalar *kvt_kind_scalars(int kind, int *n);

static inline int64_t *kvt_scalar_ptr(struct kvt_cache_info *info, const struct kvt_scalar *s)
{
    return (int64_t *)(void *)((char *)info + s->field);
}

static inline int64_t kvt_scalar_get(const struct kvt_cache_info *info, const struct kvt_scalar *s)
{
    return *(const int64_t *)(const void *)((const char *)info + s->field);
}

/* ---- loading (file_load.c, file_verify.c, tensor_read.c) ---- */

/**
 * L1 (identity keys; an absent header key does not match, except that an absent ns reads as
 * "") and L2 (donor-layer count) against @p x (NULL = nothing expected). @return 0 or
 * KVT_E_MISMATCH with "<name>: L1: <key> mismatch (file X, expected Y)".
 */
int kvt_header_check_expect(const struct kvt_header *h, const struct kvt_expect *x,
                            const char *name);
/**
 * Open @p path, read its header and check it against @p x: the start every load and verify
 * shares. @return 0 with *@p fd open and *@p h set, or the error with nothing left open.
 */
int kvt_file_open_header(const char *path, const struct kvt_expect *x, int *fd,
                         struct kvt_header **h);

/*
 * The caller's placement of the slots of a file loaded into memory it owns: host memory
 * (kvt_file_load_into()) or device memory (kvt_file_load_to_device()), and where to tell
 * whether it refused (a restore then leaves the file be: the failure is the caller's).
 */
struct kvt_placement {
    kvt_place_fn host;          /* host addresses; or */
    kvt_device_place_fn device; /* device addresses */
    void *ud;
    bool *refused; /* NULL, or set to whether the placement refused */
};
/**
 * Ask @p p where the slots of @p h go: *@p dst receives one void * (host) or uint64_t (device)
 * per slot in header order, the caller's to free, even on failure. @return 0, -ENOMEM or the
 * placement's refusal, with its message or "<name>: the destination was refused: ...".
 */
int kvt_placement_ask(const struct kvt_placement *p, const struct kvt_header *h, const char *name,
                      void **dst);
/** kvt_file_load_into() through @p p (a host placement). */
int kvt_file_load_placed(const char *path, const struct kvt_expect *x,
                         const struct kvt_placement *p, struct kvt_header **out_header);

/**
 * Where a slot's bytes go: @p blocks equal blocks, block k at dst + k * stride. Bytes from
 * dst + small_tail on (a buffer's small-page tail, kvt_buf_small_tail()) are read through
 * staging rather than straight into place; UINT64_MAX when there is none. @p zeroed: the
 * memory is known to be all zeros, so the slack between blocks is left untouched.
 */
struct kvt_slot_dst {
    uint8_t *dst;
    uint64_t blocks, stride;
    uint64_t small_tail;
    bool zeroed;
};

/** Streams the tensor ranges of one open file, reading ahead (io/stream.h). */
struct kvt_tensor_reader {
    int fd;
    const char *name; /* prefixes messages */
    const struct kvt_header *h;
    bool verify;            /* check slot hashes (L3) */
    bool keep_cache;        /* do not drop the ranges read from the page cache */
    struct kvt_rstream *rs; /* opened on the first read: the slots in header order */
    size_t next_ci;         /* the slot the stream delivers next */
    int next_sj;
    /* Optional: every slot's destination in header order (all caches' slots), given before
     * the first read so that the stream can read ahead straight into them. The memory must
     * stay valid until kvt_tensor_reader_free(). */
    const struct kvt_slot_dst *dst;
};

/**
 * Read slot @p sj of cache @p ci: its bytes are @p blocks equal blocks that land at
 * @p dst + k * @p dst_stride (k = 0 .. blocks - 1); @p dst NULL only hashes (verify). Slack
 * bytes between blocks are zeroed. Hashes in the same pass when r->verify. With r->dst, the
 * arguments must be the slot's entry there.
 * @return 0, KVT_E_CORRUPT (L3) or -errno.
 */
int kvt_tensor_read(struct kvt_tensor_reader *r, size_t ci, int sj, uint8_t *dst, uint64_t blocks,
                    uint64_t dst_stride);
/**
 * Read every slot in header order into its r->dst entry (NULL r->dst: hash only), as
 * kvt_tensor_read() on each would. When every slot is in the page cache, slots are copied
 * and hashed on several cores at once (kvt_mem_opts.no_parallel turns it off); the error
 * reported is then still that of the first failing slot in header order.
 * @return 0, KVT_E_CORRUPT (L3), -EINVAL (bad geometry) or -errno.
 */
int kvt_tensor_read_all(struct kvt_tensor_reader *r);
/**
 * kvt_tensor_read_all() of the @p nf files @p r (each with its r->dst) as one load: when every
 * slot of all of them is in the page cache, slots of all files are copied and hashed on
 * several cores at once (kvt_read_choose_files()); else file by file in order, the next file's
 * read-ahead stream opened while this one is read. Every reader's stream is freed on return.
 * @return as kvt_tensor_read_all(); on failure *@p failed (may be NULL) is the index of the
 * file whose error is reported (the first failing one in order).
 */
int kvt_tensor_read_files(struct kvt_tensor_reader *r, size_t nf, size_t *failed);
void kvt_tensor_reader_free(struct kvt_tensor_reader *r);

/**
 * @p h cut to its first @p keep tokens (keep < h->n_tokens), as a load of only that prefix
 * lays it out: every cache a kv cache of [B, H, T, D] slots, T cut by the same count, slots
 * contiguous in order, hashes 0. @return 0, KVT_E_UNSUPPORTED for other kinds (their trims
 * are not cuts of rows) or -ENOMEM.
 */
int kvt_header_cut_prefix(const struct kvt_header *h, size_t keep, struct kvt_header **out);

/** Rows a restore gives a token-axis cache of @p offset rows (CACHES.md §12). */
uint64_t kvt_restore_cap(uint64_t offset);

/** The fresh tensors a load of a header restores into, and where each slot's bytes go. */
struct kvt_load_bufs {
    struct kvt_tensor *t;   /* one per slot, all caches' slots in header order */
    struct kvt_slot_dst *d; /* the same order */
    size_t made;            /* tensors allocated */
};
/**
 * Allocate a tensor for every slot of @p h (token-axis kinds with restore capacity, the
 * slack zeroed or to be zeroed per d->zeroed). @return 0, or -ENOMEM with nothing left.
 */
int kvt_load_bufs_new(const struct kvt_header *h, const char *name, struct kvt_load_bufs *b);
/** The entry of @p h from its filled tensors @p b (its caches take their own references). */
int kvt_load_bufs_entry(const struct kvt_header *h, const char *name, struct kvt_load_bufs *b,
                        struct kvt_entry **out);
void kvt_load_bufs_free(struct kvt_load_bufs *b);

/* ---- a load fed the file's bytes in order (feed_load.c) ---- */

/**
 * A load of a file of @p size bytes whose bytes arrive in order (over a network) instead of
 * being read: each is written by the feeder where kvt_feed_next() says, and checked as
 * kvt_file_load() checks it the moment it is in. @p x (may be NULL) is copied; the strings it
 * points to must outlive the feed. @p name prefixes messages. @return 0 or -ENOMEM.
 */
struct kvt_feed;
int kvt_feed_new(uint64_t size, const struct kvt_expect *x, const char *name,
                 struct kvt_feed **out);
/**
 * Where the next bytes of the file go: *@p len (> 0) contiguous bytes at *@p at.
 * @return 0, or the error that stopped the feed (a failed check: KVT_E_*, -EINVAL, -ENOMEM).
 */
int kvt_feed_next(struct kvt_feed *f, uint8_t **at, size_t *len);
/** The first @p n bytes kvt_feed_next() asked for were written: checks what is complete.
 *  @return 0 or the error that stops the feed (then sticky). */
int kvt_feed_wrote(struct kvt_feed *f, size_t n);
/** All bytes are in: the entry (and the header, when @p out_header is not NULL).
 *  @return 0, the feed's error, or -EINVAL when bytes are missing. */
int kvt_feed_finish(struct kvt_feed *f, struct kvt_entry **out, struct kvt_header **out_header);
/**
 * Land the slots in the caller's memory instead of new buffers: once the header is in and
 * checked, @p fn receives it and fills the destination of each of its @p n slots (header
 * order; zeroed set where the rows between blocks belong to others) or returns the error that
 * stops the feed. kvt_feed_finish() then gives the header only (*out NULL). Call before the
 * first byte.
 */
typedef int (*kvt_feed_place_fn)(void *ud, const struct kvt_header *h, struct kvt_slot_dst *d,
                                 size_t n);
void kvt_feed_place(struct kvt_feed *f, kvt_feed_place_fn fn, void *ud);
/** Back to the file's first byte (a transfer that starts over). */
void kvt_feed_reset(struct kvt_feed *f);
void kvt_feed_free(struct kvt_feed *f);

/** Absolute file offset of slot @p s (data_start + off; V17 guarantees no overflow). */
static inline uint64_t kvt_slot_abs(const struct kvt_header *h, const struct kvt_slot *s)
{
    return (uint64_t)h->data_start + s->off;
}

/** "caches[i].tensors[j]"-style name of a slot into @p buf. */
const char *kvt_slot_name(char *buf, size_t n, size_t cache, int slot);

#endif
