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
  return ruccl_tcp_connect_ex(host, port, deadline_ns, 1, fd_out);
}

ruccl_result_t ruccl_tcp_connect_ex(const char *host, int port, int64_t deadline_ns, int retry_refused, int *fd_out) {
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
    if (!retry_refused && last_errno == ECONNREFUSED)
      return ruccl_fail(RUCCL_ERR_PEER_LOST, "%s:%d refused the connection: nothing listens there", host, port);
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

ruccl_result_t ruccl_auth_key(const void *secret, size_t secret_len, unsigned char key[RUCCL_AUTH_KEY_BYTES]) {
  static const unsigned char salt[] = "ruccl-auth-v2";
  if (secret_len == 0 || secret_len > RUCCL_MAX_SECRET || !secret)
    return ruccl_fail(RUCCL_ERR_INVALID_CONFIG, "the session secret is empty or longer than %d bytes", RUCCL_MAX_SECRET);
  if (PKCS5_PBKDF2_HMAC(secret, (int)secret_len, salt, sizeof salt - 1, RUCCL_AUTH_ROUNDS, EVP_sha256(),
                        RUCCL_AUTH_KEY_BYTES, key) != 1)
    return ruccl_fail(RUCCL_ERR_IO, "PBKDF2 failed");
  return RUCCL_OK;
}

/* HMAC(key, label | Ns | Nc | type | len | first): a proof that binds both nonces,
   the side that speaks and the connection's first frame. */
static void proof(const unsigned char key[RUCCL_AUTH_KEY_BYTES], const char *label, const unsigned char *ns,
                  const unsigned char *nc, uint16_t type, const void *first, uint32_t len,
                  unsigned char out[PROOF_BYTES]) {
  unsigned char head[32 + 2 * NONCE_BYTES + 6];
  size_t n = strlen(label) + 1; /* with its terminator: no label is a prefix of another */
  memcpy(head, label, n);
  memcpy(head + n, ns, NONCE_BYTES);
  memcpy(head + n + NONCE_BYTES, nc, NONCE_BYTES);
  unsigned char *t = head + n + 2 * NONCE_BYTES;
  t[0] = (unsigned char)(type >> 8), t[1] = (unsigned char)type;
  t[2] = (unsigned char)(len >> 24), t[3] = (unsigned char)(len >> 16), t[4] = (unsigned char)(len >> 8),
  t[5] = (unsigned char)len;
  size_t hl = n + 2 * NONCE_BYTES + 6;
  unsigned char *msg = malloc(hl + len);
  unsigned int out_len = PROOF_BYTES;
  if (msg) {
    memcpy(msg, head, hl);
    if (len) memcpy(msg + hl, first, len);
  }
  if (!msg || !HMAC(EVP_sha256(), key, RUCCL_AUTH_KEY_BYTES, msg, hl + len, out, &out_len))
    RAND_bytes(out, PROOF_BYTES); /* out of memory: a proof nobody can match */
  free(msg);
}

#define AUTH_HEAD_BYTES RUCCL_AUTH_HEAD_BYTES

ruccl_result_t ruccl_auth_hello(unsigned char hello[RUCCL_AUTH_HELLO_BYTES]) {
  uint32_t version = htonl(RUCCL_AUTH_VERSION);
  memcpy(hello, &version, 4);
  if (RAND_bytes(hello + 4, NONCE_BYTES) != 1) return ruccl_fail(RUCCL_ERR_IO, "no random bytes for a nonce");
  return RUCCL_OK;
}

ruccl_result_t ruccl_auth_check(const unsigned char key[RUCCL_AUTH_KEY_BYTES],
                                const unsigned char hello[RUCCL_AUTH_HELLO_BYTES], const unsigned char *auth,
                                uint32_t n, uint16_t *type, const unsigned char **first, uint32_t *len,
                                unsigned char proof_out[RUCCL_AUTH_PROOF_BYTES]) {
  if (n < AUTH_HEAD_BYTES) return ruccl_fail(RUCCL_ERR_PROTOCOL, "an authentication frame of %u bytes", n);
  const unsigned char *ns = hello + 4, *nc = auth, *their = auth + NONCE_BYTES, *body = auth + AUTH_HEAD_BYTES;
  uint16_t ft = (uint16_t)(auth[NONCE_BYTES + PROOF_BYTES] << 8 | auth[NONCE_BYTES + PROOF_BYTES + 1]);
  uint32_t flen = n - AUTH_HEAD_BYTES;
  unsigned char expect[PROOF_BYTES];
  proof(key, "ruccl-auth-v2 client", ns, nc, ft, body, flen, expect);
  if (CRYPTO_memcmp(expect, their, PROOF_BYTES) != 0)
    return ruccl_fail(RUCCL_ERR_AUTH, "a connection failed to prove it knows the session secret");
  proof(key, "ruccl-auth-v2 server", ns, nc, ft, body, flen, proof_out);
  *type = ft;
  *first = body;
  *len = flen;
  return RUCCL_OK;
}

ruccl_result_t ruccl_auth_server(int fd, const unsigned char key[RUCCL_AUTH_KEY_BYTES], uint16_t *type, void *first,
                                 uint32_t cap, uint32_t *len, int64_t deadline_ns) {
  unsigned char hello[RUCCL_AUTH_HELLO_BYTES];
  *type = 0;
  *len = 0;
  if (cap > RUCCL_WIRE_MAX_CONTROL - AUTH_HEAD_BYTES) cap = RUCCL_WIRE_MAX_CONTROL - AUTH_HEAD_BYTES;
  ruccl_result_t rc = ruccl_auth_hello(hello);
  if (rc != RUCCL_OK) return rc;
  unsigned char *auth = malloc(AUTH_HEAD_BYTES + (size_t)cap);
  if (!auth) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "authentication frame");
  rc = ruccl_frame_send(fd, RUCCL_FRAME_HELLO, hello, sizeof hello, deadline_ns);
  uint16_t t = 0;
  uint32_t n = 0;
  if (rc == RUCCL_OK) rc = ruccl_frame_recv(fd, &t, auth, AUTH_HEAD_BYTES + cap, &n, deadline_ns);
  if (rc == RUCCL_OK && t != RUCCL_FRAME_AUTH)
    rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "expected an authentication frame, got type %u of %u bytes", t, n);
  const unsigned char *body = NULL;
  unsigned char mine[PROOF_BYTES];
  if (rc == RUCCL_OK) rc = ruccl_auth_check(key, hello, auth, n, type, &body, len, mine);
  if (rc == RUCCL_ERR_AUTH) {
    ruccl_frame_send(fd, RUCCL_FRAME_AUTH_FAIL, NULL, 0, deadline_ns);
    ruccl_fail(RUCCL_ERR_AUTH, "a connection failed to prove it knows the session secret");
  }
  if (rc == RUCCL_OK) rc = ruccl_frame_send(fd, RUCCL_FRAME_AUTH_OK, mine, sizeof mine, deadline_ns);
  if (rc == RUCCL_OK) memcpy(first, body, *len);
  else *type = 0, *len = 0;
  free(auth);
  return rc;
}

ruccl_result_t ruccl_auth_client(int fd, const unsigned char key[RUCCL_AUTH_KEY_BYTES], uint16_t type,
                                 const void *first, uint32_t len, int64_t deadline_ns) {
  unsigned char hello[RUCCL_AUTH_HELLO_BYTES], their[PROOF_BYTES], expect[PROOF_BYTES];
  const unsigned char *ns = hello + 4;
  if (len > RUCCL_WIRE_MAX_CONTROL - AUTH_HEAD_BYTES)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "a first frame of %u bytes is too long", len);
  uint16_t t = 0;
  uint32_t n = 0;
  ruccl_result_t rc = ruccl_frame_recv(fd, &t, hello, sizeof hello, &n, deadline_ns);
  if (rc != RUCCL_OK) return rc;
  uint32_t version;
  memcpy(&version, hello, 4);
  if (t != RUCCL_FRAME_HELLO || n != sizeof hello || ntohl(version) != RUCCL_AUTH_VERSION)
    return ruccl_fail(RUCCL_ERR_PROTOCOL, "expected a hello frame of handshake version %d, got type %u of %u bytes",
                      RUCCL_AUTH_VERSION, t, n);
  unsigned char *auth = malloc(AUTH_HEAD_BYTES + (size_t)len);
  if (!auth) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "authentication frame");
  unsigned char *nc = auth;
  if (RAND_bytes(nc, NONCE_BYTES) != 1) {
    free(auth);
    return ruccl_fail(RUCCL_ERR_IO, "no random bytes for a nonce");
  }
  proof(key, "ruccl-auth-v2 client", ns, nc, type, first, len, auth + NONCE_BYTES);
  auth[NONCE_BYTES + PROOF_BYTES] = (unsigned char)(type >> 8);
  auth[NONCE_BYTES + PROOF_BYTES + 1] = (unsigned char)type;
  if (len) memcpy(auth + AUTH_HEAD_BYTES, first, len);
  rc = ruccl_frame_send(fd, RUCCL_FRAME_AUTH, auth, AUTH_HEAD_BYTES + len, deadline_ns);
  if (rc == RUCCL_OK) rc = ruccl_frame_recv(fd, &t, their, sizeof their, &n, deadline_ns);
  if (rc == RUCCL_OK && t == RUCCL_FRAME_AUTH_FAIL)
    rc = ruccl_fail(RUCCL_ERR_AUTH, "the other side refused our proof of the session secret");
  else if (rc == RUCCL_ERR_PEER_LOST) /* gone mid-handshake (a refused proof is answered AUTH_FAIL) */
    rc = ruccl_fail(RUCCL_ERR_PEER_LOST, "the other side closed the connection during the handshake");
  else if (rc == RUCCL_OK && (t != RUCCL_FRAME_AUTH_OK || n != sizeof their))
    rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "expected an authentication reply, got type %u", t);
  if (rc == RUCCL_OK) {
    proof(key, "ruccl-auth-v2 server", ns, nc, type, first, len, expect);
    if (CRYPTO_memcmp(expect, their, PROOF_BYTES) != 0)
      rc = ruccl_fail(RUCCL_ERR_AUTH, "the other side does not know the session secret");
  }
  free(auth);
  return rc;
}

void ruccl_node_lost_encode(uint32_t id, unsigned char out[RUCCL_NODE_LOST_BYTES]) {
  for (int i = 0; i < 4; i++) out[i] = (unsigned char)(id >> (8 * i));
}

uint32_t ruccl_node_lost_decode(const unsigned char in[RUCCL_NODE_LOST_BYTES]) {
  return (uint32_t)in[0] | (uint32_t)in[1] << 8 | (uint32_t)in[2] << 16 | (uint32_t)in[3] << 24;
}
