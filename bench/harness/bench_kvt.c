/*
 * The kvtier side of `kvtier bench` (public API only): model-shaped entries of pseudo-random
 * state, the hash of an entry's persisted bytes (to prove a restore is byte-identical), the
 * file layout as spans over the entry's memory (so the raw writes write the very same bytes
 * from the very same memory), and the save / load jobs that run in a measuring child.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

const struct bench_model bench_llama3_8b = {
    .layers = 32, .kv_heads = 8, .head_dim = 128, .dtype = KVT_BFLOAT16};

size_t bench_token_bytes(const struct bench_model *m)
{
    return (size_t)m->layers * 2 * (size_t)m->kv_heads * (size_t)m->head_dim *
           kvt_dtype_size(m->dtype);
}

void bench_fill(void *dst, size_t n, uint64_t *state)
{
    uint8_t *p = dst;
    uint64_t x = *state ? *state : 0x9e3779b97f4a7c15ull;
    while (n >= 8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        uint64_t v = x * 0x2545f4914f6cdd1dull;
        memcpy(p, &v, 8);
        p += 8;
        n -= 8;
    }
    if (n) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        uint64_t v = x * 0x2545f4914f6cdd1dull;
        memcpy(p, &v, n);
    }
    *state = x;
}

int bench_cache_append_random(kvt_cache *c, const struct bench_model *m, size_t len, uint64_t *rng)
{
    int64_t shape[4] = {1, m->kv_heads, (int64_t)len, m->head_dim};
    size_t bytes = (size_t)m->kv_heads * len * (size_t)m->head_dim * kvt_dtype_size(m->dtype);
    struct kvt_tensor in[2];
    int rc = 0, made = 0;
    for (; made < 2; made++) {
        kvt_buf *b;
        rc = kvt_buf_new_uninit(bytes, &b);
        if (rc < 0)
            goto out;
        bench_fill(kvt_buf_data(b), bytes, rng);
        rc = kvt_tensor_init(&in[made], b, 0, m->dtype, 4, shape);
        kvt_buf_unref(b);
        if (rc < 0)
            goto out;
    }
    rc = kvt_cache_append(c, in, 2);
out:
    while (made-- > 0)
        kvt_tensor_release(&in[made]);
    return rc;
}

int bench_entry_build(const struct bench_model *m, const int32_t *tok, size_t n_tokens,
                      size_t chunk, uint64_t seed, struct kvt_entry **out)
{
    struct kvt_cache_info params = {.kind = KVT_KIND_KV};
    kvt_cache **caches = calloc((size_t)m->layers, sizeof(*caches));
    int32_t *ids = malloc((n_tokens ? n_tokens : 1) * sizeof(*ids));
    uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 1;
    int rc = 0, i;
    *out = NULL;
    if (!caches || !ids) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t t = 0; t < n_tokens; t++) {
        uint64_t v;
        bench_fill(&v, sizeof(v), &rng);
        ids[t] = tok ? tok[t] : (int32_t)(v % 128000);
    }
    if (chunk == 0)
        chunk = n_tokens;
    for (i = 0; i < m->layers; i++) {
        rc = kvt_cache_new(&params, &caches[i]);
        for (size_t done = 0; rc == 0 && done < n_tokens; done += chunk)
            rc = bench_cache_append_random(caches[i], m,
                                           n_tokens - done < chunk ? n_tokens - done : chunk, &rng);
        if (rc < 0)
            goto out;
    }
    rc = kvt_entry_new(ids, n_tokens, caches, (size_t)m->layers, NULL, out);
    if (rc == 0) {
        free(caches); /* the entry owns the cache objects now */
        caches = NULL;
    }
out:
    if (caches) {
        for (i = 0; i < m->layers; i++)
            kvt_cache_free(caches[i]);
        free(caches);
    }
    free(ids);
    return rc;
}

int bench_entry_state_hash(const struct kvt_entry *e, uint64_t *out)
{
    struct kvt_wyhash_state st;
    struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
    kvt_wyhash_init(&st, 0);
    for (size_t i = 0; i < e->n_caches; i++) {
        int n = kvt_cache_state(e->caches[i], t);
        if (n < 0)
            return n;
        int rc = 0;
        for (int j = 0; j < n; j++) {
            struct kvt_tensor c;
            if (rc == 0 && kvt_tensor_is_contiguous(&t[j])) {
                kvt_wyhash_update(&st, (const char *)kvt_buf_data(t[j].buf) + t[j].offset,
                                  kvt_tensor_nbytes(&t[j]));
            } else if (rc == 0 && (rc = kvt_tensor_contiguous(&c, &t[j])) == 0) {
                kvt_wyhash_update(&st, kvt_buf_data(c.buf), kvt_tensor_nbytes(&c));
                kvt_tensor_release(&c);
            }
            kvt_tensor_release(&t[j]);
        }
        if (rc < 0)
            return rc;
    }
    *out = kvt_wyhash_final(&st);
    return 0;
}

void bench_layout_free(struct bench_layout *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n_copies; i++)
        kvt_tensor_release(&l->copies[i]);
    free(l->copies);
    free(l->spans);
    free(l->header_block);
    memset(l, 0, sizeof(*l));
}

int bench_layout_build(const struct kvt_entry *e, const char *path, struct bench_layout *l)
{
    struct kvt_header *h = NULL;
    struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
    int rc, fd = -1;
    memset(l, 0, sizeof(*l));
    rc = kvt_file_read_header(path, NULL, &h);
    if (rc < 0)
        return rc;
    size_t max_spans = 1 + h->n_caches * KVT_MAX_CACHE_TENSORS;
    l->spans = calloc(max_spans, sizeof(*l->spans));
    l->copies = calloc(max_spans, sizeof(*l->copies));
    l->header_block = malloc(h->data_start);
    if (!l->spans || !l->copies || !l->header_block || h->n_caches != e->n_caches) {
        rc = h->n_caches != e->n_caches ? -EINVAL : -ENOMEM;
        goto out;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || pread(fd, l->header_block, h->data_start, 0) != (ssize_t)h->data_start) {
        rc = -EIO;
        goto out;
    }
    l->spans[l->n_spans++] = (struct bench_span){l->header_block, 0, h->data_start};
    for (size_t i = 0; i < e->n_caches; i++) {
        int n = kvt_cache_state(e->caches[i], t);
        if (n < 0) {
            rc = n;
            goto out;
        }
        for (int j = 0; j < n; j++) {
            const struct kvt_tensor *src = &t[j];
            if (rc == 0 && !kvt_tensor_is_contiguous(src)) {
                rc = kvt_tensor_contiguous(&l->copies[l->n_copies], src);
                if (rc == 0)
                    src = &l->copies[l->n_copies++];
            }
            if (rc == 0 && (j >= h->caches[i].n_slots ||
                            h->caches[i].slots[j].bytes != kvt_tensor_nbytes(src)))
                rc = -EINVAL;
            if (rc == 0)
                l->spans[l->n_spans++] = (struct bench_span){
                    (char *)kvt_buf_data(src->buf) + src->offset,
                    h->data_start + h->caches[i].slots[j].off, kvt_tensor_nbytes(src)};
            kvt_tensor_release(&t[j]); /* the entry (or the copy) keeps the bytes alive */
        }
        if (rc < 0)
            goto out;
    }
    l->file_bytes = h->file_size;
out:
    if (fd >= 0)
        close(fd);
    kvt_header_free(h);
    if (rc < 0)
        bench_layout_free(l);
    return rc;
}

int bench_kvt_save(void *arg, double *secs, uint64_t *value)
{
    const struct bench_kvt_job *j = arg;
    struct kvt_save_opts o = {.created_at = 1767225600000};
    double t0 = bench_now();
    int rc = kvt_file_save(j->path, j->e, &o, value);
    *secs = bench_now() - t0;
    return rc;
}

int bench_kvt_load(void *arg, double *secs, uint64_t *value)
{
    const struct bench_kvt_job *j = arg;
    struct kvt_expect x = {.no_verify = !j->verify, .keep_cache = j->keep_cache};
    struct kvt_entry *e;
    double t0 = bench_now();
    int rc = kvt_file_load(j->path, &x, &e, NULL);
    *secs = bench_now() - t0;
    if (rc == 0) {
        *value = kvt_entry_bytes(e);
        kvt_entry_free(e);
    }
    return rc;
}
