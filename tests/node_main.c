/* node_main.c — ruccl-test-node: one node of a multi-node test session, run as a
 * real process by test_multinode.cc.
 *
 *   ruccl-test-node ORCH_ADDR NUM_NODES GROUP IDS SCENARIO [STRATEGY [DATA_PORT]]
 *
 * IDS is this node's peer ids, comma-separated (one thread each); the session's
 * peers are 0..N-1 across all nodes.  Exit status 0 means every check passed; the
 * scenarios print what they saw on failure.  Scenarios:
 *   all       every collective, every root, checked against expected values
 *   many      10 000 consecutive mixed small collectives
 *   mismatch  peer 0 passes another shape: everyone must see SHAPE_MISMATCH, then
 *             the next all-reduce must work
 *   staged    all-reduce, broadcast and reduce of 9 MB (the host-staged path's
 *             slices), checked exactly
 *   big       all-reduces of 32 MB until one fails; exits 3 if that failure was
 *             PEER_LOST (a killed node), else 1
 *   finish    peer 0 finishes at once; everyone else's next all-reduce must fail
 *             with PEER_FINISHED
 *   lagfinish[-big]  the finish race: the first peer of the last node (the
 *             laggard) sleeps LAG_MS in the last receiving step of the second of two
 *             all-reduces (1000 floats, or 4M with -big), then in its receive of a
 *             point-to-point message from peer 0; every other peer finishes as soon
 *             as its part is done.  Every result must be right, and the laggard's
 *             node's next all-reduce must fail with PEER_FINISHED.  Prints
 *             "finish-enter ID NS" and "laggard-woke NS NS" (CLOCK_MONOTONIC) to
 *             stderr, so that the test can check that the race really happened
 *   bits      all-reduces (SUM, MEAN) of pseudo-random float32 and float64 of several
 *             sizes: every peer prints "bits CASE HASH" (FNV-1a of its output's bytes)
 *             to stderr, for the test to compare across peers and nodes; each result
 *             is also checked against a float64 sum, within rounding
 *   p2p       one ruccl_p2p_group: every peer exchanges uneven-sized messages with
 *             every peer (itself, its node's, the other nodes'), tags 1 and 2 each
 *             way, receiving tag 2 first (IDS must be 0..total-1)
 *   reset     node of peer 0: its peers wait in an all-reduce while a thread calls
 *             ruccl_reset() (all must return RESET within a second); other nodes
 *             call the all-reduce later and must get PEER_LOST
 *   abortrace rounds (RUCCL_RACE_ROUNDS, 200) of a 4 MB (RUCCL_RACE_MB) all-reduce
 *             that a thread of peer 1 aborts after a varying delay: every peer must
 *             end each round with ABORTED
 *   p2pbig    64 MB to the next peer, sent before the receive from the previous is
 *             posted; then peer 0 receives every other peer's id from any peer
 *   p2pflood  two peers: peer 0 sends 32 messages of 1 MB at once, peer 1 posts its
 *             receives 1.5 s later and checks them; with RUCCL_TEST_EXPECT_PAUSE=1
 *             peer 0's sends must take that long (the receiver's unexpected queue,
 *             RUCCL_P2P_UNEXPECTED_MB, pauses the stream), with 0 they must not
 *   links     "all", printing "sockets-registered N" before and "sockets-after N"
 *             after it (the process's open sockets; one peer a node)
 *   idle      an all-reduce, RUCCL_TEST_IDLE_MS (default 4000) without a call (a
 *             long compute phase), then another all-reduce and a barrier: all must
 *             work (no liveness false alarm)
 * The recovery scenarios (shrink, agreedie, revoke, revoke2, exclude) are described
 * in node_recovery.c.
 * RUCCL_TEST_SILENT_PEER=ID: the node of peer ID sends no liveness beats.
 * RUCCL_TEST_DIE_AFTER_TABLE_PEER=ID: the node of peer ID exits (status 7) as soon as
 * it has the session's table, before it links to anyone.
 * RUCCL_TEST_LIVENESS_API_MS sets the liveness timeout with
 * ruccl_config_set_liveness_timeout_ms.
 * ORCH "dir:PATH" rendezvouses through a key-value store kept as files in PATH (the
 * seam the PyTorch backend uses with torch's store) instead of an orchestrator.
 * The secret comes from RUCCL_SECRET. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "ruccl.h"
#include "testing.h"
#include "transport.h" /* ruccl_now_ns: the clock the hook stamps with */

#include "node_common.h"

/* A large MEAN all-reduce: several ring slices and a ragged last one. */
static void large_all_reduce(peer_t *p, ruccl_comm_t *comm, int inplace) {
  const size_t count = 700001;
  float *in = malloc(count * sizeof(float)), *out = inplace ? in : malloc(count * sizeof(float));
  ruccl_result_t rc = RUCCL_ERR_NO_MEMORY;
  size_t wrong = count;
  float got = 0, want = 0;
  if (in && out) {
    for (size_t i = 0; i < count; i++) in[i] = val(p->id, i);
    if (!inplace)
      for (size_t i = 0; i < count; i++) out[i] = -1.0f;
    ruccl_tensor_t tin = vec(in, count), tout = vec(out, count);
    rc = ruccl_all_reduce(comm, &tin, &tout, RUCCL_MEAN);
    for (size_t i = 0; rc == RUCCL_OK && i < count && wrong == count; i++) {
      float mean = val_sum(p->total, i) / (float)p->total;
      if (out[i] != mean) wrong = i, got = out[i], want = mean;
    }
  }
  free(in);
  if (!inplace) free(out);
  CHECK(p, rc == RUCCL_OK, "large all_reduce (in place: %d)", inplace);
  CHECK(p, wrong == count, "large all_reduce (in place: %d) [%zu] = %g, want %g", inplace, wrong, got, want);
}

static void scenario_all(peer_t *p, ruccl_comm_t *comm) {
  unsigned n = p->total;
  enum { COUNT = 1000 };
  float in[COUNT], out[COUNT * 8];
  for (size_t i = 0; i < COUNT; i++) in[i] = val(p->id, i);
  ruccl_tensor_t tin = vec(in, COUNT), tout = vec(out, COUNT);
  static const ruccl_reduce_op_t ops[] = {RUCCL_SUM, RUCCL_MEAN, RUCCL_MAX, RUCCL_MIN};
  for (int o = 0; o < 4; o++) {
    CHECK(p, ruccl_all_reduce(comm, &tin, &tout, ops[o]) == RUCCL_OK, "all_reduce op %d", o);
    for (size_t i = 0; i < COUNT; i++) {
      float sum = val_sum(n, i), mx = val(n - 1, i), mn = val(0, i);
      float want = ops[o] == RUCCL_SUM ? sum : ops[o] == RUCCL_MEAN ? sum / (float)n : ops[o] == RUCCL_MAX ? mx : mn;
      CHECK(p, out[i] == want, "all_reduce op %d [%zu] = %g, want %g", o, i, out[i], want);
    }
  }
  for (uint32_t root = 0; root < n; root++) {
    memset(out, 0, sizeof(float) * COUNT);
    CHECK(p, ruccl_broadcast(comm, p->id == root ? &tin : NULL, &tout) == RUCCL_OK, "broadcast root %u", root);
    for (size_t i = 0; i < COUNT; i++) CHECK(p, out[i] == val(root, i), "broadcast root %u [%zu]", root, i);
    memset(out, 0, sizeof(float) * COUNT);
    CHECK(p, ruccl_reduce(comm, &tin, p->id == root ? &tout : NULL, RUCCL_SUM, root) == RUCCL_OK, "reduce %u", root);
    if (p->id == root)
      for (size_t i = 0; i < COUNT; i++) {
        float sum = val_sum(n, i);
        CHECK(p, out[i] == sum, "reduce root %u [%zu] = %g, want %g", root, i, out[i], sum);
      }
  }
  for (int inplace = 0; inplace < 2; inplace++) {
    large_all_reduce(p, comm, inplace);
    if (p->status) return;
  }
  ruccl_tensor_t tall = vec(out, (size_t)COUNT * n);
  CHECK(p, ruccl_all_gather(comm, &tin, &tall) == RUCCL_OK, "all_gather");
  for (uint32_t k = 0; k < n; k++)
    for (size_t i = 0; i < COUNT; i++)
      CHECK(p, out[k * COUNT + i] == val(k, i), "all_gather block %u [%zu] = %g", k, i, out[k * COUNT + i]);
  /* reduce_scatter: input of n blocks of 100, block k of peer id x = x + k */
  float rs_in[100 * 8], rs_out[100];
  for (uint32_t k = 0; k < n; k++)
    for (size_t i = 0; i < 100; i++) rs_in[k * 100 + i] = (float)(p->id + k) + (float)i;
  ruccl_tensor_t trs_in = vec(rs_in, 100 * (size_t)n), trs_out = vec(rs_out, 100);
  CHECK(p, ruccl_reduce_scatter(comm, &trs_in, &trs_out, RUCCL_SUM) == RUCCL_OK, "reduce_scatter");
  for (size_t i = 0; i < 100; i++) {
    float want = 0;
    for (uint32_t x = 0; x < n; x++) want += (float)(x + p->id) + (float)i;
    CHECK(p, rs_out[i] == want, "reduce_scatter [%zu] = %g, want %g", i, rs_out[i], want);
  }
  CHECK(p, ruccl_barrier(comm) == RUCCL_OK, "barrier");
}

static void scenario_many(peer_t *p, ruccl_comm_t *comm) {
  unsigned n = p->total;
  float a[64], b[64 * 8];
  for (int it = 0; it < 10000; it++) {
    size_t count = (size_t)(it % 7) * 9 + 1;
    for (size_t i = 0; i < count; i++) a[i] = (float)(p->id * 3 + (uint32_t)it % 5) + (float)i;
    ruccl_tensor_t ta = vec(a, count), tb = vec(b, count);
    uint32_t root = (uint32_t)it % n;
    switch (it % 4) {
      case 0: {
        CHECK(p, ruccl_all_reduce(comm, &ta, &tb, RUCCL_SUM) == RUCCL_OK, "#%d all_reduce", it);
        float want = 0;
        for (uint32_t k = 0; k < n; k++) want += (float)(k * 3 + (uint32_t)it % 5);
        CHECK(p, b[0] == want, "#%d all_reduce got %g want %g", it, b[0], want);
        break;
      }
      case 1:
        CHECK(p, ruccl_broadcast(comm, p->id == root ? &ta : NULL, &tb) == RUCCL_OK, "#%d broadcast", it);
        CHECK(p, b[count - 1] == (float)(root * 3 + (uint32_t)it % 5) + (float)(count - 1), "#%d broadcast", it);
        break;
      case 2: {
        ruccl_tensor_t tall = vec(b, count * n);
        CHECK(p, ruccl_all_gather(comm, &ta, &tall) == RUCCL_OK, "#%d all_gather", it);
        for (uint32_t k = 0; k < n; k++)
          CHECK(p, b[k * count] == (float)(k * 3 + (uint32_t)it % 5), "#%d all_gather block %u", it, k);
        break;
      }
      default: CHECK(p, ruccl_barrier(comm) == RUCCL_OK, "#%d barrier", it); break;
    }
  }
}

static void scenario_mismatch(peer_t *p, ruccl_comm_t *comm) {
  float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8];
  for (int i = 0; i < 8; i++) b[i] = -1;
  ruccl_tensor_t ta = vec(a, p->id == 0 ? 7 : 8), tb = vec(b, p->id == 0 ? 7 : 8);
  ruccl_result_t rc = ruccl_all_reduce(comm, &ta, &tb, RUCCL_SUM);
  CHECK(p, rc == RUCCL_ERR_SHAPE_MISMATCH, "mismatch gave %s", ruccl_error_string(rc));
  CHECK(p, strstr(ruccl_last_error(), "RUCCL_ERR_SHAPE_MISMATCH") != NULL, "message");
  for (int i = 0; i < 8; i++) CHECK(p, b[i] == -1, "output modified on a mismatch");
  ta = vec(a, 8), tb = vec(b, 8);
  CHECK(p, ruccl_all_reduce(comm, &ta, &tb, RUCCL_SUM) == RUCCL_OK, "all_reduce after the mismatch");
  CHECK(p, b[7] == 8.0f * (float)p->total, "after the mismatch: %g", b[7]);
}

static void scenario_big(peer_t *p, ruccl_comm_t *comm) {
  size_t count = 8u << 20; /* 32 MB */
  float *a = malloc(count * sizeof(float)), *b = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; i++) a[i] = 1.0f;
  ruccl_tensor_t ta = vec(a, count), tb = vec(b, count);
  ruccl_result_t rc = RUCCL_OK;
  for (int it = 0; it < 100000 && rc == RUCCL_OK; it++) {
    rc = ruccl_all_reduce(comm, &ta, &tb, RUCCL_SUM);
    if (it == 0 && rc == RUCCL_OK) {
      printf("peer %u: running\n", p->id);
      fflush(stdout);
      fprintf(stderr, "peer %u: running\n", p->id);
    }
  }
  free(a);
  free(b);
  fprintf(stderr, "peer %u: big ended with %s: %s\n", p->id, ruccl_error_string(rc), ruccl_last_error());
  p->status = rc == RUCCL_ERR_PEER_LOST ? 3 : 1;
}

static void scenario_idle(peer_t *p, ruccl_comm_t *comm) {
  const char *env = getenv("RUCCL_TEST_IDLE_MS");
  long ms = env ? atol(env) : 4000;
  float a[4] = {1, 2, 3, 4}, b[4];
  ruccl_tensor_t ta = vec(a, 4), tb = vec(b, 4);
  for (int round = 0; round < 2 && !p->status; round++) {
    if (round) {
      struct timespec pause = {ms / 1000, (ms % 1000) * 1000000};
      nanosleep(&pause, NULL);
    }
    ruccl_result_t rc = ruccl_all_reduce(comm, &ta, &tb, RUCCL_SUM);
    CHECK(p, rc == RUCCL_OK, "all_reduce %d: %s (%s)", round, ruccl_error_string(rc), ruccl_last_error());
    CHECK(p, rc != RUCCL_OK || b[3] == 4.0f * (float)p->total, "all_reduce %d: %g", round, b[3]);
  }
  if (!p->status) {
    ruccl_result_t rc = ruccl_barrier(comm);
    CHECK(p, rc == RUCCL_OK, "barrier: %s (%s)", ruccl_error_string(rc), ruccl_last_error());
  }
}

/* The sockets among this process's open files. */
static int open_sockets(void) {
  int n = 0;
  char path[64], target[64];
  for (int fd = 0; fd < 4096; fd++) {
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t len = readlink(path, target, sizeof target - 1);
    if (len > 0 && (target[len] = 0, strncmp(target, "socket:", 7) == 0)) n++;
  }
  return n;
}

/* "all", with the process's sockets counted before and after (one peer a node). */
static void scenario_links(peer_t *p, ruccl_comm_t *comm) {
  fprintf(stderr, "sockets-registered %d\n", open_sockets());
  scenario_all(p, comm);
  fprintf(stderr, "sockets-after %d\n", open_sockets());
}

static void scenario_finish(peer_t *p, ruccl_comm_t **comm) {
  if (p->id == 0) return; /* finishes right away */
  float a[4] = {1, 2, 3, 4}, b[4];
  ruccl_tensor_t ta = vec(a, 4), tb = vec(b, 4);
  ruccl_result_t rc = ruccl_all_reduce(*comm, &ta, &tb, RUCCL_SUM);
  CHECK(p, rc == RUCCL_ERR_PEER_FINISHED, "after peer 0 finished: %s", ruccl_error_string(rc));
}

static size_t p2p_count(uint32_t from, uint32_t to) { return (size_t)((from * 7 + to * 13) % 5) * 100000 + 1; }
static int32_t p2p_val(uint32_t from, uint32_t to, size_t i) { return (int32_t)(from * 1000003u + to * 1009u + i); }

/* Every peer with every peer (itself, its node's, the other nodes'), two messages
   each way with tags 1 and 2, received in the other order: each lands by tag. */
static void scenario_p2p(peer_t *p, ruccl_comm_t *comm) {
  unsigned np = p->total;
  int32_t **out = calloc(2 * (size_t)np, sizeof *out), **in = calloc(2 * (size_t)np, sizeof *in);
  ruccl_tensor_t *tout = calloc(2 * (size_t)np, sizeof *tout), *tin = calloc(2 * (size_t)np, sizeof *tin);
  ruccl_p2p_op_t *ops = calloc(4 * (size_t)np, sizeof *ops);
  for (unsigned k = 0; k < 2 * np; k++) {
    uint32_t peer = k / 2, tag = 1 + k % 2;
    size_t so = p2p_count(p->id, peer) + tag, si = p2p_count(peer, p->id) + tag;
    out[k] = malloc(so * sizeof(int32_t));
    in[k] = calloc(si, sizeof(int32_t));
    for (size_t i = 0; i < so; i++) out[k][i] = p2p_val(p->id, peer, i) * (int32_t)tag;
    tout[k] = (ruccl_tensor_t){.data = out[k], .dtype = RUCCL_INT32, .ndim = 1, .shape = {(int64_t)so}};
    tin[k] = (ruccl_tensor_t){.data = in[k], .dtype = RUCCL_INT32, .ndim = 1, .shape = {(int64_t)si}};
    /* receives of tag 2 listed (and posted) before those of tag 1 */
    ops[4 * (k / 2) + (tag == 2 ? 0 : 1)] = (ruccl_p2p_op_t){RUCCL_P2P_RECV, &tin[k], peer, (int32_t)tag};
    ops[4 * (k / 2) + 1 + tag] = (ruccl_p2p_op_t){RUCCL_P2P_SEND, &tout[k], peer, (int32_t)tag};
  }
  ruccl_result_t rc = ruccl_p2p_group(comm, ops, 4 * (size_t)np);
  int bad = -1;
  for (unsigned k = 0; rc == RUCCL_OK && bad < 0 && k < 2 * np; k++) {
    uint32_t peer = k / 2, tag = 1 + k % 2;
    for (size_t i = 0; i < p2p_count(peer, p->id) + tag; i++)
      if (in[k][i] != p2p_val(peer, p->id, i) * (int32_t)tag) {
        bad = (int)peer;
        break;
      }
  }
  for (unsigned k = 0; k < 2 * np; k++) free(out[k]), free(in[k]);
  free(out), free(in), free(tout), free(tin), free(ops);
  CHECK(p, rc == RUCCL_OK, "p2p_group with %u partners: %s (%s)", np, ruccl_error_string(rc), ruccl_last_error());
  CHECK(p, bad < 0, "wrong bytes from peer %d", bad);
  float a[8], b[8];
  for (int i = 0; i < 8; i++) a[i] = 1.0f;
  ruccl_tensor_t ta = vec(a, 8), tb = vec(b, 8);
  CHECK(p, ruccl_all_reduce(comm, &ta, &tb, RUCCL_SUM) == RUCCL_OK, "all_reduce after p2p");
  CHECK(p, b[7] == (float)p->total, "all_reduce after p2p: %g", b[7]);
}

/* Point-to-point as gloo allows it, across processes: every peer sends 64 MB to the
   next before it posts the receive from the previous (eager sends: no deadlock),
   then every other peer sends peer 0 its id, which peer 0 receives from any peer. */
static void scenario_p2pbig(peer_t *p, ruccl_comm_t *comm) {
  const size_t count = 16u << 20;
  uint32_t next = (p->id + 1) % p->total, prev = (p->id + p->total - 1) % p->total;
  int32_t *out = malloc(count * sizeof *out), *in = calloc(count, sizeof *in);
  for (size_t i = 0; i < count; i++) out[i] = p2p_val(p->id, next, i);
  ruccl_tensor_t to = {.data = out, .dtype = RUCCL_INT32, .ndim = 1, .shape = {(int64_t)count}};
  ruccl_tensor_t ti = {.data = in, .dtype = RUCCL_INT32, .ndim = 1, .shape = {(int64_t)count}};
  ruccl_request_t *s = NULL, *r = NULL;
  ruccl_result_t rc = ruccl_isend(comm, &to, next, 9, &s);
  if (rc == RUCCL_OK) rc = ruccl_irecv(comm, &ti, prev, 9, &r);
  if (rc == RUCCL_OK) rc = ruccl_wait(r);
  size_t bad = count;
  for (size_t i = 0; rc == RUCCL_OK && i < count; i++)
    if (in[i] != p2p_val(prev, p->id, i)) {
      bad = i;
      break;
    }
  ruccl_request_free(s), ruccl_request_free(r);
  free(out), free(in);
  CHECK(p, rc == RUCCL_OK, "64 MB ring exchange: %s (%s)", ruccl_error_string(rc), ruccl_last_error());
  CHECK(p, bad == count, "64 MB from peer %u: wrong at %zu", prev, bad);
  int64_t id = p->id;
  ruccl_tensor_t t = {.data = &id, .dtype = RUCCL_INT64, .ndim = 0};
  if (p->id != 0) {
    CHECK(p, ruccl_send(comm, &t, 0) == RUCCL_OK, "send to peer 0: %s", ruccl_last_error());
  } else {
    uint64_t seen = 0;
    for (uint32_t k = 1; k < p->total; k++) {
      uint32_t src = 0;
      rc = ruccl_irecv(comm, &t, RUCCL_ANY_PEER, 0, &r);
      if (rc == RUCCL_OK) rc = ruccl_wait(r);
      if (rc == RUCCL_OK) rc = ruccl_request_source(r, &src);
      ruccl_request_free(r);
      CHECK(p, rc == RUCCL_OK, "receive from any peer: %s (%s)", ruccl_error_string(rc), ruccl_last_error());
      CHECK(p, id == (int64_t)src && src < 64, "peer %u's message says %lld", src, (long long)id);
      seen |= 1ull << src;
    }
    CHECK(p, seen == ((1ull << p->total) - 2), "not every peer was received from once");
  }
  CHECK(p, ruccl_barrier(comm) == RUCCL_OK, "barrier after point-to-point");
}

static void scenario_p2pflood(peer_t *p, ruccl_comm_t *comm) {
  enum { N = 32, COUNT = 1 << 18 }; /* 32 x 1 MB */
  int32_t *buf = malloc((size_t)N * COUNT * sizeof *buf);
  ruccl_request_t *req[N] = {0};
  ruccl_result_t rc = RUCCL_OK;
  CHECK(p, p->total == 2 && buf, "two peers, and memory");
  if (p->id == 0) {
    for (size_t i = 0; i < (size_t)N * COUNT; i++) buf[i] = p2p_val(0, 1, i);
    int64_t t0 = ruccl_now_ns();
    for (int k = 0; k < N && rc == RUCCL_OK; k++) {
      ruccl_tensor_t t = {.data = buf + (size_t)k * COUNT, .dtype = RUCCL_INT32, .ndim = 1, .shape = {COUNT}};
      rc = ruccl_isend(comm, &t, 1, 5, &req[k]);
    }
    for (int k = 0; k < N && rc == RUCCL_OK; k++) rc = ruccl_wait(req[k]);
    int64_t ms = (ruccl_now_ns() - t0) / 1000000;
    const char *e = getenv("RUCCL_TEST_EXPECT_PAUSE");
    int expect_pause = e && atoi(e);
    printf("p2pflood-sends-ms %lld\n", (long long)ms);
    CHECK(p, rc == RUCCL_OK, "sends: %s (%s)", ruccl_error_string(rc), ruccl_last_error());
    if (expect_pause) CHECK(p, ms >= 1000, "32 MB went in %lld ms, before the receives were posted", (long long)ms);
    else CHECK(p, ms < 1000, "32 MB took %lld ms: the sends waited for the receives", (long long)ms);
  } else {
    memset(buf, 0, (size_t)N * COUNT * sizeof *buf);
    struct timespec pause = {1, 500000000};
    nanosleep(&pause, NULL);
    for (int k = 0; k < N && rc == RUCCL_OK; k++) {
      ruccl_tensor_t t = {.data = buf + (size_t)k * COUNT, .dtype = RUCCL_INT32, .ndim = 1, .shape = {COUNT}};
      rc = ruccl_irecv(comm, &t, 0, 5, &req[k]);
    }
    for (int k = 0; k < N && rc == RUCCL_OK; k++) rc = ruccl_wait(req[k]);
    CHECK(p, rc == RUCCL_OK, "receives: %s (%s)", ruccl_error_string(rc), ruccl_last_error());
    size_t bad = (size_t)-1;
    for (size_t i = 0; i < (size_t)N * COUNT; i++)
      if (buf[i] != p2p_val(0, 1, i)) {
        bad = i;
        break;
      }
    CHECK(p, bad == (size_t)-1, "message data wrong at element %zu", bad);
  }
  for (int k = 0; k < N; k++) ruccl_request_free(req[k]);
  free(buf);
  CHECK(p, ruccl_barrier(comm) == RUCCL_OK, "barrier after the flood");
}

/* ruccl_reset() in a multi-node session, from a thread of its own while this node's
   peers wait in an all-reduce the other node never joins: every local peer returns
   RUCCL_ERR_RESET within a second; the other node's peers, calling later, lose it. */
static _Atomic int64_t reset_at_ns;

static void *reset_later(void *arg) {
  (void)arg;
  struct timespec pause = {0, 500000000};
  nanosleep(&pause, NULL);
  reset_at_ns = ruccl_now_ns();
  ruccl_reset();
  return NULL;
}

static void scenario_reset(peer_t *p, ruccl_comm_t *comm) {
  float a[8] = {1, 1, 1, 1, 1, 1, 1, 1}, b[8];
  ruccl_tensor_t ta = vec(a, 8), tb = vec(b, 8);
  if (p->first_local == 0) {
    pthread_t t;
    if (p->id == 0) pthread_create(&t, NULL, reset_later, NULL);
    ruccl_result_t rc = ruccl_all_reduce(comm, &ta, &tb, RUCCL_SUM);
    int64_t after_ms = (ruccl_now_ns() - reset_at_ns) / 1000000;
    if (p->id == 0) pthread_join(t, NULL);
    CHECK(p, rc == RUCCL_ERR_RESET, "all_reduce during ruccl_reset: %s (%s)", ruccl_error_string(rc),
          ruccl_last_error());
    CHECK(p, reset_at_ns != 0 && after_ms < 1000, "returned %lld ms after the reset", (long long)after_ms);
    return;
  }
  struct timespec pause = {1, 500000000};
  nanosleep(&pause, NULL);
  int64_t t0 = ruccl_now_ns();
  ruccl_result_t rc = ruccl_all_reduce(comm, &ta, &tb, RUCCL_SUM);
  CHECK(p, rc == RUCCL_ERR_PEER_LOST, "all_reduce with a node that reset: %s", ruccl_error_string(rc));
  CHECK(p, ruccl_now_ns() - t0 < 10000000000LL, "took %lld ms", (long long)((ruccl_now_ns() - t0) / 1000000));
}

/* An abort racing a big payload: every round, every peer starts a 4 MB ring
   all-reduce (over TCP the node leaders' sockets carry it) and a thread of peer 1
   calls ruccl_comm_abort after a short, varying delay.  Every peer, on every node,
   must end the round with RUCCL_ERR_ABORTED: never PEER_LOST (the cause lost) nor
   PROTOCOL (a notice read as data).  Each round is a fresh session (group
   "race<r>"); RUCCL_RACE_ROUNDS sets how many (default 200). */
static void scenario_abortrace(peer_t *p, ruccl_comm_t **commp) {
  const char *env = getenv("RUCCL_RACE_ROUNDS");
  unsigned rounds = env ? (unsigned)atoi(env) : 200, mid = 0;
  const char *mb = getenv("RUCCL_RACE_MB");
  const size_t count = (mb ? (size_t)atoi(mb) : 4) << 18; /* floats: 4 MB by default */
  float *in = malloc(count * sizeof *in), *out = malloc(count * sizeof *out);
  for (size_t i = 0; i < count; i++) in[i] = 1.0f;
  ruccl_tensor_t ti = vec(in, count), to = vec(out, count);
  for (unsigned r = 0; r < rounds && !p->status; r++) {
    ruccl_comm_t *comm = *commp;
    if (r > 0) {
      ruccl_config_t cfg = p->cfg;
      char name[32];
      snprintf(name, sizeof name, "race%u", r);
      ruccl_config_set_group_name(&cfg, name);
      ruccl_result_t rc = ruccl_register(p->id, (ruccl_device_t){RUCCL_DEVICE_CPU, 0}, &cfg, &comm);
      CHECK(p, rc == RUCCL_OK, "round %u: register: %s", r, ruccl_error_string(rc));
      if (rc != RUCCL_OK) break;
      *commp = comm;
    }
    pthread_t t;
    call_later_t a = {comm, (r * 7919u) % 4000u, ruccl_comm_abort};
    if (p->id == 1) pthread_create(&t, NULL, call_later, &a);
    ruccl_result_t first = ruccl_all_reduce(comm, &ti, &to, RUCCL_SUM);
    ruccl_result_t then = first == RUCCL_OK ? ruccl_barrier(comm) : first;
    while (then == RUCCL_OK) then = ruccl_barrier(comm); /* the abort comes: every call ends with it */
    if (p->id == 1) pthread_join(t, NULL);
    CHECK(p, first == RUCCL_OK || first == RUCCL_ERR_ABORTED, "round %u: all_reduce: %s (%s)", r,
          ruccl_error_string(first), ruccl_last_error());
    CHECK(p, then == RUCCL_ERR_ABORTED, "round %u: after the abort: %s (%s)", r, ruccl_error_string(then),
          ruccl_last_error());
    if (first == RUCCL_ERR_ABORTED) mid++;
    ruccl_finish(comm);
    *commp = NULL;
  }
  fprintf(stderr, "peer %u: %u rounds, %u aborted inside the all-reduce\n", p->id, rounds, mid);
  free(in), free(out);
}

/* A pseudo-random value in [-1, 1) with a full mantissa, from (peer, case, index). */
static double rnd(uint32_t id, unsigned c, size_t i) {
  uint64_t x = ((uint64_t)id + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)c + 1) * 0xC2B2AE3D27D4EB4Full ^
               ((uint64_t)i + 1) * 0x165667B19E3779F9ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return (double)(x >> 11) / (double)(1ull << 52) - 1.0;
}

static void scenario_bits(peer_t *p, ruccl_comm_t *comm) {
  static const size_t counts[] = {1, 1000, 70001, 262147};
  unsigned c = 0;
  for (int dt = 0; dt < 2; dt++)
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
      for (int op = 0; op < 2; op++, c++) {
        size_t n = counts[k], es = dt ? 8 : 4;
        unsigned char *in = malloc(n * es), *out = malloc(n * es);
        CHECK(p, in && out, "no memory");
        for (size_t i = 0; i < n; i++) {
          if (dt) ((double *)in)[i] = rnd(p->id, c, i);
          else ((float *)in)[i] = (float)rnd(p->id, c, i);
        }
        ruccl_tensor_t tin = {.data = in, .dtype = dt ? RUCCL_FLOAT64 : RUCCL_FLOAT32, .ndim = 1,
                              .shape = {(int64_t)n}, .device = {RUCCL_DEVICE_CPU, 0}};
        ruccl_tensor_t tout = tin;
        tout.data = out;
        ruccl_result_t rc = ruccl_all_reduce(comm, &tin, &tout, op ? RUCCL_MEAN : RUCCL_SUM);
        uint64_t h = 1469598103934665603ull;
        size_t bad = n;
        for (size_t i = 0; rc == RUCCL_OK && i < n; i++) {
          double want = 0, got = dt ? ((double *)out)[i] : ((float *)out)[i];
          for (uint32_t q = 0; q < p->total; q++) want += dt ? rnd(q, c, i) : (double)(float)rnd(q, c, i);
          if (op) want /= p->total;
          if (bad == n && !(got - want < 1e-5 * p->total && want - got < 1e-5 * p->total)) bad = i;
        }
        for (size_t b = 0; b < n * es; b++) h = (h ^ out[b]) * 1099511628211ull;
        free(in);
        free(out);
        CHECK(p, rc == RUCCL_OK, "bits case %u: %s", c, ruccl_error_string(rc));
        CHECK(p, bad == n, "bits case %u: element %zu is not the sum", c, bad);
        fprintf(stderr, "bits %u %016llx\n", c, (unsigned long long)h);
      }
}

/* Tensors of a few 4 MiB slices and a short last one (the host-staged path runs
   them in slices): all-reduce out of place and in place, broadcast, reduce; values
   are small integers, so every result is exact. */
static void scenario_staged(peer_t *p, ruccl_comm_t *comm) {
  size_t n = (9u << 20) / 4 + 13;
  float *in = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
  CHECK(p, in && out, "no memory");
  size_t i;
  float total = 0;
  for (uint32_t q = 0; q < p->total; q++) total += (float)(q + 1);
  for (i = 0; i < n; i++) in[i] = (float)(p->id + 1) + (float)(i % 7);
  ruccl_tensor_t tin = vec(in, n), tout = vec(out, n);
  ruccl_result_t rc = ruccl_all_reduce(comm, &tin, &tout, RUCCL_SUM);
  CHECK(p, rc == RUCCL_OK, "staged all_reduce: %s", ruccl_error_string(rc));
  for (i = 0; i < n && (out[i] == total + (float)(p->total * (i % 7))); i++)
    continue;
  CHECK(p, i == n, "staged all_reduce: element %zu is %g", i, out[i]);
  for (i = 0; i < n && (in[i] == (float)(p->id + 1) + (float)(i % 7)); i++)
    continue;
  CHECK(p, i == n, "staged all_reduce changed input element %zu", i);
  rc = ruccl_all_reduce(comm, &tin, &tin, RUCCL_MAX);
  CHECK(p, rc == RUCCL_OK, "staged in-place all_reduce: %s", ruccl_error_string(rc));
  for (i = 0; i < n && (in[i] == (float)p->total + (float)(i % 7)); i++)
    continue;
  CHECK(p, i == n, "staged in-place max: element %zu is %g", i, in[i]);
  for (i = 0; i < n; i++) out[i] = p->id == 1 ? (float)i : -1.0f;
  rc = ruccl_broadcast_from(comm, &tout, 1);
  CHECK(p, rc == RUCCL_OK, "staged broadcast: %s", ruccl_error_string(rc));
  for (i = 0; i < n && (out[i] == (float)i); i++)
    continue;
  CHECK(p, i == n, "staged broadcast: element %zu is %g", i, out[i]);
  for (i = 0; i < n; i++) in[i] = 1.0f, out[i] = -1.0f;
  rc = ruccl_reduce(comm, &tin, p->id == 0 ? &tout : NULL, RUCCL_SUM, 0);
  CHECK(p, rc == RUCCL_OK, "staged reduce: %s", ruccl_error_string(rc));
  for (i = 0; i < n && (out[i] == (p->id == 0 ? (float)p->total : -1.0f)); i++)
    continue;
  CHECK(p, i == n, "staged reduce: element %zu is %g", i, out[i]);
  free(in);
  free(out);
}

enum { LAG_MS = 1000 };

static void scenario_lagfinish(peer_t *p, ruccl_comm_t *comm, size_t count) {
  uint32_t laggard = p->total - p->local; /* nodes hold consecutive blocks of ids */
  int lags = p->id == laggard;
  float *in = malloc(count * sizeof(float)), *out = malloc(count * sizeof(float));
  CHECK(p, in && out, "no memory");
  for (size_t i = 0; i < count; i++) in[i] = val(p->id, i);
  ruccl_tensor_t tin = vec(in, count), tout = vec(out, count);
  uint64_t before = ruccl_testing_recv_steps();
  CHECK(p, ruccl_all_reduce(comm, &tin, &tout, RUCCL_SUM) == RUCCL_OK, "first all_reduce");
  uint64_t steps = ruccl_testing_recv_steps() - before; /* the same algorithm runs again */
  if (lags) ruccl_testing_delay_recv_step(ruccl_testing_recv_steps() + steps - 1, LAG_MS);
  memset(out, 0, count * sizeof(float));
  ruccl_result_t rc = ruccl_all_reduce(comm, &tin, &tout, RUCCL_SUM);
  int64_t woke_all_reduce = ruccl_testing_delay_woke_ns();
  CHECK(p, rc == RUCCL_OK, "last all_reduce, the laggard's last step delayed: %s", ruccl_error_string(rc));
  for (size_t i = 0; i < count; i++)
    CHECK(p, out[i] == val_sum(p->total, i), "last all_reduce [%zu] = %g, want %g", i, out[i], val_sum(p->total, i));
  if (laggard != 0 && (p->id == 0 || lags)) {
    int32_t *msg = (int32_t *)out;
    ruccl_tensor_t t = {.data = msg, .dtype = RUCCL_INT32, .ndim = 1, .shape = {(int64_t)count}};
    if (lags) {
      memset(msg, 0, count * sizeof(int32_t));
      ruccl_testing_delay_recv_step(ruccl_testing_recv_steps(), LAG_MS);
      rc = ruccl_recv(comm, &t, 0);
      CHECK(p, rc == RUCCL_OK, "recv from peer 0, delayed: %s", ruccl_error_string(rc));
      for (size_t i = 0; i < count; i++) CHECK(p, msg[i] == p2p_val(0, laggard, i), "recv [%zu] = %d", i, msg[i]);
    } else {
      for (size_t i = 0; i < count; i++) msg[i] = p2p_val(0, laggard, i);
      CHECK(p, ruccl_send(comm, &t, laggard) == RUCCL_OK, "send to the laggard");
    }
  }
  if (p->first_local == laggard && laggard != 0) {
    /* a collective the other nodes never joined: they said they finished, and that
       notice came whole after all they had sent */
    rc = ruccl_all_reduce(comm, &tin, &tout, RUCCL_SUM);
    CHECK(p, rc == RUCCL_ERR_PEER_FINISHED, "all_reduce after the others finished: %s", ruccl_error_string(rc));
  }
  free(in);
  free(out);
  if (lags)
    fprintf(stderr, "laggard-woke %lld %lld\n", (long long)woke_all_reduce, (long long)ruccl_testing_delay_woke_ns());
  else
    fprintf(stderr, "finish-enter %u %lld\n", p->id, (long long)ruccl_now_ns());
}

static void *peer_main(void *arg) {
  peer_t *p = arg;
  ruccl_comm_t *comm = NULL;
  ruccl_result_t rc = ruccl_register(p->id, (ruccl_device_t){RUCCL_DEVICE_CPU, 0}, &p->cfg, &comm);
  if (rc != RUCCL_OK) {
    fprintf(stderr, "peer %u: register: %s\n", p->id, ruccl_last_error());
    p->status = 1;
    return NULL;
  }
  unsigned size = 0;
  ruccl_comm_size(comm, &size);
  if (size != p->total) {
    fprintf(stderr, "peer %u: comm size %u, want %u\n", p->id, size, p->total);
    p->status = 1;
  }
  if (!strcmp(p->scenario, "all")) scenario_all(p, comm);
  else if (!strcmp(p->scenario, "links")) scenario_links(p, comm);
  else if (!strcmp(p->scenario, "many")) scenario_many(p, comm);
  else if (!strcmp(p->scenario, "mismatch")) scenario_mismatch(p, comm);
  else if (!strcmp(p->scenario, "big")) scenario_big(p, comm);
  else if (!strcmp(p->scenario, "idle")) scenario_idle(p, comm);
  else if (!strcmp(p->scenario, "p2p")) scenario_p2p(p, comm);
  else if (!strcmp(p->scenario, "p2pbig")) scenario_p2pbig(p, comm);
  else if (!strcmp(p->scenario, "p2pflood")) scenario_p2pflood(p, comm);
  else if (!strcmp(p->scenario, "reset")) scenario_reset(p, comm);
  else if (!strcmp(p->scenario, "abortrace")) scenario_abortrace(p, &comm);
  else if (!strcmp(p->scenario, "finish")) scenario_finish(p, &comm);
  else if (!strcmp(p->scenario, "lagfinish")) scenario_lagfinish(p, comm, 1000);
  else if (!strcmp(p->scenario, "bits")) scenario_bits(p, comm);
  else if (!strcmp(p->scenario, "staged")) scenario_staged(p, comm);
  else if (!strcmp(p->scenario, "lagfinish-big")) scenario_lagfinish(p, comm, 4u << 20);
  else if (!run_recovery_scenario(p, &comm)) p->status = 2;
  if (comm) ruccl_finish(comm);
  return NULL;
}

/* ---- a key-value store in a directory: one file per key ---------------------------- */

static void key_path(const char *dir, const char *key, char *out, size_t cap) {
  int n = snprintf(out, cap, "%s/", dir);
  for (const char *k = key; *k && (size_t)n + 1 < cap; k++) out[n++] = *k == '/' ? '_' : *k;
  out[n] = 0;
}

static ruccl_result_t dir_set(void *ctx, const char *key, const void *value, size_t len) {
  char path[512], tmp[600];
  key_path(ctx, key, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) return RUCCL_ERR_IO;
  int ok = fwrite(value, 1, len, f) == len;
  ok &= fclose(f) == 0;
  return ok && rename(tmp, path) == 0 ? RUCCL_OK : RUCCL_ERR_IO;
}

static ruccl_result_t dir_get(void *ctx, const char *key, void *value, size_t cap, size_t *len, int64_t timeout_ms) {
  char path[512];
  key_path(ctx, key, path, sizeof path);
  for (int64_t waited = 0;; waited += 5) {
    FILE *f = fopen(path, "rb");
    if (f) {
      fseek(f, 0, SEEK_END);
      *len = (size_t)ftell(f);
      rewind(f);
      size_t got = fread(value, 1, *len < cap ? *len : cap, f);
      fclose(f);
      return got == (*len < cap ? *len : cap) ? RUCCL_OK : RUCCL_ERR_IO;
    }
    if (errno != ENOENT) return RUCCL_ERR_IO;
    if (waited >= timeout_ms) return RUCCL_ERR_TIMEOUT;
    nanosleep(&(struct timespec){0, 5000000}, NULL);
  }
}

static ruccl_result_t dir_add(void *ctx, const char *key, int64_t delta, int64_t *result) {
  char path[512];
  key_path(ctx, key, path, sizeof path);
  int fd = open(path, O_RDWR | O_CREAT, 0644);
  if (fd < 0 || flock(fd, LOCK_EX) != 0) return RUCCL_ERR_IO;
  char buf[32] = {0};
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  long long v = (n > 0 ? atoll(buf) : 0) + delta;
  int len = snprintf(buf, sizeof buf, "%lld", v);
  int ok = ftruncate(fd, 0) == 0 && pwrite(fd, buf, (size_t)len, 0) == len;
  close(fd); /* drops the lock */
  *result = v;
  return ok ? RUCCL_OK : RUCCL_ERR_IO;
}

int main(int argc, char **argv) {
  /* the tests of the host-staged path between processes (testing.h) */
  if (getenv("RUCCL_TEST_PRETEND_DEVICES")) ruccl_testing_pretend_devices(atoi(getenv("RUCCL_TEST_PRETEND_DEVICES")));
  if (argc < 6) {
    fprintf(stderr, "usage: %s ORCH NUM_NODES GROUP IDS SCENARIO [auto|centralized|tree|ring]\n", argv[0]);
    return 2;
  }
  unsigned num_nodes = (unsigned)atoi(argv[2]);
  uint32_t ids[MAX_LOCAL];
  unsigned n = 0;
  for (char *tok = strtok(argv[4], ","); tok && n < MAX_LOCAL; tok = strtok(NULL, ",")) ids[n++] = (uint32_t)atoi(tok);
  ruccl_strategy_t s = {RUCCL_STRATEGY_AUTO, 2};
  if (argc > 6 && !strcmp(argv[6], "centralized")) s.kind = RUCCL_STRATEGY_CENTRALIZED;
  if (argc > 6 && !strcmp(argv[6], "tree")) s.kind = RUCCL_STRATEGY_TREE;
  if (argc > 6 && !strcmp(argv[6], "ring")) s.kind = RUCCL_STRATEGY_RING;
  ruccl_config_t cfg = ruccl_config_default();
  const char *secret = getenv("RUCCL_SECRET") ? getenv("RUCCL_SECRET") : ""; /* "": the core's own look-up */
  /* the address this node's data port listens on (another network namespace's) */
  const char *node_address = getenv("RUCCL_TEST_NODE_ADDRESS") ? getenv("RUCCL_TEST_NODE_ADDRESS") : "127.0.0.1";
  if (ruccl_config_set_num_devices(&cfg, n) || ruccl_config_set_num_nodes(&cfg, num_nodes) ||
      (strncmp(argv[1], "dir:", 4) == 0
           ? ruccl_config_set_store(&cfg, &(ruccl_store_t){dir_set, dir_get, dir_add, argv[1] + 4})
           : ruccl_config_set_global_address(&cfg, argv[1])) ||
      ruccl_config_set_node_address(&cfg, node_address) ||
      ruccl_config_set_data_service_port(&cfg, argc > 7 ? (unsigned)atoi(argv[7]) : 0) || ruccl_config_set_group_name(&cfg, argv[3]) ||
      ruccl_config_set_secret(&cfg, secret, strlen(secret)) || ruccl_config_set_local_strategy(&cfg, s) ||
      ruccl_config_set_global_strategy(&cfg, s) || ruccl_config_set_timeout_ms(&cfg, 20000)) {
    fprintf(stderr, "config: %s\n", ruccl_last_error());
    return 2;
  }
  /* RUCCL_TEST_DIE_AFTER_TABLE_PEER: the node of that peer exits (7) once it has the table */
  const char *die = getenv("RUCCL_TEST_DIE_AFTER_TABLE_PEER");
  for (unsigned i = 0; die && i < n; i++)
    if (ids[i] == (uint32_t)atoi(die)) ruccl_testing_set_die_after_table(1);
  /* RUCCL_TEST_FREEZE_AFTER_TABLE_PEER: the node of that peer stops itself (SIGSTOP) there */
  const char *freeze = getenv("RUCCL_TEST_FREEZE_AFTER_TABLE_PEER");
  for (unsigned i = 0; freeze && i < n; i++)
    if (ids[i] == (uint32_t)atoi(freeze)) ruccl_testing_set_die_after_table(2);
  /* RUCCL_TEST_DIE_IN_AGREE_PEER: the node of that peer dies while it coordinates an agreement */
  const char *die_agree = getenv("RUCCL_TEST_DIE_IN_AGREE_PEER");
  for (unsigned i = 0; die_agree && i < n; i++)
    if (ids[i] == (uint32_t)atoi(die_agree))
      ruccl_testing_set_die_in_agreement(getenv("RUCCL_TEST_DIE_IN_AGREE_MODE") ? atoi(getenv("RUCCL_TEST_DIE_IN_AGREE_MODE")) : 1);
  /* RUCCL_TEST_SILENT_PEER: the node of that peer sends no liveness beats */
  const char *silent = getenv("RUCCL_TEST_SILENT_PEER");
  for (unsigned i = 0; silent && i < n; i++)
    if (ids[i] == (uint32_t)atoi(silent)) ruccl_testing_silence_beats(1);
  /* RUCCL_TEST_LIVENESS_API_MS: the liveness timeout through the configuration */
  if (getenv("RUCCL_TEST_LIVENESS_API_MS") &&
      ruccl_config_set_liveness_timeout_ms(&cfg, atoll(getenv("RUCCL_TEST_LIVENESS_API_MS"))) != RUCCL_OK) {
    fprintf(stderr, "config: %s\n", ruccl_last_error());
    return 2;
  }
  peer_t peers[MAX_LOCAL];
  pthread_t threads[MAX_LOCAL];
  for (unsigned i = 0; i < n; i++) {
    peers[i] = (peer_t){.id = ids[i], .cfg = cfg, .scenario = argv[5], .total = n * num_nodes, .local = n};
    peers[i].first_local = ids[0];
    for (unsigned k = 1; k < n; k++)
      if (ids[k] < peers[i].first_local) peers[i].first_local = ids[k];
    pthread_create(&threads[i], NULL, peer_main, &peers[i]);
  }
  int status = 0;
  for (unsigned i = 0; i < n; i++) {
    pthread_join(threads[i], NULL);
    if (peers[i].status > status) status = peers[i].status;
  }
  return status;
}
