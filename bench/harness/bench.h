/*
 * The pieces of `kvtier bench`: the device limits measured in the same run (raw writes and
 * reads of the same bytes, memcpy), peak-RSS measurement in a child process, statistics, the
 * model-shaped entries, the numpy peer and the report (table, JSON, gnuplot).
 */
#ifndef KVT_BENCH_H
#define KVT_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvtier.h"

/* A byte range of a file and the memory that holds (or receives) its bytes. */
struct bench_span {
    void *data;
    uint64_t off;
    size_t len;
};

/* Seconds on the monotonic clock. */
double bench_now(void);
/* Median of @p n values (sorts @p v in place); 0 when n == 0. */
double bench_median(double *v, size_t n);

/* ---- the `kvtier bench` run (bench_run.c) ------------------------------------------------ */

#define BENCH_MAX_SIZES 32

struct bench_opts {
    const char *dir;
    uint64_t sizes[BENCH_MAX_SIZES];
    size_t n_sizes;
    int repeat;
    const char *json_path; /* "-" = stdout */
    const char *plot_path;
    bool peers;
    const char *python;
    const char *peer_script;
};

/*
 * Measure every size of @p o and print the report (table, and JSON / plot when asked).
 * Messages go to stderr. @return 0, or -1 when a measurement or an output failed.
 */
int bench_run(const struct bench_opts *o);

/* ---- raw limits (bench_raw.c) ----------------------------------------------------------- */

/* How the raw reads and writes reach the device: "io_uring" or "threads". */
const char *bench_raw_engine(void);
/*
 * Create @p path (truncating), write @p n spans, set the size to @p file_size, fsync the file
 * and its directory. @p direct: O_DIRECT through aligned staging buffers with several writes
 * in flight; otherwise plain buffered pwrite() straight from the spans.
 * *@p secs receives the time from open to the directory fsync.
 */
int bench_raw_write(const char *path, const struct bench_span *s, size_t n, uint64_t file_size,
                    bool direct, double *secs);
/*
 * Read each span's file range into its memory (4096-aligned, with room for the length
 * rounded up to 4096) with O_DIRECT and several reads in flight; buffered reads where the
 * filesystem refuses O_DIRECT (*@p was_direct tells which). *@p secs: open to close.
 */
int bench_raw_read(const char *path, const struct bench_span *s, size_t n, double *secs,
                   bool *was_direct);
/* Make @p path cold: fdatasync, then drop its pages from the page cache. */
int bench_make_cold(const char *path);
/** Commit the file system holding @p dir (syncfs), so that the blocks of files removed
 * before are freed (and discarded, on a disk mounted with discard) before a timed write
 * starts, not during it. 0 or -errno. */
int bench_settle_disk(const char *dir);
/* Make @p path warm: read it all through the page cache. */
int bench_make_warm(const char *path);
/*
 * Touch and free @p bytes of anonymous memory, so that the next step finds recently used
 * memory to allocate from, whatever the step before it did. On a VM that backs guest memory
 * lazily, memory freed a while ago costs a host fault per page on its next use, and without
 * this whichever step follows a large free would win.
 */
void bench_level_memory(uint64_t bytes);
/* @p len rounded up to the 4096-byte direct-I/O granule. */
uint64_t bench_round_up(uint64_t len);
/* An anonymous mapping of bench_round_up(@p len) bytes, touched first when @p prefault. */
void *bench_map(uint64_t len, bool prefault);
void bench_unmap(void *p, uint64_t len);

/* ---- a measurement in a forked child (bench_child.c) ------------------------------------ */

struct bench_child_result {
    int rc;              /* the function's return value, or -ECHILD if the child died */
    double secs;         /* the time the function measured */
    uint64_t value;      /* a figure the function reports (e.g. bytes restored) */
    uint64_t peak_extra; /* VmHWM at the end minus VmRSS at the start, bytes */
    char msg[256];       /* kvt_last_error() of a failed call */
};
typedef int (*bench_child_fn)(void *arg, double *secs, uint64_t *value);
/*
 * Run @p fn(@p arg, ...) in a forked child whose peak-RSS mark was reset at the start
 * (/proc/self/clear_refs "5"), so that peak_extra is the memory the call added at its peak.
 * Returns 0 when the child reported (its outcome is in r->rc) or -errno when it could not run.
 */
int bench_in_child(bench_child_fn fn, void *arg, struct bench_child_result *r);

/* ---- model-shaped entries and the kvtier side (bench_kvt.c) ----------------------------- */

struct bench_model {
    int layers, kv_heads, head_dim, dtype;
};
/* Llama-3-8B's KV geometry: 32 layers x 8 KV heads x 128 head dim, bfloat16. */
extern const struct bench_model bench_llama3_8b;

/* State bytes one token adds to an entry of model @p m (K and V of every layer). */
size_t bench_token_bytes(const struct bench_model *m);
/* Fill @p n bytes with the xorshift64* stream of @p state (deterministic). */
void bench_fill(void *dst, size_t n, uint64_t *state);

/* A device bench: its name, default directory, what it prints first and what it runs per
 * size (bench_device_main() parses the shared options and opens the device). */
struct bench_device_prog {
    const char *name, *dir;
    int max_repeat;
    void (*header)(kvt_device *d, int repeat);
    int (*run_size)(kvt_device *d, const char *dir, uint64_t bytes, int repeat);
};
int bench_device_main(int argc, char **argv, const struct bench_device_prog *p);
/** The time of the raw read of @p bytes of @p path into @p buf: cold (page cache dropped,
 * O_DIRECT with several reads in flight) or warm (one buffered read of the cached file). */
double bench_read_limit(const char *path, void *buf, uint64_t bytes, bool cold);
/* Append @p len tokens of pseudo-random K and V (from @p rng) to the kv cache @p c. */
int bench_cache_append_random(kvt_cache *c, const struct bench_model *m, size_t len, uint64_t *rng);
/*
 * A library-owned entry of one kv cache per layer holding @p n_tokens tokens of pseudo-random
 * state (seeded by @p seed), appended in chunks of @p chunk tokens (0 = all at once) the way a
 * prefill does. @p tok (may be NULL) supplies the token ids; otherwise they are pseudo-random.
 */
int bench_entry_build(const struct bench_model *m, const int32_t *tok, size_t n_tokens,
                      size_t chunk, uint64_t seed, struct kvt_entry **out);
/* Wyhash of the persisted state bytes of @p e, cache by cache, tensor by tensor, in order. */
int bench_entry_state_hash(const struct kvt_entry *e, uint64_t *out);

/* The file layout of a saved entry as spans over the entry's own memory (for raw writes). */
struct bench_layout {
    struct bench_span *spans; /* [0] is the header block (prefix, JSON, padding) */
    size_t n_spans;
    uint64_t file_bytes;
    void *header_block;
    struct kvt_tensor *copies; /* contiguous copies of state tensors that were strided */
    size_t n_copies;
};
int bench_layout_build(const struct kvt_entry *e, const char *path, struct bench_layout *l);
void bench_layout_free(struct bench_layout *l);

/* What a kvtier job run in a child does. */
struct bench_kvt_job {
    const char *path;
    const struct kvt_entry *e; /* for saves */
    bool verify;               /* for loads: check tensor hashes */
    bool keep_cache;           /* for loads: leave the file's pages cached */
};
/* kvt_file_save() with fsync; *value = file bytes. */
int bench_kvt_save(void *arg, double *secs, uint64_t *value);
/* kvt_file_load(); *value = kvt_entry_bytes() of the restored entry. */
int bench_kvt_load(void *arg, double *secs, uint64_t *value);

/* ---- the numpy peer (bench_peer.c) ------------------------------------------------------ */

#define BENCH_MAX_REPEAT 64

struct bench_peer {
    bool failed; /* a run failed: no peer figures for this size */
    int n;       /* repetitions measured */
    double save_s[BENCH_MAX_REPEAT], cold_s[BENCH_MAX_REPEAT], warm_s[BENCH_MAX_REPEAT];
    uint64_t file_bytes;
    char version[32];
};
/* Locate the numpy peer script: @p hint, $KVTIER_PEERS, next to the binary, ./bench/peers. */
char *bench_peer_script(const char *hint);
/*
 * Run one repetition of the peer on the tensors of @p src in @p dir; its seconds become
 * repetition @p i of @p p, so that each is compared with kvtier's figures of the same repetition.
 */
int bench_peer_step(const char *python, const char *script, const char *src, const char *dir, int i,
                    struct bench_peer *p);

/* ---- per-size results and the report (bench_report.c) ----------------------------------- */

enum bench_fig {
    BF_SAVE,             /* kvt_file_save with fsync */
    BF_RAW_WRITE,        /* buffered pwrite + fsync of the same bytes */
    BF_RAW_WRITE_DIRECT, /* O_DIRECT writes + fsync of the same bytes */
    BF_COLD,             /* kvt_file_load, cold, hash check on */
    BF_COLD_NOVERIFY,    /* kvt_file_load, cold, hash check off */
    BF_RAW_READ,         /* O_DIRECT read into freshly allocated buffers, one per tensor */
    BF_RAW_READ_HOT,     /* O_DIRECT read into memory already faulted in */
    BF_WARM,             /* kvt_file_load, page cache warm, hash check on */
    BF_WARM_NOVERIFY,    /* kvt_file_load, page cache warm, hash check off */
    BF_MEMCPY,           /* memcpy of the same bytes into freshly allocated buffers */
    BF_MEMCPY_HOT,       /* memcpy of the same bytes into memory already faulted in */
    BF_COLD_CHILD,       /* kvt_file_load, cold, hash check on, in a fresh child process */
    BF_COUNT
};

struct bench_row {
    uint64_t target_bytes;   /* the size asked for */
    uint64_t entry_bytes;    /* kvt_entry_bytes() of the built entry */
    uint64_t file_bytes;     /* the .mlxkv file */
    uint64_t restored_bytes; /* kvt_entry_bytes() of a restored entry (with capacity slack) */
    size_t tokens;
    bool direct_read; /* the raw read used O_DIRECT */
    int n;            /* repetitions measured */
    double secs[BF_COUNT][BENCH_MAX_REPEAT];
    double rss_restore[BENCH_MAX_REPEAT], rss_save[BENCH_MAX_REPEAT];
    struct bench_peer peer;
};

/* Medians and ratios of one row (see PERFORMANCE.md for the definitions). */
struct bench_summary {
    double gbps[BF_COUNT];
    double save_ratio, cold_ratio, cold_ratio_hot, warm_ratio, warm_ratio_hot;
    double verify_cost, verify_cost_warm;
    /* 95 % intervals of the medians above (PERFORMANCE.md, Reported) */
    double save_ci[2], cold_ci[2], warm_ci[2], verify_ci[2];
    double rss_restore, rss_save;
    bool has_peer;
    double peer_save_gbps, peer_cold_gbps, peer_warm_gbps;
    double peer_save_ratio, peer_cold_ratio, peer_warm_ratio; /* kvtier / numpy throughput */
    double peer_save_ci[2], peer_cold_ci[2], peer_warm_ci[2];
};
void bench_summarize(const struct bench_row *r, struct bench_summary *s);

struct bench_run_info {
    const char *dir;
    const struct bench_model *model;
    int repeat;
    double wall_s;
};
void bench_print_table(FILE *f, const struct bench_run_info *ri, const struct bench_row *rows,
                       size_t n);
void bench_print_json(FILE *f, const struct bench_run_info *ri, const struct bench_row *rows,
                      size_t n);
/* Draw throughput against entry size with gnuplot into @p path (.png or .svg). */
int bench_plot(const char *path, const struct bench_row *rows, size_t n);

#endif
