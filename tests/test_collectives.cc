/* test_collectives.cc — what each collective computes, under every local strategy
   (centralized, tree of arity 1/2/3, ring, auto) and 1–5 peers: all-reduce over
   every dtype and op, in place and out of place, bit-identical on every peer;
   broadcast from every root; reduce to every root (named by peer id); all-gather
   and reduce-scatter in peer order; barrier. */
#include "test_util.h"

namespace {

using namespace rt;

using StratPeers = std::tuple<Strat, int>;
using StratPeersDtype = std::tuple<Strat, int, ruccl_dtype_t>;

std::string CaseName(ruccl_reduce_op_t op, size_t count, bool inplace) {
  return std::string(OpName(op)) + " count " + std::to_string(count) + (inplace ? " in place" : " out of place");
}

/* ============================================================ all-reduce */

class AllReduceGrid : public ::testing::TestWithParam<StratPeersDtype> {};

struct ArCase {
  ruccl_reduce_op_t op;
  size_t count;
  bool inplace;
};

TEST_P(AllReduceGrid, EveryOpCountAndPlacement) {
  const Strat strat = std::get<0>(GetParam());
  const size_t n = static_cast<size_t>(std::get<1>(GetParam()));
  const ruccl_dtype_t dt = std::get<2>(GetParam());
  const std::vector<uint32_t> ids = ScatteredIds(n);
  std::vector<ArCase> cases;
  for (ruccl_reduce_op_t op : AllOps())
    for (size_t count : {0, 1, 7, 257})
      for (bool inplace : {false, true}) cases.push_back({op, count, inplace});

  std::vector<std::vector<Outcome>> res(n, std::vector<Outcome>(cases.size()));
  std::vector<std::vector<Bytes>> outs(n, std::vector<Bytes>(cases.size()));
  ruccl_config_t cfg = MakeConfig(static_cast<unsigned>(n), strat);
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    for (size_t c = 0; c < cases.size(); c++) {
      const ArCase &k = cases[c];
      Outcome &o = res[i][c];
      Bytes in = FillInput(dt, k.op, ids[i], k.count, c);
      const Bytes saved = in;
      ruccl_tensor_t tin = Vec(in, dt, k.count);
      if (k.inplace) {
        ruccl_tensor_t tout = Vec(in, dt, k.count); /* a second description of the same buffer */
        o.rc = ruccl_all_reduce(comm, &tin, &tout, k.op);
        outs[i][c] = in;
      } else {
        Bytes out = Sentinel(dt, k.count);
        ruccl_tensor_t tout = Vec(out, dt, k.count);
        o.rc = ruccl_all_reduce(comm, &tin, &tout, k.op);
        if (in != saved) o.problem = "the out-of-place input was modified";
        outs[i][c] = out;
      }
      if (o.rc != RUCCL_OK) {
        o.last_error = ruccl_last_error();
        break; /* the session may be unusable: don't wait out a timeout per case */
      }
    }
  });
  ASSERT_TRUE(AllOk(r));
  for (size_t c = 0; c < cases.size() && !HasFailure(); c++) {
    const ArCase &k = cases[c];
    SCOPED_TRACE(CaseName(k.op, k.count, k.inplace));
    const Bytes want = ExpectedReduce(dt, k.op, ids, k.count, c);
    for (size_t i = 0; i < n; i++) {
      const Outcome &o = res[i][c];
      ASSERT_EQ(RUCCL_OK, o.rc) << "peer " << ids[i] << ": " << o.last_error;
      EXPECT_EQ("", o.problem) << "peer " << ids[i];
      EXPECT_EQ("", CompareElems(dt, outs[i][c], want)) << "peer " << ids[i];
      EXPECT_TRUE(outs[i][c] == outs[0][c]) << "peers " << ids[0] << " and " << ids[i] << " differ";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, AllReduceGrid,
                         ::testing::Combine(::testing::ValuesIn(AllStrategies()), ::testing::Values(1, 2, 3, 4, 5),
                                            ::testing::ValuesIn(AllDtypes())),
                         [](const ::testing::TestParamInfo<StratPeersDtype> &info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "peers_" +
                                  DtypeName(std::get<2>(info.param));
                         });

class AllReduceShapes : public ::testing::TestWithParam<Strat> {};

/* ndim 0 (a scalar), several dimensions, and empty tensors whose data is NULL. */
TEST_P(AllReduceShapes, ScalarMultiDimAndEmpty) {
  const std::vector<uint32_t> ids = ScatteredIds(3);
  struct Shape {
    std::vector<int64_t> dims;
    size_t numel;
  };
  const std::vector<Shape> shapes = {{{}, 1}, {{3, 5, 7}, 105}, {{1, 1, 1, 1, 1, 1, 1, 2}, 2}, {{2, 0, 3}, 0}, {{0}, 0}};
  const std::vector<std::pair<ruccl_dtype_t, ruccl_reduce_op_t>> kinds = {
      {RUCCL_FLOAT32, RUCCL_SUM}, {RUCCL_INT64, RUCCL_MEAN}, {RUCCL_BFLOAT16, RUCCL_MAX}, {RUCCL_INT8, RUCCL_PROD}};
  const size_t ncases = shapes.size() * kinds.size();
  std::vector<std::vector<Outcome>> res(3, std::vector<Outcome>(ncases));
  std::vector<std::vector<Bytes>> outs(3, std::vector<Bytes>(ncases));
  ruccl_config_t cfg = MakeConfig(3, GetParam());
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    for (size_t c = 0; c < ncases; c++) {
      const Shape &sh = shapes[c / kinds.size()];
      const ruccl_dtype_t dt = kinds[c % kinds.size()].first;
      const ruccl_reduce_op_t op = kinds[c % kinds.size()].second;
      Bytes in = FillInput(dt, op, ids[i], sh.numel, c);
      ruccl_tensor_t t = Tensor(sh.numel ? in.data() : nullptr, dt, {});
      t.ndim = static_cast<int>(sh.dims.size());
      for (size_t d = 0; d < sh.dims.size(); d++) t.shape[d] = sh.dims[d];
      /* in == out as the very same tensor pointer */
      res[i][c].rc = ruccl_all_reduce(comm, &t, &t, op);
      outs[i][c] = in;
      if (res[i][c].rc != RUCCL_OK) {
        res[i][c].last_error = ruccl_last_error();
        break;
      }
    }
  });
  ASSERT_TRUE(AllOk(r));
  for (size_t c = 0; c < ncases && !HasFailure(); c++) {
    const Shape &sh = shapes[c / kinds.size()];
    const ruccl_dtype_t dt = kinds[c % kinds.size()].first;
    const ruccl_reduce_op_t op = kinds[c % kinds.size()].second;
    SCOPED_TRACE(std::string(DtypeName(dt)) + " " + OpName(op) + " ndim " + std::to_string(sh.dims.size()) +
                 " numel " + std::to_string(sh.numel));
    const Bytes want = ExpectedReduce(dt, op, ids, sh.numel, c);
    for (size_t i = 0; i < 3; i++) {
      ASSERT_EQ(RUCCL_OK, res[i][c].rc) << res[i][c].last_error;
      EXPECT_EQ("", CompareElems(dt, outs[i][c], want)) << "peer " << ids[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, AllReduceShapes, ::testing::ValuesIn(AllStrategies()),
                         [](const ::testing::TestParamInfo<Strat> &info) { return std::string(info.param.name); });

class AllReduceLarge : public ::testing::TestWithParam<StratPeers> {};

/* 100 000 elements, and 700 001 (several ring slices and a ragged last one). */
TEST_P(AllReduceLarge, ManyElements) {
  const Strat strat = std::get<0>(GetParam());
  const size_t n = static_cast<size_t>(std::get<1>(GetParam()));
  const std::vector<uint32_t> ids = ScatteredIds(n);
  struct Big {
    ruccl_dtype_t dt;
    ruccl_reduce_op_t op;
    bool inplace;
    size_t count;
  };
  const std::vector<Big> cases = {{RUCCL_FLOAT32, RUCCL_SUM, false, 100000}, {RUCCL_BFLOAT16, RUCCL_MEAN, true, 100000},
                                  {RUCCL_INT32, RUCCL_MAX, false, 100000},   {RUCCL_FLOAT32, RUCCL_MEAN, false, 700001},
                                  {RUCCL_FLOAT64, RUCCL_SUM, true, 700001}};
  std::vector<std::vector<Outcome>> res(n, std::vector<Outcome>(cases.size()));
  std::vector<std::vector<Bytes>> outs(n, std::vector<Bytes>(cases.size()));
  ruccl_config_t cfg = MakeConfig(static_cast<unsigned>(n), strat);
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    for (size_t c = 0; c < cases.size(); c++) {
      const Big &k = cases[c];
      const size_t count = k.count;
      Bytes in = FillInput(k.dt, k.op, ids[i], count, c);
      ruccl_tensor_t tin = Vec(in, k.dt, count);
      if (k.inplace) {
        res[i][c].rc = ruccl_all_reduce(comm, &tin, &tin, k.op);
        outs[i][c] = std::move(in);
      } else {
        const Bytes saved = in;
        Bytes out = Sentinel(k.dt, count);
        ruccl_tensor_t tout = Vec(out, k.dt, count);
        res[i][c].rc = ruccl_all_reduce(comm, &tin, &tout, k.op);
        if (in != saved) res[i][c].problem = "the out-of-place input was modified";
        outs[i][c] = std::move(out);
      }
      if (res[i][c].rc != RUCCL_OK) {
        res[i][c].last_error = ruccl_last_error();
        break;
      }
    }
  });
  ASSERT_TRUE(AllOk(r));
  for (size_t c = 0; c < cases.size(); c++) {
    SCOPED_TRACE(std::string(DtypeName(cases[c].dt)) + " " + OpName(cases[c].op));
    const Bytes want = ExpectedReduce(cases[c].dt, cases[c].op, ids, cases[c].count, c);
    for (size_t i = 0; i < n; i++) {
      ASSERT_EQ(RUCCL_OK, res[i][c].rc) << res[i][c].last_error;
      EXPECT_EQ("", res[i][c].problem);
      EXPECT_EQ("", CompareElems(cases[c].dt, outs[i][c], want)) << "peer " << ids[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Big, AllReduceLarge,
                         ::testing::Combine(::testing::ValuesIn(AllStrategies()), ::testing::Values(2, 5)),
                         StratPeersName<StratPeers>);

/* Non-integer floats: rounding now depends on the order of the additions, and every
   peer must still receive the very same bits. */
class AllReduceBitIdentical : public ::testing::TestWithParam<StratPeers> {};

TEST_P(AllReduceBitIdentical, RandomFloats) {
  const Strat strat = std::get<0>(GetParam());
  const size_t n = static_cast<size_t>(std::get<1>(GetParam()));
  const std::vector<uint32_t> ids = ScatteredIds(n);
  struct Rc {
    ruccl_dtype_t dt;
    ruccl_reduce_op_t op;
    size_t count;
  };
  std::vector<Rc> cases;
  for (ruccl_dtype_t dt : {RUCCL_FLOAT32, RUCCL_FLOAT64, RUCCL_FLOAT16, RUCCL_BFLOAT16})
    for (ruccl_reduce_op_t op : {RUCCL_SUM, RUCCL_MEAN})
      for (size_t count : {1000, 333}) cases.push_back({dt, op, count});
  auto input = [&](size_t c, uint32_t id) {
    std::mt19937 rng(static_cast<unsigned>(id * 7919 + c));
    std::uniform_real_distribution<double> dist(-1.0, 1.0);
    Bytes b(cases[c].count * ElemSize(cases[c].dt));
    for (size_t e = 0; e < cases[c].count; e++) StoreFloat(cases[c].dt, b.data(), e, dist(rng));
    return b;
  };
  std::vector<std::vector<Outcome>> res(n, std::vector<Outcome>(cases.size()));
  std::vector<std::vector<Bytes>> outs(n, std::vector<Bytes>(cases.size()));
  ruccl_config_t cfg = MakeConfig(static_cast<unsigned>(n), strat);
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    for (size_t c = 0; c < cases.size(); c++) {
      Bytes in = input(c, ids[i]);
      Bytes out = Sentinel(cases[c].dt, cases[c].count);
      ruccl_tensor_t tin = Vec(in, cases[c].dt, cases[c].count), tout = Vec(out, cases[c].dt, cases[c].count);
      res[i][c].rc = ruccl_all_reduce(comm, &tin, &tout, cases[c].op);
      outs[i][c] = std::move(out);
      if (res[i][c].rc != RUCCL_OK) {
        res[i][c].last_error = ruccl_last_error();
        break;
      }
    }
  });
  ASSERT_TRUE(AllOk(r));
  for (size_t c = 0; c < cases.size(); c++) {
    const Rc &k = cases[c];
    SCOPED_TRACE(std::string(DtypeName(k.dt)) + " " + OpName(k.op) + " count " + std::to_string(k.count));
    for (size_t i = 0; i < n; i++) {
      ASSERT_EQ(RUCCL_OK, res[i][c].rc) << res[i][c].last_error;
      ASSERT_TRUE(outs[i][c] == outs[0][c]) << "peer " << ids[i] << " received other bits than peer " << ids[0];
    }
    /* and the bits are a sensible sum (or mean) */
    std::vector<Bytes> ins;
    for (uint32_t id : ids) ins.push_back(input(c, id));
    const double eps = k.dt == RUCCL_FLOAT64 ? 2.3e-16 : k.dt == RUCCL_FLOAT32 ? 1.2e-7 : k.dt == RUCCL_FLOAT16 ? 9.8e-4 : 7.9e-3;
    for (size_t e = 0; e < k.count; e++) {
      double ref = 0;
      for (const Bytes &b : ins) ref += LoadDouble(k.dt, b.data(), e);
      if (k.op == RUCCL_MEAN) ref /= static_cast<double>(n);
      double got = LoadDouble(k.dt, outs[0][c].data(), e);
      ASSERT_NEAR(ref, got, 4 * eps * static_cast<double>(n)) << "element " << e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Random, AllReduceBitIdentical,
                         ::testing::Combine(::testing::ValuesIn(AllStrategies()), ::testing::Values(2, 3, 4, 5)),
                         StratPeersName<StratPeers>);

/* ============================================================= broadcast */

class BroadcastGrid : public ::testing::TestWithParam<StratPeers> {};

struct BcCase {
  unsigned root_rank;
  ruccl_dtype_t dt;
  size_t count;
  bool send_is_out;
};

TEST_P(BroadcastGrid, EveryRootDtypeCount) {
  const Strat strat = std::get<0>(GetParam());
  const size_t n = static_cast<size_t>(std::get<1>(GetParam()));
  const std::vector<uint32_t> ids = ScatteredIds(n);
  std::vector<BcCase> cases;
  for (unsigned root = 0; root < n; root++)
    for (ruccl_dtype_t dt : {RUCCL_FLOAT32, RUCCL_INT8, RUCCL_BFLOAT16, RUCCL_INT64})
      for (size_t count : {0, 1, 257})
        for (bool send_is_out : {false, true}) cases.push_back({root, dt, count, send_is_out});
  auto payload = [&](size_t c) { return RandomPayload(cases[c].dt, cases[c].count, 1000 + c); };
  std::vector<std::vector<Outcome>> res(n, std::vector<Outcome>(cases.size()));
  std::vector<std::vector<Bytes>> outs(n, std::vector<Bytes>(cases.size()));
  ruccl_config_t cfg = MakeConfig(static_cast<unsigned>(n), strat);
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    const unsigned me = RankOf(ids, i);
    for (size_t c = 0; c < cases.size(); c++) {
      const BcCase &k = cases[c];
      Outcome &o = res[i][c];
      if (me == k.root_rank) {
        Bytes send = payload(c);
        const Bytes saved = send;
        ruccl_tensor_t ts = Vec(send, k.dt, k.count);
        if (k.send_is_out) {
          o.rc = ruccl_broadcast(comm, &ts, &ts);
          outs[i][c] = send;
        } else {
          Bytes out = Sentinel(k.dt, k.count);
          ruccl_tensor_t to = Vec(out, k.dt, k.count);
          o.rc = ruccl_broadcast(comm, &ts, &to);
          if (send != saved) o.problem = "the sender's send buffer was modified";
          outs[i][c] = out;
        }
      } else {
        Bytes out = Sentinel(k.dt, k.count);
        ruccl_tensor_t to = Vec(out, k.dt, k.count);
        o.rc = ruccl_broadcast(comm, nullptr, &to);
        outs[i][c] = out;
      }
      if (o.rc != RUCCL_OK) {
        o.last_error = ruccl_last_error();
        break;
      }
    }
  });
  ASSERT_TRUE(AllOk(r));
  for (size_t c = 0; c < cases.size() && !HasFailure(); c++) {
    const BcCase &k = cases[c];
    SCOPED_TRACE("root rank " + std::to_string(k.root_rank) + " " + DtypeName(k.dt) + " count " +
                 std::to_string(k.count) + (k.send_is_out ? " send==out" : " send!=out"));
    const Bytes want = payload(c);
    for (size_t i = 0; i < n; i++) {
      ASSERT_EQ(RUCCL_OK, res[i][c].rc) << "peer " << ids[i] << ": " << res[i][c].last_error;
      EXPECT_EQ("", res[i][c].problem);
      EXPECT_EQ("", ByteDiff(outs[i][c], want, ElemSize(k.dt))) << "peer " << ids[i] << " did not receive the sender's exact bytes";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, BroadcastGrid,
                         ::testing::Combine(::testing::ValuesIn(AllStrategies()), ::testing::Values(1, 2, 3, 4, 5)),
                         StratPeersName<StratPeers>);

class BroadcastScalar : public ::testing::TestWithParam<Strat> {};

TEST_P(BroadcastScalar, NdimZero) {
  const std::vector<uint32_t> ids = ScatteredIds(4);
  std::vector<double> got(4, -1);
  std::vector<ruccl_result_t> rc(4, RUCCL_NUM_RESULTS);
  ruccl_config_t cfg = MakeConfig(4, GetParam());
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    double v = RankOf(ids, i) == 3 ? 2.718281828 : -1.0;
    ruccl_tensor_t t = Tensor(&v, RUCCL_FLOAT64, {});
    rc[i] = ruccl_broadcast(comm, RankOf(ids, i) == 3 ? &t : nullptr, &t);
    got[i] = v;
  });
  ASSERT_TRUE(AllOk(r));
  for (size_t i = 0; i < 4; i++) {
    EXPECT_EQ(RUCCL_OK, rc[i]);
    EXPECT_EQ(2.718281828, got[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, BroadcastScalar, ::testing::ValuesIn(AllStrategies()),
                         [](const ::testing::TestParamInfo<Strat> &info) { return std::string(info.param.name); });

/* ============================================ bit-exact special values */

/* Broadcast and all-gather move bits; they must not pass them through a float
   conversion that would quiet a signalling NaN, drop a payload or flush a
   subnormal. */
Bytes SpecialValues(ruccl_dtype_t dt, unsigned rotate) {
  std::vector<uint64_t> v;
  switch (dt) {
    case RUCCL_FLOAT16: v = {0x7c01, 0x7d1f, 0xfc01, 0x7e00, 0x7fff, 0x7c00, 0xfc00, 0x8000, 0x0001, 0x7bff}; break;
    case RUCCL_BFLOAT16: v = {0x7f81, 0x7f96, 0xff81, 0x7fc0, 0x7fff, 0x7f80, 0xff80, 0x8000, 0x0001, 0x7f7f}; break;
    case RUCCL_FLOAT32:
      v = {0x7f800001, 0x7fa00000, 0xff800001, 0x7fc00000, 0x7fffffff, 0x7f800000, 0x80000000, 0x00000001};
      break;
    default:
      v = {0x7ff0000000000001ull, 0x7ff4000000000000ull, 0xfff0000000000001ull, 0x7ff8000000000000ull,
           0x8000000000000000ull, 0x1ull};
      break;
  }
  std::rotate(v.begin(), v.begin() + rotate % v.size(), v.end());
  const size_t es = ElemSize(dt);
  Bytes b(v.size() * es);
  for (size_t i = 0; i < v.size(); i++) std::memcpy(&b[i * es], &v[i], es); /* little-endian */
  return b;
}

class BitExact : public ::testing::TestWithParam<Strat> {};

TEST_P(BitExact, BroadcastAndAllGatherKeepNaNPayloads) {
  const std::vector<uint32_t> ids = ScatteredIds(3);
  const std::vector<ruccl_dtype_t> dts = {RUCCL_FLOAT16, RUCCL_BFLOAT16, RUCCL_FLOAT32, RUCCL_FLOAT64};
  std::vector<std::vector<Outcome>> bc(3, std::vector<Outcome>(dts.size())), ag(3, std::vector<Outcome>(dts.size()));
  ruccl_config_t cfg = MakeConfig(3, GetParam());
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    const unsigned rank = RankOf(ids, i);
    for (size_t d = 0; d < dts.size(); d++) {
      const ruccl_dtype_t dt = dts[d];
      const size_t es = ElemSize(dt);
      Bytes send = SpecialValues(dt, 0);
      const size_t count = send.size() / es;
      Bytes out = Sentinel(dt, count);
      ruccl_tensor_t ts = Vec(send, dt, count), to = Vec(out, dt, count);
      bc[i][d].rc = ruccl_broadcast(comm, rank == 1 ? &ts : nullptr, &to);
      bc[i][d].problem = ByteDiff(out, SpecialValues(dt, 0), es);
      Bytes in = SpecialValues(dt, rank);
      Bytes all = Sentinel(dt, 3 * count);
      ruccl_tensor_t tin = Vec(in, dt, count), tall = Vec(all, dt, 3 * count);
      ag[i][d].rc = ruccl_all_gather(comm, &tin, &tall);
      Bytes want;
      for (unsigned k = 0; k < 3; k++) {
        Bytes b = SpecialValues(dt, k);
        want.insert(want.end(), b.begin(), b.end());
      }
      ag[i][d].problem = ByteDiff(all, want, es);
      if (bc[i][d].rc != RUCCL_OK || ag[i][d].rc != RUCCL_OK) break;
    }
  });
  ASSERT_TRUE(AllOk(r));
  for (size_t d = 0; d < dts.size(); d++)
    for (size_t i = 0; i < 3; i++) {
      SCOPED_TRACE(std::string(DtypeName(dts[d])) + ", peer " + std::to_string(ids[i]));
      ASSERT_EQ(RUCCL_OK, bc[i][d].rc);
      EXPECT_EQ("", bc[i][d].problem) << "broadcast";
      ASSERT_EQ(RUCCL_OK, ag[i][d].rc);
      EXPECT_EQ("", ag[i][d].problem) << "all_gather";
    }
}

INSTANTIATE_TEST_SUITE_P(Strategies, BitExact, ::testing::ValuesIn(AllStrategies()),
                         [](const ::testing::TestParamInfo<Strat> &info) { return std::string(info.param.name); });

/* ================================================================ reduce */

class ReduceGrid : public ::testing::TestWithParam<StratPeers> {};

struct RdCase {
  unsigned root_rank;
  ruccl_dtype_t dt;
  ruccl_reduce_op_t op;
  size_t count;
  bool root_inplace;
};

TEST_P(ReduceGrid, EveryRootByPeerId) {
  const Strat strat = std::get<0>(GetParam());
  const size_t n = static_cast<size_t>(std::get<1>(GetParam()));
  const std::vector<uint32_t> ids = ScatteredIds(n);
  const std::vector<std::pair<ruccl_dtype_t, ruccl_reduce_op_t>> kinds = {
      {RUCCL_FLOAT32, RUCCL_SUM}, {RUCCL_INT32, RUCCL_MEAN},  {RUCCL_FLOAT16, RUCCL_MAX},
      {RUCCL_INT8, RUCCL_PROD},   {RUCCL_BFLOAT16, RUCCL_MEAN}, {RUCCL_UINT8, RUCCL_MIN}};
  std::vector<RdCase> cases;
  for (unsigned root = 0; root < n; root++)
    for (size_t k = 0; k < kinds.size(); k++)
      for (size_t count : {0, 7, 257})
        cases.push_back({root, kinds[k].first, kinds[k].second, count, ((k + count + root) % 2) == 0});
  std::vector<std::vector<Outcome>> res(n, std::vector<Outcome>(cases.size()));
  std::vector<std::vector<Bytes>> outs(n, std::vector<Bytes>(cases.size()));
  ruccl_config_t cfg = MakeConfig(static_cast<unsigned>(n), strat);
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    const unsigned me = RankOf(ids, i);
    for (size_t c = 0; c < cases.size(); c++) {
      const RdCase &k = cases[c];
      const uint32_t root_id = ids[ThreadOfRank(ids, k.root_rank)];
      Outcome &o = res[i][c];
      Bytes in = FillInput(k.dt, k.op, ids[i], k.count, c);
      const Bytes saved = in;
      ruccl_tensor_t tin = Vec(in, k.dt, k.count);
      if (me != k.root_rank) {
        o.rc = ruccl_reduce(comm, &tin, nullptr, k.op, root_id);
        if (in != saved) o.problem = "a non-root peer's input was modified";
      } else if (k.root_inplace) {
        ruccl_tensor_t tout = Vec(in, k.dt, k.count);
        o.rc = ruccl_reduce(comm, &tin, &tout, k.op, root_id);
        outs[i][c] = in;
      } else {
        Bytes out = Sentinel(k.dt, k.count);
        ruccl_tensor_t tout = Vec(out, k.dt, k.count);
        o.rc = ruccl_reduce(comm, &tin, &tout, k.op, root_id);
        if (in != saved) o.problem = "the root's out-of-place input was modified";
        outs[i][c] = out;
      }
      if (o.rc != RUCCL_OK) {
        o.last_error = ruccl_last_error();
        break;
      }
    }
  });
  ASSERT_TRUE(AllOk(r));
  for (size_t c = 0; c < cases.size() && !HasFailure(); c++) {
    const RdCase &k = cases[c];
    const size_t root_thread = ThreadOfRank(ids, k.root_rank);
    SCOPED_TRACE("root peer id " + std::to_string(ids[root_thread]) + " " + DtypeName(k.dt) + " " +
                 CaseName(k.op, k.count, k.root_inplace));
    for (size_t i = 0; i < n; i++) {
      ASSERT_EQ(RUCCL_OK, res[i][c].rc) << "peer " << ids[i] << ": " << res[i][c].last_error;
      EXPECT_EQ("", res[i][c].problem) << "peer " << ids[i];
    }
    EXPECT_EQ("", CompareElems(k.dt, outs[root_thread][c], ExpectedReduce(k.dt, k.op, ids, k.count, c)));
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, ReduceGrid,
                         ::testing::Combine(::testing::ValuesIn(AllStrategies()), ::testing::Values(1, 2, 3, 4, 5)),
                         StratPeersName<StratPeers>);

class ReduceScalar : public ::testing::TestWithParam<Strat> {};

TEST_P(ReduceScalar, NdimZeroToTheHighestId) {
  const std::vector<uint32_t> ids = ScatteredIds(3); /* {5, 2, 9}: root 9 has index 2 */
  int32_t root_result = -1;
  std::vector<ruccl_result_t> rc(3, RUCCL_NUM_RESULTS);
  ruccl_config_t cfg = MakeConfig(3, GetParam());
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    int32_t v = static_cast<int32_t>(ids[i]) * 10;
    ruccl_tensor_t tin = Tensor(&v, RUCCL_INT32, {});
    if (ids[i] == 9) {
      ruccl_tensor_t tout = Tensor(&root_result, RUCCL_INT32, {});
      rc[i] = ruccl_reduce(comm, &tin, &tout, RUCCL_SUM, 9);
    } else {
      rc[i] = ruccl_reduce(comm, &tin, nullptr, RUCCL_SUM, 9);
    }
  });
  ASSERT_TRUE(AllOk(r));
  for (size_t i = 0; i < 3; i++) EXPECT_EQ(RUCCL_OK, rc[i]);
  EXPECT_EQ(160, root_result);
}

INSTANTIATE_TEST_SUITE_P(Strategies, ReduceScalar, ::testing::ValuesIn(AllStrategies()),
                         [](const ::testing::TestParamInfo<Strat> &info) { return std::string(info.param.name); });

/* ============================================================ all-gather */

class AllGatherGrid : public ::testing::TestWithParam<StratPeers> {};

TEST_P(AllGatherGrid, BlocksInPeerOrder) {
  const Strat strat = std::get<0>(GetParam());
  const size_t n = static_cast<size_t>(std::get<1>(GetParam()));
  const std::vector<uint32_t> ids = ScatteredIds(n);
  std::vector<std::pair<ruccl_dtype_t, size_t>> cases;
  for (ruccl_dtype_t dt : {RUCCL_INT64, RUCCL_FLOAT32, RUCCL_UINT8, RUCCL_BFLOAT16})
    for (size_t count : {0, 1, 7, 257}) cases.push_back({dt, count});
  auto input = [&](size_t c, uint32_t id) {
    return RandomPayload(cases[c].first, cases[c].second, 5000 + c * 131 + id);
  };
  std::vector<std::vector<Outcome>> res(n, std::vector<Outcome>(cases.size()));
  std::vector<std::vector<Bytes>> outs(n, std::vector<Bytes>(cases.size()));
  ruccl_config_t cfg = MakeConfig(static_cast<unsigned>(n), strat);
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    for (size_t c = 0; c < cases.size(); c++) {
      const ruccl_dtype_t dt = cases[c].first;
      const size_t count = cases[c].second;
      Bytes in = input(c, ids[i]);
      const Bytes saved = in;
      Bytes out = Sentinel(dt, n * count);
      ruccl_tensor_t tin = Vec(in, dt, count), tout = Vec(out, dt, n * count);
      Outcome &o = res[i][c];
      o.rc = ruccl_all_gather(comm, &tin, &tout);
      if (in != saved) o.problem = "the input was modified";
      outs[i][c] = std::move(out);
      if (o.rc != RUCCL_OK) {
        o.last_error = ruccl_last_error();
        break;
      }
    }
  });
  ASSERT_TRUE(AllOk(r));
  const std::vector<uint32_t> order = SortedIds(ids);
  for (size_t c = 0; c < cases.size() && !HasFailure(); c++) {
    SCOPED_TRACE(std::string(DtypeName(cases[c].first)) + " count " + std::to_string(cases[c].second));
    Bytes want;
    for (uint32_t id : order) {
      Bytes b = input(c, id);
      want.insert(want.end(), b.begin(), b.end());
    }
    for (size_t i = 0; i < n; i++) {
      ASSERT_EQ(RUCCL_OK, res[i][c].rc) << "peer " << ids[i] << ": " << res[i][c].last_error;
      EXPECT_EQ("", res[i][c].problem) << "peer " << ids[i];
      EXPECT_EQ("", ByteDiff(outs[i][c], want, ElemSize(cases[c].first)))
          << "peer " << ids[i] << ": not the inputs' exact bytes in ascending-id order (block = "
          << cases[c].second << " elements)";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, AllGatherGrid,
                         ::testing::Combine(::testing::ValuesIn(AllStrategies()), ::testing::Values(1, 2, 3, 4, 5)),
                         StratPeersName<StratPeers>);

/* ======================================================== reduce-scatter */

class ReduceScatterGrid : public ::testing::TestWithParam<StratPeers> {};

TEST_P(ReduceScatterGrid, PeerKGetsBlockK) {
  const Strat strat = std::get<0>(GetParam());
  const size_t n = static_cast<size_t>(std::get<1>(GetParam()));
  const std::vector<uint32_t> ids = ScatteredIds(n);
  struct RsCase {
    ruccl_dtype_t dt;
    ruccl_reduce_op_t op;
    size_t block;
  };
  std::vector<RsCase> cases;
  const std::vector<std::pair<ruccl_dtype_t, ruccl_reduce_op_t>> kinds = {
      {RUCCL_FLOAT32, RUCCL_SUM}, {RUCCL_FLOAT32, RUCCL_MEAN}, {RUCCL_INT32, RUCCL_SUM},   {RUCCL_INT32, RUCCL_MEAN},
      {RUCCL_BFLOAT16, RUCCL_SUM}, {RUCCL_INT8, RUCCL_MAX},    {RUCCL_FLOAT64, RUCCL_MIN}, {RUCCL_FLOAT16, RUCCL_PROD}};
  for (const auto &k : kinds)
    for (size_t block : {0, 1, 7, 13}) cases.push_back({k.first, k.second, block});
  std::vector<std::vector<Outcome>> res(n, std::vector<Outcome>(cases.size()));
  std::vector<std::vector<Bytes>> outs(n, std::vector<Bytes>(cases.size()));
  ruccl_config_t cfg = MakeConfig(static_cast<unsigned>(n), strat);
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    for (size_t c = 0; c < cases.size(); c++) {
      const RsCase &k = cases[c];
      Bytes in = FillInput(k.dt, k.op, ids[i], n * k.block, c);
      const Bytes saved = in;
      Bytes out = Sentinel(k.dt, k.block);
      ruccl_tensor_t tin = Vec(in, k.dt, n * k.block), tout = Vec(out, k.dt, k.block);
      Outcome &o = res[i][c];
      o.rc = ruccl_reduce_scatter(comm, &tin, &tout, k.op);
      if (in != saved) o.problem = "the input was modified";
      outs[i][c] = std::move(out);
      if (o.rc != RUCCL_OK) {
        o.last_error = ruccl_last_error();
        break;
      }
    }
  });
  ASSERT_TRUE(AllOk(r));
  for (size_t c = 0; c < cases.size() && !HasFailure(); c++) {
    const RsCase &k = cases[c];
    SCOPED_TRACE(std::string(DtypeName(k.dt)) + " " + OpName(k.op) + " block " + std::to_string(k.block));
    for (size_t i = 0; i < n; i++) {
      ASSERT_EQ(RUCCL_OK, res[i][c].rc) << "peer " << ids[i] << ": " << res[i][c].last_error;
      EXPECT_EQ("", res[i][c].problem) << "peer " << ids[i];
      const unsigned rank = RankOf(ids, i);
      Bytes want(k.block * ElemSize(k.dt));
      for (size_t j = 0; j < k.block; j++) StoreExpected(k.dt, k.op, ids, rank * k.block + j, c, want.data(), j);
      EXPECT_EQ("", CompareElems(k.dt, outs[i][c], want)) << "peer " << ids[i] << " (rank " << rank << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, ReduceScatterGrid,
                         ::testing::Combine(::testing::ValuesIn(AllStrategies()), ::testing::Values(1, 2, 3, 4, 5)),
                         StratPeersName<StratPeers>);

/* =============================================================== barrier */

class BarrierGrid : public ::testing::TestWithParam<StratPeers> {};

TEST_P(BarrierGrid, NobodyLeavesBeforeEverybodyEntered) {
  const Strat strat = std::get<0>(GetParam());
  const size_t n = static_cast<size_t>(std::get<1>(GetParam()));
  const std::vector<uint32_t> ids = ScatteredIds(n);
  const int rounds = 20;
  std::atomic<int> entered{0};
  Problems probs(n);
  ruccl_config_t cfg = MakeConfig(static_cast<unsigned>(n), strat);
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    for (int k = 0; k < rounds && !probs.Any(i); k++) {
      if (static_cast<size_t>(k) % n == i) SleepMs(3); /* a late arrival, a different one each round */
      entered.fetch_add(1);
      ruccl_result_t rc = ruccl_barrier(comm);
      int seen = entered.load();
      if (rc != RUCCL_OK)
        probs.Note(i, "round " + std::to_string(k) + ": barrier returned " + RcStr(rc) + " (" + ruccl_last_error() + ")");
      else if (seen < static_cast<int>(n) * (k + 1))
        probs.Note(i, "round " + std::to_string(k) + ": left the barrier when only " + std::to_string(seen) + " of " +
                          std::to_string(n * (k + 1)) + " entries had happened");
    }
  });
  ASSERT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
  EXPECT_EQ(static_cast<int>(n) * rounds, entered.load());
}

INSTANTIATE_TEST_SUITE_P(Grid, BarrierGrid,
                         ::testing::Combine(::testing::ValuesIn(AllStrategies()), ::testing::Values(1, 2, 3, 4, 5)),
                         StratPeersName<StratPeers>);

}  // namespace
