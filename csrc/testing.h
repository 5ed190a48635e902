/* testing.h — hooks for the test suite; not part of the API (the tests reach it
   through csrc/).  One makes a peer lag behind at a chosen step, so that a race that
   needs an unlucky schedule happens on every run; one tells a test that a thread is
   really blocked, so that it needs no sleep to be sure. */
#ifndef RUCCL_TESTING_H
#define RUCCL_TESTING_H

#include <stdint.h>

/* The transfer steps that receive, counted on the calling thread since it started. */
uint64_t ruccl_testing_recv_steps(void);

/* Arms the calling thread's receiving step number `step` (as counted above): in that
   step the transport sends what it can, then sleeps `ms` (as a descheduled process
   would), then looks at the session and its peers before it reads what arrived.  One
   step at a time; ms = 0 disarms. */
void ruccl_testing_delay_recv_step(uint64_t step, unsigned ms);

/* For the transports: called once per receiving step, after the step's sends have
   been started and before its receive is first looked at.  Sleeps if this is the
   armed step; returns whether it did. */
int ruccl_testing_pause(void);

/* CLOCK_MONOTONIC (shared by every process of the host) when the calling thread's
   delayed step woke up; 0 before that. */
int64_t ruccl_testing_delay_woke_ns(void);

/* Threads of this process asleep in a ruCCL wait right now (a collective waiting for
   a peer, a registration waiting for the others): what a test waits for instead of
   sleeping "long enough" for a thread to block. */
int ruccl_testing_blocked(void);

/* For the core: a team step that receives begins / any step ends; a thread goes to
   sleep in a wait (+1) or wakes (-1). */
void ruccl_testing_receiving_step(void);
void ruccl_testing_step_done(void);
void ruccl_testing_blocking(int delta);

/* Device paths without a device: while mode is non-zero, host tensors count as
   device tensors in the data-path decision.  1: every peer's on one shared device
   (the same-device path, where every peer is in one process); 2: each peer's on a
   device of its own (the NCCL path, where NCCL is usable); 3: each peer's on a
   device of its own, without NCCL, and the CPU adapter says the host cannot reach
   its memory (the host-staged path, copies and all).  The data stays in host
   memory and the CPU adapter does the device work, so a loaded NCCL must be one
   that works on host memory (the tests' fake). */
void ruccl_testing_pretend_devices(int mode);
int ruccl_testing_pretended_devices(void);
/* How many collectives took each data path (ruccl_path_t), process-wide; "path"
   4 counts the host-staged ones that ran in slices. */
void ruccl_testing_path_taken(int path);
uint64_t ruccl_testing_path_count(int path);

/* A descriptor as a broken or hostile node would send it: the calling thread's next
   collective states 1: a rank of 1000 dimensions, 2: a detail without its
   terminator, 3: dtype 99 (the judge must refuse it, never read past it).  Taken
   (and disarmed) by the collective. */
void ruccl_testing_corrupt_descriptor(int what);
int ruccl_testing_take_corruption(void);

/* While on, this process's liveness thread sends no beats (a node frozen before its
   first beat, as its successor sees it). */
void ruccl_testing_silence_beats(int on);
int ruccl_testing_beats_silenced(void);

/* 1: this process exits (status 7) right after its node gets the session's table, a
   crash before it links to anyone; 2: it stops itself there (SIGSTOP), frozen. */
void ruccl_testing_set_die_after_table(int on);
int ruccl_testing_die_after_table(void);
/* A node that coordinates an agreement round exits (status 9): 1, once the first node
   it asked has answered, before it sends any decision; 2, right after it sent the
   decision to the first node (the others never get it from it) (agree_net.c). */
void ruccl_testing_set_die_in_agreement(int on);
int ruccl_testing_die_in_agreement(void);

#endif
