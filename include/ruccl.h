/*
 * ruccl.h — the one public header of ruCCL, a collective-communication library.
 *
 * Peers register with a configuration, then call matching collectives in the same
 * order (all-reduce, broadcast, reduce, all-gather, reduce-scatter, barrier), and
 * finish.  Every broken contract is returned as a ruccl_result_t on every
 * participant; nothing here prints or aborts on a caller's mistake.
 *
 * The contract (names and semantics) is docs/reference.md §1–§3.
 */
#ifndef RUCCL_H
#define RUCCL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RUCCL_VERSION_MAJOR 0
#define RUCCL_VERSION_MINOR 1
#define RUCCL_VERSION_PATCH 0

#define RUCCL_MAX_DIMS 8
#define RUCCL_MAX_GROUP_NAME 64   /* bytes, including the terminating NUL */
#define RUCCL_MAX_ADDRESS 256     /* bytes, including the terminating NUL */
#define RUCCL_MAX_SECRET 256      /* bytes */

typedef enum {
  RUCCL_OK = 0,
  RUCCL_ERR_INVALID_ARGUMENT,
  RUCCL_ERR_INVALID_CONFIG,
  RUCCL_ERR_DUPLICATE_REGISTRATION,
  RUCCL_ERR_NOT_REGISTERED,
  RUCCL_ERR_CONFIG_MISMATCH,
  RUCCL_ERR_SHAPE_MISMATCH,
  RUCCL_ERR_DTYPE_MISMATCH,
  RUCCL_ERR_OP_MISMATCH,
  RUCCL_ERR_ROOT_MISMATCH,
  RUCCL_ERR_BROADCAST_SENDERS,
  RUCCL_ERR_PEER_LOST,
  RUCCL_ERR_PEER_FINISHED,
  RUCCL_ERR_TIMEOUT,
  RUCCL_ERR_RESET,
  RUCCL_ERR_AUTH,
  RUCCL_ERR_PROTOCOL,
  RUCCL_ERR_IO,
  RUCCL_ERR_DEVICE,
  RUCCL_ERR_NO_MEMORY,
  RUCCL_ERR_UNSUPPORTED,
  RUCCL_ERR_ABORTED, /* ruccl_comm_abort() was called on this session */
  RUCCL_ERR_REVOKED, /* ruccl_comm_revoke() was called on this communicator */
  RUCCL_NUM_RESULTS /* not a result: the number of codes above */
} ruccl_result_t;

typedef enum { RUCCL_DEVICE_CPU = 0, RUCCL_DEVICE_CUDA = 1 } ruccl_device_kind_t;
typedef struct {
  ruccl_device_kind_t kind;
  int index;
} ruccl_device_t;

typedef enum {
  RUCCL_FLOAT32,
  RUCCL_FLOAT64,
  RUCCL_FLOAT16,
  RUCCL_BFLOAT16,
  RUCCL_INT8,
  RUCCL_UINT8,
  RUCCL_INT32,
  RUCCL_INT64
} ruccl_dtype_t;
#define RUCCL_NUM_DTYPES 8

/* A contiguous, row-major buffer.  ndim 0 is a scalar (one element); a shape entry
   of 0 makes an empty tensor, whose data may be NULL. */
typedef struct {
  void *data;
  ruccl_dtype_t dtype;
  int ndim;
  int64_t shape[RUCCL_MAX_DIMS];
  ruccl_device_t device;
} ruccl_tensor_t;

/* MEAN divides by the number of participants across all nodes.  Half-precision
   types (FLOAT16, BFLOAT16) accumulate in FLOAT32 and are rounded once; integer
   MEAN truncates toward zero, as integer division does. */
typedef enum { RUCCL_SUM, RUCCL_MEAN, RUCCL_MIN, RUCCL_MAX, RUCCL_PROD } ruccl_reduce_op_t;
#define RUCCL_NUM_REDUCE_OPS 5

typedef enum {
  RUCCL_STRATEGY_AUTO,
  RUCCL_STRATEGY_CENTRALIZED,
  RUCCL_STRATEGY_TREE,
  RUCCL_STRATEGY_RING
} ruccl_strategy_kind_t;
typedef struct {
  ruccl_strategy_kind_t kind;
  unsigned arity; /* tree only: children per node, >= 1 */
} ruccl_strategy_t;

/* A key-value store a multi-node session can rendezvous through instead of the
   orchestrator: every node publishes its address under a key and reads the others'.
   The PyTorch backend hands torch's own c10d::Store here, so that no extra server
   is needed.  Each call returns RUCCL_OK or an error (TIMEOUT when get's key did not
   appear in time); the store must outlive the session's registration. */
typedef struct {
  ruccl_result_t (*set)(void *ctx, const char *key, const void *value, size_t len);
  /* Waits until key exists (at most timeout_ms), copies at most cap bytes of its
     value and sets *len to the value's whole length. */
  ruccl_result_t (*get)(void *ctx, const char *key, void *value, size_t cap, size_t *len, int64_t timeout_ms);
  /* Atomically adds delta to the integer under key (absent = 0); *result = the sum. */
  ruccl_result_t (*add)(void *ctx, const char *key, int64_t delta, int64_t *result);
  void *ctx;
} ruccl_store_t;

/* Bits of ruccl_config_t.multi_node_set: which of the four multi-node settings
   were given.  They are valid only all together or not at all. */
#define RUCCL_CONFIG_NUM_NODES (1u << 0)
#define RUCCL_CONFIG_GLOBAL_ADDRESS (1u << 1)
#define RUCCL_CONFIG_NODE_ADDRESS (1u << 2)
#define RUCCL_CONFIG_DATA_SERVICE_PORT (1u << 3)
#define RUCCL_CONFIG_MULTI_NODE_ALL 0xfu

/* A plain value: copy it freely.  Build it with ruccl_config_default() and the
   setters, which validate what they are given. */
typedef struct ruccl_config {
  unsigned num_devices;             /* local peers (threads) in this process */
  ruccl_strategy_t local_strategy;  /* among the local peers */
  ruccl_strategy_t global_strategy; /* among the nodes */
  unsigned num_nodes;
  char global_address[RUCCL_MAX_ADDRESS]; /* orchestrator, "host:port" */
  char node_address[RUCCL_MAX_ADDRESS];   /* this node, as its peers reach it */
  unsigned data_service_port;             /* 0 = any free port */
  unsigned multi_node_set;                /* RUCCL_CONFIG_* bits */
  int64_t timeout_ms;                     /* every blocking wait; > 0 */
  unsigned char secret[RUCCL_MAX_SECRET];
  size_t secret_len;
  char group_name[RUCCL_MAX_GROUP_NAME];
  ruccl_store_t store; /* set: the rendezvous goes through it, not global_address */
  int64_t liveness_timeout_ms; /* multi-node: a silent node is lost after this; 0 off, < 0 unset */
} ruccl_config_t;

typedef struct ruccl_comm ruccl_comm_t; /* opaque: the explicitly owned rank communicator */

#define RUCCL_DEFAULT_TIMEOUT_MS 300000
/* A node of a multi-node session that sends nothing for this long (not even the
   heartbeats its own thread sends every quarter of it) is lost: every survivor's
   calls fail with RUCCL_ERR_PEER_LOST.  ruccl_config_set_liveness_timeout_ms sets
   it; unset, RUCCL_LIVENESS_TIMEOUT_MS does, else this default.  0 turns the watch
   off. */
#define RUCCL_DEFAULT_LIVENESS_TIMEOUT_MS 30000
#define RUCCL_DEFAULT_GROUP_NAME "default"

ruccl_config_t ruccl_config_default(void);
ruccl_result_t ruccl_config_set_num_devices(ruccl_config_t *, unsigned n);
ruccl_result_t ruccl_config_set_local_strategy(ruccl_config_t *, ruccl_strategy_t);  /* within a process */
ruccl_result_t ruccl_config_set_global_strategy(ruccl_config_t *, ruccl_strategy_t); /* across nodes */
ruccl_result_t ruccl_config_set_num_nodes(ruccl_config_t *, unsigned n);
ruccl_result_t ruccl_config_set_global_address(ruccl_config_t *, const char *host_port); /* orchestrator */
ruccl_result_t ruccl_config_set_node_address(ruccl_config_t *, const char *host); /* this node, as peers reach it */
ruccl_result_t ruccl_config_set_data_service_port(ruccl_config_t *, unsigned port); /* 0 = any free port */
ruccl_result_t ruccl_config_set_timeout_ms(ruccl_config_t *, int64_t ms);
ruccl_result_t ruccl_config_set_liveness_timeout_ms(ruccl_config_t *, int64_t ms); /* >= 0; 0: no watch */
/* Authenticates every connection.  A multi-node configuration needs a secret: without
   one, registration takes RUCCL_SECRET (its bytes) or else the contents of the file
   RUCCL_SECRET_FILE names, and fails with RUCCL_ERR_INVALID_CONFIG when neither is set. */
ruccl_result_t ruccl_config_set_secret(ruccl_config_t *, const void *key, size_t len);
ruccl_result_t ruccl_config_set_group_name(ruccl_config_t *, const char *name); /* independent groups in one process */
/* Rendezvous through a key-value store instead of an orchestrator: stands in for
   the global address among the four multi-node settings. */
ruccl_result_t ruccl_config_set_store(ruccl_config_t *, const ruccl_store_t *store);

/* Blocks until every participant has registered, or fails. */
ruccl_result_t ruccl_register(uint32_t peer_id, ruccl_device_t device, const ruccl_config_t *config,
                              ruccl_comm_t **comm);
ruccl_result_t ruccl_all_reduce(ruccl_comm_t *, const ruccl_tensor_t *in, ruccl_tensor_t *out, ruccl_reduce_op_t);
ruccl_result_t ruccl_broadcast(ruccl_comm_t *, const ruccl_tensor_t *send /* NULL on receivers */,
                               ruccl_tensor_t *out);
/* Broadcast with the root named by every peer (as torch.distributed and NCCL name
   it): root_peer sends `tensor`, everyone else receives into it.  Peers that name
   different roots get RUCCL_ERR_ROOT_MISMATCH, and nothing is written. */
ruccl_result_t ruccl_broadcast_from(ruccl_comm_t *, ruccl_tensor_t *tensor, uint32_t root_peer);
ruccl_result_t ruccl_reduce(ruccl_comm_t *, const ruccl_tensor_t *in,
                            ruccl_tensor_t *out /* root only; NULL elsewhere */, ruccl_reduce_op_t,
                            uint32_t root_peer);
ruccl_result_t ruccl_all_gather(ruccl_comm_t *, const ruccl_tensor_t *in,
                                ruccl_tensor_t *out /* n x in, peer order */);
ruccl_result_t ruccl_reduce_scatter(ruccl_comm_t *, const ruccl_tensor_t *in /* n x out */, ruccl_tensor_t *out,
                                    ruccl_reduce_op_t);
ruccl_result_t ruccl_barrier(ruccl_comm_t *);

/* Point-to-point, on a channel of its own: sends and receives never meet the
   collectives' messages, and may be issued in any order relative to them (a
   receive posted before an all-reduce that its sender issues after it is fine).
 *
 * A message carries its sender and a tag.  A receive takes the first message, in
 * arrival order, from its source (or from any source, RUCCL_ANY_PEER) with its tag;
 * between one sender and one receiver, messages of one tag are received in the
 * order they were sent.  A receive must be as large as the message it takes (dtype
 * and shape are the caller's business, as in NCCL): a message of another size
 * fails that receive with RUCCL_ERR_PROTOCOL and is consumed; the session goes on.
 * A receive that nothing matches within the timeout fails with RUCCL_ERR_TIMEOUT
 * (never with another tag's data), and one pending when the session fails (a lost
 * peer, ruccl_comm_abort, ruccl_reset) with that error.
 *
 * Sends are eager: a send hands its whole message over (into the matching receive,
 * or a buffer of the receiving side when none is posted yet) and is complete when
 * ruccl_isend returns, so peers that send to each other before receiving do not
 * deadlock, whatever the sizes.  A receive completes in the background; its buffer
 * must stay valid until ruccl_wait or ruccl_test reports it done, or until
 * ruccl_request_free withdraws it.
 *
 * These calls may be made from any thread, concurrently with the communicator's
 * collectives on its own thread.  Every peer exchanges point-to-point with every
 * other, on its node or another. */
#define RUCCL_ANY_PEER UINT32_MAX
typedef struct ruccl_request ruccl_request_t; /* one send or receive in progress */
ruccl_result_t ruccl_isend(ruccl_comm_t *, const ruccl_tensor_t *tensor, uint32_t dst_peer, int32_t tag,
                           ruccl_request_t **req);
ruccl_result_t ruccl_irecv(ruccl_comm_t *, ruccl_tensor_t *tensor, uint32_t src_peer /* or RUCCL_ANY_PEER */,
                           int32_t tag, ruccl_request_t **req);
/* *done = 1 once the request is complete; its result is then the return value
   (RUCCL_OK while it is pending).  A receive's data is in its tensor then. */
ruccl_result_t ruccl_test(ruccl_request_t *, int *done);
/* Blocks until the request completes (a receive's own deadline is the session's
   timeout from its post, or the communicator's, see ruccl_comm_set_timeout);
   returns its result.  The request stays allocated. */
ruccl_result_t ruccl_wait(ruccl_request_t *);
/* Waits up to timeout_ms (< 0: without limit) for any of reqs[0..n) (all of one
   communicator; NULL entries skipped) to complete: RUCCL_OK with *index set (its
   result comes from ruccl_test or ruccl_wait), or RUCCL_ERR_TIMEOUT when none did,
   which changes nothing. */
ruccl_result_t ruccl_wait_any(ruccl_request_t *const *reqs, size_t n, int64_t timeout_ms, size_t *index);
/* A completed receive's sender (the peer id: what a receive from any peer needs). */
ruccl_result_t ruccl_request_source(const ruccl_request_t *, uint32_t *peer);
/* Frees a request; a receive still pending is withdrawn first (its buffer is not
   written after this returns, and the message it would have taken stays for the
   next receive).  NULL is ignored. */
void ruccl_request_free(ruccl_request_t *);

/* Blocking forms, tag 0. */
ruccl_result_t ruccl_send(ruccl_comm_t *, const ruccl_tensor_t *tensor, uint32_t dst_peer);
ruccl_result_t ruccl_recv(ruccl_comm_t *, ruccl_tensor_t *tensor, uint32_t src_peer);

/* Several sends and receives at once (torch's batch_isend_irecv, all-to-all): every
   one is posted, then every one waited for; the first failure is returned, after
   all of them have completed or been withdrawn. */
typedef enum { RUCCL_P2P_SEND, RUCCL_P2P_RECV } ruccl_p2p_kind_t;
typedef struct {
  ruccl_p2p_kind_t kind;
  ruccl_tensor_t *tensor; /* read by a send, written by a receive */
  uint32_t peer;          /* the other side's peer id (a receive: or RUCCL_ANY_PEER) */
  int32_t tag;
} ruccl_p2p_op_t;
ruccl_result_t ruccl_p2p_group(ruccl_comm_t *, const ruccl_p2p_op_t *ops, size_t n);

/* Makes every call of this communicator's session that is blocked, or made later,
   return promptly (well within a second) with RUCCL_ERR_ABORTED, on this node and,
   through the session's connections, on the others; other sessions are left alone.
   Safe from any thread, while the owner is blocked; the handle must still be freed
   with ruccl_finish, which then returns at once. */
ruccl_result_t ruccl_comm_abort(ruccl_comm_t *);
/* Fault tolerance (docs/reference.md §9): revoke, agree, shrink.
 *
 * Makes every call of this communicator, on every peer, that is blocked or made
 * later return promptly with RUCCL_ERR_REVOKED (or PEER_LOST, where a lost node
 * broke it first), apart from ruccl_comm_agree, ruccl_comm_shrink and
 * ruccl_finish.  Any peer may call it, at any time, from any thread; other
 * communicators, of this process or another, are untouched. */
ruccl_result_t ruccl_comm_revoke(ruccl_comm_t *);
/* A fault-tolerant agreement among the live peers, revoked communicator or not:
 * every peer that is not lost calls it (in the same order as its other agreements)
 * and every one returns the same values, even when a peer dies during it: *flags
 * becomes the bitwise AND of every live peer's *flags, and failed[0..*num_failed)
 * the ids of the peers found lost (their node died or froze past the liveness
 * timeout, or the peer finished its session), ascending.  At most failed_cap ids are
 * written (failed may be NULL when failed_cap is 0); *num_failed is the whole count.
 * A node whose peers the others found lost gets RUCCL_ERR_PEER_LOST. */
ruccl_result_t ruccl_comm_agree(ruccl_comm_t *, uint32_t *flags, uint32_t *failed, size_t failed_cap,
                                size_t *num_failed);
/* The survivors make a new communicator without the lost peers and without
 * exclude[0..num_exclude) (peer ids; NULL and 0: only the lost ones).  Every peer that
 * stays calls it with the same exclude list; the excluded ones do not.  Peer ids
 * stay; ranks (ruccl_comm_index) are renumbered densely in the old order.  No
 * orchestrator or store is needed: the survivors reach each other through the data
 * ports they already know.  The old communicator stays as it was (revoked, if it
 * was) until it is finished.  A shrink that would leave the nodes with unequal
 * numbers of peers is RUCCL_ERR_UNSUPPORTED on every survivor. */
ruccl_result_t ruccl_comm_shrink(ruccl_comm_t *, const uint32_t *exclude, size_t num_exclude, ruccl_comm_t **out);
/* The timeout of this communicator's later calls (collectives and receives
   posted after it), in place of the configuration's; > 0. */
ruccl_result_t ruccl_comm_set_timeout(ruccl_comm_t *, int64_t timeout_ms);

/* Ends this peer's session and frees the handle.  Whatever this peer sent still
   reaches peers that lag behind: when the node's last peer finishes, the node keeps
   its links until every other node has taken what it sent (or closed, or the
   timeout passed), and the others see PEER_FINISHED only in a collective this peer
   never joined. */
ruccl_result_t ruccl_finish(ruccl_comm_t *);
void ruccl_reset(void);                      /* resets the local collective service */
const char *ruccl_error_string(ruccl_result_t);
const char *ruccl_last_error(void); /* thread-local detail of the last failure */

/* Introspection that callers (the torch shim, tests) need; not in the seed. */
ruccl_result_t ruccl_comm_size(const ruccl_comm_t *, unsigned *size);  /* participants, all nodes */
ruccl_result_t ruccl_comm_index(const ruccl_comm_t *, unsigned *index); /* position in peer order */
/* The peer id at position `index` of peer order (0 .. size-1): after a shrink, ids
   keep their values while positions close up. */
ruccl_result_t ruccl_comm_peer(const ruccl_comm_t *, unsigned index, uint32_t *peer_id);
/* How this handle's last collective ran: "agreement" (a barrier, or a call refused by
   it), "fused into the agreement", "same-device", "nccl", or the host algorithm
   ("ring", "tree", "centralized"; across nodes "ring across 4 nodes", "tree within
   the node, ring across 2 nodes"); "" before the first, and after a call that failed
   before its agreement (a session already broken).  The string is the handle's,
   valid until its next collective; read it on the thread that made the call. */
ruccl_result_t ruccl_comm_algorithm(const ruccl_comm_t *, const char **name);
size_t ruccl_dtype_size(ruccl_dtype_t);                                 /* 0 for an unknown dtype */

/* The secret of the environment: RUCCL_SECRET (its bytes, without the terminator),
   else every byte of the file RUCCL_SECRET_FILE names; RUCCL_ERR_INVALID_CONFIG when
   neither is set, the file cannot be read, or the secret is empty or longer than
   RUCCL_MAX_SECRET.  ruccl_secret_from_file reads one file the same way. */
ruccl_result_t ruccl_secret_from_env(unsigned char out[RUCCL_MAX_SECRET], size_t *len);
ruccl_result_t ruccl_secret_from_file(const char *path, unsigned char out[RUCCL_MAX_SECRET], size_t *len);

/* RUCCL_ORCHESTRATOR: the rendezvous server for multi-node sessions
   (also the program `ruccl-orchestrator --listen HOST:PORT`, secret from --secret-file,
   RUCCL_SECRET or RUCCL_SECRET_FILE).  It needs a secret: an empty one is taken from
   the environment (ruccl_secret_from_env), and none there is RUCCL_ERR_INVALID_CONFIG. */
typedef struct ruccl_orchestrator ruccl_orchestrator_t;
ruccl_result_t ruccl_orchestrator_start(const char *listen_host_port /* "127.0.0.1:0" = any port */,
                                        const void *secret, size_t secret_len, ruccl_orchestrator_t **out);
int ruccl_orchestrator_port(const ruccl_orchestrator_t *); /* the port actually bound */
ruccl_result_t ruccl_orchestrator_stop(ruccl_orchestrator_t *);

#ifdef __cplusplus
}
#endif

#endif /* RUCCL_H */
