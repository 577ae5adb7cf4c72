/*
 * Entries, headers and statistics between the library's structs and Python values:
 * tokens in as int32 buffers, entries out as (tokens bytes, [Cache], meta dict, created_at).
 */
#include "ext.h"

#include <errno.h>
#include <string.h>

int kvtpy_tokens(PyObject *o, Py_buffer *view, const int32_t **tok, size_t *n)
{
    if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    if (view->itemsize != 4 || (strcmp(f, "i") && strcmp(f, "l"))) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_TypeError, "tokens must be int32");
        return -1;
    }
    *tok = view->buf;
    *n = (size_t)(view->len / 4);
    return 0;
}

int kvtpy_prompt_args(PyObject *args, Py_buffer *view, const int32_t **tok, size_t *n,
                      const char **ns)
{
    PyObject *tokens;
    *ns = NULL;
    if (!PyArg_ParseTuple(args, "O|z", &tokens, ns))
        return -1;
    return kvtpy_tokens(tokens, view, tok, n);
}

static int meta_field(PyObject *d, const char *key, const char **out)
{
    *out = NULL;
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    if (!v || v == Py_None)
        return 0;
    if (!PyUnicode_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str", key);
        return -1;
    }
    *out = PyUnicode_AsUTF8(v); /* valid while the dict holds v */
    return *out ? 0 : -1;
}

int kvtpy_meta(PyObject *d, struct kvt_meta *m)
{
    memset(m, 0, sizeof(*m));
    if (d == Py_None)
        return 0;
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "meta must be a dict");
        return -1;
    }
    if (meta_field(d, "model_id", &m->model_id) < 0 ||
        meta_field(d, "config_fingerprint", &m->config_fingerprint) < 0 ||
        meta_field(d, "tokenizer_hash", &m->tokenizer_hash) < 0 || meta_field(d, "ns", &m->ns) < 0)
        return -1;
    return 0;
}

static PyObject *str_or_none(const char *s)
{
    if (!s)
        Py_RETURN_NONE;
    return PyUnicode_FromString(s);
}

static PyObject *meta_dict(const char *model, const char *fp, const char *tok, const char *ns)
{
    PyObject *d = PyDict_New();
    const char *k[] = {"model_id", "config_fingerprint", "tokenizer_hash", "ns"};
    const char *v[] = {model, fp, tok, ns};
    for (int i = 0; d && i < 4; i++) {
        PyObject *s = str_or_none(v[i]);
        if (!s || PyDict_SetItemString(d, k[i], s) < 0) {
            Py_XDECREF(s);
            Py_CLEAR(d);
            break;
        }
        Py_DECREF(s);
    }
    return d;
}

PyObject *kvtpy_entry_out(struct kvt_entry *e)
{
    PyObject *tokens = PyBytes_FromStringAndSize((const char *)e->tokens,
                                                 (Py_ssize_t)(e->n_tokens * sizeof(int32_t)));
    PyObject *caches = PyList_New((Py_ssize_t)e->n_caches);
    PyObject *meta =
        meta_dict(e->meta.model_id, e->meta.config_fingerprint, e->meta.tokenizer_hash, e->meta.ns);
    PyObject *r = NULL;
    for (size_t i = 0; caches && i < e->n_caches; i++) {
        PyObject *c = kvtpy_cache_wrap(e->caches[i]);
        e->caches[i] = NULL; /* the Python object owns it now (or freed it on failure) */
        if (!c)
            goto out;
        PyList_SET_ITEM(caches, (Py_ssize_t)i, c);
    }
    if (tokens && caches && meta)
        r = Py_BuildValue("(OOOL)", tokens, caches, meta, (long long)e->created_at);
out:
    Py_XDECREF(tokens);
    Py_XDECREF(caches);
    Py_XDECREF(meta);
    kvt_entry_free(e);
    return r;
}

static PyObject *slot_dict(const struct kvt_slot *s)
{
    PyObject *shape = PyTuple_New(s->rank);
    for (int i = 0; shape && i < s->rank; i++)
        PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(s->shape[i]));
    if (!shape)
        return NULL;
    return Py_BuildValue("{s:s,s:N,s:K,s:K,s:K}", "dtype", kvt_dtype_name(s->dtype), "shape", shape,
                         "off", (unsigned long long)s->off, "bytes", (unsigned long long)s->bytes,
                         "hash", (unsigned long long)s->hash);
}

static PyObject *cache_header_dict(const struct kvt_cache_header *c)
{
    PyObject *slots = PyList_New(c->n_slots);
    for (int i = 0; slots && i < c->n_slots; i++) {
        PyObject *s = slot_dict(&c->slots[i]);
        if (!s) {
            Py_CLEAR(slots);
            break;
        }
        PyList_SET_ITEM(slots, i, s);
    }
    if (!slots)
        return NULL;
    const struct kvt_cache_info *i = &c->info;
    return Py_BuildValue(
        "{s:s,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:O,s:N}", "kind", kvt_kind_name(i->kind), "offset",
        (long long)i->offset, "idx", (long long)i->idx, "max_size", (long long)i->max_size,
        "group_size", (long long)i->group_size, "bits", (long long)i->bits, "k_bits",
        (long long)i->k_bits, "v_bits", (long long)i->v_bits, "head_dim", (long long)i->head_dim,
        "trimmable", kvt_kind_is_trimmable(i->kind, i->offset, i->max_size) ? Py_True : Py_False,
        "tensors", slots);
}

PyObject *kvtpy_header_dict(const struct kvt_header *h)
{
    PyObject *caches = PyList_New((Py_ssize_t)h->n_caches);
    for (size_t i = 0; caches && i < h->n_caches; i++) {
        PyObject *c = cache_header_dict(&h->caches[i]);
        if (!c) {
            Py_CLEAR(caches);
            break;
        }
        PyList_SET_ITEM(caches, (Py_ssize_t)i, c);
    }
    PyObject *meta = meta_dict(h->model_id, h->config_fingerprint, h->tokenizer_hash, h->ns);
    if (!caches || !meta) {
        Py_XDECREF(caches);
        Py_XDECREF(meta);
        return NULL;
    }
    return Py_BuildValue(
        "{s:i,s:L,s:N,s:y#,s:N,s:I,s:I,s:K,s:K,s:O,s:O}", "format_version", h->format_version,
        "created_at", (long long)h->created_at, "meta", meta, "tokens", (const char *)h->tokens,
        (Py_ssize_t)(h->n_tokens * sizeof(int32_t)), "caches", caches, "header_len",
        (unsigned)h->header_len, "data_start", (unsigned)h->data_start, "header_hash",
        (unsigned long long)h->header_hash, "file_size", (unsigned long long)h->file_size,
        "trimmable", kvt_header_is_trimmable(h) ? Py_True : Py_False, "indexable",
        kvt_header_is_indexable(h) ? Py_True : Py_False);
}

PyObject *kvtpy_store_stats_dict(const struct kvt_store_stats *st)
{
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:K,s:K,s:K,s:K}", "entries",
        (unsigned long long)st->entries, "total_bytes", (unsigned long long)st->total_bytes,
        "max_bytes", (unsigned long long)st->max_bytes, "restores",
        (unsigned long long)st->restores, "spills", (unsigned long long)st->spills,
        "store_failures", (unsigned long long)st->store_failures, "evictions",
        (unsigned long long)st->evictions, "skipped_files", (unsigned long long)st->skipped_files,
        "skipped_bytes", (unsigned long long)st->skipped_bytes, "corrupt_files",
        (unsigned long long)st->corrupt_files, "restore_misses",
        (unsigned long long)st->restore_misses, "restore_ms_last", st->restore_ms_last,
        "longest_durable_prefix_tokens", (unsigned long long)st->longest_durable_prefix_tokens,
        "tmp_reaped", (unsigned long long)st->tmp_reaped, "shared_chunks",
        (unsigned long long)st->shared_chunks, "shared_bytes",
        (unsigned long long)st->shared_bytes);
}

int kvtpy_borrow_begin(PyObject *tokens, PyObject *caches, PyObject *meta, long long created_at,
                       struct kvtpy_borrowed *b)
{
    memset(b, 0, sizeof(*b));
    const int32_t *tok;
    size_t n;
    if (kvtpy_tokens(tokens, &b->tokview, &tok, &n) < 0)
        return -1;
    b->seq = PySequence_Fast(caches, "caches must be a sequence");
    if (!b->seq || kvtpy_meta(meta, &b->e.meta) < 0)
        goto fail;
    if (kvtpy_caches_begin(b->seq, &b->v, &b->n) < 0)
        goto fail;
    b->e.tokens = (int32_t *)tok;
    b->e.n_tokens = n;
    b->e.caches = b->v;
    b->e.n_caches = b->n;
    b->e.created_at = created_at;
    return 0;
fail:
    PyBuffer_Release(&b->tokview);
    Py_CLEAR(b->seq);
    return -1;
}

void kvtpy_borrow_end(struct kvtpy_borrowed *b)
{
    kvtpy_caches_done(b->seq, b->v, b->n);
    PyBuffer_Release(&b->tokview);
    Py_CLEAR(b->seq);
}

static int dup_meta(const char *s, const char **out)
{
    *out = NULL;
    if (!s)
        return 0;
    char *d = strdup(s); /* the entry frees it with free() */
    if (!d) {
        PyErr_NoMemory();
        return -1;
    }
    *out = d;
    return 0;
}

int kvtpy_entry_owned(PyObject *tokens, PyObject *caches, PyObject *meta, struct kvt_entry **out)
{
    struct kvtpy_borrowed b;
    *out = NULL;
    if (kvtpy_borrow_begin(tokens, caches, meta, -1, &b) < 0)
        return -1;
    kvt_cache **clones = calloc(b.n ? b.n : 1, sizeof(*clones));
    int rc = clones ? 0 : -ENOMEM;
    size_t made = 0;
    for (; rc == 0 && made < b.n; made++) {
        rc = kvt_cache_clone(b.v[made], &clones[made]); /* shares bytes, copy-on-write */
        if (rc < 0)
            break;
    }
    struct kvt_entry *e = NULL;
    if (rc == 0)
        rc = kvt_entry_new(b.e.tokens, b.e.n_tokens, clones, b.n, b.e.meta.ns, &e);
    if (rc < 0) {
        for (size_t i = 0; i < made && clones; i++)
            kvt_cache_free(clones[i]);
        free(clones);
        kvtpy_borrow_end(&b);
        kvtpy_raise(rc);
        return -1;
    }
    free(clones); /* the entry took the objects */
    if (dup_meta(b.e.meta.model_id, &e->meta.model_id) < 0 ||
        dup_meta(b.e.meta.config_fingerprint, &e->meta.config_fingerprint) < 0 ||
        dup_meta(b.e.meta.tokenizer_hash, &e->meta.tokenizer_hash) < 0) {
        kvt_entry_free(e);
        kvtpy_borrow_end(&b);
        return -1;
    }
    kvtpy_borrow_end(&b);
    *out = e;
    return 0;
}
