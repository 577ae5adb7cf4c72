/*
 * The dtype table: mlx-c codes (FORMAT.md §4), item sizes and names.
 */
#include "kvtier.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[KVT_DTYPE_COUNT] = {
    [KVT_BOOL] = {"bool", 1},         [KVT_UINT8] = {"uint8", 1},
    [KVT_UINT16] = {"uint16", 2},     [KVT_UINT32] = {"uint32", 4},
    [KVT_UINT64] = {"uint64", 8},     [KVT_INT8] = {"int8", 1},
    [KVT_INT16] = {"int16", 2},       [KVT_INT32] = {"int32", 4},
    [KVT_INT64] = {"int64", 8},       [KVT_FLOAT16] = {"float16", 2},
    [KVT_FLOAT32] = {"float32", 4},   [KVT_FLOAT64] = {"float64", 8},
    [KVT_BFLOAT16] = {"bfloat16", 2}, [KVT_COMPLEX64] = {"complex64", 8},
};

size_t kvt_dtype_size(int dtype)
{
    if (dtype < 0 || dtype >= KVT_DTYPE_COUNT)
        return 0;
    return dtypes[dtype].size;
}

bool kvt_dtype_is_activation(int dtype)
{
    return dtype == KVT_FLOAT16 || dtype == KVT_FLOAT32 || dtype == KVT_BFLOAT16;
}

const char *kvt_dtype_name(int dtype)
{
    if (dtype < 0 || dtype >= KVT_DTYPE_COUNT)
        return "unknown";
    return dtypes[dtype].name;
}
