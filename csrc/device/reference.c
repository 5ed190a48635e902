/* reference.c — a device reduction computed on the host, element by element,
 * with the operator code the CUDA kernels use (reduce_ops.h). */
#include "device.h"

#include "device/reduce_ops.h"
#include "dtype.h"

/* LOAD and STORE convert between a storage element and the compute type C. */
#define REFERENCE(S, C, NAME, LOAD, STORE)                                         \
  do {                                                                            \
    for (size_t i = 0; i < r->count; i++) {                                       \
      C acc = LOAD(((const S *)r->srcs[0])[i]);                                   \
      for (unsigned k = 1; k < r->nsrc; k++)                                      \
        acc = ruccl_combine_##NAME(op, acc, LOAD(((const S *)r->srcs[k])[i]));    \
      if (r->divisor) acc = ruccl_divide_##NAME(acc, r->divisor);                 \
      for (unsigned d = 0; d < r->ndst; d++) ((S *)r->dsts[d])[i] = STORE(acc);   \
    }                                                                             \
  } while (0)
#define SAME(x) (x)

void ruccl_reduce_reference(const ruccl_device_reduce_t *r) {
  int op = r->divisor ? RUCCL_SUM : (int)r->op;
  ruccl_dtype_t cdt = ruccl_compute_dtype(r->dtype, r->divisor ? RUCCL_MEAN : r->op);
  switch (r->dtype) {
    case RUCCL_FLOAT32: REFERENCE(float, float, f32, SAME, SAME); break;
    case RUCCL_FLOAT64: REFERENCE(double, double, f64, SAME, SAME); break;
    case RUCCL_FLOAT16: REFERENCE(uint16_t, float, f32, ruccl_half_to_float, ruccl_float_to_half); break;
    case RUCCL_BFLOAT16: REFERENCE(uint16_t, float, f32, ruccl_bf16_to_float, ruccl_float_to_bf16); break;
    case RUCCL_INT64: REFERENCE(int64_t, int64_t, i64, SAME, SAME); break;
#define NARROW_INT(S, NAME)                                                   \
  if (cdt == RUCCL_INT64) REFERENCE(S, int64_t, i64, (int64_t), (S));         \
  else REFERENCE(S, S, NAME, SAME, SAME);                                     \
  break;
    case RUCCL_INT8: NARROW_INT(int8_t, i8)
    case RUCCL_UINT8: NARROW_INT(uint8_t, u8)
    case RUCCL_INT32: NARROW_INT(int32_t, i32)
#undef NARROW_INT
  }
}
