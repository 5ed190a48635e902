/* fuzz_frame.c — the frame reader (csrc/net/wire.c) on any bytes a peer may send:
   frames are read one after another from a socket holding the input until the
   reader refuses one or the bytes end.  A frame is never longer than the cap, and
   nothing is read past the end of the buffer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "net/wire.h"
#include "transport.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int sp[2];
  if (size > 150000 || fuzz_socket_with(data, size, sp) != 0) return 0;
  static unsigned char buf[1024];
  /* the cap varies with the input: small caps exercise the refusal of long frames */
  uint32_t cap = size ? (uint32_t)(data[size - 1] % 4 == 0 ? sizeof buf : data[size - 1] % 64) : 16;
  for (;;) {
    uint16_t type = 0;
    uint32_t len = 0;
    if (ruccl_frame_recv(sp[0], &type, buf, cap, &len, ruccl_now_ns() + 100000000) != RUCCL_OK) break;
    if (len > cap) abort();
  }
  close(sp[0]);
  close(sp[1]);
  return 0;
}
