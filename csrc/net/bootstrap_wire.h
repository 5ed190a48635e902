/* bootstrap_wire.h — the orchestrator's messages (JOIN, TABLE, ERROR) and their
   encoding: fixed-width fields in network byte order, every length checked. */
#ifndef RUCCL_BOOTSTRAP_WIRE_H
#define RUCCL_BOOTSTRAP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "ruccl.h"

#define RUCCL_DIGEST_BYTES 32
#define RUCCL_WIRE_MAX_LOCAL 1024 /* local peers one node may announce */
#define RUCCL_WIRE_MAX_NODES 256  /* nodes in one table (fits a control frame with a few peers each) */

typedef struct {
  char group[RUCCL_MAX_GROUP_NAME];
  uint32_t num_nodes;
  unsigned char digest[RUCCL_DIGEST_BYTES]; /* what the nodes must agree on */
  char address[RUCCL_MAX_ADDRESS];          /* data service host */
  uint32_t data_port;
  uint32_t num_local;
  uint32_t peer_ids[RUCCL_WIRE_MAX_LOCAL];
} ruccl_join_t;

typedef struct {
  uint32_t num_nodes;
  ruccl_join_t *nodes; /* num_nodes, heap */
} ruccl_table_t;

typedef struct {
  uint32_t code;
  char message[256];
} ruccl_error_wire_t;

/* Encodings are heap buffers (free them); decoders validate every field. */
unsigned char *ruccl_join_encode(const ruccl_join_t *j, size_t *len);
ruccl_result_t ruccl_join_decode(const unsigned char *buf, size_t len, ruccl_join_t *j);
unsigned char *ruccl_table_encode(const ruccl_table_t *t, size_t *len);
ruccl_result_t ruccl_table_decode(const unsigned char *buf, size_t len, ruccl_table_t *t);
void ruccl_table_free(ruccl_table_t *t);

#endif
