/* fuzz_handshake.c — both sides of the handshake (csrc/net/wire.c, pake.c) on any
   bytes: the server's check of an AUTH payload (ruccl_auth_check: the client's share
   and proof), and the client reading
   a stranger's HELLO and answer from a socket.  A first frame handed back lies
   within the payload; nothing is accepted without a valid proof. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "net/wire.h"
#include "transport.h"

static unsigned char key[RUCCL_AUTH_KEY_BYTES];
static ruccl_auth_server_t server; /* one HELLO's state, copied for each input (a check wipes it) */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  return ruccl_auth_key("fuzz-secret", 11, key) == RUCCL_OK && ruccl_auth_hello(key, &server) == RUCCL_OK ? 0 : 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0 || size > 70000) return 0;
  const uint8_t *in = data + 1;
  size_t n = size - 1;
  if (data[0] & 1) { /* the server's check */
    uint16_t type = 0;
    const unsigned char *first = NULL;
    uint32_t len = 0;
    unsigned char proof[RUCCL_AUTH_PROOF_BYTES];
    ruccl_auth_server_t state = server;
    ruccl_result_t rc = ruccl_auth_check(key, &state, in, (uint32_t)n, &type, &first, &len, proof);
    if (rc == RUCCL_OK && (first < in || first + len > in + n)) abort();
    return 0;
  }
  /* the client, against a "server" that sends the input */
  int sp[2];
  if (fuzz_socket_with(in, n, sp) != 0) return 0;
  static const char first[] = "a first frame";
  if (ruccl_auth_client(sp[0], key, 10, first, sizeof first, ruccl_now_ns() + 100000000) == RUCCL_OK) {
    /* only a server that knows the key could have answered: the input cannot */
    abort();
  }
  close(sp[0]);
  close(sp[1]);
  return 0;
}
