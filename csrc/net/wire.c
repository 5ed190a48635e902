/* wire.c — TCP with deadlines, bounded frames, and HMAC-SHA256 challenge-response
   (OpenSSL's libcrypto: no hand-written crypto). */
#include "wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../error.h"
#include "../transport.h"

#define NONCE_BYTES 32
#define PROOF_BYTES 32

ruccl_result_t ruccl_split_host_port(const char *hp, char *host, size_t cap, int *port) {
  if (!hp) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "address is NULL");
  const char *colon = strrchr(hp, ':');
  if (!colon || colon == hp || (size_t)(colon - hp) >= cap)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "address '%s' is not HOST:PORT", hp);
  char *end;
  long p = strtol(colon + 1, &end, 10);
  if (*end || end == colon + 1 || p < 0 || p > 65535)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "address '%s' has no valid port", hp);
  memcpy(host, hp, (size_t)(colon - hp));
  host[colon - hp] = 0;
  *port = (int)p;
  return RUCCL_OK;
}

static ruccl_result_t resolve(const char *host, int port, struct sockaddr_in *sa) {
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, host, &sa->sin_addr) == 1) return RUCCL_OK;
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
  int e = getaddrinfo(host, NULL, &hints, &res);
  if (e != 0 || !res) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "cannot resolve host '%s': %s", host, gai_strerror(e));
  sa->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return RUCCL_OK;
}

static void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFD, FD_CLOEXEC);
}

ruccl_result_t ruccl_tcp_listen(const char *host, int port, int *fd_out, int *bound_port) {
  struct sockaddr_in sa;
  ruccl_result_t rc = resolve(host, port, &sa);
  if (rc != RUCCL_OK) return rc;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ruccl_fail(RUCCL_ERR_IO, "socket: %s", strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  /* the whole queue the system allows: a thousand nodes may connect at once */
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 4096) != 0) { /* the kernel caps it at net.core.somaxconn */
    int e = errno;
    close(fd);
    return ruccl_fail(RUCCL_ERR_IO, "cannot listen on %s:%d: %s", host, port, strerror(e));
  }
  socklen_t len = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &len);
  *bound_port = ntohs(sa.sin_port);
  *fd_out = fd;
  return RUCCL_OK;
}

static int remaining_ms(int64_t deadline_ns) {
  int64_t left = deadline_ns - ruccl_now_ns();
  if (left <= 0) return 0;
  int64_t ms = (left + 999999) / 1000000;
  return ms > 1000000 ? 1000000 : (int)ms;
}

ruccl_result_t ruccl_tcp_connect(const char *host, int port, int64_t deadline_ns, int *fd_out) {
  struct sockaddr_in sa;
  ruccl_result_t rc = resolve(host, port, &sa);
  if (rc != RUCCL_OK) return rc;
  int last_errno = 0;
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return ruccl_fail(RUCCL_ERR_IO, "socket: %s", strerror(errno));
    int r = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    if (r != 0 && errno == EINPROGRESS) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      int ms = remaining_ms(deadline_ns);
      if (poll(&p, 1, ms) == 1) {
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
        r = err ? -1 : 0;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (r == 0) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      tune(fd);
      *fd_out = fd;
      return RUCCL_OK;
    }
    last_errno = errno;
    close(fd);
    if (ruccl_now_ns() >= deadline_ns)
      return ruccl_fail(RUCCL_ERR_TIMEOUT, "cannot reach %s:%d before the timeout (%s)", host, port,
                        strerror(last_errno));
    struct timespec pause = {0, 20 * 1000000}; /* retry: the other side may not listen yet */
    nanosleep(&pause, NULL);
  }
}

int ruccl_accept_until_woken(int listen_fd, int wake_fd) {
  for (;;) {
    struct pollfd p[2] = {{.fd = listen_fd, .events = POLLIN}, {.fd = wake_fd, .events = POLLIN}};
    if (poll(p, 2, -1) < 0) continue;
    if (p[1].revents) return -1;
    if (!(p[0].revents & POLLIN)) continue;
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
      /* out of descriptors or memory: the connection stays queued; back off instead
         of spinning on it (woken all the same) */
      struct pollfd w = {.fd = wake_fd, .events = POLLIN};
      if (poll(&w, 1, 50) == 1) return -1;
      continue;
    }
    if (fd < 0) continue;
    tune(fd);
    return fd;
  }
}

ruccl_result_t ruccl_tcp_accept(int listen_fd, int64_t deadline_ns, int *fd_out) {
  for (;;) {
    struct pollfd p = {.fd = listen_fd, .events = POLLIN};
    int r = poll(&p, 1, remaining_ms(deadline_ns));
    if (r == 1) {
      int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
      if (fd >= 0) {
        tune(fd);
        *fd_out = fd;
        return RUCCL_OK;
      }
      if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN)
        return ruccl_fail(RUCCL_ERR_IO, "accept: %s", strerror(errno));
    } else if (r < 0 && errno != EINTR) {
      return ruccl_fail(RUCCL_ERR_IO, "poll: %s", strerror(errno));
    }
    if (ruccl_now_ns() >= deadline_ns) return ruccl_fail(RUCCL_ERR_TIMEOUT, "no connection before the timeout");
  }
}

static ruccl_result_t wait_fd(int fd, short events, int64_t deadline_ns) {
  for (;;) {
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, remaining_ms(deadline_ns));
    if (r == 1) return RUCCL_OK;
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ruccl_fail(RUCCL_ERR_IO, "poll: %s", strerror(errno));
    if (ruccl_now_ns() >= deadline_ns) return ruccl_fail(RUCCL_ERR_TIMEOUT, "socket I/O timed out");
  }
}

ruccl_result_t ruccl_write_all(int fd, const void *buf, size_t len, int64_t deadline_ns) {
  const char *p = buf;
  while (len) {
    ssize_t w = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      len -= (size_t)w;
      continue;
    }
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      ruccl_result_t rc = wait_fd(fd, POLLOUT, deadline_ns);
      if (rc != RUCCL_OK) return rc;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    return ruccl_fail(RUCCL_ERR_PEER_LOST, "connection lost while sending: %s", strerror(errno));
  }
  return RUCCL_OK;
}

ruccl_result_t ruccl_read_all(int fd, void *buf, size_t len, int64_t deadline_ns) {
  char *p = buf;
  while (len) {
    ssize_t r = recv(fd, p, len, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      len -= (size_t)r;
      continue;
    }
    if (r == 0) return ruccl_fail(RUCCL_ERR_PEER_LOST, "connection closed by the other side");
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      ruccl_result_t rc = wait_fd(fd, POLLIN, deadline_ns);
      if (rc != RUCCL_OK) return rc;
      continue;
    }
    if (errno == EINTR) continue;
    return ruccl_fail(RUCCL_ERR_PEER_LOST, "connection lost while receiving: %s", strerror(errno));
  }
  return RUCCL_OK;
}

ruccl_result_t ruccl_frame_send(int fd, uint16_t type, const void *payload, uint32_t len, int64_t deadline_ns) {
  ruccl_frame_header_t h = {.magic = htonl(RUCCL_WIRE_MAGIC), .type = htons(type), .flags = 0, .length = htonl(len)};
  ruccl_result_t rc = ruccl_write_all(fd, &h, sizeof h, deadline_ns);
  if (rc == RUCCL_OK && len) rc = ruccl_write_all(fd, payload, len, deadline_ns);
  return rc;
}

ruccl_result_t ruccl_frame_recv(int fd, uint16_t *type, void *payload, uint32_t cap, uint32_t *len,
                                int64_t deadline_ns) {
  ruccl_frame_header_t h;
  ruccl_result_t rc = ruccl_read_all(fd, &h, sizeof h, deadline_ns);
  if (rc != RUCCL_OK) return rc;
  if (ntohl(h.magic) != RUCCL_WIRE_MAGIC) return ruccl_fail(RUCCL_ERR_PROTOCOL, "frame with a bad magic number");
  uint32_t n = ntohl(h.length);
  if (n > cap) return ruccl_fail(RUCCL_ERR_PROTOCOL, "frame of %u bytes exceeds the %u allowed", n, cap);
  rc = ruccl_read_all(fd, payload, n, deadline_ns);
  if (rc != RUCCL_OK) return rc;
  *type = ntohs(h.type);
  *len = n;
  return RUCCL_OK;
}

static void proof(const void *secret, size_t secret_len, const char *role, const unsigned char *a,
                  const unsigned char *b, unsigned char out[PROOF_BYTES]) {
  unsigned char msg[16 + 2 * NONCE_BYTES];
  size_t rl = strlen(role);
  memcpy(msg, role, rl);
  memcpy(msg + rl, a, NONCE_BYTES);
  memcpy(msg + rl + NONCE_BYTES, b, NONCE_BYTES);
  static const unsigned char empty_key = 0;
  unsigned int out_len = PROOF_BYTES;
  HMAC(EVP_sha256(), secret_len ? secret : &empty_key, (int)secret_len, msg, rl + 2 * NONCE_BYTES, out, &out_len);
}

ruccl_result_t ruccl_auth_server(int fd, const void *secret, size_t secret_len, int64_t deadline_ns) {
  unsigned char ns[NONCE_BYTES], reply[NONCE_BYTES + PROOF_BYTES], expect[PROOF_BYTES];
  if (RAND_bytes(ns, sizeof ns) != 1) return ruccl_fail(RUCCL_ERR_IO, "no random bytes for a nonce");
  ruccl_result_t rc = ruccl_frame_send(fd, RUCCL_FRAME_HELLO, ns, sizeof ns, deadline_ns);
  uint16_t type = 0;
  uint32_t len = 0;
  if (rc == RUCCL_OK) rc = ruccl_frame_recv(fd, &type, reply, sizeof reply, &len, deadline_ns);
  if (rc != RUCCL_OK) return rc;
  if (type != RUCCL_FRAME_AUTH || len != sizeof reply)
    return ruccl_fail(RUCCL_ERR_PROTOCOL, "expected an authentication frame, got type %u of %u bytes", type, len);
  proof(secret, secret_len, "ruccl-client", ns, reply, expect);
  if (CRYPTO_memcmp(expect, reply + NONCE_BYTES, PROOF_BYTES) != 0) {
    ruccl_frame_send(fd, RUCCL_FRAME_AUTH_FAIL, NULL, 0, deadline_ns);
    return ruccl_fail(RUCCL_ERR_AUTH, "a connection failed to prove it knows the session secret");
  }
  unsigned char mine[PROOF_BYTES];
  proof(secret, secret_len, "ruccl-server", reply, ns, mine);
  return ruccl_frame_send(fd, RUCCL_FRAME_AUTH_OK, mine, sizeof mine, deadline_ns);
}

ruccl_result_t ruccl_auth_client(int fd, const void *secret, size_t secret_len, int64_t deadline_ns) {
  unsigned char ns[NONCE_BYTES], msg[NONCE_BYTES + PROOF_BYTES], their[PROOF_BYTES], expect[PROOF_BYTES];
  uint16_t type = 0;
  uint32_t len = 0;
  ruccl_result_t rc = ruccl_frame_recv(fd, &type, ns, sizeof ns, &len, deadline_ns);
  if (rc != RUCCL_OK) return rc;
  if (type != RUCCL_FRAME_HELLO || len != sizeof ns)
    return ruccl_fail(RUCCL_ERR_PROTOCOL, "expected a hello frame, got type %u of %u bytes", type, len);
  if (RAND_bytes(msg, NONCE_BYTES) != 1) return ruccl_fail(RUCCL_ERR_IO, "no random bytes for a nonce");
  proof(secret, secret_len, "ruccl-client", ns, msg, msg + NONCE_BYTES);
  rc = ruccl_frame_send(fd, RUCCL_FRAME_AUTH, msg, sizeof msg, deadline_ns);
  if (rc == RUCCL_OK) rc = ruccl_frame_recv(fd, &type, their, sizeof their, &len, deadline_ns);
  if (rc == RUCCL_ERR_PEER_LOST || (rc == RUCCL_OK && type == RUCCL_FRAME_AUTH_FAIL))
    return ruccl_fail(RUCCL_ERR_AUTH, "the other side refused our proof of the session secret");
  if (rc != RUCCL_OK) return rc;
  if (type != RUCCL_FRAME_AUTH_OK || len != sizeof their)
    return ruccl_fail(RUCCL_ERR_PROTOCOL, "expected an authentication reply, got type %u", type);
  proof(secret, secret_len, "ruccl-server", msg, ns, expect);
  if (CRYPTO_memcmp(expect, their, PROOF_BYTES) != 0)
    return ruccl_fail(RUCCL_ERR_AUTH, "the other side does not know the session secret");
  return RUCCL_OK;
}
