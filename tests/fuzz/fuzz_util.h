/* fuzz_util.h — what the fuzz targets share. */
#ifndef RUCCL_FUZZ_UTIL_H
#define RUCCL_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

/* A connected socket pair whose first end reads data[0..n) and then the end of the
   stream (the second end is shut for writing; close both).  Returns 0, or -1. */
static inline int fuzz_socket_with(const uint8_t *data, size_t n, int sp[2]) {
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) != 0) return -1;
  int big = 1 << 20;
  setsockopt(sp[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  setsockopt(sp[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  size_t off = 0;
  while (off < n) {
    ssize_t w = send(sp[1], data + off, n - off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w <= 0) break;
    off += (size_t)w;
  }
  shutdown(sp[1], SHUT_WR);
  return 0;
}

#endif
