// streams.cpp — see streams.hpp.
#include "streams.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#ifdef RUCCL_TORCH_CUDA
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>

#include "errors.hpp"

namespace ruccl_torch {

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

JobStreams::JobStreams(StreamSync *sync) : sync_(sync) {
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
void JobStreams::finish() {
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
JobStreams::~JobStreams() {
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

}  // namespace ruccl_torch
