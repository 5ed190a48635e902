// nccl_header_check.cc — ruCCL's own declarations of the NCCL API
// (csrc/device/nccl_api.h) against a real nccl.h: every value, size and field
// offset that ruCCL relies on.  The check is that this file compiles; running it
// prints the NCCL version of the header.
#include <nccl.h>

#include <cstddef>
#include <cstdio>
#include <type_traits>

#include "device/nccl_api.h"

#define SAME_VALUE(ours, theirs) static_assert(static_cast<int>(ours) == static_cast<int>(theirs), #ours)

static_assert(RUCCL_NCCL_UNIQUE_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "unique id size");
static_assert(sizeof(ruccl_nccl_unique_id_t) == sizeof(ncclUniqueId), "unique id layout");
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
// NCCL_API_MAGIC has a name since 2.19; before, the initializer spells it out.
static constexpr ncclConfig_t kNcclConfigInitializer = NCCL_CONFIG_INITIALIZER;
static_assert(RUCCL_NCCL_API_MAGIC == kNcclConfigInitializer.magic, "config magic");
#endif
static_assert(RUCCL_NCCL_CONFIG_UNDEF_INT == NCCL_CONFIG_UNDEF_INT, "undefined config value");
static_assert(RUCCL_NCCL_VERSION(2, 18, 0) == NCCL_VERSION(2, 18, 0), "version code");

SAME_VALUE(RUCCL_NCCL_SUCCESS, ncclSuccess);
SAME_VALUE(RUCCL_NCCL_UNHANDLED_CUDA_ERROR, ncclUnhandledCudaError);
SAME_VALUE(RUCCL_NCCL_SYSTEM_ERROR, ncclSystemError);
SAME_VALUE(RUCCL_NCCL_INTERNAL_ERROR, ncclInternalError);
SAME_VALUE(RUCCL_NCCL_INVALID_ARGUMENT, ncclInvalidArgument);
SAME_VALUE(RUCCL_NCCL_INVALID_USAGE, ncclInvalidUsage);
SAME_VALUE(RUCCL_NCCL_REMOTE_ERROR, ncclRemoteError);
SAME_VALUE(RUCCL_NCCL_IN_PROGRESS, ncclInProgress);

SAME_VALUE(RUCCL_NCCL_INT8, ncclInt8);
SAME_VALUE(RUCCL_NCCL_UINT8, ncclUint8);
SAME_VALUE(RUCCL_NCCL_INT32, ncclInt32);
SAME_VALUE(RUCCL_NCCL_INT64, ncclInt64);
SAME_VALUE(RUCCL_NCCL_FLOAT16, ncclFloat16);
SAME_VALUE(RUCCL_NCCL_FLOAT32, ncclFloat32);
SAME_VALUE(RUCCL_NCCL_FLOAT64, ncclFloat64);
SAME_VALUE(RUCCL_NCCL_BFLOAT16, ncclBfloat16);

SAME_VALUE(RUCCL_NCCL_SUM, ncclSum);
SAME_VALUE(RUCCL_NCCL_PROD, ncclProd);
SAME_VALUE(RUCCL_NCCL_MAX, ncclMax);
SAME_VALUE(RUCCL_NCCL_MIN, ncclMin);

// The configuration is a prefix of NCCL's, field for field, from 2.18 (the oldest NCCL
// ruCCL loads; an older header has a shorter ncclConfig_t, and only the rest is checked).
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
#define SAME_FIELD(ours, theirs)                                                               \
  static_assert(offsetof(ruccl_nccl_config_t, ours) == offsetof(ncclConfig_t, theirs), #ours); \
  static_assert(sizeof(((ruccl_nccl_config_t *)0)->ours) == sizeof(((ncclConfig_t *)0)->theirs), #ours)
SAME_FIELD(size, size);
SAME_FIELD(magic, magic);
SAME_FIELD(version, version);
SAME_FIELD(blocking, blocking);
SAME_FIELD(cga_cluster_size, cgaClusterSize);
SAME_FIELD(min_ctas, minCTAs);
SAME_FIELD(max_ctas, maxCTAs);
SAME_FIELD(net_name, netName);
SAME_FIELD(split_share, splitShare);
static_assert(sizeof(ruccl_nccl_config_t) <= sizeof(ncclConfig_t), "config prefix");
#endif

// The function pointers ruCCL calls through have NCCL's signatures (cudaStream_t is a
// pointer; enums pass as int).
static_assert(sizeof(ncclComm_t) == sizeof(ruccl_nccl_comm_t), "");
static_assert(sizeof(cudaStream_t) == sizeof(void *), "");
static_assert(sizeof(ncclResult_t) == sizeof(ruccl_nccl_result_t), "");
static_assert(sizeof(ncclDataType_t) == sizeof(ruccl_nccl_data_type_t), "");
static_assert(sizeof(ncclRedOp_t) == sizeof(ruccl_nccl_red_op_t), "");

int main() {
  std::printf("nccl_api.h matches nccl.h of NCCL %d.%d.%d%s\n", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH,
              NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0) ? "" : " (older than 2.18: configuration not checked)");
  return 0;
}
