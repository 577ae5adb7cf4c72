/*
 * kvtier CLI entry point: dispatches to the command groups in tools/cmd_*.c.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static int cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("kvtier %s\n", kvt_version());
    return 0;
}

static const struct cli_command commands[] = {
    {"version", "version", cmd_version},
    {"inspect", "inspect FILE [--json]", cmd_inspect},
    {"verify", "verify PATH... [--json] [--no-hashes]", cmd_verify},
    {"synth", "synth OUT --kind KIND|mixed [options]", cmd_synth},
    {"ls", "ls DIR | --redis URL [--json] [--ns NS]", cmd_store_ls},
    {"find", "find DIR --tokens 1,2,3 [--ns NS] [--json]", cmd_store_find},
    {"gc", "gc DIR | --redis URL [--max-bytes N] [--dry-run] [--remove-skipped]", cmd_store_gc},
    {"stats", "stats DIR | --redis URL [--json]", cmd_store_stats},
    {"bench", "bench [--dir D] [--size 64M,1G] [--repeat N] [--json [F]] [--plot F] [--peers]",
     cmd_bench},
    {"demo", "demo [--dir D] [--turns N] [--tokens T] [--prefill-tps R]", cmd_demo},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvtier COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  kvtier %s\n", commands[i].usage);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "-h") || !strcmp(name, "--help") || !strcmp(name, "help")) {
        usage(stdout);
        return 0;
    }
    int rc = cli_env_apply();
    if (rc < 0)
        return cli_error("environment", rc);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(name, commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvtier: unknown command '%s'\n", name);
    usage(stderr);
    return EXIT_USAGE;
}
