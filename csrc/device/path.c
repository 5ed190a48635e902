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

static int same_uuid(const ruccl_path_facts_t *a, const ruccl_path_facts_t *b) {
  return memcmp(a->uuid.bytes, b->uuid.bytes, sizeof a->uuid.bytes) == 0;
}

ruccl_path_t ruccl_choose_path(const ruccl_path_facts_t *f, unsigned n, int own_dtype, char *why, size_t cap) {
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
      return snprintf(why, cap, "%u ranks of one process on one GPU", n), RUCCL_PATH_SAME_DEVICE;
    return snprintf(why, cap, "%u ranks on one GPU, more than the %d one device reduction takes", n,
                    RUCCL_DEVICE_REDUCE_MAX),
           RUCCL_PATH_HOST_STAGED;
  }
  for (unsigned i = 0; i < n; i++)
    for (unsigned j = i + 1; j < n; j++)
      if (same_uuid(&f[i], &f[j]))
        return snprintf(why, cap, "participants %u and %u share a GPU%s (NCCL refuses a duplicate GPU)", i, j,
                        f[i].process != f[j].process ? " from different processes" : ""),
               RUCCL_PATH_HOST_STAGED;
  for (unsigned i = 0; i < n; i++)
    if (f[i].nccl_version < RUCCL_NCCL_MIN_VERSION)
      return snprintf(why, cap, "participant %u has no usable NCCL", i), RUCCL_PATH_HOST_STAGED;
  for (unsigned i = 1; i < n; i++)
    if (f[i].nccl_version != f[0].nccl_version)
      return snprintf(why, cap, "participants 0 and %u have NCCL %d and %d", i, f[0].nccl_version,
                      f[i].nccl_version),
             RUCCL_PATH_HOST_STAGED;
  if (!own_dtype)
    return snprintf(why, cap, "the reduction runs in a wider dtype than NCCL would use"), RUCCL_PATH_HOST_STAGED;
  return snprintf(why, cap, "%u GPUs, NCCL %d", n, f[0].nccl_version), RUCCL_PATH_NCCL;
}
