/*
 * Loading an entry kept as shared chunks plus its tail (docs/SHARING.md §4), in two passes.
 * First every header: the tail's (checked as any file's), then each chunk's, checked against
 * the entry before any tensor byte is read (its tokens, then one cache of the same kind,
 * quantization and shape per cut layer, 256 rows). From them comes the header of the whole
 * entry, which sizes the destinations. Then every file's slots are read into their rows of
 * those destinations as one load (kvt_tensor_read_files(): in parallel out of the page cache,
 * else file by file with the next file read ahead), hashes checked in the same pass.
 */
#include "store/share.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "format/format.h"
#include "io/io.h"
#include "io/stream.h"
#include "tensor/tensor_parts.h"

/* Files read as one load: bounds the descriptors open at once for a long entry. */
#define READ_BATCH 64

void kvt_share_close(struct kvt_share_open *so)
{
    for (size_t f = 0; f < so->nf; f++) {
        if (so->fd && so->fd[f] >= 0)
            kvt_io()->close(so->fd[f]);
        if (so->h)
            kvt_header_free(so->h[f]);
        if (so->path)
            free(so->path[f]);
    }
    free(so->fd);
    free(so->ino);
    free(so->h);
    free(so->path);
    kvt_header_free(so->whole);
    *so = (struct kvt_share_open){0};
}

/* Bytes of one row of slot @p s (a [B, H, T, D] tensor). */
static uint64_t row_bytes(const struct kvt_slot *s)
{
    return kvt_dtype_size(s->dtype) * (uint64_t)s->shape[3];
}

/* Check the tail's cut layers: [B, H, own, D] slots of own = n - 256m rows, m >= 1. */
static int tail_fits(const struct kvt_header *t, const char *path, uint64_t own)
{
    if (!kvt_share_chunks(t->n_tokens))
        return kvt_fail(KVT_E_CORRUPT, "%s: a tail of %zu tokens has no chunks", path, t->n_tokens);
    for (size_t i = 0; i < t->n_caches; i++) {
        const struct kvt_cache_header *c = &t->caches[i];
        bool ok = !kvt_share_splits(c->info.kind) || (uint64_t)c->info.offset == own;
        for (int j = 0; ok && kvt_share_splits(c->info.kind) && j < c->n_slots; j++)
            ok = c->slots[j].rank == 4 && (uint64_t)c->slots[j].shape[2] == own;
        if (!ok)
            return kvt_fail(KVT_E_CORRUPT, "%s: caches[%zu] does not hold the tail's %llu rows",
                            path, i, (unsigned long long)own);
    }
    return 0;
}

/* The header of the whole entry: the tail's, every cut layer grown to all n rows (slots
 * contiguous [B, H, n, D], offsets in order, hashes 0: no file holds them so). */
static int whole_header(const struct kvt_header *t, const char *path, struct kvt_header **out)
{
    struct kvt_header *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    *w = *t;
    const char *src[4] = {t->model_id, t->config_fingerprint, t->tokenizer_hash, t->ns};
    char **dst[4] = {&w->model_id, &w->config_fingerprint, &w->tokenizer_hash, &w->ns};
    bool oom = false;
    for (int k = 0; k < 4; k++)
        oom |= src[k] && !(*dst[k] = strdup(src[k]));
    w->tokens = malloc(t->n_tokens * sizeof(*w->tokens));
    w->caches = malloc((t->n_caches ? t->n_caches : 1) * sizeof(*w->caches));
    if (oom || !w->tokens || !w->caches) {
        kvt_header_free(w);
        return -ENOMEM;
    }
    memcpy(w->tokens, t->tokens, t->n_tokens * sizeof(*w->tokens));
    memcpy(w->caches, t->caches, t->n_caches * sizeof(*w->caches));
    uint64_t off = 0, n = t->n_tokens;
    for (size_t i = 0; i < w->n_caches; i++) {
        struct kvt_cache_header *c = &w->caches[i];
        bool cut = kvt_share_splits(c->info.kind);
        if (cut)
            c->info.offset = (int64_t)n;
        for (int j = 0; j < c->n_slots; j++) {
            struct kvt_slot *s = &c->slots[j];
            uint64_t bytes = s->bytes;
            if (cut && (__builtin_mul_overflow((uint64_t)(s->shape[0] * s->shape[1]), n, &bytes) ||
                        __builtin_mul_overflow(bytes, row_bytes(s), &bytes))) {
                kvt_header_free(w);
                return kvt_fail(KVT_E_CORRUPT, "%s: an entry of %llu tokens is too large", path,
                                (unsigned long long)n);
            }
            if (cut) {
                s->shape[2] = (int64_t)n;
                s->hash = 0;
            }
            s->bytes = bytes;
            s->off = off;
            off += bytes;
        }
    }
    *out = w;
    return 0;
}

/* Whether slot @p s of a chunk fits the whole entry's slot @p w: 256 of its rows. */
static bool slot_fits(const struct kvt_slot *s, const struct kvt_slot *w)
{
    return s->dtype == w->dtype && s->rank == 4 && s->shape[0] == w->shape[0] &&
           s->shape[1] == w->shape[1] && s->shape[2] == KVT_SHARE_CHUNK &&
           s->shape[3] == w->shape[3];
}

/* Whether the chunk of header @p h fits rows [256k, 256(k + 1)) of the entry @p w: its tokens,
 * then one cache of the same kind, 256 rows and tensor shapes per cut layer, in order. */
static int chunk_fits(const struct kvt_header *w, const struct kvt_header *h, size_t k,
                      const char *path)
{
    if (h->n_tokens != KVT_SHARE_CHUNK ||
        memcmp(h->tokens, w->tokens + k * KVT_SHARE_CHUNK, KVT_SHARE_CHUNK * sizeof(int32_t)))
        return kvt_fail(KVT_E_CORRUPT, "%s: the chunk's tokens are not the entry's", path);
    size_t j = 0;
    for (size_t i = 0; i < w->n_caches; i++) {
        const struct kvt_cache_header *want = &w->caches[i];
        if (!kvt_share_splits(want->info.kind))
            continue;
        const struct kvt_cache_header *ch = j < h->n_caches ? &h->caches[j] : NULL;
        bool ok = ch && ch->info.kind == want->info.kind && ch->info.offset == KVT_SHARE_CHUNK &&
                  ch->info.bits == want->info.bits &&
                  ch->info.group_size == want->info.group_size && ch->n_slots == want->n_slots;
        for (int sj = 0; ok && sj < ch->n_slots; sj++)
            ok = slot_fits(&ch->slots[sj], &want->slots[sj]);
        if (!ok)
            return kvt_fail(KVT_E_CORRUPT, "%s: the chunk's layer %zu does not fit the entry", path,
                            j);
        j++;
    }
    if (j != h->n_caches)
        return kvt_fail(KVT_E_CORRUPT, "%s: the chunk has %zu layers, the entry cuts %zu", path,
                        h->n_caches, j);
    return 0;
}

struct open_job {
    struct kvt_share_open *so;
    const char *dir;
    struct kvt_expect cx; /* a chunk's: no layer count, it holds only the cut layers */
    char **bad;
};

/* Open chunk @p k (file k + 1) and check its header against the entry; closed again (the
 * read reopens it: a long entry would hold too many descriptors). */
static int open_chunk(void *ud, size_t k, const char *id)
{
    struct open_job *j = ud;
    struct kvt_share_open *so = j->so;
    size_t f = k + 1;
    if (!(so->path[f] = kvt_share_chunk_path(j->dir, id)))
        return -ENOMEM;
    int fd;
    int rc = kvt_file_open_header(so->path[f], &j->cx, &fd, &so->h[f]);
    if (rc == 0) {
        struct stat st;
        rc = kvt_io()->fstat(fd, &st);
        so->ino[f] = (uint64_t)st.st_ino;
        kvt_io()->close(fd);
    }
    if (rc == 0) {
        rc = chunk_fits(so->whole, so->h[f], k, so->path[f]);
    }
    if (rc < 0 && j->bad)
        *j->bad = strdup(so->path[f]);
    return rc;
}

static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
}

/* The tail of @p so (file 0), checked, and the whole entry's header. */
static int open_tail(struct kvt_share_open *so, const char *tail_path, const struct kvt_expect *x)
{
    struct kvt_header *t;
    int fd;
    int rc = kvt_file_open_header(tail_path, x, &fd, &t);
    if (rc)
        return rc;
    size_t m = kvt_share_chunks(t->n_tokens);
    int *fds = malloc((m + 1) * sizeof(*fds));
    uint64_t *ino = calloc(m + 1, sizeof(*ino));
    struct kvt_header **h = calloc(m + 1, sizeof(*h));
    char **path = calloc(m + 1, sizeof(*path));
    if (!fds || !ino || !h || !path || !(path[0] = strdup(tail_path))) {
        free(fds);
        free(ino);
        free(h);
        free(path);
        kvt_header_free(t);
        kvt_io()->close(fd);
        return -ENOMEM;
    }
    for (size_t f = 1; f <= m; f++)
        fds[f] = -1;
    fds[0] = fd;
    h[0] = t;
    *so = (struct kvt_share_open){.nf = m + 1, .fd = fds, .ino = ino, .h = h, .path = path};
    so->own = t->n_tokens - m * KVT_SHARE_CHUNK;
    rc = tail_fits(t, tail_path, so->own);
    return rc ? rc : whole_header(t, tail_path, &so->whole);
}

int kvt_share_open(const char *tail_path, const struct kvt_expect *x, struct kvt_share_open *so,
                   char **bad_chunk)
{
    *so = (struct kvt_share_open){0};
    if (bad_chunk)
        *bad_chunk = NULL;
    char *dir = dir_of(tail_path);
    int rc = dir ? open_tail(so, tail_path, x) : -ENOMEM;
    struct open_job j = {so, dir, x ? *x : (struct kvt_expect){0}, bad_chunk};
    j.cx.n_layers = 0;
    if (rc == 0)
        rc = kvt_share_each_chunk(so->whole->tokens, so->whole->n_tokens, open_chunk, &j);
    free(dir);
    if (rc == -ENOMEM)
        rc = kvt_fail(rc, "%s: out of memory", tail_path);
    if (rc)
        kvt_share_close(so);
    return rc;
}

/* Where the slots of file @p f go, from the whole entry's destinations @p d: a chunk's cut
 * slots into rows [256(f - 1), 256f), the tail's into its last own rows, its other slots
 * whole. Rows of a cut slot lie between other files' rows, so they are never zeroed. */
static void file_dsts(const struct kvt_share_open *so, size_t f, const struct kvt_slot_dst *d,
                      struct kvt_slot_dst *out)
{
    const struct kvt_header *w = so->whole;
    uint64_t first = f ? (f - 1) * KVT_SHARE_CHUNK : w->n_tokens - so->own;
    for (size_t i = 0, o = 0, k = 0; i < w->n_caches; i++) {
        bool cut = kvt_share_splits(w->caches[i].info.kind);
        for (int j = 0; j < w->caches[i].n_slots; j++, o++) {
            if (!cut && f == 0)
                out[k++] = d[o];
            if (!cut)
                continue;
            uint64_t at = first * row_bytes(&w->caches[i].slots[j]);
            uint64_t tail = d[o].small_tail;
            out[k++] = d[o].dst ? (struct kvt_slot_dst){d[o].dst + at, d[o].blocks, d[o].stride,
                                                        tail == UINT64_MAX ? UINT64_MAX
                                                        : tail > at        ? tail - at
                                                                           : 0,
                                                        true}
                                : (struct kvt_slot_dst){NULL, 1, 0, UINT64_MAX, false};
        }
    }
}

/* Reopen chunk file @p f for its read: the same file whose header was checked. Another file
 * under its name (its entries evicted and the chunk removed by another process, then the
 * prefix put again) is no fault of the chunk: -ESTALE, a miss that removes nothing. The same
 * file at another size is corrupt. */
static int reopen(struct kvt_share_open *so, size_t f)
{
    if (so->fd[f] >= 0)
        return 0;
    int fd = kvt_io()->openat(AT_FDCWD, so->path[f], O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return kvt_fail(fd, "%s: open: %s", so->path[f], kvt_strerror(fd));
    struct stat st;
    int rc = kvt_io()->fstat(fd, &st);
    if (rc == 0 && (uint64_t)st.st_ino != so->ino[f])
        rc = kvt_fail(-ESTALE, "%s: replaced while being restored", so->path[f]);
    else if (rc == 0 && (uint64_t)st.st_size != so->h[f]->file_size)
        rc = kvt_fail(KVT_E_CORRUPT, "%s: changed size while being restored", so->path[f]);
    if (rc) {
        kvt_io()->close(fd);
        return rc;
    }
    so->fd[f] = fd;
    return 0;
}

/* Files [a, b) of @p so as one load into the whole entry's destinations @p d. */
static int read_batch(struct kvt_share_open *so, size_t a, size_t b, const struct kvt_slot_dst *d,
                      const struct kvt_expect *x, size_t *failed)
{
    struct kvt_tensor_reader r[READ_BATCH] = {0};
    size_t per = 0, nd = 0;
    for (size_t i = 0; i < so->whole->n_caches; i++)
        per += (size_t)so->whole->caches[i].n_slots;
    struct kvt_slot_dst *fd_dst = calloc((b - a) * per + 1, sizeof(*fd_dst));
    int rc = fd_dst ? 0 : kvt_fail(-ENOMEM, "%s: out of memory", so->path[0]);
    for (size_t f = a; f < b && rc == 0; f++) {
        *failed = f;
        rc = reopen(so, f);
        file_dsts(so, f, d, fd_dst + nd);
        bool keep = f > 0 || kvt_read_keeps_cache(so->fd[0], so->h[0]->data_start,
                                                  so->h[0]->file_size - so->h[0]->data_start,
                                                  x && x->keep_cache);
        /* other entries need a chunk: its pages stay cached */
        r[f - a] = (struct kvt_tensor_reader){.fd = so->fd[f],
                                              .name = so->path[f],
                                              .h = so->h[f],
                                              .verify = !(x && x->no_verify),
                                              .keep_cache = keep,
                                              .dst = fd_dst + nd};
        nd += per;
    }
    size_t at = 0;
    if (rc == 0 && (rc = kvt_tensor_read_files(r, b - a, &at)) != 0)
        *failed = a + at;
    for (size_t f = a; f < b; f++)
        if (f > 0 && so->fd[f] >= 0) {
            kvt_io()->close(so->fd[f]);
            so->fd[f] = -1;
        }
    free(fd_dst);
    return rc;
}

int kvt_share_read(struct kvt_share_open *so, const struct kvt_slot_dst *d,
                   const struct kvt_expect *x, char **bad_chunk)
{
    int rc = 0;
    size_t failed = 0;
    for (size_t a = 0; a < so->nf && rc == 0; a += READ_BATCH)
        rc = read_batch(so, a, a + READ_BATCH < so->nf ? a + READ_BATCH : so->nf, d, x, &failed);
    if (rc < 0 && failed > 0 && bad_chunk)
        *bad_chunk = strdup(so->path[failed]);
    return rc;
}

/* Zero rows [n, cap) of the cut slots of @p b (where the memory was not fresh zeros): the
 * files fill every row below n, the slack must read zero. */
static void zero_slack(const struct kvt_header *w, const struct kvt_load_bufs *b)
{
    for (size_t i = 0, o = 0; i < w->n_caches; i++)
        for (int j = 0; j < w->caches[i].n_slots; j++, o++) {
            const struct kvt_slot_dst *d = &b->d[o];
            uint64_t used = w->caches[i].slots[j].bytes / (d->blocks ? d->blocks : 1);
            if (!kvt_share_splits(w->caches[i].info.kind) || !d->dst || d->zeroed)
                continue;
            for (uint64_t k = 0; k < d->blocks; k++)
                memset(d->dst + k * d->stride + used, 0, (size_t)(d->stride - used));
        }
}

int kvt_share_load(const char *tail_path, const struct kvt_expect *x, struct kvt_entry **out,
                   char **bad_chunk)
{
    *out = NULL;
    struct kvt_share_open so;
    int rc = kvt_share_open(tail_path, x, &so, bad_chunk);
    if (rc)
        return rc;
    struct kvt_load_bufs b;
    rc = kvt_load_bufs_new(so.whole, tail_path, &b);
    if (rc == 0) {
        zero_slack(so.whole, &b);
        rc = kvt_share_read(&so, b.d, x, bad_chunk);
        if (rc == 0)
            rc = kvt_load_bufs_entry(so.whole, tail_path, &b, out);
        kvt_load_bufs_free(&b);
    }
    kvt_share_close(&so);
    return rc;
}

void kvt_share_placed_dsts(const struct kvt_header *w, void *const *dst, struct kvt_slot_dst *d)
{
    for (size_t i = 0, o = 0; i < w->n_caches; i++)
        for (int j = 0; j < w->caches[i].n_slots; j++, o++) {
            const struct kvt_slot *s = &w->caches[i].slots[j];
            uint64_t blocks = kvt_share_splits(w->caches[i].info.kind)
                                  ? (uint64_t)(s->shape[0] * s->shape[1])
                                  : 1;
            d[o] = dst[o] && s->bytes && blocks
                       ? (struct kvt_slot_dst){dst[o], blocks, s->bytes / blocks, UINT64_MAX, false}
                       : (struct kvt_slot_dst){NULL, 1, 0, UINT64_MAX, false};
        }
}

int kvt_share_load_into(const char *tail_path, const struct kvt_expect *x,
                        const struct kvt_placement *p, struct kvt_header **out_header,
                        char **bad_chunk)
{
    *out_header = NULL;
    struct kvt_share_open so;
    int rc = kvt_share_open(tail_path, x, &so, bad_chunk);
    if (rc)
        return rc;
    size_t n = 0;
    for (size_t i = 0; i < so.whole->n_caches; i++)
        n += (size_t)so.whole->caches[i].n_slots;
    void *dst = NULL;
    struct kvt_slot_dst *d = calloc(n + 1, sizeof(*d));
    rc = d ? kvt_placement_ask(p, so.whole, tail_path, &dst)
           : kvt_fail(-ENOMEM, "%s: out of memory", tail_path);
    if (rc == 0) {
        kvt_share_placed_dsts(so.whole, (void *const *)dst, d);
        rc = kvt_share_read(&so, d, x, bad_chunk);
    }
    if (rc == 0) {
        *out_header = so.whole;
        so.whole = NULL;
    }
    free(dst);
    free(d);
    kvt_share_close(&so);
    return rc;
}
