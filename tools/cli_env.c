/*
 * The CLI's environment: the KVT_* variables operators and the benchmark use, mapped onto
 * the library's process settings (struct kvt_mem_opts) before any command runs. The library
 * itself reads no environment.
 *   KVT_BUF_CACHE=N[K|M|G]   buffer cache limit (0: keep nothing)
 *   KVT_HUGEPAGE=0           no huge pages
 *   KVT_IO_PREFAULT=0        no restore helper thread
 *   KVT_IO_PARALLEL=0        warm restores one slot at a time
 *   KVT_IO_DIRECT=0          no O_DIRECT
 *   KVT_IO_ENGINE=io_uring|threads
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static bool off(const char *name)
{
    const char *v = getenv(name);
    return v && !strcmp(v, "0");
}

int cli_env_apply(void)
{
    struct kvt_mem_opts m;
    kvt_mem_opts_init(&m);
    uint64_t bytes;
    const char *v = getenv("KVT_BUF_CACHE");
    if (v && cli_parse_size(v, &bytes) && bytes <= INT64_MAX) /* anything else is ignored */
        m.buf_cache_bytes = bytes ? (int64_t)bytes : -1;
    m.no_hugepages = off("KVT_HUGEPAGE");
    m.no_helper = off("KVT_IO_PREFAULT");
    m.no_parallel = off("KVT_IO_PARALLEL");
    m.no_direct = off("KVT_IO_DIRECT");
    v = getenv("KVT_IO_ENGINE");
    if (v && (!strcmp(v, "io_uring") || !strcmp(v, "threads")))
        m.io_engine = v;
    return kvt_mem_configure(&m);
}
