// ProcessGroupRuccl.cpp — see ProcessGroupRuccl.hpp: the backend's queue.  Calls are
// queued in issue order and run one at a time, on a worker or inline on a caller that
// waits; a job's errors complete its work; coalescing blocks run as one job; shutdown
// and abort.  The parts, top-down: rendezvous.cpp (the registration), collectives.cpp
// and p2p.cpp (each c10d call as core calls), work.cpp and streams.cpp (the Work and
// its stream contract), flight_recorder.cpp (what each call did, for the trace),
// tensors.cpp (views, staging, reduce ops, argument checks), errors.hpp (the error text).
#include "ProcessGroupRuccl.hpp"

#include <c10/util/Exception.h>

#include <cstring>
#include <mutex>
#include <stdexcept>

#include "errors.hpp"
#include "streams.hpp"

namespace ruccl_torch {
ProcessGroupRuccl::~ProcessGroupRuccl() { shutdown(); }

// Every blocked or queued call of this group returns RUCCL_ERR_ABORTED promptly (on
// the other ranks too), then the group shuts down.
void ProcessGroupRuccl::abort() {
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (comm_) ruccl_comm_abort(comm_);
  }
  FlightRecorder::get().dump_if_configured("abort");
  shutdown();
}

void ProcessGroupRuccl::setTimeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) fail(RUCCL_ERR_INVALID_ARGUMENT, "timeout must be > 0 ms");
  timeout_ms_ = timeout.count();
  std::lock_guard<std::mutex> lock(comm_mu_);
  if (comm_) check(ruccl_comm_set_timeout(comm_, timeout_ms_)); // for the receives posted from now on
}

// Runs what was queued, fails what was being coalesced, stops the workers and ends
// this peer's session.  Called again (destroy_process_group, then the destructor),
// it waits for the first call.  Called on a worker (a future callback that destroys
// the group), that worker is let go instead of joined: it touches nothing of ours
// after the callback (see worker_loop).
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
                                                          std::chrono::milliseconds timeout, TraceCall trace) {
  std::vector<at::Tensor> touched = outputs;
  touched.insert(touched.end(), inputs.begin(), inputs.end());
  for (const auto &op : p2p) touched.push_back(op.tensor);
  std::shared_ptr<StreamSync> sync = sync_at_issue(touched); // refuses a CUDA graph capture
  FlightRecorder &recorder = FlightRecorder::get();
  TraceTensors described;  // what the flight recorder says of the call's tensors
  if (recorder.enabled()) {
    if (!inputs.empty()) described = TraceTensors::of(inputs);
    else if (!outputs.empty()) described = TraceTensors::of(outputs);
    else for (const auto &op : p2p) described.add(op.tensor);
  }
  auto work = c10::make_intrusive<WorkRuccl>(rank_, type, title, std::move(outputs), std::move(touched), sync);
  Job job{std::move(run), std::move(p2p), work, std::move(sync), std::move(after),
          timeout.count() > 0 ? timeout.count() : 0};
  {
    std::unique_lock<std::mutex> lock(q_->mu);
    if (q_->stopping) fail(RUCCL_ERR_NOT_REGISTERED, "the process group was shut down");
    if (q_->coalescing && caller_waits)
      fail(RUCCL_ERR_INVALID_ARGUMENT, std::string(title) + " with async_op=False inside a coalescing block: "
                                                         "it would wait for ops that run only at its end");
    bool now = !q_->coalescing && caller_waits && !q_->busy && q_->jobs.empty(); // inline, on this thread
    bool is_p2p = type == c10d::OpType::SEND || type == c10d::OpType::RECV ||
                  type == c10d::OpType::RECVANYSOURCE || trace.p2p;
    uint64_t seq = is_p2p ? p2p_seq_++ : seq_++; // numbered from 0, as the core numbers its collectives
    job.trace_id = recorder.issued(trace_group_, seq, is_p2p, title, described, trace, now);
    job.trace_started = now;
    if (q_->coalescing) {
      q_->coalesced.push_back(std::move(job));
      return work;
    }
    if (!now) {
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
  if (!job.trace_started) FlightRecorder::get().started(job.trace_id);
  std::exception_ptr error = run_job_body(job);
  if (job.trace_id) { // copied now: the next job may run before this one completes
    const char *algorithm = "";
    if (!job.p2p.empty()) algorithm = kP2pAlgorithm;
    else ruccl_comm_algorithm(comm_, &algorithm);
    std::strncpy(job.algorithm, algorithm, sizeof job.algorithm - 1);
  }
  return error;
}

std::exception_ptr ProcessGroupRuccl::run_job_body(Job &job) {
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
  // recorded (and, on an error, dumped) before the caller can see the outcome
  FlightRecorder::get().finished(job.trace_id, job.algorithm, error);
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
  bool all_p2p = !jobs.empty(); // a block of sends and receives (batch_isend_irecv) is point-to-point
  for (auto &j : jobs) {
    for (auto &t : j.work->result()) outputs.push_back(t);
    all_p2p &= !j.p2p.empty();
  }
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
          FlightRecorder::get().started(jobs[j].trace_id);
          std::strncpy(jobs[j].algorithm, kP2pAlgorithm, sizeof jobs[j].algorithm - 1);
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
  TraceCall trace;
  trace.p2p = all_p2p;
  return enqueue(c10d::OpType::COALESCED, "ruccl:coalesced", outputs, run, {}, false, [shared, errors] {
    for (size_t i = 0; i < shared->size(); i++) complete((*shared)[i], (*errors)[i]);
  }, {}, c10d::kUnsetTimeout, trace);
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

}  // namespace ruccl_torch
