/* all_reduce.c — the ruCCL check: a ring all-reduce with 4 logical ranks (threads of
 * this process) over 257 FP32 elements.  It checks the sum and the mean, that the
 * inputs are unchanged, and that every session finishes; it exits non-zero on any
 * failure.  With a CUDA build, RUCCL_EXAMPLE_DEVICE=cuda puts every rank on GPU 0. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ruccl.h"

#define RANKS 4
#define COUNT 257

typedef struct {
  uint32_t peer_id;
  ruccl_config_t config;
  int failures;
} rank_t;

static float input_value(uint32_t rank, int i) { return (float)(rank + 1) * 0.5f + (float)i; }

static int check(rank_t *r, const char *what, ruccl_result_t rc) {
  if (rc == RUCCL_OK) return 1;
  fprintf(stderr, "rank %u: %s failed: %s (%s)\n", r->peer_id, what, ruccl_error_string(rc), ruccl_last_error());
  r->failures++;
  return 0;
}

static void *run_rank(void *arg) {
  rank_t *r = arg;
  ruccl_device_t dev = {RUCCL_DEVICE_CPU, 0};
  ruccl_comm_t *comm = NULL;
  if (!check(r, "register", ruccl_register(r->peer_id, dev, &r->config, &comm))) return NULL;

  float in[COUNT], sum[COUNT], mean[COUNT];
  for (int i = 0; i < COUNT; i++) in[i] = input_value(r->peer_id, i);
  ruccl_tensor_t tin = {.data = in, .dtype = RUCCL_FLOAT32, .ndim = 1, .shape = {COUNT}, .device = dev};
  ruccl_tensor_t tsum = tin, tmean = tin;
  tsum.data = sum;
  tmean.data = mean;

  if (check(r, "all_reduce(SUM)", ruccl_all_reduce(comm, &tin, &tsum, RUCCL_SUM)) &&
      check(r, "all_reduce(MEAN)", ruccl_all_reduce(comm, &tin, &tmean, RUCCL_MEAN))) {
    for (int i = 0; i < COUNT; i++) {
      float want = 0;
      for (uint32_t k = 0; k < RANKS; k++) want += input_value(k, i);
      if (sum[i] != want || fabsf(mean[i] - want / RANKS) > 1e-5f * fabsf(want) ||
          in[i] != input_value(r->peer_id, i)) {
        fprintf(stderr, "rank %u: element %d: sum %g mean %g input %g, want %g %g %g\n", r->peer_id, i, sum[i],
                mean[i], in[i], want, want / RANKS, input_value(r->peer_id, i));
        r->failures++;
        break;
      }
    }
  }
  check(r, "finish", ruccl_finish(comm));
  return NULL;
}

int main(void) {
  ruccl_config_t config = ruccl_config_default();
  ruccl_strategy_t ring = {RUCCL_STRATEGY_RING, 0};
  if (ruccl_config_set_num_devices(&config, RANKS) != RUCCL_OK ||
      ruccl_config_set_local_strategy(&config, ring) != RUCCL_OK ||
      ruccl_config_set_timeout_ms(&config, 30000) != RUCCL_OK) {
    fprintf(stderr, "config: %s\n", ruccl_last_error());
    return 1;
  }
  pthread_t threads[RANKS];
  rank_t ranks[RANKS];
  for (int i = 0; i < RANKS; i++) {
    ranks[i] = (rank_t){.peer_id = (uint32_t)i, .config = config};
    pthread_create(&threads[i], NULL, run_rank, &ranks[i]);
  }
  int failures = 0;
  for (int i = 0; i < RANKS; i++) {
    pthread_join(threads[i], NULL);
    failures += ranks[i].failures;
  }
  if (failures) {
    fprintf(stderr, "all_reduce: FAILED (%d failures)\n", failures);
    return 1;
  }
  printf("all_reduce: %d ranks x %d float32 (ring): sum, mean, inputs preserved, sessions finished: OK\n", RANKS,
         COUNT);
  return 0;
}
