/* testing.c — the test suite's hooks (testing.h): a receiving step that lags, and a
   count of the threads asleep in a wait.  Each costs a thread-local test or an
   atomic add on a path that is about to sleep anyway. */
#include "testing.h"

#include <stdatomic.h>
#include <time.h>

#include "transport.h"

static _Thread_local uint64_t recv_steps, delay_step;
static _Thread_local unsigned delay_ms, pause_ms; /* armed; pending in the current step */
static _Thread_local int64_t delay_woke_ns;
static atomic_int blocked;

uint64_t ruccl_testing_recv_steps(void) { return recv_steps; }

void ruccl_testing_delay_recv_step(uint64_t step, unsigned ms) {
  delay_step = step;
  delay_ms = ms;
  delay_woke_ns = 0;
}

int64_t ruccl_testing_delay_woke_ns(void) { return delay_woke_ns; }

void ruccl_testing_receiving_step(void) {
  if (recv_steps++ == delay_step && delay_ms) pause_ms = delay_ms, delay_ms = 0;
}

void ruccl_testing_step_done(void) { pause_ms = 0; }

int ruccl_testing_pause(void) {
  if (!pause_ms) return 0;
  struct timespec ts = {.tv_sec = pause_ms / 1000, .tv_nsec = (long)(pause_ms % 1000) * 1000000};
  pause_ms = 0;
  while (nanosleep(&ts, &ts) != 0) {
  }
  delay_woke_ns = ruccl_now_ns();
  return 1;
}

void ruccl_testing_blocking(int delta) { atomic_fetch_add_explicit(&blocked, delta, memory_order_relaxed); }

int ruccl_testing_blocked(void) { return atomic_load_explicit(&blocked, memory_order_relaxed); }

static atomic_int pretend_mode;
void ruccl_testing_pretend_devices(int mode) { atomic_store(&pretend_mode, mode); }
int ruccl_testing_pretended_devices(void) { return atomic_load(&pretend_mode); }

static atomic_uint_fast64_t paths_taken[5];
void ruccl_testing_path_taken(int path) {
  if ((unsigned)path < 5) atomic_fetch_add(&paths_taken[path], 1);
}
uint64_t ruccl_testing_path_count(int path) { return (unsigned)path < 5 ? atomic_load(&paths_taken[path]) : 0; }

static _Thread_local int corruption;
void ruccl_testing_corrupt_descriptor(int what) { corruption = what; }
int ruccl_testing_take_corruption(void) {
  int what = corruption;
  corruption = 0;
  return what;
}

static _Atomic int beats_silenced;
void ruccl_testing_silence_beats(int on) { beats_silenced = on; }
int ruccl_testing_beats_silenced(void) { return beats_silenced; }

static _Atomic int die_after_table;
void ruccl_testing_set_die_after_table(int on) { die_after_table = on; }
int ruccl_testing_die_after_table(void) { return die_after_table; }

static _Atomic int die_in_agreement;
void ruccl_testing_set_die_in_agreement(int on) { die_in_agreement = on; }
int ruccl_testing_die_in_agreement(void) { return die_in_agreement; }
