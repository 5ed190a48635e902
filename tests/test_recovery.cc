// Revoke, agree and shrink among the peers (threads) of one process.  The
// multi-node forms (a killed node, a node that dies during the agreement, revoke
// racing 64 MB collectives) are in test_multinode.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "ruccl.h"
#include "test_util.h"

using namespace rt;

namespace {

// A float32 all-reduce (SUM) of `count` elements of id-dependent values on comm,
// checked against the sum over `ids`; "" when right.
std::string AllReduceOver(ruccl_comm_t *comm, uint32_t my_id, const std::vector<uint32_t> &ids, size_t count = 1000) {
  std::vector<float> in(count), out(count, -1.0f);
  for (size_t i = 0; i < count; i++) in[i] = static_cast<float>(my_id + 1) + static_cast<float>(i % 7);
  ruccl_tensor_t tin{in.data(), RUCCL_FLOAT32, 1, {static_cast<int64_t>(count)}, Cpu()};
  ruccl_tensor_t tout{out.data(), RUCCL_FLOAT32, 1, {static_cast<int64_t>(count)}, Cpu()};
  ruccl_result_t rc = ruccl_all_reduce(comm, &tin, &tout, RUCCL_SUM);
  if (rc != RUCCL_OK) return "all_reduce: " + RcStr(rc) + " (" + ruccl_last_error() + ")";
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (uint32_t id : ids) want += static_cast<float>(id + 1) + static_cast<float>(i % 7);
    if (out[i] != want) return "all_reduce[" + std::to_string(i) + "] = " + std::to_string(out[i]) + ", want " +
                                std::to_string(want);
  }
  return "";
}

// Agree with flags ~(1 << i) from thread i; what it returned.
struct Agreed {
  ruccl_result_t rc = RUCCL_NUM_RESULTS;
  uint32_t flags = 0;
  std::vector<uint32_t> failed;
  std::string why;
};

Agreed AgreeFrom(ruccl_comm_t *comm, size_t thread) {
  Agreed a;
  a.flags = ~(1u << thread);
  uint32_t failed[16];
  size_t n = 0;
  a.rc = ruccl_comm_agree(comm, &a.flags, failed, 16, &n);
  if (a.rc != RUCCL_OK) a.why = ruccl_last_error();
  a.failed.assign(failed, failed + std::min<size_t>(n, 16));
  return a;
}

}  // namespace

TEST(Revoke, WakesEveryPeerBlockedInACollectiveAndEveryLaterCall) {
  const std::vector<uint32_t> ids = {10, 11, 12, 13};
  ruccl_config_t cfg = MakeConfig(4, Ring(), 20000);
  std::vector<ruccl_result_t> blocked(4, RUCCL_NUM_RESULTS), later(4, RUCCL_NUM_RESULTS);
  std::vector<int64_t> took_ms(4, 0);
  std::vector<Agreed> agreed(4);
  std::vector<std::string> after(4);
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    if (i == 3) {  // never joins the all-reduce: the others block until the revoke
      SleepMs(300);
      RT_CHECK_OK(ruccl_comm_revoke(comm));
    } else {
      int64_t t0 = NowMs();
      std::string e = AllReduceOver(comm, ids[i], ids, 1 << 20);
      took_ms[i] = NowMs() - t0;
      blocked[i] = e.rfind("all_reduce: RUCCL_ERR_REVOKED", 0) == 0 ? RUCCL_ERR_REVOKED : RUCCL_OK;
      if (blocked[i] != RUCCL_ERR_REVOKED) ADD_FAILURE() << "thread " << i << ": " << e;
    }
    later[i] = ruccl_barrier(comm);
    agreed[i] = AgreeFrom(comm, i);
    ruccl_comm_t *same = nullptr;
    ruccl_result_t rc = ruccl_comm_shrink(comm, nullptr, 0, &same);
    if (rc != RUCCL_OK) {
      after[i] = "shrink: " + RcStr(rc) + " " + ruccl_last_error();
      return;
    }
    unsigned size = 0, index = 0;
    ruccl_comm_size(same, &size);
    ruccl_comm_index(same, &index);
    if (size != 4 || index != i) after[i] = "size " + std::to_string(size) + " index " + std::to_string(index);
    else after[i] = AllReduceOver(same, ids[i], ids);
    EXPECT_EQ(RUCCL_OK, ruccl_finish(same));
  });
  ASSERT_TRUE(AllOk(r));
  for (size_t i = 0; i < 4; i++) {
    if (i < 3) {
      EXPECT_LT(took_ms[i], 3000) << "thread " << i << " was not woken promptly";
    }
    EXPECT_EQ(RUCCL_ERR_REVOKED, later[i]) << "thread " << i;
    EXPECT_EQ(RUCCL_OK, agreed[i].rc) << agreed[i].why;
    EXPECT_EQ(~0xfu, agreed[i].flags) << "thread " << i << ": the AND of every peer's flags";
    EXPECT_TRUE(agreed[i].failed.empty()) << "thread " << i;
    EXPECT_EQ("", after[i]) << "thread " << i;
  }
}

TEST(Revoke, LeavesAnotherCommunicatorOfTheSamePeersAlone) {
  const std::vector<uint32_t> ids = {0, 1, 2};
  ruccl_config_t a = MakeConfig(3, Auto(), 10000, UniqueGroupName("a"));
  ruccl_config_t b = MakeConfig(3, Auto(), 10000, UniqueGroupName("b"));
  std::vector<ruccl_comm_t *> other(3, nullptr);
  std::vector<ruccl_result_t> on_a(3), on_b(3);
  std::vector<std::string> b_sum(3);
  std::mutex mu;
  RunResult r = RunPeers(ids, a, [&](ruccl_comm_t *comm, size_t i) {
    RT_CHECK_OK(ruccl_register(ids[i], Cpu(), &b, &other[i]));
    if (i == 0) RT_CHECK_OK(ruccl_comm_revoke(comm));
    on_a[i] = ruccl_barrier(comm);
    b_sum[i] = AllReduceOver(other[i], ids[i], ids);
    on_b[i] = ruccl_barrier(other[i]);
    RT_CHECK_OK(ruccl_finish(other[i]));
  });
  ASSERT_TRUE(AllOk(r));
  for (size_t i = 0; i < 3; i++) {
    EXPECT_EQ(RUCCL_ERR_REVOKED, on_a[i]) << "thread " << i;
    EXPECT_EQ("", b_sum[i]) << "thread " << i;
    EXPECT_EQ(RUCCL_OK, on_b[i]) << "thread " << i;
  }
}

TEST(Revoke, WakesAPendingReceiveAndRefusesLaterPointToPoint) {
  const std::vector<uint32_t> ids = {0, 1};
  ruccl_config_t cfg = MakeConfig(2, Auto(), 20000);
  ruccl_result_t recv_rc = RUCCL_NUM_RESULTS, send_rc = RUCCL_NUM_RESULTS;
  int64_t took_ms = 0;
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    float x = 0;
    ruccl_tensor_t t{&x, RUCCL_FLOAT32, 0, {}, Cpu()};
    if (i == 0) {
      int64_t t0 = NowMs();
      recv_rc = ruccl_recv(comm, &t, 1);  // peer 1 never sends: it revokes
      took_ms = NowMs() - t0;
    } else {
      SleepMs(200);
      RT_CHECK_OK(ruccl_comm_revoke(comm));
      send_rc = ruccl_send(comm, &t, 0);
    }
  });
  ASSERT_TRUE(AllOk(r));
  EXPECT_EQ(RUCCL_ERR_REVOKED, recv_rc);
  EXPECT_EQ(RUCCL_ERR_REVOKED, send_rc);
  EXPECT_LT(took_ms, 3000);
}

TEST(Agree, CountsAFinishedPeerAsFailedAndShrinkLeavesItOut) {
  const std::vector<uint32_t> ids = {3, 5, 7, 9};
  ruccl_config_t cfg = MakeConfig(4, Auto(), 10000);
  std::vector<Agreed> agreed(4);
  std::vector<std::string> after(4);
  std::vector<unsigned> index(4, 99);
  std::vector<ruccl_result_t> fin(4, RUCCL_OK);
  RunResult r = RunPeers(
      ids, cfg,
      [&](ruccl_comm_t *comm, size_t i) {
        if (i == 1) {  // "dies": finishes its session instead of agreeing
          fin[i] = ruccl_finish(comm);
          return;
        }
        agreed[i] = AgreeFrom(comm, i);
        ruccl_comm_t *small = nullptr;
        ruccl_result_t rc = ruccl_comm_shrink(comm, nullptr, 0, &small);
        if (rc != RUCCL_OK) {
          after[i] = "shrink: " + RcStr(rc) + " " + ruccl_last_error();
        } else {
          unsigned size = 0;
          ruccl_comm_size(small, &size);
          ruccl_comm_index(small, &index[i]);
          after[i] = size != 3 ? "size " + std::to_string(size) : AllReduceOver(small, ids[i], {3, 7, 9});
          EXPECT_EQ(RUCCL_OK, ruccl_finish(small));
        }
        fin[i] = ruccl_finish(comm);
      },
      false);
  for (size_t i = 0; i < 4; i++) ASSERT_EQ(RUCCL_OK, r.reg[i]);
  for (size_t i : {0, 2, 3}) {
    EXPECT_EQ(RUCCL_OK, agreed[i].rc) << agreed[i].why;
    EXPECT_EQ(std::vector<uint32_t>{5}, agreed[i].failed) << "thread " << i;
    EXPECT_EQ(~(1u | 4u | 8u), agreed[i].flags) << "thread " << i << ": the AND of the live peers' flags";
    EXPECT_EQ("", after[i]) << "thread " << i;
    EXPECT_EQ(RUCCL_OK, fin[i]);
  }
  EXPECT_EQ((std::vector<unsigned>{0, 99, 1, 2}), index) << "ranks renumbered densely in the old order";
}

TEST(Shrink, WithAnExcludeListAndNoFailure) {
  const std::vector<uint32_t> ids = {1, 2, 3, 4};
  ruccl_config_t cfg = MakeConfig(4, Ring(), 10000);
  std::vector<std::string> after(4);
  std::vector<unsigned> index(4, 99);
  std::vector<std::string> old_after(4);
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    if (i == 1) return;  // excluded: does not call
    const uint32_t exclude[] = {2};
    ruccl_comm_t *small = nullptr;
    ruccl_result_t rc = ruccl_comm_shrink(comm, exclude, 1, &small);
    if (rc != RUCCL_OK) {
      after[i] = "shrink: " + RcStr(rc) + " " + ruccl_last_error();
      return;
    }
    ruccl_comm_index(small, &index[i]);
    after[i] = AllReduceOver(small, ids[i], {1, 3, 4}, 100000);
    EXPECT_EQ(RUCCL_OK, ruccl_finish(small));
  });
  ASSERT_TRUE(AllOk(r));
  for (size_t i : {0, 2, 3}) EXPECT_EQ("", after[i]) << "thread " << i;
  EXPECT_EQ((std::vector<unsigned>{0, 99, 1, 2}), index);
}

TEST(Shrink, DifferentExcludeListsAreTheSameErrorOnEveryPeer) {
  const std::vector<uint32_t> ids = {0, 1, 2};
  ruccl_config_t cfg = MakeConfig(3, Auto(), 5000);
  std::vector<ruccl_result_t> rc(3, RUCCL_NUM_RESULTS);
  std::vector<ruccl_result_t> unknown(3, RUCCL_NUM_RESULTS);
  std::vector<std::string> why(3);
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    // every list names peer 2, who does not call; peer 1 names 0 as well
    const uint32_t list0[] = {2}, list1[] = {2, 0};
    if (i == 2) return;
    if (i == 1) SleepMs(200);  // peer 0's list is the node's; peer 1's then differs
    ruccl_comm_t *out = nullptr;
    rc[i] = i == 0 ? ruccl_comm_shrink(comm, list0, 1, &out) : ruccl_comm_shrink(comm, list1, 2, &out);
    why[i] = ruccl_last_error();
    EXPECT_EQ(nullptr, out);
  });
  ASSERT_TRUE(AllOk(r));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, rc[0]) << why[0];
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, rc[1]) << why[1];
  EXPECT_EQ(why[0], why[1]) << "the same message on every peer";

  RunResult r2 = RunPeers(ids, MakeConfig(3, Auto(), 5000), [&](ruccl_comm_t *comm, size_t i) {
    const uint32_t stranger[] = {77};
    ruccl_comm_t *out = nullptr;
    unknown[i] = ruccl_comm_shrink(comm, stranger, 1, &out);
  });
  ASSERT_TRUE(AllOk(r2));
  EXPECT_EQ(std::vector<ruccl_result_t>(3, RUCCL_ERR_INVALID_ARGUMENT), unknown);
}

TEST(Shrink, NullArgumentsAreInvalid) {
  uint32_t flags = 0;
  size_t n = 0;
  ruccl_comm_t *out = nullptr;
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_comm_revoke(nullptr));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_comm_agree(nullptr, &flags, nullptr, 0, &n));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_comm_shrink(nullptr, nullptr, 0, &out));
}
