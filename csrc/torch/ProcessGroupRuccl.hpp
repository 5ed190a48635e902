// ProcessGroupRuccl.hpp — the torch shim: a c10d::Backend that forwards every
// collective to the ruCCL C API (include/ruccl.h).
//
// One process is one ruCCL node with one peer (peer id = group rank); the nodes
// rendezvous through the c10d::Store torch hands the backend, so no extra server
// runs.  Calls are queued in issue order and run one at a time (on one of the
// backend's two workers, or inline on a caller that waits: the C communicator is used
// by one thread at a time, and ops must run in the order the ranks issued them); each returns a Work whose future completes with the output
// tensors.  Tensors the C core cannot take directly go through copies here:
// non-contiguous ones through contiguous copies on their device, CUDA tensors
// through host copies unless the extension is built with CUDA (RUCCL_TORCH_CUDA:
// setup.py builds the core with its CUDA adapter then, and CUDA tensors go to it
// as they are, ordered with the caller's streams as torch's own backends do; see
// StreamSync in streams.hpp).  The parts of the shim, file by file: ProcessGroupRuccl.cpp.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "ruccl.h"
}

#include "flight_recorder.hpp"

namespace ruccl_torch {

// The backend's liveness timeout where RUCCL_LIVENESS_TIMEOUT_MS is unset: a rank that is
// frozen (SIGSTOP, a hung host) is RUCCL_ERR_PEER_LOST on every survivor after about this
// long.  Its heartbeat thread beats whatever Python does, so only a stopped or starved
// process is silent this long; reference §4 says why 10 s.
constexpr int64_t kTrainingLivenessTimeoutMs = 10000;

// What the Python registration hands over (torch's DistributedBackendOptions and
// what ruccl_pg works out: this node's address).
struct RucclOptions {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::string group_id;
  std::string node_address = "127.0.0.1";
};

// How a job is ordered with the device streams of the tensors it touches (defined in
// streams.hpp: with CUDA, events on the caller's streams and side streams of the job's
// own; without, the caller's stream the host copies run on).  Null for CPU tensors.
struct StreamSync;

class WorkRuccl : public c10d::Work {
 public:
  // keep: every tensor the op reads or writes, held until the work is destroyed.
  WorkRuccl(int rank, c10d::OpType type, const char *title, std::vector<at::Tensor> outputs,
            std::vector<at::Tensor> keep, std::shared_ptr<StreamSync> sync);
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  // Blocks the host until the work is complete (as gloo's does), then makes the
  // caller's current streams wait for it.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  // The caller's current streams wait for the work (once it is complete).
  void synchronize() override;
  // Called once, on the worker: completes the work and its future.
  void complete(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;
  std::shared_ptr<StreamSync> sync_;
  std::atomic<bool> ran_{false}; // complete() was called: sync_'s `done` events are final
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Rank -> peer id of a group a shrink made (peer ids stay, ranks close up); null or
// empty: the id is the rank.
using PeerIds = std::shared_ptr<const std::vector<uint32_t>>;
inline uint32_t id_of_rank(const PeerIds &ids, int rank) {
  if (!ids || ids->empty()) return static_cast<uint32_t>(rank);
  // a rank out of range becomes an id no peer has: the core refuses it as it refuses any
  return rank >= 0 && static_cast<size_t>(rank) < ids->size() ? (*ids)[static_cast<size_t>(rank)] : UINT32_MAX - 1;
}
inline int rank_of_id(const PeerIds &ids, uint32_t id) {
  if (!ids || ids->empty()) return static_cast<int>(id);
  for (size_t r = 0; r < ids->size(); r++)
    if ((*ids)[r] == id) return static_cast<int>(r);
  return -1;
}

// A point-to-point op on host tensors, posted at issue (ruccl_isend / ruccl_irecv).
// A send is complete when posted; a receive completes when waited for, or when the
// backend's completer sees it done (which completes the future).  The request is
// freed with the work.
class WorkRucclP2p : public WorkRuccl {
 public:
  WorkRucclP2p(int rank, c10d::OpType type, const char *title, at::Tensor user, at::Tensor buf, ruccl_request_t *req,
               bool recv, PeerIds ids);
  ~WorkRucclP2p() override;
  // Blocks until the op completes; with a timeout, throws RUCCL_ERR_TIMEOUT when it
  // has not completed by then (the receive stays posted).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  int sourceRank() const override; // the sender of a completed receive
  bool settle();                    // completes the work if its request is done; whether it is
  bool settled() const { return settled_.load(); }
  ruccl_request_t *request() const { return req_; }
  void set_trace(uint64_t id) { trace_id_ = id; } // the flight recorder's entry


 private:
  void conclude(ruccl_result_t rc); // once: copies a receive back, completes the work
  at::Tensor user_, buf_;
  ruccl_request_t *req_;
  bool recv_;
  std::atomic<bool> settled_{false};
  std::atomic<int> source_{-1};
  PeerIds ids_;
  uint64_t trace_id_ = 0;
};

class ProcessGroupRuccl : public c10d::Backend {
 public:
  explicit ProcessGroupRuccl(const RucclOptions &opts);
  // A group a shrink made, on its communicator (no rendezvous): shrink.cpp.
  ProcessGroupRuccl(ruccl_comm_t *comm, int rank, int size, PeerIds ids, int64_t timeout_ms, const std::string &group_id);
  ~ProcessGroupRuccl() override;

  const std::string getBackendName() const override { return "ruccl"; }
  void shutdown() override;
  void abort() override;
  // The timeout of later ops that name none (torch's _set_default_timeout).
  void setTimeout(std::chrono::milliseconds timeout) override;

  // dist.shrink_group (shrink.cpp): the survivors make a new group without
  // ranks_to_exclude (and any rank the core finds lost), ranked densely in the old
  // order; SHRINK_ABORT (1) revokes this group first, so that a survivor blocked in a
  // collective returns at once.  This group stays (revoked, if it was) until shutdown.
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t> &ranks_to_exclude, int shrink_flags = 0,
                                           const c10::intrusive_ptr<Options> &opts_override = nullptr) override;

  // Coalescing (batch_isend_irecv, _coalescing_manager): the ops issued between
  // start and end run as one job; the point-to-point ones as one ruccl_p2p_group, so
  // an exchange in both directions cannot deadlock.
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                           const c10d::BroadcastOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                           const c10d::AllreduceOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor> &tensors,
                                                     const c10d::AllreduceCoalescedOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors, const c10d::ReduceOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                           std::vector<at::Tensor> &inputs,
                                           const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                 const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>> &outputs,
                                                     std::vector<at::Tensor> &inputs,
                                                     const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor> &outputs,
                                                                 std::vector<at::Tensor> &inputs,
                                                                 const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                        std::vector<at::Tensor> &inputs, const c10d::GatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                         std::vector<std::vector<at::Tensor>> &inputs,
                                         const c10d::ScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                std::vector<std::vector<at::Tensor>> &inputs,
                                                const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                                      const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor> &outputs,
                                                                 std::vector<at::Tensor> &inputs,
                                                                 const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                               std::vector<int64_t> &output_split_sizes,
                                               std::vector<int64_t> &input_split_sizes,
                                               const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
                                          const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override;

  // Collectives issued so far (point-to-point calls not counted), as gloo counts
  // them: what torch's debug wrapper compares across ranks.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }

  // One point-to-point operation, as the worker runs it.
  struct P2pOp {
    bool send;
    at::Tensor tensor;
    int peer; // a receive: -1 = any
    int tag = 0;
  };

 private:
  // A queued call: `run` does the collective (throwing on a ruCCL error); p2p holds
  // the point-to-point operations instead when the call is one.
  struct Job {
    std::function<void()> run;
    std::vector<P2pOp> p2p;
    c10::intrusive_ptr<WorkRuccl> work;
    std::shared_ptr<StreamSync> sync; // with device tensors: how the job follows the caller's streams
    std::function<void()> after;      // run after the group is free, before the work completes
    int64_t timeout_ms = 0;           // the op's own; 0: the group's
    uint64_t trace_id = 0;            // its flight recorder entry (0: none)
    bool trace_started = false;       // the entry says running already (a job run inline)
    char algorithm[64] = {};          // how the core ran it (ruccl_comm_algorithm), for the recorder
  };

  // Receives in flight, for the completer thread.
  struct P2pState {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<c10::intrusive_ptr<WorkRucclP2p>> works;
    bool stop = false;
  };

  // The queue, shared with the workers: a worker whose future callback destroyed the
  // backend (shutdown() lets that thread go) still finds it after the callback.
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Job> jobs;
    bool busy = false;     // a job is running, on a worker or inline on a caller
    bool stopping = false; // shutdown has begun: nothing new is queued
    bool shut = false;     // shutdown has finished: workers joined, comm finished
    bool coalescing = false;
    std::vector<Job> coalesced;
  };

  // caller_waits (a collective called with async_op=False): when nothing is queued
  // or running, the call runs on the caller's thread, saving two thread hand-offs.
  // inputs: the tensors the op reads that are not among outputs (nor in p2p).
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char *title, std::vector<at::Tensor> outputs,
                                         std::function<void()> run, std::vector<P2pOp> p2p = {},
                                         bool caller_waits = false, std::function<void()> after = nullptr,
                                         std::vector<at::Tensor> inputs = {},
                                         std::chrono::milliseconds timeout = c10d::kUnsetTimeout,
                                         TraceCall trace = {});
  c10::intrusive_ptr<c10d::Work> post_p2p(bool send, at::Tensor t, int peer, int tag);
  c10::intrusive_ptr<c10d::Work> after_all(c10d::OpType type, const char *title, std::vector<at::Tensor> outputs,
                                           std::vector<c10::intrusive_ptr<c10d::Work>> works);
  static void completer_loop(std::shared_ptr<P2pState> st);
  static void worker_loop(ProcessGroupRuccl *self, std::shared_ptr<Queue> q);
  // Runs the job (never throws); returns the error, if any, for complete().
  std::exception_ptr run_job(Job &job);
  std::exception_ptr run_job_body(Job &job);
  static void complete(Job &job, std::exception_ptr error);   // the work and its future; never throws
  static void finish_job(Job &job, std::exception_ptr error); // after, then complete
  static void release_queue(Queue &q); // busy = false; wakes the workers if one has work
  void run_p2p(std::vector<P2pOp> &ops);

  void start_threads();
  uint32_t id_of(int rank) const { return id_of_rank(ids_, rank); }

  ruccl_comm_t *comm_ = nullptr;
  PeerIds ids_; // rank -> peer id, after a shrink (else empty)
  std::string group_id_;
  std::mutex comm_mu_; // abort() against shutdown()'s finish
  std::atomic<int64_t> timeout_ms_{RUCCL_DEFAULT_TIMEOUT_MS};
  std::shared_ptr<Queue> q_ = std::make_shared<Queue>();
  std::vector<std::thread> workers_;
  std::shared_ptr<P2pState> p2p_ = std::make_shared<P2pState>();
  std::thread completer_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<uint64_t> p2p_seq_{0}; // point-to-point calls issued (the flight recorder's count)
  uint32_t trace_group_ = 0;          // this group in the flight recorder
};

}  // namespace ruccl_torch
