/* node_recovery.c — the recovery scenarios of ruccl-test-node (revoke, agree,
 * shrink), run as real processes by test_multinode.cc.  IDS across the nodes must be
 * 0..total-1.
 *   shrink     1M-float all-reduces until one fails (the test kills a node once
 *              every peer printed "running"); then agree and shrink, and an all-reduce
 *              over the survivors, checked.  Prints "peer ID: agreed FLAGS failed
 *              A,B," and "peer ID: recovered in MS ms" (from the failure's return to
 *              the shrunk group's first all-reduce done) to stderr
 *   agreedie   an all-reduce, then the same agree and shrink, while the node of peer
 *              RUCCL_TEST_DIE_IN_AGREE_PEER coordinates the agreement and dies in it
 *              (RUCCL_TEST_DIE_IN_AGREE_MODE=2: it dies right after it sent the decision
 *              to the first node it asked, so the others must get it from that node)
 *   xmismatch  every peer shrinks; the node of peer 1 excludes the first node's peers,
 *              the others exclude nobody: every caller (the first node's too) must get
 *              RUCCL_ERR_INVALID_ARGUMENT
 *   revoke     RUCCL_TEST_ROUNDS (5) rounds: a 64 MB all-reduce that a thread of peer
 *              1 revokes after a varying delay: every peer must see REVOKED (in it or
 *              in the barrier after), agree (nobody failed), shrink to the same peers
 *              and go on with the new communicator
 *   revoke2    two communicators on the same peers: peer 0 revokes the first; the
 *              second's all-reduce must go on, right
 *   exclude    the last node's peers finish at once; the others shrink them away
 *              with an exclude list (nobody failed) and all-reduce, checked */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "node_common.h"
#include "transport.h" /* ruccl_now_ns */

/* An all-reduce (SUM) of count floats over comm, whose peers are those of `alive`
   (by id): 0 when every element is right. */
static int checked_all_reduce(peer_t *p, ruccl_comm_t *comm, const unsigned char *alive, size_t count) {
  float *a = malloc(count * sizeof(float)), *b = malloc(count * sizeof(float));
  int bad = !a || !b;
  for (size_t i = 0; !bad && i < count; i++) a[i] = val(p->id, i);
  ruccl_tensor_t ta = vec(a, count), tb = vec(b, count);
  ruccl_result_t rc = bad ? RUCCL_ERR_NO_MEMORY : ruccl_all_reduce(comm, &ta, &tb, RUCCL_SUM);
  bad = rc != RUCCL_OK;
  if (bad) fprintf(stderr, "peer %u: all_reduce: %s (%s)\n", p->id, ruccl_error_string(rc), ruccl_last_error());
  for (size_t i = 0; !bad && i < count; i++) {
    float want = 0;
    for (uint32_t k = 0; k < p->total; k++)
      if (alive[k]) want += val(k, i);
    if (b[i] != want) {
      fprintf(stderr, "peer %u: all_reduce[%zu] = %g, want %g\n", p->id, i, b[i], want);
      bad = 1;
    }
  }
  free(a);
  free(b);
  return bad;
}

/* Agree (flags: every bit but the id's), shrink away the failed peers, and check
   the new communicator with an all-reduce.  *comm becomes the new one (the old is
   finished).  expect_failed: how many peers must be found lost, or -1: any. */
static void agree_and_shrink(peer_t *p, ruccl_comm_t **comm, int expect_failed, int64_t failed_at_ns,
                             const uint32_t *exclude, size_t num_exclude) {
  uint32_t flags = ~(1u << (p->id % 32)), failed[64];
  size_t nf = 0;
  int64_t agree_at = ruccl_now_ns();
  ruccl_result_t rc = ruccl_comm_agree(*comm, &flags, failed, 64, &nf);
  int64_t agreed_at = ruccl_now_ns();
  CHECK(p, rc == RUCCL_OK, "agree: %s", ruccl_error_string(rc));
  char text[512];
  size_t used = (size_t)snprintf(text, sizeof text, "peer %u: agreed %08x failed ", p->id, flags);
  unsigned char alive[256];
  memset(alive, 1, sizeof alive);
  for (size_t i = 0; i < nf && i < 64 && used < sizeof text; i++) {
    used += (size_t)snprintf(text + used, sizeof text - used, "%u,", failed[i]);
    if (failed[i] < 256) alive[failed[i]] = 0;
  }
  fprintf(stderr, "%s\n", text);
  CHECK(p, expect_failed < 0 || nf == (size_t)expect_failed, "agree: %zu failed, want %d", nf, expect_failed);
  uint32_t want = UINT32_MAX;
  for (uint32_t k = 0; k < p->total; k++)
    if (alive[k]) want &= ~(1u << (k % 32));
  CHECK(p, flags == want, "agree: flags %08x, want %08x", flags, want);
  for (size_t i = 0; i < num_exclude; i++) alive[exclude[i]] = 0;
  ruccl_comm_t *small = NULL;
  rc = ruccl_comm_shrink(*comm, exclude, num_exclude, &small);
  int64_t shrunk_at = ruccl_now_ns();
  CHECK(p, rc == RUCCL_OK && small, "shrink: %s", ruccl_error_string(rc));
  ruccl_finish(*comm);
  *comm = small;
  unsigned size = 0, index = 0, left = 0, below = 0;
  ruccl_comm_size(small, &size);
  ruccl_comm_index(small, &index);
  for (uint32_t k = 0; k < p->total; k++) left += alive[k], below += alive[k] && k < p->id;
  CHECK(p, size == left && index == below, "shrunk: size %u index %u, want %u and %u", size, index, left, below);
  CHECK(p, checked_all_reduce(p, small, alive, 100003) == 0, "all_reduce after the shrink");
  int64_t done_at = ruccl_now_ns();
  if (failed_at_ns) {
    fprintf(stderr, "peer %u: recovered in %.1f ms\n", p->id, (double)(done_at - failed_at_ns) / 1e6);
    /* CLOCK_MONOTONIC stamps, for bench/shrink_bench.py */
    fprintf(stderr, "peer %u: stamps failed %lld agree %lld agreed %lld shrunk %lld done %lld\n", p->id,
            (long long)failed_at_ns, (long long)agree_at, (long long)agreed_at, (long long)shrunk_at,
            (long long)done_at);
  }
  fprintf(stderr, "peer %u: shrunk to %u, right\n", p->id, size);
}

static void scenario_shrink(peer_t *p, ruccl_comm_t **comm) {
  size_t count = 1u << 20;
  float *a = malloc(count * sizeof(float)), *b = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; i++) a[i] = 1.0f;
  ruccl_tensor_t ta = vec(a, count), tb = vec(b, count);
  ruccl_result_t rc = RUCCL_OK;
  for (int it = 0; it < 1000000 && rc == RUCCL_OK; it++) {
    rc = ruccl_all_reduce(*comm, &ta, &tb, RUCCL_SUM);
    if (it == 0 && rc == RUCCL_OK) fprintf(stderr, "peer %u: running\n", p->id);
  }
  int64_t failed_at = ruccl_now_ns();
  free(a);
  free(b);
  fprintf(stderr, "peer %u: all_reduce ended with %s\n", p->id, ruccl_error_string(rc));
  CHECK(p, rc == RUCCL_ERR_PEER_LOST, "the all-reduces ended with %s", ruccl_error_string(rc));
  agree_and_shrink(p, comm, -1, failed_at, NULL, 0);
}

static void scenario_agreedie(peer_t *p, ruccl_comm_t **comm) {
  unsigned char all[256];
  memset(all, 1, sizeof all);
  CHECK(p, checked_all_reduce(p, *comm, all, 1000) == 0, "all_reduce before");
  agree_and_shrink(p, comm, -1, 0, NULL, 0);
}


static void scenario_revoke(peer_t *p, ruccl_comm_t **comm) {
  unsigned rounds = getenv("RUCCL_TEST_ROUNDS") ? (unsigned)atoi(getenv("RUCCL_TEST_ROUNDS")) : 5;
  size_t count = 16u << 20; /* 64 MB */
  float *a = malloc(count * sizeof(float)), *b = malloc(count * sizeof(float));
  CHECK(p, a && b, "no memory");
  for (size_t i = 0; i < count; i++) a[i] = 1.0f;
  ruccl_tensor_t ta = vec(a, count), tb = vec(b, count);
  for (unsigned r = 0; r < rounds && p->status == 0; r++) {
    pthread_t t;
    call_later_t rv = {*comm, (r * 7919u) % 40000u, ruccl_comm_revoke}; /* 0 .. 40 ms: mostly inside the 64 MB */
    if (p->id == 1) pthread_create(&t, NULL, call_later, &rv);
    ruccl_result_t first = ruccl_all_reduce(*comm, &ta, &tb, RUCCL_SUM);
    ruccl_result_t then = first == RUCCL_OK ? ruccl_barrier(*comm) : first;
    if (p->id == 1) pthread_join(t, NULL);
    if (first == RUCCL_OK && then == RUCCL_OK) then = ruccl_barrier(*comm); /* the revoke came after both */
    fprintf(stderr, "peer %u: round %u: %s then %s\n", p->id, r, ruccl_error_string(first), ruccl_error_string(then));
    if (then != RUCCL_ERR_REVOKED) {
      fprintf(stderr, "peer %u: round %u: after the revoke: %s (%s)\n", p->id, r, ruccl_error_string(then),
              ruccl_last_error());
      p->status = 1;
      break;
    }
    agree_and_shrink(p, comm, 0, 0, NULL, 0);
  }
  free(a);
  free(b);
}

static void scenario_revoke2(peer_t *p, ruccl_comm_t **comm) {
  ruccl_config_t cfg = p->cfg;
  char name[RUCCL_MAX_GROUP_NAME];
  snprintf(name, sizeof name, "%.40s-b", cfg.group_name);
  ruccl_config_set_group_name(&cfg, name);
  ruccl_comm_t *other = NULL;
  ruccl_result_t rc = ruccl_register(p->id, (ruccl_device_t){RUCCL_DEVICE_CPU, 0}, &cfg, &other);
  CHECK(p, rc == RUCCL_OK, "register the second communicator: %s", ruccl_error_string(rc));
  unsigned char all[256];
  memset(all, 1, sizeof all);
  if (p->id == 0) ruccl_comm_revoke(*comm);
  rc = ruccl_barrier(*comm);
  int bad = checked_all_reduce(p, other, all, 100003);
  ruccl_result_t again = ruccl_barrier(other);
  ruccl_finish(other);
  CHECK(p, rc == RUCCL_ERR_REVOKED, "the revoked communicator's barrier: %s", ruccl_error_string(rc));
  CHECK(p, !bad && again == RUCCL_OK, "the other communicator must go on");
}

static void scenario_exclude(peer_t *p, ruccl_comm_t **comm) {
  unsigned char all[256];
  memset(all, 1, sizeof all);
  CHECK(p, checked_all_reduce(p, *comm, all, 1000) == 0, "all_reduce before");
  uint32_t exclude[MAX_LOCAL];
  for (unsigned i = 0; i < p->local; i++) exclude[i] = p->total - p->local + i;
  if (p->id >= p->total - p->local) return; /* excluded: finishes */
  agree_and_shrink(p, comm, -1, 0, exclude, p->local); /* the excluded may be gone by then */
}

static void scenario_xmismatch(peer_t *p, ruccl_comm_t **comm) {
  uint32_t first_node[MAX_LOCAL];
  for (unsigned i = 0; i < p->local; i++) first_node[i] = i; /* ids 0 .. local-1: node 0's */
  int on_node1 = p->id >= p->local && p->id < 2 * p->local;
  ruccl_comm_t *small = NULL;
  ruccl_result_t rc = ruccl_comm_shrink(*comm, on_node1 ? first_node : NULL, on_node1 ? p->local : 0, &small);
  fprintf(stderr, "peer %u: shrink with %s list: %s (%s)\n", p->id, on_node1 ? "its" : "an empty",
          ruccl_error_string(rc), ruccl_last_error());
  if (small) ruccl_finish(small);
  CHECK(p, rc == RUCCL_ERR_INVALID_ARGUMENT, "shrink with differing exclude lists: %s", ruccl_error_string(rc));
}

int run_recovery_scenario(peer_t *p, ruccl_comm_t **comm) {
  if (!strcmp(p->scenario, "shrink")) scenario_shrink(p, comm);
  else if (!strcmp(p->scenario, "agreedie")) scenario_agreedie(p, comm);
  else if (!strcmp(p->scenario, "xmismatch")) scenario_xmismatch(p, comm);
  else if (!strcmp(p->scenario, "revoke")) scenario_revoke(p, comm);
  else if (!strcmp(p->scenario, "revoke2")) scenario_revoke2(p, comm);
  else if (!strcmp(p->scenario, "exclude")) scenario_exclude(p, comm);
  else return 0;
  return 1;
}
