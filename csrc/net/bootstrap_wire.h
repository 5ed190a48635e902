/* bootstrap_wire.h — the orchestrator's messages (JOIN, TABLE, ERROR) and their
   encoding: fixed-width little-endian fields (le.h), every length checked. */
#ifndef RUCCL_BOOTSTRAP_WIRE_H
#define RUCCL_BOOTSTRAP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "ruccl.h"

#define RUCCL_DIGEST_BYTES 32
#define RUCCL_WIRE_MAX_LOCAL 1024 /* local peers one node may announce */
#define RUCCL_WIRE_MAX_NODES 4096 /* nodes in one table: RUCCL_MAX_NODES (a TABLE goes in chunks) */
#define RUCCL_TABLE_CHUNK_HEAD 12  /* num_nodes, first, count */
#define RUCCL_WIRE_HOST_BYTES 40   /* a host's id (its kernel's boot id), NUL-terminated */

typedef struct {
  char group[RUCCL_MAX_GROUP_NAME];
  uint32_t num_nodes;
  unsigned char digest[RUCCL_DIGEST_BYTES]; /* what the nodes must agree on */
  char address[RUCCL_MAX_ADDRESS];          /* data service host */
  uint32_t data_port;
  char host[RUCCL_WIRE_HOST_BYTES];         /* "" when unknown: nodes of one host may share memory */
  uint32_t num_local;
  uint32_t peer_ids[RUCCL_WIRE_MAX_LOCAL];
} ruccl_join_t;

typedef struct ruccl_table {
  uint32_t num_nodes;
  ruccl_join_t *nodes; /* num_nodes, heap */
} ruccl_table_t;

/* An ERROR frame: the code (u32) and the message's bytes (at most
   RUCCL_ERROR_MESSAGE_MAX, no terminator).  The decoder takes only a code that is an
   error (else RUCCL_ERR_PROTOCOL stands in for it) and terminates the message. */
#define RUCCL_ERROR_MESSAGE_MAX 255
size_t ruccl_error_encode(ruccl_result_t code, const char *message, unsigned char out[4 + RUCCL_ERROR_MESSAGE_MAX]);
ruccl_result_t ruccl_error_decode(const unsigned char *buf, size_t len, ruccl_result_t *code,
                                  char message[RUCCL_ERROR_MESSAGE_MAX + 1]);

/* Encodings are heap buffers (free them); decoders validate every field. */
unsigned char *ruccl_join_encode(const ruccl_join_t *j, size_t *len);
ruccl_result_t ruccl_join_decode(const unsigned char *buf, size_t len, ruccl_join_t *j);
/* A TABLE travels as chunks, each one frame of at most max_len bytes: the table's
   num_nodes, the index of its first node, how many nodes it holds, then their JOINs.
   ruccl_table_encode_chunk encodes nodes from `first` on, as many as fit (at least
   one: NULL where one does not fit, or out of memory), and says where the next chunk
   starts (t->num_nodes after the last).  ruccl_table_decode_chunk takes the chunks
   in order into t (zeroed before the first: it allocates t->nodes), counting the
   nodes filled in *filled; the table is whole when *filled == t->num_nodes.  A chunk
   out of order, of another size of table, or malformed is RUCCL_ERR_PROTOCOL (t is
   freed). */
unsigned char *ruccl_table_encode_chunk(const ruccl_table_t *t, uint32_t first, size_t max_len, uint32_t *next,
                                        size_t *len);
ruccl_result_t ruccl_table_decode_chunk(const unsigned char *buf, size_t len, ruccl_table_t *t, uint32_t *filled);
void ruccl_table_free(ruccl_table_t *t);

#endif
