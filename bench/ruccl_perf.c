/* ruccl_perf.c — ruccl-perf, the collective benchmark.  Its table follows nccl-tests
 * (size, count, type, redop, root; time, algbw, busbw and #wrong for out-of-place
 * and in-place), and the same run measures a plain memcpy bandwidth as reference.
 *
 *   ruccl-perf [-c all_reduce|broadcast|reduce|all_gather|reduce_scatter]
 *              [-n peers] [-N processes] [-b min_bytes] [-e max_bytes] [-f factor]
 *              [-s auto|centralized|tree|ring] [-w warmup] [-i iters] [-d cpu|cuda]
 *
 * -d cuda (a CUDA build) puts every peer's buffers in GPU 0's memory; the same run
 * then measures a device-to-device copy and pinned host<->device copies as the
 * references (the same-GPU path is checked against the first, the host-staged
 * path against the second).
 *
 * Peers are -n threads of one process (the in-process transport); with -N P > 1,
 * P processes of -n peers each form a multi-node session on 127.0.0.1 through an
 * orchestrator this program starts, and the same run measures a raw single-stream
 * loopback TCP throughput as the reference for the network, and prints the processes'
 * registration times, resident memory and sockets (median and largest, "# scale:").  busbw follows
 * nccl-tests: all_reduce x 2(n-1)/n, all_gather and reduce_scatter x (n-1)/n,
 * broadcast and reduce x 1; "size" is the bytes of one peer's full buffer. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ruccl.h"
#ifdef RUCCL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

typedef enum { C_ALL_REDUCE, C_BROADCAST, C_REDUCE, C_ALL_GATHER, C_REDUCE_SCATTER } coll_t;
static const char *const coll_names[] = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter"};

/* What one process of a multi-process run reports (in memory shared with the parent):
   its first peer's registration time, and after the warm-up its resident memory and
   how many sockets it holds. */
typedef struct {
  double register_s;
  long rss_kb;
  int sockets;
  int reported;
} node_stats_t;

typedef struct {
  coll_t coll;
  unsigned peers; /* per process */
  unsigned nodes; /* processes */
  unsigned total; /* peers of all processes */
  unsigned node;  /* this process */
  size_t min_bytes, max_bytes;
  unsigned factor;
  ruccl_strategy_t strategy;
  int warmup, iters;
  int cuda; /* -d cuda: the buffers are on GPU 0 */
  int warm_barriers; /* barriers before anything is timed (200; fewer at scale) */
  node_stats_t *stats; /* [nodes], shared with the parent: multi-process runs */
} options_t;

typedef struct {
  const options_t *opt;
  uint32_t id;
  node_stats_t *stats; /* this process's, filled by its first peer; NULL: not asked */
  ruccl_config_t config;
  double *times; /* [size index][in_place]: seconds per iteration, written by peer 0 */
  long *wrong;   /* [size index][in_place], summed over peers */
  pthread_mutex_t *mu;
  int failed;
} peer_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse(int argc, char **argv, options_t *o) {
  *o = (options_t){.coll = C_ALL_REDUCE, .peers = 2, .nodes = 1, .min_bytes = 8, .max_bytes = 64u << 20,
                   .factor = 2, .strategy = {RUCCL_STRATEGY_AUTO, 2}, .warmup = 5, .iters = 20};
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *k = argv[i], *v = argv[i + 1];
    if (!strcmp(k, "-c")) {
      int found = 0;
      for (int c = 0; c < 5; c++)
        if (!strcmp(v, coll_names[c])) o->coll = (coll_t)c, found = 1;
      if (!found) return -1;
    } else if (!strcmp(k, "-n")) o->peers = (unsigned)atoi(v);
    else if (!strcmp(k, "-N")) o->nodes = (unsigned)atoi(v);
    else if (!strcmp(k, "-b")) o->min_bytes = strtoull(v, NULL, 10);
    else if (!strcmp(k, "-e")) o->max_bytes = strtoull(v, NULL, 10);
    else if (!strcmp(k, "-f")) o->factor = (unsigned)atoi(v);
    else if (!strcmp(k, "-w")) o->warmup = atoi(v);
    else if (!strcmp(k, "-i")) o->iters = atoi(v);
    else if (!strcmp(k, "-d")) {
      if (!strcmp(v, "cuda")) o->cuda = 1;
      else if (strcmp(v, "cpu")) return -1;
    }
    else if (!strcmp(k, "-s")) {
      if (!strcmp(v, "auto")) o->strategy.kind = RUCCL_STRATEGY_AUTO;
      else if (!strcmp(v, "centralized")) o->strategy.kind = RUCCL_STRATEGY_CENTRALIZED;
      else if (!strcmp(v, "tree")) o->strategy.kind = RUCCL_STRATEGY_TREE;
      else if (!strcmp(v, "ring")) o->strategy.kind = RUCCL_STRATEGY_RING;
      else return -1;
    } else return -1;
  }
  o->total = o->peers * o->nodes;
  /* 200 barriers warm a small session; a session of hundreds of processes on a few
     cores takes tens of milliseconds a barrier: 10 there */
  o->warm_barriers = o->nodes > 64 ? 10 : 200;
  if (o->peers < 1 || o->nodes < 1 || o->min_bytes < 4 || o->max_bytes < o->min_bytes || o->factor < 2 || o->iters < 1) return -1;
  return 0;
}

static unsigned num_sizes(const options_t *o) {
  unsigned k = 0;
  for (size_t b = o->min_bytes; b <= o->max_bytes; b *= o->factor) k++;
  return k;
}

/* Elements of the full per-peer buffer, rounded to what the collective can split. */
static size_t full_count(const options_t *o, size_t bytes) {
  size_t count = bytes / sizeof(float);
  if (o->coll == C_ALL_GATHER || o->coll == C_REDUCE_SCATTER) count -= count % o->total;
  return count;
}

static ruccl_device_kind_t device_kind = RUCCL_DEVICE_CPU;

static ruccl_tensor_t tensor(float *data, size_t count) {
  ruccl_tensor_t t = {.data = data, .dtype = RUCCL_FLOAT32, .ndim = 1, .shape = {(int64_t)count},
                      .device = {device_kind, 0}};
  return t;
}

/* Buffers on the benchmark's device: host memory, or GPU 0's. */
static float *device_alloc(size_t bytes) {
#ifdef RUCCL_HAVE_CUDA
  if (device_kind == RUCCL_DEVICE_CUDA) {
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
  }
#endif
  return malloc(bytes);
}

static void device_free(float *p) {
#ifdef RUCCL_HAVE_CUDA
  if (device_kind == RUCCL_DEVICE_CUDA) {
    cudaFree(p);
    return;
  }
#endif
  free(p);
}

/* Copies between the host and the benchmark's buffers (to_device: host -> them). */
static void device_copy(void *dst, const void *src, size_t bytes, int to_device) {
#ifdef RUCCL_HAVE_CUDA
  if (device_kind == RUCCL_DEVICE_CUDA) {
    cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
    return;
  }
#endif
  (void)to_device;
  memcpy(dst, src, bytes);
}

static ruccl_result_t run_once(const options_t *o, ruccl_comm_t *comm, uint32_t id, float *in, float *out,
                               size_t count) {
  size_t block = count / o->total;
  ruccl_tensor_t tin = tensor(in, count), tout = tensor(out, count);
  switch (o->coll) {
    case C_ALL_REDUCE: return ruccl_all_reduce(comm, &tin, &tout, RUCCL_SUM);
    case C_BROADCAST: return ruccl_broadcast(comm, id == 0 ? &tin : NULL, &tout);
    case C_REDUCE: return ruccl_reduce(comm, &tin, id == 0 ? &tout : NULL, RUCCL_SUM, 0);
    case C_ALL_GATHER: {
      ruccl_tensor_t part = tensor(in == out ? out + (size_t)id * block : in, block);
      return ruccl_all_gather(comm, &part, &tout);
    }
    case C_REDUCE_SCATTER: {
      ruccl_tensor_t part = tensor(in == out ? out + (size_t)id * block : out, block);
      return ruccl_reduce_scatter(comm, &tin, &part, RUCCL_SUM);
    }
  }
  return RUCCL_ERR_INVALID_ARGUMENT;
}

/* Inputs are small integers, so every sum is exact and #wrong is a real count. */
static float value(uint32_t id, size_t i) { return (float)((id + 1) * (i % 7 + 1)); }

static void fill(const options_t *o, uint32_t id, int in_place, float *in, float *out, size_t count) {
  size_t block = count / o->total;
  for (size_t i = 0; i < count; i++) out[i] = -1.0f;
  float *src = in_place ? out : in;
  if (o->coll == C_ALL_GATHER) {
    float *mine = in_place ? out + (size_t)id * block : in;
    for (size_t i = 0; i < block; i++) mine[i] = value(id, (size_t)id * block + i);
  } else {
    for (size_t i = 0; i < count; i++) src[i] = value(id, i);
  }
}

static long count_wrong(const options_t *o, uint32_t id, int in_place, const float *out, size_t count) {
  unsigned n = o->total;
  size_t block = count / n;
  float scale = (float)(n * (n + 1) / 2); /* sum of (id + 1) over the peers */
  long wrong = 0;
  switch (o->coll) {
    case C_ALL_REDUCE:
      for (size_t i = 0; i < count; i++) wrong += out[i] != scale * (float)(i % 7 + 1);
      break;
    case C_BROADCAST:
      for (size_t i = 0; i < count; i++) wrong += out[i] != value(0, i);
      break;
    case C_REDUCE:
      if (id == 0)
        for (size_t i = 0; i < count; i++) wrong += out[i] != scale * (float)(i % 7 + 1);
      break;
    case C_ALL_GATHER:
      for (size_t i = 0; i < count; i++) wrong += out[i] != value((uint32_t)(i / block), i);
      break;
    case C_REDUCE_SCATTER: {
      const float *part = out + (in_place ? (size_t)id * block : 0);
      for (size_t i = 0; i < block; i++) wrong += part[i] != scale * (float)(((size_t)id * block + i) % 7 + 1);
      break;
    }
  }
  return wrong;
}

/* This process's resident memory (VmRSS, KiB) and the sockets among its open files. */
static void process_usage(long *rss_kb, int *sockets) {
  *rss_kb = -1;
  *sockets = 0;
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "VmRSS:", 6) == 0) *rss_kb = strtol(line + 6, NULL, 10);
  if (f) fclose(f);
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    char path[300], target[64];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n > 0 && (target[n] = 0, strncmp(target, "socket:", 7) == 0)) (*sockets)++;
  }
  if (d) closedir(d);
}

static void *peer_main(void *arg) {
  peer_t *p = arg;
  const options_t *o = p->opt;
  ruccl_comm_t *comm;
  double t_register = now_s();
  if (ruccl_register(p->id, (ruccl_device_t){device_kind, 0}, &p->config, &comm) != RUCCL_OK) {
    fprintf(stderr, "peer %u: register: %s\n", p->id, ruccl_last_error());
    p->failed = 1;
    return NULL;
  }
  t_register = now_s() - t_register;
  /* Warm up the session (connections, caches, the other processes' start-up)
     before anything is timed. */
  for (int w = 0; w < o->warm_barriers; w++)
    if (ruccl_barrier(comm) != RUCCL_OK) {
      fprintf(stderr, "peer %u: warm-up: %s\n", p->id, ruccl_last_error());
      p->failed = 1;
      ruccl_finish(comm);
      return NULL;
    }
  if (p->stats) {
    p->stats->register_s = t_register;
    process_usage(&p->stats->rss_kb, &p->stats->sockets);
    p->stats->reported = 1;
  }
  size_t max_count = full_count(o, o->max_bytes), max_bytes = max_count * sizeof(float) + 64;
  /* host_in/host_out: filled and checked on the host; in/out: where the collective runs */
  float *host_in = malloc(max_bytes), *host_out = malloc(max_bytes);
  float *in = o->cuda ? device_alloc(max_bytes) : host_in, *out = o->cuda ? device_alloc(max_bytes) : host_out;
  if (!host_in || !host_out || !in || !out) {
    fprintf(stderr, "peer %u: no memory for 2 x %zu bytes\n", p->id, max_bytes);
    goto fail;
  }
  unsigned k = 0;
  for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= o->factor, k++) {
    size_t count = full_count(o, bytes);
    for (int in_place = 0; in_place < 2; in_place++) {
      float *src = in_place ? out : in;
      fill(o, p->id, in_place, host_in, host_out, count);
      if (o->cuda) {
        device_copy(in, host_in, count * sizeof(float), 1);
        device_copy(out, host_out, count * sizeof(float), 1);
      }
      if (run_once(o, comm, p->id, src, out, count) != RUCCL_OK) goto fail;
      if (o->cuda) device_copy(host_out, out, count * sizeof(float), 0);
      long wrong = count_wrong(o, p->id, in_place, host_out, count);
      pthread_mutex_lock(p->mu);
      p->wrong[k * 2 + (unsigned)in_place] += wrong;
      pthread_mutex_unlock(p->mu);
      for (int w = 0; w < o->warmup; w++)
        if (run_once(o, comm, p->id, src, out, count) != RUCCL_OK) goto fail;
      if (ruccl_barrier(comm) != RUCCL_OK) goto fail;
      double t0 = now_s();
      for (int it = 0; it < o->iters; it++)
        if (run_once(o, comm, p->id, src, out, count) != RUCCL_OK) goto fail;
      if (ruccl_barrier(comm) != RUCCL_OK) goto fail;
      if (p->id == 0) p->times[k * 2 + (unsigned)in_place] = (now_s() - t0) / o->iters;
    }
  }
  if (o->cuda) device_free(in), device_free(out);
  free(host_in);
  free(host_out);
  ruccl_finish(comm);
  return NULL;
fail:
  fprintf(stderr, "peer %u: %s\n", p->id, ruccl_last_error());
  p->failed = 1;
  if (o->cuda && in) device_free(in);
  if (o->cuda && out) device_free(out);
  free(host_in);
  free(host_out);
  ruccl_finish(comm);
  return NULL;
}

static double memcpy_bandwidth(size_t bytes) {
  char *a = malloc(bytes), *b = malloc(bytes);
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  int reps = 0;
  double t0 = now_s(), t;
  do {
    memcpy(b, a, bytes);
    reps++;
    t = now_s() - t0;
  } while (t < 0.5 || reps < 5);
  double gbs = (double)bytes * reps / t / 1e9;
  free(a);
  free(b);
  return gbs;
}

#ifdef RUCCL_HAVE_CUDA
/* GB/s of copies of `bytes` on GPU 0: device to device, and pinned host to and from
   the device, each timed over enough repetitions for half a second. */
static double timed_copy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
  int reps = 0;
  cudaDeviceSynchronize();
  double t0 = now_s(), t;
  do {
    cudaMemcpyAsync(dst, src, bytes, kind, 0);
    cudaDeviceSynchronize();
    reps++;
    t = now_s() - t0;
  } while (t < 0.5 || reps < 5);
  return (double)bytes * reps / t / 1e9;
}

static void cuda_bandwidths(size_t bytes, double *d2d, double *h2d, double *d2h) {
  void *a = NULL, *b = NULL, *h = NULL;
  if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess &&
      cudaHostAlloc(&h, bytes, cudaHostAllocPortable) == cudaSuccess) {
    *d2d = timed_copy(b, a, bytes, cudaMemcpyDeviceToDevice);
    *h2d = timed_copy(a, h, bytes, cudaMemcpyHostToDevice);
    *d2h = timed_copy(h, a, bytes, cudaMemcpyDeviceToHost);
  }
  cudaFree(a);
  cudaFree(b);
  cudaFreeHost(h);
}
#endif

static int run_node(options_t *o, const char *orchestrator) {
  unsigned nsizes = num_sizes(o);
  double *times = calloc(nsizes * 2, sizeof *times);
  long *wrong = calloc(nsizes * 2, sizeof *wrong);
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  ruccl_config_t cfg = ruccl_config_default();
  ruccl_config_set_num_devices(&cfg, o->peers);
  ruccl_config_set_local_strategy(&cfg, o->strategy);
  ruccl_config_set_group_name(&cfg, "ruccl-perf");
  ruccl_config_set_timeout_ms(&cfg, 120000);
  if (o->nodes > 1) {
    ruccl_config_set_global_strategy(&cfg, o->strategy);
    ruccl_config_set_num_nodes(&cfg, o->nodes);
    ruccl_config_set_global_address(&cfg, orchestrator);
    ruccl_config_set_node_address(&cfg, "127.0.0.1");
    ruccl_config_set_data_service_port(&cfg, 0);
  }
  peer_t *peers = calloc(o->peers, sizeof *peers);
  pthread_t *threads = calloc(o->peers, sizeof *threads);
  for (unsigned i = 0; i < o->peers; i++) {
    peers[i] = (peer_t){.opt = o,
                        .id = o->node * o->peers + i,
                        .stats = o->stats && i == 0 ? &o->stats[o->node] : NULL,
                        .config = cfg,
                        .times = times,
                        .wrong = wrong,
                        .mu = &mu};
    pthread_create(&threads[i], NULL, peer_main, &peers[i]);
  }
  int failed = 0;
  for (unsigned i = 0; i < o->peers; i++) {
    pthread_join(threads[i], NULL);
    failed |= peers[i].failed;
  }
  if (o->node != 0) {
    free(times), free(wrong), free(peers), free(threads);
    return failed ? 1 : 0;
  }
  static const char *const strategy_names[] = {"auto", "centralized", "tree", "ring"};
  if (o->nodes > 1)
    printf("# ruccl-perf: %s, %u processes x %u peers (%s between processes), strategy %s, %d warmup + %d iterations\n",
           coll_names[o->coll], o->nodes, o->peers,
           getenv("RUCCL_TRANSPORT") && !strcmp(getenv("RUCCL_TRANSPORT"), "tcp") ? "tcp" : "shared memory",
           strategy_names[o->strategy.kind], o->warmup, o->iters);
  else
    printf("# ruccl-perf: %s, %u in-process peers on %s, strategy %s, %d warmup + %d iterations\n",
           coll_names[o->coll], o->peers, o->cuda ? "cuda:0" : "the host", strategy_names[o->strategy.kind], o->warmup,
           o->iters);
  printf("#%62s %27s\n", "out-of-place", "in-place");
  printf("# %10s %12s %6s %6s %5s %9s %7s %7s %6s %9s %7s %7s %6s\n", "size", "count", "type", "redop", "root",
         "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  printf("# %10s %12s %6s %6s %5s %9s %7s %7s %6s %9s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
         "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  double n = o->total, factor = 1;
  if (o->coll == C_ALL_REDUCE) factor = 2 * (n - 1) / n;
  else if (o->coll == C_ALL_GATHER || o->coll == C_REDUCE_SCATTER) factor = (n - 1) / n;
  const int rooted = o->coll == C_BROADCAST || o->coll == C_REDUCE;
  const int reduces = o->coll == C_ALL_REDUCE || o->coll == C_REDUCE || o->coll == C_REDUCE_SCATTER;
  unsigned k = 0;
  long total_wrong = 0;
  double last_busbw = 0;
  size_t last_bytes = 0;
  for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= o->factor, k++) {
    size_t count = full_count(o, bytes);
    double sz = (double)count * sizeof(float);
    printf("  %10zu %12zu %6s %6s %5s", (size_t)sz, count, "float", reduces ? "sum" : "none", rooted ? "0" : "-1");
    for (int ip = 0; ip < 2; ip++) {
      double t = times[k * 2 + ip], algbw = t > 0 ? sz / t / 1e9 : 0;
      printf(" %9.2f %7.2f %7.2f %6ld", t * 1e6, algbw, algbw * factor, wrong[k * 2 + ip]);
      total_wrong += wrong[k * 2 + ip];
      if (ip == 0) last_busbw = algbw * factor, last_bytes = (size_t)sz;
    }
    printf("\n");
  }
  printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
#ifdef RUCCL_HAVE_CUDA
  if (o->cuda && !failed) {
    double d2d = 0, h2d = 0, d2h = 0;
    cuda_bandwidths(o->max_bytes, &d2d, &h2d, &d2h);
    printf("# cuda:0 copies (%zu B): device-to-device %.2f GB/s (read + write: %.2f), pinned host-to-device %.2f, "
           "device-to-host %.2f GB/s\n", o->max_bytes, d2d, 2 * d2d, h2d, d2h);
    printf("# busbw at %zu B (out of place): %.2f GB/s = %.0f%% of the device-to-device copy, %.0f%% of the slower "
           "pinned copy\n", last_bytes, last_busbw, 100 * last_busbw / d2d, 100 * last_busbw / (h2d < d2h ? h2d : d2h));
  }
#endif
  double mbw = memcpy_bandwidth(o->max_bytes);
  printf("# memcpy bandwidth (%zu B, one thread): %.2f GB/s\n", o->max_bytes, mbw);
  printf("# busbw at %zu B (out of place): %.2f GB/s = %.0f%% of memcpy\n", last_bytes, last_busbw,
         100 * last_busbw / mbw);
  free(times);
  free(wrong);
  free(peers);
  free(threads);
  return failed || total_wrong ? 1 : 0;
}

static int by_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The processes' registration times, memory and sockets: median and largest. */
static void print_scale(const options_t *o) {
  double *reg = calloc(o->nodes, sizeof *reg), *rss = calloc(o->nodes, sizeof *rss),
         *sock = calloc(o->nodes, sizeof *sock);
  unsigned n = 0;
  for (unsigned k = 0; reg && rss && sock && k < o->nodes; k++)
    if (o->stats[k].reported)
      reg[n] = o->stats[k].register_s, rss[n] = o->stats[k].rss_kb / 1024.0, sock[n] = o->stats[k].sockets, n++;
  if (n) {
    qsort(reg, n, sizeof *reg, by_double), qsort(rss, n, sizeof *rss, by_double), qsort(sock, n, sizeof *sock, by_double);
    printf("# scale: %u of %u processes reported: registration %.2f s median, %.2f s longest; resident memory %.1f MB "
           "median, %.1f MB largest; sockets %.0f median, %.0f most\n",
           n, o->nodes, reg[n / 2], reg[n - 1], rss[n / 2], rss[n - 1], sock[n / 2], sock[n - 1]);
  }
  free(reg), free(rss), free(sock);
}

/* A raw single-stream loopback TCP throughput: one child process writes, we read. */
static double socket_throughput(size_t bytes) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1) ||
      getsockname(ls, (struct sockaddr *)&sa, &len))
    return 0;
  int reps = 8;
  pid_t child = fork();
  if (child == 0) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) _exit(1);
    char *buf = malloc(bytes);
    memset(buf, 7, bytes);
    for (int r = 0; r < reps; r++)
      for (size_t off = 0; off < bytes;) {
        ssize_t w = write(fd, buf + off, bytes - off);
        if (w <= 0) _exit(1);
        off += (size_t)w;
      }
    _exit(0);
  }
  int fd = accept(ls, NULL, NULL);
  char *buf = malloc(bytes);
  double t0 = now_s();
  size_t total = 0;
  while (total < bytes * (size_t)reps) {
    ssize_t r = read(fd, buf, bytes);
    if (r <= 0) break;
    total += (size_t)r;
  }
  double t = now_s() - t0;
  waitpid(child, NULL, 0);
  close(fd);
  close(ls);
  free(buf);
  return (double)total / t / 1e9;
}

int main(int argc, char **argv) {
  options_t o;
  if (parse(argc, argv, &o) != 0) {
    fprintf(stderr,
            "usage: ruccl-perf [-c all_reduce|broadcast|reduce|all_gather|reduce_scatter] [-n peers] [-N processes]\n"
            "                  [-b min_bytes] [-e max_bytes] [-f factor] [-s auto|centralized|tree|ring]\n"
            "                  [-w warmup] [-i iters] [-d cpu|cuda]\n");
    return 2;
  }
  if (o.cuda) {
#ifdef RUCCL_HAVE_CUDA
    device_kind = RUCCL_DEVICE_CUDA;
#else
    fprintf(stderr, "ruccl-perf: -d cuda needs a build with RUCCL_CUDA\n");
    return 2;
#endif
  }
  if (o.nodes == 1) return run_node(&o, NULL);
  /* The orchestrator runs in a child of its own: its threads (and the locks they
     hold, OpenSSL's among them) must not be copied into the nodes forked below. */
  /* Multi-node sessions need a secret: the environment's, else a fresh one that the
     orchestrator and every node below inherit. */
  if (!getenv("RUCCL_SECRET") && !getenv("RUCCL_SECRET_FILE")) {
    unsigned char rnd[16];
    char hex[33];
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(rnd, 1, sizeof rnd, f) != sizeof rnd) return 1;
    fclose(f);
    for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
    setenv("RUCCL_SECRET", hex, 1);
  }
  int port_pipe[2], stop_pipe[2];
  if (pipe(port_pipe) || pipe(stop_pipe)) return 1;
  fflush(stdout);
  pid_t orch_pid = fork();
  if (orch_pid == 0) {
    close(port_pipe[0]);
    close(stop_pipe[1]);
    ruccl_orchestrator_t *orch;
    int port = -1;
    if (ruccl_orchestrator_start("127.0.0.1:0", NULL, 0, &orch) != RUCCL_OK) /* RUCCL_SECRET */
      fprintf(stderr, "orchestrator: %s\n", ruccl_last_error());
    else
      port = ruccl_orchestrator_port(orch);
    if (write(port_pipe[1], &port, sizeof port) != sizeof port || port < 0) _exit(1);
    char c;
    while (read(stop_pipe[0], &c, 1) > 0) {
    } /* until the parent closes it */
    ruccl_orchestrator_stop(orch);
    _exit(0);
  }
  close(port_pipe[1]);
  close(stop_pipe[0]);
  int port = -1;
  if (read(port_pipe[0], &port, sizeof port) != sizeof port || port < 0) return 1;
  close(port_pipe[0]);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  fflush(stdout);
  o.stats = mmap(NULL, o.nodes * sizeof *o.stats, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (o.stats == MAP_FAILED) return 1;
  memset(o.stats, 0, o.nodes * sizeof *o.stats);
  pid_t *kids = calloc(o.nodes, sizeof *kids);
  for (unsigned k = 0; k < o.nodes; k++) {
    kids[k] = fork();
    if (kids[k] == 0) {
      o.node = k;
      close(stop_pipe[1]);
      int rc = run_node(&o, addr);
      fflush(stdout);
      _exit(rc);
    }
  }
  int failed = 0;
  for (unsigned k = 0; k < o.nodes; k++) {
    int st = 0;
    waitpid(kids[k], &st, 0);
    failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  close(stop_pipe[1]);
  waitpid(orch_pid, NULL, 0);
  print_scale(&o);
  printf("# raw loopback TCP, one stream (%zu B writes): %.2f GB/s\n", o.max_bytes, socket_throughput(o.max_bytes));
  free(kids);
  return failed;
}
