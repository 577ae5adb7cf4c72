/*
 * The index record of one remote entry, as stored in the identity's index hash: a fixed
 * little-endian head, for a shared entry the prefix objects it needs (each a fixed entry, as
 * the index's object table holds it too), the namespace and the tokens. Records come from the
 * network, so the decoder checks every count against the record's own length and the configured
 * limits before it allocates.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "remote/robj.h"
#include "store/share.h"

#define MAGIC "KVR1"
#define MAGIC_SHARED "KVR2" /* the record of a shared entry: its object list follows the head */
#define HEAD 76 /* magic 4, uuid 32, ns_len 4, n_chunks 4, bytes, chunk, hash, created 8 each */
#define MAX_NS 4096
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

void kvt_rrec_free_fields(struct kvt_rrec *r)
{
    free(r->ns);
    free(r->tokens);
    free(r->objs);
    r->ns = NULL;
    r->tokens = NULL;
    r->objs = NULL;
    r->n_objs = 0;
}

void kvt_rrecs_free(struct kvt_rrec *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        kvt_rrec_free_fields(&v[i]);
    free(v);
}

void kvt_rrec_free(struct kvt_rrec *r)
{
    if (!r)
        return;
    kvt_rrec_free_fields(r);
    free(r);
}

bool kvt_rrec_same(const struct kvt_rrec *a, const struct kvt_rrec *b)
{
    return !strcmp(a->uuid, b->uuid) && a->bytes == b->bytes && a->chunk == b->chunk &&
           a->n_chunks == b->n_chunks && a->header_hash == b->header_hash &&
           a->created_ms == b->created_ms;
}

uint8_t *kvt_rrec_encode(const struct kvt_rrec *r, size_t *len)
{
    size_t nsl = strlen(r->ns), ol = kvt_robjs_wire(r);
    *len = HEAD + 1 + ol + nsl + r->n_tokens * 4;
    uint8_t *p = malloc(*len);
    if (!p)
        return NULL;
    memcpy(p, ol ? MAGIC_SHARED : MAGIC, 4);
    memcpy(p + 4, r->uuid, 32);
    put64(p + 36, (uint64_t)nsl | (uint64_t)r->n_chunks << 32);
    put64(p + 44, r->bytes);
    put64(p + 52, r->chunk);
    put64(p + 60, r->header_hash);
    put64(p + 68, (uint64_t)r->created_ms);
    p[HEAD] = r->trimmable ? 1 : 0;
    if (ol)
        kvt_robjs_encode(r, p + HEAD + 1);
    memcpy(p + HEAD + 1 + ol, r->ns, nsl);
    for (size_t i = 0; i < r->n_tokens; i++) {
        uint32_t t = (uint32_t)r->tokens[i];
        uint8_t *q = p + HEAD + 1 + ol + nsl + 4 * i;
        q[0] = (uint8_t)t, q[1] = (uint8_t)(t >> 8), q[2] = (uint8_t)(t >> 16);
        q[3] = (uint8_t)(t >> 24);
    }
    return p;
}

static bool uuid_ok(const uint8_t *p)
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
    if (len != KVT_ROBJ_WIRE || !uuid_ok(p) || !uuid_ok(p + 32))
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

/* The head's numbers, checked against each other and the limits; the namespace starts at
 * @p at. */
static int decode_head(const uint8_t *p, size_t len, size_t at, uint64_t max_bytes,
                       struct kvt_rrec *o, size_t *nsl)
{
    if (len < at || !uuid_ok(p + 4))
        return kvt_fail(KVT_E_CORRUPT, "remote: bad index record head");
    uint64_t w = get64(p + 36);
    *nsl = (size_t)(w & 0xffffffffu);
    o->n_chunks = (uint32_t)(w >> 32);
    o->bytes = get64(p + 44);
    o->chunk = get64(p + 52);
    o->header_hash = get64(p + 60);
    o->created_ms = (int64_t)get64(p + 68);
    size_t rest = len - at;
    if (*nsl > MAX_NS || *nsl > rest || (rest - *nsl) % 4 || p[HEAD] > 1)
        return kvt_fail(KVT_E_CORRUPT, "remote: bad index record lengths");
    if (o->chunk < MIN_CHUNK || o->chunk > MAX_CHUNK || o->bytes == 0 || o->bytes > max_bytes ||
        o->n_chunks != (o->bytes + o->chunk - 1) / o->chunk)
        return kvt_fail(KVT_E_CORRUPT, "remote: bad index record sizes");
    o->n_tokens = (rest - *nsl) / 4;
    o->trimmable = p[HEAD] == 1;
    memcpy(o->uuid, p + 4, 32);
    o->uuid[32] = '\0';
    return 0;
}

/* The object list of a shared entry's record (KVR2), which must fit its tokens and namespace:
 * its length in *@p at. */
static int decode_objs(const uint8_t *p, size_t len, uint64_t max_bytes, struct kvt_rrec *o,
                       char nsh[17], size_t *at)
{
    *at = 0;
    if (len < HEAD + 1 || (memcmp(p, MAGIC, 4) && memcmp(p, MAGIC_SHARED, 4)))
        return kvt_fail(KVT_E_CORRUPT, "remote: bad index record head");
    if (!memcmp(p, MAGIC, 4))
        return 0;
    return kvt_robjs_decode(p + HEAD + 1, len - HEAD - 1, max_bytes, o, nsh, at);
}

/* The fields of a decoded record, checked against each other: 0, or the record is freed. */
static int decode_fields(const uint8_t *p, size_t len, uint64_t max_bytes, struct kvt_rrec *o)
{
    char nsh[17] = "", want[17];
    size_t ol = 0, nsl = 0;
    int rc = decode_objs(p, len, max_bytes, o, nsh, &ol);
    if (rc == 0)
        rc = decode_head(p, len, HEAD + 1 + ol, max_bytes, o, &nsl);
    if (rc == 0 && !(o->ns = strndup((const char *)p + HEAD + 1 + ol, nsl)))
        rc = kvt_fail(-ENOMEM, "remote: out of memory");
    if (rc == 0 && strlen(o->ns) != nsl)
        rc = kvt_fail(KVT_E_CORRUPT, "remote: NUL in an index record's namespace");
    if (rc == 0 && o->n_objs)
        kvt_ns_hash(o->ns, want);
    if (rc == 0 && o->n_objs && (strcmp(want, nsh) || o->n_objs != kvt_share_chunks(o->n_tokens)))
        rc = kvt_fail(KVT_E_CORRUPT, "remote: a shared record's objects do not fit its tokens");
    if (rc < 0)
        kvt_rrec_free_fields(o);
    return rc;
}

int kvt_rrec_decode(const uint8_t *p, size_t len, uint64_t max_bytes, struct kvt_rrec *o)
{
    memset(o, 0, sizeof(*o));
    int rc = decode_fields(p, len, max_bytes, o);
    if (rc < 0)
        return rc;
    size_t at = len - o->n_tokens * 4;
    o->tokens = malloc(o->n_tokens ? o->n_tokens * 4 : 1);
    if (!o->tokens) {
        kvt_rrec_free_fields(o);
        return kvt_fail(-ENOMEM, "remote: out of memory");
    }
    const uint8_t *q = p + at;
    for (size_t i = 0; i < o->n_tokens; i++, q += 4)
        o->tokens[i] = (int32_t)((uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
                                 (uint32_t)q[3] << 24);
    return 0;
}
