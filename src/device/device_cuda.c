/*
 * CUDA devices through the driver API, loaded at run time: the library needs no toolkit to
 * build and runs where there is no GPU, where opening a CUDA device reports "unavailable".
 * One stream per device carries every copy in order; an event per staging slot tells when
 * the copies queued from that slot are done. A second, non-blocking stream carries the copies
 * of layer-wise takes, each tensor's followed by an event the caller's stream waits for. Staging is
 * page-locked (cuMemHostAlloc), which is what lets host-to-device copies run at the bus's speed and
 * overlap the next read.
 */
#include "device/device_parts.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef unsigned long long CUdeviceptr;

/* CUDA_MEMCPY2D of the driver API (cuda.h); memory types 1 host, 2 device. */
typedef struct {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;

struct cuda_api {
    void *lib;
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*PrimaryCtxRelease)(CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*MemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
    CUresult (*Memcpy2DAsync)(const CUDA_MEMCPY2D *, CUstream);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
};

struct cuda_dev {
    struct cuda_api api;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    CUevent ev[KVT_DEVICE_MAX_SLOTS];
    /* the side stream (non-blocking: the legacy default stream's later work does not wait
     * for it), the one copies go to now, and the event that orders it after the legacy one */
    CUstream side, cur;
    CUevent legacy;
};

#define CU_STREAM_LEGACY ((CUstream)0x1)

static int cu_fail(const struct cuda_api *a, CUresult r, const char *what)
{
    const char *s = NULL;
    if (a->GetErrorString)
        a->GetErrorString(r, &s);
    return kvt_fail(-EIO, "cuda: %s: error %d (%s)", what, r, s ? s : "unknown");
}

#define CU(dv, call, what)                                                                         \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_)                                                                                    \
            return cu_fail(&(dv)->api, r_, what);                                                  \
    } while (0)

static int load_api(struct cuda_api *a)
{
    a->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!a->lib)
        return kvt_fail(KVT_E_UNSUPPORTED, "cuda: unavailable: libcuda.so.1 cannot be loaded (no "
                                           "NVIDIA driver on this machine)");
    static const char *const names[] = {"cuInit",
                                        "cuDeviceGet",
                                        "cuDeviceGetName",
                                        "cuDevicePrimaryCtxRetain",
                                        "cuDevicePrimaryCtxRelease_v2",
                                        "cuCtxSetCurrent",
                                        "cuMemAlloc_v2",
                                        "cuMemFree_v2",
                                        "cuMemHostAlloc",
                                        "cuMemFreeHost",
                                        "cuMemcpyHtoDAsync_v2",
                                        "cuMemcpyDtoHAsync_v2",
                                        "cuStreamCreate",
                                        "cuStreamDestroy_v2",
                                        "cuEventCreate",
                                        "cuEventRecord",
                                        "cuEventSynchronize",
                                        "cuEventDestroy_v2",
                                        "cuGetErrorString",
                                        "cuMemGetAddressRange_v2",
                                        "cuMemcpy2DAsync_v2",
                                        "cuStreamWaitEvent"};
    void **slots = (void **)&a->Init;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        slots[i] = dlsym(a->lib, names[i]);
        if (!slots[i]) {
            dlclose(a->lib);
            return kvt_fail(KVT_E_UNSUPPORTED, "cuda: unavailable: the driver lacks %s", names[i]);
        }
    }
    return 0;
}

static int alloc(kvt_device *d, size_t bytes, uint64_t *addr)
{
    struct cuda_dev *c = d->impl;
    c->api.CtxSetCurrent(c->ctx); /* the calling thread may not have it */
    CUdeviceptr p;
    CU(c, c->api.MemAlloc(&p, bytes ? bytes : 1), "cuMemAlloc");
    *addr = p;
    return 0;
}

static void dfree(kvt_device *d, uint64_t addr)
{
    struct cuda_dev *c = d->impl;
    c->api.CtxSetCurrent(c->ctx);
    c->api.MemFree((CUdeviceptr)addr);
}

static int range(kvt_device *d, uint64_t addr, uint64_t *base, size_t *size)
{
    struct cuda_dev *c = d->impl;
    c->api.CtxSetCurrent(c->ctx);
    CUdeviceptr b;
    CU(c, c->api.MemGetAddressRange(&b, size, (CUdeviceptr)addr), "cuMemGetAddressRange");
    *base = b;
    return 0;
}

static int host_alloc(kvt_device *d, size_t bytes, void **out)
{
    struct cuda_dev *c = d->impl;
    c->api.CtxSetCurrent(c->ctx);
    CU(c, c->api.MemHostAlloc(out, bytes, 0), "cuMemHostAlloc (page-locked staging)");
    return 0;
}

static void host_free(kvt_device *d, void *p)
{
    struct cuda_dev *c = d->impl;
    c->api.CtxSetCurrent(c->ctx);
    c->api.MemFreeHost(p);
}

static int h2d(kvt_device *d, uint64_t dst, const void *src, size_t n, unsigned slot)
{
    struct cuda_dev *c = d->impl;
    c->api.CtxSetCurrent(c->ctx);
    CU(c, c->api.MemcpyHtoDAsync((CUdeviceptr)dst, src, n, c->cur), "cuMemcpyHtoDAsync");
    if (slot < KVT_DEVICE_MAX_SLOTS)
        CU(c, c->api.EventRecord(c->ev[slot], c->cur), "cuEventRecord");
    return 0;
}

static int h2d_rows(kvt_device *d, uint64_t dst, const void *src, size_t pitch, size_t dpitch,
                    size_t n, size_t rows, unsigned slot)
{
    struct cuda_dev *c = d->impl;
    c->api.CtxSetCurrent(c->ctx);
    CUDA_MEMCPY2D m = {.srcMemoryType = 1 /* host */,
                       .srcHost = src,
                       .srcPitch = pitch,
                       .dstMemoryType = 2 /* device */,
                       .dstDevice = (CUdeviceptr)dst,
                       .dstPitch = dpitch,
                       .WidthInBytes = n,
                       .Height = rows};
    CU(c, c->api.Memcpy2DAsync(&m, c->cur), "cuMemcpy2DAsync");
    if (slot < KVT_DEVICE_MAX_SLOTS)
        CU(c, c->api.EventRecord(c->ev[slot], c->cur), "cuEventRecord");
    return 0;
}

static int d2h(kvt_device *d, void *dst, uint64_t src, size_t n, unsigned slot)
{
    struct cuda_dev *c = d->impl;
    c->api.CtxSetCurrent(c->ctx);
    CU(c, c->api.MemcpyDtoHAsync(dst, (CUdeviceptr)src, n, c->cur), "cuMemcpyDtoHAsync");
    if (slot < KVT_DEVICE_MAX_SLOTS)
        CU(c, c->api.EventRecord(c->ev[slot], c->cur), "cuEventRecord");
    return 0;
}

static int wait_slot(kvt_device *d, unsigned slot)
{
    struct cuda_dev *c = d->impl;
    c->api.CtxSetCurrent(c->ctx);
    CU(c, c->api.EventSynchronize(c->ev[slot]), "cuEventSynchronize");
    return 0;
}

static int side(kvt_device *d, bool on)
{
    struct cuda_dev *c = d->impl;
    c->api.CtxSetCurrent(c->ctx);
    c->cur = on ? c->side : c->stream;
    if (on) {
        CU(c, c->api.EventRecord(c->legacy, CU_STREAM_LEGACY), "cuEventRecord");
        CU(c, c->api.StreamWaitEvent(c->side, c->legacy, 0), "cuStreamWaitEvent");
    }
    return 0;
}

static int mark(kvt_device *d, void **ev)
{
    struct cuda_dev *c = d->impl;
    c->api.CtxSetCurrent(c->ctx);
    CUevent e;
    CU(c, c->api.EventCreate(&e, 2 /* CU_EVENT_DISABLE_TIMING */), "cuEventCreate");
    CUresult r = c->api.EventRecord(e, c->cur);
    if (r) {
        c->api.EventDestroy(e);
        return cu_fail(&c->api, r, "cuEventRecord");
    }
    *ev = e;
    return 0;
}

static int mark_wait(kvt_device *d, void *ev, uint64_t stream)
{
    struct cuda_dev *c = d->impl;
    c->api.CtxSetCurrent(c->ctx);
    CU(c, c->api.StreamWaitEvent((CUstream)(uintptr_t)stream, ev, 0), "cuStreamWaitEvent");
    return 0;
}

static int mark_sync(kvt_device *d, void *ev)
{
    struct cuda_dev *c = d->impl;
    c->api.CtxSetCurrent(c->ctx);
    CU(c, c->api.EventSynchronize(ev), "cuEventSynchronize");
    return 0;
}

static void mark_free(kvt_device *d, void *ev)
{
    struct cuda_dev *c = d->impl;
    c->api.EventDestroy(ev);
}

static void close_dev(kvt_device *d)
{
    struct cuda_dev *c = d->impl;
    if (c->legacy)
        c->api.EventDestroy(c->legacy);
    if (c->side)
        c->api.StreamDestroy(c->side);
    for (unsigned k = 0; k < KVT_DEVICE_MAX_SLOTS; k++)
        if (c->ev[k])
            c->api.EventDestroy(c->ev[k]);
    if (c->stream)
        c->api.StreamDestroy(c->stream);
    if (c->ctx)
        c->api.PrimaryCtxRelease(c->dev);
    dlclose(c->api.lib);
    free(c);
}

static const struct kvt_device_ops cuda_ops = {
    .alloc = alloc,
    .free = dfree,
    .range = range,
    .host_alloc = host_alloc,
    .host_free = host_free,
    .h2d = h2d,
    .d2h = d2h,
    .h2d_rows = h2d_rows,
    .wait = wait_slot,
    .side = side,
    .mark = mark,
    .mark_wait = mark_wait,
    .mark_sync = mark_sync,
    .mark_free = mark_free,
    .close = close_dev,
};

static int setup(struct cuda_dev *c, int ordinal, kvt_device *d)
{
    CU(c, c->api.Init(0), "cuInit");
    CU(c, c->api.DeviceGet(&c->dev, ordinal), "cuDeviceGet");
    CU(c, c->api.PrimaryCtxRetain(&c->ctx, c->dev), "cuDevicePrimaryCtxRetain");
    CU(c, c->api.CtxSetCurrent(c->ctx), "cuCtxSetCurrent");
    /* a blocking stream: its copies wait for work queued before on the legacy default stream
     * (torch's, unless told otherwise), so a save reads finished tensors and a restore does
     * not overtake the work of memory's previous user */
    CU(c, c->api.StreamCreate(&c->stream, 0 /* CU_STREAM_DEFAULT */), "cuStreamCreate");
    for (unsigned k = 0; k < KVT_DEVICE_MAX_SLOTS; k++)
        CU(c, c->api.EventCreate(&c->ev[k], 2 /* CU_EVENT_DISABLE_TIMING */), "cuEventCreate");
    CU(c, c->api.StreamCreate(&c->side, 1 /* CU_STREAM_NON_BLOCKING */), "cuStreamCreate");
    CU(c, c->api.EventCreate(&c->legacy, 2 /* CU_EVENT_DISABLE_TIMING */), "cuEventCreate");
    c->cur = c->stream;
    char name[96] = "";
    c->api.DeviceGetName(name, sizeof(name), c->dev);
    snprintf(d->name, sizeof(d->name), "cuda:%d %s", ordinal, name);
    return 0;
}

int kvt_device_cuda_open(int ordinal, kvt_device *d)
{
    struct cuda_dev *c = calloc(1, sizeof(*c));
    if (!c)
        return kvt_fail(-ENOMEM, "out of memory");
    int rc = load_api(&c->api);
    if (rc) {
        free(c);
        return rc;
    }
    d->impl = c;
    d->ops = &cuda_ops;
    rc = setup(c, ordinal, d);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", kvt_last_error());
        close_dev(d);
        d->impl = NULL;
        /* no device, or a driver without one: the same "unavailable" as no driver at all */
        return kvt_fail(KVT_E_UNSUPPORTED, "cuda: unavailable: %s", msg);
    }
    return 0;
}
