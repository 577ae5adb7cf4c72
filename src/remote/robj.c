/*
 * Shared prefix objects in index records (SHARING.md "The remote tier"): a record of a
 * shared entry (magic KVR2) carries, after its head, its namespace hash and one fixed-size
 * entry per object it needs: the chunk id, the generation (the uuid of the upload whose keys
 * hold the bytes), byte size, value size and header hash. The index scripts read the same
 * bytes: the object's field in the index is "<nsHash>:<id>" and its value is its entry.
 * Records come from the network, so every count is checked before anything is allocated.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "remote/robj.h"

#define MIN_CHUNK 4096
#define MAX_CHUNK ((uint64_t)512 << 20)

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static bool hex32(const uint8_t *p)
{
    for (int i = 0; i < 32; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return false;
    return true;
}

void kvt_robj_encode(const struct kvt_robj *o, uint8_t *p)
{
    memcpy(p, o->id, 32);
    memcpy(p + 32, o->gen, 32);
    put64(p + 64, o->bytes);
    put64(p + 72, o->chunk);
    put64(p + 80, o->header_hash);
}

int kvt_robj_decode(const uint8_t *p, size_t len, uint64_t max_bytes, struct kvt_robj *o)
{
    memset(o, 0, sizeof(*o));
    if (len != KVT_ROBJ_WIRE || !hex32(p) || !hex32(p + 32))
        return kvt_fail(KVT_E_CORRUPT, "remote: bad shared object entry");
    memcpy(o->id, p, 32);
    memcpy(o->gen, p + 32, 32);
    o->bytes = get64(p + 64);
    o->chunk = get64(p + 72);
    o->header_hash = get64(p + 80);
    if (o->chunk < MIN_CHUNK || o->chunk > MAX_CHUNK || o->bytes == 0 || o->bytes > max_bytes)
        return kvt_fail(KVT_E_CORRUPT, "remote: bad shared object sizes");
    o->n_chunks = (uint32_t)((o->bytes + o->chunk - 1) / o->chunk);
    return 0;
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

size_t kvt_robjs_wire(const struct kvt_rrec *r)
{
    char nsh[17];
    kvt_ns_hash(r->ns, nsh);
    return r->n_objs ? 1 + strlen(nsh) + 4 + (size_t)r->n_objs * KVT_ROBJ_WIRE : 0;
}

void kvt_robjs_encode(const struct kvt_rrec *r, uint8_t *p)
{
    char nsh[17];
    kvt_ns_hash(r->ns, nsh);
    size_t nl = strlen(nsh);
    p[0] = (uint8_t)nl;
    memcpy(p + 1, nsh, nl);
    p += 1 + nl;
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(r->n_objs >> (8 * i));
    for (uint32_t i = 0; i < r->n_objs; i++)
        kvt_robj_encode(&r->objs[i], p + 4 + (size_t)i * KVT_ROBJ_WIRE);
}

int kvt_robjs_decode(const uint8_t *p, size_t len, uint64_t max_bytes, struct kvt_rrec *o,
                     char nsh[17], size_t *used)
{
    size_t nl = len ? p[0] : 0;
    if (len < 5 || nl == 0 || nl > 16 || len - 5 < nl)
        return kvt_fail(KVT_E_CORRUPT, "remote: bad shared object list");
    memcpy(nsh, p + 1, nl);
    nsh[nl] = '\0';
    const uint8_t *q = p + 1 + nl;
    uint32_t n = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
    if (n == 0 || n > (len - 5 - nl) / KVT_ROBJ_WIRE)
        return kvt_fail(KVT_E_CORRUPT, "remote: bad shared object count");
    if (!(o->objs = calloc(n, sizeof(*o->objs))))
        return kvt_fail(-ENOMEM, "remote: out of memory");
    o->n_objs = n;
    for (uint32_t i = 0; i < n; i++) {
        int rc = kvt_robj_decode(q + 4 + (size_t)i * KVT_ROBJ_WIRE, KVT_ROBJ_WIRE, max_bytes,
                                 &o->objs[i]);
        if (rc < 0)
            return rc; /* the caller frees o->objs */
    }
    *used = 5 + nl + (size_t)n * KVT_ROBJ_WIRE;
    return 0;
}
