/* reduce_ops.h — the element arithmetic of every reduction, in one place: the host
 * kernels (dtype.c), the host reference (reference.c) and the CUDA kernels
 * (cuda_kernels.cu) all compute with these functions, so a result does not depend
 * on which of them ran.
 *
 * Rules: NaN propagates through MIN and MAX (as in torch); integer SUM and PROD wrap
 * (computed in the unsigned type of the same width); float16 and bfloat16 widen to
 * float32, and a result is rounded back once, to nearest even; MEAN divides the sum
 * (integers truncate toward zero). */
#ifndef RUCCL_REDUCE_OPS_H
#define RUCCL_REDUCE_OPS_H

#include <stdint.h>
#include <string.h>

#include "ruccl.h"

#ifdef __CUDACC__
#define RUCCL_HD __host__ __device__ __forceinline__
#else
#define RUCCL_HD static inline
#endif

/* The binary operators (a is the running value, b the next one). */
#define RUCCL_FMIN(a, b) ((b) != (b) ? (b) : ((b) < (a) ? (b) : (a)))
#define RUCCL_FMAX(a, b) ((b) != (b) ? (b) : ((b) > (a) ? (b) : (a)))
#define RUCCL_IMIN(a, b) ((b) < (a) ? (b) : (a))
#define RUCCL_IMAX(a, b) ((b) > (a) ? (b) : (a))
#define RUCCL_WRAP_ADD(T, U, a, b) ((T)(U)((U)(a) + (U)(b)))
#define RUCCL_WRAP_MUL(T, U, a, b) ((T)(U)((U)(a) * (U)(b)))

RUCCL_HD uint32_t ruccl_float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

RUCCL_HD float ruccl_bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

RUCCL_HD float ruccl_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return ruccl_bits_float(sign | 0x7f800000u | (mant << 13)); /* inf, nan */
  if (exp != 0) return ruccl_bits_float(sign | ((exp + 112) << 23) | (mant << 13));
  /* zero or subnormal: mant * 2^-24 is exact in float */
  float v = (float)mant * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

RUCCL_HD uint16_t ruccl_float_to_half(float f) {
  uint32_t u = ruccl_float_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) /* inf or nan (keep nan quiet and non-zero) */
    return (uint16_t)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0));
  if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
  if (abs < 0x38800000u) {                                   /* below 2^-14: subnormal or zero */
    if (abs < 0x33000000u) return sign;                      /* below 2^-25: rounds to zero */
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp; /* 14..24 */
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1); /* round to nearest even on the 13 dropped bits */
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

RUCCL_HD float ruccl_bf16_to_float(uint16_t h) { return ruccl_bits_float((uint32_t)h << 16); }

RUCCL_HD uint16_t ruccl_float_to_bf16(float f) {
  uint32_t u = ruccl_float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet nan */
  u += 0x7fffu + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

/* ruccl_combine_<c>(op, a, b) and ruccl_divide_<c>(a, divisor) for each compute
   type c: f32, f64, i64 (and i8, u8, i32, which reduce in their own type except
   for MEAN, which accumulates in i64). */
#define RUCCL_FLOAT_OPS(NAME, T)                                                  \
  RUCCL_HD T ruccl_combine_##NAME(int op, T a, T b) {                             \
    switch (op) {                                                                 \
      case RUCCL_PROD: return a * b;                                              \
      case RUCCL_MIN: return RUCCL_FMIN(a, b);                                    \
      case RUCCL_MAX: return RUCCL_FMAX(a, b);                                    \
      default: return a + b;                                                      \
    }                                                                             \
  }                                                                               \
  RUCCL_HD T ruccl_divide_##NAME(T a, unsigned divisor) { return a / (T)divisor; }

#define RUCCL_INT_OPS(NAME, T, U)                                                 \
  RUCCL_HD T ruccl_combine_##NAME(int op, T a, T b) {                             \
    switch (op) {                                                                 \
      case RUCCL_PROD: return RUCCL_WRAP_MUL(T, U, a, b);                         \
      case RUCCL_MIN: return RUCCL_IMIN(a, b);                                    \
      case RUCCL_MAX: return RUCCL_IMAX(a, b);                                    \
      default: return RUCCL_WRAP_ADD(T, U, a, b);                                 \
    }                                                                             \
  }                                                                               \
  RUCCL_HD T ruccl_divide_##NAME(T a, unsigned divisor) { return (T)(a / (int64_t)divisor); }

RUCCL_FLOAT_OPS(f32, float)
RUCCL_FLOAT_OPS(f64, double)
RUCCL_INT_OPS(i8, int8_t, uint8_t)
RUCCL_INT_OPS(u8, uint8_t, uint8_t)
RUCCL_INT_OPS(i32, int32_t, uint32_t)
RUCCL_INT_OPS(i64, int64_t, uint64_t)

#endif
