/* dtype.h — element types: sizes, the type reductions run in, half-precision
   conversion, and the elementwise reduction kernels. */
#ifndef RUCCL_DTYPE_H
#define RUCCL_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "ruccl.h"

int ruccl_dtype_valid(ruccl_dtype_t dt);
const char *ruccl_dtype_name(ruccl_dtype_t dt);
const char *ruccl_op_name(ruccl_reduce_op_t op);

/* The dtype a reduction runs in: FLOAT16 and BFLOAT16 accumulate in FLOAT32 and
   round once at the end; MEAN of the narrow integers accumulates in INT64, so that
   the mean of in-range values is right even where their sum would not fit. */
ruccl_dtype_t ruccl_compute_dtype(ruccl_dtype_t dt, ruccl_reduce_op_t op);

/* Converts count elements from a storage dtype to its compute dtype and back
   (a plain copy where they are the same type). */
void ruccl_to_compute(const void *src, ruccl_dtype_t dt, void *dst, ruccl_dtype_t cdt, size_t count);
void ruccl_from_compute(const void *src, ruccl_dtype_t cdt, void *dst, ruccl_dtype_t dt, size_t count);

/* dst[i] = a[i] op b[i], then divided by `divisor` when it is non-zero (MEAN's last
   step).  op is SUM, MIN, MAX or PROD; dt is a compute dtype.  dst may be a or b
   (the same address), never a partial overlap. */
void ruccl_reduce_kernel(void *dst, const void *a, const void *b, size_t count, ruccl_dtype_t dt,
                         ruccl_reduce_op_t op, unsigned divisor);
/* dst[i] = src[i] / divisor, in place allowed. */
void ruccl_divide_kernel(void *dst, const void *src, size_t count, ruccl_dtype_t dt, unsigned divisor);

#endif
