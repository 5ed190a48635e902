/* algo_common.c — pieces every algorithm file uses: chunking, the local result,
   reduce-on-receive, and the direct gather/scatter through one root. */
#include <string.h>

#include "algorithms.h"
#include "algo_internal.h"
#include "../dtype.h"

size_t ruccl_args_elem(const ruccl_args_t *a) { return ruccl_dtype_size(a->dtype); }

void ruccl_local_result(void *dst, const void *src, size_t count, ruccl_dtype_t dt, unsigned divisor) {
  if (dst != src && count) memmove(dst, src, count * ruccl_dtype_size(dt));
  if (divisor > 1) ruccl_divide_kernel(dst, dst, count, dt, divisor);
}

void ruccl_chunk(size_t count, unsigned n, unsigned i, size_t *begin, size_t *len) {
  size_t base = count / n, extra = count % n;
  *begin = i * base + (i < extra ? i : extra);
  *len = base + (i < extra ? 1 : 0);
}

ruccl_result_t ruccl_recv_reduce(const ruccl_team_t *team, int peer, void *dst, const void *local, size_t count,
                                 const ruccl_args_t *a, unsigned divisor) {
  size_t bytes = count * ruccl_args_elem(a);
  ruccl_xfer_t x = {.send_peer = RUCCL_NO_PEER,
                    .recv_peer = peer,
                    .recv_buf = dst,
                    .recv_bytes = bytes,
                    .reduce_local = local,
                    .dtype = a->dtype,
                    .op = a->op,
                    .divisor = divisor};
  return ruccl_team_xfer(team, &x);
}

ruccl_result_t ruccl_algo_gather_to(const ruccl_team_t *t, unsigned root, const void *src, void *dst, size_t count,
                              size_t elem) {
  size_t block = count * elem;
  if (t->me != root) return ruccl_team_send(t, (int)root, src, block);
  char *out = dst;
  if (out + (size_t)root * block != src && block) memmove(out + (size_t)root * block, src, block);
  for (unsigned p = 0; p < t->n; p++) {
    if (p == root) continue;
    ruccl_result_t rc = ruccl_team_recv(t, (int)p, out + (size_t)p * block, block);
    if (rc != RUCCL_OK) return rc;
  }
  return RUCCL_OK;
}

ruccl_result_t ruccl_algo_scatter_from(const ruccl_team_t *t, unsigned root, const void *full, void *dst, size_t count,
                                 size_t elem) {
  size_t block = count * elem;
  if (t->me != root) return ruccl_team_recv(t, (int)root, dst, block);
  const char *in = full;
  for (unsigned p = 0; p < t->n; p++) {
    if (p == root) continue;
    ruccl_result_t rc = ruccl_team_send(t, (int)p, in + (size_t)p * block, block);
    if (rc != RUCCL_OK) return rc;
  }
  if (block && dst != in + (size_t)root * block) memmove(dst, in + (size_t)root * block, block);
  return RUCCL_OK;
}

ruccl_result_t ruccl_algo_reduce_direct(const ruccl_team_t *t, unsigned root, const void *src, void *acc, size_t count,
                                  const ruccl_args_t *a) {
  size_t bytes = count * ruccl_args_elem(a);
  if (t->me != root) return ruccl_team_send(t, (int)root, src, bytes);
  if (t->n == 1) {
    ruccl_local_result(acc, src, count, a->dtype, a->divisor);
    return RUCCL_OK;
  }
  unsigned received = 0;
  for (unsigned p = 0; p < t->n; p++) {
    if (p == root) continue;
    received++;
    ruccl_result_t rc = ruccl_recv_reduce(t, (int)p, acc, received == 1 ? src : acc, count, a,
                                          received == t->n - 1 ? a->divisor : 0);
    if (rc != RUCCL_OK) return rc;
  }
  return RUCCL_OK;
}
