/*
 * The process's CUDA devices: the one kvt_device per ordinal that DLPack tensors handed in
 * live on and that Device objects of an ordinal share, opened at first use and never closed.
 */
#include "ext.h"

#include <errno.h>

#define MAX_ORDINALS 64

static kvt_device *cuda_by_ordinal[MAX_ORDINALS];

kvt_device *kvtpy_cuda_device(int ordinal)
{
    if (ordinal < 0 || ordinal >= MAX_ORDINALS) {
        kvtpy_raise_msg(-EINVAL, "CUDA device ordinal out of range");
        return NULL;
    }
    if (!cuda_by_ordinal[ordinal]) { /* under the GIL: opened once */
        int rc = kvt_device_open_cuda(ordinal, NULL, &cuda_by_ordinal[ordinal]);
        if (rc) {
            kvtpy_raise(rc);
            return NULL;
        }
    }
    return cuda_by_ordinal[ordinal];
}
