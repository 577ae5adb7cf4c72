/*
 * The kvtier command-line tool: one file per command group, all on the public API only.
 * Exit codes: 0 success, 1 a checked thing is bad (corrupt file, miss where one was asked
 * about), 2 usage or I/O error.
 */
#ifndef KVT_CLI_H
#define KVT_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kvtier.h"

#define EXIT_BAD 1
#define EXIT_USAGE 2

struct cli_command {
    const char *name;
    const char *usage;
    int (*run)(int argc, char **argv); /* argv[0] is the command name */
};

/* Command groups (tools/cmd_*.c). */
int cmd_inspect(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_store_ls(int argc, char **argv);
int cmd_store_find(int argc, char **argv);
int cmd_store_gc(int argc, char **argv);
int cmd_store_stats(int argc, char **argv);
int cmd_bench(int argc, char **argv);
/** ls / stats / gc of a remote tier (tools/cmd_remote.c); argv[0] names the command, @p usage
 *  is the command's usage (printed on bad arguments). */
int cmd_remote(int argc, char **argv, const char *usage);
/** Whether the arguments name a remote (--redis URL). */
bool cli_has_redis(int argc, char **argv);
int cmd_demo(int argc, char **argv);

/** Map the KVT_* environment onto the library's process settings (tools/cli_env.c). */
int cli_env_apply(void);

/* Shared helpers (tools/cli_util.c). */
/** Whether the arguments after the command ask for its usage (-h, --help). */
bool cli_wants_help(int argc, char **argv);
/** Print "usage: kvtier <usage>" to @p f; returns @p status. */
int cli_usage(FILE *f, const char *usage, int status);
/** Print "kvtier: <what>: <message>" to stderr for a failed library call; returns EXIT_USAGE. */
int cli_error(const char *what, int rc);
/** Parse a size with an optional K/M/G/T (binary) suffix; false on junk. */
bool cli_parse_size(const char *s, uint64_t *out);
/** Parse a comma-separated token list ("1,2,3"); caller frees *out. */
bool cli_parse_tokens(const char *s, int32_t **out, size_t *n);
/** Write @p s as a JSON string literal (with quotes) to @p f. */
void cli_json_string(FILE *f, const char *s);

#endif
