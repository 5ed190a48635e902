/* fuzz_agreement.c — the agreement's messages from another node (csrc/agreement.h):
   a descriptor, a verdict and its extras decoded from any bytes, then the checks a
   receiver runs before it uses a field. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agreement.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size >= RUCCL_DESC_WIRE_BYTES) {
    unsigned char *w = malloc(RUCCL_DESC_WIRE_BYTES);
    memcpy(w, data, RUCCL_DESC_WIRE_BYTES);
    coll_desc_t d;
    ruccl_desc_decode(w, &d);
    free(w);
    const char *why = ruccl_desc_malformed(&d);
    if (!why && !memchr(d.detail, 0, sizeof d.detail)) abort();
    if (!why && d.local_error == RUCCL_OK && (d.ndim < 0 || d.ndim > RUCCL_MAX_DIMS)) abort();
    unsigned char again[RUCCL_DESC_WIRE_BYTES];
    ruccl_desc_encode(&d, again);
    if (memcmp(again, data, RUCCL_DESC_WIRE_BYTES) != 0) abort(); /* every byte is a field */
  }
  if (size >= RUCCL_VERDICT_WIRE_BYTES + RUCCL_EXTRAS_WIRE_BYTES) {
    coll_verdict_t v;
    coll_extras_t x;
    ruccl_verdict_decode(data, &v);
    ruccl_extras_decode(data + RUCCL_VERDICT_WIRE_BYTES, &x);
    unsigned n_total = size > RUCCL_VERDICT_WIRE_BYTES + RUCCL_EXTRAS_WIRE_BYTES
                           ? data[RUCCL_VERDICT_WIRE_BYTES + RUCCL_EXTRAS_WIRE_BYTES] + 1u
                           : 1u;
    if (ruccl_verdict_check(n_total, &v, &x) == RUCCL_OK) {
      if (!memchr(v.message, 0, sizeof v.message) || v.sender_pos < 0 || (unsigned)v.sender_pos >= n_total) abort();
    }
  }
  return 0;
}
