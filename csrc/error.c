/* error.c — names of the result codes, the thread-local failure detail, and the
   environment-switched debug log (RUCCL_DEBUG). */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RUCCL_LAST_ERROR_MAX 512

static _Thread_local char last_error[RUCCL_LAST_ERROR_MAX];

static const char *const result_names[RUCCL_NUM_RESULTS] = {
    [RUCCL_OK] = "RUCCL_OK",
    [RUCCL_ERR_INVALID_ARGUMENT] = "RUCCL_ERR_INVALID_ARGUMENT",
    [RUCCL_ERR_INVALID_CONFIG] = "RUCCL_ERR_INVALID_CONFIG",
    [RUCCL_ERR_DUPLICATE_REGISTRATION] = "RUCCL_ERR_DUPLICATE_REGISTRATION",
    [RUCCL_ERR_NOT_REGISTERED] = "RUCCL_ERR_NOT_REGISTERED",
    [RUCCL_ERR_CONFIG_MISMATCH] = "RUCCL_ERR_CONFIG_MISMATCH",
    [RUCCL_ERR_SHAPE_MISMATCH] = "RUCCL_ERR_SHAPE_MISMATCH",
    [RUCCL_ERR_DTYPE_MISMATCH] = "RUCCL_ERR_DTYPE_MISMATCH",
    [RUCCL_ERR_OP_MISMATCH] = "RUCCL_ERR_OP_MISMATCH",
    [RUCCL_ERR_ROOT_MISMATCH] = "RUCCL_ERR_ROOT_MISMATCH",
    [RUCCL_ERR_BROADCAST_SENDERS] = "RUCCL_ERR_BROADCAST_SENDERS",
    [RUCCL_ERR_PEER_LOST] = "RUCCL_ERR_PEER_LOST",
    [RUCCL_ERR_PEER_FINISHED] = "RUCCL_ERR_PEER_FINISHED",
    [RUCCL_ERR_TIMEOUT] = "RUCCL_ERR_TIMEOUT",
    [RUCCL_ERR_RESET] = "RUCCL_ERR_RESET",
    [RUCCL_ERR_AUTH] = "RUCCL_ERR_AUTH",
    [RUCCL_ERR_PROTOCOL] = "RUCCL_ERR_PROTOCOL",
    [RUCCL_ERR_IO] = "RUCCL_ERR_IO",
    [RUCCL_ERR_DEVICE] = "RUCCL_ERR_DEVICE",
    [RUCCL_ERR_NO_MEMORY] = "RUCCL_ERR_NO_MEMORY",
    [RUCCL_ERR_UNSUPPORTED] = "RUCCL_ERR_UNSUPPORTED",
    [RUCCL_ERR_ABORTED] = "RUCCL_ERR_ABORTED",
    [RUCCL_ERR_REVOKED] = "RUCCL_ERR_REVOKED",
};

const char *ruccl_error_string(ruccl_result_t code) {
  if ((unsigned)code >= RUCCL_NUM_RESULTS) return "RUCCL_ERR_UNKNOWN";
  return result_names[code];
}

const char *ruccl_last_error(void) { return last_error; }

const char *ruccl_last_error_detail(void) {
  for (int code = 0; code < RUCCL_NUM_RESULTS; code++) {
    size_t n = strlen(result_names[code]);
    if (strncmp(last_error, result_names[code], n) == 0 && strncmp(last_error + n, ": ", 2) == 0)
      return last_error + n + 2;
  }
  return last_error;
}

void ruccl_set_last_error(const char *msg) { snprintf(last_error, sizeof last_error, "%s", msg); }

ruccl_result_t ruccl_fail(ruccl_result_t code, const char *fmt, ...) {
  char detail[RUCCL_LAST_ERROR_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  snprintf(last_error, sizeof last_error, "%s: %s", ruccl_error_string(code), detail);
  ruccl_log(1, "%s", last_error);
  return code;
}

int ruccl_debug_enabled(int level) {
  static int configured = -1; /* racy first read is benign: every thread computes the same */
  int lvl = __atomic_load_n(&configured, __ATOMIC_RELAXED);
  if (lvl < 0) {
    const char *env = getenv("RUCCL_DEBUG");
    lvl = 0;
    if (env && (strcmp(env, "INFO") == 0 || strcmp(env, "info") == 0)) lvl = 2;
    else if (env && (strcmp(env, "WARN") == 0 || strcmp(env, "warn") == 0)) lvl = 1;
    __atomic_store_n(&configured, lvl, __ATOMIC_RELAXED);
  }
  return level <= lvl;
}

void ruccl_log(int level, const char *fmt, ...) {
  if (!ruccl_debug_enabled(level)) return;
  char line[RUCCL_LAST_ERROR_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "ruccl %s: %s\n", level >= 2 ? "INFO" : "WARN", line);
}
