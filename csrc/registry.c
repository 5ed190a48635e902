/* registry.c — the local collective service: groups by name, registration and
 * rendezvous, finish, and reset.
 *
 * A group collects num_devices registrations (each a thread with its own peer id);
 * when the last one arrives the peers are sorted by id (peer order) and every
 * waiting registrant returns its handle.  A mismatching configuration poisons the
 * pending group, so that every waiting peer fails with CONFIG_MISMATCH.  Groups are
 * reference counted: a handle keeps its group alive after ruccl_reset() so that
 * stale handles can still answer NOT_REGISTERED. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "error.h"
#include "rank.h"
#include "net/session.h"
#include "device/device.h"
#include "device/path.h"
#include "testing.h"

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static ruccl_group_t *registry_head;

/* ---- group lifetime ---------------------------------------------------------------- */

static ruccl_group_t *group_new(const ruccl_config_t *cfg) {
  ruccl_group_t *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->config = *cfg;
  g->n = cfg->num_devices;
  g->members = calloc(g->n, sizeof *g->members);
  g->finished = calloc(g->n, sizeof *g->finished);
  uint32_t *ids = calloc(g->n, sizeof *ids);
  g->mail = calloc(g->n, sizeof *g->mail);
  unsigned mailboxes = 0;
  while (g->mail && mailboxes < g->n && ruccl_mailbox_init(&g->mail[mailboxes]) == 0) mailboxes++;
  g->meeting = ruccl_meeting_new();
  if (!g->members || !g->finished || !ids || mailboxes < g->n || !g->meeting ||
      ruccl_inproc_init(&g->inproc, g->n) != 0) {
    ruccl_meeting_free(g->meeting);
    for (unsigned i = 0; i < mailboxes; i++) ruccl_mailbox_destroy(&g->mail[i]);
    free(g->mail);
    free(g->members);
    free(g->finished);
    free(ids);
    free(g);
    return NULL;
  }
  g->peer_ids_store = ids;
  for (unsigned i = 0; i < g->n; i++) atomic_init(&g->finished[i], 0);
  atomic_init(&g->refs, 1); /* the registry's */
  atomic_init(&g->reset, 0);
  atomic_init(&g->broken, 0);
  pthread_mutex_init(&g->break_mu, NULL);
  g->cancel = (ruccl_cancel_t){.reset = &g->reset, .broken = &g->broken, .broken_why = g->broken_why};
  ruccl_cond_init_monotonic(&g->registered);
  return g;
}

static void group_unref(ruccl_group_t *g) {
  if (atomic_fetch_sub(&g->refs, 1) != 1) return;
  ruccl_session_close(g, 0);
  for (unsigned i = 0; i < g->n; i++) ruccl_mailbox_destroy(&g->mail[i]);
  free(g->mail);
  free(g->all_ids);
  free(g->node_members);
  free(g->node_of);
  free(g->local_of);
  ruccl_inproc_destroy(&g->inproc);
  ruccl_meeting_free(g->meeting);
  pthread_cond_destroy(&g->registered);
  free(g->members);
  free((void *)g->finished);
  free(g->peer_ids_store);
  free(g);
}

void ruccl_group_ref(ruccl_group_t *g) { atomic_fetch_add(&g->refs, 1); }
void ruccl_group_unref(ruccl_group_t *g) { group_unref(g); }

/* Registry lock held. */
static void registry_remove(ruccl_group_t *g) {
  if (!g->in_registry) return;
  for (ruccl_group_t **p = &registry_head; *p; p = &(*p)->next) {
    if (*p == g) {
      *p = g->next;
      break;
    }
  }
  g->in_registry = 0;
  g->next = NULL;
  group_unref(g);
}

void ruccl_group_break(ruccl_group_t *g, ruccl_result_t code) {
  if (code == RUCCL_ERR_RESET) { /* reset already marks the group: only wake the waiters */
    ruccl_inproc_wake(&g->inproc);
    for (unsigned i = 0; i < g->n; i++) ruccl_mailbox_wake(&g->mail[i]);
    return;
  }
  /* The first break names the cause and the code (telling the other nodes takes up
     to a second, during which their own notices may come back here). */
  pthread_mutex_lock(&g->break_mu);
  if (!g->break_code) {
    g->break_code = (int)code;
    snprintf(g->broken_why, sizeof g->broken_why, "%s", ruccl_last_error());
  }
  code = (ruccl_result_t)g->break_code;
  pthread_mutex_unlock(&g->break_mu);
  if (g->net) ruccl_session_transport()->abort(g->net, code); /* the other nodes stop with the same code */
  pthread_mutex_lock(&g->break_mu);
  if (atomic_load(&g->broken) == 0) atomic_store(&g->broken, (int)code);
  pthread_mutex_unlock(&g->break_mu);
  ruccl_inproc_wake(&g->inproc); /* after the store: a sleeper sees it or is woken */
  for (unsigned i = 0; i < g->n; i++) ruccl_mailbox_wake(&g->mail[i]);
}

/* ---- comms ------------------------------------------------------------------------- */

void *ruccl_comm_scratch(ruccl_comm_t *c, int slot, size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (c->scratch_cap[slot] >= bytes) return c->scratch[slot];
  free(c->scratch[slot]);
  size_t cap = bytes < 4096 ? 4096 : bytes;
  c->scratch[slot] = malloc(cap);
  c->scratch_cap[slot] = c->scratch[slot] ? cap : 0;
  return c->scratch[slot];
}

ruccl_comm_t *ruccl_comm_new(uint32_t peer_id, ruccl_device_t device, int64_t timeout_ms) {
  ruccl_comm_t *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->peer_id = peer_id;
  c->device = device;
  c->timeout_ms = timeout_ms;
  c->last_path = RUCCL_PATH_HOST; /* said only when a collective takes another */
  return c;
}

static void comm_free(ruccl_comm_t *c) {
  for (int i = 0; i < RUCCL_SCRATCH_SLOTS; i++) free(c->scratch[i]);
  ruccl_comm_release_device(c);
  free(c);
}

ruccl_result_t ruccl_comm_size(const ruccl_comm_t *c, unsigned *size) {
  if (!c || !size) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "comm or size is NULL");
  if (atomic_load(&c->group->reset)) return ruccl_fail(RUCCL_ERR_NOT_REGISTERED, "handle discarded by ruccl_reset()");
  *size = c->group->n_total;
  return RUCCL_OK;
}

ruccl_result_t ruccl_comm_index(const ruccl_comm_t *c, unsigned *index) {
  if (!c || !index) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "comm or index is NULL");
  if (atomic_load(&c->group->reset)) return ruccl_fail(RUCCL_ERR_NOT_REGISTERED, "handle discarded by ruccl_reset()");
  *index = c->global_index;
  return RUCCL_OK;
}

ruccl_result_t ruccl_comm_peer(const ruccl_comm_t *c, unsigned index, uint32_t *peer_id) {
  if (!c || !peer_id) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "comm or peer_id is NULL");
  if (atomic_load(&c->group->reset)) return ruccl_fail(RUCCL_ERR_NOT_REGISTERED, "handle discarded by ruccl_reset()");
  if (index >= c->group->n_total)
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "position %u is not below the size %u", index, c->group->n_total);
  *peer_id = c->group->all_ids[index];
  return RUCCL_OK;
}

ruccl_result_t ruccl_comm_algorithm(const ruccl_comm_t *c, const char **name) {
  if (!c || !name) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "comm or name is NULL");
  if (atomic_load(&c->group->reset)) return ruccl_fail(RUCCL_ERR_NOT_REGISTERED, "handle discarded by ruccl_reset()");
  *name = c->algorithm;
  return RUCCL_OK;
}

/* ---- registration ------------------------------------------------------------------ */

static int by_peer_id(const void *a, const void *b) {
  uint32_t x = (*(ruccl_comm_t *const *)a)->peer_id, y = (*(ruccl_comm_t *const *)b)->peer_id;
  return x < y ? -1 : x > y;
}

/* A single node: the global numbering is the local one. */
static int number_single_node(ruccl_group_t *g) {
  unsigned n = g->n;
  g->all_ids = malloc(sizeof *g->all_ids * n);
  g->node_members = malloc(sizeof *g->node_members * n);
  g->node_of = calloc(n, sizeof *g->node_of);
  g->local_of = malloc(sizeof *g->local_of * n);
  if (!g->all_ids || !g->node_members || !g->node_of || !g->local_of) return -1;
  for (unsigned i = 0; i < n; i++) {
    g->all_ids[i] = g->peer_ids_store[i];
    g->node_members[i] = g->local_of[i] = i;
  }
  g->n_total = n;
  g->num_nodes = 1;
  g->node_index = 0;
  return 0;
}

ruccl_group_t *ruccl_group_assemble(const ruccl_config_t *cfg, ruccl_comm_t **comms, int single) {
  ruccl_group_t *g = group_new(cfg);
  if (!g) return NULL;
  for (unsigned i = 0; i < g->n; i++) {
    g->members[i] = comms[i];
    comms[i]->group = g;
    comms[i]->index = i;
    g->peer_ids_store[i] = comms[i]->peer_id;
    atomic_fetch_add(&g->refs, 1);
  }
  g->joined = g->n;
  g->complete = 1;
  g->active = g->n;
  g->net_state = single ? 0 : 2;
  if (single && number_single_node(g) != 0) {
    ruccl_group_discard(g);
    return NULL;
  }
  return g;
}

void ruccl_group_publish(ruccl_group_t *g) {
  pthread_mutex_lock(&registry_mu);
  g->in_registry = 1;
  g->next = registry_head;
  registry_head = g;
  for (unsigned i = 0; i < g->n; i++)
    g->members[i]->global_index = g->node_members[g->node_index * g->n + i];
  pthread_mutex_unlock(&registry_mu);
}

void ruccl_group_discard(ruccl_group_t *g) {
  for (unsigned i = 0; i < g->n; i++) {
    comm_free(g->members[i]);
    group_unref(g);
  }
  group_unref(g); /* the registry's, never taken */
}

/* Registry lock held: every pending peer has arrived. */
static void complete_rendezvous(ruccl_group_t *g) {
  qsort(g->members, g->n, sizeof *g->members, by_peer_id);
  for (unsigned i = 0; i < g->n; i++) {
    g->members[i]->index = i;
    g->peer_ids_store[i] = g->members[i]->peer_id;
  }
  if (ruccl_config_is_multi_node(&g->config)) {
    g->net_state = 1; /* local index 0 connects the nodes; the others wait for it */
  } else if (number_single_node(g) != 0) {
    g->failed = RUCCL_ERR_NO_MEMORY;
    snprintf(g->broken_why, sizeof g->broken_why, "RUCCL_ERR_NO_MEMORY: peer tables");
    registry_remove(g);
  }
  g->complete = 1;
  g->active = g->n;
  pthread_cond_broadcast(&g->registered);
  ruccl_log(2, "group '%s': %u peers registered", g->config.group_name, g->n);
}

/* Registry lock held: a pending registrant gives up. */
static void leave_pending(ruccl_group_t *g, ruccl_comm_t *c) {
  for (unsigned i = 0; i < g->joined; i++) {
    if (g->members[i] == c) {
      g->members[i] = g->members[--g->joined];
      break;
    }
  }
  if (g->joined == 0) registry_remove(g);
}

static ruccl_result_t check_device(ruccl_device_t device) {
  const ruccl_device_adapter_t *ad = ruccl_device_adapter(device.kind);
  if (!ad)
    return ruccl_fail(RUCCL_ERR_UNSUPPORTED, "device kind %d is not supported by this build%s", (int)device.kind,
                      device.kind == RUCCL_DEVICE_CUDA ? " (configure with -DRUCCL_CUDA=ON)" : "");
  if (ad->check(device) != RUCCL_OK) /* the adapter's last error says why */
    return ruccl_fail(RUCCL_ERR_DEVICE, "device %s", ruccl_last_error_detail());
  return RUCCL_OK;
}

ruccl_result_t ruccl_register(uint32_t peer_id, ruccl_device_t device, const ruccl_config_t *config,
                              ruccl_comm_t **comm) {
  if (!comm) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "comm output pointer is NULL");
  *comm = NULL;
  ruccl_result_t rc = ruccl_config_validate(config);
  if (rc != RUCCL_OK) return rc;
  rc = check_device(device);
  if (rc != RUCCL_OK) return rc;

  ruccl_comm_t *c = ruccl_comm_new(peer_id, device, config->timeout_ms);
  if (!c) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "communicator");

  pthread_mutex_lock(&registry_mu);
  ruccl_group_t *g = NULL;
  for (ruccl_group_t *it = registry_head; it; it = it->next) {
    if (strcmp(it->config.group_name, config->group_name) != 0) continue;
    if (!it->complete) {
      g = it;
      continue;
    }
    for (unsigned i = 0; i < it->n; i++) {
      if (it->peer_ids_store[i] == peer_id && !atomic_load(&it->finished[i])) {
        pthread_mutex_unlock(&registry_mu);
        comm_free(c);
        return ruccl_fail(RUCCL_ERR_DUPLICATE_REGISTRATION,
                          "peer %u is already registered in the active session of group '%s'", peer_id,
                          config->group_name);
      }
    }
  }
  if (g && g->failed) {
    /* A poisoned rendezvous: the peers still on their way learn its verdict now
       rather than waiting out their timeout. */
    if (ruccl_now_ns() < g->tombstone_until && ++g->arrived <= g->n) {
      char why[sizeof g->broken_why];
      memcpy(why, g->broken_why, sizeof why);
      ruccl_result_t failed = g->failed;
      if (g->arrived == g->n) registry_remove(g);
      pthread_mutex_unlock(&registry_mu);
      comm_free(c);
      ruccl_set_last_error(why);
      return failed;
    }
    registry_remove(g); /* expired: a fresh session may start under this name */
    g = NULL;
  }
  if (g) {
    for (unsigned i = 0; i < g->joined; i++) {
      if (g->members[i]->peer_id == peer_id) {
        pthread_mutex_unlock(&registry_mu);
        comm_free(c);
        return ruccl_fail(RUCCL_ERR_DUPLICATE_REGISTRATION, "peer %u is already registering in group '%s'",
                          peer_id, config->group_name);
      }
    }
    const char *diff = ruccl_config_difference(&g->config, config);
    if (diff) {
      g->failed = RUCCL_ERR_CONFIG_MISMATCH;
      snprintf(g->broken_why, sizeof g->broken_why,
               "RUCCL_ERR_CONFIG_MISMATCH: peer %u registered in group '%s' with a different %s", peer_id,
               config->group_name, diff);
      pthread_cond_broadcast(&g->registered);
      g->arrived = g->joined + 1;
      g->tombstone_until = ruccl_deadline_after_ms(g->config.timeout_ms);
      if (g->arrived >= g->n) registry_remove(g);
      pthread_mutex_unlock(&registry_mu);
      comm_free(c);
      return ruccl_fail(RUCCL_ERR_CONFIG_MISMATCH, "peer %u registered in group '%s' with a different %s", peer_id,
                        config->group_name, diff);
    }
  } else {
    g = group_new(config);
    if (!g) {
      pthread_mutex_unlock(&registry_mu);
      comm_free(c);
      return ruccl_fail(RUCCL_ERR_NO_MEMORY, "group of %u peers", config->num_devices);
    }
    g->in_registry = 1;
    g->next = registry_head;
    registry_head = g;
  }
  c->group = g;
  atomic_fetch_add(&g->refs, 1);
  g->members[g->joined++] = c;
  if (g->joined == g->n) complete_rendezvous(g);

  int64_t deadline = ruccl_deadline_after_ms(config->timeout_ms);
  struct timespec ts = {.tv_sec = deadline / 1000000000, .tv_nsec = deadline % 1000000000};
  int timed_out = 0;
  while (!g->complete && !g->failed && !atomic_load(&g->reset) && !timed_out) {
    ruccl_testing_blocking(1);
    int w = pthread_cond_timedwait(&g->registered, &registry_mu, &ts);
    ruccl_testing_blocking(-1);
    timed_out = w != 0 && w != EINTR; /* ETIMEDOUT, or a deadline the clock cannot express */
  }

  if (g->complete && !g->failed && !atomic_load(&g->reset) && g->net_state == 1) {
    if (c->index == 0) {
      /* Connect the nodes without holding the registry. */
      pthread_mutex_unlock(&registry_mu);
      struct ruccl_net *net = NULL;
      rc = ruccl_session_connect(g, &net);
      pthread_mutex_lock(&registry_mu);
      if (rc == RUCCL_OK) {
        g->net = net; /* under the lock ruccl_reset reads it with */
        if (atomic_load(&g->reset)) ruccl_session_transport()->abort(net, RUCCL_ERR_PEER_LOST); /* reset came meanwhile */
        g->net_state = 2;
      } else {
        g->net_state = -(int)rc;
        snprintf(g->net_why, sizeof g->net_why, "%s", ruccl_last_error());
      }
      pthread_cond_broadcast(&g->registered);
    } else {
      while (g->net_state == 1 && !atomic_load(&g->reset)) pthread_cond_wait(&g->registered, &registry_mu);
    }
    if (g->net_state < 0 && !g->failed) {
      g->failed = (ruccl_result_t)(-g->net_state);
      memcpy(g->broken_why, g->net_why, sizeof g->broken_why);
      registry_remove(g);
    }
  }
  if (g->complete && !g->failed && !atomic_load(&g->reset)) {
    c->global_index = g->node_members[g->node_index * g->n + c->index];
    pthread_mutex_unlock(&registry_mu);
    *comm = c;
    return RUCCL_OK;
  }
  if (g->failed) {
    char why[sizeof g->broken_why];
    memcpy(why, g->broken_why, sizeof why);
    rc = g->failed;
    pthread_mutex_unlock(&registry_mu);
    ruccl_set_last_error(why);
  } else if (atomic_load(&g->reset)) {
    pthread_mutex_unlock(&registry_mu);
    rc = ruccl_fail(RUCCL_ERR_RESET, "ruccl_reset() was called while peer %u was registering", peer_id);
  } else {
    unsigned joined = g->joined;
    leave_pending(g, c);
    pthread_mutex_unlock(&registry_mu);
    rc = ruccl_fail(RUCCL_ERR_TIMEOUT, "peer %u: only %u of %u peers registered in group '%s' within %lld ms",
                    peer_id, joined, config->num_devices, config->group_name, (long long)config->timeout_ms);
  }
  group_unref(g);
  comm_free(c);
  return rc;
}

/* ---- finish and reset ------------------------------------------------------------- */

ruccl_result_t ruccl_finish(ruccl_comm_t *c) {
  if (!c) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "communicator is NULL");
  ruccl_group_t *g = c->group;
  ruccl_result_t rc = RUCCL_OK;
  if (atomic_load(&g->reset)) {
    rc = ruccl_fail(RUCCL_ERR_NOT_REGISTERED, "peer %u: this handle was discarded by ruccl_reset(); freed it",
                    c->peer_id);
  } else {
    atomic_store(&g->finished[c->index], 1);
    ruccl_mailbox_close(&g->mail[c->index], RUCCL_ERR_NOT_REGISTERED, "this peer finished its session");
    char why[96];
    snprintf(why, sizeof why, "peer %u finished its session", c->peer_id);
    for (unsigned i = 0; i < g->n; i++) /* receives waiting for what it will never send */
      if (i != c->index) ruccl_mailbox_fail_sources(&g->mail[i], &c->global_index, 1, RUCCL_ERR_PEER_FINISHED, why);
    pthread_mutex_lock(&registry_mu);
    int last = --g->active == 0;
    if (last) registry_remove(g);
    pthread_mutex_unlock(&registry_mu);
    if (last) ruccl_session_close(g, 1); /* the node leaves the orchestrator cleanly */
    ruccl_inproc_wake(&g->inproc); /* peers waiting for us see that we finished */
    ruccl_meeting_wake(g->meeting);
    ruccl_log(2, "peer %u finished its session in group '%s'", c->peer_id, g->config.group_name);
  }
  comm_free(c);
  group_unref(g);
  return rc;
}

ruccl_result_t ruccl_comm_abort(ruccl_comm_t *c) {
  if (!c) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "abort: communicator is NULL");
  ruccl_group_t *g = c->group;
  if (atomic_load(&g->reset)) return RUCCL_OK; /* nothing left to stop */
  ruccl_fail(RUCCL_ERR_ABORTED, "peer %u aborted the session", c->peer_id); /* the reason everyone reads */
  ruccl_group_break(g, RUCCL_ERR_ABORTED);
  ruccl_log(1, "peer %u aborted its session in group '%s'", c->peer_id, g->config.group_name);
  return RUCCL_OK;
}

ruccl_result_t ruccl_comm_set_timeout(ruccl_comm_t *c, int64_t timeout_ms) {
  if (!c) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "set_timeout: communicator is NULL");
  if (timeout_ms <= 0) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "set_timeout: timeout %lld ms is not > 0", (long long)timeout_ms);
  __atomic_store_n(&c->timeout_ms, timeout_ms, __ATOMIC_RELAXED);
  return RUCCL_OK;
}

void ruccl_reset(void) {
  pthread_mutex_lock(&registry_mu);
  while (registry_head) {
    ruccl_group_t *g = registry_head;
    atomic_store(&g->reset, 1);
    if (g->net) ruccl_session_transport()->abort(g->net, RUCCL_ERR_PEER_LOST);
    pthread_cond_broadcast(&g->registered);
    /* hold a reference while waking: registry_remove may drop the last one */
    atomic_fetch_add(&g->refs, 1);
    registry_remove(g);
    ruccl_inproc_wake(&g->inproc);
    for (unsigned i = 0; i < g->n; i++) ruccl_mailbox_wake(&g->mail[i]);
    group_unref(g);
  }
  pthread_mutex_unlock(&registry_mu);
}
