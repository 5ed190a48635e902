/* recovery.c — keeping on after a failure: revoke, agree and shrink (ruccl.h).
 *
 * An agreement round has two levels.  The local peers of a node (threads) meet here,
 * in the group's meeting: each brings its flags (and, for a shrink, its exclude
 * list); the peer whose arrival completes the set (every local peer that has not
 * finished) runs the round for the node.  Between nodes the round is the
 * fault-tolerant agreement of net/agree_net.c, over connections of its own through
 * the data ports, so a revoked session (whose links are shut) still agrees.  Its
 * decision is the same bytes on every live node; each node then reads what it means
 * for its peers, and a shrink makes the new group from it: the survivors keep their
 * peer ids, are numbered densely in the old order, and link through new data ports
 * whose numbers travelled in the agreement.  A single node agrees locally. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "config.h"
#include "error.h"
#include "le.h"
#include "net/agree_net.h"
#include "net/bootstrap_wire.h"
#include "net/session.h"
#include "rank.h"

enum { ROUND_AGREE = 1, ROUND_SHRINK = 2 };
#define WHY_BYTES 192
#define DECISION_WHY 256

struct ruccl_meeting {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t round;  /* the round being gathered */
  int kind;        /* ROUND_*, the first arrival's */
  unsigned char *came;     /* by local index */
  unsigned char *excluded; /* by global index: the first arrival's list */
  uint32_t flags;
  int32_t code; /* a local error of the round (another list, another kind) */
  char why[WHY_BYTES];
  int running;
  /* The outcome of round `done`. */
  uint64_t done;
  ruccl_result_t result;
  char result_why[DECISION_WHY];
  uint32_t out_flags;
  unsigned char *failed;  /* by global index */
  ruccl_comm_t **made;    /* by local index: a shrink's new handles */
};

struct ruccl_meeting *ruccl_meeting_new(void) {
  struct ruccl_meeting *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  pthread_mutex_init(&m->mu, NULL);
  ruccl_cond_init_monotonic(&m->cv);
  return m;
}

void ruccl_meeting_free(struct ruccl_meeting *m) {
  if (!m) return;
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->cv);
  free(m->came);
  free(m->excluded);
  free(m->failed);
  free(m->made);
  free(m);
}

void ruccl_meeting_wake(struct ruccl_meeting *m) {
  pthread_mutex_lock(&m->mu);
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
}

/* ---- revoke ------------------------------------------------------------------------ */

ruccl_result_t ruccl_comm_revoke(ruccl_comm_t *c) {
  if (!c) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "revoke: communicator is NULL");
  ruccl_group_t *g = c->group;
  if (atomic_load(&g->reset)) return ruccl_fail(RUCCL_ERR_NOT_REGISTERED, "revoke: handle discarded by ruccl_reset()");
  ruccl_fail(RUCCL_ERR_REVOKED, "peer %u revoked the communicator", c->peer_id); /* the reason everyone reads */
  ruccl_group_break(g, RUCCL_ERR_REVOKED);
  ruccl_log(1, "peer %u revoked its communicator in group '%s'", c->peer_id, g->config.group_name);
  return RUCCL_OK;
}

/* ---- what a node brings, and what the nodes decide ----------------------------------
 *
 * Contribution: kind u32, flags u32, code u32, why[WHY_BYTES], port u32, then by
 * global index gone[n_total] (this node's peers that finished) and excluded[n_total].
 * Decision: code u32, why[DECISION_WHY], flags u32, failed[n_total], excluded[n_total],
 * lost[num_nodes], port[num_nodes] u32. */

typedef struct {
  unsigned n_total, num_nodes;
  const uint32_t *ids;
  const unsigned *node_of;
} shape_t;

static uint32_t contribution_bytes(const shape_t *s) { return 4 * 3 + WHY_BYTES + 4 + 2 * s->n_total; }
/* (contribution_at and decision_at below name the fields at these offsets) */
static uint32_t decision_bytes(const shape_t *s) { return 4 + DECISION_WHY + 4 + 2 * s->n_total + 5 * s->num_nodes; }

/* Where each field of a contribution or a decision lies in its bytes. */
typedef struct {
  unsigned char *kind, *flags, *code, *why, *port, *gone, *excluded;
} contribution_t;

typedef struct {
  unsigned char *code, *why, *flags, *failed, *excluded, *lost, *port;
} decision_t;

static contribution_t contribution_at(const shape_t *s, const unsigned char *c) {
  unsigned char *p = (unsigned char *)c; /* read-only where c is */
  contribution_t v = {.kind = p, .flags = p + 4, .code = p + 8, .why = p + 12};
  v.port = v.why + WHY_BYTES;
  v.gone = v.port + 4;
  v.excluded = v.gone + s->n_total;
  return v;
}

static decision_t decision_at(const shape_t *s, unsigned char *d) {
  decision_t v = {.code = d, .why = d + 4};
  v.flags = v.why + DECISION_WHY;
  v.failed = v.flags + 4;
  v.excluded = v.failed + s->n_total;
  v.lost = v.excluded + s->n_total;
  v.port = v.lost + s->num_nodes;
  return v;
}

static void combine(void *ctx, unsigned num_nodes, const unsigned char *const *contribs, uint32_t len,
                    unsigned char *out, uint32_t cap, uint32_t *dlen) {
  const shape_t *s = ctx;
  (void)len;
  *dlen = decision_bytes(s);
  if (cap < *dlen) { /* cannot happen: every node sizes its buffer the same */
    *dlen = 0;
    return;
  }
  memset(out, 0, *dlen);
  decision_t d = decision_at(s, out);
  uint32_t code = RUCCL_OK, flags = UINT32_MAX, kind = 0;
  char why[DECISION_WHY] = "";
  const unsigned char *first_excluded = NULL;
  unsigned first_node = 0;
  for (unsigned k = 0; k < num_nodes; k++) {
    const unsigned char *c = contribs[k];
    if (c == ruccl_agree_mismatch) { /* in the round, but its exclude list leaves out other nodes */
      if (code == RUCCL_OK) {
        code = RUCCL_ERR_INVALID_ARGUMENT;
        snprintf(why, sizeof why, "the exclude lists differ: node %u leaves out other nodes than node %u does", k,
                 first_node);
      }
      continue;
    }
    if (!c) {
      d.lost[k] = 1;
      for (unsigned i = 0; i < s->n_total; i++)
        if (s->node_of[i] == k) d.failed[i] = 1;
      continue;
    }
    contribution_t in = contribution_at(s, c);
    uint32_t ck = ruccl_get_le32(in.kind), cf = ruccl_get_le32(in.flags), cc = ruccl_get_le32(in.code);
    const char *cwhy = (const char *)in.why;
    uint32_t port = ruccl_get_le32(in.port);
    const unsigned char *gone = in.gone, *excl = in.excluded;
    if (!kind) kind = ck;
    if (code == RUCCL_OK && ck != kind) {
      code = RUCCL_ERR_OP_MISMATCH;
      snprintf(why, sizeof why, "node %u called %s while node %u called %s", first_node,
               kind == ROUND_SHRINK ? "ruccl_comm_shrink" : "ruccl_comm_agree", k,
               ck == ROUND_SHRINK ? "ruccl_comm_shrink" : "ruccl_comm_agree");
    }
    if (code == RUCCL_OK && cc != RUCCL_OK && cc < RUCCL_NUM_RESULTS) {
      code = cc;
      snprintf(why, sizeof why, "node %u: %.*s", k, WHY_BYTES - 1, cwhy);
    }
    flags &= cf;
    ruccl_put_le32(d.port + 4 * k, port);
    for (unsigned i = 0; i < s->n_total; i++) d.failed[i] |= gone[i] ? 1 : 0;
    if (!first_excluded) {
      first_excluded = excl, first_node = k;
    } else if (code == RUCCL_OK && memcmp(first_excluded, excl, s->n_total) != 0) {
      unsigned i = 0;
      while (first_excluded[i] == excl[i]) i++;
      code = RUCCL_ERR_INVALID_ARGUMENT;
      snprintf(why, sizeof why, "the exclude lists differ: node %u's names peer %u, node %u's does not",
               first_excluded[i] ? first_node : k, s->ids[i], first_excluded[i] ? k : first_node);
    }
  }
  if (first_excluded) memcpy(d.excluded, first_excluded, s->n_total);
  if (code == RUCCL_OK && kind == ROUND_SHRINK) {
    /* the survivors, by node: every node that keeps any must keep as many */
    unsigned want = 0, left = 0;
    for (unsigned k = 0; k < num_nodes && code == RUCCL_OK; k++) {
      unsigned keep = 0;
      for (unsigned i = 0; i < s->n_total; i++) keep += s->node_of[i] == k && !d.failed[i] && !d.excluded[i];
      left += keep;
      if (keep && want && keep != want) {
        code = RUCCL_ERR_UNSUPPORTED;
        snprintf(why, sizeof why, "the shrink would leave node %u with %u peers and another with %u: every node "
                 "must keep as many peers", k, keep, want);
      }
      if (keep) want = keep;
    }
    if (code == RUCCL_OK && !left) {
      code = RUCCL_ERR_INVALID_ARGUMENT;
      snprintf(why, sizeof why, "the shrink excludes every peer");
    }
  }
  ruccl_put_le32(d.code, code);
  memcpy(d.why, why, sizeof why);
  ruccl_put_le32(d.flags, flags);
}

/* ---- the new group of a shrink ------------------------------------------------------ */

/* Node k's survivors (ascending id), or how many with ids NULL. */
static unsigned survivors_of(const shape_t *s, const decision_t *d, unsigned k, uint32_t *ids) {
  unsigned n = 0;
  for (unsigned i = 0; i < s->n_total; i++)
    if (s->node_of[i] == k && !d->failed[i] && !d->excluded[i]) {
      if (ids) ids[n] = s->ids[i];
      n++;
    }
  return n;
}

/* The runner makes the node's part of the new group: handles for its survivors,
   and, across nodes, the new session through net (opened before the round). */
static ruccl_result_t make_group(ruccl_group_t *old, const shape_t *s, const decision_t *d, struct ruccl_net **netp,
                                 ruccl_comm_t **made) {
  struct ruccl_net *net = *netp;
  *netp = NULL; /* this function's now: the new group's, or closed */
  const ruccl_net_t *on = old->net;
  unsigned keep_here = survivors_of(s, d, old->node_index, NULL), nodes = 0, my_node = 0;
  for (unsigned k = 0; k < s->num_nodes; k++) {
    if (!survivors_of(s, d, k, NULL)) continue;
    if (k == old->node_index) my_node = nodes;
    nodes++;
  }
  ruccl_comm_t **comms = calloc(keep_here ? keep_here : 1, sizeof *comms);
  if (!comms) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "shrink: handles");
  ruccl_result_t rc = RUCCL_OK;
  unsigned made_n = 0;
  for (unsigned i = 0; i < old->n && rc == RUCCL_OK; i++) {
    unsigned gi = old->node_members[old->node_index * old->n + i];
    if (d->failed[gi] || d->excluded[gi]) continue;
    ruccl_comm_t *oc = old->members[i];
    comms[made_n] = ruccl_comm_new(oc->peer_id, oc->device, ruccl_comm_timeout(oc));
    if (!comms[made_n]) rc = ruccl_fail(RUCCL_ERR_NO_MEMORY, "shrink: handle");
    else made_n++;
  }
  ruccl_config_t cfg = old->config;
  cfg.num_devices = keep_here;
  cfg.num_nodes = nodes;
  ruccl_group_t *g = rc == RUCCL_OK ? ruccl_group_assemble(&cfg, comms, nodes <= 1) : NULL;
  if (rc == RUCCL_OK && !g) rc = ruccl_fail(RUCCL_ERR_NO_MEMORY, "shrink: group");
  if (!g)
    for (unsigned i = 0; i < made_n; i++) free(comms[i]);
  if (rc == RUCCL_OK && nodes > 1) {
    ruccl_table_t table = {.num_nodes = nodes, .nodes = calloc(nodes, sizeof(ruccl_join_t))};
    if (!table.nodes) rc = ruccl_fail(RUCCL_ERR_NO_MEMORY, "shrink: table");
    for (unsigned k = 0, t = 0; rc == RUCCL_OK && k < s->num_nodes; k++) {
      if (!survivors_of(s, d, k, NULL)) continue; /* a node with none left is no node of the new session */
      ruccl_join_t *j = &table.nodes[t];
      j->num_local = survivors_of(s, d, k, j->peer_ids);
      snprintf(j->address, sizeof j->address, "%s", on->nodes[k].address);
      snprintf(j->host, sizeof j->host, "%s", on->nodes[k].host);
      j->data_port = ruccl_get_le32(d->port + 4 * k);
      t++;
    }
    if (rc == RUCCL_OK) rc = ruccl_session_join(g, net, &table, my_node);
    free(table.nodes);
    if (rc == RUCCL_OK) {
      g->net = net;
      net = NULL;
    } else {
      /* the net first: its threads may reach the group until they stop */
      ruccl_session_discard(net);
      net = NULL;
      ruccl_group_discard(g);
      g = NULL;
    }
  }
  if (net) ruccl_session_discard(net); /* one node left: no session between nodes */
  if (rc == RUCCL_OK) {
    ruccl_group_publish(g);
    for (unsigned i = 0, m = 0; i < old->n; i++) {
      unsigned gi = old->node_members[old->node_index * old->n + i];
      made[i] = d->failed[gi] || d->excluded[gi] ? NULL : g->members[m++];
    }
    ruccl_log(1, "group '%s' shrank to %u peers on %u node(s)", cfg.group_name, g->n_total, g->num_nodes);
  }
  free(comms);
  return rc;
}

/* ---- one round ---------------------------------------------------------------------- */

/* Mutex held, the meeting sized: whether every local peer that is due has come. */
static int everyone_came(const ruccl_group_t *g, const struct ruccl_meeting *m) {
  for (unsigned i = 0; i < g->n; i++) {
    unsigned gi = g->node_members[g->node_index * g->n + i];
    if (!m->came[i] && !atomic_load(&g->finished[i]) && !m->excluded[gi]) return 0;
  }
  return 1;
}

/* The runner: the node's contribution, the round among the nodes (or alone), and
   what the decision means here.  Mutex not held. */
static void run_round(ruccl_comm_t *c, struct ruccl_meeting *m, uint64_t round) {
  ruccl_group_t *g = c->group;
  shape_t s = {.n_total = g->n_total, .num_nodes = g->num_nodes, .ids = g->all_ids, .node_of = g->node_of};
  uint32_t clen = contribution_bytes(&s), dcap = decision_bytes(&s), dlen = 0;
  unsigned char *mine = calloc(1, clen), *dec = calloc(1, dcap);
  ruccl_result_t rc = mine && dec ? RUCCL_OK : ruccl_fail(RUCCL_ERR_NO_MEMORY, "agreement of %u peers", s.n_total);
  struct ruccl_net *net = NULL;
  ruccl_net_t *on = g->net;
  /* what this node brings, taken under the lock (a late peer may still write the meeting) */
  pthread_mutex_lock(&m->mu);
  int kind = m->kind;
  int32_t code = m->code;
  char why[WHY_BYTES];
  memcpy(why, m->why, sizeof why);
  contribution_t out = contribution_at(&s, mine);
  if (rc == RUCCL_OK) {
    ruccl_put_le32(out.kind, (uint32_t)kind);
    ruccl_put_le32(out.flags, m->flags);
    for (unsigned i = 0; i < g->n; i++)
      if (atomic_load(&g->finished[i]) && !m->came[i]) out.gone[g->node_members[g->node_index * g->n + i]] = 1;
    memcpy(out.excluded, m->excluded, s.n_total);
  }
  pthread_mutex_unlock(&m->mu);
  if (rc == RUCCL_OK && kind == ROUND_SHRINK && on && code == RUCCL_OK) {
    rc = ruccl_session_open(on, &g->config, &net);
    if (rc != RUCCL_OK) { /* told to the others as this node's error */
      code = rc;
      snprintf(why, sizeof why, "%s", ruccl_last_error());
      rc = RUCCL_OK;
    }
  }
  if (rc == RUCCL_OK) {
    ruccl_put_le32(out.code, (uint32_t)code);
    memcpy(out.why, why, WHY_BYTES);
    ruccl_put_le32(out.port, net ? ruccl_session_port(net) : 0);
    const unsigned char *excluded = out.excluded;
    int64_t deadline = ruccl_deadline_after_ms(ruccl_comm_timeout(c));
    unsigned char *skip = on ? calloc(s.num_nodes, 1) : NULL; /* nodes whose every peer is excluded */
    for (unsigned k = 0; skip && k < s.num_nodes; k++) {
      skip[k] = 1;
      for (unsigned i = 0; i < s.n_total; i++)
        if (s.node_of[i] == k && !excluded[i]) skip[k] = 0;
    }
    if (on && !skip) rc = ruccl_fail(RUCCL_ERR_NO_MEMORY, "agreement of %u nodes", s.num_nodes);
    else if (on)
      rc = ruccl_agree_net_run(on, round, mine, clen, skip, combine, &s, ruccl_session_liveness_ms(&g->config),
                               deadline, dec, dcap, &dlen);
    else
      combine(&s, 1, (const unsigned char *const *)&mine, clen, dec, dcap, &dlen);
    free(skip);
    if (rc == RUCCL_OK && dlen != dcap)
      rc = ruccl_fail(RUCCL_ERR_PROTOCOL, "the agreement's decision has %u bytes, not %u", dlen, dcap);
  }
  decision_t d = decision_at(&s, dec);
  if (rc == RUCCL_OK && ruccl_get_le32(d.code) != RUCCL_OK) {
    char said[DECISION_WHY + 1];
    memcpy(said, d.why, DECISION_WHY);
    said[DECISION_WHY] = 0;
    rc = ruccl_fail((ruccl_result_t)ruccl_get_le32(d.code), "%s", said);
  }
  /* (a round that failed fails alike for every caller, this node too: the code first) */
  if (rc == RUCCL_OK && d.lost[g->node_index])
    rc = ruccl_fail(RUCCL_ERR_PEER_LOST, "the other nodes found this node lost during the agreement (it was frozen "
                    "or too slow) and went on without it");
  if (rc == RUCCL_OK && kind == ROUND_SHRINK) rc = make_group(g, &s, &d, &net, m->made);
  if (net) ruccl_session_discard(net);
  pthread_mutex_lock(&m->mu);
  m->result = rc;
  snprintf(m->result_why, sizeof m->result_why, "%s", rc == RUCCL_OK ? "" : ruccl_last_error());
  m->out_flags = rc == RUCCL_OK ? ruccl_get_le32(d.flags) : 0;
  if (rc == RUCCL_OK) memcpy(m->failed, d.failed, s.n_total);
  m->done = round;
  m->running = 0;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  free(mine);
  free(dec);
}

/* Every local peer's call: joins the round, runs it when it completes the set, and
   waits for its outcome (mutex held on return when RUCCL_OK). */
static ruccl_result_t meet(ruccl_comm_t *c, int kind, uint32_t flags, const uint32_t *exclude, size_t num_exclude) {
  ruccl_group_t *g = c->group;
  struct ruccl_meeting *m = g->meeting;
  if (atomic_load(&g->reset))
    return ruccl_fail(RUCCL_ERR_NOT_REGISTERED, "peer %u: this handle was discarded by ruccl_reset()", c->peer_id);
  unsigned n = g->n_total;
  unsigned char *excl = calloc(n, 1);
  if (!excl) return ruccl_fail(RUCCL_ERR_NO_MEMORY, "exclude list");
  int32_t code = RUCCL_OK;
  char why[WHY_BYTES] = "";
  for (size_t i = 0; i < num_exclude; i++) {
    int gi = ruccl_peer_index(c, exclude[i]);
    if (gi < 0 && code == RUCCL_OK) {
      code = RUCCL_ERR_INVALID_ARGUMENT;
      snprintf(why, sizeof why, "peer %u: the exclude list names peer %u, which is no participant", c->peer_id,
               exclude[i]);
    } else if (gi >= 0) {
      excl[gi] = 1;
    }
  }
  if (excl[c->global_index] && code == RUCCL_OK) { /* it still meets the others, who may wait for it */
    code = RUCCL_ERR_INVALID_ARGUMENT;
    snprintf(why, sizeof why, "peer %u is in its own exclude list: excluded peers do not call ruccl_comm_shrink",
             c->peer_id);
  }
  uint64_t round = ++c->agree_round;
  pthread_mutex_lock(&m->mu);
  if (!m->came) {
    m->came = calloc(g->n, 1);
    m->excluded = calloc(n, 1);
    m->failed = calloc(n, 1);
    m->made = calloc(g->n, sizeof *m->made);
    if (!m->came || !m->excluded || !m->failed || !m->made) {
      free(m->came), free(m->excluded), free(m->failed), free(m->made);
      m->came = NULL;
      pthread_mutex_unlock(&m->mu);
      free(excl);
      return ruccl_fail(RUCCL_ERR_NO_MEMORY, "agreement of %u peers", n);
    }
  }
  if (m->done >= round) { /* the round ran without this peer: another's exclude list names it */
    pthread_mutex_unlock(&m->mu);
    free(excl);
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "peer %u came to agreement round %llu after its node had run it "
                      "without it: another peer of its node excludes it", c->peer_id, (unsigned long long)round);
  }
  if (m->round != round) { /* the first of this round */
    m->round = round;
    m->kind = kind;
    memset(m->came, 0, g->n);
    memcpy(m->excluded, excl, n);
    m->flags = UINT32_MAX;
    m->code = RUCCL_OK;
    m->why[0] = 0;
  } else if (m->code == RUCCL_OK && m->kind != kind) {
    m->code = RUCCL_ERR_OP_MISMATCH;
    snprintf(m->why, sizeof m->why, "peer %u called %s while another peer of its node called %s", c->peer_id,
             kind == ROUND_SHRINK ? "ruccl_comm_shrink" : "ruccl_comm_agree",
             kind == ROUND_SHRINK ? "ruccl_comm_agree" : "ruccl_comm_shrink");
  } else if (m->code == RUCCL_OK && memcmp(m->excluded, excl, n) != 0) {
    m->code = RUCCL_ERR_INVALID_ARGUMENT;
    snprintf(m->why, sizeof m->why, "peer %u's exclude list differs from another peer's of its node", c->peer_id);
  }
  if (code != RUCCL_OK && m->code == RUCCL_OK) {
    m->code = code;
    memcpy(m->why, why, sizeof why);
  }
  free(excl);
  m->came[c->index] = 1;
  m->flags &= flags;
  int64_t deadline = ruccl_deadline_after_ms(ruccl_comm_timeout(c));
  while (m->done < round) {
    if (!m->running && (everyone_came(g, m) || m->code != RUCCL_OK)) { /* an error needs no one else */
      m->running = 1;
      pthread_mutex_unlock(&m->mu);
      run_round(c, m, round);
      pthread_mutex_lock(&m->mu);
      continue;
    }
    if (!m->running && ruccl_now_ns() >= deadline) {
      unsigned missing = 0;
      for (unsigned i = 0; i < g->n; i++) missing += !m->came[i] && !atomic_load(&g->finished[i]);
      /* this peer leaves the round: if it runs later, it runs as failed, without it */
      m->came[c->index] = 0;
      if (m->code == RUCCL_OK) {
        m->code = RUCCL_ERR_TIMEOUT;
        snprintf(m->why, sizeof m->why, "peer %u timed out waiting for its node's other peers", c->peer_id);
      }
      pthread_mutex_unlock(&m->mu);
      return ruccl_fail(RUCCL_ERR_TIMEOUT, "peer %u: %u local peer(s) did not join the agreement within %lld ms",
                        c->peer_id, missing, (long long)ruccl_comm_timeout(c));
    }
    int64_t wake = ruccl_now_ns() + 50000000;
    struct timespec ts = {.tv_sec = wake / 1000000000, .tv_nsec = wake % 1000000000};
    pthread_cond_timedwait(&m->cv, &m->mu, &ts);
  }
  if (m->result != RUCCL_OK) {
    ruccl_result_t rc = m->result;
    char msg[DECISION_WHY];
    memcpy(msg, m->result_why, sizeof msg);
    pthread_mutex_unlock(&m->mu);
    ruccl_set_last_error(msg);
    return rc;
  }
  return RUCCL_OK;
}

ruccl_result_t ruccl_comm_agree(ruccl_comm_t *c, uint32_t *flags, uint32_t *failed, size_t failed_cap,
                                size_t *num_failed) {
  if (!c || !flags || !num_failed || (!failed && failed_cap))
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "agree: communicator, flags, num_failed or failed is NULL");
  ruccl_result_t rc = meet(c, ROUND_AGREE, *flags, NULL, 0);
  if (rc != RUCCL_OK) return rc;
  struct ruccl_meeting *m = c->group->meeting;
  *flags = m->out_flags;
  size_t count = 0;
  for (unsigned i = 0; i < c->group->n_total; i++) {
    if (!m->failed[i]) continue;
    if (count < failed_cap) failed[count] = c->group->all_ids[i];
    count++;
  }
  *num_failed = count;
  pthread_mutex_unlock(&m->mu);
  return RUCCL_OK;
}

ruccl_result_t ruccl_comm_shrink(ruccl_comm_t *c, const uint32_t *exclude, size_t num_exclude, ruccl_comm_t **out) {
  if (!c || !out || (!exclude && num_exclude))
    return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "shrink: communicator, out or exclude is NULL");
  *out = NULL;
  ruccl_result_t rc = meet(c, ROUND_SHRINK, UINT32_MAX, exclude, num_exclude);
  if (rc != RUCCL_OK) return rc;
  struct ruccl_meeting *m = c->group->meeting;
  *out = m->made[c->index];
  m->made[c->index] = NULL;
  pthread_mutex_unlock(&m->mu);
  return RUCCL_OK;
}
