/* Shared test helpers (see support.h). */
#include "support/support.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "settings/settings.h"

const char *golden_path(const char *name)
{
    static char buf[4096];
    snprintf(buf, sizeof(buf), "%s/golden/%s", KVT_TEST_DIR, name);
    return buf;
}

char *scratch_dir(const char *tag)
{
    static unsigned counter;
    const char *base = getenv("KVT_SCRATCH");
    char *path = strf("%s/%s-%d-%u", base ? base : "/tmp", tag, (int)getpid(), counter++);
    rm_rf(path);
    if (mkdir(path, 0755) != 0) {
        free(path);
        return NULL;
    }
    return path;
}

char *test_dir;

int test_dir_setup(void **state)
{
    (void)state;
    test_dir = scratch_dir(program_invocation_short_name);
    return test_dir ? 0 : -1;
}

int test_dir_teardown(void **state)
{
    (void)state;
    if (test_dir)
        rm_rf(test_dir);
    free(test_dir);
    test_dir = NULL;
    return 0;
}

uint8_t *read_file(const char *path, size_t *n)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return NULL;
    }
    uint8_t *buf = malloc(st.st_size ? (size_t)st.st_size : 1);
    size_t got = 0;
    while (buf && got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r <= 0) {
            free(buf);
            buf = NULL;
            break;
        }
        got += (size_t)r;
    }
    close(fd);
    if (buf)
        *n = got;
    return buf;
}

int write_file(const char *path, const void *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return -errno;
    const uint8_t *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            int e = errno;
            close(fd);
            return -e;
        }
        p += w;
        n -= (size_t)w;
    }
    return close(fd) == 0 ? 0 : -errno;
}

void *load_json(const char *path)
{
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j)
        fprintf(stderr, "%s:%d: %s\n", path, err.line, err.text);
    return j;
}

uint64_t xs64(uint64_t *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 0x2545F4914F6CDD1Dull;
}

void fill_random(void *dst, size_t n, uint64_t *state)
{
    uint8_t *p = dst;
    while (n > 0) {
        uint64_t v = xs64(state);
        size_t k = n < 8 ? n : 8;
        memcpy(p, &v, k);
        p += k;
        n -= k;
    }
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void rm_rf(const char *path)
{
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

char *strf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    return s;
}

/* The VmFlags line of the mapping holding @p p, from /proc/self/smaps ("" if not found). */
void vma_flags(const void *p, char *out, size_t n)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    bool inside = false;
    out[0] = '\0';
    while (f && fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2)
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (inside && !strncmp(line, "VmFlags:", 8)) {
            snprintf(out, n, "%s", line);
            break;
        }
    }
    if (f)
        fclose(f);
}

int run_cli(const char *args, bool with_stderr, char **out)
{
    char *cmd = strf("%s/kvtier %s 2>%s", KVT_BUILD_DIR, args, with_stderr ? "&1" : "/dev/null");
    int rc = run_capture(cmd, out);
    free(cmd);
    return rc;
}

int run_capture(const char *cmd, char **out)
{
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap);
    assert_non_null(buf);
    while ((r = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += r;
        if (n + 1 == cap) {
            buf = realloc(buf, cap *= 2);
            assert_non_null(buf);
        }
    }
    buf[n] = '\0';
    int st = pclose(p);
    if (out)
        *out = buf;
    else
        free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
/* A kv layer of [1, 4, n, 96] float16 rows and an ssm layer, random bytes from @p seed. */
void synth_random_tensor(struct kvt_tensor *t, int dtype, int rank, const int64_t *shape,
                         uint64_t *rng)
{
    assert_int_equal(kvt_tensor_zeros(t, dtype, rank, shape), 0);
    fill_random((uint8_t *)kvt_buf_data(t->buf) + t->offset, kvt_tensor_nbytes(t), rng);
}

kvt_cache *synth_random_kv(int dtype, int64_t heads, int64_t rows, int64_t dim, uint64_t *rng)
{
    struct kvt_cache_info p = {.kind = KVT_KIND_KV};
    kvt_cache *c;
    assert_int_equal(kvt_cache_new(&p, &c), 0);
    const int64_t shape[4] = {1, heads, rows, dim};
    struct kvt_tensor t[2];
    for (int k = 0; k < 2; k++)
        synth_random_tensor(&t[k], dtype, 4, shape, rng);
    assert_int_equal(kvt_cache_append(c, t, 2), 0);
    kvt_tensor_release(&t[0]);
    kvt_tensor_release(&t[1]);
    return c;
}

bool synth_same_state(const kvt_cache *a, const kvt_cache *b)
{
    struct kvt_tensor ta[KVT_MAX_CACHE_TENSORS], tb[KVT_MAX_CACHE_TENSORS];
    int na = kvt_cache_state(a, ta), nb = kvt_cache_state(b, tb);
    bool same = na > 0 && na == nb;
    for (int i = 0; i < na && i < nb; i++) {
        size_t bytes = kvt_tensor_nbytes(&ta[i]);
        uint8_t *x = malloc(bytes + 1), *y = malloc(bytes + 1);
        kvt_tensor_copy_out(&ta[i], x);
        kvt_tensor_copy_out(&tb[i], y);
        same = same && bytes == kvt_tensor_nbytes(&tb[i]) && !memcmp(x, y, bytes);
        free(x);
        free(y);
    }
    for (int i = 0; i < na; i++)
        kvt_tensor_release(&ta[i]);
    for (int i = 0; i < nb; i++)
        kvt_tensor_release(&tb[i]);
    return same;
}

struct kvt_entry *synth_random_entry(const int32_t *tok, size_t n, uint64_t seed, const char *model,
                                     const char *fp, const char *tok_hash)
{
    kvt_cache *c[3];
    for (int l = 0; l < 2; l++) {
        const int64_t shape[4] = {1, 4, (int64_t)n, 96};
        struct kvt_tensor t[2];
        for (int w = 0; w < 2; w++)
            synth_random_tensor(&t[w], KVT_FLOAT16, 4, shape, &seed);
        struct kvt_cache_info info = {.kind = KVT_KIND_KV, .offset = (int64_t)n};
        assert_int_equal(kvt_cache_from_state(&info, t, 2, &c[l]), 0);
        kvt_tensor_release(&t[0]);
        kvt_tensor_release(&t[1]);
    }
    const int64_t conv[3] = {1, 3, 64}, rec[4] = {1, 8, 16, 4};
    struct kvt_tensor t[2];
    synth_random_tensor(&t[0], KVT_FLOAT32, 3, conv, &seed);
    synth_random_tensor(&t[1], KVT_FLOAT32, 4, rec, &seed);
    struct kvt_cache_info info = {.kind = KVT_KIND_SSM, .offset = (int64_t)n};
    assert_int_equal(kvt_cache_from_state(&info, t, 2, &c[2]), 0);
    kvt_tensor_release(&t[0]);
    kvt_tensor_release(&t[1]);
    struct kvt_entry *e;
    assert_int_equal(kvt_entry_new(tok, n, c, 3, "", &e), 0);
    e->meta.model_id = strdup(model);
    e->meta.config_fingerprint = strdup(fp);
    e->meta.tokenizer_hash = strdup(tok_hash);
    return e;
}

/* The bytes of every persisted tensor of @p e, concatenated in slot order. */
uint8_t *synth_entry_bytes(const struct kvt_entry *e, size_t *total)
{
    size_t cap = kvt_entry_bytes(e) + 1, at = 0;
    uint8_t *out = malloc(cap);
    for (size_t i = 0; i < e->n_caches; i++) {
        struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
        int nt = kvt_cache_state(e->caches[i], t);
        assert_true(nt > 0);
        for (int j = 0; j < nt; j++) {
            size_t b = kvt_tensor_nbytes(&t[j]);
            assert_true(at + b <= cap);
            kvt_tensor_copy_out(&t[j], out + at);
            at += b;
            kvt_tensor_release(&t[j]);
        }
    }
    *total = at;
    return out;
}

bool synth_same_entry_bytes(const struct kvt_entry *a, const struct kvt_entry *b)
{
    size_t na, nb;
    uint8_t *x = synth_entry_bytes(a, &na), *y = synth_entry_bytes(b, &nb);
    bool same = na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

void store_opts_for(struct kvt_store_opts *o, const char *model, const char *fp, const char *tok)
{
    kvt_store_opts_init(o);
    o->model_id = model;
    o->config_fingerprint = fp;
    o->tokenizer_hash = tok;
}

void set_mem(bool no_hugepages, bool no_parallel)
{
    struct kvt_mem_opts m;
    kvt_mem_opts_init(&m);
    m.no_hugepages = no_hugepages;
    m.no_parallel = no_parallel;
    if (kvt_mem_configure(&m) != 0)
        abort();
}

void mem_probe_init(struct mem_probe *p)
{
    p->limit = kvt_buf_cache_limit(0);
    kvt_buf_cache_limit(p->limit);
    p->direct = kvt_mem_direct();
    kvt_mem_opts_init(&p->m);
    p->m.buf_cache_bytes = (int64_t)(p->limit / 2 + 4096);
    p->m.no_direct = p->direct;
}

void mem_probe_check(const struct mem_probe *p, bool applied)
{
    size_t was = kvt_buf_cache_limit(p->limit);
    assert_int_equal(was, applied ? (size_t)p->m.buf_cache_bytes : p->limit);
    assert_int_equal(kvt_mem_direct(), applied ? !p->direct : p->direct);
    if (applied)
        assert_int_equal(kvt_mem_configure(NULL), 0);
}

bool loader_checks_byte(const struct kvt_header *h, uint64_t off)
{
    if (off < 26 + (uint64_t)h->header_len) /* the prefix and the JSON */
        return true;
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++) {
            uint64_t a = (uint64_t)h->data_start + h->caches[i].slots[j].off;
            if (off >= a && off < a + h->caches[i].slots[j].bytes)
                return true;
        }
    return false;
}

void flip_slot_byte(const char *path, size_t ci, int sj, uint64_t at, uint8_t mask)
{
    struct kvt_header *h;
    assert_int_equal(kvt_file_read_header(path, NULL, &h), 0);
    assert_true(ci < h->n_caches && sj < h->caches[ci].n_slots);
    assert_true(at < h->caches[ci].slots[sj].bytes);
    size_t n;
    uint8_t *b = read_file(path, &n);
    assert_non_null(b);
    b[h->data_start + h->caches[ci].slots[sj].off + at] ^= mask;
    assert_int_equal(write_file(path, b, n), 0);
    free(b);
    kvt_header_free(h);
}
