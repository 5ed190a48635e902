/* wire.c — TCP with deadlines, bounded frames, and the handshake: a SPAKE2 key
   exchange (pake.c) and HMAC-SHA256 proofs (OpenSSL's libcrypto: no hand-written
   crypto). */
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
#include "../le.h"
#include "../transport.h"

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

void ruccl_frame_header_encode(uint16_t type, uint32_t length, unsigned char out[RUCCL_FRAME_HEADER_BYTES]) {
  ruccl_put_le32(out, RUCCL_WIRE_MAGIC);
  ruccl_put_le16(out + 4, type);
  ruccl_put_le16(out + 6, 0);
  ruccl_put_le32(out + 8, length);
}

ruccl_result_t ruccl_frame_header_decode(const unsigned char in[RUCCL_FRAME_HEADER_BYTES], uint16_t *type,
                                         uint32_t *length) {
  if (ruccl_get_le32(in) != RUCCL_WIRE_MAGIC || ruccl_get_le16(in + 6) != 0)
    return ruccl_fail(RUCCL_ERR_PROTOCOL, "frame with a bad magic number or unknown flags");
  *type = ruccl_get_le16(in + 4);
  *length = ruccl_get_le32(in + 8);
  return RUCCL_OK;
}

ruccl_result_t ruccl_frame_send(int fd, uint16_t type, const void *payload, uint32_t len, int64_t deadline_ns) {
  unsigned char h[RUCCL_FRAME_HEADER_BYTES];
  ruccl_frame_header_encode(type, len, h);
  ruccl_result_t rc = ruccl_write_all(fd, h, sizeof h, deadline_ns);
  if (rc == RUCCL_OK && len) rc = ruccl_write_all(fd, payload, len, deadline_ns);
  return rc;
}

ruccl_result_t ruccl_frame_recv(int fd, uint16_t *type, void *payload, uint32_t cap, uint32_t *len,
                                int64_t deadline_ns) {
  unsigned char h[RUCCL_FRAME_HEADER_BYTES];
  uint16_t t = 0;
  uint32_t n = 0;
  ruccl_result_t rc = ruccl_read_all(fd, h, sizeof h, deadline_ns);
  if (rc == RUCCL_OK) rc = ruccl_frame_header_decode(h, &t, &n);
  if (rc != RUCCL_OK) return rc;
  if (n > cap) return ruccl_fail(RUCCL_ERR_PROTOCOL, "frame of %u bytes exceeds the %u allowed", n, cap);
  rc = ruccl_read_all(fd, payload, n, deadline_ns);
  if (rc != RUCCL_OK) return rc;
  *type = t;
  *len = n;
  return RUCCL_OK;
}

ruccl_result_t ruccl_auth_key(const void *secret, size_t secret_len, unsigned char key[RUCCL_AUTH_KEY_BYTES]) {
  static const unsigned char salt[] = "ruccl-auth-v2"; /* unchanged in v3: the same stretching */
  if (secret_len == 0 || secret_len > RUCCL_MAX_SECRET || !secret)
    return ruccl_fail(RUCCL_ERR_INVALID_CONFIG, "the session secret is empty or longer than %d bytes", RUCCL_MAX_SECRET);
  if (PKCS5_PBKDF2_HMAC(secret, (int)secret_len, salt, sizeof salt - 1, RUCCL_AUTH_ROUNDS, EVP_sha256(),
                        RUCCL_AUTH_KEY_BYTES, key) != 1)
    return ruccl_fail(RUCCL_ERR_IO, "PBKDF2 failed");
  return RUCCL_OK;
}

/* HMAC(secret, label ‖ type ‖ len ‖ first): a proof of the key exchange's shared
   secret (which binds both shares, so one connection only) that binds the side that
   speaks and the connection's first frame.  Integers little-endian. */
static void proof(const unsigned char secret[RUCCL_PAKE_SECRET_BYTES], const char *label, uint16_t type,
                  const void *first, uint32_t len, unsigned char out[PROOF_BYTES]) {
  size_t n = strlen(label) + 1; /* with its terminator: no label is a prefix of another */
  size_t hl = n + 6;
  unsigned char *msg = malloc(hl + len);
  unsigned int out_len = PROOF_BYTES;
  if (msg) {
    memcpy(msg, label, n);
    ruccl_put_le16(msg + n, type);
    ruccl_put_le32(msg + n + 2, len);
    if (len) memcpy(msg + hl, first, len);
  }
  if (!msg || !HMAC(EVP_sha256(), secret, RUCCL_PAKE_SECRET_BYTES, msg, hl + len, out, &out_len))
    RAND_bytes(out, PROOF_BYTES); /* out of memory: a proof nobody can match */
  free(msg);
}

#define CLIENT_LABEL "ruccl-auth-v3 client"
#define SERVER_LABEL "ruccl-auth-v3 server"
#define AUTH_HEAD_BYTES RUCCL_AUTH_HEAD_BYTES

ruccl_result_t ruccl_auth_hello(const unsigned char key[RUCCL_AUTH_KEY_BYTES], ruccl_auth_server_t *s) {
  ruccl_result_t rc = ruccl_pake_start(key, RUCCL_PAKE_SERVER, &s->pake);
  if (rc != RUCCL_OK) return rc;
  ruccl_put_le32(s->hello, RUCCL_AUTH_VERSION);
  memcpy(s->hello + 4, s->pake.share, RUCCL_PAKE_SHARE_BYTES);
  return RUCCL_OK;
}

ruccl_result_t ruccl_auth_check(const unsigned char key[RUCCL_AUTH_KEY_BYTES], ruccl_auth_server_t *s,
                                const unsigned char *auth, uint32_t n, uint16_t *type, const unsigned char **first,
                                uint32_t *len, unsigned char proof_out[RUCCL_AUTH_PROOF_BYTES]) {
  unsigned char shared[RUCCL_PAKE_SECRET_BYTES], expect[PROOF_BYTES];
  ruccl_result_t rc = RUCCL_OK;
  if (n < AUTH_HEAD_BYTES) rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "an authentication frame of %u bytes", n);
  if (rc == RUCCL_OK) rc = ruccl_pake_finish(key, &s->pake, auth, shared);
  ruccl_pake_wipe(&s->pake); /* one answer per HELLO */
  if (rc != RUCCL_OK) return rc;
  const unsigned char *their = auth + RUCCL_PAKE_SHARE_BYTES, *body = auth + AUTH_HEAD_BYTES;
  uint16_t ft = ruccl_get_le16(their + PROOF_BYTES);
  uint32_t flen = n - AUTH_HEAD_BYTES;
  proof(shared, CLIENT_LABEL, ft, body, flen, expect);
  if (CRYPTO_memcmp(expect, their, PROOF_BYTES) != 0)
    rc = ruccl_fail(RUCCL_ERR_AUTH, "a connection failed to prove it knows the session secret");
  else
    proof(shared, SERVER_LABEL, ft, body, flen, proof_out);
  OPENSSL_cleanse(shared, sizeof shared);
  if (rc != RUCCL_OK) return rc;
  *type = ft;
  *first = body;
  *len = flen;
  return RUCCL_OK;
}

ruccl_result_t ruccl_auth_server(int fd, const unsigned char key[RUCCL_AUTH_KEY_BYTES], uint16_t *type, void *first,
                                 uint32_t cap, uint32_t *len, int64_t deadline_ns) {
  ruccl_auth_server_t state;
  *type = 0;
  *len = 0;
  if (cap > RUCCL_WIRE_MAX_CONTROL - AUTH_HEAD_BYTES) cap = RUCCL_WIRE_MAX_CONTROL - AUTH_HEAD_BYTES;
  ruccl_result_t rc = ruccl_auth_hello(key, &state);
  if (rc != RUCCL_OK) return rc;
  unsigned char *auth = malloc(AUTH_HEAD_BYTES + (size_t)cap);
  if (!auth) {
    ruccl_pake_wipe(&state.pake);
    return ruccl_fail(RUCCL_ERR_NO_MEMORY, "authentication frame");
  }
  rc = ruccl_frame_send(fd, RUCCL_FRAME_HELLO, state.hello, sizeof state.hello, deadline_ns);
  uint16_t t = 0;
  uint32_t n = 0;
  if (rc == RUCCL_OK) rc = ruccl_frame_recv(fd, &t, auth, AUTH_HEAD_BYTES + cap, &n, deadline_ns);
  if (rc == RUCCL_OK && t != RUCCL_FRAME_AUTH)
    rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "expected an authentication frame, got type %u of %u bytes", t, n);
  const unsigned char *body = NULL;
  unsigned char mine[PROOF_BYTES];
  if (rc == RUCCL_OK) rc = ruccl_auth_check(key, &state, auth, n, type, &body, len, mine);
  ruccl_pake_wipe(&state.pake);
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
  unsigned char shared[RUCCL_PAKE_SECRET_BYTES];
  if (len > RUCCL_WIRE_MAX_CONTROL - AUTH_HEAD_BYTES)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "a first frame of %u bytes is too long", len);
  uint16_t t = 0;
  uint32_t n = 0;
  ruccl_result_t rc = ruccl_frame_recv(fd, &t, hello, sizeof hello, &n, deadline_ns);
  if (rc != RUCCL_OK) return rc;
  if (t != RUCCL_FRAME_HELLO || n != sizeof hello || ruccl_get_le32(hello) != RUCCL_AUTH_VERSION)
    return ruccl_fail(RUCCL_ERR_PROTOCOL, "expected a hello frame of handshake version %d, got type %u of %u bytes",
                      RUCCL_AUTH_VERSION, t, n);
  ruccl_pake_t mine;
  rc = ruccl_pake_start(key, RUCCL_PAKE_CLIENT, &mine);
  if (rc == RUCCL_OK) rc = ruccl_pake_finish(key, &mine, hello + 4, shared);
  unsigned char *auth = rc == RUCCL_OK ? malloc(AUTH_HEAD_BYTES + (size_t)len) : NULL;
  if (rc == RUCCL_OK && !auth) rc = ruccl_fail(RUCCL_ERR_NO_MEMORY, "authentication frame");
  if (rc == RUCCL_OK) {
    memcpy(auth, mine.share, RUCCL_PAKE_SHARE_BYTES);
    proof(shared, CLIENT_LABEL, type, first, len, auth + RUCCL_PAKE_SHARE_BYTES);
    ruccl_put_le16(auth + RUCCL_PAKE_SHARE_BYTES + PROOF_BYTES, type);
    if (len) memcpy(auth + AUTH_HEAD_BYTES, first, len);
    rc = ruccl_frame_send(fd, RUCCL_FRAME_AUTH, auth, AUTH_HEAD_BYTES + len, deadline_ns);
    if (rc == RUCCL_OK) rc = ruccl_frame_recv(fd, &t, their, sizeof their, &n, deadline_ns);
    if (rc == RUCCL_OK && t == RUCCL_FRAME_AUTH_FAIL)
      rc = ruccl_fail(RUCCL_ERR_AUTH, "the other side refused our proof of the session secret");
    else if (rc == RUCCL_ERR_PEER_LOST) /* gone mid-handshake (a refused proof is answered AUTH_FAIL) */
      rc = ruccl_fail(RUCCL_ERR_PEER_LOST, "the other side closed the connection during the handshake");
    else if (rc == RUCCL_OK && (t != RUCCL_FRAME_AUTH_OK || n != sizeof their))
      rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "expected an authentication reply, got type %u", t);
  }
  if (rc == RUCCL_OK) {
    proof(shared, SERVER_LABEL, type, first, len, expect);
    if (CRYPTO_memcmp(expect, their, PROOF_BYTES) != 0)
      rc = ruccl_fail(RUCCL_ERR_AUTH, "the other side does not know the session secret");
  }
  ruccl_pake_wipe(&mine);
  OPENSSL_cleanse(shared, sizeof shared);
  free(auth);
  return rc;
}

void ruccl_node_lost_encode(uint32_t id, unsigned char out[RUCCL_NODE_LOST_BYTES]) {
  for (int i = 0; i < 4; i++) out[i] = (unsigned char)(id >> (8 * i));
}

uint32_t ruccl_node_lost_decode(const unsigned char in[RUCCL_NODE_LOST_BYTES]) {
  return (uint32_t)in[0] | (uint32_t)in[1] << 8 | (uint32_t)in[2] << 16 | (uint32_t)in[3] << 24;
}
