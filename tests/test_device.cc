/* test_device.cc — the device adapters, on any machine: the host reference of the
   device reduction (the spec the CUDA kernels are checked against) equals the host
   kernels of dtype.c bit for bit; the CPU adapter's functions; and how a CUDA
   device is refused where it cannot be used: RUCCL_ERR_UNSUPPORTED in a build
   without CUDA, RUCCL_ERR_DEVICE with CUDA's reason in a CUDA build on a machine
   without a GPU (by registration, by a collective on every peer, and by the
   example program).  On a GPU, test_cuda.cc checks the CUDA adapter itself. */
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <map>

#include "device_cases.h"

extern "C" {
#include "dtype.h"
}
#ifdef RUCCL_HAVE_CUDA
#include "device/cuda_kernels.h"
#endif

extern char **environ;

namespace {

using namespace rt;

/* =========================================== the reference against dtype.c */

/* Case k computed by the host kernels of dtype.c, as the host-staged path runs
   them: every source widened to the compute dtype, combined in source order,
   divided (MEAN), rounded back once. */
Bytes HostKernels(const ReduceCase &k, const std::vector<Bytes> &srcs, size_t count) {
  ruccl_dtype_t cdt = ruccl_compute_dtype(k.dt, k.divisor ? RUCCL_MEAN : k.op);
  size_t cs = ruccl_dtype_size(cdt);
  Bytes acc(count * cs), next(count * cs), out(count * ElemSize(k.dt));
  ruccl_to_compute(srcs[0].data(), k.dt, acc.data(), cdt, count);
  for (unsigned s = 1; s < k.nsrc; s++) {
    ruccl_to_compute(srcs[s].data(), k.dt, next.data(), cdt, count);
    ruccl_reduce_kernel(acc.data(), acc.data(), next.data(), count, cdt, k.op, 0);
  }
  if (k.divisor) ruccl_divide_kernel(acc.data(), acc.data(), count, cdt, k.divisor);
  ruccl_from_compute(acc.data(), cdt, out.data(), k.dt, count);
  return out;
}

/* Bit for bit, NaNs included, except the sign and payload of a NaN that an add or a
   multiply made from two NaNs (ArithmeticNaNs: the compiler may swap the operands of
   dtype.c's vectorized adds, and x86 keeps the first operand's payload). */
TEST(DeviceReference, EqualsTheHostKernelsBitForBit) {
  const size_t count = 61;
  std::vector<ReduceCase> cases = AllReduceCases();
  int failures = 0;
  for (size_t c = 0; c < cases.size() && failures < 10; c++) {
    const ReduceCase &k = cases[c];
    std::vector<Bytes> srcs = CaseSources(k, count, c);
    Bytes want = HostKernels(k, srcs, count);
    std::vector<Bytes> got = ReferenceResult(k, srcs, count);
    for (unsigned d = 0; d < k.ndst; d++) {
      std::string diff = ReductionDiff(k.dt, got[d], want, ArithmeticNaNs(k));
      if (!diff.empty()) {
        ADD_FAILURE() << CaseName(k) << ", destination " << d << ": " << diff;
        failures++;
      }
    }
  }
}

/* The data reach what they are meant to: NaNs, infinities and wrapping sums. */
TEST(DeviceReference, DataCoverTheCorners) {
  Bytes f = ReductionData(RUCCL_FLOAT32, 600, 1), h = ReductionData(RUCCL_FLOAT16, 600, 2);
  int nan = 0, inf = 0, hnan = 0;
  for (size_t i = 0; i < 600; i++) {
    float v = GetRaw<float>(f.data(), i);
    nan += std::isnan(v);
    inf += std::isinf(v);
    hnan += std::isnan(HalfToFloat(GetRaw<uint16_t>(h.data(), i)));
  }
  EXPECT_GT(nan, 10);
  EXPECT_GT(inf, 5);
  EXPECT_GT(hnan, 10);
}

/* One element of one reduction through the reference. */
template <typename T>
T ReduceOne(ruccl_dtype_t dt, ruccl_reduce_op_t op, unsigned divisor, std::vector<T> vals) {
  T out{};
  ruccl_device_reduce_t r;
  std::memset(&r, 0, sizeof r);
  for (size_t i = 0; i < vals.size(); i++) r.srcs[i] = &vals[i];
  r.dsts[0] = &out;
  r.nsrc = static_cast<unsigned>(vals.size());
  r.ndst = 1;
  r.count = 1;
  r.dtype = dt;
  r.op = op;
  r.divisor = divisor;
  ruccl_reduce_reference(&r);
  return out;
}

/* The rules of reduce_ops.h, value by value. */
TEST(DeviceReference, HandPickedValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(ReduceOne<float>(RUCCL_FLOAT32, RUCCL_MIN, 0, {1.0f, nan, -inf})));
  EXPECT_TRUE(std::isnan(ReduceOne<float>(RUCCL_FLOAT32, RUCCL_MAX, 0, {nan, inf})));
  EXPECT_EQ(-inf, ReduceOne<float>(RUCCL_FLOAT32, RUCCL_MIN, 0, {1.0f, -inf, 3.0f}));
  EXPECT_EQ(1.5f, ReduceOne<float>(RUCCL_FLOAT32, RUCCL_SUM, 2, {1.0f, 2.0f}));
  EXPECT_EQ(int8_t(-128), ReduceOne<int8_t>(RUCCL_INT8, RUCCL_SUM, 0, {127, 1}));            /* wraps */
  EXPECT_EQ(int8_t(0), ReduceOne<int8_t>(RUCCL_INT8, RUCCL_PROD, 0, {16, 16}));             /* wraps */
  EXPECT_EQ(int8_t(127), ReduceOne<int8_t>(RUCCL_INT8, RUCCL_SUM, 2, {127, 127}));          /* mean in int64 */
  EXPECT_EQ(uint8_t(255), ReduceOne<uint8_t>(RUCCL_UINT8, RUCCL_SUM, 3, {255, 255, 255}));  /* mean in int64 */
  EXPECT_EQ(int32_t(-3), ReduceOne<int32_t>(RUCCL_INT32, RUCCL_SUM, 2, {-3, -4}));          /* truncates */
  EXPECT_EQ(INT64_MIN, ReduceOne<int64_t>(RUCCL_INT64, RUCCL_SUM, 0, {INT64_MAX, 1}));
  /* float16: 1024 + 0.5 ties to even (1024); 1024 + 0.5 + 0.5 is 1025 in float32, rounded once */
  EXPECT_EQ(FloatToHalf(1024.0f), ReduceOne<uint16_t>(RUCCL_FLOAT16, RUCCL_SUM, 0, {0x6400, 0x3800}));
  EXPECT_EQ(FloatToHalf(1026.0f), ReduceOne<uint16_t>(RUCCL_FLOAT16, RUCCL_SUM, 0, {0x6400, 0x3800, 0x3800, 0x3c00}));
  EXPECT_EQ(0x7c00, ReduceOne<uint16_t>(RUCCL_FLOAT16, RUCCL_SUM, 0, {0x7bff, 0x5000})); /* overflow: inf */
  EXPECT_EQ(0x7bff, ReduceOne<uint16_t>(RUCCL_FLOAT16, RUCCL_SUM, 2, {0x7bff, 0x7bff})); /* mean in float32 */
  EXPECT_EQ(FloatToBf16(3.0f), ReduceOne<uint16_t>(RUCCL_BFLOAT16, RUCCL_SUM, 0, {0x3f80, 0x4000}));
}

#ifdef RUCCL_HAVE_CUDA
/* Whether every buffer of r starts on a 16-byte boundary (where the kernel packs). */
bool AllAligned16(const ruccl_device_reduce_t &r) {
  uintptr_t bits = 0;
  for (unsigned k = 0; k < r.nsrc; k++) bits |= reinterpret_cast<uintptr_t>(r.srcs[k]);
  for (unsigned d = 0; d < r.ndst; d++) bits |= reinterpret_cast<uintptr_t>(r.dsts[d]);
  return (bits & 15) == 0;
}

/* The reduction r over copies of its buffers that start one element past a 16-byte
   boundary (a buffer both read and written stays one buffer), copied back after. */
void ReduceMisalignedOnHost(ruccl_device_reduce_t *r) {
  const size_t es = ruccl_dtype_size(r->dtype), bytes = r->count * es;
  std::map<void *, std::vector<unsigned char>> copies;
  std::map<void *, void *> at;  // where each buffer's copy begins
  auto moved = [&](void *p) {
    if (!at.count(p)) {
      std::vector<unsigned char> &copy = copies.emplace(p, std::vector<unsigned char>(bytes + 16 + es)).first->second;
      unsigned char *base = copy.data();
      base += (16 - (reinterpret_cast<uintptr_t>(base) & 15)) & 15;
      std::memcpy(base + es, p, bytes);
      at[p] = base + es;
    }
    return at[p];
  };
  ruccl_device_reduce_t m = *r;
  for (unsigned k = 0; k < m.nsrc; k++) m.srcs[k] = moved(const_cast<void *>(m.srcs[k]));
  for (unsigned d = 0; d < m.ndst; d++) m.dsts[d] = moved(m.dsts[d]);
  EXPECT_FALSE(AllAligned16(m)) << "the misaligned run's buffers are 16-byte aligned";
  ruccl_cuda_reduce_on_host(&m);
  for (unsigned d = 0; d < r->ndst; d++) std::memcpy(r->dsts[d], m.dsts[d], bytes);
}

/* The CUDA kernel's element code and dtype dispatch, compiled by nvcc and run on the
   host: what a machine without a GPU can check of the kernel (test_cuda.cc runs it
   on a GPU).  The packed code (every buffer 16-byte aligned: 16 bytes at a time, then
   the tail element by element) and the element code (a buffer off that alignment),
   over 61 elements: whole packs and a tail for every dtype. */
TEST(DeviceCudaKernel, ElementCodeOnTheHostEqualsTheReference) {
  const size_t count = 61;
  std::vector<ReduceCase> cases = AllReduceCases();
  int failures = 0;
  for (bool misaligned : {false, true}) {
    for (size_t c = 0; c < cases.size() && failures < 10; c++) {
      const ReduceCase &k = cases[c];
      CaseRun run = RunCase(k, count, c, [misaligned](ruccl_device_reduce_t *r) {
        if (misaligned) {
          ReduceMisalignedOnHost(r);
        } else {
          EXPECT_TRUE(AllAligned16(*r)) << "the aligned run's buffers are not 16-byte aligned";
          ruccl_cuda_reduce_on_host(r);
        }
        return RUCCL_OK;
      });
      for (unsigned d = 0; d < k.ndst; d++) {
        std::string diff = ReductionDiff(k.dt, run.got[d], run.want[d], ArithmeticNaNs(k));
        if (!diff.empty()) {
          ADD_FAILURE() << CaseName(k) << (misaligned ? " (misaligned)" : " (aligned)") << ", destination " << d
                        << ": " << diff;
          failures++;
        }
      }
    }
  }
}
#endif

/* ====================================================== the adapter table */

TEST(DeviceAdapters, TableNamesTheAdaptersOfThisBuild) {
  const ruccl_device_adapter_t *cpu = ruccl_device_adapter(RUCCL_DEVICE_CPU);
  ASSERT_EQ(&ruccl_cpu_adapter, cpu);
  EXPECT_STREQ("cpu", cpu->name);
  EXPECT_EQ(1, cpu->host_accessible);
#ifdef RUCCL_HAVE_CUDA
  const ruccl_device_adapter_t *cuda = ruccl_device_adapter(RUCCL_DEVICE_CUDA);
  ASSERT_EQ(&ruccl_cuda_adapter, cuda);
  EXPECT_STREQ("cuda", cuda->name);
  EXPECT_EQ(0, cuda->host_accessible);
#else
  EXPECT_EQ(nullptr, ruccl_device_adapter(RUCCL_DEVICE_CUDA));
#endif
  EXPECT_EQ(nullptr, ruccl_device_adapter(static_cast<ruccl_device_kind_t>(7)));
}

/* ========================================================= the CPU adapter */

TEST(DeviceCpuAdapter, EveryFunctionWorksAtOnce) {
  const ruccl_device_adapter_t &a = ruccl_cpu_adapter;
  ruccl_device_t dev = Cpu();
  EXPECT_EQ(RUCCL_OK, a.check(dev));

  ruccl_device_uuid_t uuid;
  std::memset(&uuid, 0xff, sizeof uuid);
  ASSERT_EQ(RUCCL_OK, a.uuid(dev, &uuid));
  for (uint8_t b : uuid.bytes) EXPECT_EQ(0, b);

  void *stream = &uuid;
  ASSERT_EQ(RUCCL_OK, a.stream_create(dev, &stream));
  EXPECT_EQ(nullptr, stream);
  EXPECT_EQ(RUCCL_OK, a.stream_wait(dev, stream, 0));
  EXPECT_EQ(RUCCL_OK, a.stream_wait(dev, stream, 1)); /* a past deadline: nothing is ever pending */

  void *zero = nullptr, *buf = nullptr;
  ASSERT_EQ(RUCCL_OK, a.host_alloc(dev, 0, &zero));
  EXPECT_NE(nullptr, zero);
  ASSERT_EQ(RUCCL_OK, a.host_alloc(dev, 4096, &buf));
  ASSERT_NE(nullptr, buf);
  std::memset(buf, 0x5a, 4096); /* writable, all of it */
  a.host_free(dev, zero);

  /* copies of every kind, overlapping ones included (memmove) */
  unsigned char *p = static_cast<unsigned char *>(buf);
  for (int i = 0; i < 64; i++) p[i] = static_cast<unsigned char>(i);
  ASSERT_EQ(RUCCL_OK, a.copy(dev, stream, p + 100, p, 64, RUCCL_COPY_TO_HOST));
  ASSERT_EQ(RUCCL_OK, a.copy(dev, stream, p + 200, p + 100, 64, RUCCL_COPY_FROM_HOST));
  ASSERT_EQ(RUCCL_OK, a.copy(dev, stream, p + 8, p, 64, RUCCL_COPY_ON_DEVICE));
  ASSERT_EQ(RUCCL_OK, a.copy(dev, stream, p, p, 0, RUCCL_COPY_ON_DEVICE));
  for (int i = 0; i < 64; i++) {
    EXPECT_EQ(i, p[100 + i]);
    EXPECT_EQ(i, p[200 + i]);
    EXPECT_EQ(i, p[8 + i]);
  }
  a.stream_destroy(dev, stream);
  a.host_free(dev, buf);
}

TEST(DeviceCpuAdapter, ReduceIsTheReference) {
  const size_t count = 33;
  std::vector<ReduceCase> cases = AllReduceCases();
  for (size_t c = 0; c < cases.size(); c += 7) { /* a spread of the grid */
    const ReduceCase &k = cases[c];
    CaseRun run = RunCase(k, count, c, [](ruccl_device_reduce_t *r) { return ruccl_cpu_adapter.reduce(Cpu(), nullptr, r); });
    ASSERT_EQ(RUCCL_OK, run.rc) << CaseName(k);
    for (unsigned d = 0; d < k.ndst; d++)
      EXPECT_EQ("", ByteDiff(run.got[d], run.want[d], ElemSize(k.dt))) << CaseName(k) << ", destination " << d;
  }
}

/* ================================== a CUDA device where it cannot be used */

/* Whether cuda:0 is usable here (a CUDA build on a machine with a GPU). */
bool CudaUsable(std::string *why) {
#ifdef RUCCL_HAVE_CUDA
  ruccl_device_t d = {RUCCL_DEVICE_CUDA, 0};
  bool ok = ruccl_cuda_adapter.check(d) == RUCCL_OK;
  if (why) *why = ruccl_last_error();
  return ok;
#else
  if (why) *why = "this build has no CUDA adapter";
  return false;
#endif
}

/* A CUDA device this process cannot use: cuda:0 without a GPU, else one past them all. */
ruccl_device_t UnusableCuda() {
  ruccl_device_t d = {RUCCL_DEVICE_CUDA, CudaUsable(nullptr) ? 999 : 0};
  return d;
}

/* What refusing it returns: UNSUPPORTED without the adapter, DEVICE with it. */
ruccl_result_t RefusalCode() {
#ifdef RUCCL_HAVE_CUDA
  return RUCCL_ERR_DEVICE;
#else
  return RUCCL_ERR_UNSUPPORTED;
#endif
}

/* What the refusal's message must carry. */
std::string RefusalWords(ruccl_device_t d) {
#ifdef RUCCL_HAVE_CUDA
  return "cuda:" + std::to_string(d.index) + " is not usable: ";
#else
  (void)d;
  return "not supported by this build";
#endif
}

#ifdef RUCCL_HAVE_CUDA
TEST(DeviceCudaAdapter, CheckSaysWhyTheDeviceIsNotUsable) {
  ruccl_device_t d = UnusableCuda();
  ASSERT_EQ(RUCCL_ERR_DEVICE, ruccl_cuda_adapter.check(d));
  std::string msg = ruccl_last_error(), head = "RUCCL_ERR_DEVICE: " + RefusalWords(d);
  EXPECT_EQ(0u, msg.rfind(head, 0)) << msg;
  EXPECT_GT(msg.size(), head.size() + 5) << "no reason given: " << msg;
  ruccl_device_t negative = {RUCCL_DEVICE_CUDA, -1};
  EXPECT_EQ(RUCCL_ERR_DEVICE, ruccl_cuda_adapter.check(negative));
  EXPECT_NE(std::string::npos, std::string(ruccl_last_error()).find("cuda:-1 is not usable")) << ruccl_last_error();
}

/* Without a GPU every function of the adapter returns an error and crashes nothing. */
TEST(DeviceCudaAdapter, WithoutAGpuEveryFunctionFailsCleanly) {
  std::string why;
  if (CudaUsable(&why)) GTEST_SKIP() << "a CUDA device is present (test_cuda.cc covers it)";
  const ruccl_device_adapter_t &a = ruccl_cuda_adapter;
  ruccl_device_t d = {RUCCL_DEVICE_CUDA, 0};
  ruccl_device_uuid_t uuid;
  EXPECT_EQ(RUCCL_ERR_DEVICE, a.uuid(d, &uuid));
  EXPECT_NE(std::string::npos, std::string(ruccl_last_error()).find("cuda:0")) << ruccl_last_error();
  void *stream = &uuid, *host = &uuid;
  EXPECT_EQ(RUCCL_ERR_DEVICE, a.stream_create(d, &stream));
  EXPECT_EQ(nullptr, stream);
  EXPECT_EQ(RUCCL_ERR_DEVICE, a.stream_wait(d, nullptr, 0));
  EXPECT_EQ(RUCCL_ERR_DEVICE, a.host_alloc(d, 4096, &host));
  EXPECT_EQ(nullptr, host);
  unsigned char x[8] = {0}, y[8] = {0};
  EXPECT_EQ(RUCCL_ERR_DEVICE, a.copy(d, nullptr, x, y, sizeof x, RUCCL_COPY_TO_HOST));
  EXPECT_EQ(RUCCL_OK, a.copy(d, nullptr, x, y, 0, RUCCL_COPY_TO_HOST)); /* nothing to copy */
  ruccl_device_reduce_t r;
  std::memset(&r, 0, sizeof r);
  r.srcs[0] = x;
  r.dsts[0] = y;
  r.nsrc = r.ndst = 1;
  r.count = 8;
  r.dtype = RUCCL_UINT8;
  EXPECT_EQ(RUCCL_ERR_DEVICE, a.reduce(d, nullptr, &r));
  r.nsrc = 0;
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, a.reduce(d, nullptr, &r));
  r.nsrc = 1;
  r.ndst = RUCCL_DEVICE_REDUCE_MAX + 1;
  EXPECT_EQ(RUCCL_ERR_INVALID_ARGUMENT, a.reduce(d, nullptr, &r));
  a.stream_destroy(d, nullptr);
  a.host_free(d, nullptr);
}
#endif

TEST(DeviceRefusal, RegisterOnAnUnusableCudaDevice) {
  ruccl_config_t cfg = MakeConfig(1);
  ruccl_device_t d = UnusableCuda();
  ruccl_comm_t *comm = nullptr;
  EXPECT_EQ(RefusalCode(), ruccl_register(0, d, &cfg, &comm));
  EXPECT_EQ(nullptr, comm);
  std::string msg = ruccl_last_error();
  EXPECT_NE(std::string::npos, msg.find(RefusalWords(d))) << msg;
#ifndef RUCCL_HAVE_CUDA
  EXPECT_NE(std::string::npos, msg.find("RUCCL_CUDA")) << msg; /* says how to get it */
#endif
  if (comm) ruccl_finish(comm);
  /* the refusal left nothing behind: the same id registers on the CPU */
  ASSERT_EQ(RUCCL_OK, ruccl_register(0, Cpu(), &cfg, &comm));
  EXPECT_EQ(RUCCL_OK, ruccl_finish(comm));
}

/* One peer's tensor on a CUDA device it cannot use: every peer gets the same error,
   which names that peer and (in a CUDA build) CUDA's reason; then the communicator
   still works. */
TEST(DeviceRefusal, CollectiveWithAnUnusableCudaTensorFailsOnEveryPeer) {
  const std::vector<uint32_t> ids = ScatteredIds(3);
  const ruccl_device_t d = UnusableCuda();
  const size_t count = 11;
  std::vector<std::vector<Outcome>> seen(ids.size(), std::vector<Outcome>(2));
  Problems probs(ids.size());
  RunResult r = RunPeers(ids, MakeConfig(3), [&](ruccl_comm_t *comm, size_t i) {
    for (size_t step = 0; step < 2; step++) {
      Bytes in = FillInput(RUCCL_FLOAT32, RUCCL_SUM, ids[i], count), out = Sentinel(RUCCL_FLOAT32, count);
      ruccl_tensor_t tin = Vec(in, RUCCL_FLOAT32, count), tout = Vec(out, RUCCL_FLOAT32, count);
      if (step == 0 && i == 1) tin.device = d;  /* a CUDA input on thread 1 */
      if (step == 1 && i == 2) tout.device = d; /* then a CUDA output on thread 2 */
      seen[i][step].rc = ruccl_all_reduce(comm, &tin, &tout, RUCCL_SUM);
      seen[i][step].last_error = ruccl_last_error();
      if (!IsSentinel(out)) probs.Note(i, "step " + std::to_string(step) + ": output written");
    }
    std::string p = CheckedAllReduce(comm, ids, ids[i]);
    if (!p.empty()) probs.Note(i, "afterwards: " + p);
  });
  ASSERT_TRUE(AllOk(r));
  EXPECT_TRUE(probs.None());
  for (size_t step = 0; step < 2; step++) {
    std::string culprit = "peer " + std::to_string(ids[step + 1]) + ": " + (step ? "output" : "input");
    for (size_t i = 0; i < ids.size(); i++) {
      const Outcome &o = seen[i][step];
      EXPECT_EQ(RefusalCode(), o.rc) << "step " << step << ", peer " << ids[i] << ": " << o.last_error;
      EXPECT_NE(std::string::npos, o.last_error.find(culprit)) << o.last_error;
#ifdef RUCCL_HAVE_CUDA
      EXPECT_NE(std::string::npos, o.last_error.find(RefusalWords(d))) << o.last_error;
#endif
      EXPECT_EQ(seen[0][step].last_error, o.last_error) << "the peers' messages differ";
    }
  }
}

/* ================================================== the example program */

#ifdef RUCCL_EXAMPLE_ALL_REDUCE_BIN
/* The example as a child process; its stdout and stderr together (RUCCL_EXAMPLE_DEVICE
   is not passed on: the arguments say which device). */
struct ExampleRun {
  int status = -1;
  std::string output;
};

ExampleRun RunExample(const std::vector<std::string> &args) {
  std::vector<std::string> all = {RUCCL_EXAMPLE_ALL_REDUCE_BIN};
  all.insert(all.end(), args.begin(), args.end());
  ChildRun c = RunProgram(all, {"RUCCL_EXAMPLE_DEVICE="});
  return {c.status, c.out + c.err};
}

TEST(DeviceExample, CudaRunsOnAGpuAndIsRefusedClearlyElsewhere) {
  std::string why;
  bool gpu = CudaUsable(&why);
  ExampleRun run = RunExample({"--device", "cuda"});
  if (gpu) {
    EXPECT_EQ(0, run.status) << run.output;
    EXPECT_NE(std::string::npos, run.output.find("on cuda:0: sum, mean")) << run.output;
    return;
  }
  EXPECT_GT(run.status, 0) << "want a clean non-zero exit:\n" << run.output;
  EXPECT_NE(std::string::npos, run.output.find(std::string("register failed: ") + TestResultName(RefusalCode())))
      << run.output;
  EXPECT_NE(std::string::npos, run.output.find(RefusalWords({RUCCL_DEVICE_CUDA, 0}))) << run.output;
  EXPECT_NE(std::string::npos, run.output.find("all_reduce: FAILED on cuda:0")) << run.output;
}

TEST(DeviceExample, CpuByFlagAndBadArguments) {
  ExampleRun cpu = RunExample({"--device", "cpu"});
  EXPECT_EQ(0, cpu.status) << cpu.output;
  EXPECT_NE(std::string::npos, cpu.output.find("on cpu: sum, mean")) << cpu.output;
  ExampleRun bad = RunExample({"--device", "tpu"});
  EXPECT_EQ(2, bad.status) << bad.output;
  EXPECT_NE(std::string::npos, bad.output.find("usage")) << bad.output;
}
#endif

}  // namespace
