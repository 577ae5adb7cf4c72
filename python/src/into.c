/*
 * Restores into memory the caller owns (kvt_file_load_into, kvt_store_restore_into): the
 * library asks where each slot goes once the header has passed its checks; the binding asks
 * Python (a callable given the header, or a ready sequence) for one writable, contiguous
 * destination per slot - a numpy array, a torch tensor, any writable buffer - or None.
 * The place callback runs on the calling thread, inside the GIL-free section: it takes the GIL.
 */
#include "ext.h"
#include "dlpack_abi.h"

#include <errno.h>
#include <stdlib.h>

struct dest {
    Py_buffer view;
    bool has_view;
    DLManagedTensor *dl;
};

struct place_ctx {
    PyObject *place; /* callable(header dict) -> sequence, or a sequence */
    struct dest *dests;
    size_t n;
    bool py_error; /* a Python exception is set: report it rather than the library's code */
};

/* Writable contiguous memory of @p o that fits slot @p sj of cache @p ci of @p h (destination
 * @p k); 0 or -1 with an exception. */
static int writable(PyObject *o, size_t k, const struct kvt_header *h, size_t ci, int sj,
                    struct dest *d, void **out)
{
    int64_t shape[KVT_MAX_RANK];
    int ndim, dtype;
    size_t have;
    if (PyObject_CheckBuffer(o)) {
        if (PyObject_GetBuffer(o, &d->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            return -1;
        d->has_view = true;
        *out = d->view.buf;
        have = (size_t)d->view.len;
        dtype = kvtpy_format_dtype(d->view.format, d->view.itemsize);
        ndim = d->view.ndim;
        for (int i = 0; i < ndim && i < KVT_MAX_RANK; i++)
            shape[i] = d->view.shape[i];
    } else if (PyObject_HasAttrString(o, "__dlpack__")) {
        PyObject *cap = PyObject_CallMethod(o, "__dlpack__", NULL);
        if (!cap)
            return -1;
        if (!PyCapsule_IsValid(cap, "dltensor")) {
            Py_DECREF(cap);
            PyErr_Format(PyExc_TypeError, "destination %zu: not a DLPack capsule", k);
            return -1;
        }
        DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        PyCapsule_SetName(cap, "used_dltensor");
        Py_DECREF(cap);
        d->dl = m;
        DLTensor *t = &m->dl_tensor;
        if (t->device.device_type != KVTPY_DL_CPU || !kvtpy_dl_contiguous(t, &have)) {
            PyErr_Format(PyExc_ValueError, "destination %zu: not contiguous host memory", k);
            return -1;
        }
        *out = (char *)t->data + t->byte_offset;
        dtype = kvtpy_dl_dtype(t->dtype);
        ndim = t->ndim;
        for (int i = 0; i < ndim && i < KVT_MAX_RANK; i++)
            shape[i] = t->shape[i];
    } else {
        PyErr_Format(PyExc_TypeError,
                     "destination %zu: expected a writable array or tensor, "
                     "got %.80s",
                     k, Py_TYPE(o)->tp_name);
        return -1;
    }
    return kvtpy_dest_fits(k, h, ci, sj, dtype, ndim, shape, have);
}

PyObject *kvtpy_place_seq(PyObject *place, const struct kvt_header *h, size_t *n_slots)
{
    size_t n = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        n += (size_t)h->caches[i].n_slots;
    *n_slots = n;
    PyObject *list = NULL, *seq = NULL;
    if (PyCallable_Check(place)) {
        PyObject *hd = kvtpy_header_dict(h);
        list = hd ? PyObject_CallOneArg(place, hd) : NULL;
        Py_XDECREF(hd);
    } else {
        list = Py_NewRef(place);
    }
    if (list)
        seq = PySequence_Fast(list, "place must return a sequence of destinations");
    Py_XDECREF(list);
    if (seq && (size_t)PySequence_Fast_GET_SIZE(seq) != n) {
        PyErr_Format(PyExc_ValueError, "%zd destinations for %zu slots",
                     PySequence_Fast_GET_SIZE(seq), n);
        Py_CLEAR(seq);
    }
    return seq;
}

static int place_cb(void *ud, const struct kvt_header *h, void **dst)
{
    struct place_ctx *c = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    size_t n;
    PyObject *seq = kvtpy_place_seq(c->place, h, &n);
    if (seq) {
        c->dests = calloc(n ? n : 1, sizeof(*c->dests));
        if (!c->dests)
            PyErr_NoMemory();
        c->n = c->dests ? n : 0;
        size_t k = 0;
        for (size_t i = 0; c->dests && i < h->n_caches && !PyErr_Occurred(); i++)
            for (int j = 0; j < h->caches[i].n_slots && !PyErr_Occurred(); j++, k++) {
                PyObject *o = PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)k);
                dst[k] = NULL;
                if (o != Py_None)
                    writable(o, k, h, i, j, &c->dests[k], &dst[k]);
            }
    }
    Py_XDECREF(seq);
    int rc = 0;
    if (PyErr_Occurred()) {
        c->py_error = true;
        rc = -EINVAL;
    }
    PyGILState_Release(g);
    return rc;
}

static void release_dests(struct place_ctx *c)
{
    for (size_t k = 0; k < c->n; k++) {
        if (c->dests[k].has_view)
            PyBuffer_Release(&c->dests[k].view);
        if (c->dests[k].dl && c->dests[k].dl->deleter)
            c->dests[k].dl->deleter(c->dests[k].dl);
    }
    free(c->dests);
}

PyObject *kvtpy_placed_result(int rc, struct kvt_header *h, bool py_error)
{
    if (py_error) {
        kvt_header_free(h);
        return NULL; /* the exception raised in place() */
    }
    if (rc < 0)
        return kvtpy_raise(rc);
    if (!h)
        Py_RETURN_NONE; /* a store miss */
    PyObject *d = kvtpy_header_dict(h);
    kvt_header_free(h);
    return d;
}

static PyObject *finish(struct place_ctx *c, int rc, struct kvt_header *h)
{
    release_dests(c);
    return kvtpy_placed_result(rc, h, c->py_error);
}

static PyObject *py_file_load_into(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"path",           "place", "model_id", "config_fingerprint",
                             "tokenizer_hash", "ns",    "n_layers", "no_verify",
                             "keep_cache",     NULL};
    const char *path;
    struct kvt_expect x = {0};
    Py_ssize_t n_layers = 0;
    int no_verify = 0, keep_cache = 0;
    struct place_ctx c = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|zzzznpp", kwlist, &path, &c.place, &x.model_id,
                                     &x.config_fingerprint, &x.tokenizer_hash, &x.ns, &n_layers,
                                     &no_verify, &keep_cache))
        return NULL;
    x.n_layers = n_layers > 0 ? (size_t)n_layers : 0;
    x.no_verify = no_verify, x.keep_cache = keep_cache;
    struct kvt_header *h = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_file_load_into(path, &x, place_cb, &c, &h);
    Py_END_ALLOW_THREADS
    return finish(&c, rc, h);
}

PyObject *kvtpy_store_restore_into(kvt_store *s, const struct kvt_hit *hit, PyObject *place)
{
    struct place_ctx c = {.place = place};
    struct kvt_header *h = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_store_restore_into(s, hit, place_cb, &c, &h);
    Py_END_ALLOW_THREADS
    return finish(&c, rc, h);
}

PyMethodDef kvtpy_into_methods[] = {
    {"file_load_into", (PyCFunction)(void (*)(void))py_file_load_into, METH_VARARGS | METH_KEYWORDS,
     NULL},
    {NULL, NULL, 0, NULL},
};
