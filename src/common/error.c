/*
 * kvt_version(), kvt_strerror() and the per-thread message of the last failed call. A
 * thread-local buffer keeps the library print-free and lock-free while still saying what went
 * wrong and where.
 */
#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MSG_MAX 1024

static _Thread_local char last_msg[MSG_MAX];

#define STR2(x) #x
#define STR(x) STR2(x)

const char *kvt_version(void)
{
    return STR(KVT_VERSION_MAJOR) "." STR(KVT_VERSION_MINOR) "." STR(KVT_VERSION_PATCH);
}

const char *kvt_strerror(int code)
{
    switch (code) {
    case 0: return "success";
    case KVT_E_FORMAT: return "not an .mlxkv file";
    case KVT_E_CORRUPT: return "corrupt or inconsistent file";
    case KVT_E_MISMATCH:
        return "entry belongs to another model, tokenizer, namespace or layer layout";
    case KVT_E_UNSUPPORTED: return "unsupported format version, kind, dtype or feature";
    case KVT_E_TOO_LARGE: return "entry exceeds the byte cap";
    case KVT_E_STATE: return "operation not allowed in the current state";
    case KVT_E_REFUSED: return "the engine refused the step";
    case KVT_E_TIMEOUT: return "timed out";
    default: break;
    }
    if (code < 0 && code > -4096) {
        const char *s = strerror(-code);
        return s ? s : "system error";
    }
    return "unknown error";
}

const char *kvt_last_error(void)
{
    return last_msg;
}

int kvt_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_msg, sizeof(last_msg), fmt, ap);
    va_end(ap);
    return code;
}

int kvt_set_error(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_msg, sizeof(last_msg), fmt, ap);
    va_end(ap);
    return code;
}

int kvt_fail_prefix(int code, const char *prefix)
{
    char tmp[MSG_MAX];
    const char *msg = last_msg[0] ? last_msg : kvt_strerror(code);
    size_t np = strnlen(prefix, MSG_MAX - 3);
    memcpy(tmp, prefix, np);
    memcpy(tmp + np, ": ", 2);
    size_t nm = strnlen(msg, MSG_MAX - np - 3);
    memcpy(tmp + np + 2, msg, nm);
    tmp[np + 2 + nm] = '\0';
    memcpy(last_msg, tmp, np + 3 + nm);
    return code;
}

void kvt_clear_error(void)
{
    last_msg[0] = '\0';
}

void kvt_log_vline(kvt_log_fn log, void *ud, int level, const char *fmt, va_list ap)
{
    if (!log)
        return;
    char buf[1024];
    vsnprintf(buf, sizeof(buf), fmt, ap);
    log(ud, level, buf);
}

void kvt_log_line(kvt_log_fn log, void *ud, int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvt_log_vline(log, ud, level, fmt, ap);
    va_end(ap);
}
