/* cancel.h — what every wait of a transport watches, owned by the rank core (a
   transport never sees the group): ruccl_reset() was called, or the session broke,
   with a code whose cause (broken_why) was written before the code.  C only (the
   tests' C++ includes transport.h, not this). */
#ifndef RUCCL_CANCEL_H
#define RUCCL_CANCEL_H

#include <stdatomic.h>

#include "ruccl.h"

typedef struct {
  const atomic_int *reset;
  const atomic_int *broken;
  const char *broken_why;
} ruccl_cancel_t;

/* RESET, or the code the session broke with (its cause made the last error), else
   RUCCL_OK. */
ruccl_result_t ruccl_cancel_state(const ruccl_cancel_t *c);

#endif
