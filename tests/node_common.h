/* node_common.h — what the scenarios of ruccl-test-node share (node_main.c,
   node_recovery.c). */
#ifndef RUCCL_NODE_COMMON_H
#define RUCCL_NODE_COMMON_H

#include <stdio.h>
#include <time.h>

#include "ruccl.h"

#define MAX_LOCAL 16

typedef struct {
  uint32_t id;
  ruccl_config_t cfg;
  const char *scenario;
  unsigned total;
  unsigned local; /* peers of this node: ids first_local .. first_local + local - 1 */
  uint32_t first_local;
  int status; /* 0 ok, else exit code */
} peer_t;

static inline ruccl_tensor_t vec(float *data, size_t n) {
  ruccl_tensor_t t = {.data = data, .dtype = RUCCL_FLOAT32, .ndim = 1, .shape = {(int64_t)n},
                      .device = {RUCCL_DEVICE_CPU, 0}};
  return t;
}

#define CHECK(p, cond, ...)                          \
  do {                                               \
    if (!(cond)) {                                   \
      fprintf(stderr, "peer %u: ", (p)->id);         \
      fprintf(stderr, __VA_ARGS__);                  \
      fprintf(stderr, " [%s]\n", ruccl_last_error()); \
      (p)->status = 1;                               \
      return;                                        \
    }                                                \
  } while (0)

static inline float val(uint32_t id, size_t i) { return (float)(id + 1) + (float)(i % 13); }
/* element i summed over the peers 0 .. n-1 */
static inline float val_sum(unsigned n, size_t i) {
  float sum = 0;
  for (uint32_t k = 0; k < n; k++) sum += val(k, i);
  return sum;
}

/* A thread's job: after delay_us, call(comm) (an abort, a revoke racing the owner's
   collective). */
typedef struct {
  ruccl_comm_t *comm;
  unsigned delay_us;
  ruccl_result_t (*call)(ruccl_comm_t *);
} call_later_t;

static inline void *call_later(void *arg) {
  call_later_t *a = arg;
  struct timespec pause = {a->delay_us / 1000000, (long)(a->delay_us % 1000000) * 1000};
  nanosleep(&pause, NULL);
  a->call(a->comm);
  return NULL;
}

/* The recovery scenarios (node_recovery.c): 1 when `scenario` is one of them. */
int run_recovery_scenario(peer_t *p, ruccl_comm_t **comm);

#endif
