/* test_agreement.cc — before any output is written the participants agree on kind,
   dtype, shape, op and root.  One peer (the first in peer order, then the last)
   deviates; every participant must return the same error code, no output may be
   touched, nothing may hang, and the next collective on the same communicators
   must work. */
#include "test_util.h"

extern "C" {
#include "agreement.h"
#include "testing.h"
}

namespace {

using namespace rt;

using StratPeers = std::tuple<Strat, int>;

/* A buffer and its tensor description.  Outputs start as sentinel bytes, inputs as
   the suite's test data; Intact() says whether the bytes are what they were. */
class Buf {
 public:
  Buf(ruccl_dtype_t dt, std::vector<int64_t> shape, bool output, uint32_t peer_id = 0) {
    size_t numel = 1;
    for (int64_t d : shape) numel *= d > 0 ? static_cast<size_t>(d) : 0;
    bytes_ = output ? Sentinel(dt, numel) : FillInput(dt, RUCCL_SUM, peer_id, numel, 3);
    saved_ = bytes_;
    std::memset(&t, 0, sizeof t);
    t.data = bytes_.empty() ? nullptr : bytes_.data();
    t.dtype = dt;
    t.ndim = static_cast<int>(shape.size());
    for (size_t k = 0; k < shape.size() && k < RUCCL_MAX_DIMS; k++) t.shape[k] = shape[k];
    t.device = Cpu();
  }
  Buf(const Buf &) = delete;
  Buf &operator=(const Buf &) = delete;
  bool Intact() const { return bytes_ == saved_; }
  ruccl_tensor_t t;

 private:
  Bytes bytes_, saved_;
};

/* What a peer knows while it makes its (possibly deviating) call. */
struct Ctx {
  size_t n;
  uint32_t id;
  unsigned rank;
  unsigned odd_rank;
  bool odd;                    /* this peer is the one that deviates */
  std::vector<uint32_t> order; /* peer ids by rank */
  bool intact = true;          /* set false when a buffer changed */
  void Check(const Buf &b) { intact = intact && b.Intact(); }
};

using BadCall = std::function<ruccl_result_t(ruccl_comm_t *, Ctx &)>;

class Agreement : public ::testing::TestWithParam<StratPeers> {
 protected:
  size_t n() const { return static_cast<size_t>(std::get<1>(GetParam())); }

  /* Two rounds on the same communicators (the first, then the last peer in peer
     order deviating), each followed by a correct all-reduce. */
  void Expect(const std::vector<ruccl_result_t> &acceptable, const BadCall &bad) {
    const size_t np = n();
    const std::vector<uint32_t> ids = ScatteredIds(np);
    const int rounds = 2;
    struct Seen {
      ruccl_result_t rc = RUCCL_NUM_RESULTS;
      bool intact = false;
      std::string last_error, followup = "not run";
    };
    std::vector<std::vector<Seen>> seen(np, std::vector<Seen>(rounds));
    ruccl_config_t cfg = MakeConfig(static_cast<unsigned>(np), std::get<0>(GetParam()));
    RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
      for (int round = 0; round < rounds; round++) {
        Ctx ctx;
        ctx.n = np;
        ctx.id = ids[i];
        ctx.rank = RankOf(ids, i);
        ctx.odd_rank = round == 0 ? 0 : static_cast<unsigned>(np - 1);
        ctx.odd = ctx.rank == ctx.odd_rank;
        ctx.order = SortedIds(ids);
        Seen &s = seen[i][round];
        s.rc = bad(comm, ctx);
        s.intact = ctx.intact;
        s.last_error = ruccl_last_error() ? ruccl_last_error() : "";
        s.followup = CheckedAllReduce(comm, ids, ids[i], RUCCL_FLOAT32, RUCCL_SUM, 19, 100 + round);
        if (!s.followup.empty()) break;
      }
    });
    ASSERT_TRUE(AllOk(r));
    for (int round = 0; round < rounds; round++) {
      SCOPED_TRACE("deviating peer: rank " + std::to_string(round == 0 ? 0 : np - 1));
      for (size_t i = 0; i < np; i++) {
        const Seen &s = seen[i][round];
        const std::string who = "peer id " + std::to_string(ids[i]) + " (rank " + std::to_string(RankOf(ids, i)) + ")";
        EXPECT_NE(acceptable.end(), std::find(acceptable.begin(), acceptable.end(), s.rc))
            << who << " returned " << RcStr(s.rc) << ", expected " << ::testing::PrintToString(acceptable[0])
            << (acceptable.size() > 1 ? " (or an alternative)" : "") << "; detail: " << s.last_error;
        EXPECT_EQ(seen[0][round].rc, s.rc) << who << " disagrees with peer id " << ids[0];
        EXPECT_TRUE(s.intact) << who << ": a buffer was modified by a collective that failed";
        EXPECT_FALSE(s.last_error.empty()) << who << ": ruccl_last_error() is empty after a failure";
        EXPECT_EQ("", s.followup) << who << ": the next collective did not work";
      }
      if (HasFailure()) break;
    }
  }
  void Expect(ruccl_result_t expected, const BadCall &bad) { Expect(std::vector<ruccl_result_t>{expected}, bad); }
};

/* An out-of-place all-reduce where the deviating peer's input (and output) has
   in_shape/dt and the others' has {7}/FLOAT32. */
ruccl_result_t AllReduceWith(ruccl_comm_t *comm, Ctx &c, std::vector<int64_t> odd_shape, ruccl_dtype_t odd_dt,
                             ruccl_reduce_op_t odd_op) {
  std::vector<int64_t> shape = c.odd ? odd_shape : std::vector<int64_t>{7};
  ruccl_dtype_t dt = c.odd ? odd_dt : RUCCL_FLOAT32;
  Buf in(dt, shape, false, c.id), out(dt, shape, true);
  ruccl_result_t rc = ruccl_all_reduce(comm, &in.t, &out.t, c.odd ? odd_op : RUCCL_SUM);
  c.Check(in);
  c.Check(out);
  return rc;
}

/* ---------------------------------------------------------------- shape */

TEST_P(Agreement, ShapeMismatchDifferentNumel) {
  Expect(RUCCL_ERR_SHAPE_MISMATCH,
         [](ruccl_comm_t *comm, Ctx &c) { return AllReduceWith(comm, c, {8}, RUCCL_FLOAT32, RUCCL_SUM); });
}

TEST_P(Agreement, ShapeMismatchSameNumelSameNdim) {
  Expect(RUCCL_ERR_SHAPE_MISMATCH, [](ruccl_comm_t *comm, Ctx &c) {
    std::vector<int64_t> shape = c.odd ? std::vector<int64_t>{2, 6} : std::vector<int64_t>{3, 4};
    Buf in(RUCCL_FLOAT32, shape, false, c.id), out(RUCCL_FLOAT32, shape, true);
    ruccl_result_t rc = ruccl_all_reduce(comm, &in.t, &out.t, RUCCL_SUM);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, ShapeMismatchSameNumelOtherNdim) {
  Expect(RUCCL_ERR_SHAPE_MISMATCH, [](ruccl_comm_t *comm, Ctx &c) {
    std::vector<int64_t> shape = c.odd ? std::vector<int64_t>{12} : std::vector<int64_t>{3, 4};
    Buf in(RUCCL_FLOAT32, shape, false, c.id), out(RUCCL_FLOAT32, shape, true);
    ruccl_result_t rc = ruccl_all_reduce(comm, &in.t, &out.t, RUCCL_SUM);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, ScalarVersusOneElement) {
  Expect(RUCCL_ERR_SHAPE_MISMATCH,
         [](ruccl_comm_t *comm, Ctx &c) { return AllReduceWith(comm, c, {}, RUCCL_FLOAT32, RUCCL_SUM); });
}

TEST_P(Agreement, OutShapeDiffersFromInOnOnePeer) {
  Expect(RUCCL_ERR_SHAPE_MISMATCH, [](ruccl_comm_t *comm, Ctx &c) {
    Buf in(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {c.odd ? 8 : 7}, true);
    ruccl_result_t rc = ruccl_all_reduce(comm, &in.t, &out.t, RUCCL_SUM);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, AllGatherOutputWrongSizeOnOnePeer) {
  Expect(RUCCL_ERR_SHAPE_MISMATCH, [](ruccl_comm_t *comm, Ctx &c) {
    int64_t out_n = static_cast<int64_t>(c.n) * 5 + (c.odd ? 1 : 0);
    Buf in(RUCCL_INT32, {5}, false, c.id), out(RUCCL_INT32, {out_n}, true);
    ruccl_result_t rc = ruccl_all_gather(comm, &in.t, &out.t);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, ReduceScatterOutputWrongSizeOnOnePeer) {
  Expect(RUCCL_ERR_SHAPE_MISMATCH, [](ruccl_comm_t *comm, Ctx &c) {
    Buf in(RUCCL_INT32, {static_cast<int64_t>(c.n) * 5}, false, c.id), out(RUCCL_INT32, {c.odd ? 6 : 5}, true);
    ruccl_result_t rc = ruccl_reduce_scatter(comm, &in.t, &out.t, RUCCL_SUM);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, BroadcastShapeMismatch) {
  Expect(RUCCL_ERR_SHAPE_MISMATCH, [](ruccl_comm_t *comm, Ctx &c) {
    const bool sender = c.rank == 0;
    std::vector<int64_t> shape = {c.odd ? 8 : 7};
    Buf send(RUCCL_FLOAT32, shape, false, c.id), out(RUCCL_FLOAT32, shape, true);
    ruccl_result_t rc = ruccl_broadcast(comm, sender ? &send.t : nullptr, &out.t);
    c.Check(send);
    c.Check(out);
    return rc;
  });
}

/* ------------------------------------------------------ dtype, op, root */

TEST_P(Agreement, DtypeMismatch) {
  Expect(RUCCL_ERR_DTYPE_MISMATCH,
         [](ruccl_comm_t *comm, Ctx &c) { return AllReduceWith(comm, c, {7}, RUCCL_FLOAT64, RUCCL_SUM); });
}

TEST_P(Agreement, DtypeMismatchSameElementSize) {
  Expect(RUCCL_ERR_DTYPE_MISMATCH,
         [](ruccl_comm_t *comm, Ctx &c) { return AllReduceWith(comm, c, {7}, RUCCL_INT32, RUCCL_SUM); });
}

TEST_P(Agreement, BroadcastDtypeMismatch) {
  Expect(RUCCL_ERR_DTYPE_MISMATCH, [](ruccl_comm_t *comm, Ctx &c) {
    const bool sender = c.rank == 0;
    ruccl_dtype_t dt = c.odd ? RUCCL_INT32 : RUCCL_FLOAT32;
    Buf send(dt, {7}, false, c.id), out(dt, {7}, true);
    ruccl_result_t rc = ruccl_broadcast(comm, sender ? &send.t : nullptr, &out.t);
    c.Check(send);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, OpMismatch) {
  Expect(RUCCL_ERR_OP_MISMATCH,
         [](ruccl_comm_t *comm, Ctx &c) { return AllReduceWith(comm, c, {7}, RUCCL_FLOAT32, RUCCL_MAX); });
}

TEST_P(Agreement, ReduceRootMismatch) {
  Expect(RUCCL_ERR_ROOT_MISMATCH, [](ruccl_comm_t *comm, Ctx &c) {
    uint32_t root = c.odd ? c.order.back() : c.order.front();
    Buf in(RUCCL_INT64, {7}, false, c.id), out(RUCCL_INT64, {7}, true);
    ruccl_result_t rc = ruccl_reduce(comm, &in.t, c.id == root ? &out.t : nullptr, RUCCL_SUM, root);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, ReduceRootNotAParticipant) {
  Expect(RUCCL_ERR_INVALID_ARGUMENT, [](ruccl_comm_t *comm, Ctx &c) {
    Buf in(RUCCL_INT64, {7}, false, c.id);
    ruccl_result_t rc = ruccl_reduce(comm, &in.t, nullptr, RUCCL_SUM, 999999);
    c.Check(in);
    return rc;
  });
}

/* Only one peer names a stranger as root: whether that reads as an invalid
   argument or a root disagreement, every peer must say the same. */
TEST_P(Agreement, ReduceRootNotAParticipantOnOnePeer) {
  Expect({RUCCL_ERR_INVALID_ARGUMENT, RUCCL_ERR_ROOT_MISMATCH}, [](ruccl_comm_t *comm, Ctx &c) {
    uint32_t root = c.odd ? 999999u : c.order.front();
    Buf in(RUCCL_INT64, {7}, false, c.id), out(RUCCL_INT64, {7}, true);
    ruccl_result_t rc = ruccl_reduce(comm, &in.t, c.id == root ? &out.t : nullptr, RUCCL_SUM, root);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

/* ------------------------------------------------------ broadcast senders */

TEST_P(Agreement, BroadcastWithoutSender) {
  Expect(RUCCL_ERR_BROADCAST_SENDERS, [](ruccl_comm_t *comm, Ctx &c) {
    Buf out(RUCCL_FLOAT32, {7}, true);
    ruccl_result_t rc = ruccl_broadcast(comm, nullptr, &out.t);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, BroadcastWithTwoSenders) {
  Expect(RUCCL_ERR_BROADCAST_SENDERS, [](ruccl_comm_t *comm, Ctx &c) {
    const bool sender = c.odd || c.rank == (c.odd_rank + 1) % c.n;
    Buf send(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {7}, true);
    ruccl_result_t rc = ruccl_broadcast(comm, sender ? &send.t : nullptr, &out.t);
    c.Check(send);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, BroadcastEveryoneSends) {
  Expect(RUCCL_ERR_BROADCAST_SENDERS, [](ruccl_comm_t *comm, Ctx &c) {
    Buf send(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {7}, true);
    ruccl_result_t rc = ruccl_broadcast(comm, &send.t, &out.t);
    c.Check(send);
    c.Check(out);
    return rc;
  });
}

/* ruccl_broadcast_from: the root is named, so a disagreement on it is caught
   instead of one peer taking another root's data. */
TEST_P(Agreement, BroadcastFromRootMismatch) {
  Expect(RUCCL_ERR_ROOT_MISMATCH, [](ruccl_comm_t *comm, Ctx &c) {
    Buf t(RUCCL_FLOAT32, {7}, false, c.id);
    ruccl_result_t rc = ruccl_broadcast_from(comm, &t.t, c.odd ? c.order.back() : c.order.front());
    c.Check(t);
    return rc;
  });
}

TEST_P(Agreement, BroadcastFromVersusBroadcastWithASendTensor) {
  Expect(RUCCL_ERR_ROOT_MISMATCH, [](ruccl_comm_t *comm, Ctx &c) {
    Buf t(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {7}, true);
    uint32_t root = c.order.front();
    ruccl_result_t rc = c.odd ? ruccl_broadcast(comm, c.id == root ? &t.t : nullptr, &out.t)
                              : ruccl_broadcast_from(comm, &t.t, root);
    c.Check(t);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, BroadcastFromRootNotAParticipant) {
  Expect(RUCCL_ERR_INVALID_ARGUMENT, [](ruccl_comm_t *comm, Ctx &c) {
    Buf t(RUCCL_FLOAT32, {7}, false, c.id);
    ruccl_result_t rc = ruccl_broadcast_from(comm, &t.t, 999999);
    c.Check(t);
    return rc;
  });
}

/* ------------------------------------------------------------------ kind */

TEST_P(Agreement, AllReduceVersusBroadcast) {
  Expect(RUCCL_ERR_OP_MISMATCH, [](ruccl_comm_t *comm, Ctx &c) {
    Buf in(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {7}, true);
    ruccl_result_t rc =
        c.odd ? ruccl_broadcast(comm, &in.t, &out.t) : ruccl_all_reduce(comm, &in.t, &out.t, RUCCL_SUM);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, AllReduceVersusReduce) {
  Expect(RUCCL_ERR_OP_MISMATCH, [](ruccl_comm_t *comm, Ctx &c) {
    Buf in(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {7}, true);
    ruccl_result_t rc = c.odd ? ruccl_reduce(comm, &in.t, &out.t, RUCCL_SUM, c.id)
                              : ruccl_all_reduce(comm, &in.t, &out.t, RUCCL_SUM);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, AllReduceVersusBarrier) {
  Expect(RUCCL_ERR_OP_MISMATCH, [](ruccl_comm_t *comm, Ctx &c) {
    if (c.odd) return ruccl_barrier(comm);
    Buf in(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {7}, true);
    ruccl_result_t rc = ruccl_all_reduce(comm, &in.t, &out.t, RUCCL_SUM);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, AllGatherVersusReduceScatter) {
  Expect(RUCCL_ERR_OP_MISMATCH, [](ruccl_comm_t *comm, Ctx &c) {
    const int64_t big = static_cast<int64_t>(c.n) * 4;
    if (c.odd) {
      Buf in(RUCCL_FLOAT32, {4}, false, c.id), out(RUCCL_FLOAT32, {big}, true);
      ruccl_result_t rc = ruccl_all_gather(comm, &in.t, &out.t);
      c.Check(in);
      c.Check(out);
      return rc;
    }
    Buf in(RUCCL_FLOAT32, {big}, false, c.id), out(RUCCL_FLOAT32, {4}, true);
    ruccl_result_t rc = ruccl_reduce_scatter(comm, &in.t, &out.t, RUCCL_SUM);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

/* ------------------------------------------------ invalid arguments on one peer
   The deviating peer gets INVALID_ARGUMENT from its own checks; the others get it
   too (the error is propagated so that the sequence numbers stay aligned). */

TEST_P(Agreement, InvalidNdimOnOnePeer) {
  Expect(RUCCL_ERR_INVALID_ARGUMENT, [](ruccl_comm_t *comm, Ctx &c) {
    Buf in(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {7}, true);
    if (c.odd) in.t.ndim = out.t.ndim = RUCCL_MAX_DIMS + 1;
    ruccl_result_t rc = ruccl_all_reduce(comm, &in.t, &out.t, RUCCL_SUM);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, NegativeNdimOrDimensionOnOnePeer) {
  Expect(RUCCL_ERR_INVALID_ARGUMENT, [](ruccl_comm_t *comm, Ctx &c) {
    Buf in(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {7}, true);
    if (c.odd && c.odd_rank == 0) in.t.ndim = out.t.ndim = -1;
    if (c.odd && c.odd_rank != 0) in.t.shape[0] = out.t.shape[0] = -7;
    ruccl_result_t rc = ruccl_all_reduce(comm, &in.t, &out.t, RUCCL_SUM);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, BadDtypeValueOnOnePeer) {
  Expect(RUCCL_ERR_INVALID_ARGUMENT, [](ruccl_comm_t *comm, Ctx &c) {
    Buf in(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {7}, true);
    if (c.odd) { /* stored, never loaded as an enum by C++ code (that is what UBSan's enum check watches) */
      in.t.dtype = static_cast<ruccl_dtype_t>(99);
      out.t.dtype = static_cast<ruccl_dtype_t>(99);
    }
    ruccl_result_t rc = ruccl_all_reduce(comm, &in.t, &out.t, RUCCL_SUM);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, BadOpValueOnOnePeer) {
  Expect(RUCCL_ERR_INVALID_ARGUMENT, [](ruccl_comm_t *comm, Ctx &c) {
    Buf in(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {7}, true);
    ruccl_result_t rc = c.odd ? ruccl_all_reduce(comm, &in.t, &out.t, static_cast<ruccl_reduce_op_t>(77))
                              : ruccl_all_reduce(comm, &in.t, &out.t, RUCCL_SUM);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

// A descriptor that no well-behaved peer would send (as from a broken or hostile
// node): a rank of 1000 dimensions, a detail without its terminator, an unknown
// dtype.  The judge refuses it before using it (no read past the shape or the
// detail: ASan watches), every peer gets PROTOCOL naming it, no output is written.
TEST_P(Agreement, MalformedDescriptorOnOnePeer) {
  for (int what : {1, 2, 3}) {
    Expect(RUCCL_ERR_PROTOCOL, [what](ruccl_comm_t *comm, Ctx &c) {
      Buf in(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {7}, true);
      if (c.odd) ruccl_testing_corrupt_descriptor(what);
      ruccl_result_t rc = ruccl_all_reduce(comm, &in.t, &out.t, RUCCL_SUM);
      if (strstr(ruccl_last_error(), "malformed descriptor") == nullptr) rc = RUCCL_NUM_RESULTS;  // the wrong cause
      c.Check(in);
      c.Check(out);
      return rc;
    });
  }
}

TEST_P(Agreement, NullInputOnOnePeer) {
  Expect(RUCCL_ERR_INVALID_ARGUMENT, [](ruccl_comm_t *comm, Ctx &c) {
    Buf in(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {7}, true);
    ruccl_result_t rc = ruccl_all_reduce(comm, c.odd ? nullptr : &in.t, &out.t, RUCCL_SUM);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, NullOutputOnOnePeer) {
  Expect(RUCCL_ERR_INVALID_ARGUMENT, [](ruccl_comm_t *comm, Ctx &c) {
    Buf in(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {7}, true);
    ruccl_result_t rc = ruccl_all_reduce(comm, &in.t, c.odd ? nullptr : &out.t, RUCCL_SUM);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, NullDataWithElementsOnOnePeer) {
  Expect(RUCCL_ERR_INVALID_ARGUMENT, [](ruccl_comm_t *comm, Ctx &c) {
    Buf in(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {7}, true);
    if (c.odd) in.t.data = nullptr;
    ruccl_result_t rc = ruccl_all_reduce(comm, &in.t, &out.t, RUCCL_SUM);
    c.Check(in);
    c.Check(out);
    return rc;
  });
}

TEST_P(Agreement, ReduceRootWithoutOutput) {
  Expect(RUCCL_ERR_INVALID_ARGUMENT, [](ruccl_comm_t *comm, Ctx &c) {
    const uint32_t root = c.order[c.odd_rank]; /* the deviating peer is the root and passes no output */
    Buf in(RUCCL_FLOAT32, {7}, false, c.id);
    ruccl_result_t rc = ruccl_reduce(comm, &in.t, nullptr, RUCCL_SUM, root);
    c.Check(in);
    return rc;
  });
}

TEST_P(Agreement, BroadcastReceiverWithoutOutput) {
  Expect(RUCCL_ERR_INVALID_ARGUMENT, [](ruccl_comm_t *comm, Ctx &c) {
    const bool sender = c.rank == (c.odd_rank + 1) % c.n; /* never the deviating peer */
    Buf send(RUCCL_FLOAT32, {7}, false, c.id), out(RUCCL_FLOAT32, {7}, true);
    ruccl_result_t rc = ruccl_broadcast(comm, sender ? &send.t : nullptr, c.odd ? nullptr : &out.t);
    c.Check(send);
    c.Check(out);
    return rc;
  });
}

INSTANTIATE_TEST_SUITE_P(Grid, Agreement,
                         ::testing::Combine(::testing::ValuesIn(AllStrategies()), ::testing::Values(2, 3, 4)),
                         StratPeersName<StratPeers>);

/* -------------------------------------------------------------- NULL comm */

TEST(AgreementArgs, NullComm) {
  float v[3] = {1, 2, 3};
  ruccl_tensor_t t = Tensor(v, RUCCL_FLOAT32, {3});
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_all_reduce(nullptr, &t, &t, RUCCL_SUM));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_broadcast(nullptr, &t, &t));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_reduce(nullptr, &t, &t, RUCCL_SUM, 0));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_all_gather(nullptr, &t, &t));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_reduce_scatter(nullptr, &t, &t, RUCCL_SUM));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_barrier(nullptr));
  EXPECT_STRNE("", ruccl_last_error());
  EXPECT_EQ(1.0f, v[0]);
  EXPECT_EQ(3.0f, v[2]);
}

/* A single peer has nobody to disagree with, but its own arguments are still
   checked. */
TEST(AgreementArgs, SinglePeerStillValidatesArguments) {
  ruccl_config_t cfg = MakeConfig(1);
  ruccl_comm_t *comm = nullptr;
  ASSERT_EQ(RUCCL_OK, ruccl_register(3, Cpu(), &cfg, &comm));
  Buf in(RUCCL_FLOAT32, {7}, false, 3), out(RUCCL_FLOAT32, {8}, true);
  EXPECT_EQ(RUCCL_ERR_SHAPE_MISMATCH, ruccl_all_reduce(comm, &in.t, &out.t, RUCCL_SUM));
  EXPECT_TRUE(out.Intact());
  in.t.ndim = 9;
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_all_reduce(comm, &in.t, &in.t, RUCCL_SUM));
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_reduce(comm, &out.t, &out.t, RUCCL_SUM, 4));
  EXPECT_EQ(RUCCL_ERR_BROADCAST_SENDERS, ruccl_broadcast(comm, nullptr, &out.t));
  EXPECT_TRUE(out.Intact());
  EXPECT_EQ("", CheckedAllReduce(comm, {3}, 3));
  EXPECT_EQ(RUCCL_OK, ruccl_finish(comm));
}

}  // namespace

/* ------------------------------------------- the agreement's encoding between nodes */

namespace {

// Descriptors, verdicts and extras cross nodes in a fixed little-endian layout: a
// round trip gives every field back, and the bytes are where the layout says (not a
// copy of the struct, whose padding and byte order depend on the ABI).
TEST(AgreementWire, RoundTripsAndExplicitLittleEndianLayout) {
  coll_desc_t d;
  memset(&d, 0, sizeof d);
  d.seq = 0x0102030405060708ull;
  d.kind = RUCCL_COLL_REDUCE;
  d.dtype = RUCCL_BFLOAT16;
  d.op = RUCCL_MAX;
  d.ndim = 3;
  d.shape[0] = 2, d.shape[1] = -1, d.shape[2] = int64_t(1) << 40;
  d.root_id = 77;
  d.root_named = 1;
  d.sender = 1;
  d.local_error = RUCCL_ERR_INVALID_ARGUMENT;
  snprintf(d.detail, sizeof d.detail, "a detail");
  d.facts.device_kind = RUCCL_DEVICE_CUDA;
  for (int i = 0; i < 16; i++) d.facts.uuid.bytes[i] = uint8_t(i * 7);
  d.facts.process = 3;
  d.facts.nccl_version = 22800;
  d.nccl_stale = 1;
  d.fuse_bytes = 4096;
  d.buffers.in = 0x1122334455667788ull;
  d.buffers.out = 9;
  unsigned char w[RUCCL_DESC_WIRE_BYTES];
  ruccl_desc_encode(&d, w);
  EXPECT_EQ(0x08, w[0]);  // seq, least significant byte first
  EXPECT_EQ(0x01, w[7]);
  EXPECT_EQ(RUCCL_COLL_REDUCE, w[8]);
  EXPECT_EQ(0, w[9]);
  EXPECT_EQ(0xff, w[8 + 16 + 8]);  // shape[1] = -1, two's complement
  coll_desc_t back;
  ruccl_desc_decode(w, &back);
  EXPECT_EQ(0, memcmp(&d, &back, sizeof d)) << "every field comes back (the struct was zeroed: padding too)";

  coll_verdict_t v;
  memset(&v, 0, sizeof v);
  v.seq = 5;
  v.code = RUCCL_ERR_SHAPE_MISMATCH;
  v.sender_pos = 2;
  v.failures = 1;
  v.path = 1;
  v.nccl_new = 1;
  v.sliced = 1;
  v.extras = 1;
  v.fused = 1;
  snprintf(v.message, sizeof v.message, "shapes differ");
  unsigned char vw[RUCCL_VERDICT_WIRE_BYTES];
  ruccl_verdict_encode(&v, vw);
  EXPECT_EQ(RUCCL_ERR_SHAPE_MISMATCH, vw[8]);
  coll_verdict_t vb;
  ruccl_verdict_decode(vw, &vb);
  EXPECT_EQ(0, memcmp(&v, &vb, sizeof v));

  coll_extras_t x, xb;
  memset(&x, 0, sizeof x);
  snprintf(x.path_why, sizeof x.path_why, "why");
  for (int i = 0; i < RUCCL_NCCL_UNIQUE_ID_BYTES; i++) x.nccl_id.internal[i] = char(i);
  unsigned char xw[RUCCL_EXTRAS_WIRE_BYTES];
  ruccl_extras_encode(&x, xw);
  ruccl_extras_decode(xw, &xb);
  EXPECT_EQ(0, memcmp(&x, &xb, sizeof x));
}

// What another node sent is checked field by field before use.
TEST(AgreementWire, MalformedDescriptorsAndVerdictsAreNamed) {
  coll_desc_t d;
  memset(&d, 0, sizeof d);
  EXPECT_EQ(nullptr, ruccl_desc_malformed(&d));
  auto with = [&](auto change) {
    coll_desc_t e = d;
    change(e);
    const char *why = ruccl_desc_malformed(&e);
    return std::string(why ? why : "");
  };
  EXPECT_EQ("collective kind", with([](coll_desc_t &e) { e.kind = RUCCL_COLL_NUM_KINDS; }));
  EXPECT_EQ("error code", with([](coll_desc_t &e) { e.local_error = -1; }));
  EXPECT_EQ("detail (no terminator)", with([](coll_desc_t &e) { memset(e.detail, 'x', sizeof e.detail); }));
  EXPECT_EQ("dtype", with([](coll_desc_t &e) { e.dtype = 99; }));
  EXPECT_EQ("reduce op", with([](coll_desc_t &e) { e.op = -3; }));
  EXPECT_EQ("number of dimensions", with([](coll_desc_t &e) { e.ndim = RUCCL_MAX_DIMS + 1; }));
  EXPECT_EQ("input length", with([](coll_desc_t &e) { e.fuse_bytes = FUSE_MAX_BYTES + 1; }));
  // a peer with a local error is judged by it alone
  EXPECT_EQ("", with([](coll_desc_t &e) { e.local_error = RUCCL_ERR_INVALID_ARGUMENT, e.dtype = 99; }));

  coll_verdict_t v;
  coll_extras_t x;
  memset(&v, 0, sizeof v);
  memset(&x, 0, sizeof x);
  EXPECT_EQ(RUCCL_OK, ruccl_verdict_check(4, &v, &x));
  v.sender_pos = 4;
  EXPECT_EQ(RUCCL_ERR_PROTOCOL, ruccl_verdict_check(4, &v, &x));
  v.sender_pos = 0;
  memset(v.message, 'm', sizeof v.message);
  EXPECT_EQ(RUCCL_ERR_PROTOCOL, ruccl_verdict_check(4, &v, &x));
  v.message[0] = 0;
  v.extras = 1;
  memset(x.path_why, 'p', sizeof x.path_why);
  EXPECT_EQ(RUCCL_ERR_PROTOCOL, ruccl_verdict_check(4, &v, &x));
  EXPECT_NE(std::string(ruccl_last_error()).find("path's reason"), std::string::npos) << ruccl_last_error();
}

}  // namespace
