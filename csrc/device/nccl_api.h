/* nccl_api.h — the part of NCCL's API that ruCCL uses, declared here so that the
 * core builds without NCCL: the library is loaded at run time (nccl.c), never
 * linked.  Names carry a ruccl_ prefix so that this header and a real nccl.h can be
 * compiled together; tests/test_nccl_header.cc checks every value and layout here
 * against a real nccl.h when one is found at build time.
 *
 * The configuration struct is NCCL's ncclConfig_t as of 2.18 (a prefix of every
 * later version): NCCL reads only the fields that the version stamped in it has. */
#ifndef RUCCL_NCCL_API_H
#define RUCCL_NCCL_API_H

#include <limits.h>
#include <stddef.h>

#define RUCCL_NCCL_VERSION(X, Y, Z) ((X) * 10000 + (Y) * 100 + (Z)) /* 2.9 and later */
#define RUCCL_NCCL_UNIQUE_ID_BYTES 128
#define RUCCL_NCCL_API_MAGIC 0xcafebeefu
#define RUCCL_NCCL_CONFIG_UNDEF_INT INT_MIN

typedef struct ruccl_nccl_comm *ruccl_nccl_comm_t;
typedef struct {
  char internal[RUCCL_NCCL_UNIQUE_ID_BYTES];
} ruccl_nccl_unique_id_t;

typedef enum {
  RUCCL_NCCL_SUCCESS = 0,
  RUCCL_NCCL_UNHANDLED_CUDA_ERROR = 1,
  RUCCL_NCCL_SYSTEM_ERROR = 2,
  RUCCL_NCCL_INTERNAL_ERROR = 3,
  RUCCL_NCCL_INVALID_ARGUMENT = 4,
  RUCCL_NCCL_INVALID_USAGE = 5,
  RUCCL_NCCL_REMOTE_ERROR = 6,
  RUCCL_NCCL_IN_PROGRESS = 7
} ruccl_nccl_result_t;

typedef enum {
  RUCCL_NCCL_INT8 = 0,
  RUCCL_NCCL_UINT8 = 1,
  RUCCL_NCCL_INT32 = 2,
  RUCCL_NCCL_INT64 = 4,
  RUCCL_NCCL_FLOAT16 = 6,
  RUCCL_NCCL_FLOAT32 = 7,
  RUCCL_NCCL_FLOAT64 = 8,
  RUCCL_NCCL_BFLOAT16 = 9
} ruccl_nccl_data_type_t;

typedef enum { RUCCL_NCCL_SUM = 0, RUCCL_NCCL_PROD = 1, RUCCL_NCCL_MAX = 2, RUCCL_NCCL_MIN = 3 } ruccl_nccl_red_op_t;

typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cga_cluster_size;
  int min_ctas;
  int max_ctas;
  const char *net_name;
  int split_share;
} ruccl_nccl_config_t;

/* The functions, as pointers filled by dlsym (cudaStream_t is a pointer). */
typedef struct {
  ruccl_nccl_result_t (*get_version)(int *version);
  ruccl_nccl_result_t (*get_unique_id)(ruccl_nccl_unique_id_t *id);
  ruccl_nccl_result_t (*comm_init_rank_config)(ruccl_nccl_comm_t *comm, int nranks, ruccl_nccl_unique_id_t id,
                                               int rank, ruccl_nccl_config_t *config);
  ruccl_nccl_result_t (*comm_get_async_error)(ruccl_nccl_comm_t comm, ruccl_nccl_result_t *async_error);
  ruccl_nccl_result_t (*comm_finalize)(ruccl_nccl_comm_t comm);
  ruccl_nccl_result_t (*comm_destroy)(ruccl_nccl_comm_t comm);
  ruccl_nccl_result_t (*comm_abort)(ruccl_nccl_comm_t comm);
  const char *(*get_error_string)(ruccl_nccl_result_t result);
  const char *(*get_last_error)(ruccl_nccl_comm_t comm); /* may be NULL */
  ruccl_nccl_result_t (*all_reduce)(const void *send, void *recv, size_t count, ruccl_nccl_data_type_t dt,
                                    ruccl_nccl_red_op_t op, ruccl_nccl_comm_t comm, void *stream);
  ruccl_nccl_result_t (*broadcast)(const void *send, void *recv, size_t count, ruccl_nccl_data_type_t dt, int root,
                                   ruccl_nccl_comm_t comm, void *stream);
  ruccl_nccl_result_t (*reduce)(const void *send, void *recv, size_t count, ruccl_nccl_data_type_t dt,
                                ruccl_nccl_red_op_t op, int root, ruccl_nccl_comm_t comm, void *stream);
  ruccl_nccl_result_t (*all_gather)(const void *send, void *recv, size_t send_count, ruccl_nccl_data_type_t dt,
                                    ruccl_nccl_comm_t comm, void *stream);
  ruccl_nccl_result_t (*reduce_scatter)(const void *send, void *recv, size_t recv_count, ruccl_nccl_data_type_t dt,
                                        ruccl_nccl_red_op_t op, ruccl_nccl_comm_t comm, void *stream);
} ruccl_nccl_api_t;

#endif
