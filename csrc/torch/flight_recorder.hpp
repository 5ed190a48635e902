// flight_recorder.hpp — what every rank was doing when a job hung or failed.
//
// Each process keeps a ring of its last RUCCL_TRACE_BUFFER collectives and
// point-to-point calls (default 2000; 0: no recorder), over every ruccl group it has.
// An entry holds the group and its sequence number, the call (kind, dtype, shape, op,
// root or peer), the algorithm the core took, the times it was issued, started and
// finished, and its state: queued, running, done or error (with the error's text).
//
// The ring is written to RUCCL_TRACE_DIR, one JSON file per process
// (ruccl_trace_rank_<rank>.json, replaced atomically), when a call fails (a timeout,
// an abort, a lost peer, a contract the ranks broke), when the group is aborted, when
// ruccl_pg.dump_trace() asks, and on SIGUSR1 (installed when RUCCL_TRACE_DIR is set,
// chained to the handler it replaces).  `python -m ruccl_pg.trace DIR` reads the
// files of every rank and names where they part.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

namespace ruccl_torch {

enum class TraceState : uint8_t { Queued, Running, Done, Error };

// A call as the recorder notes it at issue.
struct TraceCall {
  const char *op = nullptr;  // the reduce op's name (SUM, AVG, PREMUL_SUM...), or none
  int root = -1;             // the root (broadcast, reduce, gather, scatter), or -1
  bool p2p = false;          // point-to-point, though not a send or receive (a coalesced block of them)
};

// The tensors of a call, as an entry keeps them: the first one's dtype and shape, and
// how many there are.  Taken on the caller's thread, before the call is queued.
struct TraceTensors {
  static constexpr int kDims = 6;  // shape dims kept (more: the element count, as one dim)
  int8_t dtype = -1;               // at::ScalarType, -1: no tensor
  int8_t ndim = -1;
  int64_t shape[kDims] = {};
  int32_t count = 0;

  void add(const at::Tensor &t);
  template <typename Seq>
  static TraceTensors of(const Seq &tensors) {
    TraceTensors d;
    for (const at::Tensor &t : tensors) d.add(t);
    return d;
  }
};

// The algorithm an entry of a send, a receive or a block of them names.
constexpr const char *kP2pAlgorithm = "p2p";

class FlightRecorder {
 public:
  static FlightRecorder &get();

  bool enabled() const { return capacity_ > 0; }
  // The rank in the process's file name: RANK when set, else the first group's rank.
  void note_process_rank(int rank);
  // A group of this process; its index in the dump's group table.
  uint32_t add_group(const std::string &name, int rank, int size);

  // A call issued: its record id (0 when the recorder is off).  title: the Work's
  // ("ruccl:all_reduce", a literal); the entry's kind is what follows "ruccl:".
  uint64_t issued(uint32_t group, uint64_t seq, bool p2p, const char *title, const TraceTensors &tensors,
                  const TraceCall &call, bool started);
  void started(uint64_t id);
  // Finished: done, or error (then written to RUCCL_TRACE_DIR, if set).  algorithm: how
  // the core ran it (ruccl_comm_algorithm), or null.
  void finished(uint64_t id, const char *algorithm, std::exception_ptr error);

  // Writes the ring to dir (empty: RUCCL_TRACE_DIR); returns the file's path.  Throws
  // when there is no directory to write to, or it cannot be written.
  std::string dump(const std::string &dir, const std::string &reason);
  // dump() to RUCCL_TRACE_DIR when it is set; never throws (a warning instead).
  void dump_if_configured(const std::string &reason);

 private:
  struct Entry {
    uint64_t id = 0;
    uint32_t group = 0;
    uint64_t seq = 0;
    bool p2p = false;
    const char *kind = "";
    TraceTensors tensors;
    const char *op = nullptr;
    int32_t root = -1;
    char algorithm[64] = {};
    int64_t issued_ns = 0, started_ns = 0, finished_ns = 0;
    TraceState state = TraceState::Queued;
    char error[160] = {};  // the error's text (its first bytes)
  };
  struct Group {
    std::string name;
    int rank, size;
  };

  FlightRecorder();
  Entry *find(uint64_t id);  // under mu_; null when overwritten or unknown
  void start_dumper();       // the thread that writes what SIGUSR1 and error bursts ask for
  void dumper_loop();

  std::mutex mu_;
  std::mutex dump_mu_;  // one file write at a time (errors on several threads, SIGUSR1)
  int64_t last_error_dump_ns_ = 0;  // under mu_: errors within a second of it are written by the dumper
  std::string pending_reason_;      // under mu_: why the dumper was woken for an error
  size_t capacity_ = 0;
  std::vector<Entry> ring_;
  uint64_t next_id_ = 1;
  std::vector<Group> groups_;
  int process_rank_ = -1;
  std::string dir_;  // RUCCL_TRACE_DIR
};

}  // namespace ruccl_torch
