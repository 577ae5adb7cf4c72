/*
 * The store index proper: records, the namespace / id / path maps, running totals and the
 * two heaps (eviction order by (mtime_ms, seq), longest record). The radix tree itself is in
 * trie.c. Every operation is O(tokens) or O(log records); nothing scans all records except
 * kvt_index_records() (listing) and kvt_index_check() (tests).
 */
#include "store/index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "kvtier.h"

static bool evict_less(const void *a, const void *b)
{
    const struct kvt_rec *x = a, *y = b;
    return x->mtime_ms != y->mtime_ms ? x->mtime_ms < y->mtime_ms : x->seq < y->seq;
}

static bool longest_less(const void *a, const void *b)
{
    return ((const struct kvt_rec *)a)->n_tokens > ((const struct kvt_rec *)b)->n_tokens;
}

static const struct kvt_pheap_ops evict_ops = {evict_less, offsetof(struct kvt_rec, evict_pos)};
static const struct kvt_pheap_ops longest_ops = {longest_less, offsetof(struct kvt_rec, len_pos)};

static uint64_t str_hash(const char *s)
{
    return kvt_wyhash(0, s, strlen(s));
}

static bool ns_eq(const void *val, const void *key)
{
    return !strcmp(((const struct kvt_ns *)val)->name, key);
}

static bool seq_eq(const void *val, const void *key)
{
    return ((const struct kvt_rec *)val)->seq == *(const uint64_t *)key;
}

static bool path_eq(const void *val, const void *key)
{
    const struct kvt_rec *r = val;
    return r->path && !strcmp(r->path, key);
}

static struct kvt_ns *ns_get(const struct kvt_index *ix, const char *name)
{
    return kvt_hmap_get(&ix->ns_map, str_hash(name), ns_eq, name);
}

static void ns_free(struct kvt_ns *ns)
{
    kvt_trie_clear(ns);
    free(ns->name);
    free(ns);
}

int kvt_index_new(struct kvt_index **out)
{
    *out = calloc(1, sizeof(**out));
    return *out ? 0 : -ENOMEM;
}

static void free_rec(void *val, void *ud)
{
    (void)ud;
    struct kvt_rec *r = val;
    free(r->path);
    free(r);
}

static void free_ns(void *val, void *ud)
{
    (void)ud;
    ns_free(val);
}

void kvt_index_free(struct kvt_index *ix)
{
    if (!ix)
        return;
    kvt_hmap_each(&ix->seq_map, free_rec, NULL);
    kvt_hmap_each(&ix->ns_map, free_ns, NULL);
    kvt_hmap_free(&ix->seq_map);
    kvt_hmap_free(&ix->path_map);
    kvt_hmap_free(&ix->ns_map);
    kvt_pheap_free(&ix->evict);
    kvt_pheap_free(&ix->longest);
    free(ix);
}

/* The namespace @p name, added when missing (*@p added); NULL when out of memory. */
static struct kvt_ns *ns_get_or_add(struct kvt_index *ix, const char *name, bool *added)
{
    struct kvt_ns *ns = ns_get(ix, name);
    if (ns)
        return ns;
    ns = calloc(1, sizeof(*ns));
    if (!ns || !(ns->name = strdup(name))) {
        free(ns);
        return NULL;
    }
    ns->hash = str_hash(name);
    if (kvt_hmap_put(&ix->ns_map, ns->hash, ns) < 0) {
        ns_free(ns);
        return NULL;
    }
    *added = true;
    return ns;
}

int kvt_index_insert(struct kvt_index *ix, const char *ns_name, const int32_t *tok, size_t n,
                     bool trimmable, uint64_t bytes, int64_t mtime_ms, const char *path,
                     struct kvt_rec **out)
{
    if (out)
        *out = NULL;
    if (!ns_name)
        ns_name = "";
    if (path && kvt_index_by_path(ix, path))
        return -EEXIST;
    int rc = -ENOMEM;
    bool new_ns = false;
    struct kvt_ns *ns = ns_get_or_add(ix, ns_name, &new_ns);
    if (!ns)
        return -ENOMEM;

    struct kvt_rec *r = calloc(1, sizeof(*r));
    if (!r)
        goto out_ns;
    if (path && !(r->path = strdup(path)))
        goto out_rec;
    r->seq = ix->next_seq + 1;
    r->bytes = bytes;
    r->mtime_ms = mtime_ms;
    r->trimmable = trimmable;
    r->ns = ns;
    if (kvt_pheap_reserve(&ix->evict, ix->evict.n + 1) < 0 ||
        kvt_pheap_reserve(&ix->longest, ix->longest.n + 1) < 0)
        goto out_rec;
    if (kvt_hmap_put(&ix->seq_map, kvt_hmap_mix(r->seq), r) < 0)
        goto out_rec;
    if (path && kvt_hmap_put(&ix->path_map, str_hash(path), r) < 0)
        goto out_seq;
    if (kvt_trie_insert(ns, tok, n, r) < 0)
        goto out_path;
    kvt_pheap_push(&ix->evict, &evict_ops, r);
    kvt_pheap_push(&ix->longest, &longest_ops, r);
    ix->next_seq = r->seq;
    ix->count++;
    ix->total_bytes += bytes;
    if (out)
        *out = r;
    return 0;

out_path:
    if (path)
        kvt_hmap_del(&ix->path_map, str_hash(path), r);
out_seq:
    kvt_hmap_del(&ix->seq_map, kvt_hmap_mix(r->seq), r);
out_rec:
    free(r->path);
    free(r);
out_ns:
    if (new_ns) {
        kvt_hmap_del(&ix->ns_map, ns->hash, ns);
        ns_free(ns);
    }
    return rc;
}

void kvt_index_remove(struct kvt_index *ix, struct kvt_rec *r)
{
    struct kvt_ns *ns = r->ns;
    kvt_trie_remove(ns, r);
    kvt_hmap_del(&ix->seq_map, kvt_hmap_mix(r->seq), r);
    if (r->path)
        kvt_hmap_del(&ix->path_map, str_hash(r->path), r);
    kvt_pheap_remove(&ix->evict, &evict_ops, r);
    kvt_pheap_remove(&ix->longest, &longest_ops, r);
    ix->count--;
    ix->total_bytes -= r->bytes;
    free(r->path);
    free(r);
    if (ns->root.sub_n == 0) {
        kvt_hmap_del(&ix->ns_map, ns->hash, ns);
        ns_free(ns);
    }
}

struct kvt_rec *kvt_index_find(const struct kvt_index *ix, const char *ns, const int32_t *tok,
                               size_t n, size_t *plen)
{
    *plen = 0;
    const struct kvt_ns *t = ns_get(ix, ns ? ns : "");
    return t ? kvt_trie_find(t, tok, n, plen) : NULL;
}

bool kvt_index_has_durable_prefix(const struct kvt_index *ix, const char *ns, const int32_t *tok,
                                  size_t n)
{
    const struct kvt_ns *t = ns_get(ix, ns ? ns : "");
    return t && kvt_trie_has_durable_prefix(t, tok, n);
}

int kvt_index_superseded(const struct kvt_index *ix, const char *ns, const int32_t *tok, size_t n,
                         bool trimmable, struct kvt_rec ***out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    const struct kvt_ns *t = ns_get(ix, ns ? ns : "");
    if (!t)
        return 0;
    size_t cap = 0;
    int rc = kvt_trie_on_path(t, tok, n, trimmable, out, n_out, &cap);
    if (rc < 0) {
        free(*out);
        *out = NULL;
        *n_out = 0;
    }
    return rc;
}

struct kvt_rec *kvt_index_by_seq(const struct kvt_index *ix, uint64_t seq)
{
    return kvt_hmap_get(&ix->seq_map, kvt_hmap_mix(seq), seq_eq, &seq);
}

struct kvt_rec *kvt_index_by_path(const struct kvt_index *ix, const char *path)
{
    return kvt_hmap_get(&ix->path_map, str_hash(path), path_eq, path);
}

struct kvt_rec *kvt_index_oldest(const struct kvt_index *ix)
{
    return kvt_pheap_top(&ix->evict);
}

void kvt_index_touch(struct kvt_index *ix, struct kvt_rec *r, int64_t mtime_ms)
{
    r->mtime_ms = mtime_ms;
    kvt_pheap_fix(&ix->evict, &evict_ops, r);
}

uint64_t kvt_index_count(const struct kvt_index *ix)
{
    return ix->count;
}

uint64_t kvt_index_total_bytes(const struct kvt_index *ix)
{
    return ix->total_bytes;
}

size_t kvt_index_longest(const struct kvt_index *ix)
{
    const struct kvt_rec *r = kvt_pheap_top(&ix->longest);
    return r ? r->n_tokens : 0;
}

const char *kvt_rec_ns(const struct kvt_rec *r)
{
    return r->ns->name;
}

void kvt_rec_tokens(const struct kvt_rec *r, int32_t *out)
{
    for (const struct kvt_tnode *u = r->node; u && u->parent; u = u->parent)
        memcpy(out + u->parent->depth, u->label, u->label_len * sizeof(*out));
}

struct collect {
    struct kvt_rec **v;
    size_t n;
};

static void collect_rec(void *val, void *ud)
{
    struct collect *c = ud;
    c->v[c->n++] = val;
}

static int seq_cmp(const void *a, const void *b)
{
    uint64_t x = (*(struct kvt_rec *const *)a)->seq, y = (*(struct kvt_rec *const *)b)->seq;
    return x < y ? -1 : x > y;
}

int kvt_index_records(const struct kvt_index *ix, struct kvt_rec ***out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (!ix->count)
        return 0;
    struct collect c = {malloc(ix->count * sizeof(*c.v)), 0};
    if (!c.v)
        return -ENOMEM;
    kvt_hmap_each(&ix->seq_map, collect_rec, &c);
    qsort(c.v, c.n, sizeof(*c.v), seq_cmp);
    *out = c.v;
    *n = c.n;
    return 0;
}

struct check {
    const struct kvt_index *ix;
    uint64_t records, bytes;
    int rc;
};

static void check_ns(void *val, void *ud)
{
    struct check *c = ud;
    uint64_t n = 0;
    if (c->rc == 0)
        c->rc = kvt_trie_check(val, &n);
    c->records += n;
}

static void check_rec(void *val, void *ud)
{
    struct check *c = ud;
    const struct kvt_rec *r = val;
    c->bytes += r->bytes;
    if (c->rc == 0 && r->path && kvt_index_by_path(c->ix, r->path) != r)
        c->rc = kvt_fail(-EINVAL, "index: path map misses seq %llu", (unsigned long long)r->seq);
    if (c->rc == 0 && (!r->node || ns_get(c->ix, r->ns->name) != r->ns))
        c->rc = kvt_fail(-EINVAL, "index: record %llu detached", (unsigned long long)r->seq);
}

int kvt_index_check(const struct kvt_index *ix)
{
    struct check c = {ix, 0, 0, 0};
    kvt_hmap_each(&ix->ns_map, check_ns, &c);
    kvt_hmap_each(&ix->seq_map, check_rec, &c);
    if (c.rc)
        return c.rc;
    if (c.records != ix->count || ix->seq_map.n != ix->count)
        return kvt_fail(-EINVAL, "index: %llu records in trees, %zu by id, count %llu",
                        (unsigned long long)c.records, ix->seq_map.n,
                        (unsigned long long)ix->count);
    if (c.bytes != ix->total_bytes)
        return kvt_fail(-EINVAL, "index: total_bytes %llu, records sum to %llu",
                        (unsigned long long)ix->total_bytes, (unsigned long long)c.bytes);
    if (ix->evict.n != ix->count || ix->longest.n != ix->count ||
        kvt_pheap_check(&ix->evict, &evict_ops) < 0 ||
        kvt_pheap_check(&ix->longest, &longest_ops) < 0)
        return kvt_fail(-EINVAL, "index: heap out of order");
    return 0;
}
