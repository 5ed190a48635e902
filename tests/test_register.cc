/* test_register.cc — registration: peer order by ascending id, duplicate ids,
   disagreeing configurations, the registration timeout, argument checks, and
   independent groups living side by side in one process. */
#include "test_util.h"

extern "C" {
#include "testing.h"
}

namespace {

using namespace rt;

/* -------------------------------------------------- size, index, order */

class RegisterPeers : public ::testing::TestWithParam<std::vector<uint32_t>> {};

TEST_P(RegisterPeers, SizeAndIndexFollowAscendingIds) {
  const std::vector<uint32_t> ids = GetParam();
  const size_t n = ids.size();
  ruccl_config_t cfg = MakeConfig(static_cast<unsigned>(n));
  std::vector<unsigned> size(n, 999), index(n, 999);
  std::vector<ruccl_result_t> size_rc(n), index_rc(n), gather_rc(n);
  std::vector<std::vector<int64_t>> gathered(n);
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    size_rc[i] = ruccl_comm_size(comm, &size[i]);
    index_rc[i] = ruccl_comm_index(comm, &index[i]);
    /* all-gather of the ids themselves shows the order the data moves in */
    int64_t mine = ids[i];
    gathered[i].assign(n, -1);
    ruccl_tensor_t tin = Tensor(&mine, RUCCL_INT64, {1});
    ruccl_tensor_t tout = Tensor(gathered[i].data(), RUCCL_INT64, {static_cast<int64_t>(n)});
    gather_rc[i] = ruccl_all_gather(comm, &tin, &tout);
  });
  ASSERT_TRUE(AllOk(r));
  std::vector<uint32_t> sorted = SortedIds(ids);
  std::vector<int64_t> sorted64(sorted.begin(), sorted.end());
  for (size_t i = 0; i < n; i++) {
    EXPECT_EQ(RUCCL_OK, size_rc[i]);
    EXPECT_EQ(RUCCL_OK, index_rc[i]);
    EXPECT_EQ(n, size[i]) << "thread " << i;
    EXPECT_EQ(RankOf(ids, i), index[i]) << "peer id " << ids[i];
    EXPECT_EQ(RUCCL_OK, gather_rc[i]);
    EXPECT_EQ(sorted64, gathered[i]) << "thread " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(IdSets, RegisterPeers,
                         ::testing::Values(std::vector<uint32_t>{7}, std::vector<uint32_t>{7, 3},
                                           std::vector<uint32_t>{7, 3, 100},
                                           std::vector<uint32_t>{7, 3, 100, 42},
                                           std::vector<uint32_t>{7, 3, 100, 42, 0, 99999, 5, 4000000000u}),
                         [](const ::testing::TestParamInfo<std::vector<uint32_t>> &info) {
                           return std::to_string(info.param.size()) + "peers";
                         });

TEST(Register, SinglePeerNeedsNoOneElse) {
  ruccl_config_t cfg = MakeConfig(1);
  ruccl_comm_t *comm = nullptr;
  ASSERT_EQ(RUCCL_OK, ruccl_register(12345, Cpu(), &cfg, &comm));
  ASSERT_NE(nullptr, comm);
  unsigned size = 0, index = 99;
  EXPECT_EQ(RUCCL_OK, ruccl_comm_size(comm, &size));
  EXPECT_EQ(RUCCL_OK, ruccl_comm_index(comm, &index));
  EXPECT_EQ(1u, size);
  EXPECT_EQ(0u, index);
  EXPECT_EQ("", CheckedAllReduce(comm, {12345}, 12345));
  EXPECT_EQ(RUCCL_OK, ruccl_finish(comm));
}

/* ruccl_comm_algorithm: how the last collective ran, as the configured strategy says. */
TEST(Register, AlgorithmOfTheLastCollective) {
  const std::vector<uint32_t> ids{4, 9, 2};
  const struct { ruccl_strategy_t strategy; const char *name; } cases[] = {
      {{RUCCL_STRATEGY_RING, 0}, "ring"}, {{RUCCL_STRATEGY_TREE, 2}, "tree"},
      {{RUCCL_STRATEGY_CENTRALIZED, 0}, "centralized"}};
  for (const auto &k : cases) {
    ruccl_config_t cfg = MakeConfig(3);
    ASSERT_EQ(RUCCL_OK, ruccl_config_set_local_strategy(&cfg, k.strategy));
    std::vector<std::string> before(3), after_reduce(3), after_barrier(3), after_refused(3);
    RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
      const char *name = nullptr;
      if (ruccl_comm_algorithm(comm, &name) == RUCCL_OK) before[i] = name;
      EXPECT_EQ("", CheckedAllReduce(comm, ids, ids[i]));
      if (ruccl_comm_algorithm(comm, &name) == RUCCL_OK) after_reduce[i] = name;
      EXPECT_EQ(RUCCL_OK, ruccl_barrier(comm));
      if (ruccl_comm_algorithm(comm, &name) == RUCCL_OK) after_barrier[i] = name;
      /* refused by the agreement (thread 0 passes another shape): no algorithm ran */
      float v[2] = {1, 2};
      ruccl_tensor_t t = Tensor(v, RUCCL_FLOAT32, {i == 0 ? 2 : 1});
      EXPECT_EQ(RUCCL_ERR_SHAPE_MISMATCH, ruccl_all_reduce(comm, &t, &t, RUCCL_SUM));
      if (ruccl_comm_algorithm(comm, &name) == RUCCL_OK) after_refused[i] = name;
    });
    ASSERT_TRUE(AllOk(r));
    for (size_t i = 0; i < 3; i++) {
      EXPECT_EQ("", before[i]);
      EXPECT_EQ(k.name, after_reduce[i]) << "thread " << i;
      EXPECT_EQ("agreement", after_barrier[i]) << "thread " << i;
      EXPECT_EQ("agreement", after_refused[i]) << "thread " << i;
    }
  }
  const char *name = nullptr;
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_comm_algorithm(nullptr, &name));
}

TEST(Register, IntrospectionRejectsNull) {
  unsigned v = 0;
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_comm_size(nullptr, &v));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_comm_index(nullptr, &v));
  ruccl_config_t cfg = MakeConfig(1);
  ruccl_comm_t *comm = nullptr;
  ASSERT_EQ(RUCCL_OK, ruccl_register(0, Cpu(), &cfg, &comm));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_comm_size(comm, nullptr));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_comm_index(comm, nullptr));
  EXPECT_EQ(RUCCL_OK, ruccl_finish(comm));
}

/* ---------------------------------------------------------- arguments */

TEST(Register, NullConfigOrCommPointer) {
  ruccl_config_t cfg = MakeConfig(1);
  ruccl_comm_t *comm = nullptr;
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_register(0, Cpu(), nullptr, &comm));
  EXPECT_EQ(nullptr, comm);
  EXPECT_STRNE("", ruccl_last_error());
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_register(0, Cpu(), &cfg, nullptr));
  /* the refused attempts left nothing behind: the id registers normally */
  ASSERT_EQ(RUCCL_OK, ruccl_register(0, Cpu(), &cfg, &comm));
  EXPECT_EQ(RUCCL_OK, ruccl_finish(comm));
}

#ifndef RUCCL_HAVE_CUDA
TEST(Register, CudaDeviceUnsupportedInACpuBuild) {
  ruccl_config_t cfg = MakeConfig(1);
  ruccl_device_t dev;
  dev.kind = RUCCL_DEVICE_CUDA;
  dev.index = 0;
  ruccl_comm_t *comm = nullptr;
  EXPECT_EQ(RUCCL_ERR_UNSUPPORTED, ruccl_register(0, dev, &cfg, &comm));
  EXPECT_EQ(nullptr, comm);
  if (comm) ruccl_finish(comm);
}
#endif

/* --------------------------------------------------------- duplicates */

TEST(Register, DuplicateIdWhileRegistrationPending) {
  ruccl_config_t cfg = MakeConfig(2);
  ruccl_result_t rc_first = RUCCL_NUM_RESULTS, rc_third = RUCCL_NUM_RESULTS;
  std::string first_check, third_check;
  std::atomic<bool> first_started{false};
  std::thread first([&] {
    ruccl_comm_t *c = nullptr;
    first_started = true;
    rc_first = ruccl_register(5, Cpu(), &cfg, &c);
    if (rc_first == RUCCL_OK) {
      first_check = CheckedAllReduce(c, {5, 6}, 5);
      ruccl_finish(c);
    }
  });
  ASSERT_TRUE(WaitFor([&] { return first_started.load() && ruccl_testing_blocked() >= 1; }))
      << "the first registration never blocked";
  ruccl_comm_t *dup = nullptr;
  int64_t t0 = NowMs();
  ruccl_result_t rc_dup = ruccl_register(5, Cpu(), &cfg, &dup);
  int64_t dup_ms = NowMs() - t0;
  std::thread third([&] {
    ruccl_comm_t *c = nullptr;
    rc_third = ruccl_register(6, Cpu(), &cfg, &c);
    if (rc_third == RUCCL_OK) {
      third_check = CheckedAllReduce(c, {5, 6}, 6);
      ruccl_finish(c);
    }
  });
  first.join();
  third.join();
  EXPECT_EQ(RUCCL_ERR_DUPLICATE_REGISTRATION, rc_dup);
  EXPECT_EQ(nullptr, dup);
  EXPECT_LT(dup_ms, 2000) << "a duplicate is refused at once, not after waiting";
  EXPECT_EQ(RUCCL_OK, rc_first) << "the duplicate must not disturb the pending registration";
  EXPECT_EQ(RUCCL_OK, rc_third);
  EXPECT_EQ("", first_check);
  EXPECT_EQ("", third_check);
  if (dup) ruccl_finish(dup);
}

TEST(Register, DuplicateIdWhileSessionActive) {
  const std::vector<uint32_t> ids = {1, 2};
  ruccl_config_t cfg = MakeConfig(2);
  std::atomic<int> ready{0};
  std::atomic<bool> dup_done{false};
  Problems problems(2);
  std::thread peers([&] {
    RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
      ready++;
      if (!WaitFor([&] { return dup_done.load(); })) problems.Note(i, "main thread never tried the duplicate");
      std::string p = CheckedAllReduce(comm, ids, ids[i]);
      if (!p.empty()) problems.Note(i, "after the duplicate: " + p);
    });
    if (!AllOk(r)) problems.Note(0, AllOk(r).message());
  });
  bool both_ready = WaitFor([&] { return ready.load() == 2; });
  ruccl_comm_t *dup = nullptr;
  ruccl_result_t rc_dup = both_ready ? ruccl_register(1, Cpu(), &cfg, &dup) : RUCCL_NUM_RESULTS;
  dup_done = true;
  peers.join();
  ASSERT_TRUE(both_ready);
  EXPECT_EQ(RUCCL_ERR_DUPLICATE_REGISTRATION, rc_dup);
  EXPECT_EQ(nullptr, dup);
  EXPECT_TRUE(problems.None());
  if (dup) ruccl_finish(dup);
}

/* ---------------------------------------------------- config mismatch */

struct Mismatch {
  const char *name;
  std::function<void(ruccl_config_t *)> change;
};

class ConfigMismatch : public ::testing::TestWithParam<Mismatch> {};

/* The first peer waits; the second arrives with a configuration that differs: the
   late peer fails, and so does the waiting one (the implementation fails every
   waiting peer of the group).  Afterwards the group name is free again. */
TEST_P(ConfigMismatch, BothPeersFail) {
  const std::string group = UniqueGroupName();
  ruccl_config_t first_cfg = MakeConfig(2, Ring(), kTimeoutMs, group);
  ruccl_config_t late_cfg = first_cfg;
  GetParam().change(&late_cfg);
  ruccl_result_t rc_first = RUCCL_NUM_RESULTS;
  int64_t first_ms = 0;
  ruccl_comm_t *first_comm = nullptr;
  std::atomic<bool> started{false};
  std::thread first([&] {
    started = true;
    int64_t t0 = NowMs();
    rc_first = ruccl_register(0, Cpu(), &first_cfg, &first_comm);
    first_ms = NowMs() - t0;
  });
  ASSERT_TRUE(WaitFor([&] { return started.load() && ruccl_testing_blocked() >= 1; }))
      << "the first registration never blocked";
  ruccl_comm_t *late_comm = nullptr;
  ruccl_result_t rc_late = ruccl_register(1, Cpu(), &late_cfg, &late_comm);
  std::string late_detail = ruccl_last_error();
  first.join();
  EXPECT_EQ(RUCCL_ERR_CONFIG_MISMATCH, rc_late);
  EXPECT_FALSE(late_detail.empty());
  EXPECT_EQ(nullptr, late_comm);
  EXPECT_EQ(RUCCL_ERR_CONFIG_MISMATCH, rc_first) << "the waiting peer fails too";
  EXPECT_LT(first_ms, kTimeoutMs / 2) << "the waiting peer learns of the mismatch at once, not by timing out";
  EXPECT_EQ(nullptr, first_comm);
  if (first_comm) ruccl_finish(first_comm);
  if (late_comm) ruccl_finish(late_comm);

  /* the failed rendezvous left nothing: the same group registers afresh */
  EXPECT_TRUE(SessionWorks({0, 1}, first_cfg));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, ConfigMismatch,
    ::testing::Values(Mismatch{"NumDevices", [](ruccl_config_t *c) { ruccl_config_set_num_devices(c, 3); }},
                      Mismatch{"StrategyKind",
                               [](ruccl_config_t *c) { ruccl_config_set_local_strategy(c, Centralized().value()); }}),
    [](const ::testing::TestParamInfo<Mismatch> &info) { return std::string(info.param.name); });

TEST(Register, TreeArityMismatchBetweenTwoTrees) {
  const std::string group = UniqueGroupName();
  ruccl_config_t a = MakeConfig(2, Tree(2), kTimeoutMs, group);
  ruccl_config_t b = MakeConfig(2, Tree(3), kTimeoutMs, group);
  ruccl_result_t rc_a = RUCCL_NUM_RESULTS;
  ruccl_comm_t *ca = nullptr;
  std::thread ta([&] { rc_a = ruccl_register(0, Cpu(), &a, &ca); });
  ASSERT_TRUE(WaitFor([] { return ruccl_testing_blocked() >= 1; })) << "the first registration never blocked";
  ruccl_comm_t *cb = nullptr;
  ruccl_result_t rc_b = ruccl_register(1, Cpu(), &b, &cb);
  ta.join();
  EXPECT_EQ(RUCCL_ERR_CONFIG_MISMATCH, rc_b);
  EXPECT_EQ(RUCCL_ERR_CONFIG_MISMATCH, rc_a);
  if (ca) ruccl_finish(ca);
  if (cb) ruccl_finish(cb);
}

/* ------------------------------------------------------------ timeout */

TEST(Register, TimesOutWhenPeersNeverArrive) {
  ruccl_config_t cfg = MakeConfig(2, Auto(), 200);
  ruccl_comm_t *comm = nullptr;
  int64_t t0 = NowMs();
  ruccl_result_t rc = ruccl_register(0, Cpu(), &cfg, &comm);
  int64_t ms = NowMs() - t0;
  EXPECT_EQ(RUCCL_ERR_TIMEOUT, rc);
  EXPECT_EQ(nullptr, comm);
  EXPECT_GE(ms, 150) << "returned before the timeout";
  EXPECT_LT(ms, 5000);
  EXPECT_STRNE("", ruccl_last_error());
  if (comm) ruccl_finish(comm);

  /* the timed-out attempt left nothing behind: both peers register afresh */
  ruccl_config_t full = cfg;
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_timeout_ms(&full, kTimeoutMs));
  EXPECT_TRUE(SessionWorks({0, 1}, full));
}

/* ------------------------------------------------------------- groups */

/* Two groups with different names (and overlapping peer ids, as torch subgroups
   have) registered at the same time, running collectives concurrently. */
TEST(Register, TwoIndependentGroupsConcurrently) {
  const std::vector<uint32_t> ids_a = {0, 1, 2}, ids_b = {0, 1};
  ruccl_config_t cfg_a = MakeConfig(3, Ring(), kTimeoutMs, UniqueGroupName("A"));
  ruccl_config_t cfg_b = MakeConfig(2, Tree(2), kTimeoutMs, UniqueGroupName("B"));
  const int rounds = 150;
  Problems pa(3), pb(2);
  auto body = [rounds](const std::vector<uint32_t> *ids, Problems *probs, ruccl_dtype_t dt) {
    return [rounds, ids, probs, dt](ruccl_comm_t *comm, size_t i) {
      for (int k = 0; k < rounds && !probs->Any(i); k++) {
        std::string p = CheckedAllReduce(comm, *ids, (*ids)[i], dt, RUCCL_SUM, 1 + (k * 7) % 40, k);
        if (!p.empty()) probs->Note(i, "round " + std::to_string(k) + ": " + p);
      }
    };
  };
  RunResult ra, rb;
  std::thread ga([&] { ra = RunPeers(ids_a, cfg_a, body(&ids_a, &pa, RUCCL_INT32)); });
  std::thread gb([&] { rb = RunPeers(ids_b, cfg_b, body(&ids_b, &pb, RUCCL_FLOAT32)); });
  ga.join();
  gb.join();
  EXPECT_TRUE(AllOk(ra));
  EXPECT_TRUE(AllOk(rb));
  EXPECT_TRUE(pa.None());
  EXPECT_TRUE(pb.None());
}

/* The same threads in a world group and a subgroup, interleaving collectives on
   the two handles (how torch uses new_group). */
TEST(Register, OneThreadInTwoGroups) {
  const std::vector<uint32_t> world = {0, 1, 2}, sub = {0, 1};
  ruccl_config_t cfg_w = MakeConfig(3, Auto(), kTimeoutMs, UniqueGroupName("W"));
  ruccl_config_t cfg_s = MakeConfig(2, Auto(), kTimeoutMs, UniqueGroupName("S"));
  Problems probs(3);
  std::vector<ruccl_result_t> reg_s(3, RUCCL_OK), fin_s(3, RUCCL_OK);
  RunResult r = RunPeers(world, cfg_w, [&](ruccl_comm_t *w, size_t i) {
    ruccl_comm_t *s = nullptr;
    if (i < 2) {
      reg_s[i] = ruccl_register(sub[i], Cpu(), &cfg_s, &s);
      if (reg_s[i] != RUCCL_OK) return;
    }
    for (int k = 0; k < 50 && !probs.Any(i); k++) {
      std::string p = CheckedAllReduce(w, world, world[i], RUCCL_INT64, RUCCL_MAX, 9, k);
      if (!p.empty()) probs.Note(i, "world round " + std::to_string(k) + ": " + p);
      if (s) {
        p = CheckedAllReduce(s, sub, sub[i], RUCCL_FLOAT64, RUCCL_SUM, 5, k);
        if (!p.empty()) probs.Note(i, "subgroup round " + std::to_string(k) + ": " + p);
      }
    }
    if (s) fin_s[i] = ruccl_finish(s);
  });
  EXPECT_TRUE(AllOk(r));
  for (size_t i = 0; i < 2; i++) {
    EXPECT_EQ(RUCCL_OK, reg_s[i]);
    EXPECT_EQ(RUCCL_OK, fin_s[i]);
  }
  EXPECT_TRUE(probs.None());
}

}  // namespace
