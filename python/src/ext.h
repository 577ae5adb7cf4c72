/*
 * Internal interface of the kvtier._ext extension: the object types, error raising, and the
 * conversions between Python objects and the library's tensors, caches and entries.
 * GIL rule: every library call that does I/O, copies tensor bytes or waits runs between
 * Py_BEGIN/END_ALLOW_THREADS; calls that only read scalars keep the GIL.
 */
#ifndef KVTPY_EXT_H
#define KVTPY_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>

#include "kvtier.h"

/* A library tensor (one buffer reference) seen by Python: buffer protocol and DLPack. */
typedef struct {
    PyObject_HEAD
    struct kvt_tensor t;
    Py_ssize_t shape[KVT_MAX_RANK];
    Py_ssize_t strides[KVT_MAX_RANK]; /* bytes, for the buffer protocol */
    PyObject *weakrefs;
} KvtTensor;

/* One cache; busy while a call runs on it without the GIL (caches are one-thread objects). */
typedef struct {
    PyObject_HEAD
    kvt_cache *c;
    int busy;
} KvtCache;

/* A kvt_retain handed out by a take and consumed by a put. */
typedef struct {
    PyObject_HEAD
    kvt_retain *r;
} KvtRetain;

extern PyTypeObject KvtTensor_Type;
extern PyTypeObject KvtCache_Type;
extern PyTypeObject KvtRetain_Type;
extern PyTypeObject KvtStore_Type;
extern PyTypeObject KvtPcache_Type;

/* Raise the exception for library code @p rc with the thread's last message; returns NULL. */
PyObject *kvtpy_raise(int rc);
/* The same with a message of the binding's own. */
PyObject *kvtpy_raise_msg(int rc, const char *msg);
/* Set the factory errors.from_code(code, message) that builds the exception objects. */
PyObject *kvtpy_set_error_factory(PyObject *self, PyObject *factory);

/* A new Python Tensor sharing @p t's bytes (takes a reference). */
PyObject *kvtpy_tensor_new(const struct kvt_tensor *t);
/*
 * An owned kvt_tensor over @p o's memory without copying: a kvtier Tensor (shared), an object
 * with the buffer protocol (numpy, bytes, memoryview) or with __dlpack__ (torch). Foreign
 * memory is wrapped with kvt_buf_wrap(); @p o stays alive until the library releases it.
 * @p as_dtype >= 0 reinterprets integer memory of the same item size (torch has no uint32).
 * Returns 0, or -1 with a Python exception set.
 */
int kvtpy_tensor_import(PyObject *o, int as_dtype, const char *what, struct kvt_tensor *out);
/* The kvtier dtype of buffer-protocol format @p f with item size @p item, or -1. */
int kvtpy_format_dtype(const char *f, Py_ssize_t item);
/*
 * Whether a destination of @p dtype and shape @p shape[@p ndim] (@p bytes in all) may receive
 * slot @p sj of cache @p ci of @p h, destination @p k of the placement: a 1-D uint8 buffer
 * of at least the slot's bytes, or a typed one of exactly the slot's dtype and shape. 0, or
 * -1 with a ValueError naming the slot.
 */
int kvtpy_dest_fits(size_t k, const struct kvt_header *h, size_t ci, int sj, int dtype, int ndim,
                    const int64_t *shape, size_t bytes);
/* @p o.__dlpack__(): for CUDA memory with stream=1 (ready on the legacy default stream, which
 * the library's copies wait for). New reference, or NULL with an exception. */
PyObject *kvtpy_dlpack(PyObject *o);
/* Whether interpreter finalization has begun (callbacks then leak instead of taking the GIL). */
bool kvtpy_finalizing(void);

/* A Cache object taking ownership of @p c. */
PyObject *kvtpy_cache_wrap(kvt_cache *c);
/* Check-and-mark busy for @p n caches of a sequence; undo with kvtpy_caches_done(). */
int kvtpy_caches_begin(PyObject *seq, kvt_cache ***out, size_t *n);
void kvtpy_caches_done(PyObject *seq, kvt_cache **v, size_t n);

/* A borrowed view of int32 tokens from a buffer object; release with PyBuffer_Release. */
int kvtpy_tokens(PyObject *o, Py_buffer *view, const int32_t **tok, size_t *n);
/* The (tokens, ns=None) arguments of a lookup: the tokens as kvtpy_tokens() gives them. */
int kvtpy_prompt_args(PyObject *args, Py_buffer *view, const int32_t **tok, size_t *n,
                      const char **ns);
/* Metadata dict (model_id, config_fingerprint, tokenizer_hash, ns) → struct (borrowed). */
int kvtpy_meta(PyObject *d, struct kvt_meta *m);
/* (tokens bytes, [Cache], meta dict, created_at) from a library entry, which it frees. */
PyObject *kvtpy_entry_out(struct kvt_entry *e);
/* An entry over borrowed caches (marked busy) and a borrowed token buffer, for save and put. */
struct kvtpy_borrowed {
    Py_buffer tokview;
    PyObject *seq;
    kvt_cache **v;
    size_t n;
    struct kvt_entry e;
};
int kvtpy_borrow_begin(PyObject *tokens, PyObject *caches, PyObject *meta, long long created_at,
                       struct kvtpy_borrowed *b);
void kvtpy_borrow_end(struct kvtpy_borrowed *b);
/* A library-owned entry of clones of the caches (sharing their bytes), for the prompt cache. */
int kvtpy_entry_owned(PyObject *tokens, PyObject *caches, PyObject *meta, struct kvt_entry **out);
/* A dict of a header's fields. */
PyObject *kvtpy_header_dict(const struct kvt_header *h);
/* A dict of store statistics. */
PyObject *kvtpy_store_stats_dict(const struct kvt_store_stats *st);

/* Module-level functions of each file, for the method table. */
extern PyMethodDef kvtpy_file_methods[];
extern PyMethodDef kvtpy_cache_functions[];
extern PyMethodDef kvtpy_store_functions[];
extern PyMethodDef kvtpy_into_methods[];
/* kvt_store_restore_into() with destinations from @p place; a header dict, None on a miss. */
PyObject *kvtpy_store_restore_into(kvt_store *s, const struct kvt_hit *hit, PyObject *place);

/* The destinations a placement gives for @p h: @p place called with the header dict, or
 * @p place itself; a sequence of exactly *@p n_slots items, or NULL with an exception. */
PyObject *kvtpy_place_seq(PyObject *place, const struct kvt_header *h, size_t *n_slots);

/* The result of a restore into placed memory: the header dict, None on a store miss, or NULL
 * with the exception (the placement's own when @p py_error). Frees @p h. */
PyObject *kvtpy_placed_result(int rc, struct kvt_header *h, bool py_error);

/* The process's CUDA device of @p ordinal (cuda_devices.c; opened at first use, never closed;
 * NULL with an exception). */
kvt_device *kvtpy_cuda_device(int ordinal);
/* Devices (device_object.c): the Device type and restores into device memory. */
extern PyTypeObject KvtDevice_Type;
extern PyMethodDef kvtpy_device_methods[];
/** The kvt_device of a Device object (NULL with TypeError). */
kvt_device *kvtpy_device_of(PyObject *o);
/** kvt_pcache_take_to_device() with a Python placement: the header dict, None on a miss. */
/* kvt_pcache_take_to_device() with a Python placement: the header dict, None on a miss. With
 * @p pending, the layer-wise take (kvt_pcache_take_to_device_async()): *@p pending is set to
 * a DeviceTake when the result is not NULL. */
extern PyTypeObject KvtDTake_Type;
PyObject *kvtpy_pcache_take_to_device(kvt_pcache *pc, const int32_t *tok, size_t n, const char *ns,
                                      PyObject *dev, PyObject *place, bool *from_disk,
                                      PyObject **pending);
PyObject *kvtpy_store_restore_to_device(kvt_store *s, const struct kvt_hit *hit, PyObject *dev,
                                        PyObject *place);
extern PyMethodDef kvtpy_pcache_functions[];
/* A list of dicts of the records of @p s (GIL released for the snapshot). */
PyObject *kvtpy_store_list(kvt_store *s);

#endif
