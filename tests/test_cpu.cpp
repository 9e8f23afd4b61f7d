// The Highway kernels against the scalar reference, on every target this build compiles
// (hwy::SetSupportedTargetsForTest), every dtype, pairing, angle source, in and out of place,
// awkward sizes, misaligned pointers, strides; and bit-identical results for any thread count.
//
// Bound proven (src/rotate.hpp): every path rotates a pair with the same float32 operations
// (detail::rotate_minus: the larger product fused, the smaller rounded), lane by lane or in
// scalar tails, with an exactly emulated fma where the target has none; so with a Table the CPU
// kernels are byte-identical to the reference on every target. On the fly, the vectorised cos/sin
// are the scalar exact angles bit for bit (OnTheFlyFloatAnglesAreTheScalarExactAngles), so the
// kernels are byte-identical there too; the bounds below allow two contract units,
// 2^-22 g (|a| + |b|) per pair, as before. f16/bf16 are the f32 result rounded once.
#include <hwy/tests/hwy_gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <new>
#include <random>
#include <thread>

#include "cpu/cpu.hpp"
#include "math/half.hpp"
#include "rotary/angle.hpp"
#include "rotary/apply.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

constexpr double kOnTheFlyPairBound = 0x1p-22;  // two contract units, see above

class CpuKernels : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(CpuKernels);

uint64_t poison_bits(DType dtype) {
  switch (dtype) {
    case DType::f32: return 0x7fc12345u;
    case DType::f64: return 0x7ff8123456789abcull;
    default: return 0x7e55u;  // a NaN in both f16 and bf16
  }
}

// Storage that starts on a 64-byte boundary (as framework allocations do), copies included, so
// that a guard zone of a multiple of 64 bytes puts a view on the alignment non-temporal stores need.
template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  bool operator==(const Aligned64&) const { return true; }
};

// Storage buffer of `elements` plus guard zones, filled with `fill` values from floats.
struct Buffer {
  DType dtype;
  int64_t guard;
  int64_t misalign;
  std::vector<unsigned char, Aligned64<unsigned char>> bytes;
  Buffer(DType t, int64_t elements, int64_t guard_elements, int64_t misalign_elements)
      : dtype(t), guard(guard_elements), misalign(misalign_elements),
        bytes(static_cast<size_t>((elements + 2 * guard + misalign) * size_of(t))) {
    poison();
  }
  void poison() {
    const uint64_t p = poison_bits(dtype);
    const int64_t es = size_of(dtype);
    for (size_t i = 0; i < bytes.size(); i += static_cast<size_t>(es)) std::memcpy(&bytes[i], &p, static_cast<size_t>(es));
  }
  void* data() { return bytes.data() + (guard + misalign) * size_of(dtype); }
  void set(int64_t i, float v) {
    unsigned char* p = static_cast<unsigned char*>(data()) + i * size_of(dtype);
    test::store_element(dtype, p, v);
  }
  double get(int64_t i) const {
    const unsigned char* p = bytes.data() + (guard + misalign + i) * size_of(dtype);
    return test::load_element(dtype, p);
  }
  bool is_poison_at_offset(int64_t byte_index) const {
    const uint64_t p = poison_bits(dtype);
    return std::memcmp(&bytes[static_cast<size_t>(byte_index)], &p, static_cast<size_t>(size_of(dtype))) == 0;
  }
};

struct ChannelLayout {
  const char* name;
  // strides for shape [b, s, h, d] in a buffer; returns element count the buffer needs
  std::array<int64_t, 4> strides;
  int64_t extent;
};

ChannelLayout make_layout(int kind, int64_t b, int64_t s, int64_t h, int64_t d) {
  switch (kind) {
    case 0: return {"bshd", {s * h * d, h * d, d, 1}, b * s * h * d};
    case 1: return {"bhsd", {h * s * d, d, s * d, 1}, b * s * h * d};
    case 2: {  // a slice of a fused QKV [b, s, 3h, d] buffer (the k part)
      return {"fused-qkv", {s * 3 * h * d, 3 * h * d, d, 1}, b * s * 3 * h * d};
    }
    default:  // head_dim not contiguous (stride 2): the strided scalar path
      return {"strided-d", {s * h * 2 * d, h * 2 * d, 2 * d, 2}, b * s * h * 2 * d};
  }
}

struct SweepCase {
  DType dtype;
  Pairing pairing;
  bool table;
  bool in_place;
  int64_t head_dim;
  int64_t rotary_dim;
  int64_t seq;
  int lanes;
  int64_t misalign;
  int64_t guard = 19;  ///< elements before and after the view
};

std::string fmt_case(const SweepCase& c) {
  static const char* layouts[] = {"bshd", "bhsd", "fused-qkv", "strided-d"};
  return std::string(to_string(c.dtype)) + " " + std::string(to_string(c.pairing)) +
         (c.table ? " table" : " on-the-fly") + (c.in_place ? " in-place" : " out-of-place") +
         " head_dim " + std::to_string(c.head_dim) + " rotary_dim " + std::to_string(c.rotary_dim) +
         " seq " + std::to_string(c.seq) + " " + layouts[c.lanes] + " misalign " +
         std::to_string(c.misalign) + " target " + hwy::TargetName(hwy::SupportedTargets() & -hwy::SupportedTargets());
}

// Runs one case through the CPU kernels and the reference; compares; checks guards and poison.
void run_case(const SweepCase& c, uint64_t seed) {
  const int64_t batch = 2, heads = 3;
  Spec spec{.head_dim = c.head_dim, .rotary_dim = c.rotary_dim, .pairing = c.pairing,
            .schedule = ScheduleType::yarn, .factor = 4.0, .original_max_position = 4096};
  const Schedule schedule = make_schedule(spec);
  std::vector<int64_t> positions;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> any(0, max_position_limit - 1);
  for (int64_t t = 0; t < batch * c.seq; ++t) positions.push_back(t % 3 == 0 ? t : any(rng));
  const Table table = Table::at(schedule, positions);
  const ChannelLayout lanes = make_layout(c.lanes, batch, c.seq, heads, c.head_dim);
  const int64_t base_offset = c.lanes == 2 ? heads * c.head_dim : 0;
  const int64_t guard = c.guard;
  Buffer input(c.dtype, lanes.extent, guard, c.misalign);
  const std::vector<float> values = test::random_floats(static_cast<size_t>(lanes.extent), seed, 2.0f);
  for (int64_t i = 0; i < lanes.extent; ++i) input.set(i, values[static_cast<size_t>(i)]);
  Buffer fast_in = input, ref_in = input;
  Buffer fast_out(c.dtype, lanes.extent, guard, c.misalign), ref_out(c.dtype, lanes.extent, guard, c.misalign);
  auto view = [&](Buffer& buffer) {
    return TensorView{.data = static_cast<unsigned char*>(buffer.data()) + base_offset * size_of(c.dtype),
                      .dtype = c.dtype, .shape = {batch, c.seq, heads, c.head_dim}, .strides = lanes.strides};
  };
  ApplyArgs fast{.q = view(fast_in), .positions = Positions::per_token(positions),
                 .table = c.table ? &table : nullptr, .backend = Backend::cpu};
  ApplyArgs ref = fast;
  ref.q = view(ref_in);
  ref.backend = Backend::reference;
  if (!c.in_place) {
    fast.q_out = view(fast_out);
    ref.q_out = view(ref_out);
  }
  apply(schedule, fast);
  apply(schedule, ref);
  Buffer& got = c.in_place ? fast_in : fast_out;
  Buffer& want = c.in_place ? ref_in : ref_out;
  const std::string where = fmt_case(c);
  // Every byte: identical for the table path (and untouched bytes, guards, poison alike).
  if (c.table) {
    ASSERT_EQ(got.bytes, want.bytes) << where;
  }
  // Element-wise within the on-the-fly bound, by (batch, token, head, channel).
  const int64_t h = c.rotary_dim / 2;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < c.seq; ++s)
      for (int64_t hd = 0; hd < heads; ++hd)
        for (int64_t i = 0; i < h; ++i) {
          const int64_t base = base_offset + b * lanes.strides[0] + s * lanes.strides[1] + hd * lanes.strides[2];
          const int64_t ia = base + (c.pairing == Pairing::interleaved ? 2 * i : i) * lanes.strides[3];
          const int64_t ib = base + (c.pairing == Pairing::interleaved ? 2 * i + 1 : i + h) * lanes.strides[3];
          const double bound = kOnTheFlyPairBound * schedule.attention_factor *
                               (std::fabs(input.get(ia)) + std::fabs(input.get(ib)));
          // 16-bit storage: the two f32 results may round to neighbouring 16-bit values.
          const double narrow = c.dtype == DType::bf16 ? 0x1p-8 : c.dtype == DType::f16 ? 0x1p-11 : 0.0;
          for (int64_t e : {ia, ib}) {
            const double allowed = bound + narrow * std::fabs(want.get(e));
            ASSERT_LE(std::fabs(got.get(e) - want.get(e)), allowed)
                << where << " batch " << b << " token " << s << " head " << hd << " element " << e;
          }
        }
  // Tail channels and every element of the view: identical to the reference, never poison.
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < c.seq; ++s)
      for (int64_t hd = 0; hd < heads; ++hd)
        for (int64_t j = 0; j < c.head_dim; ++j) {
          const int64_t e = base_offset + b * lanes.strides[0] + s * lanes.strides[1] +
                            hd * lanes.strides[2] + j * lanes.strides[3];
          const int64_t byte = (guard + c.misalign + e) * size_of(c.dtype);
          ASSERT_FALSE(got.is_poison_at_offset(byte)) << where << " unwritten element " << e;
          if (j >= c.rotary_dim) {
            ASSERT_EQ(std::memcmp(&got.bytes[byte], &input.bytes[byte], size_of(c.dtype)), 0)
                << where << " tail channel " << j;
          }
        }
  // Guards: nothing written outside the view.
  const int64_t es = size_of(c.dtype);
  for (int64_t i = 0; i < guard + c.misalign; ++i) {
    ASSERT_TRUE(got.is_poison_at_offset(i * es)) << where << " front guard";
  }
  const int64_t end = (guard + c.misalign + lanes.extent) * es;
  for (int64_t i = end; i < static_cast<int64_t>(got.bytes.size()); i += es) {
    ASSERT_TRUE(got.is_poison_at_offset(i)) << where << " back guard";
  }
}

}  // namespace
}  // namespace rotary

namespace rotary {
namespace {

// The sweep: head_dim 2..256 (pair counts 1, 3, 7, 9, 17, 32, 40, 48, 64, 96, 128 straddle every
// vector width), partial rotary, token counts around the lane counts, layouts, misalignment.
TEST_P(CpuKernels, MatchReferenceEverywhere) {
  const std::vector<std::pair<int64_t, int64_t>> dims = {
      {2, 2}, {6, 6}, {14, 14}, {18, 18}, {34, 34}, {64, 64}, {80, 80}, {96, 96}, {128, 128},
      {192, 192}, {256, 256}, {80, 32}, {128, 64}, {96, 14}, {6, 2}};
  int cases = 0;
  uint64_t seed = 1;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (Pairing pairing : {Pairing::half, Pairing::interleaved}) {
      for (const auto& [d, r] : dims) {
        for (int variant = 0; variant < 4; ++variant) {
          SweepCase c{.dtype = dtype, .pairing = pairing, .table = (variant & 1) != 0,
                      .in_place = (variant & 2) != 0, .head_dim = d, .rotary_dim = r,
                      .seq = static_cast<int64_t>(1 + (seed % 9)), .lanes = static_cast<int>(seed % 4),
                      .misalign = static_cast<int64_t>(seed % 3)};
          run_case(c, seed++);
          if (HasFatalFailure()) return;
          ++cases;
        }
      }
    }
  }
  // Token counts around vector widths, every lanes, both sources, at one head size.
  for (int64_t seq : {1, 2, 3, 6, 7, 8, 9, 10, 15, 16, 17, 33, 66}) {
    for (int lanes = 0; lanes < 4; ++lanes) {
      for (bool table : {false, true}) {
        run_case({.dtype = DType::f32, .pairing = Pairing::interleaved, .table = table, .in_place = false,
                  .head_dim = 40, .rotary_dim = 36, .seq = seq, .lanes = lanes, .misalign = 1}, seed++);
        run_case({.dtype = DType::bf16, .pairing = Pairing::half, .table = table, .in_place = true,
                  .head_dim = 40, .rotary_dim = 40, .seq = seq, .lanes = lanes, .misalign = 0}, seed++);
        if (HasFatalFailure()) return;
        cases += 2;
      }
    }
  }
  EXPECT_GT(cases, 500);
}

// Out of place into large outputs the vector bodies store non-temporally (RowArgs::stream); forced
// here for every size. Aligned views take the streaming stores, misaligned ones fall back; both
// give the reference's bytes and touch nothing outside the view.
TEST_P(CpuKernels, NonTemporalStoresMatchTheReference) {
  const detail::ScopedMinBytes every_call(detail::Threshold::stream, 0);
  const int64_t streamed_before = detail::streamed_call_count();
  const std::vector<std::pair<int64_t, int64_t>> dims = {{128, 128}, {64, 64}, {96, 96}, {80, 32}, {128, 64}, {34, 34}};
  uint64_t seed = 500;
  int cases = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (Pairing pairing : {Pairing::half, Pairing::interleaved}) {
      for (const auto& [d, r] : dims) {
        for (int lanes = 0; lanes < 4; ++lanes) {
          for (int64_t misalign : {0, 1}) {
            run_case({.dtype = dtype, .pairing = pairing, .table = (seed & 1) != 0, .in_place = false,
                      .head_dim = d, .rotary_dim = r, .seq = static_cast<int64_t>(1 + seed % 5),
                      .lanes = lanes, .misalign = misalign, .guard = 64}, seed);
            ++seed;
            if (HasFatalFailure()) return;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 2 * 6 * 4 * 2);
  EXPECT_EQ(detail::streamed_call_count() - streamed_before, cases);  // every CPU call streamed
}

// Calls that stream from memory prefetch a later token's rows as they go (RowArgs::prefetch_in,
// prefetch_out); forced here for every size, with and without streaming stores: every layout (a
// head-major one, a slice of a fused QKV buffer, batch boundaries within the prefetch distance),
// in and out of place, partial rotary with its tail copied, gives the reference's bytes and touches
// nothing outside the view.
TEST_P(CpuKernels, PrefetchingCallsMatchTheReference) {
  const detail::ScopedMinBytes every_call(detail::Threshold::prefetch, 0);
  const int64_t prefetched_before = detail::prefetched_call_count();
  const int64_t distances_before = detail::prefetch_distance_count();
  const std::vector<std::pair<int64_t, int64_t>> dims = {{128, 128}, {64, 64}, {80, 32}, {128, 64}, {34, 34}, {6, 2}};
  uint64_t seed = 900;
  int cases = 0;
  for (bool stream : {false, true}) {
    const detail::ScopedMinBytes streams(detail::Threshold::stream, stream ? 0 : int64_t{1} << 62);
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      for (Pairing pairing : {Pairing::half, Pairing::interleaved}) {
        for (const auto& [d, r] : dims) {
          for (int lanes = 0; lanes < 4; ++lanes) {
            run_case({.dtype = dtype, .pairing = pairing, .table = (seed & 1) != 0, .in_place = (seed & 2) != 0,
                      .head_dim = d, .rotary_dim = r, .seq = static_cast<int64_t>(1 + seed % 13), .lanes = lanes,
                      .misalign = static_cast<int64_t>(seed % 2), .guard = 64}, seed);
            ++seed;
            if (HasFatalFailure()) return;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 2 * 4 * 2 * 6 * 4);
  EXPECT_EQ(detail::prefetched_call_count() - prefetched_before, cases);  // every CPU call chose to
  // and the rows were given distances to prefetch by (contiguous channels, a later token in reach)
  EXPECT_GT(detail::prefetch_distance_count() - distances_before, cases);
}

TEST_P(CpuKernels, SixteenBitResultsAreTheF32ResultRoundedOnce) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (Pairing pairing : {Pairing::half, Pairing::interleaved}) {
      for (bool table : {false, true}) {
        const Schedule s = make_schedule(Spec{.head_dim = 72, .rotary_dim = 64, .pairing = pairing});
        const int64_t n = 3 * 11 * 4 * 72;
        std::vector<float> wide = test::random_floats(static_cast<size_t>(n), 77, 4.0f);
        std::vector<uint16_t> narrow(wide.size());
        for (size_t j = 0; j < wide.size(); ++j) {
          narrow[j] = dtype == DType::f16 ? detail::f32_to_f16(wide[j]) : detail::f32_to_bf16(wide[j]);
          wide[j] = dtype == DType::f16 ? detail::f16_to_f32(narrow[j]) : detail::bf16_to_f32(narrow[j]);
        }
        const Table t = Table::range(s, 1000, 11);
        apply(s, {.q = TensorView::bshd(wide.data(), DType::f32, 3, 11, 4, 72),
                  .positions = Positions::sequential(1000), .table = table ? &t : nullptr});
        apply(s, {.q = TensorView::bshd(narrow.data(), dtype, 3, 11, 4, 72),
                  .positions = Positions::sequential(1000), .table = table ? &t : nullptr});
        for (size_t j = 0; j < narrow.size(); ++j) {
          ASSERT_EQ(narrow[j], dtype == DType::f16 ? detail::f32_to_f16(wide[j]) : detail::f32_to_bf16(wide[j]))
              << to_string(dtype) << " element " << j;
        }
      }
    }
  }
}

// Zeros, infinities, NaN, subnormals and values near each format's overflow, through the vector
// bodies and their tails: every non-NaN output bit-identical to the reference, NaN where it has NaN.
TEST_P(CpuKernels, SpecialValuesMatchTheReference) {
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -3e-39f, 0x1p-126f,
                            6.0e-8f, -5.9e-5f, 65504.0f, -65000.0f, 3.3e38f, -3.0e38f, 1.0f, -2.5f};
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (Pairing pairing : {Pairing::half, Pairing::interleaved}) {
      for (bool table : {false, true}) {
        const int64_t d = 200, heads = 3, seq = 4;  // 100 pairs: full vectors and a tail everywhere
        const Schedule s = make_schedule(Spec{.head_dim = d, .pairing = pairing, .schedule = ScheduleType::yarn,
                                              .factor = 2.0, .original_max_position = 1024});
        const std::vector<int64_t> positions = {0, 1, 77777, max_position_limit - 1};
        const Table t = Table::at(s, positions);
        const int64_t n = seq * heads * d;
        Buffer fast(dtype, n, 0, 0);
        std::mt19937_64 rng(static_cast<uint64_t>(n));
        for (int64_t i = 0; i < n; ++i) fast.set(i, specials[rng() % std::size(specials)]);
        Buffer ref = fast;
        for (auto [buffer, backend] : {std::pair{&fast, Backend::cpu}, std::pair{&ref, Backend::reference}}) {
          apply(s, {.q = TensorView::bshd(buffer->data(), dtype, 1, seq, heads, d),
                    .positions = Positions::per_token(positions), .table = table ? &t : nullptr, .backend = backend});
        }
        const int64_t es = size_of(dtype);
        for (int64_t i = 0; i < n; ++i) {
          const double got = fast.get(i), want = ref.get(i);
          if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(got)) << to_string(dtype) << " element " << i;
          } else {
            ASSERT_EQ(std::memcmp(&fast.bytes[static_cast<size_t>(i * es)], &ref.bytes[static_cast<size_t>(i * es)],
                                  static_cast<size_t>(es)), 0)
                << to_string(dtype) << " " << to_string(pairing) << (table ? " table" : " on-the-fly")
                << " element " << i << " got " << got << " want " << want;
          }
        }
      }
    }
  }
}

// The caller's own cos/sin may hold float32 NaNs with payload bits anywhere: the bf16 bodies round
// them NaN-safely (bf16_lanes-inl.h), so a NaN angle gives NaN, as the reference does, never a carry
// into the sign (a NaN of 0x7fffffff once came out as -0.0). Every non-NaN output equal to the
// reference's, every target, both pairings, tails.
TEST_P(CpuKernels, CallersNaNAnglesWithPayloadBitsGiveNaN) {
  const uint32_t nans[] = {0x7fffffffu, 0xffffffffu, 0x7f800001u, 0x7fc08001u, 0xffc0ffffu, 0x7fbfffffu};
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (Pairing pairing : {Pairing::half, Pairing::interleaved}) {
      const int64_t d = 200, heads = 3, seq = 4, pairs = d / 2;  // 100 pairs: vectors and a tail
      const Schedule s = make_schedule(Spec{.head_dim = d, .pairing = pairing});
      std::vector<float> cos(static_cast<size_t>(seq * pairs)), sin(cos.size());
      std::mt19937_64 rng(7);
      std::uniform_real_distribution<float> angle(0.0f, 6.28f);
      for (size_t i = 0; i < cos.size(); ++i) {
        cos[i] = std::cos(angle(rng));
        sin[i] = std::sin(angle(rng));
        if (rng() % 5 == 0) std::memcpy(&(rng() % 2 == 0 ? cos : sin)[i], &nans[rng() % std::size(nans)], 4);
      }
      const CallerAngles caller{.index = CallerAngles::Index::per_token, .columns = CallerAngles::Columns::pairs,
                                .cos = cos.data(), .sin = sin.data(), .shape = {1, seq, pairs},
                                .cos_strides = {seq * pairs, pairs, 1}, .sin_strides = {seq * pairs, pairs, 1}};
      const int64_t n = seq * heads * d;
      Buffer fast(dtype, n, 0, 0);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int64_t i = 0; i < n; ++i) fast.set(i, normal(rng));
      Buffer ref = fast;
      for (auto [buffer, backend] : {std::pair{&fast, Backend::cpu}, std::pair{&ref, Backend::reference}}) {
        apply(s, {.q = TensorView::bshd(buffer->data(), dtype, 1, seq, heads, d), .caller_angles = &caller,
                  .backend = backend});
      }
      const int64_t es = size_of(dtype);
      int64_t nan_outputs = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double got = fast.get(i), want = ref.get(i);
        if (std::isnan(want)) {
          ++nan_outputs;
          ASSERT_TRUE(std::isnan(got)) << to_string(dtype) << " " << to_string(pairing) << " element " << i
                                       << " got " << got;
        } else {
          ASSERT_EQ(std::memcmp(&fast.bytes[static_cast<size_t>(i * es)], &ref.bytes[static_cast<size_t>(i * es)],
                                static_cast<size_t>(es)), 0)
              << to_string(dtype) << " " << to_string(pairing) << " element " << i << " got " << got << " want "
              << want;
        }
      }
      EXPECT_GT(nan_outputs, n / 10) << "the NaN angles reach the outputs";
    }
  }
}

// On-the-fly float angles (the vectorised row a Table is also filled with) against the scalar exact
// angle the reference uses (exact_cos_sin, src/math/exact_angle.hpp: CosSinLanes's operations one
// for one), times the factor and rounded once: the same bits for every value, on every target.
TEST_P(CpuKernels, OnTheFlyFloatAnglesAreTheScalarExactAngles) {
  int64_t values = 0, differing = 0;
  for (const Spec& spec : {Spec{.head_dim = 128, .base = 500000}, Spec{.head_dim = 100, .base = 1e6,
                           .schedule = ScheduleType::yarn, .factor = 8.0, .original_max_position = 4096}}) {
    const Schedule s = make_schedule(spec);
    std::vector<int64_t> positions = {0, 1, 131071, max_position_limit - 1};
    for (int64_t p : test::near_quarter_turns(s.inv_freq[0], max_position_limit)) positions.push_back(p);
    std::mt19937_64 rng(17);
    std::uniform_int_distribution<int64_t> any(0, max_position_limit - 1);
    for (int i = 0; i < 5000; ++i) positions.push_back(any(rng));
    const int64_t h = s.pairs();
    std::vector<float> c(static_cast<size_t>(h)), sn(static_cast<size_t>(h)), tc(c), ts(c);
    for (int64_t p : positions) {
      table_row(s, p, tc.data(), ts.data());
      for (float sign : {1.0f, -1.0f}) {
        detail::cos_sin_row_f32(static_cast<double>(p), nullptr, s.inv_freq.data(), h, s.attention_factor, sign, c.data(), sn.data());
        for (int64_t i = 0; i < h; ++i) {
          const size_t u = static_cast<size_t>(i);
          const CosSin e = exact_cos_sin(p, s.inv_freq[u]);
          const float want_c = static_cast<float>(e.cos * s.attention_factor);
          const float want_s = sign * static_cast<float>(e.sin * s.attention_factor);
          for (auto [got, want] : {std::pair{c[u], want_c}, std::pair{sn[u], want_s}, std::pair{tc[u], want_c},
                                   std::pair{sign * ts[u], want_s}}) {
            if (std::bit_cast<uint32_t>(got) != std::bit_cast<uint32_t>(want)) {
              ADD_FAILURE() << "position " << p << " pair " << i << ": " << got << " vs " << want;
              if (++differing > 10) return;
            }
            ++values;
          }
        }
      }
    }
  }
  EXPECT_EQ(differing, 0) << "of " << values;
}

TEST_P(CpuKernels, VectorisedAnglesMatchMpfr) {
  // cos_sin_row's doubles against MPFR: the same relative bound as exact_cos_sin's test.
  const Schedule s = make_schedule(Spec{.head_dim = 256, .base = 500000});
  std::vector<int64_t> positions = {0, 1, 2, 7, 131071, max_position_limit - 1};
  for (int64_t p : test::near_quarter_turns(1.0, max_position_limit)) positions.push_back(p);
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int64_t> any(0, max_position_limit - 1);
  for (int i = 0; i < 300; ++i) positions.push_back(any(rng));
  std::vector<double> c(128), sn(128);
  double worst = 0;
  for (int64_t p : positions) {
    for (int64_t pairs : {int64_t{128}, int64_t{5}}) {  // full vectors and a padded tail
      detail::cos_sin_row(static_cast<double>(p), nullptr, s.inv_freq.data(), pairs, 1.0, c.data(), sn.data());
      for (int64_t i = 0; i < pairs; ++i) {
        const test::Exact e = test::mpfr_cos_sin(p, s.inv_freq[static_cast<size_t>(i)]);
        const double ec = std::fabs(c[i] - e.cos) / (0x1p-51 * std::fabs(e.cos) + 0x1p-90);
        const double es = std::fabs(sn[i] - e.sin) / (0x1p-51 * std::fabs(e.sin) + 0x1p-90);
        worst = std::max({worst, ec, es});
        ASSERT_LE(ec, 1.0) << "cos position " << p << " pair " << i;
        ASSERT_LE(es, 1.0) << "sin position " << p << " pair " << i;
      }
    }
  }
  std::printf("worst vectorised angle error: %.3f of the bound\n", worst);
}

TEST_P(CpuKernels, BitIdenticalForAnyThreadCount) {
  struct Shape { int64_t b, s, hq, hk, d; };
  // a prefill slice, a batched decode, and one decode token wide enough to split heads
  for (Shape shape : {Shape{2, 64, 8, 2, 128}, Shape{64, 1, 32, 8, 128}, Shape{1, 1, 64, 16, 1024}}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (bool table : {false, true}) {
        const Schedule s = make_schedule(Spec{.head_dim = shape.d, .pairing = Pairing::interleaved});
        std::vector<int64_t> positions;
        for (int64_t t = 0; t < shape.b * shape.s; ++t) positions.push_back((t * 7919 + 12345) % 200000);  // never 0: a zero angle changes nothing
        const Table tab = Table::at(s, positions);
        const int64_t es = size_of(dtype);
        const std::vector<float> qf = test::random_floats(static_cast<size_t>(shape.b * shape.s * shape.hq * shape.d), 5);
        const std::vector<float> kf = test::random_floats(static_cast<size_t>(shape.b * shape.s * shape.hk * shape.d), 6);
        std::vector<unsigned char> q0(qf.size() * es), k0(kf.size() * es);
        for (size_t j = 0; j < qf.size(); ++j) {
          if (dtype == DType::f32) std::memcpy(&q0[j * 4], &qf[j], 4);
          else { const uint16_t h = detail::f32_to_bf16(qf[j]); std::memcpy(&q0[j * 2], &h, 2); }
        }
        for (size_t j = 0; j < kf.size(); ++j) {
          if (dtype == DType::f32) std::memcpy(&k0[j * 4], &kf[j], 4);
          else { const uint16_t h = detail::f32_to_bf16(kf[j]); std::memcpy(&k0[j * 2], &h, 2); }
        }
        std::vector<unsigned char> q1, k1;
        for (int threads : {1, 2, 3, 7, max_threads}) {
          std::vector<unsigned char> q = q0, k = k0;
          apply(s, {.q = TensorView::bshd(q.data(), dtype, shape.b, shape.s, shape.hq, shape.d),
                    .k = TensorView::bshd(k.data(), dtype, shape.b, shape.s, shape.hk, shape.d),
                    .positions = Positions::per_token(positions), .table = table ? &tab : nullptr,
                    .threads = threads});
          if (threads == 1) {
            q1 = q;
            k1 = k;
            ASSERT_NE(q, q0);
          } else {
            ASSERT_EQ(q, q1) << "threads " << threads;
            ASSERT_EQ(k, k1) << "threads " << threads;
          }
        }
      }
    }
  }
}

// Every OpenMP team is cut to what can help: processors and blocks, never what was asked blindly.
TEST(CpuThreads, TeamNeverExceedsProcessorsOrBlocks) {
  const int processors = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_LE(detail::useful_threads(max_threads, int64_t{1} << 40), processors);
  EXPECT_LE(detail::useful_threads(100000, int64_t{1} << 40), std::min(processors, max_threads));
  EXPECT_LE(detail::useful_threads(0, int64_t{1} << 40), processors);
  EXPECT_EQ(detail::useful_threads(max_threads, 1), 1);
  EXPECT_EQ(detail::useful_threads(max_threads, 0), 1);
  EXPECT_EQ(detail::useful_threads(1, int64_t{1} << 40), 1);
  EXPECT_LE(detail::useful_threads(3, 2), 2);
  EXPECT_GE(detail::useful_threads(3, 2), 1);
}

}  // namespace
}  // namespace rotary
