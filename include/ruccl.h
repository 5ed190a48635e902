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
} ruccl_config_t;

typedef struct ruccl_comm ruccl_comm_t; /* opaque: the explicitly owned rank communicator */

#define RUCCL_DEFAULT_TIMEOUT_MS 300000
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
ruccl_result_t ruccl_config_set_secret(ruccl_config_t *, const void *key, size_t len); /* authenticates every connection */
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

/* Point-to-point.  A send and the matching receive name each other's peer id and
   move the same number of bytes (dtype and shape are the caller's business, as in
   NCCL).  Between one pair of peers, point-to-point messages travel in one ordered
   stream with the collectives' messages: both sides must issue their sends and
   receives in the same order relative to their collectives, and a receive that
   meets a collective's message (or a send of another size) is RUCCL_ERR_PROTOCOL,
   never taken as data.  A failure in the middle of a
   transfer (a size that does not match, a timeout, a lost peer) breaks the session
   as a failed collective does.  Between nodes, only peers of local index 0 (the node
   leaders, which is every peer when each process has one device) exchange directly;
   others get RUCCL_ERR_UNSUPPORTED. */
typedef enum { RUCCL_P2P_SEND, RUCCL_P2P_RECV } ruccl_p2p_kind_t;
typedef struct {
  ruccl_p2p_kind_t kind;
  ruccl_tensor_t *tensor; /* read by a send, written by a receive */
  uint32_t peer;          /* the other side's peer id */
} ruccl_p2p_op_t;
ruccl_result_t ruccl_send(ruccl_comm_t *, const ruccl_tensor_t *tensor, uint32_t dst_peer);
ruccl_result_t ruccl_recv(ruccl_comm_t *, ruccl_tensor_t *tensor, uint32_t src_peer);
/* Several sends and receives at once, to and from any peers (torch's
   batch_isend_irecv, all-to-all).  They run peer by peer in ascending peer id, with
   one peer's sends and receives paired into steps that send and receive together:
   when the other peers' groups hold the matching operations, nothing deadlocks,
   whatever the sizes. */
ruccl_result_t ruccl_p2p_group(ruccl_comm_t *, const ruccl_p2p_op_t *ops, size_t n);

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
size_t ruccl_dtype_size(ruccl_dtype_t);                                 /* 0 for an unknown dtype */

/* RUCCL_ORCHESTRATOR: the rendezvous server for multi-node sessions
   (also the program `ruccl-orchestrator --listen HOST:PORT`, secret from RUCCL_SECRET or --secret-file) */
typedef struct ruccl_orchestrator ruccl_orchestrator_t;
ruccl_result_t ruccl_orchestrator_start(const char *listen_host_port /* "127.0.0.1:0" = any port */,
                                        const void *secret, size_t secret_len, ruccl_orchestrator_t **out);
int ruccl_orchestrator_port(const ruccl_orchestrator_t *); /* the port actually bound */
ruccl_result_t ruccl_orchestrator_stop(ruccl_orchestrator_t *);

#ifdef __cplusplus
}
#endif

#endif /* RUCCL_H */
