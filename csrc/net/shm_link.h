/* shm_link.h — the shared-memory data path between two node processes of one host:
   a pair of single-producer single-consumer byte rings in one mapped segment. */
#ifndef RUCCL_SHM_LINK_H
#define RUCCL_SHM_LINK_H

#include <stddef.h>

#include "ruccl.h"

#define RUCCL_SHM_NAME_MAX 64
#define RUCCL_SHM_TOKEN_BYTES 16

typedef struct ruccl_shm_ring ruccl_shm_ring_t;

typedef struct {
  ruccl_shm_ring_t *tx, *rx;
  void *map;
  size_t map_len;
  int side; /* 0: the creator, 1: the opener (whose doorbell is which) */
} ruccl_shm_link_t;

/* The creator maps a fresh segment and writes a random token into it; the peer
   opens it by name and proves it reached the same memory by reading the token. */
ruccl_result_t ruccl_shm_create(ruccl_shm_link_t *l, char name[RUCCL_SHM_NAME_MAX],
                                unsigned char token[RUCCL_SHM_TOKEN_BYTES]);
ruccl_result_t ruccl_shm_open(ruccl_shm_link_t *l, const char *name, const unsigned char token[RUCCL_SHM_TOKEN_BYTES]);
void ruccl_shm_unlink(const char *name);
/* Segments are unlinked as soon as both sides have them mapped; one whose creator died
   before that (its name carries the creator's pid) is removed by the next process
   that creates one (once per process), or by this call.  Only this user's segments,
   and only those whose creator no longer exists. */
void ruccl_shm_sweep(void);
void ruccl_shm_close(ruccl_shm_link_t *l);

/* Non-blocking: the bytes moved (0 when the ring is full / empty), or
   RUCCL_SHM_CORRUPT when the ring's counters cannot be right (the other side's
   counter is more than a ring away from ours): nothing is copied then. */
#define RUCCL_SHM_CORRUPT ((size_t)-1)
size_t ruccl_shm_write(ruccl_shm_link_t *l, const void *buf, size_t len);
size_t ruccl_shm_read(ruccl_shm_link_t *l, void *buf, size_t len);
/* Zero-copy reading: the readable bytes that lie contiguous in the ring (*data
   points at them; 0 when the ring is empty; or RUCCL_SHM_CORRUPT), then hand back
   what was used. */
size_t ruccl_shm_peek(ruccl_shm_link_t *l, const void **data);
void ruccl_shm_consume(ruccl_shm_link_t *l, size_t len);

/* Declares (+1) or withdraws (-1) that this side may sleep on the link: the peer
   rings the doorbell on every counter it moves while it is declared.  Declare it a
   while (RUCCL_SHM_SLEEPY_NS) before the first ruccl_shm_wait. */
#define RUCCL_SHM_SLEEPY_NS 100000
void ruccl_shm_sleepy(ruccl_shm_link_t *l, int delta);
/* This side may wait at once after declaring itself sleepy (no while between):
   its peer fences before it looks for sleepers.  Call before the first message. */
void ruccl_shm_set_eager(ruccl_shm_link_t *l);
/* Sleeps (futex) until the peer has written into the receiving ring (want_read) or
   freed room in the sending ring (want_write), or until_ns (CLOCK_MONOTONIC) passes;
   returns at once if that has happened already. */
void ruccl_shm_wait(ruccl_shm_link_t *l, int want_read, int want_write, int64_t until_ns);

/* Whether this host's processes may use shared memory (RUCCL_TRANSPORT=tcp says no). */
int ruccl_shm_allowed(void);
/* This kernel's boot id: processes that share it share a host ("" when unknown). */
#define RUCCL_HOST_ID_BYTES 40
void ruccl_host_id(char out[RUCCL_HOST_ID_BYTES]);

/* Tests only: breaks a counter as a faulty or hostile peer would (which 0: the
   sending ring's tail, read past what was written; 1: the receiving ring's head,
   written a ring and more past what was read). */
void ruccl_shm_testing_corrupt(ruccl_shm_link_t *l, int which);
/* Tests only: sets a counter to any value (which 0: the sending ring's head, 1 its
   tail, 2 the receiving ring's head, 3 its tail). */
void ruccl_shm_testing_set_counter(ruccl_shm_link_t *l, int which, uint64_t value);

#endif
