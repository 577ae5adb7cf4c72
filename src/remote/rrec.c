/*
 * The index record of one remote entry, as stored in the identity's index hash: a fixed
 * little-endian head, the namespace and the tokens. Records come from the network, so the
 * decoder checks every count against the record's own length and the configured limits
 * before it allocates.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "remote/remote_parts.h"

#define MAGIC "KVR1"
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
    r->ns = NULL;
    r->tokens = NULL;
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
    size_t nsl = strlen(r->ns);
    *len = HEAD + 1 + nsl + r->n_tokens * 4;
    uint8_t *p = malloc(*len);
    if (!p)
        return NULL;
    memcpy(p, MAGIC, 4);
    memcpy(p + 4, r->uuid, 32);
    put64(p + 36, (uint64_t)nsl | (uint64_t)r->n_chunks << 32);
    put64(p + 44, r->bytes);
    put64(p + 52, r->chunk);
    put64(p + 60, r->header_hash);
    put64(p + 68, (uint64_t)r->created_ms);
    p[HEAD] = r->trimmable ? 1 : 0;
    memcpy(p + HEAD + 1, r->ns, nsl);
    for (size_t i = 0; i < r->n_tokens; i++) {
        uint32_t t = (uint32_t)r->tokens[i];
        uint8_t *q = p + HEAD + 1 + nsl + 4 * i;
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

/* The head's numbers, checked against each other and the limits. */
static int decode_head(const uint8_t *p, size_t len, uint64_t max_bytes, struct kvt_rrec *o,
                       size_t *nsl)
{
    if (len < HEAD + 1 || memcmp(p, MAGIC, 4) || !uuid_ok(p + 4))
        return kvt_fail(KVT_E_CORRUPT, "remote: bad index record head");
    uint64_t w = get64(p + 36);
    *nsl = (size_t)(w & 0xffffffffu);
    o->n_chunks = (uint32_t)(w >> 32);
    o->bytes = get64(p + 44);
    o->chunk = get64(p + 52);
    o->header_hash = get64(p + 60);
    o->created_ms = (int64_t)get64(p + 68);
    size_t rest = len - HEAD - 1;
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

int kvt_rrec_decode(const uint8_t *p, size_t len, uint64_t max_bytes, struct kvt_rrec *o)
{
    memset(o, 0, sizeof(*o));
    size_t nsl = 0;
    int rc = decode_head(p, len, max_bytes, o, &nsl);
    if (rc < 0)
        return rc;
    o->ns = malloc(nsl + 1);
    o->tokens = malloc(o->n_tokens ? o->n_tokens * 4 : 1);
    if (!o->ns || !o->tokens) {
        free(o->ns);
        free(o->tokens);
        return kvt_fail(-ENOMEM, "remote: out of memory");
    }
    memcpy(o->ns, p + HEAD + 1, nsl);
    o->ns[nsl] = '\0';
    const uint8_t *q = p + HEAD + 1 + nsl;
    for (size_t i = 0; i < o->n_tokens; i++, q += 4)
        o->tokens[i] = (int32_t)((uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
                                 (uint32_t)q[3] << 24);
    if (memchr(o->ns, '\0', nsl)) {
        free(o->ns);
        free(o->tokens);
        return kvt_fail(KVT_E_CORRUPT, "remote: NUL in an index record's namespace");
    }
    return 0;
}
