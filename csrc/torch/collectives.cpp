// collectives.cpp — each c10d collective as calls of the core: its arguments checked
// on the caller's thread, then a job that stages the tensors and runs the core's
// collective on the group's queue.
#include "ProcessGroupRuccl.hpp"

#include "errors.hpp"
#include "tensors.hpp"

namespace ruccl_torch {
namespace {

// The options of one op of a coalesced form: queued, whether or not the caller waits
// for the whole (inside a coalescing block an op that waits would wait for its end).
template <typename Options>
Options queued(const Options &opts) {
  Options o = opts;
  o.asyncOp = true;
  return o;
}

}  // namespace

// A coalesced form's work: queued after its ops, done when they are, failed if any
// failed.  Inside a coalescing block (torch's _coalescing_manager with a device) its
// ops complete only when the block has run: there it waits for nothing, and completes
// after them, in order, as the block's works do.
c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::after_all(c10d::OpType type, const char *title,
                                                            std::vector<at::Tensor> outputs,
                                                            std::vector<c10::intrusive_ptr<c10d::Work>> works) {
  bool coalescing;
  {
    std::lock_guard<std::mutex> lock(q_->mu);
    coalescing = q_->coalescing;
  }
  if (coalescing) return enqueue(type, title, std::move(outputs), [] {});
  return enqueue(type, title, std::move(outputs), [works] {
    for (auto &w : works) w->wait();
  });
}

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
  }, {}, !opts.asyncOp, nullptr, {}, opts.timeout, {op_name(opts.reduceOp.op_)});
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
  }, {}, false, nullptr, {}, c10d::kUnsetTimeout, {op_name(opts.reduceOp.op_)});
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
    check(ruccl_broadcast_from(comm_, &v, id_of(static_cast<int>(root))));
    h.put();
  }, {}, !opts.asyncOp, nullptr, {}, opts.timeout, {nullptr, static_cast<int>(root)});
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
    check(ruccl_reduce(comm_, &v, is_root ? &v : nullptr, op.op, id_of(static_cast<int>(root))));
    if (!is_root) return;
    op.result(x, h.buf);
    h.put();
  }, {}, !opts.asyncOp, nullptr, {}, opts.timeout, {op_name(opts.reduceOp.op_), static_cast<int>(root)});
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
    works.push_back(allgather(o, in, queued(opts)));
  }
  for (const auto &o : outputs) all_outputs.insert(all_outputs.end(), o.begin(), o.end());
  return after_all(c10d::OpType::ALLGATHER_COALESCED, "ruccl:all_gather_coalesced", all_outputs, works);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::allgather_into_tensor_coalesced(std::vector<at::Tensor> &outputs,
                                                                                  std::vector<at::Tensor> &inputs,
                                                                                  const c10d::AllgatherOptions &opts) {
  if (outputs.size() != inputs.size())
    fail(RUCCL_ERR_INVALID_ARGUMENT, "allgather_into_tensor_coalesced: output and input counts differ");
  for (size_t i = 0; i < inputs.size(); i++) check_gather_base(outputs[i], inputs[i], size_);
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); i++) works.push_back(_allgather_base(outputs[i], inputs[i], queued(opts)));
  return after_all(c10d::OpType::COALESCED, "ruccl:all_gather_into_tensor_coalesced", outputs, works);
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
  }, {}, !opts.asyncOp, nullptr, {in}, opts.timeout, {op_name(opts.reduceOp.op_)});
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
  }, {}, !opts.asyncOp, nullptr, ins, opts.timeout, {op_name(opts.reduceOp.op_)});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs, const c10d::ReduceScatterOptions &opts) {
  if (outputs.size() != inputs.size())
    fail(RUCCL_ERR_INVALID_ARGUMENT, "reduce_scatter_tensor_coalesced: output and input counts differ");
  for (size_t i = 0; i < inputs.size(); i++) check_scatter_base(outputs[i], inputs[i], opts.reduceOp, size_);
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); i++)
    works.push_back(_reduce_scatter_base(outputs[i], inputs[i], queued(opts)));
  return after_all(c10d::OpType::COALESCED, "ruccl:reduce_scatter_tensor_coalesced", outputs, works);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRuccl::barrier(const c10d::BarrierOptions &opts) {
  return enqueue(c10d::OpType::BARRIER, "ruccl:barrier", {}, [this] { check(ruccl_barrier(comm_)); }, {},
                 !opts.asyncOp, nullptr, {}, opts.timeout);
}

}  // namespace ruccl_torch
