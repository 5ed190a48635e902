/* ring.c — the ring strategy: each peer talks only to its neighbours.  All-reduce is
   a reduce-scatter then an all-gather over n chunks (each peer moves 2(n-1)/n of the
   data: bandwidth-optimal, the choice for large messages); broadcast and reduce are
   a chain along the ring, pipelined in segments. */
#include "algo_internal.h"
#include <string.h>

#include "../error.h"

#define RING_SEGMENT_BYTES (256 * 1024)
#define RING_SLICE_BYTES (1024 * 1024) /* per peer, per all-reduce slice */

#define AT(p, elems, elem) ((char *)(p) + (size_t)(elems) * (elem))

static unsigned left_of(const ruccl_team_t *t) { return (t->me + t->n - 1) % t->n; }
static unsigned right_of(const ruccl_team_t *t) { return (t->me + 1) % t->n; }

static ruccl_result_t ring_all_reduce_slice(const ruccl_team_t *t, const ruccl_args_t *a) {
  unsigned n = t->n, me = t->me;
  size_t elem = ruccl_args_elem(a);
  /* Reduce-scatter: at step s send chunk me-s, receive chunk me-s-1 and fold it into
     our own input; after n-1 steps chunk me+1 is complete here. */
  for (unsigned s = 0; s + 1 < n; s++) {
    size_t sb, sl, rb, rl;
    ruccl_chunk(a->count, n, (me + n - s) % n, &sb, &sl);
    ruccl_chunk(a->count, n, (me + 2 * n - s - 1) % n, &rb, &rl);
    ruccl_xfer_t x = {.send_peer = (int)right_of(t),
                      .send_buf = AT(s == 0 ? a->src : a->dst, sb, elem),
                      .send_bytes = sl * elem,
                      .recv_peer = (int)left_of(t),
                      .recv_buf = AT(a->dst, rb, elem),
                      .recv_bytes = rl * elem,
                      .reduce_local = AT(a->src, rb, elem),
                      .dtype = a->dtype,
                      .op = a->op,
                      .divisor = s + 2 == n ? a->divisor : 0};
    ruccl_result_t rc = ruccl_team_xfer(t, &x);
    if (rc != RUCCL_OK) return rc;
  }
  /* All-gather the completed chunks around the ring. */
  for (unsigned s = 0; s + 1 < n; s++) {
    size_t sb, sl, rb, rl;
    ruccl_chunk(a->count, n, (me + 1 + n - s) % n, &sb, &sl);
    ruccl_chunk(a->count, n, (me + n - s) % n, &rb, &rl);
    ruccl_xfer_t x = {.send_peer = (int)right_of(t),
                      .send_buf = AT(a->dst, sb, elem),
                      .send_bytes = sl * elem,
                      .recv_peer = (int)left_of(t),
                      .recv_buf = AT(a->dst, rb, elem),
                      .recv_bytes = rl * elem};
    ruccl_result_t rc = ruccl_team_xfer(t, &x);
    if (rc != RUCCL_OK) return rc;
  }
  return RUCCL_OK;
}

/* Large messages run as a sequence of independent ring all-reduces over slices of
   n x RING_SLICE_BYTES: a chunk reduced in the reduce-scatter is still in cache when
   the all-gather sends it on, and the transport's buffers stay cache-sized.  One
   unsliced pass over 64 MB read its output back from memory and ran at about two
   thirds of the sliced speed (shared memory, 2 processes).  Slices of 1 MB a peer
   rather than 256 KB: 4 processes on 2 cores hand over a quarter as often, 16 MB
   went from 14.2 to 11.3 ms (ruccl-perf -N 4, 2026-12-05); 2 and 8 processes the same. */
static ruccl_result_t ring_all_reduce(const ruccl_team_t *t, const ruccl_args_t *a) {
  unsigned n = t->n;
  if (n == 1) {
    ruccl_local_result(a->dst, a->src, a->count, a->dtype, a->divisor);
    return RUCCL_OK;
  }
  size_t elem = ruccl_args_elem(a);
  size_t per = RING_SLICE_BYTES / elem ? RING_SLICE_BYTES / elem * n : n;
  size_t done = 0;
  do {
    ruccl_args_t s = *a;
    s.src = AT(a->src, done, elem);
    s.dst = AT(a->dst, done, elem);
    s.count = a->count - done < per ? a->count - done : per;
    ruccl_result_t rc = ring_all_reduce_slice(t, &s);
    if (rc != RUCCL_OK) return rc;
    done += s.count;
  } while (done < a->count);
  return RUCCL_OK;
}

static size_t segment_elems(const ruccl_args_t *a) {
  size_t per = RING_SEGMENT_BYTES / ruccl_args_elem(a);
  return per ? per : 1;
}

static size_t segment_count(const ruccl_args_t *a) {
  size_t per = segment_elems(a);
  size_t k = (a->count + per - 1) / per;
  return k ? k : 1; /* an empty message is still one (empty) step */
}

static void segment(const ruccl_args_t *a, size_t i, size_t *begin, size_t *len) {
  size_t per = segment_elems(a);
  *begin = i * per;
  *len = *begin >= a->count ? 0 : (a->count - *begin < per ? a->count - *begin : per);
}

/* A chain along the ring from position 0 (the head) to position n-1 (the tail),
   pipelined: at step t a middle peer receives segment t and forwards segment t-1.
   reduce: each peer folds its src into what it forwards; otherwise a plain relay. */
static ruccl_result_t ring_chain(const ruccl_team_t *t, const ruccl_args_t *a, unsigned head, int reduce,
                                 void *buf) {
  unsigned n = t->n, pos = (t->me + n - head) % n;
  size_t elem = ruccl_args_elem(a), k = segment_count(a);
  for (size_t step = 0; step <= k; step++) {
    ruccl_xfer_t x = {.send_peer = RUCCL_NO_PEER, .recv_peer = RUCCL_NO_PEER, .dtype = a->dtype, .op = a->op};
    size_t b, l;
    if (pos + 1 < n && step >= 1) { /* forward segment step-1 */
      segment(a, step - 1, &b, &l);
      x.send_peer = (int)right_of(t);
      x.send_buf = AT(pos == 0 ? a->src : buf, b, elem);
      x.send_bytes = l * elem;
    }
    if (pos > 0 && step < k) { /* receive segment step */
      segment(a, step, &b, &l);
      x.recv_peer = (int)left_of(t);
      x.recv_buf = AT(buf, b, elem);
      x.recv_bytes = l * elem;
      if (reduce) {
        x.reduce_local = AT(a->src, b, elem);
        x.divisor = pos + 1 == n ? a->divisor : 0;
      }
    }
    if (x.send_peer == RUCCL_NO_PEER && x.recv_peer == RUCCL_NO_PEER) continue;
    ruccl_result_t rc = ruccl_team_xfer(t, &x);
    if (rc != RUCCL_OK) return rc;
  }
  return RUCCL_OK;
}

static ruccl_result_t ring_broadcast(const ruccl_team_t *t, const ruccl_args_t *a) {
  ruccl_result_t rc = ring_chain(t, a, a->root, 0, a->dst);
  if (rc == RUCCL_OK && t->me == a->root) ruccl_local_result(a->dst, a->src, a->count, a->dtype, 0);
  return rc;
}

static ruccl_result_t ring_reduce(const ruccl_team_t *t, const ruccl_args_t *a) {
  unsigned n = t->n;
  if (n == 1) {
    ruccl_local_result(a->dst, a->src, a->count, a->dtype, a->divisor);
    return RUCCL_OK;
  }
  /* The chain starts right of the root and ends at it. */
  void *acc = a->dst;
  if (t->me != a->root) {
    acc = a->scratch.get(a->scratch.ctx, 0, a->count * ruccl_args_elem(a));
    if (!acc && a->count) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "ring reduce scratch");
  }
  return ring_chain(t, a, (a->root + 1) % n, 1, acc);
}

static ruccl_result_t ring_all_gather(const ruccl_team_t *t, const ruccl_args_t *a) {
  unsigned n = t->n, me = t->me;
  size_t block = a->count * ruccl_args_elem(a);
  char *out = a->dst;
  if (out + (size_t)me * block != a->src && block) memmove(out + (size_t)me * block, a->src, block);
  for (unsigned s = 0; s + 1 < n; s++) {
    ruccl_xfer_t x = {.send_peer = (int)right_of(t),
                      .send_buf = out + (size_t)((me + n - s) % n) * block,
                      .send_bytes = block,
                      .recv_peer = (int)left_of(t),
                      .recv_buf = out + (size_t)((me + 2 * n - s - 1) % n) * block,
                      .recv_bytes = block};
    ruccl_result_t rc = ruccl_team_xfer(t, &x);
    if (rc != RUCCL_OK) return rc;
  }
  return RUCCL_OK;
}

static ruccl_result_t ring_reduce_scatter(const ruccl_team_t *t, const ruccl_args_t *a) {
  unsigned n = t->n, me = t->me;
  size_t elem = ruccl_args_elem(a), block = a->count * elem;
  if (n == 1) {
    ruccl_local_result(a->dst, a->src, a->count, a->dtype, a->divisor);
    return RUCCL_OK;
  }
  /* Partial sums ping-pong between two blocks: we receive into one while the right
     neighbour reads the other.  The last step lands block `me` in dst. */
  char *tmp = a->scratch.get(a->scratch.ctx, 0, 2 * block);
  if (!tmp && block) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "ring reduce-scatter scratch");
  const char *in = a->src;
  for (unsigned s = 0; s + 1 < n; s++) {
    unsigned sb = (me + 2 * n - s - 1) % n, rb = (me + 2 * n - s - 2) % n;
    int last = s + 2 == n;
    ruccl_xfer_t x = {.send_peer = (int)right_of(t),
                      .send_buf = s == 0 ? in + (size_t)sb * block : tmp + (size_t)((s - 1) % 2) * block,
                      .send_bytes = block,
                      .recv_peer = (int)left_of(t),
                      .recv_buf = last ? (char *)a->dst : tmp + (size_t)(s % 2) * block,
                      .recv_bytes = block,
                      .reduce_local = in + (size_t)rb * block,
                      .dtype = a->dtype,
                      .op = a->op,
                      .divisor = last ? a->divisor : 0};
    ruccl_result_t rc = ruccl_team_xfer(t, &x);
    if (rc != RUCCL_OK) return rc;
  }
  return RUCCL_OK;
}

const ruccl_algorithm_table_t ruccl_ring_algorithms = {
    .name = "ring",
    .all_reduce = ring_all_reduce,
    .broadcast = ring_broadcast,
    .reduce = ring_reduce,
    .all_gather = ring_all_gather,
    .reduce_scatter = ring_reduce_scatter,
};
