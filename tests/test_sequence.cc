/* test_sequence.cc — collectives are matched by order, with a sequence number:
   thousands of consecutive collectives of every kind, dtype, size and root, on
   3–4 peers, each result checked by the peer that received it. */
#include "test_util.h"

namespace {

using namespace rt;

using StratPeers = std::tuple<Strat, int>;

constexpr int kSteps = 3000;

enum Kind { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kBarrier, kNumKinds };
const char *const kKindNames[] = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "barrier"};

struct Step {
  Kind kind;
  ruccl_dtype_t dt;
  ruccl_reduce_op_t op;
  size_t count;
  unsigned root_rank;
  bool inplace;
};

/* Step s of the plan: a splitmix64 hash of s picks kind, dtype, op and size
   independently; the root rotates through the peers. */
Step StepAt(int s, size_t n) {
  uint64_t h = static_cast<uint64_t>(s) + 0x9E3779B97F4A7C15ull;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  h ^= h >> 31;
  Step st;
  st.kind = static_cast<Kind>(h % kNumKinds);
  st.dt = AllDtypes()[(h >> 8) % AllDtypes().size()];
  st.op = AllOps()[(h >> 16) % AllOps().size()];
  st.count = static_cast<size_t>((h >> 24) % 41);
  st.root_rank = static_cast<unsigned>(static_cast<size_t>(s) % n);
  st.inplace = ((h >> 40) & 1) != 0;
  return st;
}

/* Runs step s on this peer and checks what it received: "" when right. */
std::string RunStep(ruccl_comm_t *comm, int s, const std::vector<uint32_t> &ids, size_t me_thread) {
  const size_t n = ids.size();
  const Step st = StepAt(s, n);
  const std::vector<uint32_t> order = SortedIds(ids);
  const uint32_t me = ids[me_thread];
  const unsigned my_rank = RankOf(ids, me_thread);
  const uint32_t root_id = order[st.root_rank];
  const size_t es = ElemSize(st.dt);
  ruccl_result_t rc = RUCCL_OK;
  std::string bad;
  switch (st.kind) {
    case kAllReduce: {
      Bytes in = FillInput(st.dt, st.op, me, st.count, s);
      Bytes out = st.inplace ? Bytes() : Sentinel(st.dt, st.count);
      Bytes &result = st.inplace ? in : out;
      ruccl_tensor_t tin = Vec(in, st.dt, st.count), tout = Vec(result, st.dt, st.count);
      rc = ruccl_all_reduce(comm, &tin, &tout, st.op);
      if (rc == RUCCL_OK) bad = CompareElems(st.dt, result, ExpectedReduce(st.dt, st.op, ids, st.count, s));
      if (rc == RUCCL_OK && !st.inplace && in != FillInput(st.dt, st.op, me, st.count, s)) bad += " input modified";
      break;
    }
    case kBroadcast: {
      const Bytes payload = RandomPayload(st.dt, st.count, static_cast<uint64_t>(s));
      Bytes send = payload, out = Sentinel(st.dt, st.count);
      ruccl_tensor_t ts = Vec(send, st.dt, st.count), to = Vec(out, st.dt, st.count);
      rc = ruccl_broadcast(comm, me == root_id ? &ts : nullptr, &to);
      if (rc == RUCCL_OK) bad = ByteDiff(out, payload, es);
      break;
    }
    case kReduce: {
      Bytes in = FillInput(st.dt, st.op, me, st.count, s);
      Bytes out = Sentinel(st.dt, st.count);
      ruccl_tensor_t tin = Vec(in, st.dt, st.count), tout = Vec(out, st.dt, st.count);
      rc = ruccl_reduce(comm, &tin, me == root_id ? &tout : nullptr, st.op, root_id);
      if (rc == RUCCL_OK && me == root_id)
        bad = CompareElems(st.dt, out, ExpectedReduce(st.dt, st.op, ids, st.count, s));
      if (rc == RUCCL_OK && in != FillInput(st.dt, st.op, me, st.count, s)) bad += " input modified";
      break;
    }
    case kAllGather: {
      Bytes in = RandomPayload(st.dt, st.count, static_cast<uint64_t>(s) * 1000 + me);
      Bytes out = Sentinel(st.dt, n * st.count);
      ruccl_tensor_t tin = Vec(in, st.dt, st.count), tout = Vec(out, st.dt, n * st.count);
      rc = ruccl_all_gather(comm, &tin, &tout);
      if (rc == RUCCL_OK) {
        Bytes want;
        for (uint32_t id : order) {
          Bytes b = RandomPayload(st.dt, st.count, static_cast<uint64_t>(s) * 1000 + id);
          want.insert(want.end(), b.begin(), b.end());
        }
        bad = ByteDiff(out, want, es);
      }
      break;
    }
    case kReduceScatter: {
      const size_t block = st.count % 9;
      Bytes in = FillInput(st.dt, st.op, me, n * block, s);
      Bytes out = Sentinel(st.dt, block);
      ruccl_tensor_t tin = Vec(in, st.dt, n * block), tout = Vec(out, st.dt, block);
      rc = ruccl_reduce_scatter(comm, &tin, &tout, st.op);
      if (rc == RUCCL_OK) {
        Bytes want(block * es);
        for (size_t j = 0; j < block; j++) StoreExpected(st.dt, st.op, ids, my_rank * block + j, s, want.data(), j);
        bad = CompareElems(st.dt, out, want);
      }
      break;
    }
    case kBarrier:
    case kNumKinds: rc = ruccl_barrier(comm); break;
  }
  if (rc != RUCCL_OK) return "returned " + RcStr(rc) + " (" + ruccl_last_error() + ")";
  return bad;
}

class Sequence : public ::testing::TestWithParam<StratPeers> {};

TEST_P(Sequence, ThousandsOfMixedCollectives) {
  const size_t n = static_cast<size_t>(std::get<1>(GetParam()));
  const std::vector<uint32_t> ids = ScatteredIds(n);
  Problems probs(n);
  std::vector<int> done(n, 0);
  ruccl_config_t cfg = MakeConfig(static_cast<unsigned>(n), std::get<0>(GetParam()));
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    for (int s = 0; s < kSteps; s++) {
      std::string p = RunStep(comm, s, ids, i);
      if (!p.empty()) {
        const Step st = StepAt(s, n);
        probs.Note(i, "step " + std::to_string(s) + " (" + kKindNames[st.kind] + " " + DtypeName(st.dt) + " " +
                          OpName(st.op) + " count " + std::to_string(st.count) + " root rank " +
                          std::to_string(st.root_rank) + "): " + p);
        break;
      }
      done[i]++;
    }
  });
  ASSERT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
  for (size_t i = 0; i < n; i++) EXPECT_EQ(kSteps, done[i]) << "peer " << ids[i];
}

/* Every kind appears, with every dtype and op, many times over. */
TEST(SequencePlan, CoversEveryKindDtypeAndOp) {
  int kinds[kNumKinds] = {}, dts[RUCCL_NUM_DTYPES] = {}, ops[RUCCL_NUM_REDUCE_OPS] = {};
  for (int s = 0; s < kSteps; s++) {
    Step st = StepAt(s, 4);
    kinds[st.kind]++;
    if (st.kind == kAllReduce) {
      dts[st.dt]++;
      ops[st.op]++;
    }
  }
  for (int k = 0; k < kNumKinds; k++) EXPECT_GT(kinds[k], 300) << kKindNames[k];
  for (int d = 0; d < RUCCL_NUM_DTYPES; d++) EXPECT_GT(dts[d], 20) << DtypeName(static_cast<ruccl_dtype_t>(d));
  for (int o = 0; o < RUCCL_NUM_REDUCE_OPS; o++) EXPECT_GT(ops[o], 20) << OpName(static_cast<ruccl_reduce_op_t>(o));
}

INSTANTIATE_TEST_SUITE_P(Mixed, Sequence,
                         ::testing::Values(StratPeers{Auto(), 4}, StratPeers{Ring(), 3}, StratPeers{Tree(2), 4},
                                           StratPeers{Centralized(), 3}),
                         StratPeersName<StratPeers>);

}  // namespace
