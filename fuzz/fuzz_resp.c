/*
 * Fuzz target: the remote tier's own RESP reply reader (src/remote/resp_io.c), which reads
 * what a Redis server sends, untrusted, straight into entry buffers. An input is a text line
 * that says how to read, then the bytes the "server" sends:
 *
 *   OPS WANT PIECE READ_MAX\n<reply bytes>
 *
 * OPS is a list of calls, repeated until the reader fails or the bytes run out: s (a status
 * or integer expected), b (a bulk of WANT bytes into a buffer), f (a bulk of WANT bytes fed to
 * a sink that takes PIECE bytes at a time, 0: all), d (a bulk of WANT bytes dropped), x (as f,
 * but the sink refuses once PIECE bytes have landed). READ_MAX (0: no limit) caps what each
 * read() of the connection returns, as a socket delivers a reply in pieces: the target's
 * binary is linked with -Wl,--wrap=read so the cap applies to the reader's own descriptor.
 *
 * Properties checked after every call: the result is one the call documents; the read buffer
 * stays within its bounds; a reply taken as good is exactly the bytes sent for it (a status
 * line; an error line whose text, truncated, is the reply's; "$-1" for a nil; "$WANT", the
 * WANT bytes, CRLF for a bulk, whose bytes are the ones delivered, each sink piece no longer
 * than offered and the whole bulk landed); a protocol error says "redis: ...".
 */
#include "fuzz.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "remote/remote_parts.h"

#define WANT_MAX ((size_t)1 << 20)   /* the largest bulk read into memory */
#define DROP_MAX ((uint64_t)1 << 48) /* the largest bulk read and dropped */
#define CALLS_MAX 4096

ssize_t __real_read(int fd, void *buf, size_t n);
ssize_t __wrap_read(int fd, void *buf, size_t n);

static int conn_fd = -1; /* the descriptor the reader reads the reply bytes from */
static size_t read_max;  /* 0: whole reads */

ssize_t __wrap_read(int fd, void *buf, size_t n)
{
    if (fd == conn_fd && read_max && n > read_max)
        n = read_max;
    return __real_read(fd, buf, n);
}

struct sink {
    uint8_t *buf;
    size_t want, at, piece, offered;
    bool refuse;
};

static int sink_next(void *ud, uint8_t **at, size_t *len)
{
    struct sink *s = ud;
    if (s->refuse && s->at >= s->piece)
        return -ECANCELED;
    if (s->at >= s->want)
        fuzz_fail("the reader asked the sink for bytes past the bulk's end");
    size_t left = s->want - s->at;
    *at = s->buf + s->at;
    *len = s->offered = s->piece && s->piece < left ? s->piece : left;
    return 0;
}

static int sink_wrote(void *ud, size_t n)
{
    struct sink *s = ud;
    if (n == 0 || n > s->offered)
        fuzz_fail("the reader wrote a piece the sink did not offer");
    s->at += n;
    s->offered = 0;
    return 0;
}

static void sink_restart(void *ud)
{
    ((struct sink *)ud)->at = 0;
}

struct params {
    char ops[9];
    size_t n_ops, want, piece;
    bool in_memory; /* some call reads the bulk into a buffer */
};

/* The header line; its length (newline included), or 0 when it is not one. */
static size_t parse_header(const uint8_t *data, size_t size, struct params *p)
{
    const uint8_t *nl = memchr(data, '\n', size < 64 ? size : 64);
    if (!nl)
        return 0;
    char line[64];
    size_t n = (size_t)(nl - data);
    memcpy(line, data, n);
    line[n] = '\0';
    unsigned long long want, piece, rmax;
    if (sscanf(line, "%8[sbfdx] %llu %llu %llu", p->ops, &want, &piece, &rmax) != 4)
        return 0;
    p->n_ops = strlen(p->ops);
    p->in_memory = strpbrk(p->ops, "bfx") != NULL;
    if (want > (p->in_memory ? WANT_MAX : DROP_MAX))
        return 0;
    p->want = (size_t)want;
    p->piece = (size_t)piece;
    read_max = (size_t)rmax;
    return n + 1;
}

/* How many reply bytes the reader has taken: read from the descriptor, less what it holds. */
static size_t consumed(const struct kvt_rio *r)
{
    off_t off = lseek(r->fd, 0, SEEK_CUR);
    if (off < 0)
        fuzz_fail("lseek on the reply file failed");
    return (size_t)off - (r->len - r->pos);
}

/* Whether @p s[0, n) holds no line feed and ends with CRLF. */
static bool one_line(const uint8_t *s, size_t n)
{
    return n >= 2 && s[n - 2] == '\r' && s[n - 1] == '\n' && !memchr(s, '\n', n - 1);
}

/* The reply @p s[0, n) taken as a bulk of @p want bytes, which @p got holds. */
static void check_bulk(const uint8_t *s, size_t n, size_t want, const uint8_t *got)
{
    char head[32];
    int hl = snprintf(head, sizeof(head), "$%zu\r\n", want);
    if (n != (size_t)hl + want + 2 || memcmp(s, head, (size_t)hl) != 0)
        fuzz_fail("a bulk was accepted with a length line other than its own");
    if (s[n - 2] != '\r' || s[n - 1] != '\n')
        fuzz_fail("a bulk was accepted without its CRLF");
    if (got && memcmp(got, s + hl, want) != 0)
        fuzz_fail("a bulk's bytes differ from the bytes sent");
}

/* The reply @p s[0, n) that call @p op answered with @p rc (>= 0). */
static void check_reply(char op, int rc, const uint8_t *s, size_t n, const struct kvt_rio *r,
                        const uint8_t *got, size_t want)
{
    if (rc == KVT_R_ERR) {
        /* the text, truncated to the reader's line buffer */
        size_t el = strlen(r->err);
        if (!one_line(s, n) || s[0] != '-' || el != (n - 3 < 254 ? n - 3 : 254) ||
            memcmp(r->err, s + 1, el) != 0)
            fuzz_fail("an error reply's text is not the error line's");
    } else if (rc == KVT_R_NIL) {
        if (n != 5 || memcmp(s, "$-1\r\n", 5) != 0)
            fuzz_fail("a reply other than $-1 was taken for a nil");
    } else if (op == 's') {
        if (!one_line(s, n) || (s[0] != '+' && s[0] != ':'))
            fuzz_fail("a reply other than a status or an integer was taken for one");
    } else {
        check_bulk(s, n, want, got);
    }
}

/* One call of @p op; its result code. */
static int call(char op, struct kvt_rio *r, const struct params *p, uint8_t *dst, struct sink *s)
{
    *s = (struct sink){dst, p->want, 0, p->piece, 0, op == 'x'};
    const struct kvt_rsink rs = {sink_next, sink_wrote, sink_restart, s};
    switch (op) {
    case 's': return kvt_rio_reply(r, NULL, 0);
    case 'b': return kvt_rio_reply(r, dst, p->want);
    case 'd': return kvt_rio_reply_sink(r, p->want, NULL);
    default: return kvt_rio_reply_sink(r, p->want, &rs);
    }
}

static void run(const uint8_t *in, size_t n, const struct params *p, struct kvt_rio *r)
{
    uint8_t *dst = malloc(p->in_memory && p->want ? p->want : 1);
    if (!dst)
        return;
    size_t done = 0;
    for (size_t i = 0; i < CALLS_MAX; i++) {
        char op = p->ops[i % p->n_ops];
        struct sink s;
        kvt_clear_error();
        int rc = call(op, r, p, dst, &s);
        if (r->pos > r->len || r->len > sizeof(r->buf))
            fuzz_fail("the read buffer's bounds broke");
        if (rc == KVT_E_CORRUPT && strncmp(kvt_last_error(), "redis: ", 7) != 0)
            fuzz_fail("a protocol error without its message");
        if (rc == KVT_R_SINK && (op != 'x' || r->sink_rc != -ECANCELED))
            fuzz_fail("a sink refusal where the sink refused nothing");
        if (rc < 0 || rc == KVT_R_SINK)
            break;
        if (rc != KVT_R_OK && rc != KVT_R_NIL && rc != KVT_R_ERR)
            fuzz_fail("a result the reader does not document");
        if ((op == 'f' || op == 'x') && rc == KVT_R_OK && s.at != p->want)
            fuzz_fail("a bulk was accepted before all of it reached the sink");
        size_t end = consumed(r);
        if (end <= done || end > n)
            fuzz_fail("the reader's position went backwards or past the bytes sent");
        check_reply(op, rc, in + done, end - done, r, op == 'd' ? NULL : dst, p->want);
        done = end;
    }
    free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct params p;
    size_t hl = parse_header(data, size, &p);
    if (!hl)
        return 0;
    const char *path = fuzz_memfile(data + hl, size - hl);
    if (!path)
        fuzz_fail("cannot set up the reply file");
    struct kvt_rio *r = calloc(1, sizeof(*r));
    if (!r)
        return 0;
    r->fd = conn_fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0)
        fuzz_fail("cannot open the reply file");
    run(data + hl, size - hl, &p, r);
    close(r->fd);
    conn_fd = -1;
    free(r);
    return 0;
}
