// streams.hpp — how a job is ordered with the caller's device work (the CUDA stream
// contract of torch's own backends).  Nothing here for host tensors: their jobs carry
// no StreamSync.
#pragma once

#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#ifdef RUCCL_TORCH_CUDA
// c10's CUDA headers only (ATen/cuda/* pulls in cuBLAS and cuSPARSE headers).
#include <c10/core/Event.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <vector>

namespace ruccl_torch {

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

// At issue, on the caller's thread: null when no tensor is on a device.  Refuses a
// call issued while the caller's stream is capturing a CUDA graph.
std::shared_ptr<StreamSync> sync_at_issue(const std::vector<at::Tensor> &tensors);
// One sync for several jobs run as one (a coalesced point-to-point group): it waits
// for all of their events, and runs on the first one's stream of each device.
std::shared_ptr<StreamSync> merge_syncs(const std::vector<std::shared_ptr<StreamSync>> &syncs);
// The caller's current streams wait for the job's `done` events (not yet recorded:
// the job failed or never ran, and there is nothing to wait for).
void block_current_streams(StreamSync *sync);

// While a job runs (on a worker, or inline on the caller): waits for the caller's
// events, makes the side streams current; finish() drains them and records `done`.
// Left without finish() (the job threw), it still drains them, so that no copy of
// the shim's is pending when the job's tensors are let go.
class JobStreams {
 public:
  explicit JobStreams(StreamSync *sync);
  void finish();
  ~JobStreams();

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

}  // namespace ruccl_torch
