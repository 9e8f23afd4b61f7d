// The fused operations' norm rows (src/fused/cpu_rows.cpp) compiled once per Highway target and
// dispatched at run time, the body's own steps (src/fused/body.hpp: square_add, norm_factor, the
// rounding points of normalise) bit for bit: in-order sums of squares by transposed blocks of heads,
// bf16 sums in vector order where they are exact, factors and bf16 rows lane by lane, the rest plain
// loops the compiler vectorises. No step is reassociated (-ffp-contract=off, no fast-math): every
// target gives the body's bits (tests/test_fused.cpp, FusedRowsTargets, NormSumsTargets).
#include <algorithm>
#include <cmath>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/norm_rows.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "src/cpu/bf16_lanes-inl.h"
#include "src/cpu/cpu.hpp"
#include "src/fused/body.hpp"

HWY_BEFORE_NAMESPACE();
namespace rotary::detail::HWY_NAMESPACE {
namespace {

// The vector code here keeps vectors in arrays and struct members, which SVE and RVV targets
// (sizeless vector types, even where HWY_HAVE_SCALABLE is 0: SVE_256, SVE2_128) cannot hold: those,
// and the scalar target, take the plain loops (CMake disables them for the library besides).
#undef ROTARY_NORM_VECTORS
#if HWY_TARGET != HWY_SCALAR && !HWY_HAVE_SCALABLE && \
    (HWY_TARGET & (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)) == 0
#define ROTARY_NORM_VECTORS 1
#else
#define ROTARY_NORM_VECTORS 0
#endif

// f16 <-> f32 in hardware (F16C on x86), as apply's f16 rows use it: exact widening, so f16 rows
// are summed by the transposed blocks too; elsewhere in order, value by value.
#undef ROTARY_NORM_F16
#if ROTARY_NORM_VECTORS && HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
#define ROTARY_NORM_F16 1
#else
#define ROTARY_NORM_F16 0
#endif

#if ROTARY_NORM_VECTORS
namespace hn = hwy::HWY_NAMESPACE;
using DD = hn::ScalableTag<double>;
using VD = hn::Vec<DD>;
constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(DD()));

// Channels [c, c + kLanes) of one contiguous head row as doubles: the values Storage<T>::load gives
// (f32 widened; f16 widened by F16C, ROTARY_NORM_F16; bf16 its bits above sixteen zero bits, as
// bf16_to_f32), each exact in double.
template <class T>
HWY_INLINE VD LoadAsDouble(const void* row, int64_t c) {
  const DD dd;
  const hn::Rebind<float, DD> df;
  if constexpr (std::is_same_v<T, float>) {
    return hn::PromoteTo(dd, hn::LoadU(df, static_cast<const float*>(row) + c));
#if ROTARY_NORM_F16
  } else if constexpr (std::is_same_v<T, F16>) {
    const hn::Rebind<hwy::float16_t, DD> dh;
    return hn::PromoteTo(dd, hn::PromoteTo(df, hn::LoadU(dh, static_cast<const hwy::float16_t*>(row) + c)));
#endif
  } else {
    static_assert(std::is_same_v<T, BF16>, "f16 rows are widened by F16C only (ROTARY_NORM_F16)");
    const hn::Rebind<uint16_t, DD> d16;
    const hn::Rebind<uint32_t, DD> d32;
    const auto wide = hn::PromoteTo(d32, hn::LoadU(d16, static_cast<const uint16_t*>(row) + c));
    return hn::PromoteTo(dd, hn::BitCast(df, hn::ShiftLeft<16>(wide)));
  }
}

// r[i] lane j becomes r[j] lane i. Each round pairs rows 2i and 2i+1 and splits their even and odd
// lanes (a perfect unshuffle): it rotates the bits of an element's (row | lane) address right by
// one, so log2(kLanes) rounds swap row and lane.
HWY_INLINE void Transpose(VD (&r)[kLanes]) {
  const DD dd;
  for (int64_t round = 1; round < kLanes; round *= 2) {
    VD t[kLanes];
    for (int64_t i = 0; i < kLanes / 2; ++i) {
      t[i] = hn::ConcatEven(dd, r[2 * i + 1], r[2 * i]);
      t[i + kLanes / 2] = hn::ConcatOdd(dd, r[2 * i + 1], r[2 * i]);
    }
    for (int64_t i = 0; i < kLanes; ++i) r[i] = t[i];
  }
}

// The sums of squares of rows[0, kGroups * kLanes) (each a contiguous head row), each in channel
// order as square_add takes them, lane g of a vector holding row g of its group: per block of
// kLanes channels the rows are transposed so that one vector holds one channel of kLanes rows, and
// each lane's sum takes the block's channels one after another (a multiply, then an add: the body's
// two roundings; -ffp-contract=off keeps them apart). kGroups independent chains hide the add's
// latency.
template <class T, int kGroups>
void SumSquaresTransposed(const void* const* rows, int64_t n, double* sums) {
  const DD dd;
  VD sum[kGroups];
  for (int g = 0; g < kGroups; ++g) sum[g] = hn::Zero(dd);
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int g = 0; g < kGroups; ++g) {
      VD r[kLanes];
      for (int64_t i = 0; i < kLanes; ++i) r[i] = LoadAsDouble<T>(rows[g * kLanes + i], c);
      Transpose(r);
      for (int64_t j = 0; j < kLanes; ++j) sum[g] = hn::Add(sum[g], hn::Mul(r[j], r[j]));
    }
  }
  for (int g = 0; g < kGroups; ++g) hn::StoreU(sum[g], dd, sums + g * kLanes);
  for (int64_t i = 0; i < kGroups * kLanes; ++i) {  // the channels after the last whole block
    for (int64_t t = c; t < n; ++t) sums[i] = square_add(sums[i], Storage<T>::load(rows[i], t));
  }
}

// The in-order sums of rows[0, done) (contiguous rows), by transposed blocks; returns done.
template <class T>
int64_t SumsTransposed(const void* const* rows, int64_t count, int64_t n, double* sums) {
  if constexpr (std::is_same_v<T, F16> && !ROTARY_NORM_F16) {
    return 0;  // InOrderSums' loop
  } else {
    if (kLanes < 2 || n < kLanes) return 0;
    int64_t i = 0;
    for (; i + 4 * kLanes <= count; i += 4 * kLanes) SumSquaresTransposed<T, 4>(rows + i, n, sums + i);
    if (i + 2 * kLanes <= count) {
      SumSquaresTransposed<T, 2>(rows + i, n, sums + i);
      i += 2 * kLanes;
    }
    if (i + kLanes <= count) {
      SumSquaresTransposed<T, 1>(rows + i, n, sums + i);
      i += kLanes;
    }
    return i;
  }
}

// r[i] = norm_factor(sums[i], n, eps), lane by lane: each step is one correctly rounded operation
// (a double division, a rounding to float, a float addition, a double square root and division),
// the scalar function's bits.
void FactorsFromSums(const double* sums, int64_t count, int64_t n, float eps, float* r) {
  const DD dd;
  const hn::Rebind<float, DD> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(dd));
  int64_t i = 0;
  for (; i + L <= count; i += L) {
    const auto mean = hn::DemoteTo(df, hn::Div(hn::LoadU(dd, sums + i), hn::Set(dd, static_cast<double>(n))));
    const VD v = hn::PromoteTo(dd, hn::Add(mean, hn::Set(df, eps)));
    hn::StoreU(hn::DemoteTo(df, hn::Div(hn::Set(dd, 1.0), hn::Sqrt(v))), df, r + i);
  }
  for (; i < count; ++i) r[i] = norm_factor(sums[i], n, eps);
}

// ---- bf16: sums of squares that are exact, so the same in any order ----
//
// A bf16 value is M 2^q with M an integer below 2^8 and q = max(E, 1) - 134 (E its exponent field),
// so its square is exact in double (at most 16 significant bits) and an integer multiple of 2^(2q).
// Let lo be the smallest max(E, 1) among the nonzero values of the rows summed: every square is an
// integer multiple of u = 2^(2(lo - 134)) >= 2^-266, and every multiple k u with k < 2^53 is a
// normal double. If a row's exact sum S is below 2^53 u, every partial sum of every order is such a
// multiple (squares are not negative, so none exceeds S): the body's in-order sum (square_add) and
// the vector's are both S. Conversely, every operation of the vector's order (the fused
// multiply-adds, the horizontal sum, the tail) has operands that are multiples of u until one
// rounds, which it does only where its exact result reaches 2^53 u; its rounded result is then at
// least 2^53 u (which is a double; rounding to nearest is monotone), and so is every sum computed
// from it, the final one included. So a row takes its vector-order sum when that is below 2^53 u,
// else the in-order sum. An infinity or a NaN (E = 255) makes the sum one, which is not below any
// bound. lo is first the smallest over all the rows of a call, so each row's check is one compare; a
// row over that bound is checked again against its own lo before it is summed in order.
struct Bf16SquareSums {
  using DD = hn::Repartition<double, bf16_lanes::DF>;
  using DH = hn::Half<bf16_lanes::DF>;
  using VD = hn::Vec<DD>;
  using DU16 = bf16_lanes::DU16;
  hn::Vec<DU16> bottom;  // min (magnitude - 1) of every value summed: zero wraps to the top
  uint32_t tail_bottom = 0xffff;

  Bf16SquareSums() : bottom(hn::Set(DU16(), 0xffff)) {}
  // The sum of one row's squares, in an order of its own.
  double Row(const uint16_t* row, int64_t n) {
    const DU16 d16;
    const DD dd;
    const DH dh;
    const auto magnitude_bits = hn::Set(d16, 0x7fff);
    const auto one = hn::Set(d16, 1);
    const int64_t step = static_cast<int64_t>(hn::Lanes(d16));
    VD acc0 = hn::Zero(dd), acc1 = hn::Zero(dd), acc2 = hn::Zero(dd), acc3 = hn::Zero(dd);
    int64_t c = 0;
    for (; c + step <= n; c += step) {
      const auto w16 = hn::LoadU(d16, row + c);
      bottom = hn::Min(bottom, hn::Sub(hn::And(w16, magnitude_bits), one));
      const auto w = hn::BitCast(bf16_lanes::DU(), w16);
      const auto even = bf16_lanes::Bf16Even(w), odd = bf16_lanes::Bf16Odd(w);
      const VD x0 = hn::PromoteTo(dd, hn::LowerHalf(dh, even)), x1 = hn::PromoteTo(dd, hn::UpperHalf(dh, even));
      const VD x2 = hn::PromoteTo(dd, hn::LowerHalf(dh, odd)), x3 = hn::PromoteTo(dd, hn::UpperHalf(dh, odd));
      acc0 = hn::MulAdd(x0, x0, acc0);  // x x is exact: fma(x, x, a) = a + x x, bit for bit
      acc1 = hn::MulAdd(x1, x1, acc1);
      acc2 = hn::MulAdd(x2, x2, acc2);
      acc3 = hn::MulAdd(x3, x3, acc3);
    }
    double tail = 0;
    for (; c < n; ++c) {
      tail_bottom = std::min(tail_bottom, (static_cast<uint32_t>(row[c] & 0x7fffu) - 1) & 0xffffu);
      tail = square_add(tail, bf16_to_f32(row[c]));
    }
    return hn::GetLane(hn::SumOfLanes(dd, hn::Add(hn::Add(acc0, acc1), hn::Add(acc2, acc3)))) + tail;
  }
  // 2^53 u for the rows summed so far (infinity when every value was zero: every sum is then 0).
  double Bound() const {
    return BoundOf(std::min<uint32_t>(hn::GetLane(hn::MinOfLanes(DU16(), bottom)), tail_bottom));
  }
  // 2^53 u for one row alone: a row whose sum is not below the rows' bound may be below its own
  // (the smallest value of all the rows need not be in it).
  static double RowBound(const uint16_t* row, int64_t n) {
    const DU16 d16;
    const auto magnitude_bits = hn::Set(d16, 0x7fff);
    const auto one = hn::Set(d16, 1);
    const int64_t step = static_cast<int64_t>(hn::Lanes(d16));
    auto low = hn::Set(d16, 0xffff);
    int64_t c = 0;
    for (; c + step <= n; c += step) low = hn::Min(low, hn::Sub(hn::And(hn::LoadU(d16, row + c), magnitude_bits), one));
    uint32_t min_m = hn::GetLane(hn::MinOfLanes(d16, low));
    for (; c < n; ++c) min_m = std::min(min_m, (static_cast<uint32_t>(row[c] & 0x7fffu) - 1) & 0xffffu);
    return BoundOf(min_m);
  }
  // min_m: the smallest (magnitude - 1) as u16, 0xffff for zeros only (a nonzero magnitude minus one
  // is at most 0x7ffe); lo = max(E, 1) of the smallest nonzero value.
  static double BoundOf(uint32_t min_m) {
    if (min_m == 0xffff) return HUGE_VAL;
    const int lo = std::max<int>(static_cast<int>((min_m + 1) >> 7), 1);
    return std::ldexp(1.0, 53 + 2 * (lo - 134));
  }
};

#endif  // ROTARY_NORM_VECTORS

// The in-order sums of `count` rows (rows[i]: a row's first element, element stride `stride`).
template <class T>
void InOrderSums(const void* const* rows, int64_t count, int64_t stride, int64_t n, double* sums) {
  int64_t i = 0;
#if ROTARY_NORM_VECTORS
  if (stride == 1) i = SumsTransposed<T>(rows, count, n, sums);
#endif
  // Eight rows side by side, each summed in channel order (independent chains: the order of each
  // sum is the body's).
  constexpr int64_t kSide = 8;
  for (; i + kSide <= count; i += kSide) {
    double sum[kSide] = {};
    for (int64_t c = 0; c < n; ++c) {
      for (int64_t g = 0; g < kSide; ++g) sum[g] = square_add(sum[g], Storage<T>::load(rows[i + g], c * stride));
    }
    for (int64_t g = 0; g < kSide; ++g) sums[i + g] = sum[g];
  }
  for (; i < count; ++i) {
    double sum = 0;
    for (int64_t c = 0; c < n; ++c) sum = square_add(sum, Storage<T>::load(rows[i], c * stride));
    sums[i] = sum;
  }
}

// The sums of squares of `heads` rows (row h at base + h * head_stride, element stride `stride`),
// each as the body sums it (square_add in channel order): sums[h]; all_heads: one over them all,
// head after head, sums[0]. A bf16 sum that is exact (Bf16SquareSums) is taken in the vector's
// order; the others (and every sum of other dtypes) in order.
template <class T>
void SquareSumsImpl(const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n, bool all_heads,
                    double* sums) {
  using Bits = typename Storage<T>::Bits;
  const auto row = [&](int64_t h) { return static_cast<const Bits*>(base) + h * head_stride; };
  [[maybe_unused]] bool vector_sums = false;  // sums[] hold the bf16 vector-order sums
  [[maybe_unused]] double bound = 0;          // below which they are exact (Bf16SquareSums)
  // Whether row h's vector-order sum is exact (bf16, head scope).
  const auto exact = [&](int64_t h) {
#if ROTARY_NORM_VECTORS
    if constexpr (std::is_same_v<T, BF16>) {
      return vector_sums && (sums[h] < bound || sums[h] < Bf16SquareSums::RowBound(row(h), n));
    }
#endif
    static_cast<void>(h);
    return false;
  };
#if ROTARY_NORM_VECTORS
  if constexpr (std::is_same_v<T, BF16>) {
    if (stride == 1) {
      Bf16SquareSums sum;
      if (all_heads) {  // exact: so is the sum of the rows' sums, in any order
        double total = 0;
        for (int64_t h = 0; h < heads; ++h) total += sum.Row(row(h), n);
        if (total < sum.Bound()) {
          sums[0] = total;
          return;
        }
      } else {
        for (int64_t h = 0; h < heads; ++h) sums[h] = sum.Row(row(h), n);
        bound = sum.Bound();
        vector_sums = true;
      }
    }
  }
#endif
  if (all_heads) {
    double sum = 0;
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t c = 0; c < n; ++c) sum = square_add(sum, Storage<T>::load(row(h), c * stride));
    }
    sums[0] = sum;
    return;
  }
  constexpr int64_t kChunk = 64;  // rows summed in order, gathered per chunk of heads
  const void* rows[kChunk];
  int64_t which[kChunk];
  double in_order[kChunk];
  for (int64_t h0 = 0; h0 < heads; h0 += kChunk) {
    const int64_t count = std::min(kChunk, heads - h0);
    int64_t left = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (exact(h0 + i)) continue;
      rows[left] = row(h0 + i);
      which[left++] = h0 + i;
    }
    InOrderSums<T>(rows, left, stride, n, in_order);
    for (int64_t j = 0; j < left; ++j) sums[which[j]] = in_order[j];
  }
}

template <class T>
void NormFactorsImpl(const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n, bool all_heads,
                     float eps, float* r) {
  const int64_t es = static_cast<int64_t>(sizeof(typename Storage<T>::Bits));
  if (all_heads) {
    double sum;
    SquareSumsImpl<T>(base, head_stride, stride, heads, n, true, &sum);
    r[0] = norm_factor(sum, heads * n, eps);
    return;
  }
  constexpr int64_t kChunk = 64;
  double sums[kChunk];
  for (int64_t h0 = 0; h0 < heads; h0 += kChunk) {
    const int64_t count = std::min(kChunk, heads - h0);
    SquareSumsImpl<T>(static_cast<const unsigned char*>(base) + h0 * head_stride * es, head_stride, stride, count, n,
                      false, sums);
#if ROTARY_NORM_VECTORS
    FactorsFromSums(sums, count, n, eps, r + h0);
#else
    for (int64_t i = 0; i < count; ++i) r[h0 + i] = norm_factor(sums[i], n, eps);
#endif
  }
}

// One row: kWeight false: fl_T(x r); gemma: fl_T(x r w); llama: fl_T(fl_T(x r) w).
template <class T, bool kWeight, bool kGemma, bool kUnit>
void NormaliseRow(const void* src, int64_t src_stride, void* dst, int64_t dst_stride, float r, const float* w,
                  int64_t n) {
  const int64_t si = kUnit ? 1 : src_stride;
  const int64_t di = kUnit ? 1 : dst_stride;
  for (int64_t c = 0; c < n; ++c) {
    const float y = mul_rn(Storage<T>::load(src, c * si), r);
    float out;
    if constexpr (!kWeight) {
      out = y;
    } else if constexpr (kGemma) {
      out = mul_rn(y, w[c]);
    } else {
      out = mul_rn(round_to<T>(y), w[c]);
    }
    Storage<T>::store(dst, c * di, out);
  }
}

#if ROTARY_NORM_VECTORS
// bf16, contiguous: NormaliseRow's steps lane by lane, 2L values a step as u32 words (even and odd
// elements, bf16_lanes-inl.h); returns the values done.
template <bool kWeight, bool kGemma>
int64_t NormaliseBf16Vectors(const uint16_t* src, uint16_t* dst, float r, const float* w, int64_t n) {
  namespace b = bf16_lanes;
  const b::DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const b::VF vr = hn::Set(df, r);
  int64_t c = 0;
  for (; c + 2 * L <= n; c += 2 * L) {
    const b::VU words = b::LoadBf16Words(src + c);
    b::VF even = hn::Mul(b::Bf16Even(words), vr);
    b::VF odd = hn::Mul(b::Bf16Odd(words), vr);
    if constexpr (kWeight) {
      const b::VF w0 = hn::LoadU(df, w + c), w1 = hn::LoadU(df, w + c + L);
      if constexpr (!kGemma) {
        even = b::RoundToBf16(even);
        odd = b::RoundToBf16(odd);
      }
      even = hn::Mul(even, hn::ConcatEven(df, w1, w0));
      odd = hn::Mul(odd, hn::ConcatOdd(df, w1, w0));
    }
    // A NaN here has a zero low half: from the data, the factor, or a weight (cpu_rows.cpp's
    // effective_weights clears a caller's NaN weight's low half).
    hn::StoreU(hn::BitCast(b::DU16(), b::PackBf16(even, odd)), b::DU16(), dst + c);
  }
  return c;
}
#endif

#if ROTARY_NORM_F16
// f16, contiguous: NormaliseRow's steps lane by lane, widened and rounded by F16C (nearest even, as
// f32_to_f16); returns the values done.
template <bool kWeight, bool kGemma>
int64_t NormaliseF16Vectors(const uint16_t* src, uint16_t* dst, float r, const float* w, int64_t n) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const auto* in = reinterpret_cast<const hwy::float16_t*>(src);
  auto* out = reinterpret_cast<hwy::float16_t*>(dst);
  const auto vr = hn::Set(df, r);
  int64_t c = 0;
  for (; c + L <= n; c += L) {
    auto y = hn::Mul(hn::PromoteTo(df, hn::LoadU(dh, in + c)), vr);
    if constexpr (kWeight) {
      if constexpr (!kGemma) y = hn::PromoteTo(df, hn::DemoteTo(dh, y));
      y = hn::Mul(y, hn::LoadU(df, w + c));
    }
    hn::StoreU(hn::DemoteTo(dh, y), dh, out + c);
  }
  return c;
}
#endif

// The values of a contiguous row that vectors normalised (bf16; f16 where F16C widens it), 0 for
// the rest: NormaliseRow does what is left.
template <class T, bool kWeight, bool kGemma>
int64_t NormaliseVectors(const NormRow& row) {
  [[maybe_unused]] const auto* src = static_cast<const uint16_t*>(row.src);
  [[maybe_unused]] auto* dst = static_cast<uint16_t*>(row.dst);
#if ROTARY_NORM_F16
  if constexpr (std::is_same_v<T, F16>) return NormaliseF16Vectors<kWeight, kGemma>(src, dst, row.r, row.w, row.n);
#endif
#if ROTARY_NORM_VECTORS
  if constexpr (std::is_same_v<T, BF16>) return NormaliseBf16Vectors<kWeight, kGemma>(src, dst, row.r, row.w, row.n);
#endif
  return 0;
}

template <class T, bool kWeight, bool kGemma>
void NormaliseRowAnyStride(const NormRow& row) {
  if (row.src_stride == 1 && row.dst_stride == 1) {
    const int64_t done = NormaliseVectors<T, kWeight, kGemma>(row);
    const int64_t es = static_cast<int64_t>(sizeof(typename Storage<T>::Bits));
    NormaliseRow<T, kWeight, kGemma, true>(static_cast<const unsigned char*>(row.src) + done * es, 1,
                                           static_cast<unsigned char*>(row.dst) + done * es, 1, row.r,
                                           kWeight ? row.w + done : row.w, row.n - done);
  } else {
    NormaliseRow<T, kWeight, kGemma, false>(row.src, row.src_stride, row.dst, row.dst_stride, row.r, row.w, row.n);
  }
}

template <class T>
void NormaliseRowImpl(const NormRow& row) {
  if (row.w == nullptr) {
    NormaliseRowAnyStride<T, false, false>(row);
  } else if (row.gemma) {
    NormaliseRowAnyStride<T, true, true>(row);
  } else {
    NormaliseRowAnyStride<T, true, false>(row);
  }
}

}  // namespace

void NormFactorsF32(const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n, bool all_heads,
                    float eps, float* r) {
  NormFactorsImpl<float>(base, head_stride, stride, heads, n, all_heads, eps, r);
}
void NormFactorsF16(const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n, bool all_heads,
                    float eps, float* r) {
  NormFactorsImpl<F16>(base, head_stride, stride, heads, n, all_heads, eps, r);
}
void NormFactorsBF16(const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n, bool all_heads,
                     float eps, float* r) {
  NormFactorsImpl<BF16>(base, head_stride, stride, heads, n, all_heads, eps, r);
}
void SquareSumsF32(const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n, bool all_heads,
                   double* sums) {
  SquareSumsImpl<float>(base, head_stride, stride, heads, n, all_heads, sums);
}
void SquareSumsF16(const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n, bool all_heads,
                   double* sums) {
  SquareSumsImpl<F16>(base, head_stride, stride, heads, n, all_heads, sums);
}
void SquareSumsBF16(const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n, bool all_heads,
                    double* sums) {
  SquareSumsImpl<BF16>(base, head_stride, stride, heads, n, all_heads, sums);
}
void NormaliseRowF32(const NormRow& row) { NormaliseRowImpl<float>(row); }
void NormaliseRowF16(const NormRow& row) { NormaliseRowImpl<F16>(row); }
void NormaliseRowBF16(const NormRow& row) { NormaliseRowImpl<BF16>(row); }

}  // namespace rotary::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary::detail {
HWY_EXPORT(NormFactorsF32);
HWY_EXPORT(NormFactorsF16);
HWY_EXPORT(NormFactorsBF16);
HWY_EXPORT(SquareSumsF32);
HWY_EXPORT(SquareSumsF16);
HWY_EXPORT(SquareSumsBF16);
HWY_EXPORT(NormaliseRowF32);
HWY_EXPORT(NormaliseRowF16);
HWY_EXPORT(NormaliseRowBF16);

void norm_factors(DType dtype, const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n,
                  bool all_heads, float eps, float* r) {
  switch (dtype) {
    case DType::f16: HWY_DYNAMIC_DISPATCH(NormFactorsF16)(base, head_stride, stride, heads, n, all_heads, eps, r); break;
    case DType::bf16: HWY_DYNAMIC_DISPATCH(NormFactorsBF16)(base, head_stride, stride, heads, n, all_heads, eps, r); break;
    default: HWY_DYNAMIC_DISPATCH(NormFactorsF32)(base, head_stride, stride, heads, n, all_heads, eps, r); break;
  }
}

void square_sums(DType dtype, const void* base, int64_t head_stride, int64_t stride, int64_t heads, int64_t n,
                 bool all_heads, double* sums) {
  switch (dtype) {
    case DType::f16: HWY_DYNAMIC_DISPATCH(SquareSumsF16)(base, head_stride, stride, heads, n, all_heads, sums); break;
    case DType::bf16: HWY_DYNAMIC_DISPATCH(SquareSumsBF16)(base, head_stride, stride, heads, n, all_heads, sums); break;
    default: HWY_DYNAMIC_DISPATCH(SquareSumsF32)(base, head_stride, stride, heads, n, all_heads, sums); break;
  }
}

void normalise_row(DType dtype, const NormRow& row) {
  switch (dtype) {
    case DType::f16: HWY_DYNAMIC_DISPATCH(NormaliseRowF16)(row); break;
    case DType::bf16: HWY_DYNAMIC_DISPATCH(NormaliseRowBF16)(row); break;
    default: HWY_DYNAMIC_DISPATCH(NormaliseRowF32)(row); break;
  }
}
}  // namespace rotary::detail
#endif
