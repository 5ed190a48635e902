/* path.c — the data-path decision (path.h): a pure function of the facts. */
#include "device/path.h"

#include <stdio.h>
#include <string.h>

#include "device/nccl_loader.h"

const char *ruccl_path_name(ruccl_path_t path) {
  switch (path) {
    case RUCCL_PATH_HOST: return "host";
    case RUCCL_PATH_HOST_STAGED: return "host-staged";
    case RUCCL_PATH_SAME_DEVICE: return "same-device";
    case RUCCL_PATH_NCCL: return "nccl";
  }
  return "unknown";
}

int ruccl_path_parse(const char *name) {
  if (!name || !*name || !strcmp(name, "auto")) return -1;
  for (int p = RUCCL_PATH_HOST; p <= RUCCL_PATH_NCCL; p++)
    if (!strcmp(name, ruccl_path_name((ruccl_path_t)p))) return p;
  return -2;
}

static int same_uuid(const ruccl_path_facts_t *a, const ruccl_path_facts_t *b) {
  return memcmp(a->uuid.bytes, b->uuid.bytes, sizeof a->uuid.bytes) == 0;
}

/* Whether NCCL can carry the call (every peer on a GPU of its own, with the same
   usable NCCL, a reduction in the tensors' own dtype); if not, why. */
static int nccl_possible(const ruccl_path_facts_t *f, unsigned n, int own_dtype, char *why, size_t cap) {
  for (unsigned i = 0; i < n; i++)
    for (unsigned j = i + 1; j < n; j++)
      if (same_uuid(&f[i], &f[j]))
        return snprintf(why, cap, "participants %u and %u share a GPU%s (NCCL refuses a duplicate GPU)", i, j,
                        f[i].process != f[j].process ? " from different processes" : ""),
               0;
  for (unsigned i = 0; i < n; i++)
    if (f[i].nccl_version < RUCCL_NCCL_MIN_VERSION)
      return snprintf(why, cap, "participant %u has no usable NCCL", i), 0;
  for (unsigned i = 1; i < n; i++)
    if (f[i].nccl_version != f[0].nccl_version)
      return snprintf(why, cap, "participants 0 and %u have NCCL %d and %d", i, f[0].nccl_version,
                      f[i].nccl_version),
             0;
  if (!own_dtype)
    return snprintf(why, cap, "NCCL would not compute it as ruccl does (a wider dtype, or NaN in float MIN/MAX)"), 0;
  return snprintf(why, cap, "%u GPU%s, NCCL %d", n, n == 1 ? "" : "s", f[0].nccl_version), 1;
}

static ruccl_path_t choose(const ruccl_path_facts_t *f, unsigned n, int own_dtype, char *why, size_t cap) {
  unsigned cpu = 0, cuda = 0;
  for (unsigned i = 0; i < n; i++) {
    cpu += f[i].device_kind == RUCCL_DEVICE_CPU;
    cuda += f[i].device_kind == RUCCL_DEVICE_CUDA;
  }
  if (cpu == n) return snprintf(why, cap, "every tensor is in host memory"), RUCCL_PATH_HOST;
  if (cuda != n) return snprintf(why, cap, "the tensors are on different kinds of device"), RUCCL_PATH_HOST_STAGED;
  int one_process = 1, one_device = 1;
  for (unsigned i = 1; i < n; i++) {
    one_process &= f[i].process == f[0].process;
    one_device &= same_uuid(&f[i], &f[0]);
  }
  if (one_process && one_device) {
    if (n <= RUCCL_DEVICE_REDUCE_MAX)
      return snprintf(why, cap, "%u rank%s of one process on one GPU", n, n == 1 ? "" : "s"), RUCCL_PATH_SAME_DEVICE;
    return snprintf(why, cap, "%u ranks on one GPU, more than the %d one device reduction takes", n,
                    RUCCL_DEVICE_REDUCE_MAX),
           RUCCL_PATH_HOST_STAGED;
  }
  return nccl_possible(f, n, own_dtype, why, cap) ? RUCCL_PATH_NCCL : RUCCL_PATH_HOST_STAGED;
}

ruccl_path_t ruccl_choose_path(const ruccl_path_facts_t *f, unsigned n, int own_dtype, int wanted, char *why,
                               size_t cap) {
  ruccl_path_t p = choose(f, n, own_dtype, why, cap);
  if (wanted < 0 || wanted == (int)p) return p;
  /* RUCCL_PATH asks for another path: take it where it can carry the call */
  char no[96] = "";
  int ok = 0;
  switch (wanted) {
    case RUCCL_PATH_HOST_STAGED: ok = p != RUCCL_PATH_HOST; break; /* device memory can always be staged */
    case RUCCL_PATH_NCCL: ok = p != RUCCL_PATH_HOST && nccl_possible(f, n, own_dtype, no, sizeof no); break;
    default: break; /* host and same-device only where they are the automatic choice */
  }
  if (ok) return snprintf(why, cap, "RUCCL_PATH=%s", ruccl_path_name((ruccl_path_t)wanted)), (ruccl_path_t)wanted;
  char chosen[160];
  snprintf(chosen, sizeof chosen, "%s", why);
  snprintf(why, cap, "RUCCL_PATH=%s cannot carry this call%s%s; %s", ruccl_path_name((ruccl_path_t)wanted),
           no[0] ? ": " : "", no, chosen);
  return p;
}
