/* orchestrator_off.c — the orchestrator entry points of a build configured with
   -DRUCCL_ORCHESTRATOR=OFF: they refuse clearly. */
#include "../error.h"

ruccl_result_t ruccl_orchestrator_start(const char *listen_host_port, const void *secret, size_t secret_len,
                                        ruccl_orchestrator_t **out) {
  (void)listen_host_port;
  (void)secret;
  (void)secret_len;
  if (out) *out = NULL;
  return ruccl_fail(RUCCL_ERR_UNSUPPORTED, "this build has no orchestrator (RUCCL_ORCHESTRATOR=OFF)");
}

int ruccl_orchestrator_port(const ruccl_orchestrator_t *o) {
  (void)o;
  return -1;
}

ruccl_result_t ruccl_orchestrator_stop(ruccl_orchestrator_t *o) {
  (void)o;
  return ruccl_fail(RUCCL_ERR_UNSUPPORTED, "this build has no orchestrator (RUCCL_ORCHESTRATOR=OFF)");
}
