/*
 * A binary heap of pointers whose elements remember their own position (a size_t field at a
 * fixed offset), so any element can be removed or re-sifted in O(log n). The store index uses
 * it for eviction order, the longest record, and each radix node's children ordered by their
 * earliest trimmable record.
 */
#ifndef KVT_PHEAP_H
#define KVT_PHEAP_H

#include <stdbool.h>
#include <stddef.h>

struct kvt_pheap {
    void **v;
    size_t n, cap;
};

/** True when @p a must come out before @p b. */
typedef bool (*kvt_pheap_less_fn)(const void *a, const void *b);

struct kvt_pheap_ops {
    kvt_pheap_less_fn less;
    size_t pos_off; /* offsetof the element's size_t position field */
};

void kvt_pheap_free(struct kvt_pheap *h);
/** Make room for @p n elements in total. 0 or -ENOMEM. */
int kvt_pheap_reserve(struct kvt_pheap *h, size_t n);
/** Add @p e. 0 or -ENOMEM (never fails after a sufficient reserve). */
int kvt_pheap_push(struct kvt_pheap *h, const struct kvt_pheap_ops *ops, void *e);
void kvt_pheap_remove(struct kvt_pheap *h, const struct kvt_pheap_ops *ops, void *e);
/** Restore the order after the key of @p e changed. */
void kvt_pheap_fix(struct kvt_pheap *h, const struct kvt_pheap_ops *ops, void *e);
/** Put @p e where @p old is (the two must have equal keys); @p old leaves the heap. */
void kvt_pheap_replace(struct kvt_pheap *h, const struct kvt_pheap_ops *ops, void *old, void *e);
static inline void *kvt_pheap_top(const struct kvt_pheap *h)
{
    return h->n ? h->v[0] : NULL;
}
/** Verify the heap property and every stored position: 0 or -EINVAL. */
int kvt_pheap_check(const struct kvt_pheap *h, const struct kvt_pheap_ops *ops);

#endif
