/*
 * The header serializer. Files must hash the same across implementations, so the JSON is
 * written exactly as JavaScript JSON.stringify writes the reference's header object
 * (FORMAT.md §3.1): no whitespace, fixed key order, plain integers, and JSON.stringify's
 * string escaping (only '"', '\\' and C0 controls are escaped; U+2028/U+2029, DEL and all
 * other non-ASCII text are copied verbatim).
 */
#include "format/format.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void kvt_sbuf_free(struct kvt_sbuf *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

void kvt_sbuf_put(struct kvt_sbuf *b, const void *s, size_t n)
{
    if (b->oom)
        return;
    if (n > SIZE_MAX - b->len - 1) {
        b->oom = true;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1)
            cap = cap > SIZE_MAX / 2 ? b->len + n + 1 : cap * 2;
        char *p = realloc(b->data, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void kvt_sbuf_puts(struct kvt_sbuf *b, const char *s)
{
    kvt_sbuf_put(b, s, strlen(s));
}

void kvt_sbuf_put_u64(struct kvt_sbuf *b, uint64_t v)
{
    char tmp[24];
    size_t i = sizeof(tmp);
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    kvt_sbuf_put(b, tmp + i, sizeof(tmp) - i);
}

void kvt_json_put_string(struct kvt_sbuf *b, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    kvt_sbuf_put(b, "\"", 1);
    const char *run = s; /* start of the pending verbatim run */
    for (const char *p = s; *p; p++) {
        unsigned char c = (unsigned char)*p;
        char esc[6];
        size_t n = 2;
        esc[0] = '\\';
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\t': esc[1] = 't'; break;
        case '\n': esc[1] = 'n'; break;
        case '\f': esc[1] = 'f'; break;
        case '\r': esc[1] = 'r'; break;
        default:
            if (c >= 0x20)
                continue;
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            n = 6;
        }
        kvt_sbuf_put(b, run, (size_t)(p - run));
        kvt_sbuf_put(b, esc, n);
        run = p + 1;
    }
    kvt_sbuf_puts(b, run);
    kvt_sbuf_put(b, "\"", 1);
}

static void put_key(struct kvt_sbuf *b, const char *key, bool first)
{
    if (!first)
        kvt_sbuf_put(b, ",", 1);
    kvt_sbuf_put(b, "\"", 1);
    kvt_sbuf_puts(b, key);
    kvt_sbuf_put(b, "\":", 2);
}

static void put_meta(struct kvt_sbuf *b, const char *key, const char *value)
{
    if (!value)
        return;
    put_key(b, key, false);
    kvt_json_put_string(b, value);
}

void kvt_json_hex64(char out[16], uint64_t v)
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++)
        out[i] = hex[(v >> (60 - 4 * i)) & 15];
}

/* One slot; *@p hash_at (may be NULL) receives where its hash's 16 hex digits are in @p b. */
static void put_slot(struct kvt_sbuf *b, const struct kvt_slot *s, size_t *hash_at)
{
    kvt_sbuf_puts(b, "{\"off\":");
    kvt_sbuf_put_u64(b, s->off);
    kvt_sbuf_puts(b, ",\"bytes\":");
    kvt_sbuf_put_u64(b, s->bytes);
    kvt_sbuf_puts(b, ",\"shape\":[");
    for (int d = 0; d < s->rank; d++) {
        if (d)
            kvt_sbuf_put(b, ",", 1);
        kvt_sbuf_put_u64(b, (uint64_t)s->shape[d]);
    }
    kvt_sbuf_puts(b, "],\"dtype\":");
    kvt_sbuf_put_u64(b, (uint64_t)s->dtype);
    char h[16];
    kvt_json_hex64(h, s->hash);
    kvt_sbuf_puts(b, ",\"hash\":\"");
    if (hash_at)
        *hash_at = b->len;
    kvt_sbuf_put(b, h, 16);
    kvt_sbuf_puts(b, "\"}");
}

static void put_cache(struct kvt_sbuf *b, const struct kvt_cache_header *c, size_t *hash_at)
{
    kvt_sbuf_puts(b, "{\"kind\":");
    kvt_json_put_string(b, kvt_kind_name(c->info.kind));
    put_key(b, "offset", false);
    kvt_sbuf_put_u64(b, (uint64_t)c->info.offset);
    int n;
    const struct kvt_scalar *sc = kvt_kind_scalars(c->info.kind, &n);
    for (int i = 0; i < n; i++) {
        put_key(b, sc[i].key, false);
        kvt_sbuf_put_u64(b, (uint64_t)kvt_scalar_get(&c->info, &sc[i]));
    }
    kvt_sbuf_puts(b, ",\"tensors\":[");
    for (int j = 0; j < c->n_slots; j++) {
        if (j)
            kvt_sbuf_put(b, ",", 1);
        put_slot(b, &c->slots[j], hash_at ? &hash_at[j] : NULL);
    }
    kvt_sbuf_puts(b, "]}");
}

int kvt_header_to_json(const struct kvt_header *h, struct kvt_sbuf *out)
{
    return kvt_header_to_json_at(h, out, NULL);
}

int kvt_header_to_json_at(const struct kvt_header *h, struct kvt_sbuf *out, size_t *hash_at)
{
    struct kvt_sbuf *b = out;
    kvt_sbuf_puts(b, "{\"formatVersion\":");
    kvt_sbuf_put_u64(b, (uint64_t)h->format_version);
    if (h->created_at >= 0) {
        put_key(b, "createdAt", false);
        kvt_sbuf_put_u64(b, (uint64_t)h->created_at);
    }
    put_meta(b, "modelId", h->model_id);
    put_meta(b, "configFingerprint", h->config_fingerprint);
    put_meta(b, "tokenizerHash", h->tokenizer_hash);
    put_meta(b, "ns", h->ns);
    put_key(b, "tokens", false);
    kvt_sbuf_put(b, "[", 1);
    for (size_t i = 0; i < h->n_tokens; i++) {
        if (i)
            kvt_sbuf_put(b, ",", 1);
        kvt_sbuf_put_u64(b, (uint64_t)(uint32_t)h->tokens[i]);
    }
    kvt_sbuf_puts(b, "],\"caches\":[");
    for (size_t i = 0; i < h->n_caches; i++) {
        if (i)
            kvt_sbuf_put(b, ",", 1);
        put_cache(b, &h->caches[i], hash_at);
        if (hash_at)
            hash_at += h->caches[i].n_slots;
    }
    kvt_sbuf_puts(b, "]}");
    return b->oom ? -ENOMEM : 0;
}
