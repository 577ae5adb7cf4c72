/*
 * Error plumbing shared by every layer: the thread-local "last error" message behind
 * kvt_last_error(), and small helpers to set it while returning a code.
 */
#ifndef KVT_ERROR_H
#define KVT_ERROR_H

#include <stdarg.h>

#include "kvtier.h"

/** Set this thread's message (printf format) and return @p code, so callers can `return`. */
int kvt_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Prefix the current message with "<prefix>: " (e.g. the file path); returns @p code. */
int kvt_fail_prefix(int code, const char *prefix);
/** Clear this thread's message. */
void kvt_clear_error(void);

/** Format one line and send it to @p log (no-op when NULL): the tier's and the remote's logs. */
void kvt_log_line(kvt_log_fn log, void *ud, int level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void kvt_log_vline(kvt_log_fn log, void *ud, int level, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

#endif
