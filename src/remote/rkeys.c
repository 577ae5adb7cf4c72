/*
 * Key layout (REMOTE.md): everything lives under "<prefix>:", namespaced by the model
 * identity (a hash of model id, config fingerprint and tokenizer hash) and, for chunks, by
 * the namespace hash. The index keys of an identity share one hash tag so that the publish
 * script can touch them atomically in a cluster; an entry's chunks share the entry's tag, so
 * one entry lives on one master and is fetched in one pipeline, while entries spread. A shared
 * prefix object's keys have the tag of its chunk id and generation; its field in the index's
 * object table is its namespace hash and chunk id.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/error.h"
#include "remote/robj.h"

int kvt_rkeys_init(struct kvt_rkeys *k, const char *prefix, const char *model, const char *fp,
                   const char *tok)
{
    memset(k, 0, sizeof(*k));
    if (strlen(prefix) > 100 || strpbrk(prefix, "{} \r\n"))
        return kvt_fail(-EINVAL, "remote: prefix must be at most 100 characters without "
                                 "braces or spaces");
    struct kvt_wyhash_state st;
    kvt_wyhash_init(&st, 0);
    const char *parts[3] = {model, fp, tok};
    for (int i = 0; i < 3; i++)
        kvt_wyhash_update(&st, parts[i], strlen(parts[i]) + 1);
    snprintf(k->ident, sizeof(k->ident), "%016llx", (unsigned long long)kvt_wyhash_final(&st));
    if (!(k->prefix = strdup(prefix)))
        return kvt_fail(-ENOMEM, "remote: out of memory");
    snprintf(k->ver, sizeof(k->ver), "%s:{%s}:ver", prefix, k->ident);
    snprintf(k->idx, sizeof(k->idx), "%s:{%s}:idx", prefix, k->ident);
    snprintf(k->log, sizeof(k->log), "%s:{%s}:log", prefix, k->ident);
    snprintf(k->gone, sizeof(k->gone), "%s:{%s}:gone", prefix, k->ident);
    snprintf(k->bytes, sizeof(k->bytes), "%s:{%s}:bytes", prefix, k->ident);
    snprintf(k->floor, sizeof(k->floor), "%s:{%s}:floor", prefix, k->ident);
    snprintf(k->objs, sizeof(k->objs), "%s:{%s}:objs", prefix, k->ident);
    snprintf(k->refs, sizeof(k->refs), "%s:{%s}:refs", prefix, k->ident);
    return 0;
}

void kvt_rkeys_free(struct kvt_rkeys *k)
{
    free(k->prefix);
    k->prefix = NULL;
}

void kvt_rkeys_chunk(const struct kvt_rkeys *k, const char *ns, const char *uuid, uint32_t i,
                     char *out, size_t cap)
{
    char nsh[17];
    kvt_ns_hash(ns, nsh);
    snprintf(out, cap, "%s:%s:%s:{%s}:%u", k->prefix, k->ident, nsh, uuid, i);
}

void kvt_rkeys_uuid(char out[33])
{
    uint64_t v[2];
    if (getrandom(v, sizeof(v), 0) != sizeof(v)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v[0] = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30);
        v[1] = kvt_wyhash(v[0], &ts, sizeof(ts)) ^ (uint64_t)(uintptr_t)out;
    }
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)v[0], (unsigned long long)v[1]);
}

struct kvt_rentry kvt_robj_entry(const struct kvt_robj *o, const char *ns, char name[KVT_ROBJ_NAME])
{
    snprintf(name, KVT_ROBJ_NAME, "%s.%s", o->id, o->gen);
    return (struct kvt_rentry){ns, name, o->bytes, o->chunk, o->n_chunks};
}

void kvt_robj_field(const char *ns, const char *id, char out[KVT_ROBJ_FIELD])
{
    char nsh[17];
    kvt_ns_hash(ns, nsh);
    snprintf(out, KVT_ROBJ_FIELD, "%s:%s", nsh, id);
}
