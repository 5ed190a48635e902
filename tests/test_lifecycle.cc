/* test_lifecycle.cc — the end of a session: ruccl_finish (the others then get
   PEER_FINISHED, promptly), a fresh session under the same group name afterwards,
   ruccl_reset (blocked calls return RESET, old handles answer NOT_REGISTERED), and
   the collective timeout. */
#include "test_util.h"

extern "C" {
#include "testing.h"
}

namespace {

using namespace rt;

/* Well below kLongTimeoutMs: "promptly" means the answer did not come from a timeout. */
constexpr int64_t kLongTimeoutMs = 10000;
constexpr int64_t kPromptMs = 3000;

/* ---------------------------------------------------------------- finish */

class Finish : public ::testing::TestWithParam<Strat> {};

TEST_P(Finish, LaterCollectiveFailsWithPeerFinished) {
  const std::vector<uint32_t> ids = {4, 8, 15};
  ruccl_config_t cfg = MakeConfig(3, GetParam(), kLongTimeoutMs);
  std::atomic<bool> finished{false};
  std::vector<std::string> first(3);
  std::vector<ruccl_result_t> after(3, RUCCL_NUM_RESULTS), barrier_after(3, RUCCL_NUM_RESULTS);
  std::vector<int64_t> after_ms(3, 0);
  ruccl_result_t fin_rc = RUCCL_NUM_RESULTS;
  RunResult r = RunPeers(
      ids, cfg,
      [&](ruccl_comm_t *comm, size_t i) {
        first[i] = CheckedAllReduce(comm, ids, ids[i]);
        if (i == 1) { /* peer 8 leaves */
          fin_rc = ruccl_finish(comm);
          finished = true;
          return;
        }
        WaitFor([&] { return finished.load(); });
        Bytes in = FillInput(RUCCL_INT32, RUCCL_SUM, ids[i], 5), out = Sentinel(RUCCL_INT32, 5);
        ruccl_tensor_t tin = Vec(in, RUCCL_INT32, 5), tout = Vec(out, RUCCL_INT32, 5);
        int64_t t0 = NowMs();
        after[i] = ruccl_all_reduce(comm, &tin, &tout, RUCCL_SUM);
        after_ms[i] = NowMs() - t0;
        barrier_after[i] = ruccl_barrier(comm);
        ruccl_finish(comm);
      },
      /*finish=*/false);
  ASSERT_TRUE(AllOk(r));
  EXPECT_EQ(RUCCL_OK, fin_rc);
  for (size_t i : {0, 2}) {
    EXPECT_EQ("", first[i]);
    EXPECT_EQ(RUCCL_ERR_PEER_FINISHED, after[i]) << "peer " << ids[i];
    EXPECT_LT(after_ms[i], kPromptMs) << "peer " << ids[i] << " learnt of the finish by waiting";
    EXPECT_EQ(RUCCL_ERR_PEER_FINISHED, barrier_after[i]) << "peer " << ids[i] << ": and again on the next call";
  }
}

TEST_P(Finish, BlockedPeerLearnsOfTheFinish) {
  const std::vector<uint32_t> ids = {1, 2};
  ruccl_config_t cfg = MakeConfig(2, GetParam(), kLongTimeoutMs);
  ruccl_result_t blocked_rc = RUCCL_NUM_RESULTS, fin_rc = RUCCL_NUM_RESULTS;
  int64_t blocked_ms = 0;
  bool intact = false;
  std::atomic<bool> saw_blocked{false};
  RunResult r = RunPeers(
      ids, cfg,
      [&](ruccl_comm_t *comm, size_t i) {
        if (i == 0) { /* finishes instead of joining the all-reduce, once the other is asleep in it */
          saw_blocked = WaitFor([] { return ruccl_testing_blocked() >= 1; });
          fin_rc = ruccl_finish(comm);
          return;
        }
        Bytes in = FillInput(RUCCL_FLOAT32, RUCCL_SUM, 2, 9), out = Sentinel(RUCCL_FLOAT32, 9);
        ruccl_tensor_t tin = Vec(in, RUCCL_FLOAT32, 9), tout = Vec(out, RUCCL_FLOAT32, 9);
        int64_t t0 = NowMs();
        blocked_rc = ruccl_all_reduce(comm, &tin, &tout, RUCCL_SUM);
        blocked_ms = NowMs() - t0;
        intact = IsSentinel(out);
        ruccl_finish(comm);
      },
      /*finish=*/false);
  ASSERT_TRUE(AllOk(r));
  EXPECT_TRUE(saw_blocked.load()) << "peer 2 never blocked in its all-reduce";
  EXPECT_EQ(RUCCL_OK, fin_rc);
  EXPECT_EQ(RUCCL_ERR_PEER_FINISHED, blocked_rc);
  EXPECT_LT(blocked_ms, kPromptMs);
  EXPECT_TRUE(intact) << "output written by a collective that failed";
}

/* The finish race, in one process: the last peer sleeps in the last receiving step
   of the last all-reduce (a test hook, testing.h), and again in a point-to-point
   receive, while every other peer finishes as soon as ruccl_finish lets it.  The
   in-process transport hands a buffer over only when its reader has taken it, so
   nothing may be lost and no call may fail. */
TEST_P(Finish, LaggingPeerGetsEverythingBeforeTheOthersFinish) {
  const std::vector<uint32_t> ids = {3, 5, 9, 12};
  const size_t last = ids.size() - 1;
  const size_t count = 70001; /* more than one ring slice */
  ruccl_config_t cfg = MakeConfig(ids.size(), GetParam(), kLongTimeoutMs);
  Problems probs(ids.size());
  std::vector<ruccl_result_t> fin(ids.size(), RUCCL_NUM_RESULTS);
  int64_t woke = 0, p2p_woke = 0;
  RunResult r = RunPeers(
      ids, cfg,
      [&](ruccl_comm_t *comm, size_t i) {
        uint64_t before = ruccl_testing_recv_steps();
        std::string p = CheckedAllReduce(comm, ids, ids[i], RUCCL_FLOAT32, RUCCL_SUM, count);
        if (i == last) {
          uint64_t steps = ruccl_testing_recv_steps() - before;
          ruccl_testing_delay_recv_step(ruccl_testing_recv_steps() + steps - 1, 300);
        }
        if (p.empty()) p = CheckedAllReduce(comm, ids, ids[i], RUCCL_FLOAT32, RUCCL_SUM, count, 5);
        if (i == last) woke = ruccl_testing_delay_woke_ns();
        if (p.empty() && (i == 0 || i == last)) {
          Bytes msg = i == 0 ? FillInput(RUCCL_INT32, RUCCL_SUM, 99, count) : Sentinel(RUCCL_INT32, count);
          ruccl_tensor_t t = Vec(msg, RUCCL_INT32, count);
          if (i == 0) {
            ruccl_result_t rc = ruccl_send(comm, &t, ids[last]);
            if (rc != RUCCL_OK) p = "send: " + RcStr(rc);
          } else {
            ruccl_testing_delay_recv_step(ruccl_testing_recv_steps(), 300);
            ruccl_result_t rc = ruccl_recv(comm, &t, ids[0]);
            p2p_woke = ruccl_testing_delay_woke_ns();
            if (rc != RUCCL_OK) p = "recv: " + RcStr(rc) + " " + ruccl_last_error();
            else if (msg != FillInput(RUCCL_INT32, RUCCL_SUM, 99, count)) p = "recv: wrong bytes";
          }
        }
        if (!p.empty()) probs.Note(i, p);
        fin[i] = ruccl_finish(comm);
      },
      /*finish=*/false);
  ASSERT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
  EXPECT_GT(woke, 0) << "the delayed step never ran";
  EXPECT_GT(p2p_woke, 0) << "the delayed receive never ran";
  for (size_t i = 0; i < ids.size(); i++) EXPECT_EQ(RUCCL_OK, fin[i]) << "peer " << ids[i];
}

INSTANTIATE_TEST_SUITE_P(Strategies, Finish, ::testing::Values(Centralized(), Tree(2), Ring(), Auto()),
                         [](const ::testing::TestParamInfo<Strat> &info) { return std::string(info.param.name); });

TEST(Lifecycle, FinishRejectsNull) { EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_finish(nullptr)); }

TEST(Lifecycle, FreshSessionAfterEveryoneFinished) {
  const std::string group = UniqueGroupName();
  ruccl_config_t cfg = MakeConfig(3, Ring(), kTimeoutMs, group);
  EXPECT_TRUE(SessionWorks({10, 20, 30}, cfg));
  EXPECT_TRUE(SessionWorks({10, 20, 30}, cfg)) << "the same ids under the same group name, again";
  /* a fresh session need not look like the old one */
  ruccl_config_t other = MakeConfig(2, Tree(1), kTimeoutMs, group);
  EXPECT_TRUE(SessionWorks({7, 3}, other));
}

/* ----------------------------------------------------------------- reset */

/* Calls every collective on a stale handle: each must answer NOT_REGISTERED. */
std::string AllNotRegistered(ruccl_comm_t *comm) {
  float v[4] = {1, 2, 3, 4};
  float big[12] = {};
  ruccl_tensor_t t = Tensor(v, RUCCL_FLOAT32, {4});
  ruccl_tensor_t tb = Tensor(big, RUCCL_FLOAT32, {12});
  struct Call {
    const char *name;
    ruccl_result_t rc;
  };
  const Call calls[] = {
      {"all_reduce", ruccl_all_reduce(comm, &t, &t, RUCCL_SUM)},
      {"broadcast", ruccl_broadcast(comm, &t, &t)},
      {"reduce", ruccl_reduce(comm, &t, &t, RUCCL_SUM, 0)},
      {"all_gather", ruccl_all_gather(comm, &t, &tb)},
      {"reduce_scatter", ruccl_reduce_scatter(comm, &tb, &t, RUCCL_SUM)},
      {"barrier", ruccl_barrier(comm)},
  };
  std::string problems;
  for (const Call &c : calls)
    if (c.rc != RUCCL_ERR_NOT_REGISTERED) problems += std::string(c.name) + " returned " + RcStr(c.rc) + "; ";
  if (v[0] != 1 || v[3] != 4) problems += "a stale handle modified a buffer; ";
  return problems;
}

TEST(Reset, UnblocksCollectivesAndStalesHandles) {
  const std::vector<uint32_t> ids = {0, 1, 2};
  ruccl_config_t cfg = MakeConfig(3, Auto(), kLongTimeoutMs);
  std::atomic<int> registered{0}, calling{0};
  std::atomic<bool> reset_done{false};
  std::vector<ruccl_result_t> blocked_rc(3, RUCCL_NUM_RESULTS), fin_rc(3, RUCCL_NUM_RESULTS);
  std::vector<int64_t> blocked_ms(3, 0);
  std::vector<std::string> stale(3);
  std::vector<int> intact(3, 0);
  std::thread runner([&] {
    RunResult r = RunPeers(
        ids, cfg,
        [&](ruccl_comm_t *comm, size_t i) {
          registered++;
          if (i < 2) { /* these two wait in an all-reduce the third never joins */
            Bytes in = FillInput(RUCCL_FLOAT32, RUCCL_SUM, ids[i], 6), out = Sentinel(RUCCL_FLOAT32, 6);
            ruccl_tensor_t tin = Vec(in, RUCCL_FLOAT32, 6), tout = Vec(out, RUCCL_FLOAT32, 6);
            calling++;
            int64_t t0 = NowMs();
            blocked_rc[i] = ruccl_all_reduce(comm, &tin, &tout, RUCCL_SUM);
            blocked_ms[i] = NowMs() - t0;
            intact[i] = IsSentinel(out);
          } else {
            WaitFor([&] { return reset_done.load(); }, kLongTimeoutMs);
            intact[i] = true;
          }
          WaitFor([&] { return reset_done.load(); }, kLongTimeoutMs);
          stale[i] = AllNotRegistered(comm);
          fin_rc[i] = ruccl_finish(comm); /* frees the stale handle */
        },
        /*finish=*/false);
    for (size_t i = 0; i < 3; i++)
      if (r.reg[i] != RUCCL_OK) stale[i] = "register returned " + RcStr(r.reg[i]);
  });
  bool ready = WaitFor([&] { return registered.load() == 3 && calling.load() == 2; });
  bool blocked = WaitFor([] { return ruccl_testing_blocked() >= 2; }); /* both asleep in the all-reduce */
  int64_t t_reset = NowMs();
  ruccl_reset();
  reset_done = true;
  runner.join();
  ASSERT_TRUE(ready) << "the peers never registered";
  ASSERT_TRUE(blocked) << "the two peers never blocked in their all-reduce";
  for (size_t i = 0; i < 2; i++) {
    EXPECT_EQ(RUCCL_ERR_RESET, blocked_rc[i]) << "peer " << ids[i];
    EXPECT_LT(blocked_ms[i], kPromptMs) << "peer " << ids[i];
    EXPECT_TRUE(intact[i]) << "peer " << ids[i] << ": output written by a reset collective";
  }
  EXPECT_LT(NowMs() - t_reset, kPromptMs);
  for (size_t i = 0; i < 3; i++) {
    EXPECT_EQ("", stale[i]) << "peer " << ids[i];
    EXPECT_EQ(RUCCL_ERR_NOT_REGISTERED, fin_rc[i]) << "peer " << ids[i];
  }
  /* registering again, same group name and ids, works */
  EXPECT_TRUE(SessionWorks(ids, cfg));
}

TEST(Reset, UnblocksRegistration) {
  ruccl_config_t cfg = MakeConfig(3, Auto(), kLongTimeoutMs);
  std::atomic<int> started{0};
  std::vector<ruccl_result_t> rc(2, RUCCL_NUM_RESULTS);
  std::vector<ruccl_comm_t *> comm(2, nullptr);
  std::vector<int64_t> ms(2, 0);
  std::vector<std::thread> ts;
  for (size_t i = 0; i < 2; i++)
    ts.emplace_back([&, i] {
      started++;
      int64_t t0 = NowMs();
      rc[i] = ruccl_register(static_cast<uint32_t>(i), Cpu(), &cfg, &comm[i]);
      ms[i] = NowMs() - t0;
    });
  bool ready = WaitFor([&] { return started.load() == 2 && ruccl_testing_blocked() >= 2; });
  ruccl_reset();
  for (auto &t : ts) t.join();
  ASSERT_TRUE(ready) << "the two registrations never blocked";
  for (size_t i = 0; i < 2; i++) {
    EXPECT_EQ(RUCCL_ERR_RESET, rc[i]) << "thread " << i;
    EXPECT_LT(ms[i], kPromptMs);
    EXPECT_EQ(nullptr, comm[i]);
    if (rc[i] == RUCCL_OK && comm[i]) ruccl_finish(comm[i]);
  }
  EXPECT_TRUE(SessionWorks({0, 1, 2}, cfg));
}

TEST(Reset, WithNothingRegisteredIsHarmless) {
  ruccl_reset();
  ruccl_reset();
  EXPECT_TRUE(SessionWorks({1, 2}, MakeConfig(2)));
}

/* A handle of an idle, fully registered session is stale after a reset too. */
TEST(Reset, IdleSessionHandlesBecomeStale) {
  ruccl_config_t cfg = MakeConfig(2, Ring());
  std::atomic<int> registered{0};
  std::atomic<bool> reset_done{false};
  std::vector<std::string> stale(2, "not run");
  std::vector<ruccl_result_t> fin_rc(2, RUCCL_NUM_RESULTS);
  std::thread runner([&] {
    RunResult r = RunPeers(
        {0, 1}, cfg,
        [&](ruccl_comm_t *comm, size_t i) {
          registered++;
          WaitFor([&] { return reset_done.load(); }, kLongTimeoutMs);
          stale[i] = AllNotRegistered(comm);
          fin_rc[i] = ruccl_finish(comm);
        },
        /*finish=*/false);
    for (size_t i = 0; i < 2; i++)
      if (r.reg[i] != RUCCL_OK) stale[i] = "register returned " + RcStr(r.reg[i]);
  });
  bool ready = WaitFor([&] { return registered.load() == 2; });
  ruccl_reset();
  reset_done = true;
  runner.join();
  ASSERT_TRUE(ready);
  for (size_t i = 0; i < 2; i++) {
    EXPECT_EQ("", stale[i]);
    EXPECT_EQ(RUCCL_ERR_NOT_REGISTERED, fin_rc[i]);
  }
  EXPECT_TRUE(SessionWorks({0, 1}, cfg));
}

/* --------------------------------------------------------------- timeout */

TEST(Timeout, CollectiveTimesOutWhenAPeerNeverCalls) {
  const std::vector<uint32_t> ids = {0, 1};
  ruccl_config_t cfg = MakeConfig(2, Auto(), 300);
  std::atomic<bool> done{false};
  ruccl_result_t rc = RUCCL_NUM_RESULTS;
  int64_t ms = 0;
  bool intact = false;
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    if (i == 1) { /* registered, but never calls the collective */
      WaitFor([&] { return done.load(); }, kLongTimeoutMs);
      return;
    }
    Bytes in = FillInput(RUCCL_FLOAT32, RUCCL_SUM, 0, 4), out = Sentinel(RUCCL_FLOAT32, 4);
    ruccl_tensor_t tin = Vec(in, RUCCL_FLOAT32, 4), tout = Vec(out, RUCCL_FLOAT32, 4);
    int64_t t0 = NowMs();
    rc = ruccl_all_reduce(comm, &tin, &tout, RUCCL_SUM);
    ms = NowMs() - t0;
    intact = IsSentinel(out);
    done = true;
  });
  for (size_t i = 0; i < 2; i++) ASSERT_EQ(RUCCL_OK, r.reg[i]) << r.reg_detail[i];
  EXPECT_EQ(RUCCL_ERR_TIMEOUT, rc);
  EXPECT_GE(ms, 250) << "gave up before the timeout";
  EXPECT_LT(ms, 5000);
  EXPECT_TRUE(intact) << "output written by a collective that timed out";
}

}  // namespace
