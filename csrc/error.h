/* error.h — setting the thread-local failure detail that ruccl_last_error() returns. */
#ifndef RUCCL_ERROR_H
#define RUCCL_ERROR_H

#include "ruccl.h"

#if defined(__GNUC__)
#define RUCCL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define RUCCL_PRINTF(a, b)
#endif

/* Records "NAME: detail" as this thread's last error and returns code, so that a
   failure path reads `return ruccl_fail(RUCCL_ERR_X, "...", ...);`. */
ruccl_result_t ruccl_fail(ruccl_result_t code, const char *fmt, ...) RUCCL_PRINTF(2, 3);

/* This thread's last error without its "NAME: " prefix: the reason a caller quotes
   in a message of its own. */
const char *ruccl_last_error_detail(void);

/* Sets this thread's last error to an already formatted message (no prefix added). */
void ruccl_set_last_error(const char *msg);

/* Debug logging, switched on by RUCCL_DEBUG=INFO|WARN (never by recompiling). */
int ruccl_debug_enabled(int level); /* 1 = WARN, 2 = INFO */
void ruccl_log(int level, const char *fmt, ...) RUCCL_PRINTF(2, 3);

#endif
