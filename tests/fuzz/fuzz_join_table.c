/* fuzz_join_table.c — the rendezvous decoders (csrc/net/bootstrap_wire.c): a JOIN,
   and a TABLE as a sequence of chunks (each prefixed here by a 2-byte length).  A
   decoded JOIN has terminated strings and no more peers than it may hold; a table is
   freed on every path. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/bootstrap_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  if (data[0] & 1) {
    ruccl_join_t j;
    if (ruccl_join_decode(data + 1, size - 1, &j) == RUCCL_OK) {
      if (!memchr(j.group, 0, sizeof j.group) || !memchr(j.address, 0, sizeof j.address)) abort();
      if (j.num_local > RUCCL_WIRE_MAX_LOCAL) abort();
    }
    return 0;
  }
  ruccl_table_t t;
  memset(&t, 0, sizeof t);
  uint32_t filled = 0;
  size_t off = 1;
  while (off + 2 <= size) {
    size_t len = (size_t)data[off] << 8 | data[off + 1];
    off += 2;
    if (len > size - off) len = size - off;
    unsigned char *chunk = malloc(len ? len : 1); /* exactly len: ASan sees a read past it */
    if (!chunk) break;
    memcpy(chunk, data + off, len);
    ruccl_result_t rc = ruccl_table_decode_chunk(chunk, len, &t, &filled);
    free(chunk);
    off += len;
    if (rc != RUCCL_OK) break; /* t is freed */
    if (filled > t.num_nodes) abort();
    if (t.nodes && filled == t.num_nodes) break;
  }
  ruccl_table_free(&t);
  return 0;
}
