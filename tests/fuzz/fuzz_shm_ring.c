/* fuzz_shm_ring.c — a shared-memory ring (csrc/net/shm_link.c) whose counters a
   faulty or hostile peer may set to anything: each input is a list of operations
   (write, read, peek and consume, set a counter).  Nothing is copied outside the
   ring, no call returns more than asked, and a corrupt ring says so. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/shm_link.h"

static ruccl_shm_link_t a, b; /* the two sides of one segment */
static unsigned char scratch[1 << 16];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  char name[RUCCL_SHM_NAME_MAX];
  unsigned char token[RUCCL_SHM_TOKEN_BYTES];
  if (ruccl_shm_create(&a, name, token) != RUCCL_OK || ruccl_shm_open(&b, name, token) != RUCCL_OK) return 1;
  ruccl_shm_unlink(name);
  return 0;
}

static int inside(const ruccl_shm_link_t *l, const void *p, size_t n) {
  const char *m = l->map, *q = p;
  return q >= m && q + n <= m + l->map_len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (int w = 0; w < 4; w++) ruccl_shm_testing_set_counter(&a, w, 0);
  size_t i = 0;
  while (i + 3 <= size) {
    uint8_t op = data[i];
    size_t n = ((size_t)data[i + 1] << 8 | data[i + 2]) % sizeof scratch;
    i += 3;
    ruccl_shm_link_t *side = op & 0x80 ? &b : &a;
    switch (op & 3) {
      case 0: {
        size_t got = ruccl_shm_write(side, scratch, n);
        if (got != RUCCL_SHM_CORRUPT && got > n) abort();
        break;
      }
      case 1: {
        size_t got = ruccl_shm_read(side, scratch, n);
        if (got != RUCCL_SHM_CORRUPT && got > n) abort();
        break;
      }
      case 2: {
        const void *p = NULL;
        size_t got = ruccl_shm_peek(side, &p);
        if (got == RUCCL_SHM_CORRUPT) break;
        if (got && !inside(side, p, got)) abort();
        ruccl_shm_consume(side, got < n ? got : n);
        break;
      }
      case 3: {
        if (i + 8 > size) return 0;
        uint64_t v = 0;
        for (int k = 0; k < 8; k++) v = v << 8 | data[i + k];
        i += 8;
        ruccl_shm_testing_set_counter(&a, (op >> 2) & 3, v);
        break;
      }
    }
  }
  return 0;
}
