/* cuda_reduce_bench.cu — the same-device reduction kernels alone, timed with CUDA
 * events next to a device-to-device copy of the same run:
 *
 *   ruccl-cuda-reduce-bench [MiB per buffer (256)] [ranks (4)] [iterations (50)]
 *
 * One reduction is what the same-device path runs for an all-reduce of R ranks: R
 * float32 sources summed into R destinations (out of place).  It moves 2 R S bytes
 * (each source read once, each destination written once): "moved" is that over the
 * median time, next to the copy's read + write rate; "busbw" is the all-reduce's bus
 * bandwidth at that time (2 (R-1)/R S / t), next to the copy rate (S / t of a copy).
 * Every variant's output is checked against the element kernel's, bit for bit, on
 * random inputs.  This file includes cuda_kernels.cu, so that the kernels are the
 * library's own, launched here with chosen grids. */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../csrc/device/cuda_kernels.cu"

#define CHECK(call)                                                                         \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

__global__ void fill_random(float *p, size_t n, unsigned seed) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned x = (unsigned)i * 2654435761u ^ seed * 40503u;
    x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
    p[i] = (float)(x & 0xffffff) / 16777216.0f - 0.5f;
  }
}

using Conv = Plain<float, float>;

int main(int argc, char **argv) {
  const size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256;
  const unsigned ranks = argc > 2 ? (unsigned)std::strtoul(argv[2], nullptr, 10) : 4;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 50;
  const size_t bytes = mib << 20, count = bytes / sizeof(float);
  if (ranks < 1 || ranks > RUCCL_DEVICE_REDUCE_MAX || count == 0 || iters < 1) {
    std::fprintf(stderr, "usage: %s [MiB per buffer] [ranks 1..%d] [iterations]\n", argv[0], RUCCL_DEVICE_REDUCE_MAX);
    return 2;
  }
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));

  ruccl_device_reduce_t r;
  std::memset(&r, 0, sizeof r);
  r.nsrc = r.ndst = ranks;
  r.count = count;
  r.dtype = RUCCL_FLOAT32;
  r.op = RUCCL_SUM;
  for (unsigned k = 0; k < ranks; k++) {
    void *p = nullptr;
    CHECK(cudaMalloc(&p, bytes));
    fill_random<<<sms * 4, 256>>>((float *)p, count, k + 1);
    r.srcs[k] = p;
    CHECK(cudaMalloc(&r.dsts[k], bytes));
  }
  void *want = nullptr;
  CHECK(cudaMalloc(&want, bytes));
  CHECK(cudaGetLastError());

  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  /* the median of iters runs of launch(), after 3 warm-ups */
  auto time_ms = [&](auto launch) {
    for (int i = 0; i < 3; i++) launch();
    std::vector<float> t;
    for (int i = 0; i < iters; i++) {
      CHECK(cudaEventRecord(a));
      launch();
      CHECK(cudaEventRecord(b));
      CHECK(cudaEventSynchronize(b));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms);
    }
    CHECK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };

  const double copy_ms = time_ms([&] { CHECK(cudaMemcpyAsync(r.dsts[0], r.srcs[0], bytes, cudaMemcpyDeviceToDevice)); });
  const double copy_rate = bytes / copy_ms / 1e6; /* GB/s copied; read + write is twice */
  std::printf("# %s, %d SMs; %u ranks x %zu MiB float32 SUM; median of %d\n", prop.name, sms, ranks, mib, iters);
  std::printf("# device-to-device copy: %.3f ms, %.1f GB/s (read + write %.1f)\n", copy_ms, copy_rate, 2 * copy_rate);
  /* 2 R S bytes at the copy's read + write rate: the least time a reduction can take */
  const double floor_ms = 2.0 * ranks * bytes / (2 * copy_rate * 1e6);
  const double floor_busbw = 2.0 * (ranks - 1) / ranks * bytes / floor_ms / 1e6;
  std::printf("# floor at the copy's read + write rate: %.3f ms, busbw %.1f GB/s (%.0f%% of the copy rate)\n", floor_ms,
              floor_busbw, 100 * floor_busbw / copy_rate);
  std::printf("%-34s %9s %12s %12s %8s %6s\n", "kernel", "ms", "moved GB/s", "busbw GB/s", "of copy", "exact");

  /* the reference: the element kernel at the library's grid */
  const unsigned cap = (unsigned)sms * 8;
  ruccl_device_reduce_t ref = r;
  for (unsigned d = 0; d < ranks; d++) ref.dsts[d] = want;
  ref.ndst = 1;
  reduce_kernel<float, float, Conv><<<cap, kThreads>>>(ref, RUCCL_SUM);
  CHECK(cudaDeviceSynchronize());
  std::vector<float> host_want(count), host_got(count);
  CHECK(cudaMemcpy(host_want.data(), want, bytes, cudaMemcpyDeviceToHost));

  int bad = 0;
  auto report = [&](const char *name, double ms) {
    bool exact = true;
    for (unsigned d = 0; d < ranks; d++) {
      CHECK(cudaMemcpy(host_got.data(), r.dsts[d], bytes, cudaMemcpyDeviceToHost));
      exact = exact && std::memcmp(host_got.data(), host_want.data(), bytes) == 0;
      CHECK(cudaMemset(r.dsts[d], 0xff, bytes)); /* poison for the next variant */
    }
    bad += !exact;
    const double busbw = 2.0 * (ranks - 1) / ranks * bytes / ms / 1e6;
    std::printf("%-34s %9.3f %12.1f %12.1f %7.0f%% %6s\n", name, ms, 2.0 * ranks * bytes / ms / 1e6, busbw,
                100 * busbw / copy_rate, exact ? "yes" : "NO");
  };
  const size_t packs = count / 4;
  for (unsigned mult : {4u, 8u, 16u, 32u}) {
    char name[64];
    unsigned blocks = (unsigned)std::min<size_t>((count + kThreads - 1) / kThreads, (size_t)sms * mult);
    std::snprintf(name, sizeof name, "element, %u blocks/SM%s", mult, mult == 8 ? " (ruccl)" : "");
    report(name, time_ms([&] { reduce_kernel<float, float, Conv><<<blocks, kThreads>>>(r, RUCCL_SUM); }));
    blocks = (unsigned)std::min<size_t>((packs + kThreads - 1) / kThreads, (size_t)sms * mult);
    std::snprintf(name, sizeof name, "16-byte packs, %u blocks/SM%s", mult, mult == 8 ? " (ruccl)" : "");
    report(name, time_ms([&] { reduce_packed_kernel<float, float, Conv><<<blocks, kThreads>>>(r, RUCCL_SUM); }));
  }
  report("ruccl_cuda_reduce_launch", time_ms([&] {
           if (ruccl_cuda_reduce_launch(&r, nullptr) != RUCCL_OK) std::exit(1);
         }));
  std::printf("%s\n", bad ? "# some variant's output differs from the element kernel's" : "# every variant exact");
  return bad ? 1 : 0;
}
