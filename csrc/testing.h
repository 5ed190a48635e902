/* testing.h — fault injection for the test suite; not part of the API (the tests
   reach it through csrc/).  It makes one peer lag behind at a chosen step, so that a
   race that needs an unlucky schedule happens on every run. */
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

#endif
