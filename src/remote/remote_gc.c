/*
 * Listing and gc of the remote index: the local view as store records (one allocation, freed
 * with kvt_store_list_free()), and a check that drops records whose chunks are gone (evicted
 * by Redis or deleted) and the oldest entries beyond a byte cap. Only keys of this identity
 * under the prefix are ever read or deleted.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "remote/remote_obj.h"
#include "remote/robj.h"
#include "store/index.h"

int kvt_remote_list(kvt_remote *r, struct kvt_store_record **out, size_t *n)
{
    if (!r || !out || !n)
        return kvt_fail(-EINVAL, "kvt_remote_list: NULL argument");
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&r->mu);
    struct kvt_rec **all = NULL;
    size_t cnt = 0, strs = 0;
    int rc = kvt_index_records(r->view.ix, &all, &cnt);
    for (size_t i = 0; rc == 0 && i < cnt; i++)
        strs += 33 + strlen(((struct kvt_rrec *)all[i]->owner)->ns) + 1;
    struct kvt_store_record *v = rc == 0 ? malloc(cnt * sizeof(*v) + strs + 1) : NULL;
    char *p = v ? (char *)(v + cnt) : NULL;
    for (size_t i = 0; v && i < cnt; i++) {
        const struct kvt_rrec *rr = all[i]->owner;
        v[i] = (struct kvt_store_record){.id = all[i]->seq,
                                         .n_tokens = rr->n_tokens,
                                         .bytes = rr->bytes,
                                         .mtime_ms = rr->created_ms,
                                         .trimmable = rr->trimmable};
        v[i].path = memcpy(p, rr->uuid, 33);
        p += 33;
        v[i].ns = strcpy(p, rr->ns);
        p += strlen(rr->ns) + 1;
    }
    pthread_mutex_unlock(&r->mu);
    free(all);
    if (!v)
        return kvt_fail(rc < 0 ? rc : -ENOMEM, "remote list: out of memory");
    *out = v;
    *n = cnt;
    return 0;
}

#define EXISTS_BATCH 128

/* Whether every chunk of @p e exists: 1, 0, or < 0 on a connection failure. The chunks
 * share a hash tag, so one multi-key EXISTS per batch asks their master. */
static int keys_exist(struct kvt_remote *r, const struct kvt_rentry *e)
{
    char(*keys)[256] = malloc(EXISTS_BATCH * sizeof(*keys));
    const char *argv[EXISTS_BATCH + 1] = {"EXISTS"};
    int result = keys ? 1 : kvt_fail(-ENOMEM, "remote gc: out of memory");
    for (uint32_t i = 0; result == 1 && i < e->n_chunks; i += EXISTS_BATCH) {
        int argc = 1;
        for (uint32_t j = i; j < e->n_chunks && j < i + EXISTS_BATCH; j++, argc++) {
            kvt_rkeys_chunk(&r->keys, e->ns, e->uuid, j, keys[argc - 1], sizeof(*keys));
            argv[argc] = keys[argc - 1];
        }
        int err = 0;
        redisReply *rep = kvt_rclient_cmd(&r->put_rc, argv[1], argc, argv, NULL, &err);
        if (!rep)
            result = err;
        else if (rep->type == REDIS_REPLY_ERROR) /* says nothing about the chunks (a migration) */
            result = kvt_fail(-EIO, "redis: EXISTS: %s", rep->str);
        else if (rep->type != REDIS_REPLY_INTEGER || rep->integer != argc - 1)
            result = 0;
        freeReplyObject(rep);
    }
    free(keys);
    return result;
}

/* Whether every chunk of @p rec and of the shared objects it needs exists: 1, 0 or < 0. */
static int complete(struct kvt_remote *r, const struct kvt_rrec *rec)
{
    struct kvt_rentry e = {rec->ns, rec->uuid, rec->bytes, rec->chunk, rec->n_chunks};
    int ok = keys_exist(r, &e);
    for (uint32_t i = 0; ok == 1 && i < rec->n_objs; i++) {
        char tag[KVT_ROBJ_NAME];
        e = kvt_robj_entry(&rec->objs[i], rec->ns, tag);
        ok = keys_exist(r, &e);
    }
    return ok;
}

/* Records in publication order (oldest first), copied. */
static struct kvt_rrec **snapshot(struct kvt_remote *r, size_t *n)
{
    struct kvt_rec **all = NULL;
    pthread_mutex_lock(&r->mu);
    struct kvt_rrec **v = NULL;
    if (kvt_index_records(r->view.ix, &all, n) == 0 && (v = calloc(*n + 1, sizeof(*v))))
        for (size_t i = 0; i < *n; i++)
            v[i] = kvt_remote_rec_copy_locked(all[i]->owner);
    pthread_mutex_unlock(&r->mu);
    free(all);
    return v;
}

static int by_age(const void *a, const void *b)
{
    const struct kvt_rrec *x = *(struct kvt_rrec *const *)a, *y = *(struct kvt_rrec *const *)b;
    if (!x || !y)
        return !x - !y;
    return (x->created_ms > y->created_ms) - (x->created_ms < y->created_ms);
}

int kvt_remote_gc(kvt_remote *r, uint64_t max_bytes, bool dry_run, size_t *dropped)
{
    if (dropped)
        *dropped = 0;
    if (!r)
        return kvt_fail(-EINVAL, "kvt_remote_gc: NULL remote");
    int rc = kvt_remote_refresh(r);
    size_t n = 0, gone = 0;
    struct kvt_rrec **v = rc == 0 ? snapshot(r, &n) : NULL;
    if (rc == 0 && !v)
        rc = kvt_fail(-ENOMEM, "remote gc: out of memory");
    if (v)
        qsort(v, n, sizeof(*v), by_age);
    struct kvt_remote_stats st;
    kvt_remote_get_stats(r, &st);
    /* the bytes a record frees depend on which other records need its objects: with shared
     * objects the index script makes room (exactly, as for an upload); a dry run drops as if
     * each record freed only its own bytes (an upper bound) */
    uint64_t total = st.shared_bytes, cap = max_bytes ? max_bytes : r->max_bytes;
    uint64_t loop_cap = st.shared_objects && !dry_run ? UINT64_MAX : cap;
    for (size_t i = 0; i < n; i++)
        total += v[i] ? v[i]->bytes : 0;
    pthread_mutex_lock(&r->put_mu);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (!v[i])
            continue;
        kvt_rclient_arm(&r->put_rc, 0); /* each record's check and removal is one call */
        int ok = total > loop_cap ? 0 : complete(r, v[i]);
        if (ok < 0)
            rc = ok;
        if (ok != 0)
            continue;
        total -= v[i]->bytes;
        gone++;
        if (!dry_run)
            kvt_remote_delete(r, &r->put_rc, v[i]);
    }
    struct kvt_rout o;
    if (rc == 0 && loop_cap != cap) {
        kvt_rclient_arm(&r->put_rc, 0);
        rc = kvt_remote_admit(r, NULL, 0, cap, false, &o);
        gone += rc == 0 ? o.n_gone : 0;
        if (rc == 0)
            kvt_rout_free(&o);
    }
    pthread_mutex_unlock(&r->put_mu);
    for (size_t i = 0; i < n; i++)
        kvt_rrec_free(v[i]);
    free(v);
    if (dropped)
        *dropped = gone;
    return rc;
}
