/*
 * `kvtier bench`: the options; the run itself is the benchmark harness's (bench/harness/,
 * bench_run()).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bench.h"
#include "cli.h"

#define DEFAULT_REPEAT 5

static int parse_sizes(const char *s, struct bench_opts *o)
{
    char *copy = strdup(s), *save = NULL;
    int rc = copy ? 0 : -ENOMEM;
    o->n_sizes = 0;
    for (char *t = copy ? strtok_r(copy, ",", &save) : NULL; t && rc == 0;
         t = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (o->n_sizes == BENCH_MAX_SIZES || !cli_parse_size(t, &v) || v == 0)
            rc = -EINVAL;
        else
            o->sizes[o->n_sizes++] = v;
    }
    free(copy);
    return rc == 0 && o->n_sizes > 0 ? 0 : -EINVAL;
}

/* @p msg, then the usage, to @p f (stdout when asked for with --help); returns EXIT_USAGE. */
static int usage_to(FILE *f, const char *msg)
{
    fprintf(f, "kvtier bench: %s\n", msg);
    return cli_usage(f,
                     "bench [--dir D] [--size BYTES[,BYTES...]] [--repeat N] "
                     "[--json FILE|--json] [--plot FILE.png|FILE.svg] [--peers] "
                     "[--python PATH] [--peer-script PATH]",
                     EXIT_USAGE);
}

static int usage_error(const char *msg)
{
    return usage_to(stderr, msg);
}

static int parse_args(int argc, char **argv, struct bench_opts *o)
{
    static const uint64_t defaults[] = {64ull << 20,  128ull << 20, 256ull << 20,
                                        512ull << 20, 1ull << 30,   2ull << 30};
    memset(o, 0, sizeof(*o));
    o->dir = ".";
    o->repeat = DEFAULT_REPEAT;
    o->python = "/usr/bin/python3";
    o->n_sizes = sizeof(defaults) / sizeof(defaults[0]);
    memcpy(o->sizes, defaults, sizeof(defaults));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--dir") && next) {
            o->dir = argv[++i];
        } else if (!strcmp(a, "--size") && next) {
            if (parse_sizes(argv[++i], o) < 0)
                return usage_error("bad --size (e.g. 64M,1G)");
        } else if (!strcmp(a, "--repeat") && next) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > BENCH_MAX_REPEAT)
                return usage_error("--repeat must be 1..64");
            o->repeat = (int)v;
        } else if (!strcmp(a, "--json")) {
            o->json_path =
                (next && next[0] != '-') || (next && !strcmp(next, "-")) ? argv[++i] : "-";
        } else if (!strncmp(a, "--json=", 7)) {
            o->json_path = a + 7;
        } else if (!strcmp(a, "--plot") && next) {
            o->plot_path = argv[++i];
        } else if (!strcmp(a, "--peers")) {
            o->peers = true;
        } else if (!strcmp(a, "--python") && next) {
            o->python = argv[++i];
        } else if (!strcmp(a, "--peer-script") && next) {
            o->peer_script = argv[++i];
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage_to(stdout, "save/restore throughput against same-run device limits");
            return -1;
        } else {
            return usage_error("unknown or incomplete option");
        }
    }
    if (o->plot_path) {
        const char *ext = strrchr(o->plot_path, '.');
        if (!ext || (strcasecmp(ext, ".png") && strcasecmp(ext, ".svg")))
            return usage_error("--plot wants a .png or .svg file");
    }
    return 0;
}

int cmd_bench(int argc, char **argv)
{
    struct bench_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    return bench_run(&o) == 0 ? 0 : EXIT_USAGE;
}
