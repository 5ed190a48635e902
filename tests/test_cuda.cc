/* test_cuda.cc — the CUDA adapter on a GPU (built only with RUCCL_HAVE_CUDA; every
   test skips, saying why, where cuda:0 is not usable): the reduction kernel equals
   the host reference over the whole case grid, copies of every kind round-trip,
   stream_wait honours its deadline, four peers registered on cuda:0 all-reduce FP32
   and BF16 tensors in GPU memory (the same-device path, and the host-staged one
   asked for with RUCCL_PATH), and one peer all-reduces through NCCL.
   Bit for bit, except the sign and payload of a NaN made by arithmetic (SUM, PROD,
   MEAN; a GPU makes its canonical NaN): there only NaN-ness is compared. */
#include <cuda_runtime_api.h>

#include <memory>

#include "device_cases.h"

extern "C" {
#include "device/nccl_loader.h"
#include "device/path.h"
#include "testing.h"
#include "transport.h" /* ruccl_deadline_after_ms */
}

namespace {

using namespace rt;

ruccl_device_t Gpu0() {
  ruccl_device_t d;
  d.kind = RUCCL_DEVICE_CUDA;
  d.index = 0;
  return d;
}

#define REQUIRE_GPU()                                                                        \
  do {                                                                                       \
    if (ruccl_cuda_adapter.check(Gpu0()) != RUCCL_OK)                                        \
      GTEST_SKIP() << "no CUDA device: " << ruccl_last_error();                              \
  } while (0)

#define CUDA_OK(expr)                                                                        \
  do {                                                                                       \
    cudaError_t cuda_err_ = (expr);                                                          \
    ASSERT_EQ(cudaSuccess, cuda_err_) << #expr << ": " << cudaGetErrorString(cuda_err_);     \
  } while (0)

int64_t Deadline(int64_t ms) { return ruccl_deadline_after_ms(ms); }

/* GPU memory freed when it goes out of scope. */
struct DeviceBuffer {
  void *p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) p = nullptr;
  }
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
};

/* Runs case k on the GPU over srcs: every destination's bytes, and the sources'
   bytes afterwards (unchanged unless a destination aliases them). */
void RunOnGpu(const ReduceCase &k, const std::vector<Bytes> &srcs, size_t count, void *stream,
              std::vector<Bytes> *dsts_out, std::vector<Bytes> *srcs_out) {
  const ruccl_device_adapter_t &a = ruccl_cuda_adapter;
  size_t bytes = count * ElemSize(k.dt);
  std::vector<std::unique_ptr<DeviceBuffer>> s, d;
  std::vector<void *> sp, dp;
  for (unsigned x = 0; x < k.nsrc; x++) {
    s.emplace_back(new DeviceBuffer(bytes));
    ASSERT_NE(nullptr, s.back()->p);
    sp.push_back(s.back()->p);
    ASSERT_EQ(RUCCL_OK, a.copy(Gpu0(), stream, sp.back(), srcs[x].data(), bytes, RUCCL_COPY_FROM_HOST));
  }
  for (unsigned x = 0; x < k.ndst; x++) {
    d.emplace_back(new DeviceBuffer(bytes));
    ASSERT_NE(nullptr, d.back()->p);
    dp.push_back(d.back()->p);
    CUDA_OK(cudaMemsetAsync(dp.back(), kSentinel, bytes, static_cast<cudaStream_t>(stream)));
  }
  ruccl_device_reduce_t r = Describe(k, count, sp.data(), dp.data());
  ASSERT_EQ(RUCCL_OK, a.reduce(Gpu0(), stream, &r)) << ruccl_last_error();
  dsts_out->assign(k.ndst, Bytes(bytes));
  srcs_out->assign(k.nsrc, Bytes(bytes));
  for (unsigned x = 0; x < k.ndst; x++)
    ASSERT_EQ(RUCCL_OK, a.copy(Gpu0(), stream, (*dsts_out)[x].data(), r.dsts[x], bytes, RUCCL_COPY_TO_HOST));
  for (unsigned x = 0; x < k.nsrc; x++)
    ASSERT_EQ(RUCCL_OK, a.copy(Gpu0(), stream, (*srcs_out)[x].data(), sp[x], bytes, RUCCL_COPY_TO_HOST));
  ASSERT_EQ(RUCCL_OK, a.stream_wait(Gpu0(), stream, Deadline(30000))) << ruccl_last_error();
}

void CheckCase(const ReduceCase &k, size_t count, uint64_t seed, void *stream, int *failures) {
  std::vector<Bytes> srcs = CaseSources(k, count, seed), want = ReferenceResult(k, srcs, count);
  std::vector<Bytes> got, srcs_after;
  RunOnGpu(k, srcs, count, stream, &got, &srcs_after);
  if (::testing::Test::HasFatalFailure()) return;
  for (unsigned d = 0; d < k.ndst; d++) {
    std::string diff = ReductionDiff(k.dt, got[d], want[d], ArithmeticNaNs(k));
    if (!diff.empty()) {
      ADD_FAILURE() << CaseName(k) << " (" << count << " elements), destination " << d << ": " << diff;
      ++*failures;
    }
  }
  for (unsigned x = 0; x < k.nsrc; x++) {
    bool aliased = false;
    for (unsigned d = 0; d < k.ndst; d++) aliased |= AliasOf(k, d) == static_cast<int>(x);
    if (!aliased && srcs_after[x] != srcs[x]) {
      ADD_FAILURE() << CaseName(k) << ": source " << x << " was changed";
      ++*failures;
    }
  }
}

TEST(Cuda, KernelEqualsTheReferenceOverEveryCase) {
  REQUIRE_GPU();
  void *stream = nullptr;
  ASSERT_EQ(RUCCL_OK, ruccl_cuda_adapter.stream_create(Gpu0(), &stream)) << ruccl_last_error();
  std::vector<ReduceCase> cases = AllReduceCases();
  int failures = 0;
  for (size_t c = 0; c < cases.size() && failures < 10 && !HasFatalFailure(); c++)
    CheckCase(cases[c], 1031, c, stream, &failures);
  ruccl_cuda_adapter.stream_destroy(Gpu0(), stream);
}

/* More elements than the grid has threads: the grid-stride loop; and the most
   buffers a reduction takes. */
TEST(Cuda, KernelOverManyElementsAndManyBuffers) {
  REQUIRE_GPU();
  void *stream = nullptr;
  ASSERT_EQ(RUCCL_OK, ruccl_cuda_adapter.stream_create(Gpu0(), &stream)) << ruccl_last_error();
  int failures = 0;
  CheckCase({RUCCL_FLOAT32, RUCCL_SUM, 0, 3, 2, true}, (size_t{1} << 22) + 3, 1, stream, &failures);
  CheckCase({RUCCL_BFLOAT16, RUCCL_SUM, 4, 4, 1, false}, (size_t{1} << 22) + 5, 2, stream, &failures);
  CheckCase({RUCCL_INT8, RUCCL_MAX, 0, RUCCL_DEVICE_REDUCE_MAX, RUCCL_DEVICE_REDUCE_MAX, false}, 4099, 3, stream,
            &failures);
  CheckCase({RUCCL_FLOAT16, RUCCL_SUM, 64, RUCCL_DEVICE_REDUCE_MAX, 2, true}, 4099, 4, stream, &failures);
  ruccl_device_reduce_t r;
  std::memset(&r, 0, sizeof r);
  r.nsrc = RUCCL_DEVICE_REDUCE_MAX + 1;
  r.ndst = 1;
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, ruccl_cuda_adapter.reduce(Gpu0(), stream, &r));
  ruccl_cuda_adapter.stream_destroy(Gpu0(), stream);
}

TEST(Cuda, AdapterBasics) {
  REQUIRE_GPU();
  const ruccl_device_adapter_t &a = ruccl_cuda_adapter;
  ruccl_device_uuid_t u1, u2;
  ASSERT_EQ(RUCCL_OK, a.uuid(Gpu0(), &u1));
  ASSERT_EQ(RUCCL_OK, a.uuid(Gpu0(), &u2));
  EXPECT_EQ(0, std::memcmp(&u1, &u2, sizeof u1));
  ruccl_device_uuid_t zero;
  std::memset(&zero, 0, sizeof zero);
  EXPECT_NE(0, std::memcmp(&u1, &zero, sizeof u1)) << "a GPU's UUID is not all zero";
  int n = 0;
  CUDA_OK(cudaGetDeviceCount(&n));
  ruccl_device_t past = {RUCCL_DEVICE_CUDA, n};
  EXPECT_EQ(RUCCL_ERR_DEVICE, a.check(past));
  EXPECT_NE(std::string::npos, std::string(ruccl_last_error()).find("is not usable")) << ruccl_last_error();
}

TEST(Cuda, CopiesRoundTrip) {
  REQUIRE_GPU();
  const ruccl_device_adapter_t &a = ruccl_cuda_adapter;
  void *stream = nullptr;
  ASSERT_EQ(RUCCL_OK, a.stream_create(Gpu0(), &stream)) << ruccl_last_error();
  for (size_t bytes : {size_t{1}, size_t{4097}, size_t{1} << 24}) {
    Bytes data = RandomBytes(bytes, bytes);
    void *pinned_in = nullptr, *pinned_out = nullptr;
    ASSERT_EQ(RUCCL_OK, a.host_alloc(Gpu0(), bytes, &pinned_in)) << ruccl_last_error();
    ASSERT_EQ(RUCCL_OK, a.host_alloc(Gpu0(), bytes, &pinned_out)) << ruccl_last_error();
    std::memcpy(pinned_in, data.data(), bytes);
    std::memset(pinned_out, 0, bytes);
    DeviceBuffer d1(bytes), d2(bytes);
    ASSERT_TRUE(d1.p && d2.p);
    /* pinned -> device -> device -> pinned, then device -> pageable */
    ASSERT_EQ(RUCCL_OK, a.copy(Gpu0(), stream, d1.p, pinned_in, bytes, RUCCL_COPY_FROM_HOST));
    ASSERT_EQ(RUCCL_OK, a.copy(Gpu0(), stream, d2.p, d1.p, bytes, RUCCL_COPY_ON_DEVICE));
    ASSERT_EQ(RUCCL_OK, a.copy(Gpu0(), stream, pinned_out, d2.p, bytes, RUCCL_COPY_TO_HOST));
    Bytes pageable(bytes, 0);
    ASSERT_EQ(RUCCL_OK, a.copy(Gpu0(), stream, pageable.data(), d2.p, bytes, RUCCL_COPY_TO_HOST));
    ASSERT_EQ(RUCCL_OK, a.stream_wait(Gpu0(), stream, Deadline(30000))) << ruccl_last_error();
    EXPECT_EQ(0, std::memcmp(pinned_out, data.data(), bytes)) << bytes << " bytes through pinned memory";
    EXPECT_EQ(data, pageable) << bytes << " bytes into pageable memory";
    a.host_free(Gpu0(), pinned_in);
    a.host_free(Gpu0(), pinned_out);
  }
  a.stream_destroy(Gpu0(), stream);
}

/* A host function on the stream holds it until the test lets go. */
std::atomic<int> g_release{0};
void CUDART_CB HoldStream(void *) {
  int64_t end = NowMs() + 20000; /* never longer than this, whatever the test does */
  while (!g_release.load() && NowMs() < end) SleepMs(1);
}

TEST(Cuda, StreamWaitHonoursItsDeadline) {
  REQUIRE_GPU();
  const ruccl_device_adapter_t &a = ruccl_cuda_adapter;
  void *stream = nullptr;
  ASSERT_EQ(RUCCL_OK, a.stream_create(Gpu0(), &stream)) << ruccl_last_error();
  EXPECT_EQ(RUCCL_OK, a.stream_wait(Gpu0(), stream, Deadline(1000))); /* nothing queued */
  g_release = 0;
  CUDA_OK(cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), HoldStream, nullptr));
  int64_t t0 = NowMs();
  EXPECT_EQ(RUCCL_ERR_TIMEOUT, a.stream_wait(Gpu0(), stream, Deadline(200)));
  int64_t waited = NowMs() - t0;
  EXPECT_GE(waited, 190);
  EXPECT_LT(waited, 2000) << "the deadline was passed by far";
  EXPECT_NE(std::string::npos, std::string(ruccl_last_error()).find("RUCCL_ERR_TIMEOUT")) << ruccl_last_error();
  g_release = 1;
  EXPECT_EQ(RUCCL_OK, a.stream_wait(Gpu0(), stream, 0)) << ruccl_last_error(); /* no deadline */
  a.stream_destroy(Gpu0(), stream);
}

/* Four peers on cuda:0, tensors in GPU memory: the host-staged all-reduce. */
/* Peers `ids`, threads of this process on cuda:0, all-reduce FP32 and BF16 tensors in
   GPU memory; every collective must take `path` (RUCCL_PATH set to `asked`, or
   unset). */
void AllReduceOnGpu0(const std::vector<uint32_t> &ids, const char *asked, ruccl_path_t path) {
  if (asked) setenv("RUCCL_PATH", asked, 1);
  uint64_t before = ruccl_testing_path_count(path);
  const ruccl_config_t cfg = MakeConfig(static_cast<unsigned>(ids.size()), Ring());
  struct Step {
    ruccl_dtype_t dt;
    ruccl_reduce_op_t op;
    size_t count;
    bool in_place;
  };
  const std::vector<Step> steps = {
      {RUCCL_FLOAT32, RUCCL_SUM, 1000, false},          {RUCCL_FLOAT32, RUCCL_MEAN, 1000, false},
      {RUCCL_BFLOAT16, RUCCL_SUM, 1000, false},         {RUCCL_BFLOAT16, RUCCL_MEAN, 1000, true},
      {RUCCL_FLOAT32, RUCCL_SUM, (1 << 20) + 7, true}, {RUCCL_BFLOAT16, RUCCL_MAX, (1 << 18) + 1, false},
  };
  Problems probs(ids.size());
  std::vector<ruccl_result_t> reg(ids.size(), RUCCL_NUM_RESULTS), fin(ids.size(), RUCCL_NUM_RESULTS);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ids.size(); i++) {
    threads.emplace_back([&, i] {
      ruccl_comm_t *comm = nullptr;
      reg[i] = ruccl_register(ids[i], Gpu0(), &cfg, &comm);
      if (reg[i] != RUCCL_OK) return probs.Note(i, std::string("register: ") + ruccl_last_error());
      cudaSetDevice(0);
      for (size_t s = 0; s < steps.size() && !probs.Any(i); s++) {
        const Step &st = steps[s];
        std::string at = "step " + std::to_string(s) + " (" + DtypeName(st.dt) + " " + OpName(st.op) + "): ";
        size_t bytes = st.count * ElemSize(st.dt);
        Bytes in = FillInput(st.dt, st.op, ids[i], st.count, s), out(bytes), in_after(bytes);
        DeviceBuffer din(bytes), dout(bytes);
        if (!din.p || !dout.p) return probs.Note(i, at + "cudaMalloc failed");
        cudaMemcpy(din.p, in.data(), bytes, cudaMemcpyHostToDevice);
        cudaMemset(dout.p, kSentinel, bytes);
        ruccl_tensor_t tin = Vec(in, st.dt, st.count);
        tin.data = din.p;
        tin.device = Gpu0();
        ruccl_tensor_t tout = tin;
        if (!st.in_place) tout.data = dout.p;
        ruccl_result_t rc = ruccl_all_reduce(comm, &tin, &tout, st.op);
        if (rc != RUCCL_OK) return probs.Note(i, at + RcStr(rc) + " " + ruccl_last_error());
        cudaMemcpy(out.data(), tout.data, bytes, cudaMemcpyDeviceToHost);
        cudaMemcpy(in_after.data(), din.p, bytes, cudaMemcpyDeviceToHost);
        std::string diff = CompareElems(st.dt, out, ExpectedReduce(st.dt, st.op, ids, st.count, s));
        if (!diff.empty()) probs.Note(i, at + diff);
        if (!st.in_place && in_after != in) probs.Note(i, at + "the input changed");
      }
      fin[i] = ruccl_finish(comm);
    });
  }
  for (auto &t : threads) t.join();
  unsetenv("RUCCL_PATH");
  for (size_t i = 0; i < ids.size(); i++) {
    EXPECT_EQ(RUCCL_OK, reg[i]) << "peer " << ids[i];
    EXPECT_EQ(RUCCL_OK, fin[i]) << "peer " << ids[i];
  }
  EXPECT_TRUE(probs.None());
  EXPECT_EQ(ruccl_testing_path_count(path) - before, steps.size() * ids.size())
      << "not every collective took the " << ruccl_path_name(path) << " path";
}

TEST(Cuda, FourPeersOnOneGpuAllReduceOnTheDevice) {
  REQUIRE_GPU();
  AllReduceOnGpu0(ScatteredIds(4), nullptr, RUCCL_PATH_SAME_DEVICE);
}

TEST(Cuda, FourPeersOnOneGpuAllReduceThroughPinnedMemory) {
  REQUIRE_GPU();
  AllReduceOnGpu0(ScatteredIds(4), "host-staged", RUCCL_PATH_HOST_STAGED);
}

/* NCCL at world size 1 (the one NCCL session one GPU allows): its loading, set-up,
   launch and completion; float32 SUM and MEAN go through NCCL, float32 MAX (NCCL's
   fmax drops a NaN) and bfloat16 (computed in float32) do not.  The NCCL is
   RUCCL_NCCL_LIBRARY's, else one found by the loader. */
TEST(Cuda, OnePeerThroughNccl) {
  REQUIRE_GPU();
  ASSERT_NE(ruccl_nccl(nullptr), nullptr) << "no usable NCCL: " << ruccl_nccl_unavailable_reason();
  uint64_t same = ruccl_testing_path_count(RUCCL_PATH_SAME_DEVICE);
  setenv("RUCCL_PATH", "nccl", 1);
  ruccl_config_t cfg = MakeConfig(1);
  ruccl_comm_t *comm = nullptr;
  ASSERT_EQ(RUCCL_OK, ruccl_register(0, Gpu0(), &cfg, &comm)) << ruccl_last_error();
  uint64_t nccl = ruccl_testing_path_count(RUCCL_PATH_NCCL);
  for (ruccl_reduce_op_t op : {RUCCL_SUM, RUCCL_MEAN, RUCCL_MAX}) {
    size_t count = 4099, bytes = count * 4;
    Bytes in = FillInput(RUCCL_FLOAT32, op, 0, count), out(bytes);
    DeviceBuffer din(bytes), dout(bytes);
    ASSERT_TRUE(din.p && dout.p);
    cudaMemcpy(din.p, in.data(), bytes, cudaMemcpyHostToDevice);
    ruccl_tensor_t tin = Vec(in, RUCCL_FLOAT32, count);
    tin.data = din.p;
    tin.device = Gpu0();
    ruccl_tensor_t tout = tin;
    tout.data = dout.p;
    ASSERT_EQ(RUCCL_OK, ruccl_all_reduce(comm, &tin, &tout, op)) << ruccl_last_error();
    cudaMemcpy(out.data(), dout.p, bytes, cudaMemcpyDeviceToHost);
    EXPECT_EQ("", CompareElems(RUCCL_FLOAT32, out, ExpectedReduce(RUCCL_FLOAT32, op, {0}, count))) << OpName(op);
  }
  EXPECT_EQ(2u, ruccl_testing_path_count(RUCCL_PATH_NCCL) - nccl) << "SUM and MEAN through NCCL";
  EXPECT_EQ(1u, ruccl_testing_path_count(RUCCL_PATH_SAME_DEVICE) - same) << "MAX on the device by ruccl";
  // bfloat16 sums in float32: NCCL cannot carry that; the same-device path does
  size_t count = 513, bytes = count * 2;
  Bytes in = FillInput(RUCCL_BFLOAT16, RUCCL_SUM, 0, count), out(bytes);
  DeviceBuffer din(bytes);
  ASSERT_TRUE(din.p);
  cudaMemcpy(din.p, in.data(), bytes, cudaMemcpyHostToDevice);
  ruccl_tensor_t t = Vec(in, RUCCL_BFLOAT16, count);
  t.data = din.p;
  t.device = Gpu0();
  EXPECT_EQ(RUCCL_OK, ruccl_all_reduce(comm, &t, &t, RUCCL_SUM)) << ruccl_last_error();
  cudaMemcpy(out.data(), din.p, bytes, cudaMemcpyDeviceToHost);
  EXPECT_EQ("", CompareElems(RUCCL_BFLOAT16, out, ExpectedReduce(RUCCL_BFLOAT16, RUCCL_SUM, {0}, count)));
  EXPECT_EQ(2u, ruccl_testing_path_count(RUCCL_PATH_SAME_DEVICE) - same) << "MAX, then bfloat16 SUM";
  unsetenv("RUCCL_PATH");
  EXPECT_EQ(RUCCL_OK, ruccl_finish(comm));
}

}  // namespace
