/* fake_nccl.c — a stand-in for libnccl.so.2 that the tests load through
 * RUCCL_NCCL_LIBRARY: the NCCL calls ruCCL makes, on host memory, between the
 * threads of one process.  It behaves like non-blocking NCCL: set-up and
 * collectives return at once, and ncclCommGetAsyncError says ncclInProgress until
 * the rank's work is done (here that stands in for the stream as well).  A
 * collective completes when every rank of the communicator has launched it.
 *
 * fake_nccl_control() makes it misbehave: a launch that fails with
 * ncclInvalidArgument on some ranks, collectives that never complete, a remote
 * error, a set-up that never completes.  FAKE_NCCL_VERSION sets the version. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device/nccl_api.h"

enum { FAKE_OK, FAKE_LAUNCH_INVALID, FAKE_HANG, FAKE_REMOTE_ERROR, FAKE_INIT_HANG };

typedef struct {
  int kind; /* 0 all_reduce, 1 broadcast, 2 reduce, 3 all_gather, 4 reduce_scatter */
  const void *send;
  void *recv;
  size_t count;
  int dt, op, root;
} fake_op_t;

#define MAX_RANKS 64
#define MAX_CLIQUES 64

typedef struct clique clique_t;
struct ruccl_nccl_comm {
  clique_t *clique;
  int rank;
  int aborted;
  uint64_t launched, done; /* collectives launched and completed by this rank */
  int failed;              /* an async error to report */
};

struct clique {
  ruccl_nccl_unique_id_t id;
  int nranks, joined, used;
  int ready; /* every rank has joined (set-up complete) */
  struct ruccl_nccl_comm *comms[MAX_RANKS];
  fake_op_t ops[MAX_RANKS]; /* the pending collective of each rank */
  uint64_t completed;       /* collectives completed */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static clique_t cliques[MAX_CLIQUES];
static int mode;
static uint64_t rank_mask;
static int stats[4]; /* inits, aborts, collectives launched, finalizes */

void fake_nccl_control(int new_mode, uint64_t ranks) {
  pthread_mutex_lock(&mu);
  mode = new_mode;
  rank_mask = ranks;
  pthread_mutex_unlock(&mu);
}

void fake_nccl_stats(int out[4]) {
  pthread_mutex_lock(&mu);
  memcpy(out, stats, sizeof stats);
  pthread_mutex_unlock(&mu);
}

ruccl_nccl_result_t ncclGetVersion(int *version) {
  const char *v = getenv("FAKE_NCCL_VERSION");
  *version = v ? atoi(v) : RUCCL_NCCL_VERSION(2, 28, 3);
  return RUCCL_NCCL_SUCCESS;
}

ruccl_nccl_result_t ncclGetUniqueId(ruccl_nccl_unique_id_t *id) {
  static uint64_t next = 1;
  pthread_mutex_lock(&mu);
  memset(id, 0, sizeof *id);
  uint64_t mine = next++;
  memcpy(id->internal, &mine, sizeof mine);
  memcpy(id->internal + 8, "fake-nccl", 9);
  pthread_mutex_unlock(&mu);
  return RUCCL_NCCL_SUCCESS;
}

const char *ncclGetErrorString(ruccl_nccl_result_t r) {
  switch (r) {
    case RUCCL_NCCL_SUCCESS: return "no error";
    case RUCCL_NCCL_INVALID_ARGUMENT: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case RUCCL_NCCL_REMOTE_ERROR: return "remote process exited or there was a network error";
    case RUCCL_NCCL_IN_PROGRESS: return "NCCL operation in progress";
    default: return "unhandled error";
  }
}

const char *ncclGetLastError(ruccl_nccl_comm_t comm) {
  (void)comm;
  return "fake NCCL";
}

ruccl_nccl_result_t ncclCommInitRankConfig(ruccl_nccl_comm_t *comm, int nranks, ruccl_nccl_unique_id_t id, int rank,
                                           ruccl_nccl_config_t *config) {
  if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks || !config ||
      config->magic != RUCCL_NCCL_API_MAGIC || config->blocking != 0)
    return RUCCL_NCCL_INVALID_ARGUMENT;
  pthread_mutex_lock(&mu);
  clique_t *c = NULL;
  for (int i = 0; i < MAX_CLIQUES && !c; i++)
    if (cliques[i].used && memcmp(&cliques[i].id, &id, sizeof id) == 0) c = &cliques[i];
  for (int i = 0; i < MAX_CLIQUES && !c; i++)
    if (!cliques[i].used) {
      c = &cliques[i];
      memset(c, 0, sizeof *c);
      c->used = 1;
      c->id = id;
      c->nranks = nranks;
    }
  ruccl_nccl_result_t r = RUCCL_NCCL_IN_PROGRESS;
  if (!c || c->comms[rank] || c->nranks != nranks) {
    r = RUCCL_NCCL_INVALID_USAGE;
  } else {
    struct ruccl_nccl_comm *m = calloc(1, sizeof *m);
    m->clique = c;
    m->rank = rank;
    c->comms[rank] = m;
    c->ready |= ++c->joined == c->nranks;
    stats[0]++;
    *comm = m;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

static void combine(int dt, int op, void *acc, const void *x, size_t count) {
#define COMBINE(T)                                                      \
  for (size_t i = 0; i < count; i++) {                                  \
    T a = ((T *)acc)[i], b = ((const T *)x)[i];                         \
    ((T *)acc)[i] = op == RUCCL_NCCL_PROD  ? (T)(a * b)                 \
                    : op == RUCCL_NCCL_MIN ? (b < a ? b : a)            \
                    : op == RUCCL_NCCL_MAX ? (b > a ? b : a)            \
                                           : (T)(a + b);                \
  }
  switch (dt) {
    case RUCCL_NCCL_FLOAT32: COMBINE(float) break;
    case RUCCL_NCCL_FLOAT64: COMBINE(double) break;
    case RUCCL_NCCL_INT32: COMBINE(int32_t) break;
    case RUCCL_NCCL_INT64: COMBINE(int64_t) break;
    case RUCCL_NCCL_INT8: COMBINE(int8_t) break;
    case RUCCL_NCCL_UINT8: COMBINE(uint8_t) break;
    default: break; /* half types are only moved in these tests */
  }
#undef COMBINE
}

static size_t type_size(int dt) {
  switch (dt) {
    case RUCCL_NCCL_INT8:
    case RUCCL_NCCL_UINT8: return 1;
    case RUCCL_NCCL_FLOAT16:
    case RUCCL_NCCL_BFLOAT16: return 2;
    case RUCCL_NCCL_INT32:
    case RUCCL_NCCL_FLOAT32: return 4;
    default: return 8;
  }
}

/* Every rank has launched: compute each one's result (called under mu). */
static void complete(clique_t *c) {
  int n = c->nranks;
  fake_op_t *o = c->ops;
  size_t size = type_size(o[0].dt), bytes = o[0].count * size;
  void *acc = malloc(bytes * (size_t)n + 1);
  switch (o[0].kind) {
    case 0:
    case 2:
      memcpy(acc, o[0].send, bytes);
      for (int r = 1; r < n; r++) combine(o[0].dt, o[0].op, acc, o[r].send, o[0].count);
      for (int r = 0; r < n; r++)
        if (o[0].kind == 0 || r == o[0].root) memcpy(o[r].recv, acc, bytes);
      break;
    case 1:
      memcpy(acc, o[o[0].root].send, bytes);
      for (int r = 0; r < n; r++) memcpy(o[r].recv, acc, bytes);
      break;
    case 3:
      for (int r = 0; r < n; r++) memcpy((char *)acc + (size_t)r * bytes, o[r].send, bytes);
      for (int r = 0; r < n; r++) memcpy(o[r].recv, acc, bytes * (size_t)n);
      break;
    case 4:
      for (int k = 0; k < n; k++) {
        memcpy(acc, (const char *)o[0].send + (size_t)k * bytes, bytes);
        for (int r = 1; r < n; r++) combine(o[0].dt, o[0].op, acc, (const char *)o[r].send + (size_t)k * bytes, o[0].count);
        memcpy(o[k].recv, acc, bytes);
      }
      break;
  }
  free(acc);
  for (int r = 0; r < n; r++) c->comms[r]->done++;
  c->completed++;
}

static ruccl_nccl_result_t launch(ruccl_nccl_comm_t comm, fake_op_t op) {
  pthread_mutex_lock(&mu);
  ruccl_nccl_result_t r = RUCCL_NCCL_SUCCESS;
  if (comm->aborted) {
    r = RUCCL_NCCL_INVALID_USAGE;
  } else if (mode == FAKE_LAUNCH_INVALID && (rank_mask >> comm->rank & 1)) {
    r = RUCCL_NCCL_INVALID_ARGUMENT;
  } else {
    clique_t *c = comm->clique;
    c->ops[comm->rank] = op;
    comm->launched++;
    stats[2]++;
    if (mode == FAKE_REMOTE_ERROR && (rank_mask >> comm->rank & 1)) comm->failed = RUCCL_NCCL_REMOTE_ERROR;
    int all = 1;
    for (int i = 0; i < c->nranks; i++) all &= c->comms[i] && c->comms[i]->launched == c->completed + 1;
    if (all && mode != FAKE_HANG && mode != FAKE_REMOTE_ERROR) complete(c);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

ruccl_nccl_result_t ncclCommGetAsyncError(ruccl_nccl_comm_t comm, ruccl_nccl_result_t *async) {
  pthread_mutex_lock(&mu);
  clique_t *c = comm->clique;
  if (comm->failed) *async = (ruccl_nccl_result_t)comm->failed;
  else if (!c->ready || mode == FAKE_INIT_HANG) *async = RUCCL_NCCL_IN_PROGRESS;
  else *async = comm->done < comm->launched ? RUCCL_NCCL_IN_PROGRESS : RUCCL_NCCL_SUCCESS;
  pthread_mutex_unlock(&mu);
  return RUCCL_NCCL_SUCCESS;
}

/* As on a real non-blocking communicator: in progress, then done (seen through
   ncclCommGetAsyncError). */
ruccl_nccl_result_t ncclCommFinalize(ruccl_nccl_comm_t comm) {
  (void)comm;
  pthread_mutex_lock(&mu);
  stats[3]++;
  pthread_mutex_unlock(&mu);
  return RUCCL_NCCL_IN_PROGRESS;
}

static void leave(ruccl_nccl_comm_t comm) {
  clique_t *c = comm->clique;
  c->comms[comm->rank] = NULL;
  if (--c->joined == 0) c->used = 0;
  free(comm);
}

ruccl_nccl_result_t ncclCommDestroy(ruccl_nccl_comm_t comm) {
  pthread_mutex_lock(&mu);
  leave(comm);
  pthread_mutex_unlock(&mu);
  return RUCCL_NCCL_SUCCESS;
}

ruccl_nccl_result_t ncclCommAbort(ruccl_nccl_comm_t comm) {
  pthread_mutex_lock(&mu);
  stats[1]++;
  /* the others' pending collective can never complete now: they see a remote error */
  clique_t *c = comm->clique;
  for (int i = 0; i < c->nranks; i++)
    if (c->comms[i] && c->comms[i] != comm && c->comms[i]->done < c->comms[i]->launched && mode != FAKE_HANG)
      c->comms[i]->failed = RUCCL_NCCL_REMOTE_ERROR;
  leave(comm);
  pthread_mutex_unlock(&mu);
  return RUCCL_NCCL_SUCCESS;
}

ruccl_nccl_result_t ncclAllReduce(const void *send, void *recv, size_t count, ruccl_nccl_data_type_t dt,
                                  ruccl_nccl_red_op_t op, ruccl_nccl_comm_t comm, void *stream) {
  (void)stream;
  return launch(comm, (fake_op_t){0, send, recv, count, dt, op, 0});
}

ruccl_nccl_result_t ncclBroadcast(const void *send, void *recv, size_t count, ruccl_nccl_data_type_t dt, int root,
                                  ruccl_nccl_comm_t comm, void *stream) {
  (void)stream;
  return launch(comm, (fake_op_t){1, send, recv, count, dt, 0, root});
}

ruccl_nccl_result_t ncclReduce(const void *send, void *recv, size_t count, ruccl_nccl_data_type_t dt,
                               ruccl_nccl_red_op_t op, int root, ruccl_nccl_comm_t comm, void *stream) {
  (void)stream;
  return launch(comm, (fake_op_t){2, send, recv, count, dt, op, root});
}

ruccl_nccl_result_t ncclAllGather(const void *send, void *recv, size_t count, ruccl_nccl_data_type_t dt,
                                  ruccl_nccl_comm_t comm, void *stream) {
  (void)stream;
  return launch(comm, (fake_op_t){3, send, recv, count, dt, 0, 0});
}

ruccl_nccl_result_t ncclReduceScatter(const void *send, void *recv, size_t count, ruccl_nccl_data_type_t dt,
                                      ruccl_nccl_red_op_t op, ruccl_nccl_comm_t comm, void *stream) {
  (void)stream;
  return launch(comm, (fake_op_t){4, send, recv, count, dt, op, 0});
}
