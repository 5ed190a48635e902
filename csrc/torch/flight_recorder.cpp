// flight_recorder.cpp — see flight_recorder.hpp.
#include "flight_recorder.hpp"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "errors.hpp"

namespace ruccl_torch {
namespace {

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);  // wall clock: comparable across the ranks' files
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

size_t capacity_from_env() {
  const char *v = std::getenv("RUCCL_TRACE_BUFFER");
  if (!v || !*v) return 2000;
  char *end = nullptr;
  errno = 0;
  long long n = std::strtoll(v, &end, 10);
  if (errno || *end || n < 0 || n > (1 << 24))
    fail(RUCCL_ERR_INVALID_CONFIG, std::string("RUCCL_TRACE_BUFFER=") + v +
                                       ": expected a count of entries from 0 (no recorder) to 16777216");
  return static_cast<size_t>(n);
}

const char *state_name(TraceState s) {
  switch (s) {
    case TraceState::Queued: return "queued";
    case TraceState::Running: return "running";
    case TraceState::Done: return "done";
    case TraceState::Error: return "error";
  }
  return "?";
}

void json_string(std::ostream &o, const char *s) {
  o << '"';
  for (; s && *s; s++) {
    unsigned char c = static_cast<unsigned char>(*s);
    switch (c) {
      case '"': o << "\\\""; break;
      case '\\': o << "\\\\"; break;
      case '\n': o << "\\n"; break;
      case '\t': o << "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o << buf;
        } else {
          o << static_cast<char>(c);
        }
    }
  }
  o << '"';
}

// The dumper's wake-up: a byte on a pipe, kSignal from the SIGUSR1 handler (all it
// does: write() is async-signal-safe), kError when errors come faster than one a second.
int g_signal_pipe[2] = {-1, -1};
struct sigaction g_previous;
constexpr char kSignal = 1, kError = 2;

void wake(char why) {
  ssize_t ignored = write(g_signal_pipe[1], &why, 1);  // non-blocking: a full pipe has a wake-up pending
  (void)ignored;
}

void on_sigusr1(int sig, siginfo_t *info, void *ctx) {
  int saved = errno;
  char b = kSignal;
  ssize_t ignored = write(g_signal_pipe[1], &b, 1);
  (void)ignored;
  errno = saved;
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) g_previous.sa_sigaction(sig, info, ctx);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler) {
    g_previous.sa_handler(sig);
  }
}

// Copies at most cap - 1 bytes of s, terminated (no printf machinery on the hot path).
void copy_text(char *dst, size_t cap, const char *s) {
  size_t n = s ? strnlen(s, cap - 1) : 0;
  std::memcpy(dst, s ? s : "", n);
  dst[n] = '\0';
}

}  // namespace

void TraceTensors::add(const at::Tensor &t) {
  if (!t.defined()) return;
  if (count++ > 0) return;  // the first tensor's dtype and shape
  dtype = static_cast<int8_t>(t.scalar_type());
  if (t.dim() <= kDims) {
    ndim = static_cast<int8_t>(t.dim());
    for (int64_t d = 0; d < t.dim(); d++) shape[d] = t.size(d);
  } else {
    ndim = 1;
    shape[0] = t.numel();
  }
}

FlightRecorder &FlightRecorder::get() {
  static FlightRecorder *recorder = new FlightRecorder();  // never destroyed: the signal thread uses it
  return *recorder;
}

FlightRecorder::FlightRecorder() {
  capacity_ = capacity_from_env();
  ring_.resize(capacity_);
  const char *dir = std::getenv("RUCCL_TRACE_DIR");
  if (dir && *dir) dir_ = dir;
  const char *rank = std::getenv("RANK");
  if (rank && *rank) process_rank_ = std::atoi(rank);
  if (capacity_ > 0 && !dir_.empty()) start_dumper();
}

void FlightRecorder::dumper_loop() {
  char bytes[64];
  for (;;) {
    ssize_t n = read(g_signal_pipe[0], bytes, sizeof bytes);  // every wake-up so far: one dump
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    bool signal = false;
    for (ssize_t i = 0; i < n; i++) signal |= bytes[i] == kSignal;
    std::string reason = "SIGUSR1";
    if (!signal) {
      std::lock_guard<std::mutex> lock(mu_);
      reason = pending_reason_;
    }
    dump_if_configured(reason);
  }
}

// SIGUSR1 no longer ends the process (its default): it writes the trace, then runs the
// handler it replaced, if that was a function.
void FlightRecorder::start_dumper() {
  if (pipe(g_signal_pipe) != 0) return;
  fcntl(g_signal_pipe[0], F_SETFD, FD_CLOEXEC);
  fcntl(g_signal_pipe[1], F_SETFD, FD_CLOEXEC);
  fcntl(g_signal_pipe[1], F_SETFL, O_NONBLOCK);
  std::thread([this] { dumper_loop(); }).detach();
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigusr1;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, &g_previous);
}

void FlightRecorder::note_process_rank(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (process_rank_ < 0) process_rank_ = rank;
}

uint32_t FlightRecorder::add_group(const std::string &name, int rank, int size) {
  std::lock_guard<std::mutex> lock(mu_);
  groups_.push_back({name, rank, size});
  return static_cast<uint32_t>(groups_.size() - 1);
}

FlightRecorder::Entry *FlightRecorder::find(uint64_t id) {
  if (!id || !capacity_) return nullptr;
  Entry &e = ring_[(id - 1) % capacity_];
  return e.id == id ? &e : nullptr;
}

uint64_t FlightRecorder::issued(uint32_t group, uint64_t seq, bool p2p, const char *title,
                                const TraceTensors &tensors, const TraceCall &call, bool started) {
  if (!capacity_) return 0;
  const char *kind = std::strncmp(title, "ruccl:", 6) == 0 ? title + 6 : title;
  int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = next_id_++;
  Entry &e = ring_[(id - 1) % capacity_];
  e.id = id;
  e.group = group;
  e.seq = seq;
  e.p2p = p2p;
  e.kind = kind;
  e.tensors = tensors;
  e.op = call.op;
  e.root = call.root;
  e.algorithm[0] = '\0';
  e.issued_ns = t;
  e.started_ns = started ? t : 0;
  e.finished_ns = 0;
  e.state = started ? TraceState::Running : TraceState::Queued;
  e.error[0] = '\0';
  return id;
}

void FlightRecorder::started(uint64_t id) {
  if (!id) return;
  int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry *e = find(id)) {
    e->started_ns = t;
    e->state = TraceState::Running;
  }
}

void FlightRecorder::finished(uint64_t id, const char *algorithm, std::exception_ptr error) {
  if (!id) return;
  std::string why;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception &x) {
      why = x.what();
    } catch (...) {
      why = "unknown error";
    }
  }
  int64_t t = now_ns();
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry *e = find(id);
    if (!e) return;
    if (!e->started_ns) e->started_ns = t;
    e->finished_ns = t;
    e->state = error ? TraceState::Error : TraceState::Done;
    copy_text(e->algorithm, sizeof e->algorithm, algorithm);
    if (error) copy_text(e->error, sizeof e->error, why.c_str());
  }
  if (!error || dir_.empty()) return;
  // The first error of a burst is written before its caller sees it; the rest of the
  // burst (every queued call fails after a lost peer) by the dumper, once.
  std::string reason = "error: " + why.substr(0, why.find(':'));
  bool now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    now = t - last_error_dump_ns_ >= 1000000000;
    if (now) last_error_dump_ns_ = t;
    else pending_reason_ = reason;
  }
  if (now) dump_if_configured(reason);
  else wake(kError);
}

std::string FlightRecorder::dump(const std::string &dir_arg, const std::string &reason) {
  std::string dir = dir_arg.empty() ? dir_ : dir_arg;
  if (dir.empty())
    fail(RUCCL_ERR_INVALID_ARGUMENT, "dump_trace: no directory (pass one, or set RUCCL_TRACE_DIR)");
  std::lock_guard<std::mutex> writing(dump_mu_);  // the later snapshot is the one the file keeps
  std::vector<Entry> entries;
  std::vector<Group> groups;
  int rank;
  {
    std::lock_guard<std::mutex> lock(mu_);
    groups = groups_;
    rank = process_rank_ < 0 ? 0 : process_rank_;
    uint64_t first = next_id_ > capacity_ ? next_id_ - capacity_ : 1;
    for (uint64_t id = first; id < next_id_; id++)
      if (const Entry *e = find(id)) entries.push_back(*e);
  }
  std::ostringstream o;
  o << "{\"version\": 1, \"rank\": " << rank << ", \"pid\": " << getpid() << ", \"reason\": ";
  json_string(o, reason.c_str());
  o << ", \"dumped_ns\": " << now_ns() << ", \"capacity\": " << capacity_ << ",\n \"groups\": [";
  for (size_t i = 0; i < groups.size(); i++) {
    o << (i ? ", " : "") << "{\"name\": ";
    json_string(o, groups[i].name.c_str());
    o << ", \"rank\": " << groups[i].rank << ", \"size\": " << groups[i].size << "}";
  }
  o << "],\n \"entries\": [";
  for (size_t i = 0; i < entries.size(); i++) {
    const Entry &e = entries[i];
    o << (i ? ",\n  " : "\n  ") << "{\"id\": " << e.id << ", \"group\": " << e.group << ", \"seq\": " << e.seq
      << ", \"p2p\": " << (e.p2p ? "true" : "false") << ", \"kind\": ";
    json_string(o, e.kind);
    const TraceTensors &x = e.tensors;
    o << ", \"dtype\": ";
    if (x.dtype >= 0) json_string(o, c10::toString(static_cast<at::ScalarType>(x.dtype)));
    else o << "null";
    o << ", \"shape\": ";
    if (x.ndim >= 0) {
      o << "[";
      for (int d = 0; d < x.ndim; d++) o << (d ? ", " : "") << x.shape[d];
      o << "]";
    } else {
      o << "null";
    }
    o << ", \"tensors\": " << x.count << ", \"op\": ";
    if (e.op) json_string(o, e.op);
    else o << "null";
    o << (e.p2p ? ", \"peer\": " : ", \"root\": ") << e.root << ", \"algorithm\": ";
    json_string(o, e.algorithm);
    o << ", \"issued_ns\": " << e.issued_ns << ", \"started_ns\": " << e.started_ns
      << ", \"finished_ns\": " << e.finished_ns << ", \"state\": \"" << state_name(e.state) << "\", \"error\": ";
    json_string(o, e.error);
    o << "}";
  }
  o << "\n]}\n";
  ::mkdir(dir.c_str(), 0777);  // one level; an existing directory is fine
  std::string path = dir + "/ruccl_trace_rank_" + std::to_string(rank) + ".json";
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  FILE *f = std::fopen(tmp.c_str(), "w");
  if (!f) fail(RUCCL_ERR_IO, "dump_trace: cannot write " + tmp + ": " + std::strerror(errno));
  std::string text = o.str();
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    fail(RUCCL_ERR_IO, "dump_trace: cannot write " + path + ": " + why);
  }
  return path;
}

void FlightRecorder::dump_if_configured(const std::string &reason) {
  if (dir_.empty() || !capacity_) return;
  try {
    dump(dir_, reason);
  } catch (const std::exception &e) {
    TORCH_WARN("ruccl: the flight recorder could not write its trace: ", e.what());
  }
}

}  // namespace ruccl_torch
