// p2p.cpp — point-to-point (send, recv, their coalesced groups) and what torch builds
// on it here: gather, scatter and all-to-all, as groups of messages on a tag no caller
// can use; and the completer thread that finishes the receives nobody waits for.
#include "ProcessGroupRuccl.hpp"

#include <algorithm>

#include "errors.hpp"
#include "tensors.hpp"

namespace ruccl_torch {

void ProcessGroupRuccl::run_p2p(std::vector<P2pOp> &ops) {
  std::vector<Staged> staged;
  staged.reserve(ops.size());
  for (auto &op : ops) staged.emplace_back(op.tensor, op.send);
  std::vector<ruccl_tensor_t> views(ops.size());
  std::vector<ruccl_p2p_op_t> c_ops(ops.size());
  for (size_t i = 0; i < ops.size(); i++) {
    views[i] = view(staged[i].buf);
    c_ops[i] = {ops[i].send ? RUCCL_P2P_SEND : RUCCL_P2P_RECV, &views[i],
                ops[i].peer < 0 ? RUCCL_ANY_PEER : id_of(ops[i].peer), ops[i].tag};
  }
  check(ruccl_p2p_group(comm_, c_ops.data(), c_ops.size()));
  for (size_t i = 0; i < ops.size(); i++)
    if (!ops[i].send) staged[i].put();
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
  if (queued) return enqueue(type, title, {t}, nullptr, {{send, t, peer, tag}}, false, nullptr, {},
                             c10d::kUnsetTimeout, {nullptr, peer});
  at::Tensor buf = t.is_contiguous() ? t : send ? t.contiguous() : at::empty(t.sizes(), t.options());
  ruccl_tensor_t v = view(buf);
  ruccl_request_t *req = nullptr;
  FlightRecorder &recorder = FlightRecorder::get();
  TraceTensors described;
  described.add(t);
  uint64_t trace = recorder.issued(trace_group_, p2p_seq_++, true, title, described, {nullptr, peer}, true);
  ruccl_result_t rc = send ? ruccl_isend(comm_, &v, id_of(peer), tag, &req)
                           : ruccl_irecv(comm_, &v, peer < 0 ? RUCCL_ANY_PEER : id_of(peer), tag, &req);
  try {
    check(rc);
  } catch (...) {
    recorder.finished(trace, kP2pAlgorithm, std::current_exception());
    throw;
  }
  auto work = c10::make_intrusive<WorkRucclP2p>(rank_, type, title, t, buf, req, !send, ids_);
  work->set_trace(trace);
  if (send) recorder.finished(trace, kP2pAlgorithm, nullptr); // eager: handed over when posted
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
  return enqueue(c10d::OpType::GATHER, "ruccl:gather", outs, nullptr, ops, false, nullptr, {}, opts.timeout,
                 {nullptr, root});
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
  return enqueue(c10d::OpType::SCATTER, "ruccl:scatter", {out}, nullptr, ops, false, nullptr, {}, opts.timeout,
                 {nullptr, root});
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
