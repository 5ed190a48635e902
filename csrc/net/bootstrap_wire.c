/* bootstrap_wire.c — encoding and validating the orchestrator's messages. */
#include "bootstrap_wire.h"

#include <stdlib.h>
#include <string.h>

#include "../error.h"
#include "../le.h"

typedef struct {
  unsigned char *p;
  size_t len, cap;
  int bad;
} writer_t;

typedef struct {
  const unsigned char *p;
  size_t len, off;
  int bad;
} reader_t;

static void put(writer_t *w, const void *src, size_t n) {
  if (w->bad || w->len + n > w->cap) {
    w->bad = 1;
    return;
  }
  memcpy(w->p + w->len, src, n);
  w->len += n;
}

static void put_u32(writer_t *w, uint32_t v) {
  unsigned char b[4];
  ruccl_put_le32(b, v);
  put(w, b, 4);
}

static void get(reader_t *r, void *dst, size_t n) {
  if (r->bad || r->off + n > r->len) {
    r->bad = 1;
    memset(dst, 0, n);
    return;
  }
  memcpy(dst, r->p + r->off, n);
  r->off += n;
}

static uint32_t get_u32(reader_t *r) {
  unsigned char b[4];
  get(r, b, 4);
  return ruccl_get_le32(b);
}

static size_t join_size(const ruccl_join_t *j) {
  return RUCCL_MAX_GROUP_NAME + 4 + RUCCL_DIGEST_BYTES + RUCCL_MAX_ADDRESS + 4 + RUCCL_WIRE_HOST_BYTES + 4 + 4 * (size_t)j->num_local;
}

static void put_join(writer_t *w, const ruccl_join_t *j) {
  put(w, j->group, RUCCL_MAX_GROUP_NAME);
  put_u32(w, j->num_nodes);
  put(w, j->digest, RUCCL_DIGEST_BYTES);
  put(w, j->address, RUCCL_MAX_ADDRESS);
  put_u32(w, j->data_port);
  put(w, j->host, RUCCL_WIRE_HOST_BYTES);
  put_u32(w, j->num_local);
  for (uint32_t i = 0; i < j->num_local; i++) put_u32(w, j->peer_ids[i]);
}

static void get_join(reader_t *r, ruccl_join_t *j) {
  get(r, j->group, RUCCL_MAX_GROUP_NAME);
  j->num_nodes = get_u32(r);
  get(r, j->digest, RUCCL_DIGEST_BYTES);
  get(r, j->address, RUCCL_MAX_ADDRESS);
  j->data_port = get_u32(r);
  get(r, j->host, RUCCL_WIRE_HOST_BYTES);
  j->num_local = get_u32(r);
  if (j->num_local == 0 || j->num_local > RUCCL_WIRE_MAX_LOCAL) {
    r->bad = 1;
    return;
  }
  for (uint32_t i = 0; i < j->num_local; i++) j->peer_ids[i] = get_u32(r);
  if (memchr(j->group, 0, sizeof j->group) == NULL || memchr(j->address, 0, sizeof j->address) == NULL ||
      memchr(j->host, 0, sizeof j->host) == NULL ||
      j->group[0] == 0 || j->address[0] == 0 || j->data_port == 0 || j->data_port > 65535 || j->num_nodes == 0 ||
      j->num_nodes > RUCCL_WIRE_MAX_NODES)
    r->bad = 1;
}

unsigned char *ruccl_join_encode(const ruccl_join_t *j, size_t *len) {
  writer_t w = {.cap = join_size(j)};
  w.p = malloc(w.cap);
  if (!w.p) return NULL;
  put_join(&w, j);
  *len = w.len;
  return w.p;
}

ruccl_result_t ruccl_join_decode(const unsigned char *buf, size_t len, ruccl_join_t *j) {
  reader_t r = {.p = buf, .len = len};
  get_join(&r, j);
  if (r.bad || r.off != len) return ruccl_fail(RUCCL_ERR_PROTOCOL, "malformed JOIN of %zu bytes", len);
  return RUCCL_OK;
}

unsigned char *ruccl_table_encode_chunk(const ruccl_table_t *t, uint32_t first, size_t max_len, uint32_t *next,
                                        size_t *len) {
  writer_t w = {.cap = RUCCL_TABLE_CHUNK_HEAD};
  uint32_t end = first;
  while (end < t->num_nodes && w.cap + join_size(&t->nodes[end]) <= max_len) w.cap += join_size(&t->nodes[end++]);
  if (end == first) return NULL;
  w.p = malloc(w.cap);
  if (!w.p) return NULL;
  put_u32(&w, t->num_nodes);
  put_u32(&w, first);
  put_u32(&w, end - first);
  for (uint32_t i = first; i < end; i++) put_join(&w, &t->nodes[i]);
  *next = end;
  *len = w.len;
  return w.p;
}

ruccl_result_t ruccl_table_decode_chunk(const unsigned char *buf, size_t len, ruccl_table_t *t, uint32_t *filled) {
  reader_t r = {.p = buf, .len = len};
  uint32_t num_nodes = get_u32(&r), first = get_u32(&r), count = get_u32(&r);
  const char *why = NULL;
  if (r.bad)
    why = "a TABLE chunk without its header";
  else if (num_nodes == 0 || num_nodes > RUCCL_WIRE_MAX_NODES || (t->nodes && num_nodes != t->num_nodes))
    why = "a TABLE chunk for another number of nodes";
  else if (first != (t->nodes ? *filled : 0) || count == 0 || count > num_nodes - first)
    why = "a TABLE chunk out of order";
  if (!why && !t->nodes) {
    t->nodes = calloc(num_nodes, sizeof *t->nodes);
    if (!t->nodes) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "table of %u nodes", num_nodes);
    t->num_nodes = num_nodes;
    *filled = 0;
  }
  for (uint32_t i = first; !why && i < first + count && !r.bad; i++) get_join(&r, &t->nodes[i]);
  if (!why && (r.bad || r.off != len)) why = "a malformed TABLE chunk";
  if (why) {
    ruccl_table_free(t);
    return ruccl_fail(RUCCL_ERR_PROTOCOL, "%s (%zu bytes)", why, len);
  }
  *filled = first + count;
  return RUCCL_OK;
}

void ruccl_table_free(ruccl_table_t *t) {
  free(t->nodes);
  t->nodes = NULL;
  t->num_nodes = 0;
}

size_t ruccl_error_encode(ruccl_result_t code, const char *message, unsigned char out[4 + RUCCL_ERROR_MESSAGE_MAX]) {
  size_t n = message ? strnlen(message, RUCCL_ERROR_MESSAGE_MAX) : 0;
  ruccl_put_le32(out, (uint32_t)code);
  if (n) memcpy(out + 4, message, n);
  return 4 + n;
}

ruccl_result_t ruccl_error_decode(const unsigned char *buf, size_t len, ruccl_result_t *code,
                                  char message[RUCCL_ERROR_MESSAGE_MAX + 1]) {
  if (len < 4 || len > 4 + RUCCL_ERROR_MESSAGE_MAX)
    return ruccl_fail(RUCCL_ERR_PROTOCOL, "an ERROR frame of %zu bytes", len);
  uint32_t c = ruccl_get_le32(buf);
  *code = c == RUCCL_OK || c >= RUCCL_NUM_RESULTS ? RUCCL_ERR_PROTOCOL : (ruccl_result_t)c;
  memcpy(message, buf + 4, len - 4);
  message[len - 4] = 0;
  for (size_t i = 0; i < len - 4; i++) /* printed as text: nothing that is not printable */
    if ((unsigned char)message[i] < 0x20 || (unsigned char)message[i] > 0x7e) message[i] = '?';
  return RUCCL_OK;
}
