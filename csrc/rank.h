/* rank.h — the rank core's state: a group (one session of peers under one group
   name) and a communicator (one peer's handle on it). */
#ifndef RUCCL_RANK_H
#define RUCCL_RANK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ruccl.h"
#include "p2p_match.h"
#include "transport.h"
#include "transport_inproc.h"

typedef struct ruccl_group ruccl_group_t;
struct ruccl_meeting; /* recovery.c: the local peers' agreement rounds */

/* Scratch slots: 0 inside an algorithm, 1 and 2 staged input and output, 3 and 4
   the node leader's buffers between the local and the global phase (the agreement's
   descriptors, the fused inputs), 5 the agreement's encoded descriptors.  Pinned
   staging (a device the host cannot reach) has slots of its own, of which
   RUCCL_STAGING_SLOT holds a tensor's raw bytes on their way to or from the device. */
#define RUCCL_SCRATCH_SLOTS 6
#define RUCCL_STAGING_SLOT 0

struct ruccl_group {
  ruccl_config_t config;
  unsigned n; /* participants */

  /* Registration; guarded by the registry lock. */
  struct ruccl_group *next; /* registry list */
  int in_registry;
  int complete;
  ruccl_result_t failed; /* a failed rendezvous poisons the pending group */
  unsigned arrived;        /* registrations seen, the poisoned ones included */
  int64_t tombstone_until; /* a poisoned group answers late arrivals until then */
  unsigned joined;
  struct ruccl_comm **members; /* n slots; sorted by peer id once complete */
  unsigned active;             /* members that have not finished */
  pthread_cond_t registered;   /* waited on with the registry lock */

  atomic_int refs;   /* registry + comms + pending registrants */
  atomic_int reset;  /* ruccl_reset() was called: old handles are stale */
  atomic_int broken; /* a failure in the middle of a collective: the session is unusable */
  char broken_why[256]; /* written once (under break_mu) before broken is set; or why registration failed */
  int break_code;       /* the first break's code, claimed with broken_why (under break_mu; 0: none yet) */
  pthread_mutex_t break_mu;
  ruccl_cancel_t cancel; /* reset, broken and broken_why, as the transports watch them */
  atomic_int *finished; /* by peer index */
  uint32_t *peer_ids_store; /* by peer index, filled when complete */

  ruccl_inproc_t inproc; /* the in-process transport of this group */
  ruccl_mailbox_t *mail; /* point-to-point arrivals, by local index */

  /* The whole session, across nodes (single node: n_total == n, num_nodes == 1). */
  unsigned n_total, num_nodes, node_index;
  uint32_t *all_ids;       /* by global index: every peer id, ascending */
  unsigned *node_members;  /* [node * n + local index] -> global index */
  unsigned *node_of, *local_of; /* by global index */
  struct ruccl_net *_Atomic net; /* NULL on a single node; published once connected (threads of the net read it) */
  struct ruccl_meeting *meeting; /* made with the group; freed with it */
  int net_state;           /* 0 none, 1 being set up by local index 0, 2 ready, <0 failed (-code) */
  char net_why[256];
};

struct ruccl_comm {
  ruccl_group_t *group;
  uint32_t peer_id;
  unsigned index;        /* position among this node's peers (ascending id) */
  unsigned global_index; /* position in peer order across all nodes */
  ruccl_device_t device;
  uint64_t seq; /* collectives started on this handle */
  uint64_t agree_round; /* ruccl_comm_agree and ruccl_comm_shrink calls on this handle */
  int64_t timeout_ms; /* of this handle's calls (ruccl_comm_set_timeout) */
  void *scratch[RUCCL_SCRATCH_SLOTS];
  size_t scratch_cap[RUCCL_SCRATCH_SLOTS];
  /* Device staging (staging.c): a stream on stream_dev, and pinned host buffers. */
  void *stream;
  int has_stream;
  ruccl_device_t stream_dev;
  void *pinned[RUCCL_SCRATCH_SLOTS];
  size_t pinned_cap[RUCCL_SCRATCH_SLOTS];
  ruccl_device_t pinned_dev[RUCCL_SCRATCH_SLOTS];
  /* Device paths (device_collective.c). */
  void *nccl_comm; /* this peer's NCCL communicator, once the NCCL path was taken */
  ruccl_device_t nccl_dev; /* the GPU it was made for */
  int last_path;   /* the data path of the last collective, to log a change once */
  char algorithm[64]; /* how the last collective ran (ruccl_comm_algorithm): set on this handle's thread */
};

/* The handle's timeout in ms (set from any thread by ruccl_comm_set_timeout). */
static inline int64_t ruccl_comm_timeout(const ruccl_comm_t *c) { return __atomic_load_n(&c->timeout_ms, __ATOMIC_RELAXED); }

/* registry.c, for a shrink (recovery.c): a group of cfg->num_devices local peers made
   complete from comms already sorted by id (each comm takes a reference; the
   registry holds the group until its last peer finishes), numbered as a single node
   when single is set (else the caller numbers it); NULL when out of memory. */
ruccl_group_t *ruccl_group_assemble(const ruccl_config_t *cfg, ruccl_comm_t **comms, int single);
/* Puts an assembled (and numbered) group in the registry, where ruccl_reset finds it. */
void ruccl_group_publish(ruccl_group_t *g);
/* Drops a group that was assembled but not published, and frees its comms. */
void ruccl_group_discard(ruccl_group_t *g);
ruccl_comm_t *ruccl_comm_new(uint32_t peer_id, ruccl_device_t device, int64_t timeout_ms);

/* recovery.c: the meeting of a new group (NULL: out of memory), and its end. */
struct ruccl_meeting *ruccl_meeting_new(void);
void ruccl_meeting_free(struct ruccl_meeting *m);
/* A local peer finished: whoever waits in a meeting counts again. */
void ruccl_meeting_wake(struct ruccl_meeting *m);

/* A reference that keeps g's memory (not its session) alive: a request's. */
void ruccl_group_ref(ruccl_group_t *g);
void ruccl_group_unref(ruccl_group_t *g);

/* The error a wait of this group must return now, or RUCCL_OK. */
static inline ruccl_result_t ruccl_group_status(const ruccl_group_t *g) { return ruccl_cancel_state(&g->cancel); }
void ruccl_group_break(ruccl_group_t *g, ruccl_result_t code);

/* A buffer of at least `bytes` owned by the comm, kept between calls. */
void *ruccl_comm_scratch(ruccl_comm_t *c, int slot, size_t bytes);

/* staging.c: host memory for a tensor on dev (pinned when the host cannot reach
   dev's memory, else the scratch slot), and copies between it and the device on
   the comm's stream, waited for within the session's timeout. */
void *ruccl_comm_staging(ruccl_comm_t *c, int slot, size_t bytes, ruccl_device_t dev);
ruccl_result_t ruccl_comm_copy(ruccl_comm_t *c, ruccl_device_t dev, void *dst, const void *src, size_t bytes,
                               int kind /* ruccl_copy_kind_t */);
/* The comm's stream on dev (created on first use). */
ruccl_result_t ruccl_comm_stream(ruccl_comm_t *c, ruccl_device_t dev, void **stream);
void ruccl_comm_release_device(ruccl_comm_t *c);

#endif
