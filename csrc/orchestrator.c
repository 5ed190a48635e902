/* orchestrator.c — the multi-node rendezvous server.  Multi-node sessions are the
   next step of the project (transports, bootstrap); until they land these entry
   points refuse clearly instead of pretending. */
#include <stddef.h>

#include "error.h"

ruccl_result_t ruccl_orchestrator_start(const char *listen_host_port, const void *secret, size_t secret_len,
                                        ruccl_orchestrator_t **out) {
  (void)secret;
  (void)secret_len;
  if (!listen_host_port || !out) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "listen address or out is NULL");
  *out = NULL;
  return ruccl_fail(RUCCL_ERR_UNSUPPORTED, "the orchestrator is not built yet (multi-node support)");
}

int ruccl_orchestrator_port(const ruccl_orchestrator_t *o) {
  (void)o;
  return -1;
}

ruccl_result_t ruccl_orchestrator_stop(ruccl_orchestrator_t *o) {
  if (!o) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "orchestrator is NULL");
  return ruccl_fail(RUCCL_ERR_UNSUPPORTED, "the orchestrator is not built yet (multi-node support)");
}
