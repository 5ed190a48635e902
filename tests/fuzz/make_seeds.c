/* make_seeds.c — writes the seed corpus of the fuzz targets (tests/fuzz/corpus/TARGET):
   well-formed inputs of each decoder, from the encoders themselves, so that fuzzing
   starts from the real formats.  Run by scripts/fuzz.sh --seeds; the output is
   committed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agreement.h"
#include "net/bootstrap_wire.h"
#include "net/wire.h"

static const char *root;

static void put(const char *target, const char *name, const void *a, size_t na, const void *b, size_t nb) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s/%s", root, target, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(a, 1, na, f) != na || (nb && fwrite(b, 1, nb, f) != nb)) {
    perror(path);
    exit(1);
  }
  fclose(f);
}

static void frame(unsigned char *out, uint16_t type, uint32_t len) {
  ruccl_frame_header_encode(type, len, out);
}

static ruccl_join_t join(uint32_t first_id, uint32_t n_local) {
  ruccl_join_t j;
  memset(&j, 0, sizeof j);
  snprintf(j.group, sizeof j.group, "seed-group");
  j.num_nodes = 3;
  memset(j.digest, 7, sizeof j.digest);
  snprintf(j.address, sizeof j.address, "127.0.0.1");
  j.data_port = 29500;
  snprintf(j.host, sizeof j.host, "boot-id");
  j.num_local = n_local;
  for (uint32_t i = 0; i < n_local; i++) j.peer_ids[i] = first_id + i;
  return j;
}

int main(int argc, char **argv) {
  if (argc != 2) return fprintf(stderr, "usage: make_seeds CORPUS_DIR\n"), 2;
  root = argv[1];
  /* frames: a HELLO, a JOIN frame, an empty LEAVE, back to back (first byte 0: cap 1024) */
  unsigned char stream[1024], *p = stream;
  unsigned char key[RUCCL_AUTH_KEY_BYTES];
  ruccl_pake_t client, server_side;
  if (ruccl_auth_key("fuzz-secret", 11, key) != RUCCL_OK || ruccl_pake_start(key, RUCCL_PAKE_CLIENT, &client) != RUCCL_OK ||
      ruccl_pake_start(key, RUCCL_PAKE_SERVER, &server_side) != RUCCL_OK)
    return fprintf(stderr, "make_seeds: no key exchange\n"), 1;
  unsigned char hello[RUCCL_AUTH_HELLO_BYTES] = {RUCCL_AUTH_VERSION}; /* version (little-endian), a real share */
  memcpy(hello + 4, server_side.share, RUCCL_PAKE_SHARE_BYTES);
  frame(p, RUCCL_FRAME_HELLO, sizeof hello), memcpy(p + 12, hello, sizeof hello), p += 12 + sizeof hello;
  frame(p, RUCCL_FRAME_LEAVE, 0), p += 12;
  *p++ = 0; /* a last byte 0 mod 4: the reader's cap is 1024 (else last % 64) */
  put("frame", "hello_leave", stream, (size_t)(p - stream), NULL, 0);

  /* handshake: an AUTH payload (mode 1) and a server's HELLO + AUTH_OK (mode 0) */
  unsigned char auth[1 + RUCCL_AUTH_HEAD_BYTES + 8] = {1};
  memcpy(auth + 1, client.share, RUCCL_PAKE_SHARE_BYTES); /* a point of the curve, a wrong proof */
  memcpy(auth + 1 + RUCCL_AUTH_HEAD_BYTES, "payload!", 8);
  put("handshake", "auth", auth, sizeof auth, NULL, 0);
  unsigned char server[1 + 12 + RUCCL_AUTH_HELLO_BYTES + 12 + RUCCL_AUTH_PROOF_BYTES] = {0};
  frame(server + 1, RUCCL_FRAME_HELLO, RUCCL_AUTH_HELLO_BYTES);
  memcpy(server + 13, hello, sizeof hello);
  frame(server + 13 + RUCCL_AUTH_HELLO_BYTES, RUCCL_FRAME_AUTH_OK, RUCCL_AUTH_PROOF_BYTES);
  put("handshake", "server", server, sizeof server, NULL, 0);

  /* a JOIN (mode 1), and a table of three nodes in two chunks (mode 0) */
  ruccl_join_t j = join(0, 2);
  size_t jl = 0;
  unsigned char *jw = ruccl_join_encode(&j, &jl);
  unsigned char one = 1;
  put("join_table", "join", &one, 1, jw, jl);
  free(jw);
  ruccl_table_t t = {.num_nodes = 3, .nodes = calloc(3, sizeof(ruccl_join_t))};
  for (uint32_t k = 0; k < 3; k++) t.nodes[k] = join(2 * k, 2);
  unsigned char table[8192] = {0};
  size_t at = 1;
  uint32_t first = 0;
  while (first < t.num_nodes) {
    uint32_t next = first;
    size_t len = 0;
    unsigned char *c = ruccl_table_encode_chunk(&t, first, 2 * jl + 64, &next, &len);
    if (!c || at + 2 + len > sizeof table) return 1;
    table[at] = (unsigned char)(len >> 8), table[at + 1] = (unsigned char)len;
    memcpy(table + at + 2, c, len);
    at += 2 + len;
    free(c);
    first = next;
  }
  put("join_table", "table", table, at, NULL, 0);
  ruccl_table_free(&t);

  /* a descriptor, a verdict and extras */
  coll_desc_t d;
  memset(&d, 0, sizeof d);
  d.seq = 9, d.kind = RUCCL_COLL_ALL_REDUCE, d.dtype = RUCCL_FLOAT32, d.op = RUCCL_SUM, d.ndim = 2;
  d.shape[0] = 4, d.shape[1] = 257;
  unsigned char dw[RUCCL_DESC_WIRE_BYTES];
  ruccl_desc_encode(&d, dw);
  put("agreement", "descriptor", dw, sizeof dw, NULL, 0);
  coll_verdict_t v;
  coll_extras_t x;
  memset(&v, 0, sizeof v);
  memset(&x, 0, sizeof x);
  v.seq = 9, v.extras = 1;
  snprintf(x.path_why, sizeof x.path_why, "host");
  unsigned char vx[RUCCL_VERDICT_WIRE_BYTES + RUCCL_EXTRAS_WIRE_BYTES + 1];
  ruccl_verdict_encode(&v, vx);
  ruccl_extras_encode(&x, vx + RUCCL_VERDICT_WIRE_BYTES);
  vx[sizeof vx - 1] = 3;
  put("agreement", "verdict", vx, sizeof vx, NULL, 0);

  /* the ring: write 100 bytes, peek, read 50, then a counter set far ahead, a write */
  unsigned char ring[] = {0, 0, 100, 0x82, 0, 0, 1, 0, 50, 0x03 | (1 << 2), 0, 0, 0, 0, 0, 0x40, 0, 0, 0, 0, 0, 0, 1};
  put("shm_ring", "ops", ring, sizeof ring, NULL, 0);
  return 0;
}
