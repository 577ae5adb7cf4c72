/*
 * The legacy DLPack ABI (v0.6-v0.8, capsule name "dltensor"): the one torch 1.13 and numpy
 * 1.24 exchange. Declared here so the build needs no dlpack headers; the layout is frozen.
 */
#ifndef KVTPY_DLPACK_ABI_H
#define KVTPY_DLPACK_ABI_H

#include <stddef.h>
#include <stdint.h>

enum { KVTPY_DL_CPU = 1, KVTPY_DL_CUDA = 2 };
enum {
    KVTPY_DL_INT = 0,
    KVTPY_DL_UINT = 1,
    KVTPY_DL_FLOAT = 2,
    KVTPY_DL_BFLOAT = 4,
    KVTPY_DL_COMPLEX = 5,
    KVTPY_DL_BOOL = 6
};

typedef struct {
    int32_t device_type;
    int32_t device_id;
} DLDevice;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL = C-contiguous */
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* Whether @p t is C-contiguous; *@p bytes receives its size. (import.c) */
int kvtpy_dl_contiguous(const DLTensor *t, size_t *bytes);
/* The kvtier dtype of DLPack type @p t, or -1. (import.c) */
int kvtpy_dl_dtype(DLDataType t);

#endif
