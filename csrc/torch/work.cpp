// work.cpp — the Work a c10d call returns: its future, its completion and the stream
// contract of wait() and synchronize(); and the work of a point-to-point op posted at
// issue.  Declared in ProcessGroupRuccl.hpp.
#include "ProcessGroupRuccl.hpp"

#include <algorithm>

#include "errors.hpp"
#include "streams.hpp"

namespace ruccl_torch {

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
                           ruccl_request_t *req, bool recv, PeerIds ids)
    : WorkRuccl(rank, type, title, {user}, {user, buf}, nullptr), user_(std::move(user)), buf_(std::move(buf)),
      req_(req), recv_(recv), ids_(std::move(ids)) {}

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
      if (ruccl_request_source(req_, &src) == RUCCL_OK) source_.store(rank_of_id(ids_, src));
      if (!buf_.is_same(user_)) user_.copy_(buf_);
    }
  } catch (...) {
    error = std::current_exception();
  }
  FlightRecorder::get().finished(trace_id_, kP2pAlgorithm, error);
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

}  // namespace ruccl_torch
