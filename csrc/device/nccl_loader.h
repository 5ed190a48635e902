/* nccl_loader.h — NCCL, loaded at run time: which library, which version, and
 * what its result codes mean as ruCCL's. */
#ifndef RUCCL_NCCL_LOADER_H
#define RUCCL_NCCL_LOADER_H

#include "device/nccl_api.h"
#include "ruccl.h"

/* Oldest NCCL used: non-blocking communicators with ncclCommFinalize, and the
   ncclConfig_t layout of nccl_api.h. */
#define RUCCL_NCCL_MIN_VERSION RUCCL_NCCL_VERSION(2, 18, 0)

/* The NCCL of this process, loaded on first use from RUCCL_NCCL_LIBRARY, else
   the copy already in the process (torch's), else libnccl.so.2; NULL when none is
   usable (RUCCL_NCCL=0, not found, a symbol missing, older than the minimum).
   *version is its version code, 0 when NULL.  Says at RUCCL_DEBUG=INFO which one
   it took, or why none. */
const ruccl_nccl_api_t *ruccl_nccl(int *version);

/* Why ruccl_nccl() found none ("" when it found one). */
const char *ruccl_nccl_unavailable_reason(void);

/* NCCL's result as ruCCL's: invalid argument or usage -> INVALID_ARGUMENT, remote
   error -> PEER_LOST, CUDA error -> DEVICE, system error -> IO, internal error ->
   PROTOCOL. */
ruccl_result_t ruccl_nccl_code(ruccl_nccl_result_t r);

/* Forgets the loaded library, so that the next ruccl_nccl() loads again (tests
   that change RUCCL_NCCL_LIBRARY; no session may be using NCCL). */
void ruccl_nccl_unload(void);

#endif
