/*
 * Wyhash exactly as Zig's std.hash.Wyhash (what the reference's Bun.hash computes), one-shot
 * and streaming. The streaming form holds back the last block until more input arrives,
 * because the final round reads the last 16 bytes of the whole input (FORMAT.md §7).
 */
#include "hash/hash.h"

#include <string.h>

static const uint64_t P0 = 0xa0761d6478bd642full;
static const uint64_t P1 = 0xe7037ed1a0b428dbull;
static const uint64_t P2 = 0x8ebc6af09c88c6e3ull;
static const uint64_t P3 = 0x589965cc75374cc3ull;

static inline uint64_t r8(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* little-endian hosts only (x86-64, arm64) */
}

static inline uint64_t r4(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline void mum(uint64_t *a, uint64_t *b)
{
    __uint128_t p = (__uint128_t)*a * *b;
    *a = (uint64_t)p;
    *b = (uint64_t)(p >> 64);
}

static inline uint64_t mix(uint64_t a, uint64_t b)
{
    mum(&a, &b);
    return a ^ b;
}

static inline void round48(uint64_t s[3], const uint8_t *p)
{
    s[0] = mix(r8(p) ^ P1, r8(p + 8) ^ s[0]);
    s[1] = mix(r8(p + 16) ^ P2, r8(p + 24) ^ s[1]);
    s[2] = mix(r8(p + 32) ^ P3, r8(p + 40) ^ s[2]);
}

/* round48() on the block at @p p, which is also copied to @p out (one pass over the bytes). */
static inline void round48_copy(uint64_t s[3], const uint8_t *p, uint8_t *out)
{
    uint64_t w[6];
    for (int k = 0; k < 6; k++)
        w[k] = r8(p + 8 * k);
    memcpy(out, w, sizeof(w));
    s[0] = mix(w[0] ^ P1, w[1] ^ s[0]);
    s[1] = mix(w[2] ^ P2, w[3] ^ s[1]);
    s[2] = mix(w[4] ^ P3, w[5] ^ s[2]);
}

static uint64_t finish(uint64_t s0, uint64_t a, uint64_t b, uint64_t len)
{
    a ^= P1;
    b ^= s0;
    mum(&a, &b);
    return mix(a ^ P0 ^ len, b ^ P1);
}

static uint64_t small(uint64_t s0, const uint8_t *d, size_t n)
{
    uint64_t a = 0, b = 0;
    if (n >= 4) {
        size_t q = (n >> 3) << 2;
        a = (r4(d) << 32) | r4(d + q);
        b = (r4(d + n - 4) << 32) | r4(d + n - 4 - q);
    } else if (n > 0) {
        a = ((uint64_t)d[0] << 16) | ((uint64_t)d[n >> 1] << 8) | d[n - 1];
    }
    return finish(s0, a, b, n);
}

static uint64_t seed_state(uint64_t seed)
{
    return seed ^ mix(seed ^ P0, P1);
}

uint64_t kvt_wyhash(uint64_t seed, const void *data, size_t len)
{
    const uint8_t *d = data;
    uint64_t s[3];
    s[0] = s[1] = s[2] = seed_state(seed);
    if (len <= 16)
        return small(s[0], d, len);

    size_t i = 0;
    if (len >= 48) {
        while (i + 48 < len) {
            round48(s, d + i);
            i += 48;
        }
        s[0] ^= s[1] ^ s[2];
    }
    while (i + 16 < len) {
        s[0] = mix(r8(d + i) ^ P1, r8(d + i + 8) ^ s[0]);
        i += 16;
    }
    return finish(s[0], r8(d + len - 16), r8(d + len - 8), len);
}

void kvt_wyhash_init(struct kvt_wyhash_state *st, uint64_t seed)
{
    memset(st, 0, sizeof(*st));
    st->s[0] = st->s[1] = st->s[2] = seed_state(seed);
}

/* kvt_wyhash_update(), copying the input to @p out as well when it is not NULL. */
static void update(struct kvt_wyhash_state *st, const uint8_t *d, uint8_t *out, size_t len)
{
    st->total += len;

    /* Top the buffer up; a full buffer is consumed only once more input follows it. */
    if (st->nbuf > 0 || len <= 48) {
        size_t take = 48 - st->nbuf;
        if (take > len)
            take = len;
        memcpy(st->buf + st->nbuf, d, take);
        if (out) {
            memcpy(out, d, take);
            out += take;
        }
        st->nbuf += take;
        d += take;
        len -= take;
        if (len == 0)
            return;
        round48(st->s, st->buf);
        memcpy(st->last, st->buf + 32, 16);
        st->nbuf = 0;
    }
    /* Whole blocks straight from the input, keeping at least one byte back. */
    if (len > 48) {
        uint64_t s[3] = {st->s[0], st->s[1], st->s[2]};
        if (out) {
            do {
                round48_copy(s, d, out);
                d += 48;
                out += 48;
                len -= 48;
            } while (len > 48);
        } else {
            do {
                round48(s, d);
                d += 48;
                len -= 48;
            } while (len > 48);
        }
        memcpy(st->s, s, sizeof(s));
        memcpy(st->last, d - 16, 16);
    }
    memcpy(st->buf, d, len);
    if (out)
        memcpy(out, d, len);
    st->nbuf = len;
}

void kvt_wyhash_update(struct kvt_wyhash_state *st, const void *data, size_t len)
{
    update(st, data, NULL, len);
}

void kvt_wyhash_update_copy(struct kvt_wyhash_state *st, void *dst, const void *src, size_t len)
{
    update(st, src, dst, len);
}

uint64_t kvt_wyhash_final(const struct kvt_wyhash_state *st)
{
    uint64_t n = st->total;
    if (n <= 16)
        return small(st->s[0], st->buf, (size_t)n);

    uint64_t s[3] = {st->s[0], st->s[1], st->s[2]};
    if (n >= 48)
        s[0] ^= s[1] ^ s[2];

    const uint8_t *t = st->buf;
    size_t r = st->nbuf, j = 0;
    while (j + 16 < r) {
        s[0] = mix(r8(t + j) ^ P1, r8(t + j + 8) ^ s[0]);
        j += 16;
    }
    /* The last 16 bytes of the whole input, which may reach back into the consumed block. */
    uint8_t tail[16];
    if (r >= 16) {
        memcpy(tail, t + r - 16, 16);
    } else {
        memcpy(tail, st->last + r, 16 - r);
        memcpy(tail + 16 - r, t, r);
    }
    return finish(s[0], r8(tail), r8(tail + 8), n);
}
