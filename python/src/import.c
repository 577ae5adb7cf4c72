/*
 * Python tensors into the library without copying: the memory of a numpy array (buffer
 * protocol) or a torch tensor (DLPack) is wrapped with kvt_buf_wrap(). The wrapper holds the
 * Python object and its export until the library drops the last reference, which may happen
 * on the library's writer thread: the release callback takes the GIL there.
 */
#include "ext.h"
#include "dlpack_abi.h"

#include <stdlib.h>
#include <string.h>

bool kvtpy_finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return !Py_IsInitialized() || Py_IsFinalizing();
#else
    return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

/* What the wrapped buffer keeps alive: the object and either its buffer view or its DLPack. */
struct hold {
    PyObject *owner;
    Py_buffer view;
    bool has_view;
    DLManagedTensor *dl;
};

static void hold_release(void *ud, void *data)
{
    (void)data;
    struct hold *h = ud;
    if (kvtpy_finalizing())
        return; /* the interpreter is going away: the memory goes with the process */
    PyGILState_STATE g = PyGILState_Ensure();
    if (h->has_view)
        PyBuffer_Release(&h->view);
    if (h->dl && h->dl->deleter)
        h->dl->deleter(h->dl);
    Py_XDECREF(h->owner);
    PyGILState_Release(g);
    free(h);
}

int kvtpy_format_dtype(const char *f, Py_ssize_t item)
{
    if (!f)
        return KVT_UINT8;
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    else if (*f == '>' || *f == '!')
        return -1; /* big-endian: not the file's byte order */
    if (!strcmp(f, "Zf"))
        return KVT_COMPLEX64;
    if (strlen(f) != 1)
        return -1;
    switch (*f) {
    case '?': return KVT_BOOL;
    case 'B': return KVT_UINT8;
    case 'b': return KVT_INT8;
    case 'e': return KVT_FLOAT16;
    case 'f': return KVT_FLOAT32;
    case 'd': return KVT_FLOAT64;
    case 'H':
    case 'I':
    case 'L':
    case 'Q': return item == 2 ? KVT_UINT16 : item == 4 ? KVT_UINT32 : item == 8 ? KVT_UINT64 : -1;
    case 'h':
    case 'i':
    case 'l':
    case 'q': return item == 2 ? KVT_INT16 : item == 4 ? KVT_INT32 : item == 8 ? KVT_INT64 : -1;
    default: return -1;
    }
}

int kvtpy_dl_dtype(DLDataType t)
{
    if (t.lanes != 1)
        return -1;
    switch (t.code) {
    case KVTPY_DL_BOOL: return t.bits == 8 ? KVT_BOOL : -1;
    case KVTPY_DL_UINT:
        return t.bits == 8    ? KVT_UINT8
               : t.bits == 16 ? KVT_UINT16
               : t.bits == 32 ? KVT_UINT32
               : t.bits == 64 ? KVT_UINT64
                              : -1;
    case KVTPY_DL_INT:
        return t.bits == 8    ? KVT_INT8
               : t.bits == 16 ? KVT_INT16
               : t.bits == 32 ? KVT_INT32
               : t.bits == 64 ? KVT_INT64
                              : -1;
    case KVTPY_DL_FLOAT:
        return t.bits == 16   ? KVT_FLOAT16
               : t.bits == 32 ? KVT_FLOAT32
               : t.bits == 64 ? KVT_FLOAT64
                              : -1;
    case KVTPY_DL_BFLOAT: return t.bits == 16 ? KVT_BFLOAT16 : -1;
    case KVTPY_DL_COMPLEX: return t.bits == 64 ? KVT_COMPLEX64 : -1;
    default: return -1;
    }
}

static bool is_integer(int dtype)
{
    return dtype >= KVT_UINT8 && dtype <= KVT_INT64;
}

/* Apply an as_dtype request: integers of the same item size only. */
static int reinterpret(int dtype, int as_dtype, const char *what)
{
    if (as_dtype < 0 || as_dtype == dtype)
        return dtype;
    if (is_integer(dtype) && is_integer(as_dtype) &&
        kvt_dtype_size(dtype) == kvt_dtype_size(as_dtype))
        return as_dtype;
    PyErr_Format(PyExc_TypeError, "%s: dtype %s, expected %s", what, kvt_dtype_name(dtype),
                 kvt_dtype_name(as_dtype));
    return -1;
}

/* Wrap @p bytes at @p data held by @p h, then describe it as a contiguous tensor. */
static int wrap_hold(struct hold *h, void *data, size_t bytes, int dtype, int rank,
                     const int64_t *shape, struct kvt_tensor *out)
{
    kvt_buf *b;
    int rc = kvt_buf_wrap(data, bytes, hold_release, h, &b); /* releases h itself on failure */
    if (rc < 0) {
        kvtpy_raise(rc);
        return -1;
    }
    rc = kvt_tensor_init(out, b, 0, dtype, rank, shape);
    kvt_buf_unref(b);
    if (rc < 0) {
        kvtpy_raise(rc);
        return -1;
    }
    return 0;
}

static int import_buffer(PyObject *o, int as_dtype, const char *what, struct kvt_tensor *out)
{
    struct hold *h = calloc(1, sizeof(*h));
    if (!h) {
        PyErr_NoMemory();
        return -1;
    }
    if (PyObject_GetBuffer(o, &h->view, PyBUF_RECORDS_RO) < 0) {
        free(h);
        return -1;
    }
    h->has_view = true;
    Py_buffer *v = &h->view;
    int64_t shape[KVT_MAX_RANK];
    int dtype = kvtpy_format_dtype(v->format, v->itemsize);
    const char *why = NULL;
    if (!PyBuffer_IsContiguous(v, 'C'))
        why = "is not C-contiguous (copy it first, e.g. numpy.ascontiguousarray)";
    else if (v->ndim > KVT_MAX_RANK)
        why = "has more than 8 dimensions";
    else if (dtype < 0)
        why = "has a dtype kvtier does not know";
    if (why) {
        PyErr_Format(dtype < 0 ? PyExc_TypeError : PyExc_ValueError, "%s %s (format '%s')", what,
                     why, v->format ? v->format : "B");
        PyBuffer_Release(v);
        free(h);
        return -1;
    }
    if ((dtype = reinterpret(dtype, as_dtype, what)) < 0) {
        PyBuffer_Release(v);
        free(h);
        return -1;
    }
    for (int i = 0; i < v->ndim; i++)
        shape[i] = v->shape ? v->shape[i] : v->len / v->itemsize;
    int rank = v->ndim;
    if (rank == 0 && !v->shape) {
        /* a plain bytes-like object without a shape: one dimension of bytes */
        rank = 1;
        shape[0] = v->len;
    }
    h->owner = Py_NewRef(o);
    return wrap_hold(h, v->buf, (size_t)v->len, dtype, rank, shape, out);
}

int kvtpy_dl_contiguous(const DLTensor *t, size_t *bytes)
{
    size_t numel = 1;
    int64_t want = 1;
    bool contiguous = true;
    for (int i = t->ndim - 1; i >= 0; i--) {
        numel *= (size_t)t->shape[i];
        if (t->strides && t->shape[i] != 1 && t->strides[i] != want)
            contiguous = false;
        want *= t->shape[i];
    }
    *bytes = numel * ((size_t)t->dtype.bits * t->dtype.lanes / 8);
    return contiguous || numel <= 1;
}

/* Why @p t cannot be imported ("" when it can); @p dtype is its kvtier dtype or -1. */
static PyObject *dl_refusal(const DLTensor *t, int dtype, char *msg, size_t cap)
{
    size_t bytes;
    msg[0] = '\0';
    if (t->device.device_type != KVTPY_DL_CPU && t->device.device_type != KVTPY_DL_CUDA)
        snprintf(msg, cap, "is on device type %d; kvtier takes host (CPU) or CUDA memory",
                 t->device.device_type);
    else if (t->ndim > KVT_MAX_RANK)
        snprintf(msg, cap, "has more than 8 dimensions");
    else if (dtype < 0) {
        snprintf(msg, cap, "has a dtype kvtier does not know (DLPack code %u, %u bits)",
                 t->dtype.code, t->dtype.bits);
        return PyExc_TypeError;
    } else if (!kvtpy_dl_contiguous(t, &bytes))
        snprintf(msg, cap, "is not contiguous (call .contiguous() first)");
    return PyExc_ValueError;
}

/* @p h's DLPack memory as the library's buffer: host memory wrapped, CUDA memory too (on the
 * process's device of that ordinal: such tensors can be saved, not changed). */
static int wrap_dl(struct hold *h, const DLTensor *t, int dtype, struct kvt_tensor *out)
{
    int64_t shape[KVT_MAX_RANK];
    size_t numel = 1;
    for (int i = 0; i < t->ndim; i++)
        numel *= (size_t)(shape[i] = t->shape[i]);
    char *data = (char *)t->data + t->byte_offset;
    size_t bytes = numel * kvt_dtype_size(dtype);
    if (t->device.device_type == KVTPY_DL_CPU)
        return wrap_hold(h, data, bytes, dtype, t->ndim, shape, out);
    kvt_device *d = kvtpy_cuda_device(t->device.device_id);
    if (!d) {
        hold_release(h, NULL);
        return -1;
    }
    kvt_buf *b;
    int rc = kvt_buf_wrap_device(d, (uint64_t)(uintptr_t)data, bytes, hold_release, h, &b);
    if (rc == 0) { /* on failure the wrap released h itself */
        rc = kvt_tensor_init(out, b, 0, dtype, t->ndim, shape);
        kvt_buf_unref(b);
    }
    return rc ? (kvtpy_raise(rc), -1) : 0;
}

PyObject *kvtpy_dlpack(PyObject *o)
{
    PyObject *dev = PyObject_HasAttrString(o, "__dlpack_device__")
                        ? PyObject_CallMethod(o, "__dlpack_device__", NULL)
                        : NULL;
    long type = dev && PyTuple_Check(dev) && PyTuple_GET_SIZE(dev) >= 1
                    ? PyLong_AsLong(PyTuple_GET_ITEM(dev, 0))
                    : KVTPY_DL_CPU;
    Py_XDECREF(dev);
    PyErr_Clear(); /* no device query: host memory, exported as such below */
    if (type != KVTPY_DL_CUDA)
        return PyObject_CallMethod(o, "__dlpack__", NULL);
    /* ready on the legacy default stream, which the library's copies wait for */
    PyObject *args = PyTuple_New(0), *kw = Py_BuildValue("{s:i}", "stream", 1);
    PyObject *f = PyObject_GetAttrString(o, "__dlpack__");
    PyObject *cap = args && kw && f ? PyObject_Call(f, args, kw) : NULL;
    Py_XDECREF(args);
    Py_XDECREF(kw);
    Py_XDECREF(f);
    return cap;
}

static int import_dlpack(PyObject *o, int as_dtype, const char *what, struct kvt_tensor *out)
{
    PyObject *cap = kvtpy_dlpack(o);
    if (!cap)
        return -1;
    if (!PyCapsule_IsValid(cap, "dltensor")) {
        PyErr_Format(PyExc_TypeError, "%s: __dlpack__ did not return a \"dltensor\" capsule", what);
        Py_DECREF(cap);
        return -1;
    }
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    DLTensor *t = &m->dl_tensor;
    char msg[160];
    int dtype = kvtpy_dl_dtype(t->dtype);
    PyObject *err = dl_refusal(t, dtype, msg, sizeof(msg));
    if (msg[0]) {
        PyErr_Format(err, "%s %s", what, msg);
        Py_DECREF(cap); /* the capsule's destructor calls the producer's deleter */
        return -1;
    }
    if ((dtype = reinterpret(dtype, as_dtype, what)) < 0) {
        Py_DECREF(cap);
        return -1;
    }
    struct hold *h = calloc(1, sizeof(*h));
    if (!h) {
        Py_DECREF(cap);
        PyErr_NoMemory();
        return -1;
    }
    PyCapsule_SetName(cap, "used_dltensor"); /* ours now: hold_release calls the deleter */
    Py_DECREF(cap);
    h->dl = m;
    h->owner = Py_NewRef(o);
    return wrap_dl(h, t, dtype, out);
}

int kvtpy_tensor_import(PyObject *o, int as_dtype, const char *what, struct kvt_tensor *out)
{
    memset(out, 0, sizeof(*out));
    if (PyObject_TypeCheck(o, &KvtTensor_Type)) {
        KvtTensor *k = (KvtTensor *)o;
        int dtype = reinterpret(k->t.dtype, as_dtype, what);
        if (dtype < 0)
            return -1;
        kvt_tensor_share(out, &k->t);
        out->dtype = dtype;
        return 0;
    }
    if (PyObject_CheckBuffer(o))
        return import_buffer(o, as_dtype, what, out);
    if (PyObject_HasAttrString(o, "__dlpack__"))
        return import_dlpack(o, as_dtype, what, out);
    PyErr_Format(PyExc_TypeError,
                 "%s: expected a torch tensor, a numpy array or a kvtier Tensor, got %.80s", what,
                 Py_TYPE(o)->tp_name);
    return -1;
}
