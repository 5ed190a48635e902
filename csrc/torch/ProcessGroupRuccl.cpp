// ProcessGroupRuccl.cpp — see ProcessGroupRuccl.hpp.  Layout: errors and tensor
// views; the store adapter; streams (CUDA ordering); Work; the backend's queue; the
// collectives.
#include "ProcessGroupRuccl.hpp"

#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <openssl/crypto.h>

#ifdef RUCCL_TORCH_CUDA
// c10's CUDA headers only (ATen/cuda/* pulls in cuBLAS and cuSPARSE headers).
#include <c10/core/Event.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cstring>
#include <mutex>
#include <random>
#include <stdexcept>

namespace ruccl_torch {
namespace {

// ---- errors: every message starts with the ruCCL error's name ----------------------

[[noreturn]] void fail(ruccl_result_t rc, const std::string &detail) {
  throw std::runtime_error(std::string(ruccl_error_string(rc)) + ": " + detail);
}

void check(ruccl_result_t rc) {
  if (rc == RUCCL_OK) return;
  const char *why = ruccl_last_error();
  throw std::runtime_error(why && *why ? std::string(why) : std::string(ruccl_error_string(rc)));
}

// ---- tensors ---------------------------------------------------------------------

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

// The C view of a contiguous tensor the core takes (more than RUCCL_MAX_DIMS
// dimensions are flattened: the element count is what the ranks must then agree on).
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

// Where the core reads and writes a tensor of this device: on the device itself
// (the CPU; a CUDA GPU when the extension, and with it the core, is built with CUDA),
// else in host memory.
at::Device core_device(const at::Tensor &t) {
#ifdef RUCCL_TORCH_CUDA
  if (t.device().is_cuda()) return t.device();
#endif
  return at::Device(at::kCPU);
}

// Waits, on the host, for the device work queued on t's device's current stream (the
// job's side stream): the core copies on a stream of its own, so what the shim
// queued for it must be done before it reads.  Nothing for host tensors.
void settle(const at::Tensor &t) {
#ifdef RUCCL_TORCH_CUDA
  if (t.device().is_cuda()) c10::cuda::getCurrentCUDAStream(t.device().index()).synchronize();
#else
  (void)t;
#endif
}

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

// torch's reduce op as the core's, for this dtype (bool: or is max, and is min).
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

// The tag of the point-to-point messages that gather, scatter and all-to-all are
// made of: apart from every tag a caller may use.
constexpr int32_t kCollectiveTag = INT32_MIN;

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

// Contiguous row blocks of t along dim 0, of the given sizes (empty: equal blocks).
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

// ---- the store adapter: torch's c10d::Store behind ruccl_store_t -------------------

ruccl_result_t store_set(void *ctx, const char *key, const void *value, size_t len) {
  try {
    auto *store = static_cast<c10d::Store *>(ctx);
    const auto *p = static_cast<const uint8_t *>(value);
    store->set(key, std::vector<uint8_t>(p, p + len));
    return RUCCL_OK;
  } catch (const std::exception &) {
    return RUCCL_ERR_IO;
  }
}

ruccl_result_t store_get(void *ctx, const char *key, void *value, size_t cap, size_t *len, int64_t timeout_ms) {
  auto *store = static_cast<c10d::Store *>(ctx);
  try {
    store->wait({key}, std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 1)));
  } catch (const std::exception &) {
    return RUCCL_ERR_TIMEOUT;
  }
  try {
    std::vector<uint8_t> v = store->get(key);
    *len = v.size();
    std::memcpy(value, v.data(), std::min(cap, v.size()));
    return RUCCL_OK;
  } catch (const std::exception &) {
    return RUCCL_ERR_IO;
  }
}

ruccl_result_t store_add(void *ctx, const char *key, int64_t delta, int64_t *result) {
  try {
    *result = static_cast<c10d::Store *>(ctx)->add(key, delta);
    return RUCCL_OK;
  } catch (const std::exception &) {
    return RUCCL_ERR_IO;
  }
}

// A group name the registry keeps apart from every other group of this process.
std::string group_name_for(const std::string &group_id) {
  std::string name = "torch.";
  for (char c : group_id) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  if (name.size() >= RUCCL_MAX_GROUP_NAME) {
    name = "torch." + std::to_string(std::hash<std::string>{}(group_id));
  }
  return name;
}

// Rank 0 draws a random secret for the group and shares it through the store, once
// for the store's lifetime: every later session of the group on this store (a
// torchrun restart keeps its store) reads the same one, so no session can read
// another attempt's secret, whichever ranks of an attempt died before they got here.
std::string shared_secret(c10d::Store &store, const std::string &base, int rank,
                          std::chrono::milliseconds timeout) {
  const std::string key = base + "/secret";
  if (rank == 0 && !store.check({key})) {
    std::random_device rd;
    std::vector<uint8_t> bytes(32);
    for (auto &b : bytes) b = static_cast<uint8_t>(rd() & 0xff);
    store.set(key, bytes);
    OPENSSL_cleanse(bytes.data(), bytes.size());
  }
  store.wait({key}, timeout);
  auto v = store.get(key);
  std::string secret(v.begin(), v.end());
  OPENSSL_cleanse(v.data(), v.size());
  return secret;
}

}  // namespace

// ---- streams: how a job is ordered with the caller's device work -----------------

#ifdef RUCCL_TORCH_CUDA
// The core takes CUDA tensors as they are: it stages them through pinned host memory
// on a stream of its own, and returns once the result is on the device.  A job
// follows the stream contract of torch's own backends (NCCL, gloo):
//  - at issue, an event is recorded on the caller's current stream of every CUDA
//    device the job touches (the caller is not blocked);
//  - the thread that runs the job waits for those events on the host (the core's
//    stream knows nothing of the caller's), then does the shim's own device work
//    (contiguous copies and copies back) on a side stream of each device, current
//    while the job runs; it drains the side streams before the work completes and
//    records a `done` event on each;
//  - wait() and synchronize() make the caller's current streams wait for `done`; the
//    future completes with the side streams current, so its events are recorded there.
// The work holds every tensor until it is destroyed.
struct StreamSync {
  std::vector<std::shared_ptr<c10::Event>> ready; // on the callers' streams, at issue
  std::vector<c10::cuda::CUDAStream> side;                 // one per device
  std::vector<std::shared_ptr<c10::Event>> done;  // one per side stream
};
#else
// The core takes host memory only: a job copies device tensors to and from the host
// on the caller's current stream (synchronous copies), so that they follow what the
// caller queued there before the call.
struct StreamSync {
  c10::Stream caller;
};
#endif

namespace {

#ifdef RUCCL_TORCH_CUDA
[[noreturn]] void device_error(const char *what, const c10::Error &e) {
  fail(RUCCL_ERR_DEVICE, std::string(what) + ": " + e.what_without_backtrace());
}
#endif

// At issue, on the caller's thread: null when no tensor is on a device.
std::shared_ptr<StreamSync> sync_at_issue(const std::vector<at::Tensor> &tensors) {
#ifdef RUCCL_TORCH_CUDA
  std::vector<c10::DeviceIndex> devices;
  for (const auto &t : tensors)
    if (t.defined() && t.device().is_cuda() &&
        std::find(devices.begin(), devices.end(), t.device().index()) == devices.end())
      devices.push_back(t.device().index());
  if (devices.empty()) return nullptr;
  std::vector<c10::cuda::CUDAStream> callers;
  for (c10::DeviceIndex d : devices) {
    callers.push_back(c10::cuda::getCurrentCUDAStream(d));
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(callers.back().stream(), &status));
    if (status != cudaStreamCaptureStatusNone)
      fail(RUCCL_ERR_UNSUPPORTED, "ruccl: collectives cannot be captured into a CUDA graph (the current stream of "
                                  "cuda:" + std::to_string(d) + " is capturing); issue them outside the capture");
  }
  auto sync = std::make_shared<StreamSync>();
  for (size_t i = 0; i < devices.size(); i++) {
    auto ready = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
    ready->record(callers[i]);
    sync->ready.push_back(std::move(ready));
    sync->side.push_back(c10::cuda::getStreamFromPool(false, devices[i]));
    sync->done.push_back(std::make_shared<c10::Event>(c10::DeviceType::CUDA));
  }
  return sync;
#else
  for (const auto &t : tensors)
    if (t.defined() && !t.device().is_cpu()) {
      c10::impl::VirtualGuardImpl impl(t.device().type());
      return std::make_shared<StreamSync>(StreamSync{impl.getStream(t.device())});
    }
  return nullptr;
#endif
}

// One sync for several jobs run as one (a coalesced point-to-point group): it waits
// for all of their events, and runs on the first one's stream of each device.
std::shared_ptr<StreamSync> merge_syncs(const std::vector<std::shared_ptr<StreamSync>> &syncs) {
#ifdef RUCCL_TORCH_CUDA
  std::shared_ptr<StreamSync> merged;
  for (const auto &s : syncs) {
    if (!s) continue;
    if (!merged) merged = std::make_shared<StreamSync>();
    merged->ready.insert(merged->ready.end(), s->ready.begin(), s->ready.end());
    for (size_t i = 0; i < s->side.size(); i++) {
      bool have = false;
      for (const auto &st : merged->side) have |= st.device_index() == s->side[i].device_index();
      if (!have) {
        merged->side.push_back(s->side[i]);
        merged->done.push_back(s->done[i]);
      }
    }
  }
  return merged;
#else
  for (const auto &s : syncs)
    if (s) return s;
  return nullptr;
#endif
}

// While a job runs (on a worker, or inline on the caller): waits for the caller's
// events, makes the side streams current; finish() drains them and records `done`.
// Left without finish() (the job threw), it still drains them, so that no copy of
// the shim's is pending when the job's tensors are let go.
class JobStreams {
 public:
  explicit JobStreams(StreamSync *sync) : sync_(sync) {
    if (!sync_) return;
#ifdef RUCCL_TORCH_CUDA
    try {
      for (auto &e : sync_->ready) e->synchronize();
    } catch (const c10::Error &e) {
      device_error("waiting for the caller's stream", e);
    }
    device_.emplace(sync_->side.front().device_index());
    streams_.emplace(sync_->side);
#else
    streams_.emplace(sync_->caller);
#endif
  }
  void finish() {
#ifdef RUCCL_TORCH_CUDA
    if (!sync_) return;
    try {
      for (size_t i = 0; i < sync_->side.size(); i++) {
        sync_->side[i].synchronize();
        sync_->done[i]->record(sync_->side[i]);
      }
    } catch (const c10::Error &e) {
      device_error("finishing the op's copies on the device", e);
    }
#endif
    finished_ = true;
  }
  ~JobStreams() {
#ifdef RUCCL_TORCH_CUDA
    if (!sync_ || finished_) return;
    for (auto &st : sync_->side) {
      try {
        st.synchronize();
      } catch (...) {
      }
    }
#endif
  }

 private:
  StreamSync *sync_;
  bool finished_ = false;
#ifdef RUCCL_TORCH_CUDA
  std::optional<c10::cuda::CUDAGuard> device_;
  std::optional<c10::cuda::CUDAMultiStreamGuard> streams_;
#else
  std::optional<c10::StreamGuard> streams_;
#endif
};

// Makes the side streams current while a work completes (its future records its
// events on the current streams).
class CompletionStreams {
 public:
  explicit CompletionStreams(StreamSync *sync) {
#ifdef RUCCL_TORCH_CUDA
    if (sync) streams_.emplace(sync->side);
#else
    (void)sync;
#endif
  }

 private:
#ifdef RUCCL_TORCH_CUDA
  std::optional<c10::cuda::CUDAMultiStreamGuard> streams_;
#endif
};

// The caller's current streams wait for the job's `done` events (not yet recorded:
// the job failed or never ran, and there is nothing to wait for).
void block_current_streams(StreamSync *sync) {
#ifdef RUCCL_TORCH_CUDA
  if (!sync) return;
  for (size_t i = 0; i < sync->side.size(); i++)
    sync->done[i]->block(c10::cuda::getCurrentCUDAStream(sync->side[i].device_index()));
#else
  (void)sync;
#endif
}

}  // namespace

// ---- Work ------------------------------------------------------------------------

WorkRuccl::WorkRuccl(int rank, c10d::OpType type, const char *title, std::vector<at::Tensor> outputs,
                     std::vector<at::Tensor> keep, std::shared_ptr<StreamSync> sync)
    : c10d::Work(rank, type, title), outputs_(std::move(outputs)), keep_(std::move(keep)), sync_(std::move(sync)) {
  std::vector<c10::Device> devices;
  for (const auto &t : outputs_)
    if (!t.device().is_cpu() && std::find(devices.begin(), devices.end(), t.device()) == devices.end())
      devices.push_back(t.device());
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(), devices);
}

// c10d::Work::wait calls synchronize() itself, holding the work's mutex (so
// synchronize() must not take it: no isCompleted() there); waiting on the events
// twice costs nothing, and keeps the contract should a torch's wait() not call it.
bool WorkRuccl::wait(std::chrono::milliseconds timeout) {
  bool ok = c10d::Work::wait(timeout);
  block_current_streams(sync_.get());
  return ok;
}

void WorkRuccl::synchronize() {
  if (ran_.load(std::memory_order_acquire)) block_current_streams(sync_.get());
}

void WorkRuccl::complete(std::exception_ptr error) {
  ran_.store(true, std::memory_order_release); // the job's `done` events are recorded
  CompletionStreams streams(sync_.get());
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

// ---- point-to-point work ----------------------------------------------------------

WorkRucclP2p::WorkRucclP2p(int rank, c10d::OpType type, const char *title, at::Tensor user, at::Tensor buf,
                           ruccl_request_t *req, bool recv)
    : WorkRuccl(rank, type, title, {user}, {user, buf}, nullptr), user_(std::move(user)), buf_(std::move(buf)),
      req_(req), recv_(recv) {}

WorkRucclP2p::~WorkRucclP2p() { ruccl_request_free(req_); }

bool WorkRucclP2p::settle() {
  if (settled_.load(std::memory_order_acquire)) return true;
  int done = 0;
  ruccl_result_t rc = ruccl_test(req_, &done);
  if (!done) return false;
  conclude(rc);
  return true;
}

void WorkRucclP2p::conclude(ruccl_result_t rc) {
  std::string why = rc == RUCCL_OK ? "" : ruccl_last_error();
  bool expected = false;
  if (!settled_.compare_exchange_strong(expected, true)) return;
  std::exception_ptr error;
  try {
    if (rc != RUCCL_OK) throw std::runtime_error(why.empty() ? ruccl_error_string(rc) : why);
    if (recv_) {
      uint32_t src = 0;
      if (ruccl_request_source(req_, &src) == RUCCL_OK) source_.store(static_cast<int>(src));
      if (!buf_.is_same(user_)) user_.copy_(buf_);
    }
  } catch (...) {
    error = std::current_exception();
  }
  complete(error);
}

bool WorkRucclP2p::wait(std::chrono::milliseconds timeout) {
  if (!settled_.load(std::memory_order_acquire)) {
    if (timeout != kNoTimeout) {
      size_t index = 0;
      if (ruccl_wait_any(&req_, 1, timeout.count(), &index) != RUCCL_OK && !settled_.load())
        fail(RUCCL_ERR_TIMEOUT, "work.wait(" + std::to_string(timeout.count()) + " ms): the " +
                                    (recv_ ? std::string("receive") : std::string("send")) +
                                    " has not completed; it stays posted");
    }
    conclude(ruccl_wait(req_)); // torch's binding has released the GIL
  }
  return WorkRuccl::wait(timeout);
}

int WorkRucclP2p::sourceRank() const {
  int src = source_.load();
  if (src < 0) fail(RUCCL_ERR_INVALID_ARGUMENT, "sourceRank: the receive has not completed");
  return src;
}

// Completes the receives nobody waits for (their futures, the works' state): waits on
// all that are pending, in slices, so that new ones join within a slice.
void ProcessGroupRuccl::completer_loop(std::shared_ptr<P2pState> st) {
  std::vector<c10::intrusive_ptr<WorkRucclP2p>> works;
  std::vector<ruccl_request_t *> reqs;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(st->mu);
      st->works.erase(std::remove_if(st->works.begin(), st->works.end(), [](const auto &w) { return w->settled(); }),
                      st->works.end());
      st->cv.wait(lock, [&st] { return st->stop || !st->works.empty(); });
      if (st->stop) return;
      works = st->works;
    }
    reqs.clear();
    for (auto &w : works) reqs.push_back(w->request());
    size_t index = 0;
    if (ruccl_wait_any(reqs.data(), reqs.size(), 20, &index) == RUCCL_OK) works[index]->settle();
    works.clear();
  }
}

// ---- the backend -----------------------------------------------------------------

ProcessGroupRuccl::ProcessGroupRuccl(const RucclOptions &o) : c10d::Backend(o.rank, o.size) {
  ruccl_config_t cfg = ruccl_config_default();
  check(ruccl_config_set_num_devices(&cfg, 1));
  check(ruccl_config_set_timeout_ms(&cfg, std::max<int64_t>(o.timeout.count(), 1)));
  const std::string group = group_name_for(o.group_id);
  check(ruccl_config_set_group_name(&cfg, group.c_str()));
  if (o.size > 1) {
    if (!o.store) fail(RUCCL_ERR_INVALID_CONFIG, "the backend needs torch's store to rendezvous");
    // The session secret (no stranger joins the data connections): RUCCL_SECRET or
    // RUCCL_SECRET_FILE, else one rank 0 shares through the store (as strong as the
    // store is private: said once per process).
    std::string secret;
    const char *env = std::getenv("RUCCL_SECRET"), *file = std::getenv("RUCCL_SECRET_FILE");
    if ((env && *env) || (file && *file)) {
      unsigned char key[RUCCL_MAX_SECRET];
      size_t len = 0;
      check(ruccl_secret_from_env(key, &len));
      secret.assign(reinterpret_cast<const char *>(key), len);
      OPENSSL_cleanse(key, sizeof key);
    } else {
      static std::once_flag warned;
      std::call_once(warned, [] {
        LOG(WARNING) << "ruccl: no RUCCL_SECRET or RUCCL_SECRET_FILE: rank 0 shares a random session secret "
                        "through torch's store, so authentication is only as strong as access to the store "
                        "(MASTER_ADDR:MASTER_PORT); give every rank the same RUCCL_SECRET or RUCCL_SECRET_FILE "
                        "for real authentication";
      });
      try {
        secret = shared_secret(*o.store, "ruccl/" + group, o.rank, o.timeout);
      } catch (const std::exception &e) {
        fail(RUCCL_ERR_TIMEOUT, std::string("the session secret did not come through the store: ") + e.what());
      }
    }
    // A training job wants a frozen rank found in seconds, not the core's 30 s: torchrun
    // restarts the job from its last checkpoint only once every survivor has exited.
    // RUCCL_LIVENESS_TIMEOUT_MS still decides where it is set (0: no watch).
    const char *liveness = std::getenv("RUCCL_LIVENESS_TIMEOUT_MS");
    if (!liveness || !*liveness) check(ruccl_config_set_liveness_timeout_ms(&cfg, kTrainingLivenessTimeoutMs));
    ruccl_store_t st{store_set, store_get, store_add, o.store.get()};
    check(ruccl_config_set_num_nodes(&cfg, static_cast<unsigned>(o.size)));
    check(ruccl_config_set_store(&cfg, &st));
    check(ruccl_config_set_node_address(&cfg, o.node_address.c_str()));
    check(ruccl_config_set_data_service_port(&cfg, 0));
    check(ruccl_config_set_secret(&cfg, secret.data(), secret.size()));
    OPENSSL_cleanse(secret.data(), secret.size());
  }
  check(ruccl_register(static_cast<uint32_t>(o.rank), ruccl_device_t{RUCCL_DEVICE_CPU, 0}, &cfg, &comm_));
  timeout_ms_ = std::max<int64_t>(o.timeout.count(), 1);
  for (int i = 0; i < 2; i++) workers_.emplace_back(worker_loop, this, q_);
  completer_ = std::thread(completer_loop, p2p_);
}

ProcessGroupRuccl::~ProcessGroupRuccl() { shutdown(); }

// Runs what was queued, fails what was being coalesced, stops the workers and ends
// this peer's session.  Called again (destroy_process_group, then the destructor),
// it waits for the first call.  Called on a worker (a future callback that destroys
// the group), that worker is let go instead of joined: it touches nothing of ours
// after the callback (see worker_loop).
// Every blocked or queued call of this group returns RUCCL_ERR_ABORTED promptly (on
// the other ranks too), then the group shuts down.
void ProcessGroupRuccl::abort() {
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (comm_) ruccl_comm_abort(comm_);
  }
  shutdown();
}

void ProcessGroupRuccl::setTimeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) fail(RUCCL_ERR_INVALID_ARGUMENT, "timeout must be > 0 ms");
  timeout_ms_ = timeout.count();
  std::lock_guard<std::mutex> lock(comm_mu_);
  if (comm_) check(ruccl_comm_set_timeout(comm_, timeout_ms_)); // for the receives posted from now on
}

void ProcessGroupRuccl::shutdown() {
  std::vector<Job> stale;
  std::vector<std::thread> workers;
  {
    std::unique_lock<std::mutex> lock(q_->mu);
    if (q_->stopping) {
      q_->cv.wait(lock, [this] { return q_->shut; });
      return;
    }
    q_->stopping = true;
    q_->coalescing = false;
    stale.swap(q_->coalesced);
    workers.swap(workers_);
  }
  q_->cv.notify_all();
  auto gone = std::make_exception_ptr(std::runtime_error(
      "RUCCL_ERR_NOT_REGISTERED: the process group was shut down before its coalesced ops were issued"));
  for (auto &j : stale) complete(j, gone);
  for (auto &w : workers) {
    if (w.get_id() == std::this_thread::get_id()) {
      w.detach();
    } else {
      w.join(); // runs what was queued, then stops
    }
  }
  {
    std::unique_lock<std::mutex> lock(q_->mu);
    q_->cv.wait(lock, [this] { return !q_->busy; }); // an inline job on another caller
  }
  std::vector<c10::intrusive_ptr<WorkRucclP2p>> pending;
  {
    std::lock_guard<std::mutex> lock(p2p_->mu);
    p2p_->stop = true;
    pending.swap(p2p_->works);
  }
  p2p_->cv.notify_all();
  if (completer_.joinable()) {
    if (completer_.get_id() == std::this_thread::get_id()) completer_.detach();
    else completer_.join();
  }
  std::lock_guard<std::mutex> comm_lock(comm_mu_);
  if (comm_) {
    ruccl_finish(comm_); // receives still pending fail: this peer finished
    comm_ = nullptr;
  }
  for (auto &w : pending) w->settle();
  {
    std::lock_guard<std::mutex> lock(q_->mu);
    q_->shut = true;
  }
  q_->cv.notify_all();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::enqueue(c10d::OpType type, const char *title,
                                                          std::vector<at::Tensor> outputs, std::function<void()> run,
                                                          std::vector<P2pOp> p2p, bool caller_waits,
                                                          std::function<void()> after,
                                                          std::vector<at::Tensor> inputs,
                                                          std::chrono::milliseconds timeout) {
  std::vector<at::Tensor> touched = outputs;
  touched.insert(touched.end(), inputs.begin(), inputs.end());
  for (const auto &op : p2p) touched.push_back(op.tensor);
  std::shared_ptr<StreamSync> sync = sync_at_issue(touched); // refuses a CUDA graph capture
  auto work = c10::make_intrusive<WorkRuccl>(rank_, type, title, std::move(outputs), std::move(touched), sync);
  Job job{std::move(run), std::move(p2p), work, std::move(sync), std::move(after),
          timeout.count() > 0 ? timeout.count() : 0};
  {
    std::unique_lock<std::mutex> lock(q_->mu);
    if (q_->stopping) fail(RUCCL_ERR_NOT_REGISTERED, "the process group was shut down");
    if (type != c10d::OpType::SEND && type != c10d::OpType::RECV) seq_++;
    if (q_->coalescing) {
      if (caller_waits)
        fail(RUCCL_ERR_INVALID_ARGUMENT, std::string(title) + " with async_op=False inside a coalescing block: "
                                                           "it would wait for ops that run only at its end");
      q_->coalesced.push_back(std::move(job));
      return work;
    }
    if (!caller_waits || q_->busy || !q_->jobs.empty()) {
      q_->jobs.push_back(std::move(job));
      q_->cv.notify_all();
      return work;
    }
    q_->busy = true;
  }
  std::exception_ptr error = run_job(job);
  release_queue(*q_);
  finish_job(job, error);
  return work;
}

// Wakes the workers only when one has something to do (waking idle threads on every
// inline call costs more than the call on a small machine).
void ProcessGroupRuccl::release_queue(Queue &q) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    q.busy = false;
    wake = !q.jobs.empty() || q.stopping;
  }
  if (wake) q.cv.notify_all();
}

std::exception_ptr ProcessGroupRuccl::run_job(Job &job) {
  try {
    check(ruccl_comm_set_timeout(comm_, job.timeout_ms > 0 ? job.timeout_ms : timeout_ms_.load()));
    JobStreams streams(job.sync.get());
    if (!job.p2p.empty()) {
      run_p2p(job.p2p);
    } else {
      job.run();
    }
    streams.finish();
    return nullptr;
  } catch (const c10::Error &e) { // torch's own checks (a copy into a bad output...)
    return std::make_exception_ptr(
        std::runtime_error(std::string("RUCCL_ERR_INVALID_ARGUMENT: ") + e.what_without_backtrace()));
  } catch (const std::exception &e) {
    if (std::strncmp(e.what(), "RUCCL_ERR_", 10) == 0) return std::current_exception();
    return std::make_exception_ptr(std::runtime_error(std::string("RUCCL_ERR_INVALID_ARGUMENT: ") + e.what()));
  } catch (...) {
    return std::current_exception();
  }
}

void ProcessGroupRuccl::finish_job(Job &job, std::exception_ptr error) {
  if (job.after) job.after();
  complete(job, error);
}

void ProcessGroupRuccl::complete(Job &job, std::exception_ptr error) {
  try {
    job.work->complete(error); // with the job's side streams current
  } catch (const std::exception &e) {
    TORCH_WARN("ruccl: completing a work raised: ", e.what());
  } catch (...) {
    TORCH_WARN("ruccl: completing a work raised");
  }
}

void ProcessGroupRuccl::startCoalescing() {
  std::vector<Job> stale;
  {
    std::lock_guard<std::mutex> lock(q_->mu);
    if (q_->stopping) fail(RUCCL_ERR_NOT_REGISTERED, "the process group was shut down");
    // A block that never reached its end (an op in it threw, and torch's coalescing
    // manager does not end it then): its ops fail rather than wedge the group.
    stale.swap(q_->coalesced);
    q_->coalescing = true;
  }
  auto abandoned = std::make_exception_ptr(std::runtime_error(
      "RUCCL_ERR_INVALID_ARGUMENT: a coalescing block was left without endCoalescing; its ops did not run"));
  for (auto &j : stale) complete(j, abandoned);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::endCoalescing() {
  std::vector<Job> jobs;
  {
    std::lock_guard<std::mutex> lock(q_->mu);
    if (!q_->coalescing) fail(RUCCL_ERR_INVALID_ARGUMENT, "endCoalescing without startCoalescing");
    q_->coalescing = false;
    jobs.swap(q_->coalesced);
  }
  std::vector<at::Tensor> outputs;
  for (auto &j : jobs)
    for (auto &t : j.work->result()) outputs.push_back(t);
  auto shared = std::make_shared<std::vector<Job>>(std::move(jobs));
  auto errors = std::make_shared<std::vector<std::exception_ptr>>(shared->size());
  // Runs the recorded ops in order, consecutive point-to-point ones as one group; an
  // op after a failed one does not run and fails with it.  Their works complete
  // once the group is free again.
  auto run = [this, shared, errors] {
    auto &jobs = *shared;
    std::exception_ptr error;
    for (size_t i = 0; i < jobs.size() && !error;) {
      size_t j = i + 1;
      if (!jobs[i].p2p.empty()) {
        Job group;
        std::vector<std::shared_ptr<StreamSync>> syncs;
        for (j = i; j < jobs.size() && !jobs[j].p2p.empty(); j++) {
          group.p2p.insert(group.p2p.end(), jobs[j].p2p.begin(), jobs[j].p2p.end());
          syncs.push_back(jobs[j].sync);
        }
        group.sync = merge_syncs(syncs);
        error = run_job(group);
      } else {
        error = run_job(jobs[i]);
      }
      for (; i < j; i++) (*errors)[i] = error;
    }
    for (auto &e : *errors)
      if (!e) e = error;
    if (error) std::rethrow_exception(error);
  };
  return enqueue(c10d::OpType::COALESCED, "ruccl:coalesced", outputs, run, {}, false, [shared, errors] {
    for (size_t i = 0; i < shared->size(); i++) complete((*shared)[i], (*errors)[i]);
  });
}

// Touches the backend only to run a job: a job is queued only while the backend lives,
// and shutdown() runs the queue dry before it returns.
void ProcessGroupRuccl::worker_loop(ProcessGroupRuccl *self, std::shared_ptr<Queue> q) {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(q->mu);
      q->cv.wait(lock, [&q] { return !q->busy && (q->stopping || !q->jobs.empty()); });
      if (q->jobs.empty()) return;
      job = std::move(q->jobs.front());
      q->jobs.pop_front();
      q->busy = true;
    }
    std::exception_ptr error = self->run_job(job);
    release_queue(*q);
    finish_job(job, error); // callbacks run here, with the group free for the other worker
  }
}

void ProcessGroupRuccl::run_p2p(std::vector<P2pOp> &ops) {
  std::vector<Staged> staged;
  staged.reserve(ops.size());
  for (auto &op : ops) staged.emplace_back(op.tensor, op.send);
  std::vector<ruccl_tensor_t> views(ops.size());
  std::vector<ruccl_p2p_op_t> c_ops(ops.size());
  for (size_t i = 0; i < ops.size(); i++) {
    views[i] = view(staged[i].buf);
    c_ops[i] = {ops[i].send ? RUCCL_P2P_SEND : RUCCL_P2P_RECV, &views[i],
                ops[i].peer < 0 ? RUCCL_ANY_PEER : static_cast<uint32_t>(ops[i].peer), ops[i].tag};
  }
  check(ruccl_p2p_group(comm_, c_ops.data(), c_ops.size()));
  for (size_t i = 0; i < ops.size(); i++)
    if (!ops[i].send) staged[i].put();
}

// ---- collectives -----------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::allreduce(std::vector<at::Tensor> &tensors,
                                                            const c10d::AllreduceOptions &opts) {
  need_one(tensors, "allreduce");
  at::Tensor t = tensors[0];
  Reduction op = op_of(opts.reduceOp, t.scalar_type());
  return enqueue(c10d::OpType::ALLREDUCE, "ruccl:all_reduce", {t}, [this, t, op] {
    Staged h(t);
    at::Tensor x = op.operand(h.buf);
    ruccl_tensor_t v = view(x);
    check(ruccl_all_reduce(comm_, &v, &v, op.op));
    op.result(x, h.buf);
    h.put();
  }, {}, !opts.asyncOp, nullptr, {}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::allreduce_coalesced(std::vector<at::Tensor> &tensors,
                                                                      const c10d::AllreduceCoalescedOptions &opts) {
  std::vector<Reduction> ops;
  for (const auto &t : tensors) ops.push_back(op_of(opts.reduceOp, t.scalar_type()));
  std::vector<at::Tensor> ts = tensors;
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, "ruccl:all_reduce_coalesced", ts, [this, ts, ops] {
    for (size_t i = 0; i < ts.size(); i++) {
      Staged h(ts[i]);
      at::Tensor x = ops[i].operand(h.buf);
      ruccl_tensor_t v = view(x);
      check(ruccl_all_reduce(comm_, &v, &v, ops[i].op));
      ops[i].result(x, h.buf);
      h.put();
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::broadcast(std::vector<at::Tensor> &tensors,
                                                            const c10d::BroadcastOptions &opts) {
  need_one(tensors, "broadcast");
  at::Tensor t = tensors[0];
  dtype_of(t.scalar_type());
  uint32_t root = static_cast<uint32_t>(opts.rootRank);
  return enqueue(c10d::OpType::BROADCAST, "ruccl:broadcast", {t}, [this, t, root] {
    Staged h(t, static_cast<int>(root) == rank_);
    ruccl_tensor_t v = view(h.buf);
    check(ruccl_broadcast_from(comm_, &v, root));
    h.put();
  }, {}, !opts.asyncOp, nullptr, {}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::reduce(std::vector<at::Tensor> &tensors,
                                                         const c10d::ReduceOptions &opts) {
  need_one(tensors, "reduce");
  at::Tensor t = tensors[0];
  Reduction op = op_of(opts.reduceOp, t.scalar_type());
  uint32_t root = static_cast<uint32_t>(opts.rootRank);
  return enqueue(c10d::OpType::REDUCE, "ruccl:reduce", {t}, [this, t, op, root] {
    Staged h(t);
    at::Tensor x = op.operand(h.buf);
    ruccl_tensor_t v = view(x);
    bool is_root = static_cast<int>(root) == rank_;
    check(ruccl_reduce(comm_, &v, is_root ? &v : nullptr, op.op, root));
    if (!is_root) return;
    op.result(x, h.buf);
    h.put();
  }, {}, !opts.asyncOp, nullptr, {}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::_allgather_base(at::Tensor &output, at::Tensor &input,
                                                                  const c10d::AllgatherOptions &opts) {
  check_gather_base(output, input, size_);
  at::Tensor out = output, in = input;
  return enqueue(c10d::OpType::_ALLGATHER_BASE, "ruccl:all_gather_into_tensor", {out}, [this, out, in] {
    Staged hi(in), ho(out, false);
    ruccl_tensor_t vi = view(hi.buf), vo = view(ho.buf);
    check(ruccl_all_gather(comm_, &vi, &vo));
    ho.put();
  }, {}, !opts.asyncOp, nullptr, {in}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                                            std::vector<at::Tensor> &inputs,
                                                            const c10d::AllgatherOptions &opts) {
  need_one(inputs, "allgather");
  if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_)
    fail(RUCCL_ERR_INVALID_ARGUMENT, "allgather needs one output list of world size " + std::to_string(size_));
  at::Tensor in = inputs[0];
  dtype_of(in.scalar_type());
  for (const auto &o : outputs[0]) need_same(o, in, "allgather output/input");
  std::vector<at::Tensor> outs = outputs[0];
  return enqueue(c10d::OpType::ALLGATHER, "ruccl:all_gather", outs, [this, in, outs] {
    Staged hi(in);
    std::vector<int64_t> shape{static_cast<int64_t>(outs.size())};
    at::Tensor flat = at::empty({static_cast<int64_t>(outs.size()) * in.numel()}, hi.buf.options());
    ruccl_tensor_t vi = view(hi.buf), vo = view(flat);
    check(ruccl_all_gather(comm_, &vi, &vo));
    for (size_t k = 0; k < outs.size(); k++)
      outs[k].copy_(flat.narrow(0, static_cast<int64_t>(k) * in.numel(), in.numel()).view(outs[k].sizes()));
  }, {}, !opts.asyncOp, nullptr, {in}, opts.timeout);
}

// outputs[r][k]: rank r's block of input k.
c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::allgather_coalesced(std::vector<std::vector<at::Tensor>> &outputs,
                                                                      std::vector<at::Tensor> &inputs,
                                                                      const c10d::AllgatherOptions &opts) {
  if (static_cast<int>(outputs.size()) != size_)
    fail(RUCCL_ERR_INVALID_ARGUMENT, "allgather_coalesced: " + std::to_string(outputs.size()) +
                                         " output lists for world size " + std::to_string(size_));
  for (const auto &o : outputs)
    if (o.size() != inputs.size())
      fail(RUCCL_ERR_INVALID_ARGUMENT, "allgather_coalesced: an output list of " + std::to_string(o.size()) +
                                           " tensors for " + std::to_string(inputs.size()) + " inputs");
  for (size_t k = 0; k < inputs.size(); k++) { // all checked before any is queued
    dtype_of(inputs[k].scalar_type());
    for (int r = 0; r < size_; r++) need_same(outputs[r][k], inputs[k], "allgather_coalesced output/input");
  }
  std::vector<at::Tensor> all_outputs;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t k = 0; k < inputs.size(); k++) {
    std::vector<std::vector<at::Tensor>> o(1);
    for (int r = 0; r < size_; r++) o[0].push_back(outputs[r][k]);
    std::vector<at::Tensor> in{inputs[k]};
    works.push_back(allgather(o, in, opts));
  }
  for (const auto &o : outputs) all_outputs.insert(all_outputs.end(), o.begin(), o.end());
  // Queued after the gathers: done when they are, failed if any failed.
  return enqueue(c10d::OpType::ALLGATHER_COALESCED, "ruccl:all_gather_coalesced", all_outputs, [works] {
    for (auto &w : works) w->wait();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::allgather_into_tensor_coalesced(std::vector<at::Tensor> &outputs,
                                                                                  std::vector<at::Tensor> &inputs,
                                                                                  const c10d::AllgatherOptions &opts) {
  if (outputs.size() != inputs.size())
    fail(RUCCL_ERR_INVALID_ARGUMENT, "allgather_into_tensor_coalesced: output and input counts differ");
  for (size_t i = 0; i < inputs.size(); i++) check_gather_base(outputs[i], inputs[i], size_);
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); i++) works.push_back(_allgather_base(outputs[i], inputs[i], opts));
  return enqueue(c10d::OpType::COALESCED, "ruccl:all_gather_into_tensor_coalesced", outputs, [works] {
    for (auto &w : works) w->wait();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::_reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                                                       const c10d::ReduceScatterOptions &opts) {
  Reduction op = check_scatter_base(output, input, opts.reduceOp, size_);
  at::Tensor out = output, in = input;
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, "ruccl:reduce_scatter_tensor", {out}, [this, out, in, op] {
    Staged hi(in), ho(out, false);
    at::Tensor xi = op.operand(hi.buf);
    at::Tensor xo = xi.is_same(hi.buf) ? ho.buf : at::empty(ho.buf.sizes(), xi.options());
    ruccl_tensor_t vi = view(xi), vo = view(xo);
    check(ruccl_reduce_scatter(comm_, &vi, &vo, op.op));
    op.result(xo, ho.buf);
    ho.put();
  }, {}, !opts.asyncOp, nullptr, {in}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::reduce_scatter(std::vector<at::Tensor> &outputs,
                                                                 std::vector<std::vector<at::Tensor>> &inputs,
                                                                 const c10d::ReduceScatterOptions &opts) {
  need_one(outputs, "reduce_scatter");
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
    fail(RUCCL_ERR_INVALID_ARGUMENT, "reduce_scatter needs one input list of world size " + std::to_string(size_));
  at::Tensor out = outputs[0];
  Reduction op = op_of(opts.reduceOp, out.scalar_type());
  for (const auto &i : inputs[0]) need_same(i, out, "reduce_scatter input/output");
  std::vector<at::Tensor> ins = inputs[0];
  return enqueue(c10d::OpType::REDUCE_SCATTER, "ruccl:reduce_scatter", {out}, [this, out, ins, op] {
    std::vector<at::Tensor> flat;
    at::Device dev = core_device(out);
    for (const auto &i : ins) flat.push_back(i.to(dev).reshape({-1}));
    at::Tensor in = at::cat(flat);
    settle(in);
    Staged ho(out, false);
    at::Tensor xi = op.operand(in);
    at::Tensor xo = xi.is_same(in) ? ho.buf : at::empty(ho.buf.sizes(), xi.options());
    ruccl_tensor_t vi = view(xi), vo = view(xo);
    check(ruccl_reduce_scatter(comm_, &vi, &vo, op.op));
    op.result(xo, ho.buf);
    ho.put();
  }, {}, !opts.asyncOp, nullptr, ins, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs, const c10d::ReduceScatterOptions &opts) {
  if (outputs.size() != inputs.size())
    fail(RUCCL_ERR_INVALID_ARGUMENT, "reduce_scatter_tensor_coalesced: output and input counts differ");
  for (size_t i = 0; i < inputs.size(); i++) check_scatter_base(outputs[i], inputs[i], opts.reduceOp, size_);
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); i++) works.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
  return enqueue(c10d::OpType::COALESCED, "ruccl:reduce_scatter_tensor_coalesced", outputs, [works] {
    for (auto &w : works) w->wait();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::barrier(const c10d::BarrierOptions &opts) {
  return enqueue(c10d::OpType::BARRIER, "ruccl:barrier", {}, [this] { check(ruccl_barrier(comm_)); }, {},
                 !opts.asyncOp, nullptr, {}, opts.timeout);
}

// ---- point-to-point and what torch builds on it ----------------------------------

// Host tensors are posted at once, on the caller's thread, as gloo does: a send hands
// its message over before it returns, a receive completes in the background (see
// WorkRucclP2p), and neither waits behind queued collectives.  Device tensors, and
// ops inside a coalescing block, go through the queue (their copies follow the
// streams; a block runs as one ruccl_p2p_group).
c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::post_p2p(bool send, at::Tensor t, int peer, int tag) {
  need_tag(tag);
  dtype_of(t.scalar_type());
  c10d::OpType type = send ? c10d::OpType::SEND : peer < 0 ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV;
  const char *title = send ? "ruccl:send" : peer < 0 ? "ruccl:recv_anysource" : "ruccl:recv";
  bool queued;
  {
    std::lock_guard<std::mutex> lock(q_->mu);
    if (q_->stopping) fail(RUCCL_ERR_NOT_REGISTERED, "the process group was shut down");
    queued = q_->coalescing || !t.device().is_cpu();
  }
  if (queued) return enqueue(type, title, {t}, nullptr, {{send, t, peer, tag}});
  at::Tensor buf = t.is_contiguous() ? t : send ? t.contiguous() : at::empty(t.sizes(), t.options());
  ruccl_tensor_t v = view(buf);
  ruccl_request_t *req = nullptr;
  check(send ? ruccl_isend(comm_, &v, static_cast<uint32_t>(peer), tag, &req)
             : ruccl_irecv(comm_, &v, peer < 0 ? RUCCL_ANY_PEER : static_cast<uint32_t>(peer), tag, &req));
  auto work = c10::make_intrusive<WorkRucclP2p>(rank_, type, title, t, buf, req, !send);
  if (send || work->settle()) return work;
  {
    std::lock_guard<std::mutex> lock(p2p_->mu);
    p2p_->works.push_back(work);
  }
  p2p_->cv.notify_all();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::send(std::vector<at::Tensor> &tensors, int dst, int tag) {
  need_one(tensors, "send");
  if (dst < 0 || dst >= size_) fail(RUCCL_ERR_INVALID_ARGUMENT, "send to rank " + std::to_string(dst));
  return post_p2p(true, tensors[0], dst, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::recv(std::vector<at::Tensor> &tensors, int src, int tag) {
  need_one(tensors, "recv");
  if (src < 0 || src >= size_) fail(RUCCL_ERR_INVALID_ARGUMENT, "recv from rank " + std::to_string(src));
  return post_p2p(false, tensors[0], src, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::recvAnysource(std::vector<at::Tensor> &tensors, int tag) {
  need_one(tensors, "recv");
  return post_p2p(false, tensors[0], -1, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::gather(std::vector<std::vector<at::Tensor>> &outputs,
                                                         std::vector<at::Tensor> &inputs,
                                                         const c10d::GatherOptions &opts) {
  need_one(inputs, "gather");
  int root = static_cast<int>(opts.rootRank);
  at::Tensor in = inputs[0];
  dtype_of(in.scalar_type());
  std::vector<P2pOp> ops;
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_)
      fail(RUCCL_ERR_INVALID_ARGUMENT, "gather needs one output list of world size on the root");
    outs = outputs[0];
    for (int r = 0; r < size_; r++) {
      need_same(outs[r], in, "gather output/input");
      ops.push_back({false, outs[r], r, kCollectiveTag});  // the root's own block too: it sends it to itself
    }
  }
  ops.push_back({true, in, root, kCollectiveTag});
  return enqueue(c10d::OpType::GATHER, "ruccl:gather", outs, nullptr, ops, false, nullptr, {}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::scatter(std::vector<at::Tensor> &outputs,
                                                          std::vector<std::vector<at::Tensor>> &inputs,
                                                          const c10d::ScatterOptions &opts) {
  need_one(outputs, "scatter");
  int root = static_cast<int>(opts.rootRank);
  at::Tensor out = outputs[0];
  dtype_of(out.scalar_type());
  std::vector<P2pOp> ops;
  if (rank_ == root) {
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
      fail(RUCCL_ERR_INVALID_ARGUMENT, "scatter needs one input list of world size on the root");
    for (int r = 0; r < size_; r++) {
      need_same(inputs[0][r], out, "scatter input/output");
      ops.push_back({true, inputs[0][r], r, kCollectiveTag});
    }
  }
  ops.push_back({false, out, root, kCollectiveTag});
  return enqueue(c10d::OpType::SCATTER, "ruccl:scatter", {out}, nullptr, ops, false, nullptr, {}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::alltoall_base(at::Tensor &output, at::Tensor &input,
                                                                std::vector<int64_t> &output_split_sizes,
                                                                std::vector<int64_t> &input_split_sizes,
                                                                const c10d::AllToAllOptions &opts) {
  dtype_of(input.scalar_type());
  if (input.scalar_type() != output.scalar_type())
    fail(RUCCL_ERR_DTYPE_MISMATCH, "all_to_all_single: input and output dtypes differ");
  std::vector<at::Tensor> ins = split_rows(input, input_split_sizes, size_, "all_to_all_single input");
  std::vector<at::Tensor> outs = split_rows(output, output_split_sizes, size_, "all_to_all_single output");
  std::vector<P2pOp> ops;
  for (int r = 0; r < size_; r++) {
    ops.push_back({true, ins[r], r, kCollectiveTag});
    ops.push_back({false, outs[r], r, kCollectiveTag});
  }
  return enqueue(c10d::OpType::ALLTOALL_BASE, "ruccl:all_to_all_single", {output}, nullptr, ops, false, nullptr, {},
                 opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::alltoall(std::vector<at::Tensor> &outputs,
                                                           std::vector<at::Tensor> &inputs,
                                                           const c10d::AllToAllOptions &opts) {
  if (static_cast<int>(outputs.size()) != size_ || static_cast<int>(inputs.size()) != size_)
    fail(RUCCL_ERR_INVALID_ARGUMENT, "all_to_all needs world size input and output tensors");
  std::vector<P2pOp> ops;
  for (int r = 0; r < size_; r++) {
    dtype_of(inputs[r].scalar_type());
    if (inputs[r].scalar_type() != outputs[r].scalar_type())
      fail(RUCCL_ERR_DTYPE_MISMATCH, "all_to_all: input and output dtypes differ");
    ops.push_back({true, inputs[r], r, kCollectiveTag});
    ops.push_back({false, outputs[r], r, kCollectiveTag});
  }
  return enqueue(c10d::OpType::ALLTOALL, "ruccl:all_to_all", outputs, nullptr, ops, false, nullptr, {}, opts.timeout);
}

}  // namespace ruccl_torch
