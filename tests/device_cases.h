/* device_cases.h — what test_device.cc and test_cuda.cc share about the device
   reduction (device.h's ruccl_device_reduce_t): element data that reaches every
   corner of the arithmetic (NaNs with payloads, signalling NaNs, infinities, signed
   zeros, subnormals, half-precision ties and overflow, integer wrap), the grid of
   cases (dtype x op x sources x destinations x in place), and the host reference
   run over one case. */
#ifndef RUCCL_DEVICE_CASES_H
#define RUCCL_DEVICE_CASES_H

#include "device/device.h"
#include "test_util.h"

namespace rt {

/* Bit patterns worth meeting in a reduction, per storage dtype. */
inline const std::vector<uint64_t> &SpecialBits(ruccl_dtype_t dt) {
  static const std::vector<uint64_t> f32 = {
      0x7fc00000u, 0x7fc12345u, 0xffc00001u, 0x7f800001u, 0xff812345u, /* NaNs (quiet, payload, signalling) */
      0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u,              /* infinities, zeros */
      0x00000001u, 0x807fffffu, 0x00800000u, 0x7f7fffffu, 0xff7fffffu, /* subnormals, extremes */
      0x3f800000u, 0xbf800000u, 0x3f800001u, 0x477fe000u, 0x477ff000u, /* 1, -1, 1+ulp, 65504, 65520 */
      0x33000000u, 0x33000001u, 0x387fc000u, 0x3f808000u, 0x3f818000u, /* float16's edges, seen from float32 */
  };
  static const std::vector<uint64_t> f64 = {
      0x7ff8000000000000ull, 0x7ff8000000012345ull, 0xfff8000000000001ull, 0x7ff0000000000001ull,
      0x7ff0000000000000ull, 0xfff0000000000000ull, 0x0000000000000000ull, 0x8000000000000000ull,
      0x0000000000000001ull, 0x800fffffffffffffull, 0x7fefffffffffffffull, 0xffefffffffffffffull,
      0x3ff0000000000000ull, 0xbff0000000000000ull, 0x3ff0000000000001ull, 0x4340000000000001ull,
  };
  static const std::vector<uint64_t> f16 = {
      0x7e00u, 0x7e5au, 0xfe01u, 0x7c01u, 0xfd23u, /* NaNs */
      0x7c00u, 0xfc00u, 0x0000u, 0x8000u,          /* infinities, zeros */
      0x0001u, 0x83ffu, 0x0400u, 0x7bffu, 0xfbffu, /* subnormals, extremes */
      0x3c00u, 0xbc00u, 0x3c01u, 0x3bffu, 0x6400u, /* 1, -1, 1+ulp, 1-ulp/2, 1024 (adding 0.5 ties) */
      0x3800u, 0x1400u,
  };
  static const std::vector<uint64_t> bf16 = {
      0x7fc0u, 0x7fc5u, 0xffc1u, 0x7f81u, 0xff93u, /* NaNs */
      0x7f80u, 0xff80u, 0x0000u, 0x8000u,          /* infinities, zeros */
      0x0001u, 0x807fu, 0x0080u, 0x7f7fu, 0xff7fu, /* subnormals, extremes */
      0x3f80u, 0xbf80u, 0x3f81u, 0x4380u, 0x3f00u, /* 1, -1, 1+ulp, 256, 0.5 */
  };
  static const std::vector<uint64_t> i8 = {0x00, 0x01, 0xff, 0x7f, 0x80, 0x81, 0x7e, 0x40, 0xc0, 0x10};
  static const std::vector<uint64_t> u8 = {0x00, 0x01, 0xff, 0x7f, 0x80, 0xfe, 0x10, 0x0f};
  static const std::vector<uint64_t> i32 = {0x0u, 0x1u, 0xffffffffu, 0x7fffffffu, 0x80000000u,
                                            0x80000001u, 0x7ffffffeu, 0x10000u, 0xffff0000u};
  static const std::vector<uint64_t> i64 = {0x0ull, 0x1ull, 0xffffffffffffffffull, 0x7fffffffffffffffull,
                                            0x8000000000000000ull, 0x8000000000000001ull, 0x100000000ull,
                                            0xffffffff00000000ull};
  switch (dt) {
    case RUCCL_FLOAT32: return f32;
    case RUCCL_FLOAT64: return f64;
    case RUCCL_FLOAT16: return f16;
    case RUCCL_BFLOAT16: return bf16;
    case RUCCL_INT8: return i8;
    case RUCCL_UINT8: return u8;
    case RUCCL_INT32: return i32;
    case RUCCL_INT64: return i64;
  }
  return i64;
}

inline void PutBits(ruccl_dtype_t dt, void *base, size_t i, uint64_t bits) {
  switch (ElemSize(dt)) {
    case 1: PutRaw<uint8_t>(base, i, static_cast<uint8_t>(bits)); break;
    case 2: PutRaw<uint16_t>(base, i, static_cast<uint16_t>(bits)); break;
    case 4: PutRaw<uint32_t>(base, i, static_cast<uint32_t>(bits)); break;
    default: PutRaw<uint64_t>(base, i, bits); break;
  }
}

/* count elements of dt: a third special patterns, a third any bits, a third small
   values (sums and products that stay finite and round in the half types). */
inline Bytes ReductionData(ruccl_dtype_t dt, size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 17);
  const std::vector<uint64_t> &special = SpecialBits(dt);
  Bytes b(count * ElemSize(dt));
  for (size_t i = 0; i < count; i++) {
    uint64_t r = rng();
    switch (r % 3) {
      case 0: PutBits(dt, b.data(), i, special[(r >> 8) % special.size()]); break;
      case 1: PutBits(dt, b.data(), i, rng()); break;
      default: {
        int64_t v = static_cast<int64_t>((r >> 8) % 4001) - 2000; /* -2000..2000 */
        if (IsFloat(dt))
          StoreFloat(dt, b.data(), i, static_cast<double>(v) / 64.0); /* 1/64 steps: exact, then rounded */
        else
          StoreInt(dt, b.data(), i, v);
        break;
      }
    }
  }
  return b;
}

/* One device reduction to check: MEAN is SUM with a divisor, which need not be the
   number of sources. */
struct ReduceCase {
  ruccl_dtype_t dt;
  ruccl_reduce_op_t op; /* SUM, MIN, MAX or PROD */
  unsigned divisor;     /* non-zero: MEAN */
  unsigned nsrc, ndst;
  bool in_place; /* dsts[0] is the last source; dsts[1] (if any) the first */
};

inline std::string CaseName(const ReduceCase &k) {
  std::ostringstream os;
  os << DtypeName(k.dt) << " " << (k.divisor ? "Mean/" + std::to_string(k.divisor) : OpName(k.op)) << " " << k.nsrc
     << " src -> " << k.ndst << " dst" << (k.in_place ? " in place" : "");
  return os.str();
}

/* Every dtype x (SUM, MIN, MAX, PROD, MEAN by the number of sources, MEAN by 7) x
   1..5 sources x 1..3 destinations, apart and in place. */
inline std::vector<ReduceCase> AllReduceCases() {
  std::vector<ReduceCase> v;
  for (ruccl_dtype_t dt : AllDtypes())
    for (int o = 0; o < 6; o++)
      for (unsigned nsrc = 1; nsrc <= 5; nsrc++)
        for (unsigned ndst = 1; ndst <= 3; ndst++)
          for (bool in_place : {false, true}) {
            static const ruccl_reduce_op_t ops[6] = {RUCCL_SUM, RUCCL_MIN, RUCCL_MAX, RUCCL_PROD, RUCCL_SUM, RUCCL_SUM};
            unsigned divisor = o == 4 ? nsrc : o == 5 ? 7 : 0;
            v.push_back({dt, ops[o], divisor, nsrc, ndst, in_place});
          }
  return v;
}

/* Which source buffer destination d is (in place), or -1 for a buffer of its own. */
inline int AliasOf(const ReduceCase &k, unsigned d) {
  if (!k.in_place) return -1;
  if (d == 0) return static_cast<int>(k.nsrc - 1);
  if (d == 1 && k.nsrc > 1) return 0;
  return -1;
}

/* The descriptor of case k over buffers srcs (k.nsrc) and dsts (k.ndst): dsts that
   alias a source point at it. */
inline ruccl_device_reduce_t Describe(const ReduceCase &k, size_t count, void *const *srcs, void *const *dsts) {
  ruccl_device_reduce_t r;
  std::memset(&r, 0, sizeof r);
  for (unsigned s = 0; s < k.nsrc; s++) r.srcs[s] = srcs[s];
  for (unsigned d = 0; d < k.ndst; d++) r.dsts[d] = AliasOf(k, d) >= 0 ? srcs[AliasOf(k, d)] : dsts[d];
  r.nsrc = k.nsrc;
  r.ndst = k.ndst;
  r.count = count;
  r.dtype = k.dt;
  r.op = k.op;
  r.divisor = k.divisor;
  return r;
}

/* The sources of case k (seeded by its position in the grid). */
inline std::vector<Bytes> CaseSources(const ReduceCase &k, size_t count, uint64_t seed) {
  std::vector<Bytes> srcs;
  for (unsigned s = 0; s < k.nsrc; s++) srcs.push_back(ReductionData(k.dt, count, seed * 8 + s));
  return srcs;
}

/* ruccl_reduce_reference over copies of srcs: every destination's bytes. */
inline std::vector<Bytes> ReferenceResult(const ReduceCase &k, const std::vector<Bytes> &srcs, size_t count) {
  std::vector<Bytes> s = srcs, d(k.ndst, Sentinel(k.dt, count));
  std::vector<void *> sp, dp;
  for (auto &b : s) sp.push_back(b.data());
  for (auto &b : d) dp.push_back(b.data());
  ruccl_device_reduce_t r = Describe(k, count, sp.data(), dp.data());
  ruccl_reduce_reference(&r);
  for (unsigned x = 0; x < k.ndst; x++)
    if (AliasOf(k, x) >= 0) d[x] = s[AliasOf(k, x)];
  return d;
}

inline bool IsNaNElem(ruccl_dtype_t dt, const unsigned char *e) {
  switch (dt) {
    case RUCCL_FLOAT32: return (GetRaw<uint32_t>(e, 0) & 0x7fffffffu) > 0x7f800000u;
    case RUCCL_FLOAT64: return (GetRaw<uint64_t>(e, 0) & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    case RUCCL_FLOAT16: return (GetRaw<uint16_t>(e, 0) & 0x7fffu) > 0x7c00u;
    case RUCCL_BFLOAT16: return (GetRaw<uint16_t>(e, 0) & 0x7fffu) > 0x7f80u;
    default: return false;
  }
}

/* Whether a NaN result of case k may differ in sign and payload between two correct
   implementations: where arithmetic made it.  IEEE 754 leaves the payload of NaN + NaN
   to the implementation (x86 keeps the first operand's, and a compiler may swap the
   operands of a commutative add; a GPU returns its canonical NaN); MIN and MAX select
   an input and keep it bit for bit. */
inline bool ArithmeticNaNs(const ReduceCase &k) { return k.divisor || k.op == RUCCL_SUM || k.op == RUCCL_PROD; }

/* "" when got equals want byte for byte, element by element (or, with any_nan, where
   both are NaNs); else the first element that differs. */
inline std::string ReductionDiff(ruccl_dtype_t dt, const Bytes &got, const Bytes &want, bool any_nan) {
  size_t es = ElemSize(dt);
  if (got.size() != want.size()) return "sizes differ";
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size() / es; i++) {
    const unsigned char *g = &got[i * es], *w = &want[i * es];
    if (std::memcmp(g, w, es) == 0 || (any_nan && IsNaNElem(dt, g) && IsNaNElem(dt, w))) continue;
    if (bad++ == 0) first = i;
  }
  if (!bad) return "";
  auto hex = [&](const Bytes &b) {
    std::string s = "0x";
    char buf[4];
    for (size_t k = es; k-- > 0;) std::snprintf(buf, sizeof buf, "%02x", b[first * es + k]), s += buf;
    return s;
  };
  return std::to_string(bad) + " element(s) differ; first [" + std::to_string(first) + "]: got " + hex(got) +
         ", want " + hex(want);
}

/* Case k over count elements (data seed `seed`) run through `reduce` on host
   buffers: what each destination holds after it (an in-place destination is its
   source), and what the reference says it should. */
struct CaseRun {
  ruccl_result_t rc = RUCCL_OK;
  std::vector<Bytes> got, want;
};

inline CaseRun RunCase(const ReduceCase &k, size_t count, size_t seed,
                       const std::function<ruccl_result_t(ruccl_device_reduce_t *)> &reduce) {
  CaseRun run;
  std::vector<Bytes> srcs = CaseSources(k, count, seed);
  run.want = ReferenceResult(k, srcs, count);
  std::vector<Bytes> dsts(k.ndst, Sentinel(k.dt, count));
  std::vector<void *> sp, dp;
  for (auto &b : srcs) sp.push_back(b.data());
  for (auto &b : dsts) dp.push_back(b.data());
  ruccl_device_reduce_t r = Describe(k, count, sp.data(), dp.data());
  run.rc = reduce(&r);
  for (unsigned d = 0; d < k.ndst; d++) run.got.push_back(AliasOf(k, d) >= 0 ? srcs[AliasOf(k, d)] : dsts[d]);
  return run;
}

}  // namespace rt

#endif
