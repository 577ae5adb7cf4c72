/*
 * kvtier._ext: the module, its error plumbing and its constants. The public, documented API is
 * the pure-Python package around it (kvtier/__init__.py).
 */
#include "ext.h"

static PyObject *error_factory; /* kvtier.errors.from_code */

PyObject *kvtpy_raise_msg(int rc, const char *msg)
{
    if (!msg || !*msg)
        msg = kvt_strerror(rc);
    if (!error_factory)
        return PyErr_Format(PyExc_RuntimeError, "kvtier error %d: %s", rc, msg);
    PyObject *exc = PyObject_CallFunction(error_factory, "is", rc, msg);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

PyObject *kvtpy_raise(int rc)
{
    return kvtpy_raise_msg(rc, kvt_last_error());
}

PyObject *kvtpy_set_error_factory(PyObject *self, PyObject *factory)
{
    (void)self;
    if (!PyCallable_Check(factory))
        return PyErr_Format(PyExc_TypeError, "factory must be callable");
    Py_XSETREF(error_factory, Py_NewRef(factory));
    Py_RETURN_NONE;
}

static PyObject *py_strerror(PyObject *self, PyObject *arg)
{
    (void)self;
    int code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(kvt_strerror(code));
}

static PyObject *py_kind_tensor_count(PyObject *self, PyObject *arg)
{
    (void)self;
    long kind = PyLong_AsLong(arg);
    if (kind == -1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromLong(kvt_kind_tensor_count((int)kind));
}

static PyObject *py_buf_cache_limit(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long bytes;
    if (!PyArg_ParseTuple(args, "K", &bytes))
        return NULL;
    size_t prev;
    Py_BEGIN_ALLOW_THREADS /* unmapping kept buffers can take a while */
    prev = kvt_buf_cache_limit((size_t)bytes);
    Py_END_ALLOW_THREADS
    return PyLong_FromSize_t(prev);
}

static PyObject *py_buf_cache_bytes(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    return PyLong_FromSize_t(kvt_buf_cache_bytes());
}

static PyObject *py_ns_hash(PyObject *self, PyObject *args)
{
    (void)self;
    const char *ns;
    if (!PyArg_ParseTuple(args, "s", &ns))
        return NULL;
    char out[17];
    kvt_ns_hash(ns, out);
    return PyUnicode_FromString(out);
}

static PyMethodDef module_methods[] = {
    {"_set_error_factory", kvtpy_set_error_factory, METH_O, NULL},
    {"strerror", py_strerror, METH_O, "The static description of a kvtier error code."},
    {"kind_tensor_count", py_kind_tensor_count, METH_O, NULL},
    {"buf_cache_limit", py_buf_cache_limit, METH_VARARGS, NULL},
    {"buf_cache_bytes", py_buf_cache_bytes, METH_NOARGS, NULL},
    {"ns_hash", py_ns_hash, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvtier._ext",
    .m_doc = "C extension of the kvtier package (use the kvtier module).",
    .m_size = -1,
    .m_methods = module_methods,
};

static int add_functions(PyObject *m, PyMethodDef *defs)
{
    for (PyMethodDef *d = defs; d->ml_name; d++) {
        PyObject *f = PyCFunction_New(d, NULL);
        if (!f || PyModule_AddObject(m, d->ml_name, f) < 0) {
            Py_XDECREF(f);
            return -1;
        }
    }
    return 0;
}

PyMODINIT_FUNC PyInit__ext(void)
{
    PyTypeObject *types[] = {&KvtTensor_Type, &KvtCache_Type,  &KvtRetain_Type, &KvtStore_Type,
                             &KvtPcache_Type, &KvtDevice_Type, &KvtDTake_Type};
    const char *names[] = {"Tensor",      "Cache",  "Retain",    "Store",
                           "PromptCache", "Device", "DeviceTake"};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0)
            goto fail;
    }
    if (add_functions(m, kvtpy_file_methods) < 0 || add_functions(m, kvtpy_cache_functions) < 0 ||
        add_functions(m, kvtpy_store_functions) < 0 ||
        add_functions(m, kvtpy_pcache_functions) < 0 || add_functions(m, kvtpy_into_methods) < 0 ||
        add_functions(m, kvtpy_device_methods) < 0)
        goto fail;
    struct {
        const char *name;
        long v;
    } consts[] = {
        {"E_FORMAT", KVT_E_FORMAT},           {"E_CORRUPT", KVT_E_CORRUPT},
        {"E_MISMATCH", KVT_E_MISMATCH},       {"E_UNSUPPORTED", KVT_E_UNSUPPORTED},
        {"E_TOO_LARGE", KVT_E_TOO_LARGE},     {"E_STATE", KVT_E_STATE},
        {"E_REFUSED", KVT_E_REFUSED},         {"E_TIMEOUT", KVT_E_TIMEOUT},
        {"VERSION_MAJOR", KVT_VERSION_MAJOR}, {"VERSION_MINOR", KVT_VERSION_MINOR},
        {"VERSION_PATCH", KVT_VERSION_PATCH}, {"STEP", KVT_STEP},
    };
    for (size_t i = 0; i < sizeof(consts) / sizeof(consts[0]); i++)
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].v) < 0)
            goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
