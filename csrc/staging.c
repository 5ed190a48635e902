/* staging.c — the rank core's side of the device adapters: the comm's stream, its
 * pinned staging buffers, and copies between a tensor's device and host memory,
 * waited for within the session's timeout. */
#include <stdlib.h>

#include "device/device.h"
#include "device_collective.h"
#include "error.h"
#include "rank.h"

static int same_device(ruccl_device_t a, ruccl_device_t b) { return a.kind == b.kind && a.index == b.index; }

ruccl_result_t ruccl_comm_stream(ruccl_comm_t *c, ruccl_device_t dev, void **stream) {
  const ruccl_device_adapter_t *ad = ruccl_device_adapter(dev.kind);
  if (!ad) return ruccl_fail(RUCCL_ERR_UNSUPPORTED, "device kind %d is not in this build", (int)dev.kind);
  if (c->has_stream && !same_device(c->stream_dev, dev)) {
    ruccl_device_adapter(c->stream_dev.kind)->stream_destroy(c->stream_dev, c->stream);
    c->has_stream = 0;
  }
  if (!c->has_stream) {
    ruccl_result_t rc = ad->stream_create(dev, &c->stream);
    if (rc != RUCCL_OK) return rc;
    c->has_stream = 1;
    c->stream_dev = dev;
  }
  *stream = c->stream;
  return RUCCL_OK;
}

void *ruccl_comm_staging(ruccl_comm_t *c, int slot, size_t bytes, ruccl_device_t dev) {
  const ruccl_device_adapter_t *ad = ruccl_device_adapter(dev.kind);
  if (!ad || ad->host_accessible) return ruccl_comm_scratch(c, slot, bytes);
  if (bytes == 0) bytes = 1;
  if (c->pinned[slot] && c->pinned_cap[slot] >= bytes && same_device(c->pinned_dev[slot], dev)) return c->pinned[slot];
  if (c->pinned[slot]) ruccl_device_adapter(c->pinned_dev[slot].kind)->host_free(c->pinned_dev[slot], c->pinned[slot]);
  c->pinned[slot] = NULL;
  c->pinned_cap[slot] = 0;
  size_t cap = bytes < 65536 ? 65536 : bytes;
  if (ad->host_alloc(dev, cap, &c->pinned[slot]) != RUCCL_OK) return NULL;
  c->pinned_cap[slot] = cap;
  c->pinned_dev[slot] = dev;
  return c->pinned[slot];
}

ruccl_result_t ruccl_comm_copy(ruccl_comm_t *c, ruccl_device_t dev, void *dst, const void *src, size_t bytes,
                               int kind) {
  if (!bytes) return RUCCL_OK;
  const ruccl_device_adapter_t *ad = ruccl_device_adapter(dev.kind);
  void *stream;
  ruccl_result_t rc = ruccl_comm_stream(c, dev, &stream);
  if (rc == RUCCL_OK) rc = ad->copy(dev, stream, dst, src, bytes, (ruccl_copy_kind_t)kind);
  if (rc == RUCCL_OK) rc = ad->stream_wait(dev, stream, ruccl_deadline_after_ms(ruccl_comm_timeout(c)));
  return rc;
}

void ruccl_comm_release_device(ruccl_comm_t *c) {
  ruccl_nccl_release(c);
  for (int i = 0; i < RUCCL_SCRATCH_SLOTS; i++)
    if (c->pinned[i]) ruccl_device_adapter(c->pinned_dev[i].kind)->host_free(c->pinned_dev[i], c->pinned[i]);
  if (c->has_stream) ruccl_device_adapter(c->stream_dev.kind)->stream_destroy(c->stream_dev, c->stream);
  c->has_stream = 0;
}
