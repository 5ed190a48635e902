// test_edge_cases.cc — corners found in review: integer MEAN whose sum overflows the
// element type, a timeout too large for the clock, and peers that reach a
// rendezvous after it was poisoned by a configuration mismatch.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "test_util.h"

extern "C" {
#include "testing.h"
}

namespace {
using namespace rt;

template <typename T>
std::vector<T> MeanOf(ruccl_dtype_t dt, const std::vector<T> &per_peer, Strat s) {
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < per_peer.size(); i++) ids.push_back(i);
  ruccl_config_t cfg = MakeConfig((unsigned)ids.size(), s);
  std::vector<T> got(ids.size());
  std::vector<ruccl_result_t> rcs(ids.size(), RUCCL_NUM_RESULTS);
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    T in[3] = {per_peer[i], per_peer[i], per_peer[i]}, out[3] = {};
    ruccl_tensor_t tin = Tensor(in, dt, {3}), tout = Tensor(out, dt, {3});
    rcs[i] = ruccl_all_reduce(comm, &tin, &tout, RUCCL_MEAN);
    got[i] = out[2];
  });
  EXPECT_TRUE(AllOk(r));
  for (auto rc : rcs) EXPECT_EQ(RUCCL_OK, rc);
  return got;
}

class IntegerMean : public ::testing::TestWithParam<Strat> {};

TEST_P(IntegerMean, IsRightWhereTheSumWouldOverflow) {
  for (int8_t v : MeanOf<int8_t>(RUCCL_INT8, {100, 100, 101}, GetParam())) EXPECT_EQ(100, v);
  for (int8_t v : MeanOf<int8_t>(RUCCL_INT8, {-128, -128}, GetParam())) EXPECT_EQ(-128, v);
  for (uint8_t v : MeanOf<uint8_t>(RUCCL_UINT8, {250, 254}, GetParam())) EXPECT_EQ(252, v);
  for (int32_t v : MeanOf<int32_t>(RUCCL_INT32, {2000000000, 2000000000, 2000000001}, GetParam()))
    EXPECT_EQ(2000000000, v);
  for (int32_t v : MeanOf<int32_t>(RUCCL_INT32, {-7, 0}, GetParam())) EXPECT_EQ(-3, v);  // truncates toward zero
}

INSTANTIATE_TEST_SUITE_P(Strategies, IntegerMean, ::testing::ValuesIn(AllStrategies()),
                         [](const auto &info) { return std::string(info.param.name); });

TEST(Timeouts, ATimeoutBeyondTheClockStillWorks) {
  for (int64_t ms : {INT64_MAX, (int64_t)10000000000000LL}) {
    ruccl_config_t cfg = MakeConfig(2);
    ASSERT_EQ(RUCCL_OK, ruccl_config_set_timeout_ms(&cfg, ms));
    std::vector<ruccl_result_t> rcs(2, RUCCL_NUM_RESULTS);
    RunResult r = RunPeers({0, 1}, cfg, [&](ruccl_comm_t *comm, size_t i) { rcs[i] = ruccl_barrier(comm); });
    EXPECT_TRUE(AllOk(r)) << ms;
    EXPECT_EQ(std::vector<ruccl_result_t>({RUCCL_OK, RUCCL_OK}), rcs) << ms;
  }
}

TEST(Rendezvous, PeersArrivingAfterAConfigMismatchFailAtOnce) {
  const std::string group = UniqueGroupName("poisoned");
  ruccl_config_t good = MakeConfig(3, Auto(), 20000, group);
  ruccl_config_t other = MakeConfig(3, Ring(), 20000, group);
  ruccl_result_t first = RUCCL_NUM_RESULTS, second = RUCCL_NUM_RESULTS, late = RUCCL_NUM_RESULTS;
  std::thread a([&] {
    ruccl_comm_t *c = nullptr;
    first = ruccl_register(1, Cpu(), &good, &c);
  });
  ASSERT_TRUE(WaitFor([] { return ruccl_testing_blocked() >= 1; })) << "the first registration never blocked";
  ruccl_comm_t *c = nullptr;
  second = ruccl_register(2, Cpu(), &other, &c);
  a.join();
  auto t0 = std::chrono::steady_clock::now();
  late = ruccl_register(0, Cpu(), &good, &c);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(RUCCL_ERR_CONFIG_MISMATCH, first);
  EXPECT_EQ(RUCCL_ERR_CONFIG_MISMATCH, second);
  EXPECT_EQ(RUCCL_ERR_CONFIG_MISMATCH, late) << ruccl_last_error();
  EXPECT_LT(took, std::chrono::seconds(2));
  // every participant has now heard the verdict: the name starts a fresh session
  std::vector<ruccl_result_t> rcs(3, RUCCL_NUM_RESULTS);
  RunResult r = RunPeers({0, 1, 2}, good, [&](ruccl_comm_t *comm, size_t i) { rcs[i] = ruccl_barrier(comm); });
  EXPECT_TRUE(AllOk(r));
  EXPECT_EQ(std::vector<ruccl_result_t>(3, RUCCL_OK), rcs);
}

}  // namespace
