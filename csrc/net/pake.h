/* pake.h — a password-authenticated key exchange (SPAKE2, RFC 9382's construction)
   on NIST P-256, for the handshake (wire.c, docs/handshake.md).

   Both sides know w, derived from the session key.  The client sends
   T = x·G + w·M, the server S = y·G + w·N (x, y fresh random scalars; M, N fixed
   points whose discrete logarithms nobody knows), and each computes the same
   K = x·y·G: the client as x·(S − w·N), the server as y·(T − w·M).  The shared
   secret they derive binds both shares, K and w.  A party that does not know w
   gets a share it cannot use, and what it sees of an exchange lets it test one
   guess of the secret per connection it takes part in, never a dictionary
   offline.  All arithmetic is OpenSSL's (libcrypto's EC_POINT): nothing here is
   hand-written crypto but the construction. */
#ifndef RUCCL_PAKE_H
#define RUCCL_PAKE_H

#include "ruccl.h"

#define RUCCL_PAKE_SHARE_BYTES 65  /* an uncompressed P-256 point */
#define RUCCL_PAKE_SCALAR_BYTES 32
#define RUCCL_PAKE_SECRET_BYTES 32 /* what both sides end with */
#define RUCCL_PAKE_KEY_BYTES 32    /* the stretched session key w is derived from */

typedef enum { RUCCL_PAKE_CLIENT = 0, RUCCL_PAKE_SERVER = 1 } ruccl_pake_role_t;

typedef struct {
  ruccl_pake_role_t role;
  unsigned char scalar[RUCCL_PAKE_SCALAR_BYTES]; /* x or y: secret, wiped by ruccl_pake_wipe */
  unsigned char share[RUCCL_PAKE_SHARE_BYTES];   /* T or S: what goes on the wire */
} ruccl_pake_t;

/* A fresh scalar and this side's share. */
ruccl_result_t ruccl_pake_start(const unsigned char key[RUCCL_PAKE_KEY_BYTES], ruccl_pake_role_t role,
                                ruccl_pake_t *p);
/* The shared secret from the other side's share: SHA-256 over a label, the client's
   and the server's shares, K and w.  RUCCL_ERR_PROTOCOL when their share is not a
   point of the curve (or is the identity, or K is). */
ruccl_result_t ruccl_pake_finish(const unsigned char key[RUCCL_PAKE_KEY_BYTES], const ruccl_pake_t *p,
                                 const unsigned char their[RUCCL_PAKE_SHARE_BYTES],
                                 unsigned char secret[RUCCL_PAKE_SECRET_BYTES]);
void ruccl_pake_wipe(ruccl_pake_t *p);

#endif
