/* Small helpers shared by the CLI commands: error printing, number and list parsing, JSON. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_error(const char *what, int rc)
{
    const char *msg = kvt_last_error();
    fprintf(stderr, "kvtier: %s: %s\n", what, msg[0] ? msg : kvt_strerror(rc));
    return EXIT_USAGE;
}

bool cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return true;
    return false;
}

int cli_usage(FILE *f, const char *usage, int status)
{
    fprintf(f, "usage: kvtier %s\n", usage);
    return status;
}

bool cli_parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-')
        return false;
    unsigned shift = 0;
    switch (*end) {
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    case 't':
    case 'T':
        shift = 40;
        end++;
        break;
    default: break;
    }
    if (*end == 'i' || *end == 'B')
        end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    if (*end != '\0' || (shift && v > (UINT64_MAX >> shift)))
        return false;
    *out = (uint64_t)v << shift;
    return true;
}

bool cli_parse_tokens(const char *s, int32_t **out, size_t *n)
{
    size_t cap = 16, len = 0;
    int32_t *v = malloc(cap * sizeof(*v));
    const char *p = s;
    while (v && *p) {
        char *end;
        errno = 0;
        long t = strtol(p, &end, 10);
        if (errno || end == p || t < 0 || t > INT32_MAX || (*end && *end != ','))
            break;
        if (len == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof(*v));
            if (!nv)
                break;
            v = nv;
        }
        v[len++] = (int32_t)t;
        p = *end ? end + 1 : end;
        if (*p == '\0' && *end == ',')
            break; /* trailing comma */
        if (*p == '\0') {
            *out = v;
            *n = len;
            return true;
        }
    }
    free(v);
    return false;
}

void cli_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        default:
            if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}
