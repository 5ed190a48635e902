// tensors.cpp — see tensors.hpp.
#include "tensors.hpp"

#ifdef RUCCL_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace ruccl_torch {

ruccl_dtype_t dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return RUCCL_FLOAT32;
    case at::kDouble: return RUCCL_FLOAT64;
    case at::kHalf: return RUCCL_FLOAT16;
    case at::kBFloat16: return RUCCL_BFLOAT16;
    case at::kChar: return RUCCL_INT8;
    case at::kByte: return RUCCL_UINT8;
    case at::kBool: return RUCCL_UINT8; /* one byte, 0 or 1 */
    case at::kInt: return RUCCL_INT32;
    case at::kLong: return RUCCL_INT64;
    default: fail(RUCCL_ERR_UNSUPPORTED, std::string("dtype ") + c10::toString(t) + " is not supported by ruccl");
  }
}

ruccl_tensor_t view(const at::Tensor &t) {
  ruccl_tensor_t v{};
  v.data = t.data_ptr();
  v.dtype = dtype_of(t.scalar_type());
  if (t.device().is_cuda()) {
    v.device = {RUCCL_DEVICE_CUDA, static_cast<int>(t.device().index())};
  } else {
    v.device = {RUCCL_DEVICE_CPU, 0};
  }
  if (t.dim() <= RUCCL_MAX_DIMS) {
    v.ndim = static_cast<int>(t.dim());
    for (int64_t d = 0; d < t.dim(); d++) v.shape[d] = t.size(d);
  } else {
    v.ndim = 1;
    v.shape[0] = t.numel();
  }
  return v;
}

at::Device core_device(const at::Tensor &t) {
#ifdef RUCCL_TORCH_CUDA
  if (t.device().is_cuda()) return t.device();
#endif
  return at::Device(at::kCPU);
}

void settle(const at::Tensor &t) {
#ifdef RUCCL_TORCH_CUDA
  if (t.device().is_cuda()) c10::cuda::getCurrentCUDAStream(t.device().index()).synchronize();
#else
  (void)t;
#endif
}

const char *op_name(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return nullptr;
  }
}

Reduction op_of(const c10d::ReduceOp &op, at::ScalarType t) {
  dtype_of(t);
  bool boolean = t == at::kBool;
  Reduction r;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: r.op = boolean ? RUCCL_MAX : RUCCL_SUM; return r;
    case c10d::ReduceOp::PRODUCT: r.op = boolean ? RUCCL_MIN : RUCCL_PROD; return r;
    case c10d::ReduceOp::MIN: r.op = RUCCL_MIN; return r;
    case c10d::ReduceOp::MAX: r.op = RUCCL_MAX; return r;
    case c10d::ReduceOp::AVG:
      if (boolean) fail(RUCCL_ERR_UNSUPPORTED, "ReduceOp.AVG on bool tensors");
      r.op = RUCCL_MEAN;
      return r;
    case c10d::ReduceOp::BAND:
      if (boolean) { r.op = RUCCL_MIN; return r; }
      break;
    case c10d::ReduceOp::BOR:
      if (boolean) { r.op = RUCCL_MAX; return r; }
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      if (!at::isFloatingType(t))
        fail(RUCCL_ERR_UNSUPPORTED, std::string("ReduceOp.PREMUL_SUM on ") + c10::toString(t) +
                                        " tensors (it takes float32, float64, float16 and bfloat16)");
      // A PREMUL_SUM op carries this supplement (torch makes it so; ProcessGroupNCCL reads it alike).
      auto *sup = static_cast<c10d::NCCLPreMulSumSupplement *>(op.supplement_.get());
      if (!sup)
        fail(RUCCL_ERR_INVALID_ARGUMENT, "ReduceOp.PREMUL_SUM without a factor: make the op with "
                                         "torch.distributed._make_nccl_premul_sum(factor)");
      r.premul = true;
      if (sup->tensor_factor.defined()) {
        if (sup->tensor_factor.numel() != 1)
          fail(RUCCL_ERR_INVALID_ARGUMENT, "ReduceOp.PREMUL_SUM: the factor tensor has " +
                                               std::to_string(sup->tensor_factor.numel()) + " elements, not 1");
        r.factor_tensor = sup->tensor_factor;
      } else {
        r.factor = sup->double_factor;
      }
      return r;
    }
    default: break;
  }
  const char *name = op_name(op.op_);
  fail(RUCCL_ERR_UNSUPPORTED, std::string("ReduceOp.") +
                                  (name ? name : std::to_string(static_cast<int>(op.op_)).c_str()) + " on " +
                                  c10::toString(t) + " tensors (ruccl reduces with SUM, AVG, PRODUCT, MIN, MAX, "
                                  "PREMUL_SUM; BAND and BOR on bool)");
}

void need_tag(int tag) {
  if (tag == kCollectiveTag) fail(RUCCL_ERR_INVALID_ARGUMENT, "tag " + std::to_string(tag) + " is reserved by ruccl");
}

void need_one(const std::vector<at::Tensor> &tensors, const char *what) {
  if (tensors.size() != 1)
    fail(RUCCL_ERR_INVALID_ARGUMENT,
         std::string(what) + " takes one tensor per process, got " + std::to_string(tensors.size()));
}

void need_same(const at::Tensor &a, const at::Tensor &b, const std::string &what) {
  if (a.scalar_type() != b.scalar_type())
    fail(RUCCL_ERR_DTYPE_MISMATCH, what + ": " + c10::toString(a.scalar_type()) + " and " +
                                       c10::toString(b.scalar_type()));
  if (a.numel() != b.numel())
    fail(RUCCL_ERR_SHAPE_MISMATCH,
         what + ": " + std::to_string(a.numel()) + " and " + std::to_string(b.numel()) + " elements");
}

std::vector<at::Tensor> split_rows(const at::Tensor &t, const std::vector<int64_t> &sizes, int n,
                                   const char *what) {
  std::vector<at::Tensor> out;
  if (sizes.empty()) {
    if (t.dim() == 0 || t.size(0) % n != 0)
      fail(RUCCL_ERR_INVALID_ARGUMENT, std::string(what) + ": dim 0 does not split into " + std::to_string(n) +
                                           " equal blocks");
    int64_t rows = t.size(0) / n;
    for (int k = 0; k < n; k++) out.push_back(t.narrow(0, k * rows, rows));
    return out;
  }
  if (static_cast<int>(sizes.size()) != n)
    fail(RUCCL_ERR_INVALID_ARGUMENT, std::string(what) + ": " + std::to_string(sizes.size()) +
                                         " split sizes for " + std::to_string(n) + " ranks");
  int64_t at_row = 0;
  for (int64_t s : sizes) {
    if (s < 0 || at_row + s > (t.dim() ? t.size(0) : 0))
      fail(RUCCL_ERR_INVALID_ARGUMENT, std::string(what) + ": split sizes exceed dim 0");
    out.push_back(t.narrow(0, at_row, s));
    at_row += s;
  }
  if (t.dim() && at_row != t.size(0))
    fail(RUCCL_ERR_INVALID_ARGUMENT, std::string(what) + ": split sizes do not add up to dim 0");
  return out;
}

void check_gather_base(const at::Tensor &output, const at::Tensor &input, int size) {
  dtype_of(input.scalar_type());
  if (input.scalar_type() != output.scalar_type())
    fail(RUCCL_ERR_DTYPE_MISMATCH, "all_gather_into_tensor: input and output dtypes differ");
  if (output.numel() != input.numel() * size)
    fail(RUCCL_ERR_SHAPE_MISMATCH, "all_gather_into_tensor: output has " + std::to_string(output.numel()) +
                                       " elements, world size x input " + std::to_string(input.numel() * size));
}

Reduction check_scatter_base(const at::Tensor &output, const at::Tensor &input, const c10d::ReduceOp &op,
                                     int size) {
  Reduction rop = op_of(op, input.scalar_type());
  if (input.scalar_type() != output.scalar_type())
    fail(RUCCL_ERR_DTYPE_MISMATCH, "reduce_scatter_tensor: input and output dtypes differ");
  if (input.numel() != output.numel() * size)
    fail(RUCCL_ERR_SHAPE_MISMATCH, "reduce_scatter_tensor: input has " + std::to_string(input.numel()) +
                                       " elements, world size x output " + std::to_string(output.numel() * size));
  return rop;
}

}  // namespace ruccl_torch
