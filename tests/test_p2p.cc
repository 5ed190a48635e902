/* test_p2p.cc — point-to-point sends and receives between peers of one process:
   rings and all-to-all through ruccl_p2p_group (mirrored groups must not deadlock,
   whatever the sizes), ordering against collectives, and every broken pairing
   reported instead of delivered. */
#include <cstring>
#include <set>

#include "test_util.h"

extern "C" {
#include "testing.h"
}

namespace {

using namespace rt;

ruccl_p2p_op_t Op(ruccl_p2p_kind_t kind, ruccl_tensor_t *t, uint32_t peer, int32_t tag = 0) {
  return {kind, t, peer, tag};
}

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
    rc = ruccl_recv(comm, &t, 77);
    if (rc != RUCCL_ERR_INVALID_ARGUMENT) probs.Note(i, "recv from a stranger returned " + RcStr(rc));
    rc = ruccl_send(comm, nullptr, ids[1 - i]);
    if (rc != RUCCL_ERR_INVALID_ARGUMENT) probs.Note(i, "NULL tensor returned " + RcStr(rc));
    ruccl_request_t *req = reinterpret_cast<ruccl_request_t *>(1);
    rc = ruccl_irecv(comm, &t, 77, 0, &req);
    if (rc != RUCCL_ERR_INVALID_ARGUMENT || req != nullptr) probs.Note(i, "irecv from a stranger returned " + RcStr(rc));
    rc = ruccl_isend(comm, &t, ids[1 - i], 0, nullptr);
    if (rc != RUCCL_ERR_INVALID_ARGUMENT) probs.Note(i, "isend without a request pointer returned " + RcStr(rc));
    ruccl_p2p_op_t bad[] = {Op(RUCCL_P2P_SEND, &t, ids[1 - i]), Op(static_cast<ruccl_p2p_kind_t>(7), &t, ids[1 - i])};
    rc = ruccl_p2p_group(comm, bad, 2); /* nothing of it is sent */
    if (rc != RUCCL_ERR_INVALID_ARGUMENT) probs.Note(i, "unknown kind returned " + RcStr(rc));
    Bytes self_in(16, 0);
    ruccl_tensor_t si = Vec(self_in, RUCCL_UINT8, 16);
    ruccl_p2p_op_t self_ok[] = {Op(RUCCL_P2P_SEND, &t, ids[i]), Op(RUCCL_P2P_RECV, &si, ids[i])};
    rc = ruccl_p2p_group(comm, self_ok, 2);
    if (rc != RUCCL_OK || self_in != b) probs.Note(i, "self exchange returned " + RcStr(rc));
    /* what the other sent is exactly one message (the bad group sent nothing) */
    Bytes got(16, 0);
    ruccl_tensor_t g = Vec(got, RUCCL_UINT8, 16);
    ruccl_p2p_op_t pair[] = {Op(RUCCL_P2P_SEND, &t, ids[1 - i]), Op(RUCCL_P2P_RECV, &g, ids[1 - i])};
    rc = ruccl_p2p_group(comm, pair, 2);
    if (rc != RUCCL_OK || got != b) probs.Note(i, "exchange after the errors returned " + RcStr(rc));
    req = nullptr;
    rc = ruccl_irecv(comm, &g, ids[1 - i], 0, &req);
    int done = 1;
    if (rc == RUCCL_OK) rc = ruccl_test(req, &done);
    if (rc != RUCCL_OK || done) probs.Note(i, "a receive found a second message: " + RcStr(rc));
    ruccl_request_free(req);
    std::string p = CheckedAllReduce(comm, ids, ids[i]);
    if (!p.empty()) probs.Note(i, "after the errors: " + p);
  });
  EXPECT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
}

// A message of another size fails the receive that takes it (never truncated or
// padded); the session goes on, for point-to-point and collectives alike.
TEST(P2p, SizeMismatchFailsThatReceiveOnly) {
  std::vector<uint32_t> ids = {0, 1};
  ruccl_config_t cfg = MakeConfig(2);
  Problems probs(ids.size());
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    Bytes big(32, 3), small(16, 0);
    ruccl_tensor_t tb = Vec(big, RUCCL_UINT8, 32), ts = Vec(small, RUCCL_UINT8, 16);
    if (i == 0) {
      ruccl_result_t rc = ruccl_send(comm, &tb, 1);
      if (rc != RUCCL_OK) probs.Note(i, "send returned " + RcStr(rc));
    } else {
      ruccl_result_t rc = ruccl_recv(comm, &ts, 0);
      if (rc != RUCCL_ERR_PROTOCOL) probs.Note(i, "recv of 16 for 32 bytes returned " + RcStr(rc));
      else if (!strstr(ruccl_last_error(), "32 bytes")) probs.Note(i, std::string("message: ") + ruccl_last_error());
      if (small != Bytes(16, 0)) probs.Note(i, "the short receive was written");
    }
    Bytes in(32, 0);
    ruccl_tensor_t ti = Vec(in, RUCCL_UINT8, 32);
    ruccl_p2p_op_t pair[] = {Op(RUCCL_P2P_SEND, &tb, ids[1 - i]), Op(RUCCL_P2P_RECV, &ti, ids[1 - i])};
    ruccl_result_t rc = ruccl_p2p_group(comm, pair, 2);
    if (rc != RUCCL_OK || in != big) probs.Note(i, "the exchange after returned " + RcStr(rc));
    std::string p = CheckedAllReduce(comm, ids, ids[i]);
    if (!p.empty()) probs.Note(i, "all_reduce after: " + p);
  });
  EXPECT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
}

// Point-to-point and collectives are separate channels: a receive posted before an
// all-reduce whose sender sends after it (gloo allows this) completes, and so does
// the all-reduce.
TEST(P2p, ReceivePostedAcrossACollective) {
  std::vector<uint32_t> ids = {0, 1, 2};
  ruccl_config_t cfg = MakeConfig(3);
  Problems probs(ids.size());
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    Bytes msg = FillInput(RUCCL_INT32, RUCCL_SUM, 7, 1000), got = Sentinel(RUCCL_INT32, 1000);
    ruccl_tensor_t tm = Vec(msg, RUCCL_INT32, 1000), tg = Vec(got, RUCCL_INT32, 1000);
    ruccl_request_t *req = nullptr;
    if (i == 0 && ruccl_irecv(comm, &tg, 1, 5, &req) != RUCCL_OK) probs.Note(i, "irecv failed");
    std::string p = CheckedAllReduce(comm, ids, ids[i]);
    if (!p.empty()) probs.Note(i, "all_reduce: " + p);
    if (i == 1 && ruccl_isend(comm, &tm, 0, 5, &req) != RUCCL_OK) probs.Note(i, "isend failed");
    if (req) {
      ruccl_result_t rc = ruccl_wait(req);
      if (rc != RUCCL_OK) probs.Note(i, "wait returned " + RcStr(rc) + " " + ruccl_last_error());
      if (i == 0 && got != msg) probs.Note(i, "wrong bytes");
      ruccl_request_free(req);
    }
    p = CheckedAllReduce(comm, ids, ids[i], RUCCL_FLOAT32, RUCCL_SUM, 100, 2);
    if (!p.empty()) probs.Note(i, "all_reduce after: " + p);
  });
  EXPECT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
}

// Two sends with tags 1 and 2, received tag 2 first: each lands in its own buffer.
// And several messages of one tag are received in the order they were sent.
TEST(P2p, TagsMatchWhateverTheReceiveOrder) {
  std::vector<uint32_t> ids = {4, 9};
  ruccl_config_t cfg = MakeConfig(2);
  Problems probs(ids.size());
  const size_t count = 50000;
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    uint32_t other = ids[1 - i];
    std::vector<Bytes> out, in;
    for (int k = 0; k < 5; k++) out.push_back(Payload(RUCCL_INT32, ids[i], other, count + k, 10 + k));
    for (int k = 0; k < 5; k++) in.push_back(Sentinel(RUCCL_INT32, count + k));
    std::vector<ruccl_tensor_t> to, ti;
    for (int k = 0; k < 5; k++) to.push_back(Vec(out[k], RUCCL_INT32, count + k));
    for (int k = 0; k < 5; k++) ti.push_back(Vec(in[k], RUCCL_INT32, count + k));
    /* tags: message k has tag 1 for k < 3 (three in a row), tag 2 after */
    auto tag = [](int k) { return k < 3 ? 1 : 2; };
    std::vector<ruccl_request_t *> reqs;
    for (int k = 0; k < 5; k++) {
      ruccl_request_t *q = nullptr;
      if (ruccl_isend(comm, &to[k], other, tag(k), &q) != RUCCL_OK) probs.Note(i, "isend failed");
      reqs.push_back(q);
    }
    for (int k : {3, 4, 0, 1, 2}) { /* tag 2's first; then tag 1's */
      ruccl_request_t *q = nullptr;
      if (ruccl_irecv(comm, &ti[k], other, tag(k), &q) != RUCCL_OK) probs.Note(i, "irecv failed");
      reqs.push_back(q);
    }
    for (auto *q : reqs) {
      if (q && ruccl_wait(q) != RUCCL_OK) probs.Note(i, std::string("wait: ") + ruccl_last_error());
      ruccl_request_free(q);
    }
    Bytes want[5];
    for (int k = 0; k < 5; k++) want[k] = Payload(RUCCL_INT32, other, ids[i], count + k, 10 + k);
    for (int k = 0; k < 5; k++)
      if (in[k] != want[k]) probs.Note(i, "message " + std::to_string(k) + " (tag " + std::to_string(tag(k)) + ") wrong");
  });
  EXPECT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
}

// Twenty messages of one tag, all sent before any receive is posted, are received
// in the order sent, whatever order the receives are waited for in.
TEST(P2p, OneTagKeepsSendOrder) {
  std::vector<uint32_t> ids = {0, 1};
  ruccl_config_t cfg = MakeConfig(2);
  Problems probs(ids.size());
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    const int n = 20;
    std::vector<int32_t> vals(n), got(n, -1);
    std::vector<ruccl_request_t *> reqs(n, nullptr);
    for (int k = 0; k < n; k++) {
      vals[k] = 100 * (int)i + k;
      ruccl_tensor_t t = {.data = &vals[k], .dtype = RUCCL_INT32, .ndim = 0, .shape = {}, .device = {RUCCL_DEVICE_CPU, 0}};
      ruccl_request_t *q = nullptr;
      if (ruccl_isend(comm, &t, ids[1 - i], 3, &q) != RUCCL_OK) probs.Note(i, "isend");
      ruccl_request_free(q);
    }
    for (int k = 0; k < n; k++) {
      ruccl_tensor_t t = {.data = &got[k], .dtype = RUCCL_INT32, .ndim = 0, .shape = {}, .device = {RUCCL_DEVICE_CPU, 0}};
      if (ruccl_irecv(comm, &t, ids[1 - i], 3, &reqs[k]) != RUCCL_OK) probs.Note(i, "irecv");
    }
    for (int k = n - 1; k >= 0; k--) { /* waited for in reverse: matching was at arrival */
      if (ruccl_wait(reqs[k]) != RUCCL_OK) probs.Note(i, "wait");
      ruccl_request_free(reqs[k]);
    }
    for (int k = 0; k < n; k++)
      if (got[k] != 100 * (int)(1 - i) + k) probs.Note(i, "message " + std::to_string(k) + " = " + std::to_string(got[k]));
  });
  EXPECT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
}

// A receive from any peer takes the messages of every sender, and says whose each is.
TEST(P2p, ReceiveFromAnyPeer) {
  std::vector<uint32_t> ids = {2, 5, 8, 11};
  ruccl_config_t cfg = MakeConfig(4);
  Problems probs(ids.size());
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    int64_t v = 1000 + ids[i];
    ruccl_tensor_t t = {.data = &v, .dtype = RUCCL_INT64, .ndim = 0, .shape = {}, .device = {RUCCL_DEVICE_CPU, 0}};
    if (i != 0) {
      if (ruccl_send(comm, &t, ids[0]) != RUCCL_OK) probs.Note(i, "send failed");
      return;
    }
    std::set<uint32_t> seen;
    for (int k = 0; k < 3; k++) {
      int64_t got = 0;
      ruccl_tensor_t g = {.data = &got, .dtype = RUCCL_INT64, .ndim = 0, .shape = {}, .device = {RUCCL_DEVICE_CPU, 0}};
      ruccl_request_t *q = nullptr;
      uint32_t src = 0;
      if (ruccl_irecv(comm, &g, RUCCL_ANY_PEER, 0, &q) != RUCCL_OK || ruccl_wait(q) != RUCCL_OK ||
          ruccl_request_source(q, &src) != RUCCL_OK) {
        probs.Note(i, std::string("any-source receive: ") + ruccl_last_error());
      } else if (got != 1000 + (int64_t)src) {
        probs.Note(i, "the message of " + std::to_string(got) + " said it came from " + std::to_string(src));
      }
      seen.insert(src);
      ruccl_request_free(q);
    }
    if (seen != std::set<uint32_t>{5, 8, 11}) probs.Note(i, "not every sender was received once");
  });
  EXPECT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
}

// Both peers send 64 MB before either receives (gloo completes this; a rendezvous
// would deadlock): the messages wait at the receiver.
TEST(P2p, BothSendFirstAtAnySize) {
  std::vector<uint32_t> ids = {0, 1};
  ruccl_config_t cfg = MakeConfig(2);
  Problems probs(ids.size());
  const size_t count = 16u << 20; /* 64 MB of float32 */
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    Bytes out = Payload(RUCCL_FLOAT32, ids[i], ids[1 - i], count, 4), in(count * 4, 0);
    ruccl_tensor_t to = Vec(out, RUCCL_FLOAT32, count), ti = Vec(in, RUCCL_FLOAT32, count);
    ruccl_request_t *s = nullptr, *q = nullptr;
    ruccl_result_t rc = ruccl_isend(comm, &to, ids[1 - i], 0, &s);
    if (rc == RUCCL_OK) rc = ruccl_irecv(comm, &ti, ids[1 - i], 0, &q);
    if (rc == RUCCL_OK) rc = ruccl_wait(q);
    if (rc == RUCCL_OK) rc = ruccl_wait(s);
    if (rc != RUCCL_OK) probs.Note(i, "returned " + RcStr(rc) + " " + ruccl_last_error());
    else if (in != Payload(RUCCL_FLOAT32, ids[1 - i], ids[i], count, 4)) probs.Note(i, "wrong bytes");
    ruccl_request_free(s);
    ruccl_request_free(q);
  });
  EXPECT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
}

// A tag nobody sends times out (the communicator's timeout), and never takes the
// message of another tag, which the next receive of that tag still gets.  A freed
// receive leaves its message for the next one too.
TEST(P2p, UnmatchedTagTimesOutAndTakesNothing) {
  std::vector<uint32_t> ids = {0, 1};
  ruccl_config_t cfg = MakeConfig(2);
  Problems probs(ids.size());
  std::atomic<int> sent{0};
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    int32_t v = 41, w = 42;
    ruccl_tensor_t tv = {.data = &v, .dtype = RUCCL_INT32, .ndim = 0, .shape = {}, .device = {RUCCL_DEVICE_CPU, 0}};
    ruccl_tensor_t tw = {.data = &w, .dtype = RUCCL_INT32, .ndim = 0, .shape = {}, .device = {RUCCL_DEVICE_CPU, 0}};
    if (i == 1) {
      ruccl_request_t *q = nullptr;
      if (ruccl_isend(comm, &tv, 0, 1, &q) != RUCCL_OK) probs.Note(i, "isend 1");
      ruccl_request_free(q);
      if (ruccl_isend(comm, &tw, 0, 1, &q) != RUCCL_OK) probs.Note(i, "isend 2");
      ruccl_request_free(q);
      sent = 1;
      WaitFor([&] { return sent.load() == 2; }); /* stays in the session until peer 0 is done */
    } else {
      WaitFor([&] { return sent.load() == 1; });
      int32_t got = 0;
      ruccl_tensor_t tg = {.data = &got, .dtype = RUCCL_INT32, .ndim = 0, .shape = {}, .device = {RUCCL_DEVICE_CPU, 0}};
      ruccl_comm_set_timeout(comm, 300);
      ruccl_request_t *q = nullptr;
      int64_t t0 = NowMs();
      ruccl_result_t rc = ruccl_irecv(comm, &tg, 1, 2, &q);
      if (rc == RUCCL_OK) rc = ruccl_wait(q);
      int64_t took = NowMs() - t0;
      ruccl_request_free(q);
      if (rc != RUCCL_ERR_TIMEOUT || got != 0) probs.Note(i, "tag 2 returned " + RcStr(rc) + ", got " + std::to_string(got));
      if (took < 290 || took > 3000) probs.Note(i, "the 300 ms timeout took " + std::to_string(took) + " ms");
      ruccl_comm_set_timeout(comm, kTimeoutMs);
      /* a receive posted, then freed unwaited: the message stays */
      int32_t lost = 0;
      ruccl_tensor_t tl = {.data = &lost, .dtype = RUCCL_INT32, .ndim = 0, .shape = {}, .device = {RUCCL_DEVICE_CPU, 0}};
      if (ruccl_irecv(comm, &tl, 1, 3, &q) != RUCCL_OK) probs.Note(i, "irecv 3");
      ruccl_request_free(q);
      for (int32_t want : {41, 42}) {
        q = nullptr;
        rc = ruccl_irecv(comm, &tg, 1, 1, &q);
        if (rc == RUCCL_OK) rc = ruccl_wait(q);
        ruccl_request_free(q);
        if (rc != RUCCL_OK || got != want) probs.Note(i, "tag 1 got " + std::to_string(got) + ": " + RcStr(rc));
      }
      sent = 2;
    }
  });
  EXPECT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
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

namespace {

// ruccl_comm_abort from a thread of its own, while one peer waits in a receive that
// nothing will match and the other in a barrier that needs the first: both return
// RUCCL_ERR_ABORTED well within a second (the timeout is a minute), later calls fail
// the same way at once, and a session of another group in this process goes on.
TEST(Abort, FromAnotherThreadStopsEveryBlockedCall) {
  std::vector<uint32_t> ids = {0, 1};
  ruccl_config_t cfg = MakeConfig(2, Auto(), 60000);
  ruccl_config_t other = MakeConfig(2);
  ASSERT_EQ(RUCCL_OK, ruccl_config_set_group_name(&other, "abort-bystander"));
  std::vector<ruccl_result_t> rcs(2, RUCCL_NUM_RESULTS), later(2, RUCCL_NUM_RESULTS);
  std::vector<int64_t> returned_ms(2, 0);
  std::atomic<ruccl_comm_t *> victim{nullptr};
  std::atomic<int64_t> aborted_at{0};
  std::atomic<int> bystanders{0};
  std::atomic<bool> abort_returned{false};
  std::thread aborter([&] {
    WaitFor([&] { return bystanders.load() == 2 && victim.load() != nullptr && ruccl_testing_blocked() >= 2; });
    aborted_at = NowMs();
    EXPECT_EQ(RUCCL_OK, ruccl_comm_abort(victim.load()));
    abort_returned = true;
  });
  std::string bystander;
  std::thread others([&] {
    RunResult r = RunPeers(ids, other, [&](ruccl_comm_t *comm, size_t i) {
      bystanders++;
      WaitFor([&] { return aborted_at.load() != 0; });
      std::string p = CheckedAllReduce(comm, ids, ids[i]);
      if (!p.empty()) bystander = p;
    });
    if (!AllOk(r)) bystander = "registration failed";
  });
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    if (i == 0) {
      Bytes b(8, 0);
      ruccl_tensor_t t = Vec(b, RUCCL_UINT8, 8);
      victim = comm;
      rcs[i] = ruccl_recv(comm, &t, 1);
    } else {
      rcs[i] = ruccl_barrier(comm);
    }
    returned_ms[i] = NowMs();
    later[i] = ruccl_barrier(comm);
    if (i == 0) WaitFor([&] { return abort_returned.load(); }); /* the handle outlives the abort call */
  });
  aborter.join();
  others.join();
  EXPECT_TRUE(AllOk(r));
  for (size_t i = 0; i < 2; i++) {
    EXPECT_EQ(RUCCL_ERR_ABORTED, rcs[i]) << "peer " << i;
    EXPECT_EQ(RUCCL_ERR_ABORTED, later[i]) << "peer " << i << ", the call after";
    EXPECT_LT(returned_ms[i] - aborted_at.load(), 1000) << "peer " << i << " took too long to return";
    EXPECT_GE(returned_ms[i], aborted_at.load()) << "peer " << i << " returned before the abort";
  }
  EXPECT_EQ("", bystander) << "another group's session was disturbed";
}

}  // namespace
