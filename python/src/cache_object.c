/*
 * kvtier._ext.Cache: one kvt_cache (one donor layer). Built empty with its kind's parameters
 * or from tensors (wrapped, not copied); append copies, window and state return views.
 */
#include "ext.h"

#include <errno.h>
#include <stdlib.h>

PyObject *kvtpy_cache_wrap(kvt_cache *c)
{
    KvtCache *self = PyObject_New(KvtCache, &KvtCache_Type);
    if (!self) {
        kvt_cache_free(c);
        return NULL;
    }
    self->c = c;
    self->busy = 0;
    return (PyObject *)self;
}

static void cache_dealloc(KvtCache *self)
{
    kvt_cache_free(self->c); /* release callbacks take the GIL we hold: reentrant */
    PyObject_Free(self);
}

static int begin(KvtCache *self)
{
    if (self->busy) {
        kvtpy_raise_msg(KVT_E_STATE, "cache: in use by another thread");
        return -1;
    }
    self->busy = 1;
    return 0;
}

int kvtpy_caches_begin(PyObject *seq, kvt_cache ***out, size_t *n)
{
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    kvt_cache **v = calloc(len ? (size_t)len : 1, sizeof(*v));
    if (!v) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyObject_TypeCheck(o, &KvtCache_Type)) {
            PyErr_Format(PyExc_TypeError, "caches[%zd]: expected a kvtier cache, got %.80s", i,
                         Py_TYPE(o)->tp_name);
            kvtpy_caches_done(seq, v, (size_t)i);
            return -1;
        }
        if (begin((KvtCache *)o) < 0) {
            kvtpy_caches_done(seq, v, (size_t)i);
            return -1;
        }
        v[i] = ((KvtCache *)o)->c;
    }
    *out = v;
    *n = (size_t)len;
    return 0;
}

void kvtpy_caches_done(PyObject *seq, kvt_cache **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ((KvtCache *)PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i))->busy = 0;
    free(v);
}

/* Import a sequence of tensors (@p dtypes: None or a sequence of codes, -1 = as given). */
static int import_all(PyObject *tensors, PyObject *dtypes, struct kvt_tensor *t, int *nt)
{
    PyObject *seq = PySequence_Fast(tensors, "tensors must be a sequence");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > KVT_MAX_CACHE_TENSORS) {
        Py_DECREF(seq);
        kvtpy_raise_msg(-EINVAL, "cache: more than 6 tensors");
        return -1;
    }
    int i = 0;
    for (; i < n; i++) {
        int as = -1;
        if (dtypes && dtypes != Py_None) {
            PyObject *d = PySequence_GetItem(dtypes, i);
            as = d ? (int)PyLong_AsLong(d) : -1;
            Py_XDECREF(d);
            if (PyErr_Occurred())
                goto fail;
        }
        char what[32];
        snprintf(what, sizeof(what), "tensor %d", i);
        if (kvtpy_tensor_import(PySequence_Fast_GET_ITEM(seq, i), as, what, &t[i]) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    *nt = (int)n;
    return 0;
fail:
    while (i-- > 0)
        kvt_tensor_release(&t[i]);
    Py_DECREF(seq);
    return -1;
}

static void release_all(struct kvt_tensor *t, int n)
{
    for (int i = 0; i < n; i++)
        kvt_tensor_release(&t[i]);
}

static PyObject *py_cache_new(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"kind", "max_size", "group_size", "bits", "k_bits", "v_bits", NULL};
    struct kvt_cache_info p = {0};
    long long max_size = 0, group = 0, bits = 0, kb = 0, vb = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|LLLLL", kwlist, &p.kind, &max_size, &group, &bits,
                                     &kb, &vb))
        return NULL;
    p.max_size = max_size, p.group_size = group, p.bits = bits, p.k_bits = kb, p.v_bits = vb;
    kvt_cache *c;
    int rc = kvt_cache_new(&p, &c);
    if (rc < 0)
        return kvtpy_raise(rc);
    return kvtpy_cache_wrap(c);
}

static PyObject *py_cache_from_state(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"kind", "tensors", "offset", "idx",      "max_size", "group_size",
                             "bits", "k_bits",  "v_bits", "head_dim", "dtypes",   NULL};
    struct kvt_cache_info p = {0};
    long long off = 0, idx = 0, max_size = 0, group = 0, bits = 0, kb = 0, vb = 0, hd = 0;
    PyObject *tensors, *dtypes = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iOL|LLLLLLLO", kwlist, &p.kind, &tensors, &off,
                                     &idx, &max_size, &group, &bits, &kb, &vb, &hd, &dtypes))
        return NULL;
    p.offset = off, p.idx = idx, p.max_size = max_size, p.group_size = group, p.bits = bits;
    p.k_bits = kb, p.v_bits = vb, p.head_dim = hd;
    struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
    int nt;
    if (import_all(tensors, dtypes, t, &nt) < 0)
        return NULL;
    kvt_cache *c;
    int rc = kvt_cache_from_state(&p, t, nt, &c);
    release_all(t, nt);
    if (rc < 0)
        return kvtpy_raise(rc);
    return kvtpy_cache_wrap(c);
}

PyMethodDef kvtpy_cache_functions[] = {
    {"cache_new", (PyCFunction)(void (*)(void))py_cache_new, METH_VARARGS | METH_KEYWORDS, NULL},
    {"cache_from_state", (PyCFunction)(void (*)(void))py_cache_from_state,
     METH_VARARGS | METH_KEYWORDS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyObject *views(const struct kvt_tensor *t, int n)
{
    PyObject *tup = PyTuple_New(n);
    for (int i = 0; tup && i < n; i++) {
        PyObject *o = kvtpy_tensor_new(&t[i]);
        if (!o) {
            Py_CLEAR(tup);
            break;
        }
        PyTuple_SET_ITEM(tup, i, o);
    }
    return tup;
}

static PyObject *cache_append(KvtCache *self, PyObject *args)
{
    PyObject *tensors, *dtypes = Py_None;
    if (!PyArg_ParseTuple(args, "O|O", &tensors, &dtypes))
        return NULL;
    struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
    int nt, rc;
    if (import_all(tensors, dtypes, t, &nt) < 0)
        return NULL;
    if (begin(self) < 0) {
        release_all(t, nt);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS /* copies the rows, may grow (copy) the whole cache */
    rc = kvt_cache_append(self->c, t, nt);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    release_all(t, nt);
    if (rc < 0)
        return kvtpy_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *cache_ssm_update(KvtCache *self, PyObject *args)
{
    PyObject *conv, *rec;
    long long n;
    if (!PyArg_ParseTuple(args, "OOL", &conv, &rec, &n))
        return NULL;
    struct kvt_tensor t[2];
    if (kvtpy_tensor_import(conv, -1, "conv", &t[0]) < 0)
        return NULL;
    if (kvtpy_tensor_import(rec, -1, "recurrent", &t[1]) < 0) {
        kvt_tensor_release(&t[0]);
        return NULL;
    }
    int rc;
    if (begin(self) < 0) {
        release_all(t, 2);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_cache_ssm_update(self->c, &t[0], &t[1], n);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    release_all(t, 2);
    if (rc < 0)
        return kvtpy_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *tensors_of(KvtCache *self, int (*get)(const kvt_cache *, struct kvt_tensor *))
{
    if (begin(self) < 0)
        return NULL;
    struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
    int n = get(self->c, t);
    self->busy = 0;
    if (n < 0)
        return kvtpy_raise(n);
    PyObject *r = views(t, n);
    release_all(t, n);
    return r;
}

static PyObject *cache_window(KvtCache *self, PyObject *unused)
{
    (void)unused;
    return tensors_of(self, kvt_cache_window);
}

static PyObject *cache_state(KvtCache *self, PyObject *unused)
{
    (void)unused;
    return tensors_of(self, kvt_cache_state);
}

static PyObject *cache_trim(KvtCache *self, PyObject *arg)
{
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0)
        return kvtpy_raise_msg(-EINVAL, "trim: n must be >= 0");
    if (begin(self) < 0)
        return NULL;
    int rc = kvt_cache_trim(self->c, n);
    self->busy = 0;
    if (rc < 0)
        return kvtpy_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *cache_clone(KvtCache *self, PyObject *unused)
{
    (void)unused;
    if (begin(self) < 0)
        return NULL;
    kvt_cache *c;
    int rc = kvt_cache_clone(self->c, &c);
    self->busy = 0;
    if (rc < 0)
        return kvtpy_raise(rc);
    return kvtpy_cache_wrap(c);
}

static PyObject *cache_info(KvtCache *self, PyObject *unused)
{
    (void)unused;
    struct kvt_cache_info i;
    kvt_cache_get_info(self->c, &i);
    return Py_BuildValue("{s:s,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L}", "kind", kvt_kind_name(i.kind),
                         "offset", (long long)i.offset, "idx", (long long)i.idx, "max_size",
                         (long long)i.max_size, "group_size", (long long)i.group_size, "bits",
                         (long long)i.bits, "k_bits", (long long)i.k_bits, "v_bits",
                         (long long)i.v_bits, "head_dim", (long long)i.head_dim);
}

static PyObject *cache_get_offset(KvtCache *self, void *unused)
{
    (void)unused;
    return PyLong_FromLongLong(kvt_cache_offset(self->c));
}

static PyObject *cache_get_nbytes(KvtCache *self, void *unused)
{
    (void)unused;
    return PyLong_FromSize_t(kvt_cache_bytes(self->c));
}

static PyObject *cache_get_capacity(KvtCache *self, void *unused)
{
    (void)unused;
    return PyLong_FromLongLong(kvt_cache_capacity(self->c));
}

static PyObject *cache_get_trimmable(KvtCache *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(kvt_cache_is_trimmable(self->c));
}

static PyObject *cache_get_kind(KvtCache *self, void *unused)
{
    (void)unused;
    struct kvt_cache_info i;
    kvt_cache_get_info(self->c, &i);
    return PyUnicode_FromString(kvt_kind_name(i.kind));
}

static PyMethodDef cache_methods[] = {
    {"append", (PyCFunction)cache_append, METH_VARARGS, NULL},
    {"ssm_update", (PyCFunction)cache_ssm_update, METH_VARARGS, NULL},
    {"window", (PyCFunction)cache_window, METH_NOARGS, NULL},
    {"state", (PyCFunction)cache_state, METH_NOARGS, NULL},
    {"trim", (PyCFunction)cache_trim, METH_O, NULL},
    {"clone", (PyCFunction)cache_clone, METH_NOARGS, NULL},
    {"info", (PyCFunction)cache_info, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef cache_getset[] = {
    {"offset", (getter)cache_get_offset, NULL, NULL, NULL},
    {"nbytes", (getter)cache_get_nbytes, NULL, NULL, NULL},
    {"capacity", (getter)cache_get_capacity, NULL, NULL, NULL},
    {"trimmable", (getter)cache_get_trimmable, NULL, NULL, NULL},
    {"kind", (getter)cache_get_kind, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* PyVarObject_HEAD_INIT ends in a comma, which clang-format cannot know */
/* clang-format off */
PyTypeObject KvtCache_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvtier._ext.Cache",
    .tp_basicsize = sizeof(KvtCache),
    .tp_dealloc = (destructor)cache_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One library cache (use the kvtier cache classes).",
    .tp_methods = cache_methods,
    .tp_getset = cache_getset,
};
/* clang-format on */
