/* dtype.c — element types, float16/bfloat16 conversion (round to nearest even), and
   the reduction kernels.  The kernels are plain loops over one type each, written so
   that the compiler vectorizes them (-O3); integer SUM and PROD wrap, computed in
   the unsigned type so that overflow is defined. */
#include "dtype.h"

#include <string.h>

#include "device/reduce_ops.h"

size_t ruccl_dtype_size(ruccl_dtype_t dt) {
  switch (dt) {
    case RUCCL_FLOAT32: return 4;
    case RUCCL_FLOAT64: return 8;
    case RUCCL_FLOAT16: return 2;
    case RUCCL_BFLOAT16: return 2;
    case RUCCL_INT8: return 1;
    case RUCCL_UINT8: return 1;
    case RUCCL_INT32: return 4;
    case RUCCL_INT64: return 8;
  }
  return 0;
}

int ruccl_dtype_valid(ruccl_dtype_t dt) { return ruccl_dtype_size(dt) != 0; }

const char *ruccl_dtype_name(ruccl_dtype_t dt) {
  static const char *const names[RUCCL_NUM_DTYPES] = {"float32", "float64", "float16", "bfloat16",
                                                      "int8",    "uint8",   "int32",   "int64"};
  return ruccl_dtype_valid(dt) ? names[dt] : "unknown";
}

const char *ruccl_op_name(ruccl_reduce_op_t op) {
  static const char *const names[RUCCL_NUM_REDUCE_OPS] = {"sum", "mean", "min", "max", "prod"};
  return (unsigned)op < RUCCL_NUM_REDUCE_OPS ? names[op] : "unknown";
}

ruccl_dtype_t ruccl_compute_dtype(ruccl_dtype_t dt, ruccl_reduce_op_t op) {
  if (dt == RUCCL_FLOAT16 || dt == RUCCL_BFLOAT16) return RUCCL_FLOAT32;
  if (op == RUCCL_MEAN && (dt == RUCCL_INT8 || dt == RUCCL_UINT8 || dt == RUCCL_INT32)) return RUCCL_INT64;
  return dt;
}

#define WIDEN(T)                                      \
  do {                                                \
    const T *s = src;                                 \
    int64_t *d = dst;                                 \
    for (size_t i = 0; i < count; i++) d[i] = s[i];   \
  } while (0)
#define NARROW(T)                                     \
  do {                                                \
    const int64_t *s = src;                           \
    T *d = dst;                                       \
    for (size_t i = 0; i < count; i++) d[i] = (T)s[i]; \
  } while (0)

void ruccl_to_compute(const void *src, ruccl_dtype_t dt, void *dst, ruccl_dtype_t cdt, size_t count) {
  if (dt == cdt) {
    if (src != dst && count) memcpy(dst, src, count * ruccl_dtype_size(dt));
  } else if (dt == RUCCL_FLOAT16) {
    const uint16_t *s = src;
    float *d = dst;
    for (size_t i = 0; i < count; i++) d[i] = ruccl_half_to_float(s[i]);
  } else if (dt == RUCCL_BFLOAT16) {
    const uint16_t *s = src;
    float *d = dst;
    for (size_t i = 0; i < count; i++) d[i] = ruccl_bf16_to_float(s[i]);
  } else if (dt == RUCCL_INT8) {
    WIDEN(int8_t);
  } else if (dt == RUCCL_UINT8) {
    WIDEN(uint8_t);
  } else if (dt == RUCCL_INT32) {
    WIDEN(int32_t);
  }
}

/* Narrowing a MEAN is exact: the mean of in-range values is in range. */
void ruccl_from_compute(const void *src, ruccl_dtype_t cdt, void *dst, ruccl_dtype_t dt, size_t count) {
  if (dt == cdt) {
    if (src != dst && count) memcpy(dst, src, count * ruccl_dtype_size(dt));
  } else if (dt == RUCCL_FLOAT16) {
    const float *s = src;
    uint16_t *d = dst;
    for (size_t i = 0; i < count; i++) d[i] = ruccl_float_to_half(s[i]);
  } else if (dt == RUCCL_BFLOAT16) {
    const float *s = src;
    uint16_t *d = dst;
    for (size_t i = 0; i < count; i++) d[i] = ruccl_float_to_bf16(s[i]);
  } else if (dt == RUCCL_INT8) {
    NARROW(int8_t);
  } else if (dt == RUCCL_UINT8) {
    NARROW(uint8_t);
  } else if (dt == RUCCL_INT32) {
    NARROW(int32_t);
  }
}

#define LOOP(T, EXPR)                                     \
  do {                                                    \
    T *d = (T *)dst;                                      \
    const T *x = (const T *)a, *y = (const T *)b;         \
    for (size_t i = 0; i < count; i++) {                  \
      T av = x[i], bv = y[i];                             \
      d[i] = (T)(EXPR);                                   \
    }                                                     \
  } while (0)

#define FLOAT_KERNEL(T)                                          \
  switch (op) {                                                  \
    case RUCCL_PROD: LOOP(T, av * bv); break;                    \
    case RUCCL_MIN: LOOP(T, RUCCL_FMIN(av, bv)); break;                \
    case RUCCL_MAX: LOOP(T, RUCCL_FMAX(av, bv)); break;                \
    default: LOOP(T, av + bv); break;                            \
  }

/* U is the unsigned type of T's width: wrapping SUM and PROD. */
#define INT_KERNEL(T, U)                                         \
  switch (op) {                                                  \
    case RUCCL_PROD: LOOP(T, RUCCL_WRAP_MUL(T, U, av, bv)); break;         \
    case RUCCL_MIN: LOOP(T, RUCCL_IMIN(av, bv)); break;                \
    case RUCCL_MAX: LOOP(T, RUCCL_IMAX(av, bv)); break;                \
    default: LOOP(T, RUCCL_WRAP_ADD(T, U, av, bv)); break;                 \
  }

void ruccl_reduce_kernel(void *dst, const void *a, const void *b, size_t count, ruccl_dtype_t dt,
                         ruccl_reduce_op_t op, unsigned divisor) {
  switch (dt) {
    case RUCCL_FLOAT32: FLOAT_KERNEL(float); break;
    case RUCCL_FLOAT64: FLOAT_KERNEL(double); break;
    case RUCCL_INT8: INT_KERNEL(int8_t, uint8_t); break;
    case RUCCL_UINT8: INT_KERNEL(uint8_t, uint8_t); break;
    case RUCCL_INT32: INT_KERNEL(int32_t, uint32_t); break;
    case RUCCL_INT64: INT_KERNEL(int64_t, uint64_t); break;
    default: return; /* half types never reach the kernels: they compute in float32 */
  }
  if (divisor > 1) ruccl_divide_kernel(dst, dst, count, dt, divisor);
}

#define DIVIDE(T, DIV)                                    \
  do {                                                    \
    T *d = (T *)dst;                                      \
    const T *s = (const T *)src;                          \
    for (size_t i = 0; i < count; i++) d[i] = (T)(s[i] / (DIV)); \
  } while (0)

void ruccl_divide_kernel(void *dst, const void *src, size_t count, ruccl_dtype_t dt, unsigned divisor) {
  switch (dt) {
    case RUCCL_FLOAT32: DIVIDE(float, (float)divisor); break;
    case RUCCL_FLOAT64: DIVIDE(double, (double)divisor); break;
    case RUCCL_INT8: DIVIDE(int8_t, (int)divisor); break;
    case RUCCL_UINT8: DIVIDE(uint8_t, (unsigned)divisor); break;
    case RUCCL_INT32: DIVIDE(int32_t, (int64_t)divisor); break;
    case RUCCL_INT64: DIVIDE(int64_t, (int64_t)divisor); break;
    default: break;
  }
}
