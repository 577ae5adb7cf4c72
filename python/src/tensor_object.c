/*
 * kvtier.Tensor: a library tensor handed to Python without copying. numpy reads it through
 * the buffer protocol (read-only: the bytes may be shared with other holders), torch through
 * a legacy DLPack capsule whose deleter drops the buffer reference, on any thread.
 */
#include "ext.h"
#include "dlpack_abi.h"

#include <stdlib.h>
#include <string.h>

/* struct-module format of each dtype; bfloat16 has no numpy type and reads as its uint16 bits */
static const char *const buffer_format[KVT_DTYPE_COUNT] = {
    "?", "B", "H", "I", "Q", "b", "h", "i", "q", "e", "f", "d", "H", "Zf",
};

PyObject *kvtpy_tensor_new(const struct kvt_tensor *t)
{
    KvtTensor *self = PyObject_New(KvtTensor, &KvtTensor_Type);
    if (!self)
        return NULL;
    kvt_tensor_share(&self->t, t);
    self->weakrefs = NULL;
    size_t item = kvt_dtype_size(t->dtype);
    for (int i = 0; i < t->rank; i++) {
        self->shape[i] = (Py_ssize_t)t->shape[i];
        self->strides[i] = (Py_ssize_t)(t->strides[i] * (int64_t)item);
    }
    return (PyObject *)self;
}

static void tensor_dealloc(KvtTensor *self)
{
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    kvt_tensor_release(&self->t); /* may run a release callback: it takes the GIL we hold */
    PyObject_Free(self);
}

static char *data_of(const KvtTensor *self)
{
    char *base = kvt_buf_data(self->t.buf);
    uint64_t addr;
    if (!base && kvt_buf_device(self->t.buf, &addr))
        base = (char *)(uintptr_t)addr; /* device memory: an address on the device */
    return base ? base + self->t.offset : NULL;
}

/* The CUDA ordinal of the device memory @p self lies in, or -1 for host memory (the
 * stand-in's "device memory" is host memory). */
static int cuda_ordinal_of(const KvtTensor *self)
{
    kvt_device *d = kvt_buf_device(self->t.buf, NULL);
    return d ? kvt_device_ordinal(d) : -1;
}

static int tensor_getbuffer(KvtTensor *self, Py_buffer *view, int flags)
{
    if (cuda_ordinal_of(self) >= 0) {
        PyErr_SetString(PyExc_BufferError, "this kvtier tensor is in CUDA memory: use torch()");
        view->obj = NULL;
        return -1;
    }
    if (flags & PyBUF_WRITABLE) {
        PyErr_SetString(PyExc_BufferError,
                        "kvtier tensors are read-only (the bytes may be shared): copy them first");
        view->obj = NULL;
        return -1;
    }
    bool contiguous = kvt_tensor_is_contiguous(&self->t);
    if (!contiguous && (flags & PyBUF_STRIDES) != PyBUF_STRIDES) {
        PyErr_SetString(PyExc_BufferError, "this kvtier tensor is strided: ask for strides");
        view->obj = NULL;
        return -1;
    }
    view->buf = data_of(self);
    view->obj = Py_NewRef(self);
    view->len = (Py_ssize_t)kvt_tensor_nbytes(&self->t);
    view->readonly = 1;
    view->itemsize = (Py_ssize_t)kvt_dtype_size(self->t.dtype);
    view->format = (flags & PyBUF_FORMAT) ? (char *)buffer_format[self->t.dtype] : NULL;
    view->ndim = self->t.rank;
    view->shape = (flags & PyBUF_ND) ? self->shape : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? self->strides : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

static PyBufferProcs tensor_as_buffer = {
    .bf_getbuffer = (getbufferproc)tensor_getbuffer,
};

/* ---- DLPack export ---- */

struct managed {
    DLManagedTensor m;
    struct kvt_tensor t;
    int64_t shape[KVT_MAX_RANK];
    int64_t strides[KVT_MAX_RANK];
};

static void managed_delete(DLManagedTensor *m)
{
    struct managed *mt = m->manager_ctx;
    kvt_tensor_release(&mt->t);
    free(mt);
}

static void capsule_destructor(PyObject *cap)
{
    if (PyCapsule_IsValid(cap, "used_dltensor"))
        return; /* a consumer took it and calls the deleter itself */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (m && m->deleter)
        m->deleter(m);
    else if (!m)
        PyErr_WriteUnraisable(cap);
    PyErr_Restore(type, value, tb);
}

static int dl_dtype(int dtype, bool signed_ints, DLDataType *out)
{
    static const struct {
        uint8_t code, bits;
    } map[KVT_DTYPE_COUNT] = {
        {KVTPY_DL_UINT, 8}, /* bool: torch 1.13 reads it as uint8 */
        {KVTPY_DL_UINT, 8},     {KVTPY_DL_UINT, 16},  {KVTPY_DL_UINT, 32},  {KVTPY_DL_UINT, 64},
        {KVTPY_DL_INT, 8},      {KVTPY_DL_INT, 16},   {KVTPY_DL_INT, 32},   {KVTPY_DL_INT, 64},
        {KVTPY_DL_FLOAT, 16},   {KVTPY_DL_FLOAT, 32}, {KVTPY_DL_FLOAT, 64}, {KVTPY_DL_BFLOAT, 16},
        {KVTPY_DL_COMPLEX, 64},
    };
    if (dtype < 0 || dtype >= KVT_DTYPE_COUNT)
        return -1;
    out->code = map[dtype].code;
    out->bits = map[dtype].bits;
    out->lanes = 1;
    /* torch 1.13 has no uint16/32/64: the same bits as the signed type of that width */
    if (signed_ints && out->code == KVTPY_DL_UINT && out->bits > 8)
        out->code = KVTPY_DL_INT;
    return 0;
}

static PyObject *make_capsule(KvtTensor *self, bool signed_ints)
{
    struct managed *mt = calloc(1, sizeof(*mt));
    if (!mt)
        return PyErr_NoMemory();
    if (dl_dtype(self->t.dtype, signed_ints, &mt->m.dl_tensor.dtype) < 0) {
        free(mt);
        PyErr_SetString(PyExc_TypeError, "dtype has no DLPack equivalent");
        return NULL;
    }
    kvt_tensor_share(&mt->t, &self->t);
    for (int i = 0; i < self->t.rank; i++) {
        mt->shape[i] = self->t.shape[i];
        mt->strides[i] = self->t.strides[i];
    }
    /* data points at element 0 and byte_offset stays 0: older consumers ignore byte_offset */
    mt->m.dl_tensor.data = data_of(self);
    mt->m.dl_tensor.device = (DLDevice){KVTPY_DL_CPU, 0};
    int ordinal = cuda_ordinal_of(self);
    if (ordinal >= 0)
        mt->m.dl_tensor.device = (DLDevice){KVTPY_DL_CUDA, ordinal};
    mt->m.dl_tensor.ndim = self->t.rank;
    mt->m.dl_tensor.shape = mt->shape;
    mt->m.dl_tensor.strides = mt->strides;
    mt->m.dl_tensor.byte_offset = 0;
    mt->m.manager_ctx = mt;
    mt->m.deleter = managed_delete;
    PyObject *cap = PyCapsule_New(&mt->m, "dltensor", capsule_destructor);
    if (!cap)
        managed_delete(&mt->m);
    return cap;
}

static PyObject *tensor_dlpack(KvtTensor *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"stream", NULL};
    PyObject *stream = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$O", kwlist, &stream))
        return NULL;
    /* CUDA memory: no copy of the library's is pending on it, on any stream */
    if (stream != Py_None && cuda_ordinal_of(self) < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "this kvtier tensor lives in host memory: stream must be None");
        return NULL;
    }
    return make_capsule(self, false);
}

static PyObject *tensor_dlpack_device(KvtTensor *self, PyObject *unused)
{
    (void)unused;
    int ordinal = cuda_ordinal_of(self);
    return ordinal >= 0 ? Py_BuildValue("(ii)", KVTPY_DL_CUDA, ordinal)
                        : Py_BuildValue("(ii)", KVTPY_DL_CPU, 0);
}

static PyObject *tensor_capsule(KvtTensor *self, PyObject *args)
{
    int signed_ints = 0;
    if (!PyArg_ParseTuple(args, "|p", &signed_ints))
        return NULL;
    return make_capsule(self, signed_ints);
}

static PyObject *tensor_get_shape(KvtTensor *self, void *unused)
{
    (void)unused;
    PyObject *t = PyTuple_New(self->t.rank);
    for (int i = 0; t && i < self->t.rank; i++)
        PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(self->t.shape[i]));
    return t;
}

static PyObject *tensor_get_strides(KvtTensor *self, void *unused)
{
    (void)unused;
    PyObject *t = PyTuple_New(self->t.rank);
    for (int i = 0; t && i < self->t.rank; i++)
        PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(self->t.strides[i]));
    return t;
}

static PyObject *tensor_get_dtype(KvtTensor *self, void *unused)
{
    (void)unused;
    return PyUnicode_FromString(kvt_dtype_name(self->t.dtype));
}

static PyObject *tensor_get_nbytes(KvtTensor *self, void *unused)
{
    (void)unused;
    return PyLong_FromSize_t(kvt_tensor_nbytes(&self->t));
}

static PyObject *tensor_get_data_ptr(KvtTensor *self, void *unused)
{
    (void)unused;
    return PyLong_FromVoidPtr(data_of(self));
}

static PyObject *tensor_get_contiguous(KvtTensor *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(kvt_tensor_is_contiguous(&self->t));
}

static PyObject *tensor_get_refcount(KvtTensor *self, void *unused)
{
    (void)unused;
    return PyLong_FromLong(kvt_buf_refcount(self->t.buf));
}

static PyObject *tensor_repr(KvtTensor *self)
{
    PyObject *shape = tensor_get_shape(self, NULL);
    if (!shape)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("kvtier.Tensor(shape=%R, dtype=%s)", shape,
                                       kvt_dtype_name(self->t.dtype));
    Py_DECREF(shape);
    return r;
}

static PyObject *tensor_numpy(KvtTensor *self, PyObject *unused)
{
    (void)unused;
    PyObject *np = PyImport_ImportModule("numpy");
    if (!np)
        return NULL;
    PyObject *a = PyObject_CallMethod(np, "asarray", "O", (PyObject *)self);
    Py_DECREF(np);
    return a;
}

static PyObject *tensor_torch(KvtTensor *self, PyObject *unused)
{
    (void)unused;
    PyObject *dl = PyImport_ImportModule("torch.utils.dlpack");
    if (!dl)
        return NULL;
    PyObject *cap = make_capsule(self, true);
    PyObject *t = cap ? PyObject_CallMethod(dl, "from_dlpack", "O", cap) : NULL;
    Py_XDECREF(cap);
    Py_DECREF(dl);
    return t;
}

static PyMethodDef tensor_methods[] = {
    {"numpy", (PyCFunction)tensor_numpy, METH_NOARGS,
     "numpy() -> numpy.ndarray: a read-only view of the same bytes (buffer protocol, no copy).\n"
     "bfloat16 has no numpy dtype: the array is uint16 holding the bfloat16 bit patterns."},
    {"torch", (PyCFunction)tensor_torch, METH_NOARGS,
     "torch() -> torch.Tensor sharing the same bytes (DLPack, no copy). bfloat16 becomes\n"
     "torch.bfloat16; uint16/32/64, which torch 1.13 lacks, become int16/32/64 of the same bits.\n"
     "Treat it as read-only: the bytes may be shared with other holders."},
    {"__dlpack__", (PyCFunction)(void (*)(void))tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "A legacy DLPack capsule (\"dltensor\") sharing the bytes."},
    {"__dlpack_device__", (PyCFunction)tensor_dlpack_device, METH_NOARGS,
     "(kDLCPU, 0): kvtier tensors live in host memory."},
    {"_capsule", (PyCFunction)tensor_capsule, METH_VARARGS,
     "_capsule(signed_ints=False): a DLPack capsule; signed_ints maps uint16/32/64 to the "
     "signed type of the same width (for torch 1.13)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tensor_getset[] = {
    {"shape", (getter)tensor_get_shape, NULL, "Shape (tuple of ints).", NULL},
    {"strides", (getter)tensor_get_strides, NULL, "Strides in elements.", NULL},
    {"dtype", (getter)tensor_get_dtype, NULL, "kvtier dtype name (\"bfloat16\", ...).", NULL},
    {"nbytes", (getter)tensor_get_nbytes, NULL, "Bytes of the elements viewed.", NULL},
    {"data_ptr", (getter)tensor_get_data_ptr, NULL, "Address of element 0.", NULL},
    {"is_contiguous", (getter)tensor_get_contiguous, NULL, "Whether C-contiguous.", NULL},
    {"_buf_refcount", (getter)tensor_get_refcount, NULL, "References to the buffer.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* PyVarObject_HEAD_INIT ends in a comma, which clang-format cannot know */
/* clang-format off */
PyTypeObject KvtTensor_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvtier._ext.Tensor",
    .tp_basicsize = sizeof(KvtTensor),
    .tp_dealloc = (destructor)tensor_dealloc,
    .tp_repr = (reprfunc)tensor_repr,
    .tp_as_buffer = &tensor_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A tensor held by kvtier, shared with Python without copying.\n\n"
              "numpy() gives a read-only numpy view (buffer protocol); torch() a torch tensor\n"
              "over the same bytes (DLPack). numpy.asarray(t) and\n"
              "torch.utils.dlpack.from_dlpack(t) work too. bfloat16 reaches torch as\n"
              "torch.bfloat16 and numpy as uint16 holding the bit patterns (numpy has no\n"
              "bfloat16; torch.from_numpy(a.view(numpy.int16)).view(torch.bfloat16) gives\n"
              "the values back).\n"
              "The bytes may be shared with other holders: do not write into them.",
    .tp_weaklistoffset = offsetof(KvtTensor, weakrefs),
    .tp_methods = tensor_methods,
    .tp_getset = tensor_getset,
};
/* clang-format on */
