/* test_p2p.cc — point-to-point sends and receives between peers of one process:
   rings and all-to-all through ruccl_p2p_group (mirrored groups must not deadlock,
   whatever the sizes), ordering against collectives, and every broken pairing
   reported instead of delivered. */
#include "test_util.h"

namespace {

using namespace rt;

ruccl_p2p_op_t Op(ruccl_p2p_kind_t kind, ruccl_tensor_t *t, uint32_t peer) { return {kind, t, peer}; }

/* Bytes peer `from` sends to peer `to` in test `salt`: distinct per pair. */
Bytes Payload(ruccl_dtype_t dt, uint32_t from, uint32_t to, size_t count, uint64_t salt) {
  return RandomPayload(dt, count, salt * 1000003u + from * 1009u + to);
}

class P2pSizes : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

// Every peer sends to the next and receives from the previous, both directions, in
// one group: 4 ops per peer, all blocked on one another unless ordered well.
TEST_P(P2pSizes, RingBothDirectionsInOneGroup) {
  auto [n, count] = GetParam();
  std::vector<uint32_t> ids = ScatteredIds(static_cast<size_t>(n));
  std::vector<uint32_t> order = SortedIds(ids);
  ruccl_config_t cfg = MakeConfig(static_cast<unsigned>(n));
  Problems probs(ids.size());
  const ruccl_dtype_t dt = RUCCL_FLOAT32;
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    unsigned me = RankOf(ids, i);
    uint32_t next = order[(me + 1) % n], prev = order[(me + n - 1) % n];
    Bytes to_next = Payload(dt, ids[i], next, count, 1), to_prev = Payload(dt, ids[i], prev, count, 2);
    Bytes from_prev = Sentinel(dt, count), from_next = Sentinel(dt, count);
    ruccl_tensor_t a = Vec(to_next, dt, count), b = Vec(to_prev, dt, count), c = Vec(from_prev, dt, count),
                   d = Vec(from_next, dt, count);
    ruccl_p2p_op_t ops[] = {Op(RUCCL_P2P_SEND, &a, next), Op(RUCCL_P2P_RECV, &c, prev), Op(RUCCL_P2P_SEND, &b, prev),
                            Op(RUCCL_P2P_RECV, &d, next)};
    ruccl_result_t rc = ruccl_p2p_group(comm, ops, 4);
    if (rc != RUCCL_OK) return probs.Note(i, "p2p_group returned " + RcStr(rc) + " (" + ruccl_last_error() + ")");
    if (from_prev != Payload(dt, prev, ids[i], count, 1)) probs.Note(i, "wrong bytes from the previous peer");
    if (from_next != Payload(dt, next, ids[i], count, 2)) probs.Note(i, "wrong bytes from the next peer");
  });
  EXPECT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
}

INSTANTIATE_TEST_SUITE_P(P2p, P2pSizes,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values<size_t>(0, 1, 1000, 300000)),
                         [](const auto &info) {
                           return std::to_string(std::get<0>(info.param)) + "Peers" +
                                  std::to_string(std::get<1>(info.param)) + "Elems";
                         });

// All-to-all with uneven sizes (self included), listed in a different order on each
// peer: pairing is per peer, by call order, not by position in the list.
TEST(P2p, AllToAllUnevenSizesAnyListOrder) {
  std::vector<uint32_t> ids = ScatteredIds(4);
  ruccl_config_t cfg = MakeConfig(4);
  Problems probs(ids.size());
  const ruccl_dtype_t dt = RUCCL_INT64;
  auto count_of = [](uint32_t from, uint32_t to) { return static_cast<size_t>((from * 7 + to * 13) % 29) * 100; };
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    size_t n = ids.size();
    std::vector<Bytes> out(n), in(n);
    std::vector<ruccl_tensor_t> tout(n), tin(n);
    std::vector<ruccl_p2p_op_t> ops;
    for (size_t k = 0; k < n; k++) {
      size_t p = (k + i) % n; /* rotate the list on each peer */
      out[p] = Payload(dt, ids[i], ids[p], count_of(ids[i], ids[p]), 3);
      in[p] = Sentinel(dt, count_of(ids[p], ids[i]));
      tout[p] = Vec(out[p], dt, count_of(ids[i], ids[p]));
      tin[p] = Vec(in[p], dt, count_of(ids[p], ids[i]));
      if (i % 2) {
        ops.push_back(Op(RUCCL_P2P_RECV, &tin[p], ids[p]));
        ops.push_back(Op(RUCCL_P2P_SEND, &tout[p], ids[p]));
      } else {
        ops.push_back(Op(RUCCL_P2P_SEND, &tout[p], ids[p]));
        ops.push_back(Op(RUCCL_P2P_RECV, &tin[p], ids[p]));
      }
    }
    ruccl_result_t rc = ruccl_p2p_group(comm, ops.data(), ops.size());
    if (rc != RUCCL_OK) return probs.Note(i, "p2p_group returned " + RcStr(rc) + " (" + ruccl_last_error() + ")");
    for (size_t p = 0; p < n; p++)
      if (in[p] != Payload(dt, ids[p], ids[i], count_of(ids[p], ids[i]), 3))
        probs.Note(i, "wrong bytes from peer " + std::to_string(ids[p]));
  });
  EXPECT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
}

// Messages between a pair arrive in the order sent; collectives before and after
// are unaffected.
TEST(P2p, SendsArriveInOrderBetweenCollectives) {
  std::vector<uint32_t> ids = {5, 9, 2};
  ruccl_config_t cfg = MakeConfig(3);
  Problems probs(ids.size());
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    std::string p = CheckedAllReduce(comm, ids, ids[i]);
    if (!p.empty()) return probs.Note(i, "before: " + p);
    const ruccl_dtype_t dt = RUCCL_UINT8;
    for (int m = 0; m < 3; m++) {
      size_t count = 10 + m;
      if (ids[i] == 5) {
        Bytes b = Payload(dt, 5, 2, count, 10 + m);
        ruccl_tensor_t t = Vec(b, dt, count);
        ruccl_result_t rc = ruccl_send(comm, &t, 2);
        if (rc != RUCCL_OK) return probs.Note(i, "send " + RcStr(rc));
      } else if (ids[i] == 2) {
        Bytes b = Sentinel(dt, count);
        ruccl_tensor_t t = Vec(b, dt, count);
        ruccl_result_t rc = ruccl_recv(comm, &t, 5);
        if (rc != RUCCL_OK) return probs.Note(i, "recv " + RcStr(rc) + " (" + ruccl_last_error() + ")");
        if (b != Payload(dt, 5, 2, count, 10 + m)) return probs.Note(i, "message " + std::to_string(m) + " wrong");
      }
    }
    p = CheckedAllReduce(comm, ids, ids[i]);
    if (!p.empty()) probs.Note(i, "after: " + p);
  });
  EXPECT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
}

// A bad argument is caught before anything moves: the session goes on.
TEST(P2p, BadArgumentsLoseNothing) {
  std::vector<uint32_t> ids = {0, 1};
  ruccl_config_t cfg = MakeConfig(2);
  Problems probs(ids.size());
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    Bytes b(16, 1);
    ruccl_tensor_t t = Vec(b, RUCCL_UINT8, 16);
    ruccl_result_t rc = ruccl_send(comm, &t, 77);
    if (rc != RUCCL_ERR_INVALID_ARGUMENT) probs.Note(i, "send to a stranger returned " + RcStr(rc));
    rc = ruccl_send(comm, &t, ids[i]);
    if (rc != RUCCL_ERR_INVALID_ARGUMENT) probs.Note(i, "unpaired send to itself returned " + RcStr(rc));
    rc = ruccl_send(comm, nullptr, ids[1 - i]);
    if (rc != RUCCL_ERR_INVALID_ARGUMENT) probs.Note(i, "NULL tensor returned " + RcStr(rc));
    ruccl_p2p_op_t bad = Op(static_cast<ruccl_p2p_kind_t>(7), &t, ids[1 - i]);
    rc = ruccl_p2p_group(comm, &bad, 1);
    if (rc != RUCCL_ERR_INVALID_ARGUMENT) probs.Note(i, "unknown kind returned " + RcStr(rc));
    Bytes small(8, 0);
    ruccl_tensor_t s = Vec(small, RUCCL_UINT8, 8);
    ruccl_p2p_op_t self_mismatch[] = {Op(RUCCL_P2P_SEND, &t, ids[i]), Op(RUCCL_P2P_RECV, &s, ids[i])};
    rc = ruccl_p2p_group(comm, self_mismatch, 2);
    if (rc != RUCCL_ERR_INVALID_ARGUMENT) probs.Note(i, "self send/recv of other sizes returned " + RcStr(rc));
    Bytes self_in(16, 0);
    ruccl_tensor_t si = Vec(self_in, RUCCL_UINT8, 16);
    ruccl_p2p_op_t self_ok[] = {Op(RUCCL_P2P_RECV, &si, ids[i]), Op(RUCCL_P2P_SEND, &t, ids[i])};
    rc = ruccl_p2p_group(comm, self_ok, 2);
    if (rc != RUCCL_OK || self_in != b) probs.Note(i, "self exchange returned " + RcStr(rc));
    std::string p = CheckedAllReduce(comm, ids, ids[i]);
    if (!p.empty()) probs.Note(i, "after the errors: " + p);
  });
  EXPECT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
}

// A receive that meets a send of another size, or a collective that meets a
// point-to-point message, is a protocol error, never silently truncated or mixed;
// it ends the session, so the other side's next call fails too instead of pairing
// wrongly.
/* Two peers: each makes its call, then a barrier.  The one at `failing` must get
   PROTOCOL; the barrier fails on both, as the session is over. */
void ExpectProtocolErrorThenBrokenSession(size_t failing, const std::function<ruccl_result_t(ruccl_comm_t *, size_t)> &call) {
  std::vector<uint32_t> ids = {0, 1};
  ruccl_config_t cfg = MakeConfig(2, Auto(), 2000);
  std::vector<ruccl_result_t> rcs(2, RUCCL_NUM_RESULTS), next(2, RUCCL_NUM_RESULTS);
  std::vector<ruccl_result_t> after(2, RUCCL_NUM_RESULTS);
  std::vector<int64_t> next_ms(2, 0);
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    rcs[i] = call(comm, i);
    int64_t t0 = NowMs();
    next[i] = ruccl_barrier(comm);
    Bytes b(4, 1), o(4, 0);
    ruccl_tensor_t t = Vec(b, RUCCL_INT8, 4), out = Vec(o, RUCCL_INT8, 4);
    after[i] = ruccl_all_reduce(comm, &t, &out, RUCCL_SUM);
    next_ms[i] = NowMs() - t0;
  });
  EXPECT_TRUE(AllOk(r));
  EXPECT_EQ(RUCCL_ERR_PROTOCOL, rcs[failing]);
  for (size_t i = 0; i < 2; i++) { /* the session is broken with that code, for both, at once */
    EXPECT_EQ(RUCCL_ERR_PROTOCOL, next[i]) << "peer " << i << ", the next call";
    EXPECT_EQ(RUCCL_ERR_PROTOCOL, after[i]) << "peer " << i << ", the call after";
    EXPECT_LT(next_ms[i], 1000) << "peer " << i << " waited for its timeout";
  }
}

TEST(P2p, SizeMismatchIsAProtocolErrorAndEndsTheSession) {
  ExpectProtocolErrorThenBrokenSession(1, [](ruccl_comm_t *comm, size_t i) {
    Bytes b(i == 0 ? 32 : 16, 3);
    ruccl_tensor_t t = Vec(b, RUCCL_UINT8, b.size());
    return i == 0 ? ruccl_send(comm, &t, 1) : ruccl_recv(comm, &t, 0);
  });
}

TEST(P2p, CollectiveThatMeetsASendIsAProtocolError) {
  ExpectProtocolErrorThenBrokenSession(0, [](ruccl_comm_t *comm, size_t i) {
    Bytes b(64, 3), o(64, 0);
    ruccl_tensor_t t = Vec(b, RUCCL_UINT8, 64), out = Vec(o, RUCCL_UINT8, 64);
    /* peer 0 gathers the collective's descriptors: it reads peer 1's send first */
    return i == 1 ? ruccl_send(comm, &t, 0) : ruccl_all_reduce(comm, &t, &out, RUCCL_SUM);
  });
}

TEST(P2p, ReceiveWithNoSenderTimesOut) {
  std::vector<uint32_t> ids = {0, 1};
  ruccl_config_t cfg = MakeConfig(2, Auto(), 300);
  std::vector<ruccl_result_t> rcs(2, RUCCL_NUM_RESULTS);
  std::atomic<bool> done{false};
  int64_t took_ms = 0;
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    if (i == 1) { /* present, but never sends, until the receive has given up */
      WaitFor([&] { return done.load(); }, 10000);
      return;
    }
    Bytes b(8, 0);
    ruccl_tensor_t t = Vec(b, RUCCL_UINT8, 8);
    int64_t t0 = NowMs();
    rcs[i] = ruccl_recv(comm, &t, 1);
    took_ms = NowMs() - t0;
    done = true;
  });
  EXPECT_TRUE(AllOk(r));
  EXPECT_EQ(RUCCL_ERR_TIMEOUT, rcs[0]) << ruccl_last_error();
  EXPECT_GE(took_ms, 290) << "gave up before the 300 ms timeout";
  EXPECT_LT(took_ms, 2000) << "the 300 ms timeout was not honoured";
}

// (Not point-to-point, but the root-naming broadcast the PyTorch backend uses.)
TEST(BroadcastFrom, EveryRootReachesEveryPeer) {
  std::vector<uint32_t> ids = ScatteredIds(3);
  std::vector<uint32_t> order = SortedIds(ids);
  ruccl_config_t cfg = MakeConfig(3);
  Problems probs(ids.size());
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    for (uint32_t root : order) {
      Bytes b = ids[i] == root ? Payload(RUCCL_FLOAT64, root, 0, 4097, 5) : Sentinel(RUCCL_FLOAT64, 4097);
      ruccl_tensor_t t = Vec(b, RUCCL_FLOAT64, 4097);
      ruccl_result_t rc = ruccl_broadcast_from(comm, &t, root);
      if (rc != RUCCL_OK) return probs.Note(i, "root " + std::to_string(root) + ": " + RcStr(rc));
      if (b != Payload(RUCCL_FLOAT64, root, 0, 4097, 5)) probs.Note(i, "root " + std::to_string(root) + ": wrong data");
    }
  });
  EXPECT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
}

}  // namespace
