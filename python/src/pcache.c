/*
 * kvtier._ext.PromptCache: the RAM prompt cache over a store, with the library's writer and
 * timer threads. Every call releases the GIL: a call may wait for the writer, and the writer
 * may need the GIL to release a Python tensor whose save it finished.
 */
#include "ext.h"

#include <errno.h>

typedef struct {
    PyObject_HEAD
    kvt_pcache *pc;
    int in_use;
    PyObject *device; /* the Device its entries and takes are in (kept alive), or NULL */
} KvtPcache;

/* ---- Retain ---- */

static void retain_dealloc(KvtRetain *self)
{
    kvt_retain_release(self->r);
    PyObject_Free(self);
}

static PyObject *retain_wrap(kvt_retain *r)
{
    KvtRetain *self = PyObject_New(KvtRetain, &KvtRetain_Type);
    if (!self) {
        kvt_retain_release(r);
        return NULL;
    }
    self->r = r;
    return (PyObject *)self;
}

/* PyVarObject_HEAD_INIT ends in a comma, which clang-format cannot know */
/* clang-format off */
PyTypeObject KvtRetain_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvtier._ext.Retain",
    .tp_basicsize = sizeof(KvtRetain),
    .tp_dealloc = (destructor)retain_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A hold on the donor of a taken prefix; consumed by a put.",
};
/* clang-format on */

/* ---- PromptCache ---- */

static int enter(KvtPcache *self)
{
    if (!self->pc) {
        kvtpy_raise_msg(KVT_E_STATE, "prompt cache is closed");
        return -1;
    }
    self->in_use++;
    return 0;
}

static void leave(KvtPcache *self)
{
    self->in_use--;
}

static PyObject *py_pcache_open(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *kwlist[] = {"ram_max_bytes",      "cold_dir",        "model_id",
                             "config_fingerprint", "tokenizer_hash",  "max_bytes",
                             "n_layers",           "no_verify",       "spill_queue_max_bytes",
                             "write_behind",       "demote_idle_ms",  "snapshot_debounce_ms",
                             "flush_timeout_ms",   "background_cpus", "device",
                             "keep_saved_cached",  "share_prefixes",  NULL};
    struct kvt_pcache_opts o;
    kvt_pcache_opts_init(&o);
    unsigned long long ram = o.ram_max_bytes, max_bytes = 0;
    Py_ssize_t n_layers = 0;
    int no_verify = 0, write_behind = o.write_behind;
    long long queue = o.spill_queue_max_bytes, demote = o.demote_idle_ms;
    long long debounce = o.snapshot_debounce_ms, flush_timeout = o.flush_timeout_ms;
    PyObject *device = Py_None;
    int keep_saved = 0, share = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|KzzzzKnpLpLLLzOpp", kwlist, &ram, &o.cold_dir,
                                     &o.cold.model_id, &o.cold.config_fingerprint,
                                     &o.cold.tokenizer_hash, &max_bytes, &n_layers, &no_verify,
                                     &queue, &write_behind, &demote, &debounce, &flush_timeout,
                                     &o.background_cpus, &device, &keep_saved, &share))
        return NULL;
    o.cold.keep_saved_cached = keep_saved;
    o.cold.share_prefixes = share;
    if (device != Py_None && !(o.device = kvtpy_device_of(device)))
        return NULL;
    o.ram_max_bytes = ram;
    if (max_bytes) /* 0: the default cap */
        o.cold.max_bytes = max_bytes;
    o.cold.n_layers = n_layers > 0 ? (size_t)n_layers : 0;
    o.cold.no_verify = no_verify;
    o.spill_queue_max_bytes = queue;
    o.write_behind = write_behind;
    o.demote_idle_ms = demote;
    o.snapshot_debounce_ms = debounce;
    o.flush_timeout_ms = flush_timeout;
    kvt_pcache *pc;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_pcache_open(&o, &pc);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return kvtpy_raise(rc);
    KvtPcache *self = PyObject_New(KvtPcache, &KvtPcache_Type);
    if (!self) {
        Py_BEGIN_ALLOW_THREADS
        kvt_pcache_close(pc);
        Py_END_ALLOW_THREADS
        return NULL;
    }
    self->pc = pc;
    self->in_use = 0;
    self->device = device != Py_None ? Py_NewRef(device) : NULL;
    return (PyObject *)self;
}

PyMethodDef kvtpy_pcache_functions[] = {
    {"pcache_open", (PyCFunction)(void (*)(void))py_pcache_open, METH_VARARGS | METH_KEYWORDS,
     NULL},
    {NULL, NULL, 0, NULL},
};

static void close_pcache(KvtPcache *self)
{
    kvt_pcache *pc = self->pc;
    self->pc = NULL;
    Py_BEGIN_ALLOW_THREADS /* waits for the write in flight */
    kvt_pcache_close(pc);
    Py_END_ALLOW_THREADS
}

static void pcache_dealloc(KvtPcache *self)
{
    if (self->pc)
        close_pcache(self);
    Py_XDECREF(self->device); /* after the close: the pool is the device's memory */
    PyObject_Free(self);
}

static PyObject *pcache_close(KvtPcache *self, PyObject *unused)
{
    (void)unused;
    if (self->in_use)
        return kvtpy_raise_msg(KVT_E_STATE, "prompt cache: close while another thread uses it");
    if (self->pc)
        close_pcache(self);
    Py_RETURN_NONE;
}

static PyObject *pcache_take(KvtPcache *self, PyObject *args)
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
    struct kvt_take t = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_pcache_take(self->pc, tok, n, ns, &t);
    Py_END_ALLOW_THREADS
    leave(self);
    PyBuffer_Release(&view);
    if (rc < 0)
        return kvtpy_raise(rc);
    if (!t.entry) {
        kvt_retain_release(t.retain);
        Py_RETURN_NONE;
    }
    PyObject *retain = Py_None;
    Py_INCREF(retain);
    if (t.retain) {
        Py_DECREF(retain);
        retain = retain_wrap(t.retain);
        if (!retain) {
            kvt_entry_free(t.entry);
            return NULL;
        }
    }
    PyObject *entry = kvtpy_entry_out(t.entry);
    if (!entry) {
        Py_DECREF(retain);
        return NULL;
    }
    return Py_BuildValue("(NNO)", entry, retain, t.from_disk ? Py_True : Py_False);
}

/* take_to_device(tokens, place, ns, layerwise): (header dict, from_disk[, DeviceTake]), or
 * None on a miss. */
static PyObject *pcache_take_to_device(KvtPcache *self, PyObject *args)
{
    PyObject *tokens, *place;
    const char *ns = NULL;
    int layerwise = 0;
    if (!PyArg_ParseTuple(args, "OO|zp", &tokens, &place, &ns, &layerwise))
        return NULL;
    if (!self->device)
        return kvtpy_raise_msg(-EINVAL, "prompt cache: opened without a device");
    Py_buffer view;
    const int32_t *tok;
    size_t n;
    if (kvtpy_tokens(tokens, &view, &tok, &n) < 0)
        return NULL;
    if (enter(self) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    bool from_disk = false;
    PyObject *pending = NULL;
    PyObject *h = kvtpy_pcache_take_to_device(self->pc, tok, n, ns, self->device, place, &from_disk,
                                              layerwise ? &pending : NULL);
    leave(self);
    PyBuffer_Release(&view);
    if (!h || h == Py_None) {
        Py_XDECREF(pending);
        return h;
    }
    if (pending)
        return Py_BuildValue("(NON)", h, from_disk ? Py_True : Py_False, pending);
    return Py_BuildValue("(NO)", h, from_disk ? Py_True : Py_False);
}

static PyObject *pcache_put(KvtPcache *self, PyObject *args)
{
    PyObject *tokens, *caches, *meta = Py_None, *retain = Py_None;
    if (!PyArg_ParseTuple(args, "OO|OO", &tokens, &caches, &meta, &retain))
        return NULL;
    if (retain != Py_None && !PyObject_TypeCheck(retain, &KvtRetain_Type))
        return PyErr_Format(PyExc_TypeError, "retain must come from a take");
    if (enter(self) < 0)
        return NULL;
    struct kvt_entry *e;
    if (kvtpy_entry_owned(tokens, caches, meta, &e) < 0) {
        leave(self);
        return NULL;
    }
    kvt_retain *r = NULL;
    if (retain != Py_None) {
        r = ((KvtRetain *)retain)->r; /* the put owns it now */
        ((KvtRetain *)retain)->r = NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_pcache_put(self->pc, e, r);
    Py_END_ALLOW_THREADS
    leave(self);
    if (rc < 0)
        return kvtpy_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *report_dict(const struct kvt_flush_report *r)
{
    return Py_BuildValue(
        "{s:O,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "durable", r->durable ? Py_True : Py_False,
        "pending_snapshots", (unsigned long long)r->pending_snapshots, "pending_spills",
        (unsigned long long)r->pending_spills, "pending_spill_bytes",
        (unsigned long long)r->pending_spill_bytes, "dropped", (unsigned long long)r->dropped,
        "failed", (unsigned long long)r->failed, "missing", (unsigned long long)r->missing,
        "entries", (unsigned long long)r->entries, "longest_durable_prefix_tokens",
        (unsigned long long)r->longest_durable_prefix_tokens);
}

static PyObject *pcache_flush(KvtPcache *self, PyObject *args)
{
    long long timeout = -1;
    if (!PyArg_ParseTuple(args, "|L", &timeout))
        return NULL;
    if (enter(self) < 0)
        return NULL;
    struct kvt_flush_report r = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_pcache_flush(self->pc, timeout, &r);
    Py_END_ALLOW_THREADS
    leave(self);
    PyObject *d = report_dict(&r);
    if (!d)
        return NULL;
    return Py_BuildValue("(iN)", rc, d); /* the wrapper raises on a timeout, with the report */
}

static PyObject *pcache_stats(KvtPcache *self, PyObject *unused)
{
    (void)unused;
    if (enter(self) < 0)
        return NULL;
    struct kvt_pcache_stats st;
    Py_BEGIN_ALLOW_THREADS
    kvt_pcache_get_stats(self->pc, &st);
    Py_END_ALLOW_THREADS
    leave(self);
    PyObject *cold = st.has_cold ? kvtpy_store_stats_dict(&st.cold) : Py_NewRef(Py_None);
    if (!cold)
        return NULL;
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:N}", "records", (unsigned long long)st.records,
        "total_bytes", (unsigned long long)st.total_bytes, "hits", (unsigned long long)st.hits,
        "misses", (unsigned long long)st.misses, "demotions", (unsigned long long)st.demotions,
        "pending_spills", (unsigned long long)st.pending_spills, "pending_spill_bytes",
        (unsigned long long)st.pending_spill_bytes, "dropped_spills",
        (unsigned long long)st.dropped_spills, "failed_spills",
        (unsigned long long)st.failed_spills, "pending_snapshots",
        (unsigned long long)st.pending_snapshots, "cold", cold);
}

static PyObject *pcache_demote_idle(KvtPcache *self, PyObject *args)
{
    long long idle_ms = 0, now_ms = 0;
    if (!PyArg_ParseTuple(args, "|LL", &idle_ms, &now_ms))
        return NULL;
    if (enter(self) < 0)
        return NULL;
    size_t n;
    Py_BEGIN_ALLOW_THREADS
    n = kvt_pcache_demote_idle(self->pc, idle_ms, now_ms);
    Py_END_ALLOW_THREADS
    leave(self);
    return PyLong_FromSize_t(n);
}

static PyObject *pcache_clear(KvtPcache *self, PyObject *unused)
{
    (void)unused;
    if (enter(self) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    kvt_pcache_clear(self->pc);
    Py_END_ALLOW_THREADS
    leave(self);
    Py_RETURN_NONE;
}

static PyObject *tokens_query(KvtPcache *self, PyObject *args, bool exact)
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
    size_t r;
    Py_BEGIN_ALLOW_THREADS
    r = exact ? kvt_pcache_find_exact(self->pc, tok, n, ns)
              : kvt_pcache_peek_prefix_len(self->pc, tok, n, ns);
    Py_END_ALLOW_THREADS
    leave(self);
    PyBuffer_Release(&view);
    return exact ? PyBool_FromLong((long)r) : PyLong_FromSize_t(r);
}

static PyObject *pcache_peek(KvtPcache *self, PyObject *args)
{
    return tokens_query(self, args, false);
}

static PyObject *pcache_find_exact(KvtPcache *self, PyObject *args)
{
    return tokens_query(self, args, true);
}

static PyObject *pcache_cold_list(KvtPcache *self, PyObject *unused)
{
    (void)unused;
    if (enter(self) < 0)
        return NULL;
    kvt_store *s = kvt_pcache_store(self->pc);
    PyObject *r = s ? kvtpy_store_list(s) : PyList_New(0);
    leave(self);
    return r;
}

static PyObject *pcache_get_closed(KvtPcache *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(self->pc == NULL);
}

static PyMethodDef pcache_methods[] = {
    {"close", (PyCFunction)pcache_close, METH_NOARGS, NULL},
    {"take", (PyCFunction)pcache_take, METH_VARARGS, NULL},
    {"take_to_device", (PyCFunction)pcache_take_to_device, METH_VARARGS, NULL},
    {"put", (PyCFunction)pcache_put, METH_VARARGS, NULL},
    {"flush", (PyCFunction)pcache_flush, METH_VARARGS, NULL},
    {"stats", (PyCFunction)pcache_stats, METH_NOARGS, NULL},
    {"demote_idle", (PyCFunction)pcache_demote_idle, METH_VARARGS, NULL},
    {"clear", (PyCFunction)pcache_clear, METH_NOARGS, NULL},
    {"peek_prefix_len", (PyCFunction)pcache_peek, METH_VARARGS, NULL},
    {"find_exact", (PyCFunction)pcache_find_exact, METH_VARARGS, NULL},
    {"cold_list", (PyCFunction)pcache_cold_list, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef pcache_getset[] = {
    {"closed", (getter)pcache_get_closed, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* PyVarObject_HEAD_INIT ends in a comma, which clang-format cannot know */
/* clang-format off */
PyTypeObject KvtPcache_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvtier._ext.PromptCache",
    .tp_basicsize = sizeof(KvtPcache),
    .tp_dealloc = (destructor)pcache_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A prompt cache (use kvtier.PromptCache).",
    .tp_methods = pcache_methods,
    .tp_getset = pcache_getset,
};
/* clang-format on */
