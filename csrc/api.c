/* api.c — the public collective entry points: each names its call for the rank
   core (collective.c), which checks and agrees on it (agreement.c) and runs it. */
#include "collective.h"

ruccl_result_t ruccl_all_reduce(ruccl_comm_t *comm, const ruccl_tensor_t *in, ruccl_tensor_t *out,
                                ruccl_reduce_op_t op) {
  ruccl_call_t r = {.kind = RUCCL_COLL_ALL_REDUCE, .in = in, .out = out, .op = op};
  return ruccl_collective_run(comm, &r);
}

ruccl_result_t ruccl_broadcast(ruccl_comm_t *comm, const ruccl_tensor_t *send, ruccl_tensor_t *out) {
  ruccl_call_t r = {.kind = RUCCL_COLL_BROADCAST, .in = send, .out = out};
  return ruccl_collective_run(comm, &r);
}

ruccl_result_t ruccl_broadcast_from(ruccl_comm_t *comm, ruccl_tensor_t *tensor, uint32_t root_peer) {
  ruccl_call_t r = {.kind = RUCCL_COLL_BROADCAST, .out = tensor, .root_peer = root_peer, .root_named = 1};
  return ruccl_collective_run(comm, &r);
}

ruccl_result_t ruccl_reduce(ruccl_comm_t *comm, const ruccl_tensor_t *in, ruccl_tensor_t *out,
                            ruccl_reduce_op_t op, uint32_t root_peer) {
  ruccl_call_t r = {.kind = RUCCL_COLL_REDUCE, .in = in, .out = out, .op = op, .root_peer = root_peer};
  return ruccl_collective_run(comm, &r);
}

ruccl_result_t ruccl_all_gather(ruccl_comm_t *comm, const ruccl_tensor_t *in, ruccl_tensor_t *out) {
  ruccl_call_t r = {.kind = RUCCL_COLL_ALL_GATHER, .in = in, .out = out};
  return ruccl_collective_run(comm, &r);
}

ruccl_result_t ruccl_reduce_scatter(ruccl_comm_t *comm, const ruccl_tensor_t *in, ruccl_tensor_t *out,
                                    ruccl_reduce_op_t op) {
  ruccl_call_t r = {.kind = RUCCL_COLL_REDUCE_SCATTER, .in = in, .out = out, .op = op};
  return ruccl_collective_run(comm, &r);
}

ruccl_result_t ruccl_barrier(ruccl_comm_t *comm) {
  ruccl_call_t r = {.kind = RUCCL_COLL_BARRIER};
  return ruccl_collective_run(comm, &r);
}
