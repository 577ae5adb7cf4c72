/*
 * Position-indexed binary heap (see pheap.h). Elements store their index so removal and
 * re-sifting of an arbitrary element cost O(log n).
 */
#include "store/pheap.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

static size_t *pos_of(const struct kvt_pheap_ops *ops, void *e)
{
    return (size_t *)((char *)e + ops->pos_off);
}

static void place(struct kvt_pheap *h, const struct kvt_pheap_ops *ops, size_t i, void *e)
{
    h->v[i] = e;
    *pos_of(ops, e) = i;
}

static void sift_up(struct kvt_pheap *h, const struct kvt_pheap_ops *ops, size_t i)
{
    void *e = h->v[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ops->less(e, h->v[p]))
            break;
        place(h, ops, i, h->v[p]);
        i = p;
    }
    place(h, ops, i, e);
}

static void sift_down(struct kvt_pheap *h, const struct kvt_pheap_ops *ops, size_t i)
{
    void *e = h->v[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && ops->less(h->v[c + 1], h->v[c]))
            c++;
        if (!ops->less(h->v[c], e))
            break;
        place(h, ops, i, h->v[c]);
        i = c;
    }
    place(h, ops, i, e);
}

void kvt_pheap_free(struct kvt_pheap *h)
{
    free(h->v);
    h->v = NULL;
    h->n = h->cap = 0;
}

int kvt_pheap_reserve(struct kvt_pheap *h, size_t n)
{
    if (n <= h->cap)
        return 0;
    size_t cap = h->cap ? h->cap : 2;
    while (cap < n) {
        if (cap > SIZE_MAX / 2 / sizeof(void *))
            return -ENOMEM;
        cap *= 2;
    }
    void **v = realloc(h->v, cap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    h->v = v;
    h->cap = cap;
    return 0;
}

int kvt_pheap_push(struct kvt_pheap *h, const struct kvt_pheap_ops *ops, void *e)
{
    int rc = kvt_pheap_reserve(h, h->n + 1);
    if (rc < 0)
        return rc;
    place(h, ops, h->n++, e);
    sift_up(h, ops, h->n - 1);
    return 0;
}

void kvt_pheap_remove(struct kvt_pheap *h, const struct kvt_pheap_ops *ops, void *e)
{
    size_t i = *pos_of(ops, e);
    void *last = h->v[--h->n];
    if (i == h->n)
        return;
    place(h, ops, i, last);
    kvt_pheap_fix(h, ops, last);
}

void kvt_pheap_fix(struct kvt_pheap *h, const struct kvt_pheap_ops *ops, void *e)
{
    size_t i = *pos_of(ops, e);
    if (i > 0 && ops->less(e, h->v[(i - 1) / 2]))
        sift_up(h, ops, i);
    else
        sift_down(h, ops, i);
}

void kvt_pheap_replace(struct kvt_pheap *h, const struct kvt_pheap_ops *ops, void *old, void *e)
{
    place(h, ops, *pos_of(ops, old), e);
}

int kvt_pheap_check(const struct kvt_pheap *h, const struct kvt_pheap_ops *ops)
{
    for (size_t i = 0; i < h->n; i++) {
        if (*pos_of(ops, h->v[i]) != i)
            return -EINVAL;
        if (i > 0 && ops->less(h->v[i], h->v[(i - 1) / 2]))
            return -EINVAL;
    }
    return 0;
}
