// The shared-memory link's doorbell (csrc/net/shm_link.h), white-box, across two
// real processes: a side asleep on its doorbell wakes when the other side writes
// into the ring or frees room in it, long before its sleep would have ended; a
// sleep with nothing coming ends at its deadline.  Both the sleepy-while side and
// the eager one (sleeps at once, its peer fences) are covered.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

extern "C" {
#include "net/shm_link.h"
#include "transport.h"
}

namespace {

constexpr int64_t kMs = 1000000;
constexpr int64_t kLongSleep = 10000 * kMs;  // a lost wake-up would sleep all of this

// Declares sleepy, lets the while pass unless eager, then sleeps until `want` is
// true or the deadline: returns how long that took.
template <class Ready>
int64_t sleep_until(ruccl_shm_link_t *l, bool eager, int want_read, int want_write, Ready ready) {
  ruccl_shm_sleepy(l, 1);
  int64_t t0 = ruccl_now_ns();
  if (!eager)
    while (ruccl_now_ns() - t0 < RUCCL_SHM_SLEEPY_NS) sched_yield();
  while (!ready() && ruccl_now_ns() - t0 < kLongSleep) ruccl_shm_wait(l, want_read, want_write, t0 + kLongSleep);
  ruccl_shm_sleepy(l, -1);
  return ruccl_now_ns() - t0;
}

// A fresh segment, created by this process (side 0); unlinked and unmapped at the
// end of the test, after any child that opens it by name has done so.
struct Segment {
  ruccl_shm_link_t link = {};
  char name[RUCCL_SHM_NAME_MAX];
  unsigned char token[RUCCL_SHM_TOKEN_BYTES];
  Segment() { EXPECT_EQ(ruccl_shm_create(&link, name, token), RUCCL_OK); }
  ~Segment() {
    if (!link.map) return;
    ruccl_shm_unlink(name);
    ruccl_shm_close(&link);
  }
  // In a forked child: the other side of the link, or _exit(2).
  ruccl_shm_link_t open_other_side() const {
    ruccl_shm_link_t b = {};
    if (ruccl_shm_open(&b, name, token) != RUCCL_OK) _exit(2);
    return b;
  }
};

class ShmDoorbell : public ::testing::TestWithParam<bool> {};

// Child: opens the link and, 100 times, waits asleep for a message, then answers it.
// Parent: lets it fall asleep each time (20 ms), then writes.  Every wake must come
// from the doorbell: the sleeps are 10 s long.
TEST_P(ShmDoorbell, ASleepingReaderWakesOnEveryMessage) {
  const bool eager = GetParam();
  Segment seg;
  ASSERT_FALSE(HasFailure());
  ruccl_shm_link_t &a = seg.link;
  constexpr int kRounds = 30;
  pid_t child = fork();
  if (child == 0) {
    ruccl_shm_link_t b = seg.open_other_side();
    if (eager) ruccl_shm_set_eager(&b);
    for (int r = 0; r < kRounds; r++) {
      int got = -1;
      int64_t took = sleep_until(&b, eager, 1, 0, [&] { return ruccl_shm_read(&b, &got, sizeof got) == sizeof got; });
      if (took >= kLongSleep || got != r) _exit(3);
      if (ruccl_shm_write(&b, &r, sizeof r) != sizeof r) _exit(4);
    }
    ruccl_shm_close(&b);
    _exit(0);
  }
  int64_t worst = 0;
  for (int r = 0; r < kRounds; r++) {
    usleep(20000);  // the child is asleep by now
    ASSERT_EQ(ruccl_shm_write(&a, &r, sizeof r), sizeof r);
    int back = -1;
    int64_t took = sleep_until(&a, eager, 1, 0, [&] { return ruccl_shm_read(&a, &back, sizeof back) == sizeof back; });
    ASSERT_EQ(back, r);
    worst = std::max(worst, took);
  }
  int st = 0;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "the child missed a wake-up (3), or its link failed";
  EXPECT_LT(worst, kLongSleep) << "the parent missed a wake-up";
}

// A writer with the ring full sleeps until the reader frees room.
TEST_P(ShmDoorbell, AWriterWithTheRingFullWakesWhenRoomIsFreed) {
  const bool eager = GetParam();
  Segment seg;
  ASSERT_FALSE(HasFailure());
  ruccl_shm_link_t &a = seg.link;
  std::vector<unsigned char> chunk(1 << 16, 7);
  size_t filled = 0;
  while (size_t n = ruccl_shm_write(&a, chunk.data(), chunk.size())) filled += n;
  ASSERT_GT(filled, 0u);
  pid_t child = fork();
  if (child == 0) {
    ruccl_shm_link_t b = seg.open_other_side();
    usleep(50000);  // the parent is asleep by now
    std::vector<unsigned char> sink(chunk.size());
    if (ruccl_shm_read(&b, sink.data(), sink.size()) != sink.size()) _exit(3);
    usleep(200000);  // keep the mapping while the parent wakes
    ruccl_shm_close(&b);
    _exit(0);
  }
  if (eager) ruccl_shm_set_eager(&a);
  size_t wrote = 0;
  int64_t took = sleep_until(&a, eager, 0, 1, [&] { return (wrote = ruccl_shm_write(&a, chunk.data(), chunk.size())) > 0; });
  EXPECT_EQ(wrote, chunk.size());
  EXPECT_LT(took, kLongSleep) << "the writer missed its wake-up";
  int st = 0;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmDoorbell, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool> &p) { return p.param ? "Eager" : "SleepyWhile"; });

// With nothing coming, a sleep ends at its deadline (it is the caller's bound).
TEST(ShmDoorbell, ASleepWithNothingComingEndsAtItsDeadline) {
  Segment seg;
  ASSERT_FALSE(HasFailure());
  ruccl_shm_link_t &a = seg.link;
  int64_t t0 = ruccl_now_ns();
  ruccl_shm_wait(&a, 1, 0, t0 + 30 * kMs);
  int64_t took = ruccl_now_ns() - t0;
  EXPECT_GE(took, 29 * kMs);
  EXPECT_LT(took, 5000 * kMs);
}

// A segment that is not the size of a ruccl segment is refused before it is mapped
// (a short one would be a SIGBUS on the first access past its end).
TEST(ShmHostile, ATruncatedOrOversizedSegmentIsRefused) {
  for (off_t size : {off_t(4096), off_t(64) << 20}) {
    Segment seg;
    ASSERT_FALSE(HasFailure());
    int fd = shm_open(seg.name, O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, size), 0);
    close(fd);
    ruccl_shm_link_t b = {};
    EXPECT_EQ(ruccl_shm_open(&b, seg.name, seg.token), RUCCL_ERR_PROTOCOL) << size;
    EXPECT_EQ(b.map, nullptr);
    EXPECT_NE(std::string(ruccl_last_error()).find("not a ruccl segment"), std::string::npos) << ruccl_last_error();
  }
}

// A counter moved by a faulty or hostile peer: the side that finds it says
// RUCCL_SHM_CORRUPT and copies nothing (a wrapped free count once let a write run
// past the ring); a wait for room returns at once instead of sleeping on it.
TEST(ShmHostile, CorruptRingCountersAreRefusedNotCopied) {
  Segment seg;
  ASSERT_FALSE(HasFailure());
  ruccl_shm_link_t &a = seg.link;
  ruccl_shm_link_t b = {};
  ASSERT_EQ(ruccl_shm_open(&b, seg.name, seg.token), RUCCL_OK);
  std::vector<char> big(8u << 20, 'x');
  char one = 'y';

  // The reader's tail past the writer's head: a write must not trust the free count.
  ASSERT_EQ(ruccl_shm_write(&a, "hello", 5), 5u);
  ruccl_shm_testing_corrupt(&a, 0);
  EXPECT_EQ(ruccl_shm_write(&a, big.data(), big.size()), RUCCL_SHM_CORRUPT);
  EXPECT_EQ(ruccl_shm_write(&a, &one, 1), RUCCL_SHM_CORRUPT);
  int64_t t0 = ruccl_now_ns();
  ruccl_shm_wait(&a, 0, 1, t0 + 10000 * kMs);
  EXPECT_LT(ruccl_now_ns() - t0, 5000 * kMs);

  // The writer's head more than a ring past the reader's tail: nothing is read.
  ASSERT_EQ(ruccl_shm_write(&b, "hi", 2), 2u);
  ruccl_shm_testing_corrupt(&a, 1);  // a's receiving ring is b's sending one
  const void *data = nullptr;
  EXPECT_EQ(ruccl_shm_peek(&a, &data), RUCCL_SHM_CORRUPT);
  char out[8] = {};
  EXPECT_EQ(ruccl_shm_read(&a, out, sizeof out), RUCCL_SHM_CORRUPT);
  EXPECT_EQ(out[0], 0);
  ruccl_shm_close(&b);
}

// A segment whose creator died before it was unlinked (its name carries the pid) is
// removed by the sweep; one of a live process stays.
TEST(ShmHostile, ASegmentLeftByADeadCreatorIsSwept) {
  pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);  // its pid now names no process
  std::string dead = "/ruccl-" + std::to_string(child) + "-0123456789abcdef";
  std::string live = "/ruccl-" + std::to_string(getpid()) + "-fedcba9876543210";
  for (const std::string &n : {dead, live}) {
    int fd = shm_open(n.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0) << n;
    close(fd);
  }
  ruccl_shm_sweep();
  EXPECT_LT(shm_open(dead.c_str(), O_RDWR, 0600), 0) << "the dead creator's segment is still there";
  int fd = shm_open(live.c_str(), O_RDWR, 0600);
  EXPECT_GE(fd, 0) << "a live creator's segment was removed";
  if (fd >= 0) close(fd);
  shm_unlink(live.c_str());
  shm_unlink(dead.c_str());
}

}  // namespace
