/*
 * Single-byte corruption and truncation sweep over a small file holding all six kinds, written
 * through the public API (kvt_file_save of a synthetic entry, tests/progs/crash_entry.h).
 *
 * Flips. A recording io backend first finds the exact set of bytes a load reads. Every one of
 * those bytes is flipped on its own (one bit, cycling through the bit positions; all eight bits
 * in the 26-byte prefix) and the file loaded with tensor hashes checked; the outcome is known
 * from the layout: the prefix, the header JSON and every tensor byte are protected (the load
 * must fail: headerLen and dataStart by V3/V5, the JSON by its hash, the tensors by theirs),
 * anything else the load reads must not matter (identical tensors). The bytes no load reads
 * (the zero padding after the header, the gaps between tensors) cannot change a result that
 * depends only on the bytes read; each such run is flipped as a whole (every byte of it at
 * once) and must load identically without reading any of it, and every 61st of them is also
 * flipped on its own. A flipped tensor byte loaded without hash checks must come back exactly
 * as the file holds it.
 *
 * Truncations. Every length short of the file must fail as corrupt (and every 97th also
 * without hash checks). Under the address,undefined build the sweep also shows that no such
 * input makes a load read out of bounds.
 *
 * Both sweeps deal their cases round-robin to one worker process per CPU (up to 8), each
 * damaging and loading its own copy of the file; the counts printed are the sums.
 *
 * Hostile headers: crafted files whose header hash is right but whose content is not (huge
 * headerLen, overlapping or misaligned slots, huge shapes, overflowing products, wrong tensor
 * counts, duplicate keys, invalid UTF-8, trailing junk, ...) must fail load and verify with the
 * expected category and check ID, and a store scan must act by category (delete what is
 * corrupt, keep and skip the rest). Wrong arguments to the file and store API fail with
 * -EINVAL (or the OS error) and leave the out-parameters NULL.
 */
#include "support/support.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/io.h"
#include "progs/crash_entry.h"

#define PREFIX 26
#define UNREAD_STRIDE 61
#define UNVERIFIED_STRIDE 97

static char *dir, *path;
static uint8_t *img; /* the intact file */
static size_t img_len;
static struct kvt_entry *ref;  /* its load */
static struct kvt_header *hdr; /* its header */

static int setup(void **state)
{
    (void)state;
    dir = scratch_dir("sweep");
    if (!dir)
        return -1;
    path = strf("%s/mixed.mlxkv", dir);
    int32_t tok[12]; /* 12 tokens: both rings (maxSize 8) have wrapped */
    for (int i = 0; i < 12; i++)
        tok[i] = 1000 + 37 * i;
    struct kvt_entry *e;
    if (synth_entry(tok, 12, SYNTH_ALL_KINDS, 6, "sweep", &e) != 0)
        return -1;
    struct kvt_save_opts o = {.no_sync = true};
    int rc = kvt_file_save(path, e, &o, NULL);
    if (rc == 0)
        rc = kvt_file_load(path, NULL, &ref, &hdr);
    if (rc == 0 && !synth_same_caches(ref, e))
        rc = -1;
    kvt_entry_free(e);
    img = read_file(path, &img_len);
    return rc == 0 && img ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvt_entry_free(ref);
    kvt_header_free(hdr);
    free(img);
    if (dir)
        rm_rf(dir);
    free(path);
    free(dir);
    return 0;
}

/* ---- a backend that records which file bytes are read -------------------------------- */

static uint8_t *read_map; /* one flag per byte of the file */
static struct kvt_io recording;

static ssize_t recording_pread(int fd, void *buf, size_t n, uint64_t off)
{
    ssize_t r = kvt_io_posix()->pread(fd, buf, n, off);
    for (ssize_t i = 0; i < r && off + (uint64_t)i < img_len; i++)
        read_map[off + (uint64_t)i] = 1;
    return r;
}

/* Load with @p x through the recording backend, OR-ing the bytes read into read_map. */
static int recorded_load(const struct kvt_expect *x, struct kvt_entry **e)
{
    recording = *kvt_io_posix();
    recording.name = "recording";
    recording.pread = recording_pread;
    kvt_io_set(&recording);
    int rc = kvt_file_load(path, x, e, NULL);
    kvt_io_set(NULL);
    return rc;
}

/* Whether a flip at @p off must make a load with hash checks fail. */
static bool is_protected(uint64_t off)
{
    return loader_checks_byte(hdr, off);
}

/* The slot whose bytes hold @p off, or false. */
static bool slot_at(uint64_t off, size_t *ci, int *sj)
{
    for (size_t i = 0; i < hdr->n_caches; i++)
        for (int j = 0; j < hdr->caches[i].n_slots; j++) {
            const struct kvt_slot *s = &hdr->caches[i].slots[j];
            uint64_t a = (uint64_t)hdr->data_start + s->off;
            if (off >= a && off < a + s->bytes) {
                *ci = i;
                *sj = j;
                return true;
            }
        }
    return false;
}

/* ---- the sweeps' workers ---------------------------------------------------------------- */

/*
 * The flips and truncations are independent cases, each one load of the damaged file: they
 * are dealt round-robin to one worker process per CPU (at most MAX_WORKERS), each with its
 * own copy of the file, and the parent sums what they counted. A worker that finds a broken
 * expectation prints it and exits 1; the parent fails the test. With one CPU the cases run
 * in the test process itself.
 */
#define MAX_WORKERS 8
#define N_COUNTS 12

static bool in_worker;

static void check_failed(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void check_failed(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (in_worker) {
        fprintf(stderr, "worker %d: %s\n", (int)getpid(), msg);
        _exit(1);
    }
    fail_msg("%s", msg);
    abort(); /* not reached */
}

/* An expectation of one case: fails the test, from a worker or the test process. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            check_failed(__VA_ARGS__);                                                             \
    } while (0)

static unsigned worker_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_WORKERS ? MAX_WORKERS : (unsigned)n;
}

/*
 * Run @p fn(k, n, counts) for k in [0, n) on n = worker_count() workers, each loading its own
 * copy of the intact file (the global path names it there), and add their counts into
 * @p sum (N_COUNTS longs).
 */
static void in_workers(void (*fn)(unsigned k, unsigned n, long *counts), long *sum)
{
    unsigned n = worker_count();
    if (n == 1) {
        fn(0, 1, sum);
        return;
    }
    pid_t pid[MAX_WORKERS];
    int rd[MAX_WORKERS];
    for (unsigned k = 0; k < n; k++) {
        int p[2];
        assert_int_equal(pipe(p), 0);
        fflush(NULL);
        pid[k] = fork();
        assert_true(pid[k] >= 0);
        if (pid[k] == 0) {
            close(p[0]);
            in_worker = true;
            path = strf("%s/worker%u.mlxkv", dir, k);
            CHECK(write_file(path, img, img_len) == 0, "cannot write %s", path);
            long c[N_COUNTS] = {0};
            fn(k, n, c);
            unlink(path);
            _exit(write(p[1], c, sizeof(c)) == (ssize_t)sizeof(c) ? 0 : 1);
        }
        close(p[1]);
        rd[k] = p[0];
    }
    bool ok = true;
    for (unsigned k = 0; k < n; k++) {
        long c[N_COUNTS];
        ok &= read(rd[k], c, sizeof(c)) == (ssize_t)sizeof(c);
        close(rd[k]);
        int st;
        ok &= waitpid(pid[k], &st, 0) == pid[k] && WIFEXITED(st) && WEXITSTATUS(st) == 0;
        for (int i = 0; ok && i < N_COUNTS; i++)
            sum[i] += c[i];
    }
    if (!ok)
        fail_msg("a sweep worker failed (its message is above)");
}

static void put_byte(int fd, uint64_t off, uint8_t v)
{
    CHECK(pwrite(fd, &v, 1, (off_t)off) == 1, "write at %llu failed", (unsigned long long)off);
}

/* Without hash checks, the flipped slot must hold exactly the file's (flipped) bytes. */
static void check_unverified(uint64_t off)
{
    size_t ci = 0;
    int sj = 0;
    CHECK(slot_at(off, &ci, &sj), "offset %llu is in no slot", (unsigned long long)off);
    struct kvt_expect x = {.no_verify = true, .keep_cache = true};
    struct kvt_entry *e = NULL;
    int rc = kvt_file_load(path, &x, &e, NULL);
    CHECK(rc == 0, "offset %llu: load without hash checks: %s", (unsigned long long)off,
          kvt_last_error());
    const struct kvt_slot *s = &hdr->caches[ci].slots[sj];
    struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
    int nt = kvt_cache_state(e->caches[ci], t);
    CHECK(nt == hdr->caches[ci].n_slots, "offset %llu: %d tensors", (unsigned long long)off, nt);
    CHECK(kvt_tensor_nbytes(&t[sj]) == s->bytes, "offset %llu: tensor size",
          (unsigned long long)off);
    uint8_t *got = malloc(s->bytes);
    CHECK(got != NULL, "out of memory");
    kvt_tensor_copy_out(&t[sj], got);
    uint64_t a = (uint64_t)hdr->data_start + s->off;
    CHECK(got[off - a] == (img[off] ^ (uint8_t)(1u << (off % 8))),
          "offset %llu: the flipped byte came back as %u", (unsigned long long)off, got[off - a]);
    got[off - a] = img[off];
    CHECK(memcmp(got, img + a, s->bytes) == 0, "offset %llu: other bytes of the tensor differ",
          (unsigned long long)off);
    free(got);
    for (int k = 0; k < nt; k++)
        kvt_tensor_release(&t[k]);
    kvt_entry_free(e);
}

/* The flip sweep's counts (N_COUNTS longs). */
struct flip_counts {
    long loads, failed, identical, unverified, by_code[4]; /* corrupt, format, unsupported, other */
    long unread_runs, unread_single, spare[2];
};
_Static_assert(sizeof(struct flip_counts) == N_COUNTS * sizeof(long), "counts");

/* Load the (damaged) file with hash checks; @p protected_ says whether it must fail. */
static void expect_load(bool protected_, uint64_t off, struct flip_counts *c)
{
    struct kvt_expect x = {.keep_cache = true};
    struct kvt_entry *e = NULL;
    int rc = kvt_file_load(path, &x, &e, NULL);
    c->loads++;
    if (rc != 0) {
        c->failed++;
        CHECK(e == NULL, "flip at %llu: a failed load returned an entry", (unsigned long long)off);
        c->by_code[rc == KVT_E_CORRUPT       ? 0
                   : rc == KVT_E_FORMAT      ? 1
                   : rc == KVT_E_UNSUPPORTED ? 2
                                             : 3]++;
        CHECK(protected_, "flip at %llu (does not matter) failed the load: %s",
              (unsigned long long)off, kvt_last_error());
        CHECK(rc == KVT_E_CORRUPT || rc == KVT_E_FORMAT || rc == KVT_E_UNSUPPORTED,
              "flip at %llu: unexpected error %d: %s", (unsigned long long)off, rc,
              kvt_last_error());
        return;
    }
    CHECK(!protected_, "flip at %llu (protected) loaded", (unsigned long long)off);
    CHECK(synth_same_caches(e, ref), "flip at %llu loaded different tensors",
          (unsigned long long)off);
    c->identical++;
    kvt_entry_free(e);
}

/*
 * A run [off, end) of bytes no load reads: all of it flipped at once must load identically
 * without any of it being read, and every UNREAD_STRIDE-th byte of it on its own.
 */
static void flip_unread_run(int fd, uint64_t off, uint64_t end, struct flip_counts *c)
{
    struct kvt_expect on = {.keep_cache = true};
    struct kvt_entry *e = NULL;
    uint8_t *junk = malloc(end - off);
    CHECK(junk != NULL, "out of memory");
    for (uint64_t i = off; i < end; i++)
        junk[i - off] = img[i] ^ (uint8_t)(1u << (i % 8));
    CHECK(pwrite(fd, junk, end - off, (off_t)off) == (ssize_t)(end - off), "write failed");
    CHECK(recorded_load(&on, &e) == 0, "unread run at %llu: load failed: %s",
          (unsigned long long)off, kvt_last_error());
    c->loads++;
    c->identical++;
    CHECK(synth_same_caches(e, ref), "unread run at %llu: different tensors",
          (unsigned long long)off);
    kvt_entry_free(e);
    for (uint64_t i = off; i < end; i++)
        CHECK(!read_map[i], "a load read byte %llu only after it was damaged",
              (unsigned long long)i);
    CHECK(pwrite(fd, img + off, end - off, (off_t)off) == (ssize_t)(end - off), "write failed");
    for (uint64_t i = off + (off % UNREAD_STRIDE ? UNREAD_STRIDE - off % UNREAD_STRIDE : 0);
         i < end; i += UNREAD_STRIDE) {
        put_byte(fd, i, junk[i - off]);
        expect_load(false, i, c);
        put_byte(fd, i, img[i]);
        c->unread_single++;
    }
    free(junk);
    c->unread_runs++;
}

/* A byte a load reads, flipped (every bit of it in the prefix, one bit elsewhere). */
static void flip_read_byte(int fd, uint64_t off, struct flip_counts *c)
{
    int bits = off < PREFIX ? 8 : 1;
    for (int b = 0; b < bits; b++) {
        uint8_t mask = (uint8_t)(1u << (off < PREFIX ? b : (int)(off % 8)));
        put_byte(fd, off, img[off] ^ mask);
        expect_load(is_protected(off), off, c);
        if (off >= hdr->data_start && is_protected(off)) {
            check_unverified(off);
            c->unverified++;
        }
    }
    put_byte(fd, off, img[off]);
}

/* Worker @p k of @p n: every n-th case of the flip sweep (a read byte, or an unread run). */
static void flip_cases(unsigned k, unsigned n, long *counts)
{
    struct flip_counts *c = (struct flip_counts *)counts;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    CHECK(fd >= 0, "cannot open %s", path);
    uint64_t cases = 0;
    for (uint64_t off = 0; off < img_len; off++, cases++) {
        uint64_t end = off + 1;
        while (!read_map[off] && end < img_len && !read_map[end])
            end++;
        if (cases % n == k) {
            if (read_map[off])
                flip_read_byte(fd, off, c);
            else
                flip_unread_run(fd, off, end, c);
        }
        off = end - 1;
    }
    close(fd);
}

static void test_every_byte_flipped(void **state)
{
    (void)state;
    read_map = calloc(img_len, 1);
    assert_non_null(read_map);
    struct kvt_entry *e = NULL;
    struct kvt_expect on = {.keep_cache = true}, off_ = {.keep_cache = true, .no_verify = true};
    assert_int_equal(recorded_load(&on, &e), 0);
    kvt_entry_free(e);
    assert_int_equal(recorded_load(&off_, &e), 0);
    kvt_entry_free(e);
    long n_read = 0;
    for (uint64_t off = 0; off < img_len; off++) {
        n_read += read_map[off];
        if (is_protected(off) && !read_map[off])
            fail_msg("the load never reads protected byte %llu", (unsigned long long)off);
    }

    struct flip_counts c = {0};
    in_workers(flip_cases, (long *)&c);
    free(read_map);
    read_map = NULL;
    print_message("sweep: %zu-byte file, %ld bytes read by a load, each flipped: %ld loads, "
                  "%ld failed (%ld corrupt, %ld format, %ld unsupported, %ld other), %ld "
                  "identical; %ld tensor flips exact without hash checks; %ld unread runs "
                  "flipped whole, %ld unread bytes flipped alone (%u workers)\n",
                  img_len, n_read, c.loads, c.failed, c.by_code[0], c.by_code[1], c.by_code[2],
                  c.by_code[3], c.identical, c.unverified, c.unread_runs, c.unread_single,
                  worker_count());
    assert_int_equal(c.by_code[3], 0);
    assert_true(c.identical > 0 && c.failed > 0 && c.unverified > 0 && c.unread_runs > 0);
}

/* Worker @p k of @p n: every n-th truncation length, from the longest down. */
static void truncation_cases(unsigned k, unsigned n, long *counts)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    CHECK(fd >= 0, "cannot open %s", path);
    struct kvt_expect on = {.keep_cache = true};
    struct kvt_expect off = {.keep_cache = true, .no_verify = true};
    for (size_t len = img_len; len-- > 0;) {
        if ((img_len - 1 - len) % n != k)
            continue;
        CHECK(ftruncate(fd, (off_t)len) == 0, "ftruncate to %zu failed", len);
        for (int v = 0; v < (len % UNVERIFIED_STRIDE ? 1 : 2); v++) {
            struct kvt_entry *e = NULL;
            int rc = kvt_file_load(path, v ? &off : &on, &e, NULL);
            counts[0]++;
            CHECK(rc == KVT_E_CORRUPT, "truncated to %zu bytes: load returned %d (%s)", len, rc,
                  kvt_last_error());
            CHECK(e == NULL, "truncated to %zu bytes: a failed load returned an entry", len);
        }
        if (len % 4096 == 0) {
            struct kvt_expect x = {.keep_cache = true};
            CHECK(kvt_file_verify(path, &x) == KVT_E_CORRUPT, "truncated to %zu bytes: verify",
                  len);
        }
    }
    /* back to the intact file */
    CHECK(pwrite(fd, img, img_len, 0) == (ssize_t)img_len, "rewrite failed");
    close(fd);
}

static void test_every_truncation(void **state)
{
    (void)state;
    long counts[N_COUNTS] = {0};
    in_workers(truncation_cases, counts);
    struct kvt_entry *e = NULL;
    assert_int_equal(kvt_file_load(path, NULL, &e, NULL), 0);
    assert_true(synth_same_caches(e, ref));
    kvt_entry_free(e);
    print_message("sweep: %zu truncation lengths, %ld loads, all corrupt (%u workers)\n", img_len,
                  counts[0], worker_count());
}

/* ---- hostile headers ------------------------------------------------------------------- */

#define META                                                                                       \
    "\"modelId\":\"" SYNTH_MODEL "\",\"configFingerprint\":\"" SYNTH_FP                            \
    "\",\"tokenizerHash\":\"" SYNTH_TOK "\",\"ns\":\"\""
#define TOP(tokens, caches)                                                                        \
    "{\"formatVersion\":3," META ",\"tokens\":" tokens ",\"caches\":" caches "}"
#define ZH "526ea6526105509e" /* Wyhash of 64 zero bytes */
#define SLOT(off, bytes, shape)                                                                    \
    "{\"off\":" off ",\"bytes\":" bytes ",\"shape\":" shape ",\"dtype\":12,\"hash\":\"" ZH "\"}"
#define KV1(k, v) "[{\"kind\":\"kv\",\"offset\":1,\"tensors\":[" k "," v "]}]"
#define GOOD_K SLOT("0", "64", "[1,2,1,16]")
#define GOOD_V SLOT("16384", "64", "[1,2,1,16]")

struct hostile {
    const char *name;
    const char *json; /* NULL: the valid header, with the prefix edit below */
    uint64_t data;    /* bytes after dataStart (zeros) */
    int prefix_field; /* 0, or 10 (headerLen) / 14 (dataStart): overwrite with prefix_value */
    uint32_t prefix_value;
    int want;          /* load and verify result */
    const char *check; /* in the message */
};

static const struct hostile HOSTILE[] = {
    {"valid", TOP("[1]", KV1(GOOD_K, GOOD_V)), 16448, 0, 0, 0, ""},
    {"trailing bytes after the last tensor", TOP("[1]", KV1(GOOD_K, GOOD_V)), 20000, 0, 0, 0, ""},
    {"huge headerLen", NULL, 16448, 10, 0xFFFFFFF0u, KVT_E_CORRUPT, "V3"},
    {"headerLen zero", NULL, 16448, 10, 0, KVT_E_CORRUPT, "V3"},
    {"dataStart not alignUp(26 + headerLen)", NULL, 16448, 14, 4096, KVT_E_CORRUPT, "V5"},
    {"dataStart beyond the file", NULL, 16448, 14, 1u << 30, KVT_E_CORRUPT, "V5"},
    {"overlapping slots", TOP("[1]", KV1(GOOD_K, SLOT("0", "64", "[1,2,1,16]"))), 64, 0, 0,
     KVT_E_CORRUPT, "V16"},
    {"misaligned offset", TOP("[1]", KV1(GOOD_K, SLOT("16000", "64", "[1,2,1,16]"))), 16448, 0, 0,
     KVT_E_CORRUPT, "V15"},
    {"slot beyond the end of the file", TOP("[1]", KV1(GOOD_K, SLOT("32768", "64", "[1,2,1,16]"))),
     16448, 0, 0, KVT_E_CORRUPT, "V17"},
    {"huge shape (product overflows)",
     TOP("[1]", KV1(GOOD_K, SLOT("16384", "64", "[1,4294967296,1,4294967296]"))), 16448, 0, 0,
     KVT_E_CORRUPT, "V14"},
    {"bytes not shape x itemsize", TOP("[1]", KV1(GOOD_K, SLOT("16384", "62", "[1,2,1,16]"))),
     16448, 0, 0, KVT_E_CORRUPT, "V14"},
    {"off + bytes overflow", TOP("[1]", KV1(GOOD_K, SLOT("9007199254740992", "64", "[1,2,1,16]"))),
     16448, 0, 0, KVT_E_CORRUPT, "V13"},
    {"wrong tensor count", TOP("[1]", "[{\"kind\":\"kv\",\"offset\":1,\"tensors\":[" GOOD_K "]}]"),
     16448, 0, 0, KVT_E_CORRUPT, "V12"},
    {"duplicate key",
     "{\"formatVersion\":3,\"formatVersion\":3," META
     ",\"tokens\":[1],\"caches\":" KV1(GOOD_K, GOOD_V) "}",
     16448, 0, 0, KVT_E_CORRUPT, "V7"},
    {"invalid UTF-8",
     "{\"formatVersion\":3,\"modelId\":\"\xc3\x28\",\"tokens\":[1],\"caches\":" KV1(GOOD_K,
                                                                                    GOOD_V) "}",
     16448, 0, 0, KVT_E_CORRUPT, "V7"},
    {"trailing junk after the JSON", TOP("[1]", KV1(GOOD_K, GOOD_V)) " x", 16448, 0, 0,
     KVT_E_CORRUPT, "V7"},
    {"not an object", "[1,2,3]", 16448, 0, 0, KVT_E_CORRUPT, "V7"},
    {"token out of range", TOP("[2147483648]", KV1(GOOD_K, GOOD_V)), 16448, 0, 0, KVT_E_CORRUPT,
     "V11"},
    {"negative offset",
     TOP("[1]", "[{\"kind\":\"kv\",\"offset\":-1,\"tensors\":[" GOOD_K "," GOOD_V "]}]"), 16448, 0,
     0, KVT_E_CORRUPT, "V11"},
    {"fractional number", TOP("[1.5]", KV1(GOOD_K, GOOD_V)), 16448, 0, 0, KVT_E_CORRUPT, "V11"},
    {"token axis differs from offset",
     TOP("[1]", KV1(SLOT("0", "128", "[1,2,2,16]"), SLOT("16384", "128", "[1,2,2,16]"))), 16512, 0,
     0, KVT_E_CORRUPT, "V19"},
    {"empty caches", TOP("[1]", "[]"), 0, 0, 0, KVT_E_CORRUPT, "V11"},
    {"unknown kind (newer writer)", TOP("[1]", "[{\"kind\":\"mla\",\"offset\":1,\"tensors\":[]}]"),
     0, 0, 0, KVT_E_UNSUPPORTED, "V10"},
    {"formatVersion 4",
     "{\"formatVersion\":4," META ",\"tokens\":[1],\"caches\":" KV1(GOOD_K, GOOD_V) "}", 16448, 0,
     0, KVT_E_UNSUPPORTED, "V8"},
};

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Write a file: prefix (right hash), @p json, zero padding, @p data zero bytes. */
static void write_hostile(const char *file, const struct hostile *h)
{
    const char *json = h->json ? h->json : HOSTILE[0].json;
    size_t hl = strlen(json);
    uint64_t ds = (PREFIX + hl + 16383) / 16384 * 16384;
    size_t total = (size_t)(ds + h->data);
    if (h->data == 0 && ds > PREFIX + hl)
        total = (size_t)ds;
    uint8_t *b = calloc(1, total);
    assert_non_null(b);
    memcpy(b, "MLXBUNKV2\n", 10);
    put_le32(b + 10, (uint32_t)hl);
    put_le32(b + 14, (uint32_t)ds);
    uint64_t hh = kvt_wyhash(0, json, hl);
    for (int i = 0; i < 8; i++)
        b[18 + i] = (uint8_t)(hh >> (8 * i));
    memcpy(b + PREFIX, json, hl);
    if (h->prefix_field)
        put_le32(b + h->prefix_field, h->prefix_value);
    assert_int_equal(write_file(file, b, total), 0);
    free(b);
}

static void test_hostile_headers(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof(HOSTILE) / sizeof(HOSTILE[0]); k++) {
        const struct hostile *h = &HOSTILE[k];
        char *sdir = strf("%s/hostile-%zu", dir, k);
        char *nsdir = strf("%s/%s/base", sdir, SYNTH_FP);
        char *file = strf("%s/entry.mlxkv", nsdir);
        char *fpdir = strf("%s/%s", sdir, SYNTH_FP);
        assert_int_equal(mkdir(sdir, 0755), 0);
        assert_int_equal(mkdir(fpdir, 0755), 0);
        assert_int_equal(mkdir(nsdir, 0755), 0);
        write_hostile(file, h);

        struct kvt_entry *e = NULL;
        struct kvt_header *hd = NULL;
        int rc = kvt_file_load(file, NULL, &e, &hd);
        if (rc != h->want || !strstr(kvt_last_error(), h->check))
            fail_msg("%s: load returned %d (%s), expected %d %s", h->name, rc, kvt_last_error(),
                     h->want, h->check);
        assert_true(rc == 0 ? e && hd : !e && !hd);
        kvt_entry_free(e);
        kvt_header_free(hd);
        rc = kvt_file_verify(file, NULL);
        if (rc != h->want)
            fail_msg("%s: verify returned %d (%s)", h->name, rc, kvt_last_error());

        /* a store scan acts by category: corrupt files go, the others stay (skipped) */
        struct kvt_store_opts o;
        store_opts_for(&o, SYNTH_MODEL, SYNTH_FP, SYNTH_TOK);
        o.tmp_grace_ms = 0;
        kvt_store *st;
        assert_int_equal(kvt_store_open(sdir, &o, &st), 0);
        struct kvt_store_stats ss;
        kvt_store_get_stats(st, &ss);
        kvt_store_close(st);
        bool kept = access(file, F_OK) == 0;
        if (h->want == KVT_E_CORRUPT) {
            assert_false(kept);
            assert_int_equal(ss.corrupt_files, 1);
        } else {
            assert_true(kept);
            assert_int_equal(ss.entries + ss.skipped_files, 1);
            assert_int_equal(ss.entries, h->want == 0);
        }
        print_message("hostile: %-40s load %d, store %s\n", h->name, h->want,
                      h->want == KVT_E_CORRUPT ? "deleted"
                      : h->want                ? "skipped, kept"
                                               : "indexed");
        rm_rf(sdir);
        free(fpdir);
        free(file);
        free(nsdir);
        free(sdir);
    }
}

/* ---- wrong arguments ------------------------------------------------------------------- */

static void test_wrong_arguments(void **state)
{
    (void)state;
    struct kvt_entry *e = (struct kvt_entry *)1;
    struct kvt_header *h = (struct kvt_header *)1;
    assert_int_equal(kvt_file_load(NULL, NULL, &e, &h), -EINVAL);
    assert_null(e);
    assert_null(h);
    assert_int_equal(kvt_file_load(path, NULL, NULL, NULL), -EINVAL);
    e = (struct kvt_entry *)1;
    char *missing = strf("%s/no-such-file.mlxkv", dir);
    assert_int_equal(kvt_file_load(missing, NULL, &e, NULL), -ENOENT);
    assert_null(e);
    e = (struct kvt_entry *)1;
    assert_true(kvt_file_load(dir, NULL, &e, NULL) < 0); /* a directory */
    assert_null(e);
    assert_int_equal(kvt_file_verify(NULL, NULL), -EINVAL);
    assert_int_equal(kvt_file_verify(missing, NULL), -ENOENT);
    h = (struct kvt_header *)1;
    assert_int_equal(kvt_file_read_header(NULL, NULL, &h), -EINVAL);
    assert_null(h);
    assert_int_equal(kvt_file_save(NULL, ref, NULL, NULL), -EINVAL);
    assert_int_equal(kvt_file_save(missing, NULL, NULL, NULL), -EINVAL);
    char *nodir = strf("%s/no-such-dir/x.mlxkv", dir);
    assert_int_equal(kvt_file_save(nodir, ref, NULL, NULL), -ENOENT);
    assert_false(access(missing, F_OK) == 0);

    kvt_store *s = (kvt_store *)1;
    struct kvt_store_opts o;
    kvt_store_opts_init(&o);
    o.model_id = SYNTH_MODEL;
    o.config_fingerprint = SYNTH_FP;
    assert_int_equal(kvt_store_open(dir, &o, &s), -EINVAL); /* no tokenizer hash */
    assert_null(s);
    o.tokenizer_hash = SYNTH_TOK;
    s = (kvt_store *)1;
    assert_int_equal(kvt_store_open(NULL, &o, &s), -EINVAL);
    assert_null(s);
    s = (kvt_store *)1;
    assert_int_equal(kvt_store_open(dir, NULL, &s), -EINVAL);
    assert_null(s);
    o.config_fingerprint = "../escape";
    s = (kvt_store *)1;
    assert_int_equal(kvt_store_open(dir, &o, &s), -EINVAL);
    assert_null(s);
    o.config_fingerprint = SYNTH_FP;
    s = (kvt_store *)1;
    assert_true(kvt_store_open(path, &o, &s) < 0); /* a regular file, not a directory */
    assert_null(s);

    char *sdir = strf("%s/args-store", dir);
    assert_int_equal(mkdir(sdir, 0755), 0);
    assert_int_equal(kvt_store_open(sdir, &o, &s), 0);
    struct kvt_hit hit;
    int32_t tok[2] = {1, 2};
    assert_int_equal(kvt_store_find(NULL, tok, 2, "", &hit), -EINVAL);
    assert_int_equal(kvt_store_find(s, NULL, 2, "", &hit), -EINVAL);
    assert_int_equal(kvt_store_find(s, tok, 2, "", NULL), -EINVAL);
    assert_int_equal(kvt_store_find(s, tok, 2, "", &hit), 0);
    assert_int_equal(hit.prefix_len, 0);
    e = (struct kvt_entry *)1;
    assert_int_equal(kvt_store_restore(s, NULL, &e), -EINVAL);
    assert_null(e);
    struct kvt_hit bogus = hit; /* this store's, naming no record */
    bogus.prefix_len = 1, bogus.n_tokens = 2, bogus.id = 987654;
    e = (struct kvt_entry *)1;
    assert_int_equal(kvt_store_restore(s, &bogus, &e), 0); /* an unknown record is a miss */
    assert_null(e);
    bogus.store = 0; /* no store's */
    assert_int_equal(kvt_store_restore(s, &bogus, &e), -EINVAL);
    assert_null(e);
    assert_int_equal(kvt_store_put(s, NULL, NULL, NULL), -EINVAL);
    assert_int_equal(kvt_store_put(NULL, ref, NULL, NULL), -EINVAL);
    struct kvt_entry empty = {0};
    assert_int_equal(kvt_store_put(s, &empty, NULL, NULL), -EINVAL);
    kvt_store_close(s);
    rm_rf(sdir);

    /* destructors accept NULL */
    kvt_store_close(NULL);
    kvt_entry_free(NULL);
    kvt_header_free(NULL);
    kvt_cache_free(NULL);
    free(sdir);
    free(nodir);
    free(missing);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_byte_flipped),
        cmocka_unit_test(test_every_truncation),
        cmocka_unit_test(test_hostile_headers),
        cmocka_unit_test(test_wrong_arguments),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
