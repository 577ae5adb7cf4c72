/*
 * kvtier._ext.Store: one store directory. Every call is safe from any thread; the GIL is
 * released around each, and close refuses while another thread is inside a call.
 */
#include "ext.h"

#include <errno.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    kvt_store *s;
    int in_use;
} KvtStore;

static int enter(KvtStore *self)
{
    if (!self->s) {
        kvtpy_raise_msg(KVT_E_STATE, "store is closed");
        return -1;
    }
    self->in_use++;
    return 0;
}

static void leave(KvtStore *self)
{
    self->in_use--;
}

PyObject *kvtpy_store_list(kvt_store *s)
{
    struct kvt_store_record *v;
    size_t n;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_store_list(s, &v, &n);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return kvtpy_raise(rc);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *d = Py_BuildValue(
            "{s:K,s:s,s:s,s:n,s:K,s:L,s:O}", "id", (unsigned long long)v[i].id, "path", v[i].path,
            "ns", v[i].ns, "n_tokens", (Py_ssize_t)v[i].n_tokens, "bytes",
            (unsigned long long)v[i].bytes, "mtime_ms", (long long)v[i].mtime_ms, "trimmable",
            v[i].trimmable ? Py_True : Py_False);
        if (!d) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, d);
    }
    kvt_store_list_free(v);
    return list;
}

static PyObject *py_store_open(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *kwlist[] = {"dir",       "model_id", "config_fingerprint", "tokenizer_hash",
                             "max_bytes", "n_layers", "no_verify",          "quarantine",
                             "read_only", NULL};
    const char *dir;
    struct kvt_store_opts o;
    kvt_store_opts_init(&o);
    unsigned long long max_bytes = 0;
    Py_ssize_t n_layers = 0;
    int no_verify = 0, quarantine = 0, read_only = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ssss|Knppp", kwlist, &dir, &o.model_id,
                                     &o.config_fingerprint, &o.tokenizer_hash, &max_bytes,
                                     &n_layers, &no_verify, &quarantine, &read_only))
        return NULL;
    if (max_bytes) /* 0: the default cap */
        o.max_bytes = max_bytes;
    o.n_layers = n_layers > 0 ? (size_t)n_layers : 0;
    o.no_verify = no_verify, o.quarantine = quarantine, o.read_only = read_only;
    kvt_store *s;
    int rc;
    Py_BEGIN_ALLOW_THREADS /* recovery reads every header */
    rc = kvt_store_open(dir, &o, &s);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return kvtpy_raise(rc);
    KvtStore *self = PyObject_New(KvtStore, &KvtStore_Type);
    if (!self) {
        kvt_store_close(s);
        return NULL;
    }
    self->s = s;
    self->in_use = 0;
    return (PyObject *)self;
}

PyMethodDef kvtpy_store_functions[] = {
    {"store_open", (PyCFunction)(void (*)(void))py_store_open, METH_VARARGS | METH_KEYWORDS, NULL},
    {NULL, NULL, 0, NULL},
};

static void close_store(KvtStore *self)
{
    kvt_store *s = self->s;
    self->s = NULL;
    Py_BEGIN_ALLOW_THREADS
    kvt_store_close(s);
    Py_END_ALLOW_THREADS
}

static void store_dealloc(KvtStore *self)
{
    if (self->s)
        close_store(self);
    PyObject_Free(self);
}

static PyObject *store_close(KvtStore *self, PyObject *unused)
{
    (void)unused;
    if (self->in_use)
        return kvtpy_raise_msg(KVT_E_STATE, "store: close while another thread uses it");
    if (self->s)
        close_store(self);
    Py_RETURN_NONE;
}

static PyObject *store_find(KvtStore *self, PyObject *args)
{
    Py_buffer view;
    const int32_t *tok;
    size_t n;
    const char *ns;
    if (kvtpy_prompt_args(args, &view, &tok, &n, &ns) < 0)
        return NULL;
    if (enter(self) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    struct kvt_hit hit;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_store_find(self->s, tok, n, ns, &hit);
    Py_END_ALLOW_THREADS
    leave(self);
    PyBuffer_Release(&view);
    if (rc < 0)
        return kvtpy_raise(rc);
    return Py_BuildValue("(nnKOk)", (Py_ssize_t)hit.prefix_len, (Py_ssize_t)hit.n_tokens,
                         (unsigned long long)hit.id, hit.trimmable ? Py_True : Py_False,
                         (unsigned long)hit.store);
}

/* A hit from the tuple find() returned (prefix_len, n_tokens, id, trimmable, store). */
static int hit_arg(PyObject *t, struct kvt_hit *hit)
{
    Py_ssize_t prefix, ntok;
    unsigned long long id;
    int trimmable;
    unsigned int store;
    memset(hit, 0, sizeof(*hit));
    if (!PyArg_ParseTuple(t, "nnKpI", &prefix, &ntok, &id, &trimmable, &store))
        return -1;
    hit->prefix_len = (size_t)prefix, hit->n_tokens = (size_t)ntok, hit->id = id;
    hit->trimmable = trimmable, hit->store = store;
    return 0;
}

static PyObject *store_restore(KvtStore *self, PyObject *args)
{
    struct kvt_hit hit;
    PyObject *t;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &t) || hit_arg(t, &hit) < 0)
        return NULL;
    if (enter(self) < 0)
        return NULL;
    struct kvt_entry *e = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_store_restore(self->s, &hit, &e);
    Py_END_ALLOW_THREADS
    leave(self);
    if (rc < 0)
        return kvtpy_raise(rc);
    if (!e)
        Py_RETURN_NONE;
    return kvtpy_entry_out(e);
}

static PyObject *store_restore_into(KvtStore *self, PyObject *args)
{
    struct kvt_hit hit;
    PyObject *t, *place;
    if (!PyArg_ParseTuple(args, "O!O", &PyTuple_Type, &t, &place) || hit_arg(t, &hit) < 0)
        return NULL;
    if (enter(self) < 0)
        return NULL;
    PyObject *r = kvtpy_store_restore_into(self->s, &hit, place);
    leave(self);
    return r;
}

static PyObject *store_restore_to_device(KvtStore *self, PyObject *args)
{
    struct kvt_hit hit;
    PyObject *t, *dev, *place;
    if (!PyArg_ParseTuple(args, "O!OO", &PyTuple_Type, &t, &dev, &place) || hit_arg(t, &hit) < 0)
        return NULL;
    if (enter(self) < 0)
        return NULL;
    PyObject *r = kvtpy_store_restore_to_device(self->s, &hit, dev, place);
    leave(self);
    return r;
}

static PyObject *store_put(KvtStore *self, PyObject *args)
{
    PyObject *tokens, *caches, *meta = Py_None;
    long long created_at = 0;
    if (!PyArg_ParseTuple(args, "OO|OL", &tokens, &caches, &meta, &created_at))
        return NULL;
    struct kvtpy_borrowed b;
    if (enter(self) < 0)
        return NULL;
    if (kvtpy_borrow_begin(tokens, caches, meta, created_at, &b) < 0) {
        leave(self);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_store_put(self->s, &b.e, NULL, NULL);
    Py_END_ALLOW_THREADS
    kvtpy_borrow_end(&b);
    leave(self);
    if (rc < 0)
        return kvtpy_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *store_has_durable_prefix(KvtStore *self, PyObject *args)
{
    Py_buffer view;
    const int32_t *tok;
    size_t n;
    const char *ns;
    if (kvtpy_prompt_args(args, &view, &tok, &n, &ns) < 0)
        return NULL;
    if (enter(self) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    bool r;
    Py_BEGIN_ALLOW_THREADS
    r = kvt_store_has_durable_prefix(self->s, tok, n, ns);
    Py_END_ALLOW_THREADS
    leave(self);
    PyBuffer_Release(&view);
    return PyBool_FromLong(r);
}

static PyObject *store_refresh(KvtStore *self, PyObject *unused)
{
    (void)unused;
    if (enter(self) < 0)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_store_refresh(self->s);
    Py_END_ALLOW_THREADS
    leave(self);
    if (rc < 0)
        return kvtpy_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *store_stats(KvtStore *self, PyObject *unused)
{
    (void)unused;
    if (enter(self) < 0)
        return NULL;
    struct kvt_store_stats st;
    Py_BEGIN_ALLOW_THREADS
    kvt_store_get_stats(self->s, &st);
    Py_END_ALLOW_THREADS
    leave(self);
    return kvtpy_store_stats_dict(&st);
}

static PyObject *store_list(KvtStore *self, PyObject *unused)
{
    (void)unused;
    if (enter(self) < 0)
        return NULL;
    PyObject *r = kvtpy_store_list(self->s);
    leave(self);
    return r;
}

static PyObject *store_get_root(KvtStore *self, void *unused)
{
    (void)unused;
    if (!self->s)
        return kvtpy_raise_msg(KVT_E_STATE, "store is closed");
    return PyUnicode_DecodeFSDefault(kvt_store_root(self->s));
}

static PyObject *store_get_closed(KvtStore *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(self->s == NULL);
}

static PyMethodDef store_methods[] = {
    {"close", (PyCFunction)store_close, METH_NOARGS, NULL},
    {"find", (PyCFunction)store_find, METH_VARARGS, NULL},
    {"restore", (PyCFunction)store_restore, METH_VARARGS, NULL},
    {"restore_into", (PyCFunction)store_restore_into, METH_VARARGS, NULL},
    {"restore_to_device", (PyCFunction)store_restore_to_device, METH_VARARGS, NULL},
    {"put", (PyCFunction)store_put, METH_VARARGS, NULL},
    {"has_durable_prefix", (PyCFunction)store_has_durable_prefix, METH_VARARGS, NULL},
    {"refresh", (PyCFunction)store_refresh, METH_NOARGS, NULL},
    {"stats", (PyCFunction)store_stats, METH_NOARGS, NULL},
    {"list", (PyCFunction)store_list, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef store_getset[] = {
    {"root", (getter)store_get_root, NULL, NULL, NULL},
    {"closed", (getter)store_get_closed, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* PyVarObject_HEAD_INIT ends in a comma, which clang-format cannot know */
/* clang-format off */
PyTypeObject KvtStore_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvtier._ext.Store",
    .tp_basicsize = sizeof(KvtStore),
    .tp_dealloc = (destructor)store_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One store directory (use kvtier.Store).",
    .tp_methods = store_methods,
    .tp_getset = store_getset,
};
/* clang-format on */
