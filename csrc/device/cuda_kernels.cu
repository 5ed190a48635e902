/* cuda_kernels.cu — the device reduction as one CUDA kernel: a grid-stride loop over
 * the elements, each read from every source in order, combined in the compute type
 * with reduce_ops.h's operators, divided (MEAN), rounded once and written to every
 * destination.  The arithmetic is reference.c's, so results are bit for bit the
 * host reference's (except the payload of a NaN that arithmetic creates: a GPU
 * produces its canonical NaN). */
#include <cuda_runtime.h>

#include "device/cuda_kernels.h"
#include "device/reduce_ops.h"

extern "C" {
#include "dtype.h"
#include "error.h"
}

namespace {

/* Overloads of the operators by compute type C. */
__device__ __forceinline__ float combine(int op, float a, float b) { return ruccl_combine_f32(op, a, b); }
__device__ __forceinline__ double combine(int op, double a, double b) { return ruccl_combine_f64(op, a, b); }
__device__ __forceinline__ int8_t combine(int op, int8_t a, int8_t b) { return ruccl_combine_i8(op, a, b); }
__device__ __forceinline__ uint8_t combine(int op, uint8_t a, uint8_t b) { return ruccl_combine_u8(op, a, b); }
__device__ __forceinline__ int32_t combine(int op, int32_t a, int32_t b) { return ruccl_combine_i32(op, a, b); }
__device__ __forceinline__ int64_t combine(int op, int64_t a, int64_t b) { return ruccl_combine_i64(op, a, b); }

__device__ __forceinline__ float divide(float a, unsigned d) { return ruccl_divide_f32(a, d); }
__device__ __forceinline__ double divide(double a, unsigned d) { return ruccl_divide_f64(a, d); }
__device__ __forceinline__ int8_t divide(int8_t a, unsigned d) { return ruccl_divide_i8(a, d); }
__device__ __forceinline__ uint8_t divide(uint8_t a, unsigned d) { return ruccl_divide_u8(a, d); }
__device__ __forceinline__ int32_t divide(int32_t a, unsigned d) { return ruccl_divide_i32(a, d); }
__device__ __forceinline__ int64_t divide(int64_t a, unsigned d) { return ruccl_divide_i64(a, d); }

/* Conversions between a storage element S and the compute type C (reference.c's
   LOAD and STORE). */
template <typename S, typename C>
struct Plain {
  __device__ __forceinline__ static C load(S s) { return (C)s; }
  __device__ __forceinline__ static S store(C c) { return (S)c; }
};
struct Half {
  __device__ __forceinline__ static float load(uint16_t s) { return ruccl_half_to_float(s); }
  __device__ __forceinline__ static uint16_t store(float c) { return ruccl_float_to_half(c); }
};
struct BFloat16 {
  __device__ __forceinline__ static float load(uint16_t s) { return ruccl_bf16_to_float(s); }
  __device__ __forceinline__ static uint16_t store(float c) { return ruccl_float_to_bf16(c); }
};

/* The struct travels by value in the kernel's parameter space (about 1 KiB);
   __grid_constant__ lets the loop index its pointer arrays without a local copy. */
template <typename S, typename C, typename Conv>
__global__ void reduce_kernel(const __grid_constant__ ruccl_device_reduce_t r, int op) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < r.count; i += stride) {
    C acc = Conv::load(((const S *)r.srcs[0])[i]);
    for (unsigned k = 1; k < r.nsrc; k++) acc = combine(op, acc, Conv::load(((const S *)r.srcs[k])[i]));
    if (r.divisor) acc = divide(acc, r.divisor);
    const S out = Conv::store(acc);
    for (unsigned d = 0; d < r.ndst; d++) ((S *)r.dsts[d])[i] = out;
  }
}

const unsigned kThreads = 256;

template <typename S, typename C, typename Conv>
cudaError_t launch(const ruccl_device_reduce_t &r, int op, cudaStream_t stream) {
  int dev = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return err;
  /* enough blocks to fill the device several times over, no more than the elements need */
  size_t want = (r.count + kThreads - 1) / kThreads, cap = (size_t)(sms > 0 ? sms : 1) * 8;
  unsigned blocks = (unsigned)(want < cap ? want : cap);
  reduce_kernel<S, C, Conv><<<blocks, kThreads, 0, stream>>>(r, op);
  return cudaGetLastError();
}

}  // namespace

extern "C" ruccl_result_t ruccl_cuda_reduce_launch(const ruccl_device_reduce_t *r, void *stream) {
  if (r->count == 0) return RUCCL_OK;
  int op = r->divisor ? RUCCL_SUM : (int)r->op;
  ruccl_dtype_t cdt = ruccl_compute_dtype(r->dtype, r->divisor ? RUCCL_MEAN : r->op);
  cudaStream_t s = (cudaStream_t)stream;
  cudaError_t err = cudaErrorInvalidValue;
  switch (r->dtype) {
    case RUCCL_FLOAT32: err = launch<float, float, Plain<float, float>>(*r, op, s); break;
    case RUCCL_FLOAT64: err = launch<double, double, Plain<double, double>>(*r, op, s); break;
    case RUCCL_FLOAT16: err = launch<uint16_t, float, Half>(*r, op, s); break;
    case RUCCL_BFLOAT16: err = launch<uint16_t, float, BFloat16>(*r, op, s); break;
    case RUCCL_INT64: err = launch<int64_t, int64_t, Plain<int64_t, int64_t>>(*r, op, s); break;
    case RUCCL_INT8:
      err = cdt == RUCCL_INT64 ? launch<int8_t, int64_t, Plain<int8_t, int64_t>>(*r, op, s)
                               : launch<int8_t, int8_t, Plain<int8_t, int8_t>>(*r, op, s);
      break;
    case RUCCL_UINT8:
      err = cdt == RUCCL_INT64 ? launch<uint8_t, int64_t, Plain<uint8_t, int64_t>>(*r, op, s)
                               : launch<uint8_t, uint8_t, Plain<uint8_t, uint8_t>>(*r, op, s);
      break;
    case RUCCL_INT32:
      err = cdt == RUCCL_INT64 ? launch<int32_t, int64_t, Plain<int32_t, int64_t>>(*r, op, s)
                               : launch<int32_t, int32_t, Plain<int32_t, int32_t>>(*r, op, s);
      break;
    default:
      return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "device reduction of dtype %d", (int)r->dtype);
  }
  if (err != cudaSuccess)
    return ruccl_fail(RUCCL_ERR_DEVICE, "reduction kernel (%s, %zu elements): %s", ruccl_dtype_name(r->dtype),
                      r->count, cudaGetErrorString(err));
  return RUCCL_OK;
}
