/* wire.h — what crosses a socket: TCP helpers with deadlines, length-bounded
   frames, and the authenticated key exchange every connection starts with. */
#ifndef RUCCL_WIRE_H
#define RUCCL_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "pake.h"
#include "ruccl.h"

#define RUCCL_WIRE_MAGIC 0x52554343u /* "RUCC" */
#define RUCCL_WIRE_MAX_CONTROL (64 * 1024) /* the largest control frame anyone accepts */

typedef enum {
  RUCCL_FRAME_HELLO = 1,    /* server -> client: version, key-exchange share */
  RUCCL_FRAME_AUTH = 2,     /* client -> server: share, proof, the first frame's type and payload */
  RUCCL_FRAME_AUTH_OK = 3,  /* server -> client: proof */
  RUCCL_FRAME_AUTH_FAIL = 4,
  RUCCL_FRAME_JOIN = 10,    /* node -> orchestrator (inside the AUTH frame) */
  RUCCL_FRAME_TABLE = 11,   /* orchestrator -> node: every node's data address */
  RUCCL_FRAME_ERROR = 12,   /* orchestrator -> node: code, message */
  RUCCL_FRAME_LEAVE = 13,   /* node -> orchestrator: the session is over here */
  RUCCL_FRAME_NODE_LOST = 14, /* orchestrator -> node: a node of the session went without LEAVE
                                 (payload: its smallest peer id, u32 little-endian) */
} ruccl_frame_type_t;

/* A frame's header: magic u32, type u16, flags u16 (0), payload length u32, all
   little-endian. */
#define RUCCL_FRAME_HEADER_BYTES 12
void ruccl_frame_header_encode(uint16_t type, uint32_t length, unsigned char out[RUCCL_FRAME_HEADER_BYTES]);
/* RUCCL_ERR_PROTOCOL when the magic is not ours or a flag is set. */
ruccl_result_t ruccl_frame_header_decode(const unsigned char in[RUCCL_FRAME_HEADER_BYTES], uint16_t *type,
                                         uint32_t *length);

/* "host:port" -> host and port; RUCCL_ERR_INVALID_ARGUMENT when malformed. */
ruccl_result_t ruccl_split_host_port(const char *host_port, char *host, size_t host_cap, int *port);

/* Binds and listens; port 0 takes any free port.  RUCCL_ERR_IO (with the reason)
   when the address is in use or cannot be bound. */
ruccl_result_t ruccl_tcp_listen(const char *host, int port, int *fd, int *bound_port);
/* Connects, retrying refused connections until the deadline (RUCCL_ERR_TIMEOUT).  The
   _ex form with retry_refused 0: a refusal is RUCCL_ERR_PEER_LOST at once (a port that
   listened before and refuses now: its process is gone). */
ruccl_result_t ruccl_tcp_connect(const char *host, int port, int64_t deadline_ns, int *fd);
ruccl_result_t ruccl_tcp_connect_ex(const char *host, int port, int64_t deadline_ns, int retry_refused, int *fd);
/* For server threads: waits for a connection on listen_fd or a byte on wake_fd.
   Returns the accepted socket, or -1 once wake_fd is readable (time to stop). */
int ruccl_accept_until_woken(int listen_fd, int wake_fd);
/* Accepts one connection, or RUCCL_ERR_TIMEOUT at the deadline. */
ruccl_result_t ruccl_tcp_accept(int listen_fd, int64_t deadline_ns, int *fd);

/* Whole-buffer I/O; RUCCL_ERR_PEER_LOST when the other side closes or resets,
   RUCCL_ERR_TIMEOUT at the deadline. */
ruccl_result_t ruccl_write_all(int fd, const void *buf, size_t len, int64_t deadline_ns);
ruccl_result_t ruccl_read_all(int fd, void *buf, size_t len, int64_t deadline_ns);

/* A NODE_LOST frame's payload: the lost node's smallest peer id, little-endian. */
#define RUCCL_NODE_LOST_BYTES 4
void ruccl_node_lost_encode(uint32_t id, unsigned char out[RUCCL_NODE_LOST_BYTES]);
uint32_t ruccl_node_lost_decode(const unsigned char in[RUCCL_NODE_LOST_BYTES]);

ruccl_result_t ruccl_frame_send(int fd, uint16_t type, const void *payload, uint32_t len, int64_t deadline_ns);
/* Reads one frame whose payload fits in cap (else RUCCL_ERR_PROTOCOL, nothing
   allocated); bad magic is RUCCL_ERR_PROTOCOL too. */
ruccl_result_t ruccl_frame_recv(int fd, uint16_t *type, void *payload, uint32_t cap, uint32_t *len,
                                int64_t deadline_ns);

/* The handshake every connection starts with (docs/handshake.md): a SPAKE2 key
   exchange (pake.h) keyed by the session key, then proofs of the shared secret it
   gives that carry the connection's first frame (type, payload: a JOIN, a node's
   hello with its group, session and node index), so that what a side says about
   itself is authenticated with it.  Neither side's messages let a party that does
   not know the key test guesses of the secret offline; the client proves first and
   the server answers only a valid proof.  The key is stretched from the secret once
   (ruccl_auth_key: PBKDF2-HMAC-SHA256, RUCCL_AUTH_ROUNDS rounds).  RUCCL_ERR_AUTH on
   a wrong proof; the server returns the first frame (at most cap bytes, else
   RUCCL_ERR_PROTOCOL) only once the client has proven itself. */
#define RUCCL_AUTH_VERSION 3
#define RUCCL_AUTH_KEY_BYTES RUCCL_PAKE_KEY_BYTES
#define RUCCL_AUTH_ROUNDS 10000
ruccl_result_t ruccl_auth_key(const void *secret, size_t secret_len, unsigned char key[RUCCL_AUTH_KEY_BYTES]);
ruccl_result_t ruccl_auth_server(int fd, const unsigned char key[RUCCL_AUTH_KEY_BYTES], uint16_t *type, void *first,
                                 uint32_t cap, uint32_t *len, int64_t deadline_ns);
ruccl_result_t ruccl_auth_client(int fd, const unsigned char key[RUCCL_AUTH_KEY_BYTES], uint16_t type,
                                 const void *first, uint32_t len, int64_t deadline_ns);

/* The server's side in steps, for an event loop (the orchestrator's): a HELLO payload
   (version u32 little-endian, the server's share), then the check of the AUTH payload
   that answers it (the client's share, its proof, the first frame's type u16
   little-endian, the first frame): RUCCL_OK with the first frame (a pointer into
   auth) and the proof to send back in AUTH_OK; RUCCL_ERR_AUTH (answer AUTH_FAIL);
   RUCCL_ERR_PROTOCOL (too short, or not a share).  The check wipes the state: one
   HELLO answers one AUTH. */
#define RUCCL_AUTH_HELLO_BYTES (4 + RUCCL_PAKE_SHARE_BYTES)
#define RUCCL_AUTH_PROOF_BYTES 32
#define RUCCL_AUTH_HEAD_BYTES (RUCCL_PAKE_SHARE_BYTES + RUCCL_AUTH_PROOF_BYTES + 2) /* before the first frame */
typedef struct {
  ruccl_pake_t pake;
  unsigned char hello[RUCCL_AUTH_HELLO_BYTES];
} ruccl_auth_server_t;
ruccl_result_t ruccl_auth_hello(const unsigned char key[RUCCL_AUTH_KEY_BYTES], ruccl_auth_server_t *s);
ruccl_result_t ruccl_auth_check(const unsigned char key[RUCCL_AUTH_KEY_BYTES], ruccl_auth_server_t *s,
                                const unsigned char *auth, uint32_t n, uint16_t *type, const unsigned char **first,
                                uint32_t *len, unsigned char proof_out[RUCCL_AUTH_PROOF_BYTES]);

#endif
