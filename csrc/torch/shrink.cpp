// shrink.cpp — dist.shrink_group on ruccl: the survivors make a new backend on the
// communicator ruccl_comm_shrink returns (no store, no rendezvous), ranked densely in
// the old order.  torch then shuts this backend down and registers the new one.
#include "ProcessGroupRuccl.hpp"

#include <torch/csrc/utils/pybind.h>

#include "errors.hpp"

namespace ruccl_torch {

ProcessGroupRuccl::ProcessGroupRuccl(ruccl_comm_t *comm, int rank, int size, PeerIds ids, int64_t timeout_ms,
                                     const std::string &group_id)
    : c10d::Backend(rank, size), comm_(comm), ids_(std::move(ids)), group_id_(group_id) {
  FlightRecorder &recorder = FlightRecorder::get();
  trace_group_ = recorder.add_group(group_id + ":shrunk", rank, size);
  timeout_ms_ = timeout_ms;
  start_threads();
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupRuccl::shrink(const std::vector<int64_t> &ranks_to_exclude,
                                                            int shrink_flags,
                                                            const c10::intrusive_ptr<Options> & /*opts_override*/) {
  constexpr int kShrinkAbort = 1; // torch's SHRINK_ABORT
  if (shrink_flags & ~kShrinkAbort)
    fail(RUCCL_ERR_INVALID_ARGUMENT, "shrink: flags " + std::to_string(shrink_flags) + " (SHRINK_DEFAULT 0, SHRINK_ABORT 1)");
  std::vector<uint32_t> exclude;
  for (int64_t r : ranks_to_exclude) {
    if (r < 0 || r >= size_) fail(RUCCL_ERR_INVALID_ARGUMENT, "shrink: rank " + std::to_string(r) + " is not in the group");
    if (r == rank_) fail(RUCCL_ERR_INVALID_ARGUMENT, "shrink: this rank is in its own exclude list");
    exclude.push_back(id_of(static_cast<int>(r)));
  }
  if (shrink_flags & kShrinkAbort) {
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (comm_) check(ruccl_comm_revoke(comm_)); // a survivor blocked in a collective returns now
  }
  ruccl_comm_t *out = nullptr;
  auto run = [&] {
    // In the queue's order: after the ops issued before (which a revoke fails at once).
    auto work = enqueue(c10d::OpType::UNKNOWN, "ruccl:shrink", {}, [this, &exclude, &out] {
      check(ruccl_comm_shrink(comm_, exclude.data(), exclude.size(), &out));
    }, {}, true);
    work->wait();
  };
  if (PyGILState_Check()) { // ranks as threads of one process (torchft's tests) meet in the core
    pybind11::gil_scoped_release nogil;
    run();
  } else {
    run();
  }
  try {
    unsigned size = 0, index = 0;
    check(ruccl_comm_size(out, &size));
    check(ruccl_comm_index(out, &index));
    // torch numbers the new group as the old one without ranks_to_exclude: a rank the
    // core also found lost (not in the list) would shift every rank after it
    if (static_cast<int>(size) != size_ - static_cast<int>(exclude.size()))
      fail(RUCCL_ERR_INVALID_ARGUMENT,
           "shrink: " + std::to_string(size_ - static_cast<int>(exclude.size()) - static_cast<int>(size)) +
               " rank(s) not in ranks_to_exclude were found lost as well: list every lost rank in ranks_to_exclude");
    auto ids = std::make_shared<std::vector<uint32_t>>(size);
    for (unsigned i = 0; i < size; i++) check(ruccl_comm_peer(out, i, &(*ids)[i]));
    return c10::make_intrusive<ProcessGroupRuccl>(out, static_cast<int>(index), static_cast<int>(size), std::move(ids),
                                                  timeout_ms_.load(), group_id_);
  } catch (...) {
    ruccl_finish(out); // the new communicator is nobody's
    throw;
  }
}

}  // namespace ruccl_torch
