/*
 * The per-namespace radix tree of the store index (STORE.md §12.5): insert, remove, the §7
 * find, has_durable_prefix, the records on a path (dedup and supersession), and a full
 * consistency check for tests. Invariants: every node except the root has a non-empty label
 * and either records or at least two children; kids are sorted by their first token; every
 * node's aggregates equal those computed from its own records and its kids.
 */
#include "store/trie.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

static uint64_t node_key(const struct kvt_tnode *u)
{
    return u->sub_min_trim ? u->sub_min_trim->seq : UINT64_MAX;
}

static bool node_less(const void *a, const void *b)
{
    return node_key(a) < node_key(b);
}

static const struct kvt_pheap_ops kid_ops = {node_less, offsetof(struct kvt_tnode, heap_pos)};

static struct kvt_rec *earlier(struct kvt_rec *a, struct kvt_rec *b)
{
    if (!a)
        return b;
    if (!b)
        return a;
    return b->seq < a->seq ? b : a;
}

/** Length of the common prefix of a and b over at most n tokens. */
static size_t lcp(const int32_t *a, const int32_t *b, size_t n)
{
    size_t i = 0;
    while (n - i >= 16 && !memcmp(a + i, b + i, 16 * sizeof(*a)))
        i += 16;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/** The kid whose label starts with @p t, or NULL; *pos = its (insertion) index. */
static struct kvt_tnode *kid_find(const struct kvt_tnode *u, int32_t t, size_t *pos)
{
    size_t lo = 0, hi = u->n_kids;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (u->kids[mid].first < t)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (pos)
        *pos = lo;
    return lo < u->n_kids && u->kids[lo].first == t ? u->kids[lo].node : NULL;
}

static int kids_reserve(struct kvt_tnode *u, size_t n)
{
    if (n > u->cap_kids) {
        size_t cap = u->cap_kids ? u->cap_kids * 2 : 2;
        while (cap < n)
            cap *= 2;
        struct kvt_kid *k = realloc(u->kids, cap * sizeof(*k));
        if (!k)
            return -ENOMEM;
        u->kids = k;
        u->cap_kids = cap;
    }
    return kvt_pheap_reserve(&u->kid_heap, n);
}

/** Insert @p k into u's kids at index @p pos (room reserved). */
static void kid_add(struct kvt_tnode *u, size_t pos, struct kvt_tnode *k)
{
    memmove(u->kids + pos + 1, u->kids + pos, (u->n_kids - pos) * sizeof(*u->kids));
    u->kids[pos] = (struct kvt_kid){k->label[0], k};
    u->n_kids++;
    k->parent = u;
    kvt_pheap_push(&u->kid_heap, &kid_ops, k);
}

static void kid_del(struct kvt_tnode *u, struct kvt_tnode *k)
{
    size_t pos;
    kid_find(u, k->label[0], &pos);
    memmove(u->kids + pos, u->kids + pos + 1, (u->n_kids - pos - 1) * sizeof(*u->kids));
    u->n_kids--;
    kvt_pheap_remove(&u->kid_heap, &kid_ops, k);
}

/** Put @p k where @p old was among u's kids (same first token, same heap key). */
static void kid_swap(struct kvt_tnode *u, struct kvt_tnode *old, struct kvt_tnode *k)
{
    size_t pos;
    kid_find(u, old->label[0], &pos);
    u->kids[pos].node = k;
    k->parent = u;
    kvt_pheap_replace(&u->kid_heap, &kid_ops, old, k);
}

static void node_free(struct kvt_tnode *u)
{
    if (u->label != u->inl)
        free(u->label);
    free(u->kids);
    kvt_pheap_free(&u->kid_heap);
    free(u);
}

static struct kvt_tnode *node_new(const int32_t *label, size_t len, size_t depth)
{
    struct kvt_tnode *u = calloc(1, sizeof(*u));
    if (!u)
        return NULL;
    u->label = len <= KVT_INLINE_LABEL ? u->inl : malloc(len * sizeof(*label));
    if (!u->label) {
        free(u);
        return NULL;
    }
    memcpy(u->label, label, len * sizeof(*label));
    u->label_len = len;
    u->depth = depth;
    return u;
}

/** Link @p r into u's record list, keeping ascending seq. */
static void own_add(struct kvt_tnode *u, struct kvt_rec *r)
{
    struct kvt_rec *after = u->tail;
    while (after && after->seq > r->seq)
        after = after->prev;
    r->prev = after;
    r->next = after ? after->next : u->head;
    if (r->next)
        r->next->prev = r;
    else
        u->tail = r;
    if (after)
        after->next = r;
    else
        u->head = r;
    u->own_n++;
    u->own_trim += r->trimmable;
    r->node = u;
}

static struct kvt_rec *own_min_trim(const struct kvt_tnode *u)
{
    for (struct kvt_rec *r = u->head; r; r = r->next)
        if (r->trimmable)
            return r;
    return NULL;
}

/* A record now ends at @p at: the subtree aggregates of @p at and its ancestors count it. */
static void count_up(struct kvt_tnode *at, const struct kvt_rec *r)
{
    for (struct kvt_tnode *u = at; u; u = u->parent) {
        u->sub_n++;
        if (!r->trimmable)
            continue;
        u->sub_trim++;
        if (!u->sub_min_trim || r->seq < u->sub_min_trim->seq) {
            u->sub_min_trim = (struct kvt_rec *)r;
            if (u->parent)
                kvt_pheap_fix(&u->parent->kid_heap, &kid_ops, u);
        }
    }
}

int kvt_trie_insert(struct kvt_ns *ns, const int32_t *tok, size_t n, struct kvt_rec *r)
{
    /* Locate without changing anything: at most one split and one new leaf follow. */
    struct kvt_tnode *cur = &ns->root, *v = NULL;
    size_t d = 0, k = 0, pos = 0;
    while (d < n) {
        v = kid_find(cur, tok[d], &pos);
        if (!v)
            break;
        size_t m = v->label_len < n - d ? v->label_len : n - d;
        k = lcp(v->label, tok + d, m);
        if (k < v->label_len)
            break;
        cur = v;
        d += k;
        v = NULL;
    }

    struct kvt_tnode *mid = NULL, *leaf = NULL, *at = cur;
    size_t leaf_from = d;
    if (v) { /* diverges (or ends) inside v's label after k >= 1 tokens */
        mid = node_new(v->label, k, d + k);
        if (!mid || kids_reserve(mid, 2) < 0)
            goto out_nomem;
        leaf_from = d + k;
        at = mid;
    } else if (d < n && kids_reserve(cur, cur->n_kids + 1) < 0) {
        return -ENOMEM;
    }
    if (leaf_from < n) {
        leaf = node_new(tok + leaf_from, n - leaf_from, n);
        if (!leaf)
            goto out_nomem;
        at = leaf;
    }

    if (mid) {
        mid->sub_n = v->sub_n;
        mid->sub_trim = v->sub_trim;
        mid->sub_min_trim = v->sub_min_trim;
        kid_swap(cur, v, mid);
        memmove(v->label, v->label + k, (v->label_len - k) * sizeof(*v->label));
        v->label_len -= k;
        kid_add(mid, 0, v);
        if (leaf)
            kid_add(mid, leaf->label[0] < v->label[0] ? 0 : 1, leaf);
    } else if (leaf) {
        kid_add(cur, pos, leaf);
    }

    r->n_tokens = n;
    own_add(at, r);
    count_up(at, r);
    return 0;

out_nomem:
    if (mid)
        node_free(mid);
    return -ENOMEM;
}

/** Merge node @p p (no records, one kid) into that kid; on ENOMEM p simply stays. */
static void merge_down(struct kvt_tnode *p)
{
    struct kvt_tnode *c = p->kids[0].node;
    size_t len = p->label_len + c->label_len;
    int32_t small[KVT_INLINE_LABEL];
    int32_t *label = len <= KVT_INLINE_LABEL ? small : malloc(len * sizeof(*label));
    if (!label)
        return;
    memcpy(label, p->label, p->label_len * sizeof(*label));
    memcpy(label + p->label_len, c->label, c->label_len * sizeof(*label));
    if (c->label != c->inl)
        free(c->label);
    if (label == small) {
        memcpy(c->inl, small, len * sizeof(*label));
        label = c->inl;
    }
    c->label = label;
    c->label_len = len;
    kid_swap(p->parent, p, c);
    node_free(p);
}

static void prune(struct kvt_ns *ns, struct kvt_tnode *u)
{
    if (u == &ns->root)
        return;
    if (u->own_n == 0 && u->n_kids == 0) {
        struct kvt_tnode *p = u->parent;
        kid_del(p, u);
        node_free(u);
        u = p;
        if (u == &ns->root)
            return;
    }
    if (u->own_n == 0 && u->n_kids == 1)
        merge_down(u);
}

void kvt_trie_remove(struct kvt_ns *ns, struct kvt_rec *r)
{
    struct kvt_tnode *t = r->node;
    if (r->prev)
        r->prev->next = r->next;
    else
        t->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        t->tail = r->prev;
    r->prev = r->next = NULL;
    r->node = NULL;
    t->own_n--;
    t->own_trim -= r->trimmable;

    for (struct kvt_tnode *u = t; u; u = u->parent) {
        u->sub_n--;
        if (!r->trimmable)
            continue;
        u->sub_trim--;
        if (u->sub_min_trim == r) {
            struct kvt_tnode *top = kvt_pheap_top(&u->kid_heap);
            u->sub_min_trim = earlier(own_min_trim(u), top ? top->sub_min_trim : NULL);
            if (u->parent)
                kvt_pheap_fix(&u->parent->kid_heap, &kid_ops, u);
        }
    }
    prune(ns, t);
}

/** The earliest trimmable record below @p u outside kid @p v (O(1) from the kid heap). */
static struct kvt_rec *min_trim_except(const struct kvt_tnode *u, const struct kvt_tnode *v)
{
    const struct kvt_pheap *h = &u->kid_heap;
    if (h->n == 0)
        return NULL;
    const struct kvt_tnode *top = h->v[0];
    if (top != v)
        return top->sub_min_trim;
    struct kvt_rec *best = NULL;
    for (size_t i = 1; i <= 2 && i < h->n; i++)
        best = earlier(best, ((const struct kvt_tnode *)h->v[i])->sub_min_trim);
    return best;
}

/*
 * STORE.md §7 by walking the prompt to depth at most n - 1. A record's p is the depth where
 * its path leaves the prompt's (capped at n - 1); it is usable at p when it ends there or is
 * trimmable. So the answer is the deepest depth d with a usable record, the earliest such:
 *  - at the final depth D (cap, mismatch or end of tree): the records ending at D and every
 *    trimmable record below;
 *  - at a node u passed on the way into kid v: u's own records and the trimmable records
 *    below u outside v.
 * Mid-edge depths before D have no records leaving the path, so they never qualify.
 */
struct kvt_rec *kvt_trie_find(const struct kvt_ns *ns, const int32_t *tok, size_t n, size_t *plen)
{
    *plen = 0;
    if (n <= 1)
        return NULL;
    size_t limit = n - 1, d = 0;
    const struct kvt_tnode *cur = &ns->root, *edge = NULL, *cand = NULL, *cand_next = NULL;
    while (d < limit) {
        const struct kvt_tnode *v = kid_find(cur, tok[d], NULL);
        if (!v)
            break;
        size_t m = v->label_len < limit - d ? v->label_len : limit - d;
        size_t k = lcp(v->label, tok + d, m);
        if (d > 0 && (cur->own_n > 0 || cur->sub_trim - cur->own_trim - v->sub_trim > 0)) {
            cand = cur;
            cand_next = v;
        }
        d += k;
        if (k < v->label_len) {
            edge = v;
            break;
        }
        cur = v;
    }

    struct kvt_rec *best = NULL;
    if (edge)
        best = edge->sub_min_trim;
    else if (d > 0)
        best = earlier(cur->head, cur->sub_min_trim);
    if (best) {
        *plen = d;
        return best;
    }
    if (!cand)
        return NULL;
    *plen = cand->depth;
    return earlier(cand->head, min_trim_except(cand, cand_next));
}

/** Walk all of @p tok: the node reached, or the kid whose label the walk ends inside. */
static bool walk_all(const struct kvt_ns *ns, const int32_t *tok, size_t n,
                     const struct kvt_tnode **node, const struct kvt_tnode **edge)
{
    const struct kvt_tnode *cur = &ns->root;
    size_t d = 0;
    *edge = NULL;
    while (d < n) {
        const struct kvt_tnode *v = kid_find(cur, tok[d], NULL);
        if (!v)
            return false;
        size_t m = v->label_len < n - d ? v->label_len : n - d;
        size_t k = lcp(v->label, tok + d, m);
        if (k < m)
            return false;
        d += k;
        if (k < v->label_len) {
            *edge = v;
            break;
        }
        cur = v;
    }
    *node = cur;
    return true;
}

bool kvt_trie_has_durable_prefix(const struct kvt_ns *ns, const int32_t *tok, size_t n)
{
    const struct kvt_tnode *node, *edge;
    if (!walk_all(ns, tok, n, &node, &edge))
        return false;
    if (edge)
        return edge->sub_trim > 0;
    return node->own_n > 0 || node->sub_trim > 0;
}

static int push_rec(struct kvt_rec ***out, size_t *n_out, size_t *cap, struct kvt_rec *r)
{
    if (*n_out == *cap) {
        size_t c = *cap ? *cap * 2 : 8;
        struct kvt_rec **v = realloc(*out, c * sizeof(*v));
        if (!v)
            return -ENOMEM;
        *out = v;
        *cap = c;
    }
    (*out)[(*n_out)++] = r;
    return 0;
}

int kvt_trie_on_path(const struct kvt_ns *ns, const int32_t *tok, size_t n, bool ancestors,
                     struct kvt_rec ***out, size_t *n_out, size_t *cap_out)
{
    const struct kvt_tnode *cur = &ns->root;
    size_t d = 0;
    for (;;) {
        if (d == n || ancestors)
            for (struct kvt_rec *r = cur->head; r; r = r->next)
                if (push_rec(out, n_out, cap_out, r) < 0)
                    return -ENOMEM;
        if (d == n)
            return 0;
        const struct kvt_tnode *v = kid_find(cur, tok[d], NULL);
        if (!v || v->label_len > n - d || lcp(v->label, tok + d, v->label_len) < v->label_len)
            return 0;
        d += v->label_len;
        cur = v;
    }
}

static int append_kids(struct kvt_tnode ***v, size_t *len, size_t *cap, const struct kvt_tnode *u)
{
    if (*len + u->n_kids > *cap) {
        size_t c = *cap;
        while (*len + u->n_kids > c)
            c *= 2;
        struct kvt_tnode **nv = realloc(*v, c * sizeof(*nv));
        if (!nv)
            return -ENOMEM;
        *v = nv;
        *cap = c;
    }
    for (size_t i = 0; i < u->n_kids; i++)
        (*v)[(*len)++] = u->kids[i].node;
    return 0;
}

/** Every node below the root, parents before children (caller frees). */
static int collect_nodes(const struct kvt_ns *ns, struct kvt_tnode ***out, size_t *n)
{
    size_t cap = 64, len = 0;
    struct kvt_tnode **v = malloc(cap * sizeof(*v));
    if (!v || append_kids(&v, &len, &cap, &ns->root) < 0)
        goto out_nomem;
    for (size_t i = 0; i < len; i++)
        if (append_kids(&v, &len, &cap, v[i]) < 0)
            goto out_nomem;
    *out = v;
    *n = len;
    return 0;

out_nomem:
    free(v);
    return -ENOMEM;
}

void kvt_trie_clear(struct kvt_ns *ns)
{
    struct kvt_tnode *root = &ns->root;
    for (;;) {
        struct kvt_tnode **v;
        size_t n;
        if (collect_nodes(ns, &v, &n) == 0) {
            for (size_t i = 0; i < n; i++)
                node_free(v[i]);
            free(v);
            break;
        }
        /* Out of memory for the list: free leaves one at a time instead. */
        struct kvt_tnode *u = root;
        while (u->n_kids)
            u = u->kids[u->n_kids - 1].node;
        if (u == root)
            break;
        u->parent->n_kids--;
        node_free(u);
    }
    free(root->kids);
    kvt_pheap_free(&root->kid_heap);
    root->kids = NULL;
    root->n_kids = root->cap_kids = 0;
    root->head = root->tail = NULL;
    root->own_n = root->own_trim = 0;
    root->sub_n = root->sub_trim = 0;
    root->sub_min_trim = NULL;
}

static int check_node(const struct kvt_tnode *u, bool is_root, uint64_t *n_records)
{
    if (!is_root && (u->label_len == 0 || u->depth != u->parent->depth + u->label_len))
        return kvt_fail(-EINVAL, "trie: bad label or depth at depth %zu", u->depth);
    if (!is_root && u->own_n == 0 && u->n_kids < 2)
        return kvt_fail(-EINVAL, "trie: uncompressed node at depth %zu", u->depth);
    size_t own = 0, own_trim = 0;
    const struct kvt_rec *prev = NULL;
    for (const struct kvt_rec *r = u->head; r; prev = r, r = r->next) {
        if (r->node != u || r->prev != prev || r->n_tokens != u->depth ||
            (prev && prev->seq >= r->seq))
            return kvt_fail(-EINVAL, "trie: bad record list at depth %zu", u->depth);
        own++;
        own_trim += r->trimmable;
    }
    if (u->tail != prev || own != u->own_n || own_trim != u->own_trim)
        return kvt_fail(-EINVAL, "trie: bad record counts at depth %zu", u->depth);
    uint64_t sub_n = own, sub_trim = own_trim;
    struct kvt_rec *min = own_min_trim(u);
    for (size_t i = 0; i < u->n_kids; i++) {
        const struct kvt_tnode *k = u->kids[i].node;
        if (k->parent != u || u->kids[i].first != k->label[0] ||
            (i > 0 && u->kids[i - 1].first >= k->label[0]))
            return kvt_fail(-EINVAL, "trie: bad kid order at depth %zu", u->depth);
        sub_n += k->sub_n;
        sub_trim += k->sub_trim;
        min = earlier(min, k->sub_min_trim);
    }
    if (sub_n != u->sub_n || sub_trim != u->sub_trim || min != u->sub_min_trim)
        return kvt_fail(-EINVAL, "trie: bad aggregates at depth %zu", u->depth);
    if (u->kid_heap.n != u->n_kids || kvt_pheap_check(&u->kid_heap, &kid_ops) < 0)
        return kvt_fail(-EINVAL, "trie: bad kid heap at depth %zu", u->depth);
    for (size_t i = 0; i < u->kid_heap.n; i++)
        if (((const struct kvt_tnode *)u->kid_heap.v[i])->parent != u)
            return kvt_fail(-EINVAL, "trie: foreign node in kid heap at depth %zu", u->depth);
    *n_records += own;
    return 0;
}

int kvt_trie_check(const struct kvt_ns *ns, uint64_t *n_records)
{
    struct kvt_tnode **v;
    size_t n;
    int rc = collect_nodes(ns, &v, &n);
    if (rc < 0)
        return rc;
    *n_records = 0;
    /* Children before parents, so each node is checked against verified kids. */
    for (size_t i = n; rc == 0 && i-- > 0;)
        rc = check_node(v[i], false, n_records);
    if (rc == 0)
        rc = check_node(&ns->root, true, n_records);
    free(v);
    if (rc == 0 && *n_records != ns->root.sub_n)
        rc = kvt_fail(-EINVAL, "trie: %llu records reachable, root counts %llu",
                      (unsigned long long)*n_records, (unsigned long long)ns->root.sub_n);
    return rc;
}
