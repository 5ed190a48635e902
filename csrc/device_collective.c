/* device_collective.c — the device paths of one agreed collective (device_collective.h).
 *
 * Same device: one peer holds every peer's pointers after the agreement and runs the
 * collective as device operations on its stream: a reduction with one launch over
 * all the ranks' buffers (in peer order, so every output has the same bits), plain
 * device copies for the data that only moves.  Then it tells the others the outcome.
 *
 * NCCL: each peer drives its own non-blocking NCCL communicator; ruCCL's own
 * deadline bounds every wait, and a wait that passes it aborts the communicator. */
#include "device_collective.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "device/device.h"
#include "device/nccl_loader.h"
#include "dtype.h"
#include "error.h"
#include "transport.h"

/* ---- same device ------------------------------------------------------------------ */

static ruccl_result_t same_device_ops(ruccl_comm_t *c, const ruccl_device_call_t *call,
                                      const ruccl_buffer_ptrs_t *ptrs, int64_t deadline_ns) {
  const ruccl_device_adapter_t *ad = ruccl_device_adapter(call->device.kind);
  void *stream;
  ruccl_result_t rc = ruccl_comm_stream(c, call->device, &stream);
  if (rc != RUCCL_OK) return rc;
  unsigned n = c->group->n_total;
  size_t size = ruccl_dtype_size(call->dtype), bytes = call->count * size;
  ruccl_device_reduce_t red = {.ndst = 0,
                               .nsrc = n,
                               .count = call->count,
                               .dtype = call->dtype,
                               .op = call->op == RUCCL_MEAN ? RUCCL_SUM : call->op,
                               .divisor = call->op == RUCCL_MEAN ? n : 0};
  if (call->count == 0) return RUCCL_OK;
  switch (call->kind) {
    case RUCCL_COLL_ALL_REDUCE:
    case RUCCL_COLL_REDUCE:
      for (unsigned i = 0; i < n; i++) red.srcs[i] = (const void *)(uintptr_t)ptrs[i].in;
      if (call->kind == RUCCL_COLL_REDUCE) red.dsts[red.ndst++] = (void *)(uintptr_t)ptrs[call->root].out;
      else
        for (unsigned i = 0; i < n; i++) red.dsts[red.ndst++] = (void *)(uintptr_t)ptrs[i].out;
      rc = ad->reduce(call->device, stream, &red);
      break;
    case RUCCL_COLL_REDUCE_SCATTER:
      red.ndst = 1;
      for (unsigned k = 0; rc == RUCCL_OK && k < n; k++) {
        for (unsigned i = 0; i < n; i++) red.srcs[i] = (const char *)(uintptr_t)ptrs[i].in + k * bytes;
        red.dsts[0] = (void *)(uintptr_t)ptrs[k].out;
        rc = ad->reduce(call->device, stream, &red);
      }
      break;
    case RUCCL_COLL_BROADCAST: {
      const void *src = (const void *)(uintptr_t)ptrs[call->root].in;
      for (unsigned i = 0; rc == RUCCL_OK && i < n; i++)
        if ((const void *)(uintptr_t)ptrs[i].out != src)
          rc = ad->copy(call->device, stream, (void *)(uintptr_t)ptrs[i].out, src, bytes, RUCCL_COPY_ON_DEVICE);
      break;
    }
    case RUCCL_COLL_ALL_GATHER:
      for (unsigned j = 0; rc == RUCCL_OK && j < n; j++)
        for (unsigned k = 0; rc == RUCCL_OK && k < n; k++) {
          char *dst = (char *)(uintptr_t)ptrs[k].out + j * bytes;
          const void *src = (const void *)(uintptr_t)ptrs[j].in;
          if (dst != src) rc = ad->copy(call->device, stream, dst, src, bytes, RUCCL_COPY_ON_DEVICE);
        }
      break;
    default: break;
  }
  if (rc == RUCCL_OK) rc = ad->stream_wait(call->device, stream, deadline_ns);
  return rc;
}

typedef struct {
  int32_t code;
  char message[200];
} outcome_t;

ruccl_result_t ruccl_same_device_run(ruccl_comm_t *c, const ruccl_team_t *local, const ruccl_device_call_t *call,
                                     const ruccl_buffer_ptrs_t *ptrs, int64_t deadline_ns) {
  outcome_t o;
  memset(&o, 0, sizeof o);
  if (local->me != 0) {
    /* The leader answers by its deadline at the latest (its wait on the device ends
       there): the others wait one timeout longer, so that they never return while
       the device may still work on their buffers after a leader's success. */
    ruccl_team_t patient = *local;
    patient.deadline_ns = ruccl_deadline_later(deadline_ns, ruccl_comm_timeout(c));
    ruccl_result_t rc = ruccl_team_recv(&patient, 0, &o, sizeof o);
    if (rc != RUCCL_OK) return rc;
    if (o.code != RUCCL_OK) ruccl_set_last_error(o.message);
    return (ruccl_result_t)o.code;
  }
  o.code = (int32_t)same_device_ops(c, call, ptrs, deadline_ns);
  if (o.code != RUCCL_OK) snprintf(o.message, sizeof o.message, "%s", ruccl_last_error());
  ruccl_result_t rc = ruccl_team_send_all(local, &o, sizeof o);
  if (o.code != RUCCL_OK) {
    ruccl_set_last_error(o.message);
    return (ruccl_result_t)o.code;
  }
  return rc;
}

/* ---- NCCL ------------------------------------------------------------------------- */

static ruccl_nccl_data_type_t nccl_type(ruccl_dtype_t dt) {
  switch (dt) {
    case RUCCL_FLOAT32: return RUCCL_NCCL_FLOAT32;
    case RUCCL_FLOAT64: return RUCCL_NCCL_FLOAT64;
    case RUCCL_FLOAT16: return RUCCL_NCCL_FLOAT16;
    case RUCCL_BFLOAT16: return RUCCL_NCCL_BFLOAT16;
    case RUCCL_INT8: return RUCCL_NCCL_INT8;
    case RUCCL_UINT8: return RUCCL_NCCL_UINT8;
    case RUCCL_INT32: return RUCCL_NCCL_INT32;
    case RUCCL_INT64: return RUCCL_NCCL_INT64;
  }
  return RUCCL_NCCL_UINT8;
}

static ruccl_nccl_red_op_t nccl_op(ruccl_reduce_op_t op) {
  switch (op) {
    case RUCCL_PROD: return RUCCL_NCCL_PROD;
    case RUCCL_MIN: return RUCCL_NCCL_MIN;
    case RUCCL_MAX: return RUCCL_NCCL_MAX;
    default: return RUCCL_NCCL_SUM; /* SUM, and MEAN's sum */
  }
}

/* NCCL's failure as ruCCL's code, with NCCL's own words. */
static ruccl_result_t nccl_fail(const ruccl_nccl_api_t *nc, ruccl_comm_t *c, const char *what, ruccl_nccl_result_t r) {
  const char *last = nc->get_last_error ? nc->get_last_error((ruccl_nccl_comm_t)c->nccl_comm) : NULL;
  return ruccl_fail(ruccl_nccl_code(r), "peer %u: NCCL %s: %s%s%s", c->peer_id, what, nc->get_error_string(r),
                    last && *last ? ": " : "", last ? last : "");
}

static void pause_briefly(void) {
  struct timespec ts = {0, 20000};
  nanosleep(&ts, NULL);
}

/* Waits while NCCL says the communicator is still busy with a non-blocking call. */
static ruccl_result_t settle(const ruccl_nccl_api_t *nc, ruccl_comm_t *c, const char *what, int64_t deadline_ns) {
  for (;;) {
    ruccl_nccl_result_t async = RUCCL_NCCL_SUCCESS;
    ruccl_nccl_result_t r = nc->comm_get_async_error((ruccl_nccl_comm_t)c->nccl_comm, &async);
    if (r != RUCCL_NCCL_SUCCESS) return nccl_fail(nc, c, what, r);
    if (async != RUCCL_NCCL_IN_PROGRESS) return async == RUCCL_NCCL_SUCCESS ? RUCCL_OK : nccl_fail(nc, c, what, async);
    if (deadline_ns && ruccl_now_ns() >= deadline_ns) {
      ruccl_nccl_abort(c);
      return ruccl_fail(RUCCL_ERR_TIMEOUT, "peer %u: NCCL %s did not complete within the timeout of %" PRId64 " ms",
                        c->peer_id, what, ruccl_comm_timeout(c));
    }
    pause_briefly();
  }
}

ruccl_result_t ruccl_nccl_connect(ruccl_comm_t *c, const ruccl_nccl_unique_id_t *id, ruccl_device_t dev,
                                  int64_t deadline_ns) {
  const ruccl_nccl_api_t *nc = ruccl_nccl(NULL);
  if (!nc) return ruccl_fail(RUCCL_ERR_DEVICE, "peer %u: NCCL went away: %s", c->peer_id, ruccl_nccl_unavailable_reason());
  ruccl_nccl_abort(c); /* one made for another GPU (nothing is in flight on it) */
  c->nccl_dev = dev;
  const ruccl_device_adapter_t *ad = ruccl_device_adapter(dev.kind);
  int saved;
  ruccl_result_t rc = ad->enter(dev, &saved); /* NCCL takes the current device */
  if (rc != RUCCL_OK) return rc;
  ruccl_nccl_config_t config = {.size = sizeof config,
                                .magic = RUCCL_NCCL_API_MAGIC,
                                .version = RUCCL_NCCL_MIN_VERSION,
                                .blocking = 0,
                                .cga_cluster_size = RUCCL_NCCL_CONFIG_UNDEF_INT,
                                .min_ctas = RUCCL_NCCL_CONFIG_UNDEF_INT,
                                .max_ctas = RUCCL_NCCL_CONFIG_UNDEF_INT,
                                .net_name = NULL,
                                .split_share = RUCCL_NCCL_CONFIG_UNDEF_INT};
  ruccl_nccl_comm_t comm = NULL;
  ruccl_nccl_result_t r =
      nc->comm_init_rank_config(&comm, (int)c->group->n_total, *id, (int)c->global_index, &config);
  c->nccl_comm = comm;
  if (r != RUCCL_NCCL_SUCCESS && r != RUCCL_NCCL_IN_PROGRESS) {
    ad->leave(saved);
    rc = nccl_fail(nc, c, "communicator set-up", r);
    ruccl_nccl_abort(c);
    return rc;
  }
  rc = settle(nc, c, "communicator set-up", deadline_ns);
  ad->leave(saved);
  if (rc != RUCCL_OK) ruccl_nccl_abort(c);
  else ruccl_log(2, "peer %u: NCCL communicator ready (rank %u of %u)", c->peer_id, c->global_index, c->group->n_total);
  return rc;
}

ruccl_result_t ruccl_nccl_launch(ruccl_comm_t *c, const ruccl_device_call_t *call, const void *in, void *out) {
  const ruccl_nccl_api_t *nc = ruccl_nccl(NULL);
  void *stream;
  ruccl_result_t rc = ruccl_comm_stream(c, call->device, &stream);
  if (rc != RUCCL_OK) return rc;
  if (!c->nccl_comm) return ruccl_fail(RUCCL_ERR_DEVICE, "peer %u: no NCCL communicator", c->peer_id);
  ruccl_nccl_comm_t comm = (ruccl_nccl_comm_t)c->nccl_comm;
  ruccl_nccl_data_type_t dt = nccl_type(call->dtype);
  ruccl_nccl_red_op_t op = nccl_op(call->op);
  ruccl_nccl_result_t r = RUCCL_NCCL_SUCCESS;
  const ruccl_device_adapter_t *ad = ruccl_device_adapter(call->device.kind);
  int saved;
  rc = ad->enter(call->device, &saved);
  if (rc != RUCCL_OK) return rc;
  switch (call->kind) {
    case RUCCL_COLL_ALL_REDUCE: r = nc->all_reduce(in, out, call->count, dt, op, comm, stream); break;
    case RUCCL_COLL_REDUCE: r = nc->reduce(in, out, call->count, dt, op, (int)call->root, comm, stream); break;
    case RUCCL_COLL_BROADCAST: r = nc->broadcast(in, out, call->count, dt, (int)call->root, comm, stream); break;
    case RUCCL_COLL_ALL_GATHER: r = nc->all_gather(in, out, call->count, dt, comm, stream); break;
    case RUCCL_COLL_REDUCE_SCATTER: r = nc->reduce_scatter(in, out, call->count, dt, op, comm, stream); break;
    default: break;
  }
  ad->leave(saved);
  if (r != RUCCL_NCCL_SUCCESS && r != RUCCL_NCCL_IN_PROGRESS)
    return nccl_fail(nc, c, ruccl_coll_kind_name(call->kind), r);
  return RUCCL_OK;
}

ruccl_result_t ruccl_nccl_divide(ruccl_comm_t *c, const ruccl_device_call_t *call, void *out, int64_t deadline_ns) {
  if (call->op != RUCCL_MEAN || !out || !call->count) return RUCCL_OK;
  void *stream;
  ruccl_result_t rc = ruccl_comm_stream(c, call->device, &stream);
  const ruccl_device_adapter_t *ad = ruccl_device_adapter(call->device.kind);
  ruccl_device_reduce_t div = {.ndst = 1, .nsrc = 1, .count = call->count, .dtype = call->dtype,
                               .op = RUCCL_SUM, .divisor = c->group->n_total};
  div.dsts[0] = out;
  div.srcs[0] = out;
  if (rc == RUCCL_OK) rc = ad->reduce(call->device, stream, &div);
  if (rc == RUCCL_OK) rc = ad->stream_wait(call->device, stream, deadline_ns);
  return rc;
}

ruccl_result_t ruccl_nccl_wait(ruccl_comm_t *c, ruccl_device_t dev, int64_t deadline_ns) {
  const ruccl_nccl_api_t *nc = ruccl_nccl(NULL);
  const ruccl_device_adapter_t *ad = ruccl_device_adapter(dev.kind);
  void *stream;
  ruccl_result_t rc = ruccl_comm_stream(c, dev, &stream);
  if (rc != RUCCL_OK) return rc;
  const char *what = "collective";
  for (;;) {
    ruccl_nccl_result_t async = RUCCL_NCCL_SUCCESS;
    ruccl_nccl_result_t r = nc->comm_get_async_error((ruccl_nccl_comm_t)c->nccl_comm, &async);
    if (r != RUCCL_NCCL_SUCCESS) async = r;
    if (async != RUCCL_NCCL_SUCCESS && async != RUCCL_NCCL_IN_PROGRESS) {
      rc = nccl_fail(nc, c, what, async);
      ruccl_nccl_abort(c);
      return rc;
    }
    if (async == RUCCL_NCCL_SUCCESS) {
      /* a deadline already passed makes stream_wait a query */
      rc = ad->stream_wait(dev, stream, 1);
      if (rc == RUCCL_OK) return RUCCL_OK;
      if (rc != RUCCL_ERR_TIMEOUT) {
        ruccl_nccl_abort(c);
        return rc;
      }
    }
    if (deadline_ns && ruccl_now_ns() >= deadline_ns) {
      ruccl_nccl_abort(c);
      return ruccl_fail(RUCCL_ERR_TIMEOUT, "peer %u: the NCCL %s did not complete within the timeout of %" PRId64
                        " ms (a peer that never joined, or a hung device); its NCCL communicator was aborted",
                        c->peer_id, what, ruccl_comm_timeout(c));
    }
    pause_briefly();
  }
}

void ruccl_nccl_abort(ruccl_comm_t *c) {
  if (!c->nccl_comm) return;
  const ruccl_nccl_api_t *nc = ruccl_nccl(NULL);
  if (nc) nc->comm_abort((ruccl_nccl_comm_t)c->nccl_comm);
  c->nccl_comm = NULL;
}

void ruccl_nccl_release(ruccl_comm_t *c) {
  if (!c->nccl_comm) return;
  const ruccl_nccl_api_t *nc = ruccl_nccl(NULL);
  if (!nc) return;
  ruccl_nccl_comm_t comm = (ruccl_nccl_comm_t)c->nccl_comm;
  int healthy = atomic_load(&c->group->broken) == 0 && atomic_load(&c->group->reset) == 0;
  ruccl_nccl_result_t fin = healthy ? nc->comm_finalize(comm) : RUCCL_NCCL_INTERNAL_ERROR;
  /* a non-blocking communicator's finalize says in-progress; settle waits it out */
  if ((fin == RUCCL_NCCL_SUCCESS || fin == RUCCL_NCCL_IN_PROGRESS) &&
      settle(nc, c, "finalize", ruccl_deadline_after_ms(ruccl_comm_timeout(c))) == RUCCL_OK) {
    nc->comm_destroy(comm);
    c->nccl_comm = NULL;
    return;
  }
  ruccl_nccl_abort(c);
}
