/* test_util.h — what the GoogleTest suite of the C core shares: readable result
   names, float16/bfloat16 conversion written independently of the library, typed
   element access, the deterministic test data and its expected reductions, a runner
   that plays N peers as N threads, and a watchdog so that a hanging implementation
   fails one test instead of stalling the whole suite.
 *
 * Peers are threads: each registers with its own peer id and the same configuration,
 * runs its part, and finishes.  Threads only record what they saw (into their own
 * slot of a vector); the main thread asserts after joining them. */
#ifndef RUCCL_TEST_UTIL_H
#define RUCCL_TEST_UTIL_H

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <fstream>
#include <iterator>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "ruccl.h"

/* gtest finds these by argument-dependent lookup (the enums live in the global
   namespace), so EXPECT_EQ prints RUCCL_ERR_TIMEOUT rather than 13. */
inline const char *TestResultName(ruccl_result_t r) {
  static const char *const names[] = {
      "RUCCL_OK",
      "RUCCL_ERR_INVALID_ARGUMENT",
      "RUCCL_ERR_INVALID_CONFIG",
      "RUCCL_ERR_DUPLICATE_REGISTRATION",
      "RUCCL_ERR_NOT_REGISTERED",
      "RUCCL_ERR_CONFIG_MISMATCH",
      "RUCCL_ERR_SHAPE_MISMATCH",
      "RUCCL_ERR_DTYPE_MISMATCH",
      "RUCCL_ERR_OP_MISMATCH",
      "RUCCL_ERR_ROOT_MISMATCH",
      "RUCCL_ERR_BROADCAST_SENDERS",
      "RUCCL_ERR_PEER_LOST",
      "RUCCL_ERR_PEER_FINISHED",
      "RUCCL_ERR_TIMEOUT",
      "RUCCL_ERR_RESET",
      "RUCCL_ERR_AUTH",
      "RUCCL_ERR_PROTOCOL",
      "RUCCL_ERR_IO",
      "RUCCL_ERR_DEVICE",
      "RUCCL_ERR_NO_MEMORY",
      "RUCCL_ERR_UNSUPPORTED",
      "RUCCL_ERR_ABORTED",
      "RUCCL_ERR_REVOKED",
  };
  unsigned u = static_cast<unsigned>(r);
  return u < sizeof names / sizeof names[0] ? names[u] : nullptr;
}
inline constexpr unsigned kKnownResultNames = 23;

inline void PrintTo(ruccl_result_t r, std::ostream *os) {
  const char *n = TestResultName(r);
  if (n)
    *os << n;
  else
    *os << "ruccl_result_t(" << static_cast<int>(r) << ")";
}

extern char **environ;

namespace rt {

/* ------------------------------------------------------------------ names */

inline const char *DtypeName(ruccl_dtype_t dt) {
  switch (dt) {
    case RUCCL_FLOAT32: return "Float32";
    case RUCCL_FLOAT64: return "Float64";
    case RUCCL_FLOAT16: return "Float16";
    case RUCCL_BFLOAT16: return "BFloat16";
    case RUCCL_INT8: return "Int8";
    case RUCCL_UINT8: return "UInt8";
    case RUCCL_INT32: return "Int32";
    case RUCCL_INT64: return "Int64";
  }
  return "UnknownDtype";
}

inline const char *OpName(ruccl_reduce_op_t op) {
  switch (op) {
    case RUCCL_SUM: return "Sum";
    case RUCCL_MEAN: return "Mean";
    case RUCCL_MIN: return "Min";
    case RUCCL_MAX: return "Max";
    case RUCCL_PROD: return "Prod";
  }
  return "UnknownOp";
}

inline const std::vector<ruccl_dtype_t> &AllDtypes() {
  static const std::vector<ruccl_dtype_t> v = {RUCCL_FLOAT32, RUCCL_FLOAT64, RUCCL_FLOAT16, RUCCL_BFLOAT16,
                                               RUCCL_INT8,    RUCCL_UINT8,   RUCCL_INT32,   RUCCL_INT64};
  return v;
}

inline const std::vector<ruccl_reduce_op_t> &AllOps() {
  static const std::vector<ruccl_reduce_op_t> v = {RUCCL_SUM, RUCCL_MEAN, RUCCL_MIN, RUCCL_MAX, RUCCL_PROD};
  return v;
}

/* ------------------------------------------------------------- strategies */

struct Strat {
  ruccl_strategy_kind_t kind;
  unsigned arity;
  const char *name;
  ruccl_strategy_t value() const {
    ruccl_strategy_t s;
    s.kind = kind;
    s.arity = arity;
    return s;
  }
};

inline std::ostream &operator<<(std::ostream &os, const Strat &s) { return os << s.name; }

inline Strat Centralized() { return {RUCCL_STRATEGY_CENTRALIZED, 2, "Centralized"}; }
inline Strat Tree(unsigned arity) {
  static const char *const names[] = {"Tree0", "Tree1", "Tree2", "Tree3", "Tree4"};
  return {RUCCL_STRATEGY_TREE, arity, arity < 5 ? names[arity] : "TreeN"};
}
inline Strat Ring() { return {RUCCL_STRATEGY_RING, 2, "Ring"}; }
inline Strat Auto() { return {RUCCL_STRATEGY_AUTO, 2, "Auto"}; }

/* Every local strategy the suite runs the collectives under. */
inline std::vector<Strat> AllStrategies() { return {Centralized(), Tree(1), Tree(2), Tree(3), Ring(), Auto()}; }

/* ------------------------------------------------------------ half types */

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/* IEEE binary16, round to nearest even; written from the definition, not copied
   from the library, so that the two check each other. */
inline uint16_t FloatToHalf(float f) {
  uint32_t x = FloatBits(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u));
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u); /* rounds to >= 65520 */
  if (x < 0x38800000u) {                                               /* below 2^-14: subnormal */
    /* a subnormal half is m * 2^-24; scaling by 2^24 is exact, nearbyint rounds to even */
    float scaled = BitsFloat(x) * 16777216.0f;
    uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m); /* m == 0x400 is the smallest normal: same encoding */
  }
  uint32_t exp = (x >> 23) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry runs into the exponent, as it should */
  return static_cast<uint16_t>(sign | h);
}

inline float HalfToFloat(uint16_t h) {
  uint32_t sign = h & 0x8000u;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  float v;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31)
    v = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else
    v = std::ldexp(static_cast<float>(1024u + mant), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

inline uint16_t FloatToBf16(float f) {
  uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

/* --------------------------------------------------------- typed elements */

using Bytes = std::vector<unsigned char>;

inline size_t ElemSize(ruccl_dtype_t dt) {
  switch (dt) {
    case RUCCL_FLOAT32: return 4;
    case RUCCL_FLOAT64: return 8;
    case RUCCL_FLOAT16: return 2;
    case RUCCL_BFLOAT16: return 2;
    case RUCCL_INT8: return 1;
    case RUCCL_UINT8: return 1;
    case RUCCL_INT32: return 4;
    case RUCCL_INT64: return 8;
  }
  return 0;
}

inline bool IsFloat(ruccl_dtype_t dt) {
  return dt == RUCCL_FLOAT32 || dt == RUCCL_FLOAT64 || dt == RUCCL_FLOAT16 || dt == RUCCL_BFLOAT16;
}

template <typename T>
inline void PutRaw(void *base, size_t i, T v) {
  std::memcpy(static_cast<unsigned char *>(base) + i * sizeof(T), &v, sizeof(T));
}
template <typename T>
inline T GetRaw(const void *base, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const unsigned char *>(base) + i * sizeof(T), sizeof(T));
  return v;
}

/* Stores v (already representable, or rounded the way the dtype rounds). */
inline void StoreFloat(ruccl_dtype_t dt, void *base, size_t i, double v) {
  switch (dt) {
    case RUCCL_FLOAT32: PutRaw<float>(base, i, static_cast<float>(v)); break;
    case RUCCL_FLOAT64: PutRaw<double>(base, i, v); break;
    case RUCCL_FLOAT16: PutRaw<uint16_t>(base, i, FloatToHalf(static_cast<float>(v))); break;
    case RUCCL_BFLOAT16: PutRaw<uint16_t>(base, i, FloatToBf16(static_cast<float>(v))); break;
    case RUCCL_INT8: PutRaw<int8_t>(base, i, static_cast<int8_t>(v)); break;
    case RUCCL_UINT8: PutRaw<uint8_t>(base, i, static_cast<uint8_t>(v)); break;
    case RUCCL_INT32: PutRaw<int32_t>(base, i, static_cast<int32_t>(v)); break;
    case RUCCL_INT64: PutRaw<int64_t>(base, i, static_cast<int64_t>(v)); break;
  }
}

inline void StoreInt(ruccl_dtype_t dt, void *base, size_t i, int64_t v) {
  switch (dt) {
    case RUCCL_INT8: PutRaw<int8_t>(base, i, static_cast<int8_t>(v)); break;
    case RUCCL_UINT8: PutRaw<uint8_t>(base, i, static_cast<uint8_t>(v)); break;
    case RUCCL_INT32: PutRaw<int32_t>(base, i, static_cast<int32_t>(v)); break;
    case RUCCL_INT64: PutRaw<int64_t>(base, i, v); break;
    default: StoreFloat(dt, base, i, static_cast<double>(v)); break;
  }
}

inline double LoadDouble(ruccl_dtype_t dt, const void *base, size_t i) {
  switch (dt) {
    case RUCCL_FLOAT32: return GetRaw<float>(base, i);
    case RUCCL_FLOAT64: return GetRaw<double>(base, i);
    case RUCCL_FLOAT16: return HalfToFloat(GetRaw<uint16_t>(base, i));
    case RUCCL_BFLOAT16: return Bf16ToFloat(GetRaw<uint16_t>(base, i));
    case RUCCL_INT8: return GetRaw<int8_t>(base, i);
    case RUCCL_UINT8: return GetRaw<uint8_t>(base, i);
    case RUCCL_INT32: return GetRaw<int32_t>(base, i);
    case RUCCL_INT64: return static_cast<double>(GetRaw<int64_t>(base, i));
  }
  return 0;
}

/* "" when equal byte for byte, else where and how they differ. */
inline std::string CompareElems(ruccl_dtype_t dt, const void *got, const void *want, size_t count) {
  size_t es = ElemSize(dt);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < count; i++) {
    if (std::memcmp(static_cast<const unsigned char *>(got) + i * es,
                    static_cast<const unsigned char *>(want) + i * es, es) != 0) {
      if (bad == 0) first = i;
      bad++;
    }
  }
  if (bad == 0) return "";
  std::ostringstream os;
  os.precision(17);
  os << bad << " of " << count << " " << DtypeName(dt) << " elements differ; first at [" << first
     << "]: got " << LoadDouble(dt, got, first) << ", want " << LoadDouble(dt, want, first);
  return os.str();
}
inline std::string CompareElems(ruccl_dtype_t dt, const Bytes &got, const Bytes &want) {
  if (got.size() != want.size()) return "buffer sizes differ";
  return CompareElems(dt, got.data(), want.data(), got.size() / std::max<size_t>(1, ElemSize(dt)));
}

/* "" when got and want are the same bytes, else the first differing element (of
   es bytes) in hex — for collectives that must move bits without interpreting them. */
inline std::string ByteDiff(const Bytes &got, const Bytes &want, size_t es) {
  if (got.size() != want.size())
    return "size " + std::to_string(got.size()) + " bytes, want " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); i++) {
    if (got[i] == want[i]) continue;
    size_t e = i / es;
    size_t bad = 0;
    for (size_t k = 0; k < got.size() / es; k++)
      if (std::memcmp(&got[k * es], &want[k * es], es) != 0) bad++;
    char buf[64];
    std::string g, w;
    for (size_t b = 0; b < es; b++) {
      std::snprintf(buf, sizeof buf, "%02x", got[e * es + es - 1 - b]);
      g += buf;
      std::snprintf(buf, sizeof buf, "%02x", want[e * es + es - 1 - b]);
      w += buf;
    }
    return std::to_string(bad) + " element(s) differ; first [" + std::to_string(e) + "]: got 0x" + g + ", want 0x" + w;
  }
  return "";
}

/* --------------------------------------------------------------- tensors */

inline ruccl_device_t Cpu() {
  ruccl_device_t d;
  d.kind = RUCCL_DEVICE_CPU;
  d.index = 0;
  return d;
}

inline ruccl_tensor_t Tensor(void *data, ruccl_dtype_t dt, std::initializer_list<int64_t> shape) {
  ruccl_tensor_t t;
  std::memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dt;
  t.ndim = static_cast<int>(shape.size());
  int k = 0;
  for (int64_t s : shape) t.shape[k++] = s;
  t.device = Cpu();
  return t;
}

/* A 1-d tensor of `count` elements over buf. */
inline ruccl_tensor_t Vec(Bytes &buf, ruccl_dtype_t dt, size_t count) {
  return Tensor(buf.empty() ? nullptr : buf.data(), dt, {static_cast<int64_t>(count)});
}

inline constexpr unsigned char kSentinel = 0xA5;
inline Bytes Sentinel(ruccl_dtype_t dt, size_t count) { return Bytes(count * ElemSize(dt), kSentinel); }
inline bool IsSentinel(const Bytes &b) {
  return std::all_of(b.begin(), b.end(), [](unsigned char c) { return c == kSentinel; });
}

/* ------------------------------------------------------------ test data */

/* Integer-valued data, small enough that every reduction over up to 6 peers is exact
   in every dtype (int8 sums stay within ±60, products within ±64, half types hold
   them exactly).  PROD uses ±1/±2 ({1,2} for uint8); the others use [-10, 10]
   ([0, 20] for uint8), scaled up for the wide types so that their high bits count. */
inline int64_t TestValue(ruccl_dtype_t dt, ruccl_reduce_op_t op, uint32_t peer_id, size_t i, uint64_t salt = 0) {
  uint64_t h = static_cast<uint64_t>(i) * 7u + static_cast<uint64_t>(peer_id) * 13u + salt * 31u + 3u;
  if (op == RUCCL_PROD) {
    static const int64_t pm[4] = {1, -1, 2, -2};
    if (dt == RUCCL_UINT8) return 1 + static_cast<int64_t>(h % 2);
    return pm[h % 4];
  }
  int64_t v = static_cast<int64_t>(h % 21);
  if (dt != RUCCL_UINT8) v -= 10;
  switch (dt) {
    case RUCCL_INT32: return v * 100003;
    case RUCCL_INT64: return v * 1000000007000LL;
    case RUCCL_FLOAT64: return v * 1000000000LL;
    default: return v;
  }
}

inline Bytes FillInput(ruccl_dtype_t dt, ruccl_reduce_op_t op, uint32_t peer_id, size_t count, uint64_t salt = 0) {
  Bytes b(count * ElemSize(dt));
  for (size_t i = 0; i < count; i++) StoreInt(dt, b.data(), i, TestValue(dt, op, peer_id, i, salt));
  return b;
}

/* The reduction of element i over the peers, stored at out[out_index]: exact
   integer arithmetic, then MEAN the way the header defines it (integers truncate
   toward zero; half types divide in float32 and round once; float32 divides in
   float32; float64 in float64). */
inline void StoreExpected(ruccl_dtype_t dt, ruccl_reduce_op_t op, const std::vector<uint32_t> &ids, size_t i,
                          uint64_t salt, void *out, size_t out_index) {
  int64_t acc = TestValue(dt, op, ids[0], i, salt);
  for (size_t p = 1; p < ids.size(); p++) {
    int64_t v = TestValue(dt, op, ids[p], i, salt);
    switch (op) {
      case RUCCL_SUM:
      case RUCCL_MEAN: acc += v; break;
      case RUCCL_MIN: acc = std::min(acc, v); break;
      case RUCCL_MAX: acc = std::max(acc, v); break;
      case RUCCL_PROD: acc *= v; break;
    }
  }
  if (op != RUCCL_MEAN) {
    StoreInt(dt, out, out_index, acc);
    return;
  }
  int64_t n = static_cast<int64_t>(ids.size());
  if (!IsFloat(dt))
    StoreInt(dt, out, out_index, acc / n);
  else if (dt == RUCCL_FLOAT64)
    StoreFloat(dt, out, out_index, static_cast<double>(acc) / static_cast<double>(n));
  else
    StoreFloat(dt, out, out_index, static_cast<double>(static_cast<float>(acc) / static_cast<float>(n)));
}

/* The expected all-reduce of FillInput(dt, op, id, count, salt) over ids. */
inline Bytes ExpectedReduce(ruccl_dtype_t dt, ruccl_reduce_op_t op, const std::vector<uint32_t> &ids, size_t count,
                            uint64_t salt = 0) {
  Bytes b(count * ElemSize(dt));
  for (size_t i = 0; i < count; i++) StoreExpected(dt, op, ids, i, salt, b.data(), i);
  return b;
}

/* Arbitrary bytes (for float types: any bit pattern, NaNs included), for the
   collectives that must move data without interpreting it. */
inline Bytes RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  Bytes b(n);
  for (auto &c : b) c = static_cast<unsigned char>(rng() >> 56);
  return b;
}

/* Random bits for count elements of dt, except that no float element is a NaN
   (infinities, -0 and subnormals stay): the data of the broadcast / all-gather
   grids.  NaN payloads get tests of their own (BitExact.*), so that one quirk
   there does not hide everything else. */
inline Bytes RandomPayload(ruccl_dtype_t dt, size_t count, uint64_t seed) {
  const size_t es = ElemSize(dt);
  Bytes b = RandomBytes(count * es, seed);
  for (size_t i = 0; i < count; i++) {
    unsigned char *e = &b[i * es];
    switch (dt) {
      case RUCCL_FLOAT16: {
        uint16_t v = GetRaw<uint16_t>(e, 0);
        if ((v & 0x7c00u) == 0x7c00u && (v & 0x3ffu)) PutRaw<uint16_t>(e, 0, static_cast<uint16_t>(v & ~0x4000u));
        break;
      }
      case RUCCL_BFLOAT16: {
        uint16_t v = GetRaw<uint16_t>(e, 0);
        if ((v & 0x7f80u) == 0x7f80u && (v & 0x7fu)) PutRaw<uint16_t>(e, 0, static_cast<uint16_t>(v & ~0x4000u));
        break;
      }
      case RUCCL_FLOAT32: {
        uint32_t v = GetRaw<uint32_t>(e, 0);
        if ((v & 0x7f800000u) == 0x7f800000u && (v & 0x7fffffu)) PutRaw<uint32_t>(e, 0, v & ~0x40000000u);
        break;
      }
      case RUCCL_FLOAT64: {
        uint64_t v = GetRaw<uint64_t>(e, 0);
        const uint64_t exp = 0x7ff0000000000000ull;
        if ((v & exp) == exp && (v & 0xfffffffffffffull)) PutRaw<uint64_t>(e, 0, v & ~0x4000000000000000ull);
        break;
      }
      default: break;
    }
  }
  return b;
}

/* --------------------------------------------------------------- peers */

/* Peer ids for n peers: not contiguous, and not listed in ascending order, so
   that thread order, id order and rank order all differ. */
inline std::vector<uint32_t> ScatteredIds(size_t n) {
  static const uint32_t pool[] = {5, 2, 9, 0, 14, 7, 3, 11, 30, 21, 1, 40};
  std::vector<uint32_t> v(pool, pool + std::min(n, sizeof pool / sizeof pool[0]));
  for (size_t k = v.size(); k < n; k++) v.push_back(static_cast<uint32_t>(100 + k));
  return v;
}

inline std::vector<uint32_t> SortedIds(std::vector<uint32_t> ids) {
  std::sort(ids.begin(), ids.end());
  return ids;
}

/* Position of ids[i] in peer order (ascending id). */
inline unsigned RankOf(const std::vector<uint32_t> &ids, size_t i) {
  unsigned r = 0;
  for (uint32_t id : ids)
    if (id < ids[i]) r++;
  return r;
}

/* Thread index of the peer with rank r. */
inline size_t ThreadOfRank(const std::vector<uint32_t> &ids, unsigned r) {
  for (size_t i = 0; i < ids.size(); i++)
    if (RankOf(ids, i) == r) return i;
  return 0;
}

/* A group name no other test uses: a counter and the current test's name. */
inline std::string UniqueGroupName(const char *tag = "") {
  static std::atomic<unsigned> counter{0};
  std::string name = "g" + std::to_string(counter.fetch_add(1)) + "_";
  const ::testing::TestInfo *info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = info ? std::string(info->test_suite_name()) + "_" + info->name() : "none";
  test += tag;
  for (char c : test) name += (std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  if (name.size() > RUCCL_MAX_GROUP_NAME - 1) name.resize(RUCCL_MAX_GROUP_NAME - 1);
  return name;
}

inline constexpr int64_t kTimeoutMs = 5000;

#define RT_CHECK_OK(expr)                                                                          \
  do {                                                                                             \
    ruccl_result_t rt_rc_ = (expr);                                                                \
    if (rt_rc_ != RUCCL_OK) ADD_FAILURE() << #expr << " returned " << ::testing::PrintToString(rt_rc_); \
  } while (0)

/* A configuration for n local peers under strategy s, a short timeout and a group
   name of its own. */
inline ruccl_config_t MakeConfig(unsigned n, Strat s = Auto(), int64_t timeout_ms = kTimeoutMs,
                                 const std::string &group = "") {
  ruccl_config_t cfg = ruccl_config_default();
  RT_CHECK_OK(ruccl_config_set_num_devices(&cfg, n));
  RT_CHECK_OK(ruccl_config_set_local_strategy(&cfg, s.value()));
  RT_CHECK_OK(ruccl_config_set_timeout_ms(&cfg, timeout_ms));
  RT_CHECK_OK(ruccl_config_set_group_name(&cfg, group.empty() ? UniqueGroupName().c_str() : group.c_str()));
  return cfg;
}

struct RunResult {
  std::vector<ruccl_result_t> reg; /* ruccl_register, by thread */
  std::vector<std::string> reg_detail;
  std::vector<ruccl_result_t> fin; /* ruccl_finish, by thread (RUCCL_OK when not called) */
};

using PeerFn = std::function<void(ruccl_comm_t *comm, size_t thread_index)>;

/* One thread per id: register (with cfg), run fn(comm, thread index), then
   ruccl_finish unless `finish` is false (fn then owns the handle).  fn runs only on
   a successful registration.  Joins every thread before returning. */
inline RunResult RunPeers(const std::vector<uint32_t> &ids, const ruccl_config_t &cfg, const PeerFn &fn,
                          bool finish = true) {
  size_t n = ids.size();
  RunResult r;
  r.reg.assign(n, RUCCL_NUM_RESULTS);
  r.reg_detail.assign(n, "");
  r.fin.assign(n, RUCCL_OK);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; i++) {
    threads.emplace_back([&, i] {
      ruccl_comm_t *comm = nullptr;
      ruccl_result_t rc = ruccl_register(ids[i], Cpu(), &cfg, &comm);
      r.reg[i] = rc;
      if (rc != RUCCL_OK) {
        r.reg_detail[i] = ruccl_last_error() ? ruccl_last_error() : "(null)";
        return;
      }
      if (fn) fn(comm, i);
      if (finish) r.fin[i] = ruccl_finish(comm);
    });
  }
  for (auto &t : threads) t.join();
  return r;
}

/* Every peer registered and finished cleanly. */
inline ::testing::AssertionResult AllOk(const RunResult &r) {
  for (size_t i = 0; i < r.reg.size(); i++) {
    if (r.reg[i] != RUCCL_OK)
      return ::testing::AssertionFailure() << "thread " << i << ": ruccl_register returned "
                                           << ::testing::PrintToString(r.reg[i]) << " (" << r.reg_detail[i] << ")";
    if (r.fin[i] != RUCCL_OK)
      return ::testing::AssertionFailure() << "thread " << i << ": ruccl_finish returned "
                                           << ::testing::PrintToString(r.fin[i]);
  }
  return ::testing::AssertionSuccess();
}

/* What one peer saw in one step, for the main thread to judge. */
struct Outcome {
  ruccl_result_t rc = RUCCL_NUM_RESULTS;
  std::string problem; /* "" = as expected */
  std::string last_error;
};

/* Per thread, the first problem recorded (threads write only their own slot). */
struct Problems {
  explicit Problems(size_t n) : first(n) {}
  std::vector<std::string> first;
  void Note(size_t thread, const std::string &what) {
    if (first[thread].empty()) first[thread] = what;
  }
  bool Any(size_t thread) const { return !first[thread].empty(); }
  ::testing::AssertionResult None() const {
    for (size_t i = 0; i < first.size(); i++)
      if (!first[i].empty()) return ::testing::AssertionFailure() << "thread " << i << ": " << first[i];
    return ::testing::AssertionSuccess();
  }
};

inline std::string RcStr(ruccl_result_t rc) { return ::testing::PrintToString(rc); }

inline int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

/* Polls pred every millisecond until it holds or timeout_ms pass; returns pred(). */
inline bool WaitFor(const std::function<bool()> &pred, int64_t timeout_ms = kTimeoutMs) {
  int64_t end = NowMs() + timeout_ms;
  while (!pred()) {
    if (NowMs() > end) return pred();
    SleepMs(1);
  }
  return true;
}

/* A program run to its end, its output captured. */
struct ChildRun {
  int status = -1;  /* the exit status; -1: killed, crashed or not started */
  std::string out, err;
};

/* Runs args[0] with args, in this process's environment less the variables whose
   names start with one of `drop`, plus `add` ("NAME=value"); waits at most
   timeout_ms, then kills it. */
inline ChildRun RunProgram(const std::vector<std::string> &args, const std::vector<std::string> &drop = {},
                           const std::vector<std::string> &add = {}, int64_t timeout_ms = 90000) {
  ChildRun run;
  char err_path[] = "/tmp/ruccl_child_err_XXXXXX", out_path[] = "/tmp/ruccl_child_out_XXXXXX";
  int err_fd = mkstemp(err_path), out_fd = mkstemp(out_path);
  if (err_fd < 0 || out_fd < 0) return run;
  std::vector<std::string> env;
  for (char **e = environ; *e; e++) {
    bool keep = true;
    for (const auto &d : drop) keep = keep && std::strncmp(*e, d.c_str(), d.size()) != 0;
    if (keep) env.push_back(*e);
  }
  env.insert(env.end(), add.begin(), add.end());
  std::vector<char *> argv, envp;
  for (auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
  argv.push_back(nullptr);
  for (auto &e : env) envp.push_back(const_cast<char *>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
  pid_t pid = -1;
  int spawned = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(err_fd);
  close(out_fd);
  if (spawned == 0) {
    int st = 0;
    bool done = WaitFor([&] { return waitpid(pid, &st, WNOHANG) == pid; }, timeout_ms);
    if (!done) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
    }
    run.status = done && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  for (auto [path, text] : {std::pair<const char *, std::string *>{err_path, &run.err}, {out_path, &run.out}}) {
    std::ifstream f(path, std::ios::binary);
    text->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    unlink(path);
  }
  return run;
}

/* One all-reduce of the suite's test data on this peer, checked against the
   expected values: "" when right, else what went wrong.  The proof that a
   communicator still works after an error. */
inline std::string CheckedAllReduce(ruccl_comm_t *comm, const std::vector<uint32_t> &ids, uint32_t my_id,
                                    ruccl_dtype_t dt = RUCCL_FLOAT32, ruccl_reduce_op_t op = RUCCL_SUM,
                                    size_t count = 19, uint64_t salt = 77) {
  Bytes in = FillInput(dt, op, my_id, count, salt);
  Bytes out = Sentinel(dt, count);
  ruccl_tensor_t tin = Vec(in, dt, count), tout = Vec(out, dt, count);
  ruccl_result_t rc = ruccl_all_reduce(comm, &tin, &tout, op);
  if (rc != RUCCL_OK) return "all_reduce returned " + RcStr(rc) + " (" + ruccl_last_error() + ")";
  std::string diff = CompareElems(dt, out, ExpectedReduce(dt, op, ids, count, salt));
  return diff.empty() ? "" : "all_reduce result wrong: " + diff;
}

/* A fresh session of ids under cfg registers, all-reduces correctly and finishes. */
inline ::testing::AssertionResult SessionWorks(const std::vector<uint32_t> &ids, const ruccl_config_t &cfg) {
  Problems probs(ids.size());
  RunResult r = RunPeers(ids, cfg, [&](ruccl_comm_t *comm, size_t i) {
    std::string p = CheckedAllReduce(comm, ids, ids[i]);
    if (!p.empty()) probs.Note(i, p);
  });
  ::testing::AssertionResult ok = AllOk(r);
  if (!ok) return ok;
  return probs.None();
}

/* ------------------------------------------------------------- watchdog */

/* A test that runs past RUCCL_TEST_WATCHDOG_S seconds (default 120) ends the
   process with its name printed: a hang in the implementation must not stall CI. */
inline std::atomic<int64_t> g_watchdog_deadline_ms{0};
inline std::atomic<const ::testing::TestInfo *> g_watchdog_test{nullptr};

class WatchdogListener : public ::testing::EmptyTestEventListener {
 public:
  explicit WatchdogListener(int64_t limit_ms) : limit_ms_(limit_ms) {}
  void OnTestStart(const ::testing::TestInfo &info) override {
    g_watchdog_test.store(&info);
    g_watchdog_deadline_ms.store(NowMs() + limit_ms_);
  }
  void OnTestEnd(const ::testing::TestInfo &) override { g_watchdog_deadline_ms.store(0); }

 private:
  int64_t limit_ms_;
};

inline bool InstallWatchdog() {
  int64_t limit_s = 120;
  if (const char *env = std::getenv("RUCCL_TEST_WATCHDOG_S")) limit_s = std::atoll(env);
  if (limit_s <= 0) return false;
  ::testing::UnitTest::GetInstance()->listeners().Append(new WatchdogListener(limit_s * 1000));
  std::thread([] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      int64_t d = g_watchdog_deadline_ms.load();
      if (d != 0 && NowMs() > d) {
        const ::testing::TestInfo *t = g_watchdog_test.load();
        std::fprintf(stderr, "\n*** ruccl_tests watchdog: %s.%s is still running past its limit; aborting\n",
                     t ? t->test_suite_name() : "?", t ? t->name() : "?");
        std::fflush(stderr);
        std::_Exit(3);
      }
    }
  }).detach();
  return true;
}
inline const bool g_watchdog_installed = InstallWatchdog();

/* --------------------------------------------------- parameter names */

template <typename Tuple>
std::string StratPeersName(const ::testing::TestParamInfo<Tuple> &info) {
  return std::string(std::get<0>(info.param).name) + "_" + std::to_string(std::get<1>(info.param)) + "peers";
}

}  // namespace rt

#endif
