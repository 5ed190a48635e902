/* agreement_wire.c — the explicit encoding of the agreement's messages between nodes,
   and the checks of what another node sent (agreement.h). */
#include "agreement.h"

#include <string.h>

#include "error.h"
#include "le.h"

/* Little-endian writer and reader over a byte buffer (le.h). */
typedef struct {
  unsigned char *p;
} put_t;
typedef struct {
  const unsigned char *p;
} get_t;

static void put_u32(put_t *w, uint32_t v) {
  ruccl_put_le32(w->p, v);
  w->p += 4;
}
static void put_u64(put_t *w, uint64_t v) {
  ruccl_put_le64(w->p, v);
  w->p += 8;
}
static void put_bytes(put_t *w, const void *b, size_t n) {
  memcpy(w->p, b, n);
  w->p += n;
}
static uint32_t get_u32(get_t *r) {
  r->p += 4;
  return ruccl_get_le32(r->p - 4);
}
static uint64_t get_u64(get_t *r) {
  r->p += 8;
  return ruccl_get_le64(r->p - 8);
}
static void get_bytes(get_t *r, void *b, size_t n) {
  memcpy(b, r->p, n);
  r->p += n;
}
#define PUT_I32(w, v) put_u32(w, (uint32_t)(v))
#define GET_I32(r) ((int32_t)get_u32(r))

void ruccl_desc_encode(const coll_desc_t *d, unsigned char out[RUCCL_DESC_WIRE_BYTES]) {
  put_t w = {out};
  put_u64(&w, d->seq);
  PUT_I32(&w, d->kind);
  PUT_I32(&w, d->dtype);
  PUT_I32(&w, d->op);
  PUT_I32(&w, d->ndim);
  for (int i = 0; i < RUCCL_MAX_DIMS; i++) put_u64(&w, (uint64_t)d->shape[i]);
  put_u32(&w, d->root_id);
  PUT_I32(&w, d->root_named);
  PUT_I32(&w, d->sender);
  PUT_I32(&w, d->local_error);
  put_bytes(&w, d->detail, DETAIL_MAX);
  PUT_I32(&w, d->facts.device_kind);
  put_bytes(&w, d->facts.uuid.bytes, sizeof d->facts.uuid.bytes);
  put_u32(&w, d->facts.process);
  PUT_I32(&w, d->facts.nccl_version);
  PUT_I32(&w, d->nccl_stale);
  put_u32(&w, d->fuse_bytes);
  put_u64(&w, d->buffers.in);
  put_u64(&w, d->buffers.out);
}

void ruccl_desc_decode(const unsigned char in[RUCCL_DESC_WIRE_BYTES], coll_desc_t *d) {
  get_t r = {in};
  memset(d, 0, sizeof *d);
  d->seq = get_u64(&r);
  d->kind = GET_I32(&r);
  d->dtype = GET_I32(&r);
  d->op = GET_I32(&r);
  d->ndim = GET_I32(&r);
  for (int i = 0; i < RUCCL_MAX_DIMS; i++) d->shape[i] = (int64_t)get_u64(&r);
  d->root_id = get_u32(&r);
  d->root_named = GET_I32(&r);
  d->sender = GET_I32(&r);
  d->local_error = GET_I32(&r);
  get_bytes(&r, d->detail, DETAIL_MAX);
  d->facts.device_kind = GET_I32(&r);
  get_bytes(&r, d->facts.uuid.bytes, sizeof d->facts.uuid.bytes);
  d->facts.process = get_u32(&r);
  d->facts.nccl_version = GET_I32(&r);
  d->nccl_stale = GET_I32(&r);
  d->fuse_bytes = get_u32(&r);
  d->buffers.in = get_u64(&r);
  d->buffers.out = get_u64(&r);
}

void ruccl_verdict_encode(const coll_verdict_t *v, unsigned char out[RUCCL_VERDICT_WIRE_BYTES]) {
  put_t w = {out};
  put_u64(&w, v->seq);
  PUT_I32(&w, v->code);
  PUT_I32(&w, v->sender_pos);
  PUT_I32(&w, v->failures);
  PUT_I32(&w, v->path);
  PUT_I32(&w, v->nccl_new);
  PUT_I32(&w, v->sliced);
  PUT_I32(&w, v->extras);
  PUT_I32(&w, v->fused);
  put_bytes(&w, v->message, VERDICT_MAX);
}

void ruccl_verdict_decode(const unsigned char in[RUCCL_VERDICT_WIRE_BYTES], coll_verdict_t *v) {
  get_t r = {in};
  memset(v, 0, sizeof *v);
  v->seq = get_u64(&r);
  v->code = GET_I32(&r);
  v->sender_pos = GET_I32(&r);
  v->failures = GET_I32(&r);
  v->path = GET_I32(&r);
  v->nccl_new = GET_I32(&r);
  v->sliced = GET_I32(&r);
  v->extras = GET_I32(&r);
  v->fused = GET_I32(&r);
  get_bytes(&r, v->message, VERDICT_MAX);
}

void ruccl_extras_encode(const coll_extras_t *x, unsigned char out[RUCCL_EXTRAS_WIRE_BYTES]) {
  put_t w = {out};
  put_bytes(&w, x->path_why, sizeof x->path_why);
  put_bytes(&w, x->nccl_id.internal, RUCCL_NCCL_UNIQUE_ID_BYTES);
}

void ruccl_extras_decode(const unsigned char in[RUCCL_EXTRAS_WIRE_BYTES], coll_extras_t *x) {
  get_t r = {in};
  get_bytes(&r, x->path_why, sizeof x->path_why);
  get_bytes(&r, x->nccl_id.internal, RUCCL_NCCL_UNIQUE_ID_BYTES);
}

const char *ruccl_desc_malformed(const coll_desc_t *d) {
  if (d->kind < 0 || d->kind >= RUCCL_COLL_NUM_KINDS) return "collective kind";
  if (d->local_error < 0 || d->local_error >= RUCCL_NUM_RESULTS) return "error code";
  if (memchr(d->detail, 0, sizeof d->detail) == NULL) return "detail (no terminator)";
  if (d->local_error != RUCCL_OK) return NULL;
  if (d->dtype < 0 || d->dtype >= RUCCL_NUM_DTYPES) return "dtype";
  if (d->op < 0 || d->op >= RUCCL_NUM_REDUCE_OPS) return "reduce op";
  if (d->ndim < 0 || d->ndim > RUCCL_MAX_DIMS) return "number of dimensions";
  if (d->fuse_bytes > FUSE_MAX_BYTES) return "input length";
  return NULL;
}

ruccl_result_t ruccl_verdict_check(unsigned n_total, const coll_verdict_t *v, const coll_extras_t *x) {
  const char *why = NULL;
  if (v->code < 0 || v->code >= RUCCL_NUM_RESULTS) why = "code";
  else if (memchr(v->message, 0, sizeof v->message) == NULL) why = "message (no terminator)";
  else if (v->sender_pos < 0 || (uint32_t)v->sender_pos >= n_total) why = "sender";
  else if (v->path < RUCCL_PATH_HOST || v->path > RUCCL_PATH_NCCL) why = "path";
  else if (v->extras && memchr(x->path_why, 0, sizeof x->path_why) == NULL) why = "path's reason (no terminator)";
  if (why) return ruccl_fail(RUCCL_ERR_PROTOCOL, "node 0 sent a malformed verdict: its %s is out of range", why);
  return RUCCL_OK;
}
