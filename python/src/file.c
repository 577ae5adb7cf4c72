/*
 * The file level: save, load, verify, read_header of one .mlxkv file, each with the GIL
 * released for its I/O; plus the timing helper the benchmark compares the binding against.
 */
#include "ext.h"

#include <string.h>
#include <time.h>

/* Expectations from keyword arguments; strings stay owned by the caller's dict/args. */
struct expect_args {
    struct kvt_expect x;
    int no_verify, keep_cache;
    Py_ssize_t n_layers;
};

static int parse_expect(PyObject *args, PyObject *kw, const char **path, struct expect_args *a)
{
    static char *kwlist[] = {"path",           "model_id",   "config_fingerprint",
                             "tokenizer_hash", "ns",         "n_layers",
                             "no_verify",      "keep_cache", NULL};
    memset(a, 0, sizeof(*a));
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|zzzznpp", kwlist, path, &a->x.model_id,
                                     &a->x.config_fingerprint, &a->x.tokenizer_hash, &a->x.ns,
                                     &a->n_layers, &a->no_verify, &a->keep_cache))
        return -1;
    a->x.n_layers = a->n_layers > 0 ? (size_t)a->n_layers : 0;
    a->x.no_verify = a->no_verify;
    a->x.keep_cache = a->keep_cache;
    return 0;
}

static PyObject *py_file_save(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"path",           "tokens",  "caches",     "meta", "created_at",
                             "max_file_bytes", "no_sync", "drop_cache", NULL};
    const char *path;
    PyObject *tokens, *caches, *meta = Py_None;
    long long created_at = 0;
    unsigned long long max_bytes = 0;
    int no_sync = 0, drop_cache = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sOO|OLKpp", kwlist, &path, &tokens, &caches, &meta,
                                     &created_at, &max_bytes, &no_sync, &drop_cache))
        return NULL;
    struct kvtpy_borrowed b;
    if (kvtpy_borrow_begin(tokens, caches, meta, created_at, &b) < 0)
        return NULL;
    struct kvt_save_opts o = {.created_at = created_at,
                              .max_file_bytes = max_bytes,
                              .no_sync = no_sync,
                              .drop_cache = drop_cache};
    uint64_t bytes = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_file_save(path, &b.e, &o, &bytes);
    Py_END_ALLOW_THREADS
    kvtpy_borrow_end(&b);
    if (rc < 0)
        return kvtpy_raise(rc);
    return PyLong_FromUnsignedLongLong(bytes);
}

static PyObject *py_file_load(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    const char *path;
    struct expect_args a;
    if (parse_expect(args, kw, &path, &a) < 0)
        return NULL;
    struct kvt_entry *e;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_file_load(path, &a.x, &e, NULL);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return kvtpy_raise(rc);
    return kvtpy_entry_out(e);
}

static PyObject *py_file_verify(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    const char *path;
    struct expect_args a;
    if (parse_expect(args, kw, &path, &a) < 0)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_file_verify(path, &a.x);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return kvtpy_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *py_file_read_header(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"path", "max_header_bytes", NULL};
    const char *path;
    Py_ssize_t max_header = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|n", kwlist, &path, &max_header))
        return NULL;
    struct kvt_read_opts o = {.max_header_bytes = max_header > 0 ? (size_t)max_header : 0};
    struct kvt_header *h;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_file_read_header(path, &o, &h);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return kvtpy_raise(rc);
    PyObject *d = kvtpy_header_dict(h);
    kvt_header_free(h);
    return d;
}

static PyObject *py_file_plan_size(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *tokens, *caches, *meta = Py_None;
    if (!PyArg_ParseTuple(args, "OO|O", &tokens, &caches, &meta))
        return NULL;
    struct kvtpy_borrowed b;
    if (kvtpy_borrow_begin(tokens, caches, meta, 0, &b) < 0)
        return NULL;
    uint64_t bytes = 0;
    int rc = kvt_file_plan_size(&b.e, &bytes);
    kvtpy_borrow_end(&b);
    if (rc < 0)
        return kvtpy_raise(rc);
    return PyLong_FromUnsignedLongLong(bytes);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The C library's own restore of @p path, timed in C: the benchmark's reference. */
static PyObject *py_c_load_seconds(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    const char *path;
    struct expect_args a;
    if (parse_expect(args, kw, &path, &a) < 0)
        return NULL;
    struct kvt_entry *e = NULL;
    double secs = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    double t0 = now_s();
    rc = kvt_file_load(path, &a.x, &e, NULL);
    secs = now_s() - t0;
    kvt_entry_free(e);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return kvtpy_raise(rc);
    return PyFloat_FromDouble(secs);
}

PyMethodDef kvtpy_file_methods[] = {
    {"file_save", (PyCFunction)(void (*)(void))py_file_save, METH_VARARGS | METH_KEYWORDS, NULL},
    {"file_load", (PyCFunction)(void (*)(void))py_file_load, METH_VARARGS | METH_KEYWORDS, NULL},
    {"file_verify", (PyCFunction)(void (*)(void))py_file_verify, METH_VARARGS | METH_KEYWORDS,
     NULL},
    {"file_read_header", (PyCFunction)(void (*)(void))py_file_read_header,
     METH_VARARGS | METH_KEYWORDS, NULL},
    {"file_plan_size", py_file_plan_size, METH_VARARGS, NULL},
    {"_c_load_seconds", (PyCFunction)(void (*)(void))py_c_load_seconds,
     METH_VARARGS | METH_KEYWORDS, NULL},
    {NULL, NULL, 0, NULL},
};
