/*
 * What both device benches share: the read limit of a file, and the command line: [--host] [--dir
 * D] [--size 256M,1G,4G]
 * [--repeat N], the device opened (CUDA device 0, or the host stand-in), each size run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

double bench_read_limit(const char *path, void *buf, uint64_t bytes, bool cold)
{
    if (cold ? bench_make_cold(path) : bench_make_warm(path))
        return -1;
    struct bench_span s = {buf, 0, (size_t)bytes};
    double secs;
    bool direct;
    if (cold)
        return bench_raw_read(path, &s, 1, &secs, &direct) ? -1 : secs;
    FILE *f = fopen(path, "rb");
    double t0 = bench_now();
    size_t got = f ? fread(buf, 1, (size_t)bytes, f) : 0;
    secs = bench_now() - t0;
    if (f)
        fclose(f);
    return got == bytes ? secs : -1;
}

static uint64_t parse_size(const char *s)
{
    char *end;
    uint64_t v = strtoull(s, &end, 10);
    return *end == 'G' ? v << 30 : *end == 'M' ? v << 20 : *end == 'K' ? v << 10 : v;
}

int bench_device_main(int argc, char **argv, const struct bench_device_prog *p)
{
    const char *dir = p->dir, *sizes = "256M,1G,4G";
    int repeat = 5;
    bool host = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--host") == 0)
            host = true;
        else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
            dir = argv[++i];
        else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc)
            sizes = argv[++i];
        else if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--host] [--dir D] [--size 256M,1G,4G] [--repeat N]\n",
                    p->name);
            return 2;
        }
    }
    if (repeat < 1 || repeat > p->max_repeat)
        return 2;
    kvt_device *d;
    int rc = host ? kvt_device_open_host(NULL, &d) : kvt_device_open_cuda(0, NULL, &d);
    if (rc) {
        fprintf(stderr, "%s: %s\n", p->name, kvt_last_error());
        return rc == KVT_E_UNSUPPORTED ? 77 : 1;
    }
    p->header(d, repeat);
    char *list = strdup(sizes);
    for (char *t = strtok(list, ","); t && rc == 0; t = strtok(NULL, ","))
        rc = p->run_size(d, dir, parse_size(t), repeat);
    free(list);
    kvt_device_close(d);
    return rc ? 1 : 0;
}
