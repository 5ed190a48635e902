/* pake.c — SPAKE2 on P-256 (pake.h) over OpenSSL's EC_POINT arithmetic. */
#include "pake.h"

#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/obj_mac.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <string.h>

#include "../error.h"

/* The curve and M, N, made once per process and only read after.  M and N are
   "nothing up my sleeve" points: the first x = SHA-256(label ‖ counter) that lies on
   the curve, with even y.  Nobody knows their discrete logarithms, which is all
   SPAKE2 asks of them. */
static EC_GROUP *curve;
static EC_POINT *point_m, *point_n;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static EC_POINT *hashed_point(const char *label) {
  EC_POINT *p = EC_POINT_new(curve);
  if (!p) return NULL;
  size_t n = strlen(label);
  unsigned char in[64], oct[1 + SHA256_DIGEST_LENGTH];
  if (n > sizeof in - 1) n = sizeof in - 1;
  memcpy(in, label, n);
  for (unsigned counter = 0; counter < 256; counter++) {
    in[n] = (unsigned char)counter;
    oct[0] = 0x02; /* compressed, even y */
    SHA256(in, n + 1, oct + 1);
    if (EC_POINT_oct2point(curve, p, oct, sizeof oct, NULL) == 1 && !EC_POINT_is_at_infinity(curve, p)) {
      ERR_clear_error();
      return p;
    }
  }
  ERR_clear_error();
  EC_POINT_free(p);
  return NULL;
}

static void init_curve(void) {
  curve = EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1);
  if (!curve) return;
  point_m = hashed_point("ruccl-auth-v3 SPAKE2 point M");
  point_n = hashed_point("ruccl-auth-v3 SPAKE2 point N");
}

static ruccl_result_t ready(void) {
  pthread_once(&once, init_curve);
  if (!curve || !point_m || !point_n) return ruccl_fail(RUCCL_ERR_IO, "OpenSSL has no P-256 curve");
  return RUCCL_OK;
}

/* w = SHA-512(label ‖ key) mod the group's order. */
static int derive_w(const unsigned char key[RUCCL_PAKE_KEY_BYTES], BIGNUM *w, BN_CTX *ctx) {
  static const char label[] = "ruccl-auth-v3 w";
  unsigned char in[sizeof label + RUCCL_PAKE_KEY_BYTES], h[SHA512_DIGEST_LENGTH];
  memcpy(in, label, sizeof label); /* with its terminator */
  memcpy(in + sizeof label, key, RUCCL_PAKE_KEY_BYTES);
  SHA512(in, sizeof in, h);
  BIGNUM *wide = BN_bin2bn(h, sizeof h, NULL);
  int ok = wide && BN_mod(w, wide, EC_GROUP_get0_order(curve), ctx) == 1 && !BN_is_zero(w);
  BN_clear_free(wide);
  OPENSSL_cleanse(in, sizeof in);
  OPENSSL_cleanse(h, sizeof h);
  return ok;
}

ruccl_result_t ruccl_pake_start(const unsigned char key[RUCCL_PAKE_KEY_BYTES], ruccl_pake_role_t role,
                                ruccl_pake_t *p) {
  ruccl_result_t rc = ready();
  if (rc != RUCCL_OK) return rc;
  memset(p, 0, sizeof *p);
  p->role = role;
  BN_CTX *ctx = BN_CTX_secure_new();
  BIGNUM *w = BN_secure_new(), *x = BN_secure_new();
  EC_POINT *share = EC_POINT_new(curve);
  const BIGNUM *order = EC_GROUP_get0_order(curve);
  int ok = ctx && w && x && share && derive_w(key, w, ctx);
  while (ok && (ok = BN_priv_rand_range(x, order) == 1) && BN_is_zero(x)) {
  }
  /* share = x·G + w·(M for the client, N for the server) */
  ok = ok && EC_POINT_mul(curve, share, x, role == RUCCL_PAKE_CLIENT ? point_m : point_n, w, ctx) == 1 &&
       EC_POINT_point2oct(curve, share, POINT_CONVERSION_UNCOMPRESSED, p->share, sizeof p->share, ctx) ==
           sizeof p->share &&
       BN_bn2binpad(x, p->scalar, sizeof p->scalar) == (int)sizeof p->scalar;
  EC_POINT_free(share);
  BN_clear_free(x);
  BN_clear_free(w);
  BN_CTX_free(ctx);
  ERR_clear_error();
  if (!ok) {
    ruccl_pake_wipe(p);
    return ruccl_fail(RUCCL_ERR_IO, "could not make a key-exchange share (OpenSSL)");
  }
  return RUCCL_OK;
}

ruccl_result_t ruccl_pake_finish(const unsigned char key[RUCCL_PAKE_KEY_BYTES], const ruccl_pake_t *p,
                                 const unsigned char their[RUCCL_PAKE_SHARE_BYTES],
                                 unsigned char secret[RUCCL_PAKE_SECRET_BYTES]) {
  ruccl_result_t rc = ready();
  if (rc != RUCCL_OK) return rc;
  BN_CTX *ctx = BN_CTX_secure_new();
  BIGNUM *w = BN_secure_new(), *x = BN_secure_new();
  EC_POINT *peer = EC_POINT_new(curve), *blind = EC_POINT_new(curve), *k = EC_POINT_new(curve);
  int ok = ctx && w && x && peer && blind && k && derive_w(key, w, ctx) &&
           BN_bin2bn(p->scalar, sizeof p->scalar, x) != NULL;
  rc = ok ? RUCCL_OK : ruccl_fail(RUCCL_ERR_NO_MEMORY, "key exchange");
  /* their share must be a point of the curve (oct2point checks) and not the identity */
  if (rc == RUCCL_OK && (EC_POINT_oct2point(curve, peer, their, RUCCL_PAKE_SHARE_BYTES, ctx) != 1 ||
                         EC_POINT_is_at_infinity(curve, peer)))
    rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "the other side's key-exchange share is not a point of the curve");
  /* K = x·(their − w·(N when we are the client, M when we are the server)) */
  if (rc == RUCCL_OK &&
      (EC_POINT_mul(curve, blind, NULL, p->role == RUCCL_PAKE_CLIENT ? point_n : point_m, w, ctx) != 1 ||
       EC_POINT_invert(curve, blind, ctx) != 1 || EC_POINT_add(curve, peer, peer, blind, ctx) != 1 ||
       EC_POINT_mul(curve, k, NULL, peer, x, ctx) != 1))
    rc = ruccl_fail(RUCCL_ERR_IO, "key exchange arithmetic failed (OpenSSL)");
  if (rc == RUCCL_OK && EC_POINT_is_at_infinity(curve, k))
    rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "the other side's key-exchange share gives no key");
  /* secret = SHA-256(label ‖ T ‖ S ‖ K ‖ w) */
  static const char label[] = "ruccl-auth-v3 SPAKE2";
  unsigned char tt[sizeof label + 3 * RUCCL_PAKE_SHARE_BYTES + RUCCL_PAKE_SCALAR_BYTES];
  unsigned char *q = tt;
  memcpy(q, label, sizeof label), q += sizeof label;
  memcpy(q, p->role == RUCCL_PAKE_CLIENT ? p->share : their, RUCCL_PAKE_SHARE_BYTES), q += RUCCL_PAKE_SHARE_BYTES;
  memcpy(q, p->role == RUCCL_PAKE_CLIENT ? their : p->share, RUCCL_PAKE_SHARE_BYTES), q += RUCCL_PAKE_SHARE_BYTES;
  if (rc == RUCCL_OK &&
      (EC_POINT_point2oct(curve, k, POINT_CONVERSION_UNCOMPRESSED, q, RUCCL_PAKE_SHARE_BYTES, ctx) !=
           RUCCL_PAKE_SHARE_BYTES ||
       BN_bn2binpad(w, q + RUCCL_PAKE_SHARE_BYTES, RUCCL_PAKE_SCALAR_BYTES) != RUCCL_PAKE_SCALAR_BYTES))
    rc = ruccl_fail(RUCCL_ERR_IO, "key exchange encoding failed (OpenSSL)");
  if (rc == RUCCL_OK) SHA256(tt, sizeof tt, secret);
  OPENSSL_cleanse(tt, sizeof tt);
  EC_POINT_clear_free(k);
  EC_POINT_clear_free(blind);
  EC_POINT_free(peer);
  BN_clear_free(x);
  BN_clear_free(w);
  BN_CTX_free(ctx);
  ERR_clear_error();
  return rc;
}

void ruccl_pake_wipe(ruccl_pake_t *p) { OPENSSL_cleanse(p, sizeof *p); }
