/* all_reduce.c — the ruCCL check: a ring all-reduce with 4 logical ranks (threads of
 * this process) over 257 FP32 elements.  It checks the sum and the mean, that the
 * inputs are unchanged, and that every session finishes; it exits non-zero on any
 * failure.  `--device cuda` (or RUCCL_EXAMPLE_DEVICE=cuda) puts every rank's tensors
 * on GPU 0; a build without CUDA, or a machine without a usable GPU, refuses it with
 * the library's error and a non-zero exit. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef RUCCL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "ruccl.h"

#define RANKS 4
#define COUNT 257

typedef struct {
  uint32_t peer_id;
  ruccl_config_t config;
  ruccl_device_t device;
  int failures;
} rank_t;

static float input_value(uint32_t rank, int i) { return (float)(rank + 1) * 0.5f + (float)i; }

static int check(rank_t *r, const char *what, ruccl_result_t rc) {
  if (rc == RUCCL_OK) return 1;
  fprintf(stderr, "rank %u: %s failed: %s (%s)\n", r->peer_id, what, ruccl_error_string(rc), ruccl_last_error());
  r->failures++;
  return 0;
}

#ifdef RUCCL_HAVE_CUDA
static int check_cuda(rank_t *r, const char *what, cudaError_t err) {
  if (err == cudaSuccess) return 1;
  fprintf(stderr, "rank %u: %s failed: %s\n", r->peer_id, what, cudaGetErrorString(err));
  r->failures++;
  return 0;
}
#endif

/* The rank's three tensors' memory on its device: in (filled from host_in), sum and
   mean.  Returns 0 (a failure counted) when they cannot be had. */
static int device_buffers(rank_t *r, const float *host_in, float *dev[3]) {
  dev[0] = dev[1] = dev[2] = NULL;
#ifdef RUCCL_HAVE_CUDA
  size_t bytes = sizeof(float) * COUNT;
  return check_cuda(r, "cudaSetDevice", cudaSetDevice(r->device.index)) &&
         check_cuda(r, "cudaMalloc", cudaMalloc((void **)&dev[0], bytes)) &&
         check_cuda(r, "cudaMalloc", cudaMalloc((void **)&dev[1], bytes)) &&
         check_cuda(r, "cudaMalloc", cudaMalloc((void **)&dev[2], bytes)) &&
         check_cuda(r, "cudaMemcpy to the GPU", cudaMemcpy(dev[0], host_in, bytes, cudaMemcpyHostToDevice));
#else
  (void)host_in;
  fprintf(stderr, "rank %u: this example was built without CUDA\n", r->peer_id);
  r->failures++;
  return 0;
#endif
}

/* Copies the device tensors back into in, sum and mean (host arrays). */
static int device_results(rank_t *r, float *dev[3], float *in, float *sum, float *mean) {
#ifdef RUCCL_HAVE_CUDA
  size_t bytes = sizeof(float) * COUNT;
  return check_cuda(r, "cudaMemcpy from the GPU", cudaMemcpy(in, dev[0], bytes, cudaMemcpyDeviceToHost)) &&
         check_cuda(r, "cudaMemcpy from the GPU", cudaMemcpy(sum, dev[1], bytes, cudaMemcpyDeviceToHost)) &&
         check_cuda(r, "cudaMemcpy from the GPU", cudaMemcpy(mean, dev[2], bytes, cudaMemcpyDeviceToHost));
#else
  (void)r, (void)dev, (void)in, (void)sum, (void)mean;
  return 0;
#endif
}

static void device_free(float *dev[3]) {
#ifdef RUCCL_HAVE_CUDA
  for (int k = 0; k < 3; k++)
    if (dev[k]) cudaFree(dev[k]);
#else
  (void)dev;
#endif
}

static void *run_rank(void *arg) {
  rank_t *r = arg;
  ruccl_comm_t *comm = NULL;
  /* The library checks the device first: a CUDA device this build or this machine
     cannot use is refused here, before anything touches it. */
  if (!check(r, "register", ruccl_register(r->peer_id, r->device, &r->config, &comm))) return NULL;

  float in[COUNT], sum[COUNT], mean[COUNT];
  for (int i = 0; i < COUNT; i++) in[i] = input_value(r->peer_id, i);
  float *dev[3] = {in, sum, mean};
  int on_gpu = r->device.kind == RUCCL_DEVICE_CUDA;
  if (on_gpu && !device_buffers(r, in, dev)) {
    device_free(dev);
    check(r, "finish", ruccl_finish(comm));
    return NULL;
  }
  ruccl_tensor_t tin = {.data = dev[0], .dtype = RUCCL_FLOAT32, .ndim = 1, .shape = {COUNT}, .device = r->device};
  ruccl_tensor_t tsum = tin, tmean = tin;
  tsum.data = dev[1];
  tmean.data = dev[2];

  if (check(r, "all_reduce(SUM)", ruccl_all_reduce(comm, &tin, &tsum, RUCCL_SUM)) &&
      check(r, "all_reduce(MEAN)", ruccl_all_reduce(comm, &tin, &tmean, RUCCL_MEAN)) &&
      (!on_gpu || device_results(r, dev, in, sum, mean))) {
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
  if (on_gpu) device_free(dev);
  check(r, "finish", ruccl_finish(comm));
  return NULL;
}

static int usage(void) {
  fprintf(stderr, "usage: all_reduce [--device cpu|cuda]   (or RUCCL_EXAMPLE_DEVICE=cpu|cuda)\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *device = getenv("RUCCL_EXAMPLE_DEVICE");
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
      device = argv[++i];
    else if (strncmp(argv[i], "--device=", 9) == 0)
      device = argv[i] + 9;
    else
      return usage();
  }
  if (!device || !*device) device = "cpu";
  ruccl_device_t dev = {RUCCL_DEVICE_CPU, 0};
  if (strcmp(device, "cuda") == 0)
    dev.kind = RUCCL_DEVICE_CUDA;
  else if (strcmp(device, "cpu") != 0)
    return usage();

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
    ranks[i] = (rank_t){.peer_id = (uint32_t)i, .config = config, .device = dev};
    pthread_create(&threads[i], NULL, run_rank, &ranks[i]);
  }
  int failures = 0;
  for (int i = 0; i < RANKS; i++) {
    pthread_join(threads[i], NULL);
    failures += ranks[i].failures;
  }
  const char *where = dev.kind == RUCCL_DEVICE_CUDA ? "cuda:0" : "cpu";
  if (failures) {
    fprintf(stderr, "all_reduce: FAILED on %s (%d failures)\n", where, failures);
    return 1;
  }
  printf("all_reduce: %d ranks x %d float32 (ring) on %s: sum, mean, inputs preserved, sessions finished: OK\n",
         RANKS, COUNT, where);
  return 0;
}
