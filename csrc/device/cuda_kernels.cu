/* cuda_kernels.cu — the device reduction as one CUDA kernel: a grid-stride loop over
 * the elements, each read from every source in order, combined in the compute type
 * with reduce_ops.h's operators, divided (MEAN), rounded once and written to every
 * destination (16 bytes at a time from each buffer where all are 16-byte aligned,
 * else element by element).  The arithmetic is reference.c's, so results are bit for bit the
 * host reference's (except the sign and payload of a NaN that arithmetic creates: a
 * GPU produces its canonical NaN).  The same element code also runs on the host
 * (ruccl_cuda_reduce_on_host), so that a machine without a GPU still tests it. */
#include <cuda_runtime.h>

#include "device/cuda_kernels.h"
#include "device/reduce_ops.h"

extern "C" {
#include "dtype.h"
#include "error.h"
}

namespace {

/* Overloads of the operators by compute type C (RUCCL_HD: host and device code). */
RUCCL_HD float combine(int op, float a, float b) { return ruccl_combine_f32(op, a, b); }
RUCCL_HD double combine(int op, double a, double b) { return ruccl_combine_f64(op, a, b); }
RUCCL_HD int8_t combine(int op, int8_t a, int8_t b) { return ruccl_combine_i8(op, a, b); }
RUCCL_HD uint8_t combine(int op, uint8_t a, uint8_t b) { return ruccl_combine_u8(op, a, b); }
RUCCL_HD int32_t combine(int op, int32_t a, int32_t b) { return ruccl_combine_i32(op, a, b); }
RUCCL_HD int64_t combine(int op, int64_t a, int64_t b) { return ruccl_combine_i64(op, a, b); }

RUCCL_HD float divide(float a, unsigned d) { return ruccl_divide_f32(a, d); }
RUCCL_HD double divide(double a, unsigned d) { return ruccl_divide_f64(a, d); }
RUCCL_HD int8_t divide(int8_t a, unsigned d) { return ruccl_divide_i8(a, d); }
RUCCL_HD uint8_t divide(uint8_t a, unsigned d) { return ruccl_divide_u8(a, d); }
RUCCL_HD int32_t divide(int32_t a, unsigned d) { return ruccl_divide_i32(a, d); }
RUCCL_HD int64_t divide(int64_t a, unsigned d) { return ruccl_divide_i64(a, d); }

/* Conversions between a storage element S and the compute type C (reference.c's
   LOAD and STORE). */
template <typename S, typename C>
struct Plain {
  RUCCL_HD static C load(S s) { return (C)s; }
  RUCCL_HD static S store(C c) { return (S)c; }
};
struct Half {
  RUCCL_HD static float load(uint16_t s) { return ruccl_half_to_float(s); }
  RUCCL_HD static uint16_t store(float c) { return ruccl_float_to_half(c); }
};
struct BFloat16 {
  RUCCL_HD static float load(uint16_t s) { return ruccl_bf16_to_float(s); }
  RUCCL_HD static uint16_t store(float c) { return ruccl_float_to_bf16(c); }
};

/* Elements begin, begin + stride, ... of r: the body of the kernel (and of its run
   on the host, ruccl_cuda_reduce_on_host). */
template <typename S, typename C, typename Conv>
RUCCL_HD void reduce_elements(const ruccl_device_reduce_t &r, int op, size_t begin, size_t stride) {
  for (size_t i = begin; i < r.count; i += stride) {
    C acc = Conv::load(((const S *)r.srcs[0])[i]);
    for (unsigned k = 1; k < r.nsrc; k++) acc = combine(op, acc, Conv::load(((const S *)r.srcs[k])[i]));
    if (r.divisor) acc = divide(acc, r.divisor);
    const S out = Conv::store(acc);
    for (unsigned d = 0; d < r.ndst; d++) ((S *)r.dsts[d])[i] = out;
  }
}

/* Elements of storage type S in one 16-byte pack. */
template <typename S>
constexpr unsigned kLanes = sizeof(uint4) / sizeof(S);

/* Packs begin, begin + stride, ... of 16 bytes (kLanes<S> elements) of r, every buffer
   16-byte aligned: the same arithmetic as reduce_elements, element by element, with
   one 16-byte load per source and one 16-byte store per destination, so that four
   times the bytes are in flight per instruction.  The loop over the sources is
   unrolled by four, so that their loads are issued together. */
template <typename S, typename C, typename Conv>
RUCCL_HD void reduce_packs(const ruccl_device_reduce_t &r, int op, size_t begin, size_t stride, size_t npacks) {
  constexpr unsigned lanes = kLanes<S>;
  for (size_t p = begin; p < npacks; p += stride) {
    union Pack {
      uint4 raw;
      S e[lanes];
    } in, out;
    C acc[lanes];
    in.raw = ((const uint4 *)r.srcs[0])[p];
    for (unsigned v = 0; v < lanes; v++) acc[v] = Conv::load(in.e[v]);
#ifdef __CUDA_ARCH__ /* the host compiler's pass knows no such pragma */
#pragma unroll 4
#endif
    for (unsigned k = 1; k < r.nsrc; k++) {
      in.raw = ((const uint4 *)r.srcs[k])[p];
      for (unsigned v = 0; v < lanes; v++) acc[v] = combine(op, acc[v], Conv::load(in.e[v]));
    }
    for (unsigned v = 0; v < lanes; v++) out.e[v] = Conv::store(r.divisor ? divide(acc[v], r.divisor) : acc[v]);
    for (unsigned d = 0; d < r.ndst; d++) ((uint4 *)r.dsts[d])[p] = out.raw;
  }
}

/* Whether every buffer of r is 16-byte aligned (the packed kernel's condition). */
bool aligned16(const ruccl_device_reduce_t &r) {
  uintptr_t bits = 0;
  for (unsigned k = 0; k < r.nsrc; k++) bits |= (uintptr_t)r.srcs[k];
  for (unsigned d = 0; d < r.ndst; d++) bits |= (uintptr_t)r.dsts[d];
  return (bits & 15) == 0;
}

/* The struct travels by value in the kernel's parameter space (about 1 KiB);
   __grid_constant__ lets the loop index its pointer arrays without a local copy. */
template <typename S, typename C, typename Conv>
__global__ void reduce_kernel(const __grid_constant__ ruccl_device_reduce_t r, int op) {
  reduce_elements<S, C, Conv>(r, op, (size_t)blockIdx.x * blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x);
}

/* The packed kernel: the whole packs, then the elements after them (fewer than one
   pack) one by one. */
template <typename S, typename C, typename Conv>
__global__ void reduce_packed_kernel(const __grid_constant__ ruccl_device_reduce_t r, int op) {
  const size_t npacks = r.count / kLanes<S>, first = (size_t)blockIdx.x * blockDim.x + threadIdx.x,
               stride = (size_t)gridDim.x * blockDim.x;
  reduce_packs<S, C, Conv>(r, op, first, stride, npacks);
  reduce_elements<S, C, Conv>(r, op, npacks * kLanes<S> + first, stride);
}

const unsigned kThreads = 256;

template <typename S, typename C, typename Conv>
cudaError_t launch(const ruccl_device_reduce_t &r, int op, cudaStream_t stream) {
  int dev = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return err;
  /* enough blocks to fill the device several times over, no more than the packs (or
     elements) need */
  const bool packed = aligned16(r);
  const size_t items = packed ? (r.count + kLanes<S> - 1) / kLanes<S> : r.count;
  size_t want = (items + kThreads - 1) / kThreads, cap = (size_t)(sms > 0 ? sms : 1) * 8;
  unsigned blocks = (unsigned)(want < cap ? want : cap);
  if (packed)
    reduce_packed_kernel<S, C, Conv><<<blocks, kThreads, 0, stream>>>(r, op);
  else
    reduce_kernel<S, C, Conv><<<blocks, kThreads, 0, stream>>>(r, op);
  return cudaGetLastError();
}

/* The storage type S, compute type C and conversions Conv of a reduction. */
template <typename S, typename C, typename Conv>
struct Types {
  using storage = S;
  using compute = C;
  using conv = Conv;
};

/* Calls f(Types<...>()) for r's dtype and compute dtype (reference.c's switch);
   false for a dtype that is not a ruccl_dtype_t. */
template <typename F>
bool dispatch(const ruccl_device_reduce_t &r, F &&f) {
  bool wide = ruccl_compute_dtype(r.dtype, r.divisor ? RUCCL_MEAN : r.op) == RUCCL_INT64;
  switch (r.dtype) {
    case RUCCL_FLOAT32: f(Types<float, float, Plain<float, float>>()); return true;
    case RUCCL_FLOAT64: f(Types<double, double, Plain<double, double>>()); return true;
    case RUCCL_FLOAT16: f(Types<uint16_t, float, Half>()); return true;
    case RUCCL_BFLOAT16: f(Types<uint16_t, float, BFloat16>()); return true;
    case RUCCL_INT64: f(Types<int64_t, int64_t, Plain<int64_t, int64_t>>()); return true;
    case RUCCL_INT8:
      if (wide) f(Types<int8_t, int64_t, Plain<int8_t, int64_t>>());
      else f(Types<int8_t, int8_t, Plain<int8_t, int8_t>>());
      return true;
    case RUCCL_UINT8:
      if (wide) f(Types<uint8_t, int64_t, Plain<uint8_t, int64_t>>());
      else f(Types<uint8_t, uint8_t, Plain<uint8_t, uint8_t>>());
      return true;
    case RUCCL_INT32:
      if (wide) f(Types<int32_t, int64_t, Plain<int32_t, int64_t>>());
      else f(Types<int32_t, int32_t, Plain<int32_t, int32_t>>());
      return true;
  }
  return false;
}

/* The operator the elements are combined with: MEAN is SUM, then the divisor. */
int combining_op(const ruccl_device_reduce_t &r) { return r.divisor ? RUCCL_SUM : (int)r.op; }

}  // namespace

extern "C" ruccl_result_t ruccl_cuda_reduce_launch(const ruccl_device_reduce_t *r, void *stream) {
  if (r->count == 0) return RUCCL_OK;
  cudaError_t err = cudaSuccess;
  bool known = dispatch(*r, [&](auto types) {
    using T = decltype(types);
    err = launch<typename T::storage, typename T::compute, typename T::conv>(*r, combining_op(*r),
                                                                             (cudaStream_t)stream);
  });
  if (!known) return ruccl_fail(RUCCL_ERR_INVALID_ARGUMENT, "device reduction of dtype %d", (int)r->dtype);
  if (err != cudaSuccess)
    return ruccl_fail(RUCCL_ERR_DEVICE, "reduction kernel (%s, %zu elements): %s", ruccl_dtype_name(r->dtype),
                      r->count, cudaGetErrorString(err));
  return RUCCL_OK;
}

extern "C" void ruccl_cuda_reduce_on_host(const ruccl_device_reduce_t *r) {
  dispatch(*r, [&](auto types) {
    using T = decltype(types);
    using S = typename T::storage;
    const size_t npacks = aligned16(*r) ? r->count / kLanes<S> : 0;
    reduce_packs<S, typename T::compute, typename T::conv>(*r, combining_op(*r), 0, 1, npacks);
    reduce_elements<S, typename T::compute, typename T::conv>(*r, combining_op(*r), npacks * kLanes<S>, 1);
  });
}
