// tensors.hpp — what the shim hands the core: C views of tensors, staged copies of
// the tensors the core cannot take as they are, torch's reduce ops as the core's, and
// the argument checks every c10d call makes before anything is queued.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "errors.hpp"

namespace ruccl_torch {

// The core's dtype of a torch dtype (bool travels as uint8); RUCCL_ERR_UNSUPPORTED else.
ruccl_dtype_t dtype_of(at::ScalarType t);
// The C view of a contiguous tensor the core takes (more than RUCCL_MAX_DIMS
// dimensions are flattened: the element count is what the ranks must then agree on).
ruccl_tensor_t view(const at::Tensor &t);
// Where the core reads and writes a tensor of this device: on the device itself
// (the CPU; a CUDA GPU when the extension, and with it the core, is built with CUDA),
// else in host memory.
at::Device core_device(const at::Tensor &t);
// Waits, on the host, for the device work queued on t's device's current stream (the
// job's side stream): the core copies on a stream of its own, so what the shim
// queued for it must be done before it reads.  Nothing for host tensors.
void settle(const at::Tensor &t);

// A tensor as the core can take it: itself when it is contiguous and on a device the
// core takes, else a contiguous copy (on the tensor's device when the core takes
// it there, else on the host) that put() writes back.  Made on the worker, when the
// op runs, so that it sees what earlier queued ops wrote.
struct Staged {
  at::Tensor user, buf;
  explicit Staged(const at::Tensor &t, bool fill = true) : user(t) {
    at::Device dev = core_device(t);
    if (t.device() == dev && t.is_contiguous()) {
      buf = t;
    } else if (fill) {
      buf = t.to(dev).contiguous();
      settle(buf);
    } else {
      buf = at::empty(t.sizes(), t.options().device(dev));
    }
  }
  void put() {
    if (!buf.is_same(user)) user.copy_(buf);
  }
};

// A c10d reduce op as the core runs it.  PREMUL_SUM(f) is a SUM of each rank's input
// multiplied by its own factor f first: the core's rounding rule, so fp16 and bf16 are
// widened to float32 before the multiply, summed wide, and rounded once when the result
// is written back; float32 and float64 multiply and sum in their own width.  The factor
// is a double or a one-element tensor, which may live on the device (it is applied there,
// with no copy to the host).
struct Reduction {
  ruccl_reduce_op_t op = RUCCL_SUM;
  bool premul = false;
  double factor = 1.0;
  at::Tensor factor_tensor;  // defined: the factor is this tensor's one element

  // What the core reduces: buf itself, or (PREMUL_SUM) a new tensor, buf widened and
  // multiplied, settled for the core to read.
  at::Tensor operand(const at::Tensor &buf) const {
    if (!premul) return buf;
    at::ScalarType wide = buf.scalar_type() == at::kHalf || buf.scalar_type() == at::kBFloat16
                              ? at::kFloat : buf.scalar_type();
    at::Tensor x = buf.to(wide);
    x = factor_tensor.defined() ? at::mul(x, factor_tensor.to(x.device(), wide)) : at::mul(x, factor);
    settle(x);
    return x;
  }
  // Writes the core's result back into buf (rounding once), where operand made a copy.
  void result(const at::Tensor &x, const at::Tensor &buf) const {
    if (!x.is_same(buf)) buf.copy_(x);
  }
};

// torch's name of a reduce op ("SUM", "PREMUL_SUM"...), or null for an unknown one.
const char *op_name(c10d::ReduceOp::RedOpType op);
// torch's reduce op as the core's, for this dtype (bool: or is max, and is min).
Reduction op_of(const c10d::ReduceOp &op, at::ScalarType t);

// The tag of the point-to-point messages that gather, scatter and all-to-all are
// made of: apart from every tag a caller may use.
constexpr int32_t kCollectiveTag = INT32_MIN;

void need_tag(int tag);                                                   // not kCollectiveTag
void need_one(const std::vector<at::Tensor> &tensors, const char *what);  // one tensor per process
void need_same(const at::Tensor &a, const at::Tensor &b, const std::string &what);  // dtype and numel
// Contiguous row blocks of t along dim 0, of the given sizes (empty: equal blocks).
std::vector<at::Tensor> split_rows(const at::Tensor &t, const std::vector<int64_t> &sizes, int n,
                                   const char *what);
void check_gather_base(const at::Tensor &output, const at::Tensor &input, int size);
Reduction check_scatter_base(const at::Tensor &output, const at::Tensor &input, const c10d::ReduceOp &op,
                             int size);

}  // namespace ruccl_torch
