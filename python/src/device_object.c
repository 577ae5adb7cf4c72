/*
 * Devices (kvtier.h, "Devices"): the Device type over kvt_device, restores straight into
 * device memory (kvt_file_load_to_device, kvt_store_restore_to_device) and the layer-wise
 * takes of the prompt cache. A Device of a CUDA ordinal is the process's (cuda_devices.c).
 * Destinations are CUDA tensors (DLPack), raw device addresses (int), or None; on the host
 * stand-in, whose device memory is host memory, CPU tensors and arrays too.
 */
#include "ext.h"
#include "dlpack_abi.h"

#include <errno.h>
#include <stdlib.h>

typedef struct {
    PyObject_HEAD
    kvt_device *d;
    int ordinal; /* CUDA ordinal, -1 for the host stand-in */
    bool shared; /* one of the process's CUDA devices: never closed */
} KvtDevice;

static void device_dealloc(KvtDevice *self)
{
    if (!self->shared)
        kvt_device_close(self->d);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *device_name(KvtDevice *self, void *unused)
{
    (void)unused;
    return PyUnicode_FromString(self->d ? kvt_device_name(self->d) : "closed");
}

static PyObject *device_ordinal(KvtDevice *self, void *unused)
{
    (void)unused;
    return PyLong_FromLong(self->ordinal);
}

static PyGetSetDef device_getset[] = {
    {"name", (getter)device_name, NULL, "\"cuda:0 NVIDIA H200\", \"host stand-in\".", NULL},
    {"ordinal", (getter)device_ordinal, NULL, "The CUDA ordinal; -1 for the stand-in.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject KvtDevice_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvtier._ext.Device",
    .tp_basicsize = sizeof(KvtDevice),
    .tp_dealloc = (destructor)device_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A device (use kvtier.Device).",
    .tp_getset = device_getset,
};

static PyObject *device_new(kvt_device *d, int ordinal, bool shared)
{
    KvtDevice *o = PyObject_New(KvtDevice, &KvtDevice_Type);
    if (!o) {
        if (!shared)
            kvt_device_close(d);
        return NULL;
    }
    o->d = d, o->ordinal = ordinal, o->shared = shared;
    return (PyObject *)o;
}

static PyObject *py_device_cuda(PyObject *self, PyObject *args)
{
    (void)self;
    int ordinal = 0;
    if (!PyArg_ParseTuple(args, "|i", &ordinal))
        return NULL;
    kvt_device *d = kvtpy_cuda_device(ordinal);
    return d ? device_new(d, ordinal, true) : NULL;
}

static PyObject *py_device_host(PyObject *self, PyObject *args)
{
    (void)self;
    struct kvt_device_opts o = {0};
    Py_ssize_t chunk = 0;
    unsigned depth = 0, delay = 0;
    if (!PyArg_ParseTuple(args, "|nII", &chunk, &depth, &delay))
        return NULL;
    o.staging_chunk = chunk > 0 ? (size_t)chunk : 0, o.staging_depth = depth;
    o.copy_delay_us = delay;
    kvt_device *d;
    int rc = kvt_device_open_host(&o, &d);
    return rc ? kvtpy_raise(rc) : device_new(d, -1, false);
}

/* ---- restores into device memory ---------------------------------------------------------- */

struct dplace {
    PyObject *place; /* callable(header dict) -> sequence, or a sequence */
    KvtDevice *dev;
    DLManagedTensor **dl; /* the DLPack exports kept until the restore ends */
    size_t n;
    bool py_error;
};

/* The device address of destination @p o for slot @p sj of cache @p ci of @p h; 0 or -1 with
 * an exception. */
static int dest_addr(struct dplace *c, PyObject *o, size_t k, const struct kvt_header *h, size_t ci,
                     int sj, uint64_t *out)
{
    if (PyLong_Check(o)) {
        *out = PyLong_AsUnsignedLongLong(o);
        return PyErr_Occurred() ? -1 : 0;
    }
    if (!PyObject_HasAttrString(o, "__dlpack__")) {
        PyErr_Format(PyExc_TypeError,
                     "destination %zu: expected a device tensor or address, got "
                     "%.80s",
                     k, Py_TYPE(o)->tp_name);
        return -1;
    }
    PyObject *cap = kvtpy_dlpack(o);
    if (!cap)
        return -1;
    DLManagedTensor *m =
        PyCapsule_IsValid(cap, "dltensor") ? PyCapsule_GetPointer(cap, "dltensor") : NULL;
    if (m) {
        PyCapsule_SetName(cap, "used_dltensor");
        c->dl[k] = m;
    }
    Py_DECREF(cap);
    if (!m) {
        PyErr_Format(PyExc_TypeError, "destination %zu: not a DLPack capsule", k);
        return -1;
    }
    const DLTensor *t = &m->dl_tensor;
    size_t bytes;
    int want_type = c->dev->ordinal < 0 ? KVTPY_DL_CPU : KVTPY_DL_CUDA;
    if (t->device.device_type != want_type ||
        (c->dev->ordinal >= 0 && t->device.device_id != c->dev->ordinal))
        PyErr_Format(PyExc_ValueError,
                     "destination %zu: memory of another device (DLPack "
                     "device %d:%d)",
                     k, t->device.device_type, t->device.device_id);
    else if (!kvtpy_dl_contiguous(t, &bytes))
        PyErr_Format(PyExc_ValueError, "destination %zu: not contiguous", k);
    else
        kvtpy_dest_fits(k, h, ci, sj, kvtpy_dl_dtype(t->dtype), t->ndim, t->shape, bytes);
    *out = (uint64_t)(uintptr_t)t->data + t->byte_offset;
    return PyErr_Occurred() ? -1 : 0;
}

static int dplace_cb(void *ud, const struct kvt_header *h, uint64_t *dst)
{
    struct dplace *c = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    size_t n;
    PyObject *seq = kvtpy_place_seq(c->place, h, &n);
    if (seq && !(c->dl = calloc(n ? n : 1, sizeof(*c->dl))))
        PyErr_NoMemory();
    c->n = c->dl ? n : 0;
    for (size_t i = 0, k = 0; c->dl && i < h->n_caches && !PyErr_Occurred(); i++)
        for (int j = 0; j < h->caches[i].n_slots && !PyErr_Occurred(); j++, k++) {
            PyObject *o = PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)k);
            dst[k] = 0;
            if (o != Py_None)
                dest_addr(c, o, k, h, i, j, &dst[k]);
        }
    Py_XDECREF(seq);
    int rc = PyErr_Occurred() ? -EINVAL : 0;
    c->py_error = rc != 0;
    PyGILState_Release(g);
    return rc;
}

static PyObject *dfinish(struct dplace *c, int rc, struct kvt_header *h)
{
    for (size_t k = 0; k < c->n; k++)
        if (c->dl[k] && c->dl[k]->deleter)
            c->dl[k]->deleter(c->dl[k]);
    free(c->dl);
    return kvtpy_placed_result(rc, h, c->py_error);
}

static KvtDevice *device_arg(PyObject *o)
{
    if (!PyObject_TypeCheck(o, &KvtDevice_Type)) {
        PyErr_SetString(PyExc_TypeError, "expected a kvtier Device");
        return NULL;
    }
    return (KvtDevice *)o;
}

static PyObject *py_file_load_to_device(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"path",
                             "device",
                             "place",
                             "model_id",
                             "config_fingerprint",
                             "tokenizer_hash",
                             "ns",
                             "n_layers",
                             "no_verify",
                             "keep_cache",
                             NULL};
    const char *path;
    PyObject *dev;
    struct kvt_expect x = {0};
    Py_ssize_t n_layers = 0;
    int no_verify = 0, keep_cache = 0;
    struct dplace c = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sOO|zzzznpp", kwlist, &path, &dev, &c.place,
                                     &x.model_id, &x.config_fingerprint, &x.tokenizer_hash, &x.ns,
                                     &n_layers, &no_verify, &keep_cache) ||
        !(c.dev = device_arg(dev)))
        return NULL;
    x.n_layers = n_layers > 0 ? (size_t)n_layers : 0;
    x.no_verify = no_verify, x.keep_cache = keep_cache;
    struct kvt_header *h = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_file_load_to_device(path, &x, c.dev->d, dplace_cb, &c, &h);
    Py_END_ALLOW_THREADS
    return dfinish(&c, rc, h);
}

PyObject *kvtpy_store_restore_to_device(kvt_store *s, const struct kvt_hit *hit, PyObject *dev,
                                        PyObject *place)
{
    struct dplace c = {.place = place};
    if (!(c.dev = device_arg(dev)))
        return NULL;
    struct kvt_header *h = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_store_restore_to_device(s, hit, c.dev->d, dplace_cb, &c, &h);
    Py_END_ALLOW_THREADS
    return dfinish(&c, rc, h);
}

kvt_device *kvtpy_device_of(PyObject *o)
{
    KvtDevice *d = device_arg(o);
    return d ? d->d : NULL;
}

/* A layer-wise take (kvt_dtake): wait(slot, stream) and end(); ended when collected. */
typedef struct {
    PyObject_HEAD
    kvt_dtake *p;
    PyObject *dev; /* the Device: open until the take ends */
} KvtDTake;

static PyObject *dtake_end(KvtDTake *self, PyObject *unused)
{
    (void)unused;
    kvt_dtake *p = self->p;
    self->p = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_dtake_end(p);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return kvtpy_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *dtake_wait(KvtDTake *self, PyObject *args)
{
    Py_ssize_t slot;
    unsigned long long stream = 0;
    if (!PyArg_ParseTuple(args, "n|K", &slot, &stream))
        return NULL;
    if (!self->p) /* ended: everything landed */
        Py_RETURN_NONE;
    if (slot < 0)
        return kvtpy_raise_msg(-EINVAL, "slot must be >= 0");
    int rc;
    Py_BEGIN_ALLOW_THREADS /* the host stand-in waits on the host */
    rc = kvt_dtake_wait(self->p, (size_t)slot, stream);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return kvtpy_raise(rc);
    Py_RETURN_NONE;
}

static void dtake_dealloc(KvtDTake *self)
{
    Py_BEGIN_ALLOW_THREADS
    kvt_dtake_end(self->p);
    Py_END_ALLOW_THREADS
    Py_XDECREF(self->dev);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef dtake_methods[] = {
    {"wait", (PyCFunction)dtake_wait, METH_VARARGS, NULL},
    {"end", (PyCFunction)dtake_end, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject KvtDTake_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvtier._ext.DeviceTake",
    .tp_basicsize = sizeof(KvtDTake),
    .tp_dealloc = (destructor)dtake_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A take into device memory whose copies may still run.",
    .tp_methods = dtake_methods,
};

PyObject *kvtpy_pcache_take_to_device(kvt_pcache *pc, const int32_t *tok, size_t n, const char *ns,
                                      PyObject *dev, PyObject *place, bool *from_disk,
                                      PyObject **pending)
{
    struct dplace c = {.place = place};
    if (!(c.dev = device_arg(dev)))
        return NULL;
    KvtDTake *o = pending ? PyObject_New(KvtDTake, &KvtDTake_Type) : NULL;
    if (pending && !o)
        return NULL;
    if (o) {
        o->p = NULL;
        o->dev = Py_NewRef(dev);
    }
    struct kvt_header *h = NULL;
    struct kvt_take t;
    kvt_dtake *p = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pending ? kvt_pcache_take_to_device_async(pc, tok, n, ns, dplace_cb, &c, &t, &h, &p)
                 : kvt_pcache_take_to_device(pc, tok, n, ns, dplace_cb, &c, &t, &h);
    Py_END_ALLOW_THREADS
    *from_disk = t.from_disk;
    if (o) {
        o->p = p;
        *pending = (PyObject *)o;
    }
    PyObject *r = dfinish(&c, rc, h);
    if (!r && o) {
        Py_CLEAR(*pending);
    }
    return r;
}

PyMethodDef kvtpy_device_methods[] = {
    {"device_cuda", py_device_cuda, METH_VARARGS, NULL},
    {"device_host", py_device_host, METH_VARARGS, NULL},
    {"file_load_to_device", (PyCFunction)(void (*)(void))py_file_load_to_device,
     METH_VARARGS | METH_KEYWORDS, NULL},
    {NULL, NULL, 0, NULL},
};
