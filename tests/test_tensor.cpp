// Views: factories, and the aliasing analysis that guards every write.
#include "memory.hpp"
#include "rotary/tensor.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

using detail::may_overlap;
using detail::self_overlaps;
using detail::byte_span;
using detail::byte_span_checked;
using detail::bytes_view;
using detail::spans_meet;

TEST(TensorView, Factories) {
  float x[1];
  const TensorView a = TensorView::bshd(x, DType::f32, 2, 3, 4, 5);
  EXPECT_EQ(a.strides, (std::array<int64_t, 4>{60, 20, 5, 1}));
  const TensorView b = TensorView::bhsd(x, DType::bf16, 2, 4, 3, 5);
  EXPECT_EQ(b.shape, (std::array<int64_t, 4>{2, 3, 4, 5}));
  EXPECT_EQ(b.strides, (std::array<int64_t, 4>{60, 5, 15, 1}));
  EXPECT_EQ(size_of(DType::f16), 2);
  EXPECT_EQ(size_of(DType::f64), 8);
  EXPECT_EQ(to_string(DType::bf16), "bf16");
}

TEST(TensorView, FactoriesAndElementsRefuseOverflow) {
  constexpr int64_t kMax = INT64_MAX;
  float x[1];
  EXPECT_ROTARY_ERROR(TensorView::bshd(x, DType::f32, 1, kMax, 2, 64),
                      "TensorView::bshd: seq*heads*head_dim=9223372036854775807*2*64 overflows int64");
  EXPECT_ROTARY_ERROR(TensorView::bshd(x, DType::f32, 1, 0, kMax, 64),
                      "TensorView::bshd: heads*head_dim=9223372036854775807*64 overflows int64");
  EXPECT_ROTARY_ERROR(TensorView::bhsd(x, DType::f32, 1, 2, kMax, 64),
                      "TensorView::bhsd: heads*seq*head_dim=2*9223372036854775807*64 overflows int64");
  EXPECT_ROTARY_ERROR(TensorView::bhsd(x, DType::f32, 1, 0, kMax, 64),
                      "TensorView::bhsd: seq*head_dim=9223372036854775807*64 overflows int64");
  // A zero extent makes every product it enters 0, whatever the others.
  const TensorView empty = TensorView::bshd(nullptr, DType::f32, kMax, 0, 1, 64);
  EXPECT_EQ(empty.strides, (std::array<int64_t, 4>{0, 64, 64, 1}));
  EXPECT_EQ(TensorView::bhsd(nullptr, DType::f32, kMax, 0, 1, 64).strides, (std::array<int64_t, 4>{0, 64, 64, 1}));
  EXPECT_EQ(empty.elements(), 0);
  EXPECT_EQ((TensorView{.shape = {kMax, kMax, kMax, 0}}).elements(), 0);
  EXPECT_EQ(TensorView::bshd(x, DType::f32, 2, 3, 4, 5).elements(), 120);
  EXPECT_ROTARY_ERROR((TensorView{.shape = {kMax, 2, 1, 1}}).elements(),
                      "shape [9223372036854775807, 2, 1, 1] has more than 2^63 elements");
}

TEST(TensorView, AbsentEmptyAndSet) {
  float x[1];
  EXPECT_FALSE(TensorView{}.is_set());
  EXPECT_TRUE(TensorView{}.is_empty());
  // torch's empty tensor: data null, a real shape. Set, and empty.
  const TensorView torch_empty{.data = nullptr, .shape = {2, 0, 8, 64}};
  EXPECT_TRUE(torch_empty.is_set());
  EXPECT_TRUE(torch_empty.is_empty());
  const TensorView full = TensorView::bshd(x, DType::f32, 1, 1, 1, 1);
  EXPECT_TRUE(full.is_set());
  EXPECT_FALSE(full.is_empty());
  EXPECT_TRUE((TensorView{.data = x}).is_set());  // data but no shape: set (and empty)
}

TEST(TensorView, PositionsAccessors) {
  const std::vector<int32_t> p32 = {5, 6, 7, 8};
  const std::vector<int64_t> p64 = {9, 10};
  EXPECT_EQ(Positions::sequential(100).at(3, 3), 103);
  EXPECT_EQ(Positions::per_token(p32).at(2, 0), 7);
  EXPECT_EQ(Positions::per_token(p64).at(1, 1), 10);
  EXPECT_EQ(Positions::per_token(p32).count, 4);
}

// Brute force: enumerate both element sets.
bool brute_overlap(const TensorView& a, const TensorView& b) {
  std::vector<intptr_t> ea, eb;
  auto collect = [](const TensorView& v, std::vector<intptr_t>& out) {
    for (int64_t i = 0; i < v.shape[0]; ++i)
      for (int64_t j = 0; j < v.shape[1]; ++j)
        for (int64_t k = 0; k < v.shape[2]; ++k)
          for (int64_t l = 0; l < v.shape[3]; ++l)
            out.push_back(reinterpret_cast<intptr_t>(v.data) +
                          (i * v.strides[0] + j * v.strides[1] + k * v.strides[2] + l * v.strides[3]) *
                              size_of(v.dtype));
  };
  collect(a, ea);
  collect(b, eb);
  std::sort(ea.begin(), ea.end());
  for (intptr_t e : eb)
    if (std::binary_search(ea.begin(), ea.end(), e)) return true;
  return false;
}

TEST(Aliasing, ExactForEqualStridesAgainstBruteForce) {
  std::vector<float> buffer(4096);
  std::mt19937_64 rng(3);
  int overlapping = 0, disjoint = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::uniform_int_distribution<int64_t> ext(1, 4);
    TensorView a{.data = buffer.data() + 1500, .dtype = DType::f32,
                 .shape = {ext(rng), ext(rng), ext(rng), ext(rng)}, .strides = {}};
    // nested strides in a random order, random signs
    std::array<int, 4> order{0, 1, 2, 3};
    std::shuffle(order.begin(), order.end(), rng);
    int64_t stride = 1;
    for (int d : order) {
      stride += std::uniform_int_distribution<int64_t>(0, 2)(rng);
      a.strides[static_cast<size_t>(d)] = (rng() & 1) ? stride : -stride;
      stride *= a.shape[static_cast<size_t>(d)];
    }
    TensorView b = a;
    b.shape = {ext(rng), ext(rng), ext(rng), ext(rng)};
    b.data = buffer.data() + 1500 + std::uniform_int_distribution<int64_t>(-300, 300)(rng);
    const bool truth = brute_overlap(a, b);
    if (self_overlaps(a) || self_overlaps(b)) continue;
    ASSERT_EQ(may_overlap(a, b), truth) << "trial " << trial;
    (truth ? overlapping : disjoint)++;
  }
  EXPECT_GT(overlapping, 100);
  EXPECT_GT(disjoint, 100);
}

// Row-major dense views (every framework's usual tensor) are answered from their element count
// alone: the answers must be the brute-force truth, and the general rule's for the same elements
// (a twin whose unit dimensions carry other strides, which the general rule ignores).
TEST(Aliasing, DenseViewsAgainstBruteForceAndTheGeneralRule) {
  using detail::exceeds_max_view_bytes;
  std::vector<float> buffer(4096);
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int64_t> ext(1, 4);
  const auto dense = [&](float* data) {
    TensorView v{.data = data, .dtype = DType::f32, .shape = {ext(rng), ext(rng), ext(rng), ext(rng)}, .strides = {}};
    v.strides = {v.shape[1] * v.shape[2] * v.shape[3], v.shape[2] * v.shape[3], v.shape[3], 1};
    return v;
  };
  const auto twin = [](TensorView v) {  // the same elements, not dense (when some dimension is 1)
    for (size_t d = 0; d < 4; ++d) {
      if (v.shape[d] == 1) v.strides[d] = 7777 + static_cast<int64_t>(d);
    }
    return v;
  };
  int overlapping = 0, disjoint = 0, twins = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const TensorView a = dense(buffer.data() + 1500);
    const TensorView b = dense(buffer.data() + 1500 + std::uniform_int_distribution<int64_t>(-300, 300)(rng));
    const bool truth = brute_overlap(a, b);
    ASSERT_FALSE(self_overlaps(a)) << "trial " << trial;
    ASSERT_EQ(may_overlap(a, b), truth) << "trial " << trial;
    ASSERT_EQ(may_overlap(b, a), truth) << "trial " << trial;
    const TensorView ta = twin(a);
    if (ta.strides != a.strides) {
      ++twins;
      ASSERT_FALSE(self_overlaps(ta)) << "trial " << trial;
      ASSERT_EQ(may_overlap(ta, b), truth) << "trial " << trial;
      ASSERT_EQ(exceeds_max_view_bytes(ta), exceeds_max_view_bytes(a)) << "trial " << trial;
    }
    (truth ? overlapping : disjoint)++;
  }
  EXPECT_GT(overlapping, 100);
  EXPECT_GT(disjoint, 100);
  EXPECT_GT(twins, 1000);
  // The span bound at its edge, dense and general: 2^58 f32 elements are 2^60 bytes (refused),
  // one row fewer is not; element counts past int64 are refused without overflow.
  float* p = buffer.data();
  const auto view = [&](std::array<int64_t, 4> shape) {
    TensorView v{.data = p, .dtype = DType::f32, .shape = shape, .strides = {}};
    v.strides = {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1};
    return v;
  };
  const int64_t k20 = int64_t{1} << 20, k18 = int64_t{1} << 18;
  EXPECT_TRUE(exceeds_max_view_bytes(view({1, k20, k20, k18})));
  EXPECT_TRUE(exceeds_max_view_bytes(twin(view({1, k20, k20, k18}))));
  EXPECT_FALSE(exceeds_max_view_bytes(view({1, k20, k20 - 1, k18})));
  EXPECT_FALSE(exceeds_max_view_bytes(twin(view({1, k20, k20 - 1, k18}))));
  const int64_t k31 = int64_t{1} << 31;
  EXPECT_TRUE(exceeds_max_view_bytes(TensorView{.data = p, .dtype = DType::f32, .shape = {k31, k31, k31, 2},
                                                .strides = {INT64_MAX, k31 * 2, 2, 1}}));
}

// Views of different strides over the same token rows (fused QKV's q, k and v column slices, with
// their own head counts and widths, a cache's rows beside each other): when each view's rows are one
// progression of a common pitch and fit in it, the answer is exact; otherwise it may only err
// towards "overlap". Against the brute force, both ways round, with random batch/seq splits,
// head strides, negative strides and offsets.
TEST(Aliasing, RowsOfOnePitchAgainstBruteForce) {
  std::vector<float> buffer(8192);
  std::mt19937_64 rng(11);
  int exact = 0, overlapping = 0, disjoint = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    std::uniform_int_distribution<int64_t> small(1, 4);
    const int64_t tokens_a = small(rng) * small(rng), pitch = std::uniform_int_distribution<int64_t>(8, 48)(rng);
    const auto rows_view = [&](int64_t tokens, int64_t column) {
      TensorView v{.data = buffer.data() + 3000 + column, .dtype = DType::f32, .shape = {}, .strides = {}};
      const int64_t seq = (tokens % 2 == 0 && (rng() & 1)) ? tokens / 2 : tokens;
      const int64_t heads = small(rng), dim = small(rng);
      const int64_t head_stride = dim + std::uniform_int_distribution<int64_t>(0, 2)(rng);
      v.shape = {tokens / seq, seq, heads, dim};
      v.strides = {seq * pitch, pitch, head_stride, 1};
      if (rng() % 8 == 0) {  // rows in reverse: the same set of row starts
        v.data = static_cast<float*>(v.data) + (v.shape[1] - 1) * pitch;
        v.strides[1] = -pitch;
        v.strides[0] = v.shape[0] > 1 ? seq * pitch : 0;
      }
      if (rng() % 16 == 0) v.strides[0] += 1;  // batch rows off the progression: conservative
      return v;
    };
    const TensorView a = rows_view(tokens_a, std::uniform_int_distribution<int64_t>(0, pitch)(rng));
    const int64_t tokens_b = (rng() & 3) == 0 ? small(rng) : tokens_a;
    const TensorView b = rows_view(tokens_b, std::uniform_int_distribution<int64_t>(-pitch, 2 * pitch)(rng));
    if (self_overlaps(a) || self_overlaps(b)) continue;
    const bool truth = brute_overlap(a, b);
    const bool said = may_overlap(a, b);
    ASSERT_EQ(may_overlap(b, a), said) << "trial " << trial;
    if (truth) {
      ASSERT_TRUE(said) << "trial " << trial << ": an overlap reported disjoint";
      // The fused ops' prefilter: spans that do not meet are never taken for an overlap's.
      ASSERT_TRUE(spans_meet(byte_span_checked(a), byte_span_checked(b))) << "trial " << trial;
      ASSERT_TRUE(spans_meet(byte_span(a), byte_span(b))) << "trial " << trial;
    }
    (truth ? overlapping : disjoint)++;
    if (said == truth) ++exact;
  }
  EXPECT_GT(overlapping, 300);
  EXPECT_GT(disjoint, 300);
  EXPECT_GT(exact, 3000);  // conservative only off the progression or past the pitch
  // Fused QKV [tokens, 2 * 64 + 2 * 64 + 2 * 24] f32: q, k and v of another head_dim are disjoint.
  const int64_t row = 2 * 64 + 2 * 64 + 2 * 24;
  const auto slice = [&](int64_t column, int64_t heads, int64_t dim) {
    return TensorView{.data = buffer.data() + column, .dtype = DType::f32, .shape = {1, 5, heads, dim},
                      .strides = {5 * row, row, dim, 1}};
  };
  EXPECT_FALSE(may_overlap(slice(0, 2, 64), slice(256, 2, 24)));
  EXPECT_FALSE(may_overlap(slice(128, 2, 64), slice(256, 2, 24)));
  EXPECT_TRUE(may_overlap(slice(128, 2, 64), slice(255, 2, 24)));  // one channel into k's last head
}

TEST(Aliasing, ConservativeOtherwiseAndEmptyViews) {
  std::vector<float> buffer(256);
  const TensorView a = TensorView::bshd(buffer.data(), DType::f32, 1, 2, 2, 8);
  TensorView b = TensorView::bhsd(buffer.data() + 8, DType::f32, 1, 2, 2, 8);
  EXPECT_TRUE(may_overlap(a, b));  // different strides, ranges intersect: reported
  b.data = buffer.data() + 64;
  EXPECT_FALSE(may_overlap(a, b));  // ranges disjoint
  TensorView empty = a;
  empty.shape[1] = 0;
  EXPECT_FALSE(may_overlap(a, empty));
  EXPECT_FALSE(spans_meet(byte_span_checked(a), byte_span_checked(empty)));
  EXPECT_FALSE(spans_meet(byte_span_checked(empty), byte_span(a)));  // empty meets nothing
  // An array's bytes (bytes_view) beyond max_view_bytes: the widest span, and may_overlap conservative.
  const TensorView huge = bytes_view(buffer.data() + 200, int64_t{1} << 62, 4);
  EXPECT_TRUE(spans_meet(byte_span(huge), byte_span_checked(a)));  // the widest span meets every view
  EXPECT_FALSE(spans_meet(byte_span(huge), byte_span_checked(empty)));  // but an empty one
  EXPECT_TRUE(may_overlap(huge, a));
  EXPECT_FALSE(may_overlap(bytes_view(buffer.data() + 100, 4, 4), a));  // dense bytes beside a
  EXPECT_TRUE(may_overlap(bytes_view(buffer.data() + 31, 4, 4), a));    // its last element's bytes
  EXPECT_TRUE(bytes_view(nullptr, 4, 4).is_empty());
  EXPECT_TRUE(bytes_view(buffer.data(), 0, 4).is_empty());
  EXPECT_FALSE(self_overlaps(empty));
  TensorView zero_stride = a;
  zero_stride.strides[2] = 0;
  EXPECT_TRUE(self_overlaps(zero_stride));
  EXPECT_FALSE(self_overlaps(a));
  EXPECT_FALSE(self_overlaps(TensorView::bhsd(buffer.data(), DType::f32, 2, 3, 4, 5)));
}

// Extreme views: answered without overflow (this file also runs under UBSan), conservatively.
TEST(Aliasing, ExtremeViewsAreAnsweredWithoutOverflow) {
  using detail::exceeds_max_view_bytes;
  constexpr int64_t kMax = INT64_MAX, kMin = INT64_MIN;
  std::vector<float> buffer(64);
  float* p = buffer.data();
  const auto view = [](void* data, DType dtype, std::array<int64_t, 4> shape, std::array<int64_t, 4> strides) {
    return TensorView{.data = data, .dtype = dtype, .shape = shape, .strides = strides};
  };
  // The bound, in bytes: (1 + sum |stride| (extent - 1)) * element size < 2^60.
  const int64_t f32_limit = (int64_t{1} << 58) - 1;  // [2,1,1,1] f32: (1 + s) * 4 = 2^60
  EXPECT_FALSE(exceeds_max_view_bytes(view(p, DType::f32, {2, 1, 1, 1}, {f32_limit - 1, 1, 1, 1})));
  EXPECT_TRUE(exceeds_max_view_bytes(view(p, DType::f32, {2, 1, 1, 1}, {f32_limit, 1, 1, 1})));
  EXPECT_TRUE(exceeds_max_view_bytes(view(p, DType::f32, {2, 1, 1, 1}, {-f32_limit, 1, 1, 1})));
  EXPECT_TRUE(exceeds_max_view_bytes(view(p, DType::f64, {2, 1, 1, 1}, {int64_t{1} << 60, 1, 1, 1})));
  EXPECT_TRUE(exceeds_max_view_bytes(view(p, DType::f32, {2, 1, 1, 1}, {kMin, 1, 1, 1})));
  EXPECT_TRUE(exceeds_max_view_bytes(view(p, DType::f32, {kMax, kMax, 1, 1}, {kMax, kMax, 1, 1})));
  EXPECT_TRUE(exceeds_max_view_bytes(view(p, DType::f32, {3, 3, 3, 1}, {kMax / 2, kMin / 2, kMax / 2, 1})));
  EXPECT_TRUE(exceeds_max_view_bytes(view(p, DType::f32, {-1, 1, 1, 1}, {1, 1, 1, 1})));
  EXPECT_FALSE(exceeds_max_view_bytes(view(nullptr, DType::f32, {kMax, 0, 1, 64}, {kMin, kMin, kMin, kMin})));
  EXPECT_FALSE(exceeds_max_view_bytes(view(p, DType::f32, {1, 1, 1, 1}, {kMin, kMin, kMin, kMin})));
  EXPECT_FALSE(exceeds_max_view_bytes(view(p, DType::f32, {kMax, kMax, 1, 1}, {0, 0, 1, 1})));

  // Beyond the bound: conservative answers, no arithmetic on the strides.
  const TensorView wild = view(p, DType::f32, {2, 2, 1, 16}, {kMin, kMin, 16, 1});
  EXPECT_TRUE(self_overlaps(wild));
  EXPECT_TRUE(may_overlap(wild, wild));
  EXPECT_TRUE(may_overlap(view(p, DType::f32, {1, 1, 2, 16}, {1, 1, kMax, 1}), TensorView::bshd(p, DType::f32, 1, 1, 1, 16)));
  // Unit dimensions' strides (INT64_MIN included) take no part.
  const TensorView unit = view(p, DType::f32, {1, 1, 1, 16}, {kMin, kMin, kMin, 1});
  EXPECT_FALSE(self_overlaps(unit));
  EXPECT_TRUE(may_overlap(unit, unit));
  EXPECT_FALSE(may_overlap(unit, view(p + 16, DType::f32, {1, 1, 1, 16}, {kMin, kMin, kMin, 1})));
  // Empty views touch nothing, whatever their other extents and strides.
  const TensorView empty = view(nullptr, DType::f64, {kMax, 0, kMax, 64}, {kMin, kMax, kMin, kMax});
  EXPECT_FALSE(self_overlaps(empty));
  EXPECT_FALSE(may_overlap(empty, wild));
  EXPECT_FALSE(may_overlap(unit, empty));
  // Addresses at both ends of the address space neither wrap nor overflow.
  void* top = reinterpret_cast<void*>(~uintptr_t{0} - 63);
  void* low = reinterpret_cast<void*>(uintptr_t{64});
  const TensorView up = view(top, DType::f32, {1, 2, 1, 16}, {0, int64_t{1} << 50, 16, 1});
  const TensorView down = view(low, DType::f32, {1, 2, 1, 16}, {0, -(int64_t{1} << 50), 16, 1});
  EXPECT_FALSE(may_overlap(up, down));
  EXPECT_FALSE(may_overlap(down, up));
  EXPECT_TRUE(may_overlap(up, up));
  // low's second row lies 2^52 bytes up, far below top: no overlap though the strides agree.
  EXPECT_FALSE(may_overlap(up, view(low, DType::f32, {1, 2, 1, 16}, {0, int64_t{1} << 50, 16, 1})));
  // Equal strides 2^58 bytes apart: the exact search, one element apart or none.
  const int64_t far = int64_t{1} << 56;
  const TensorView a = view(p, DType::f32, {2, 1, 1, 16}, {far, 16, 16, 1});
  TensorView b = a;
  b.data = p + 16;
  EXPECT_FALSE(may_overlap(a, b));
  b.data = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) + 4 * static_cast<uintptr_t>(far));
  EXPECT_TRUE(may_overlap(a, b));
  EXPECT_FALSE(self_overlaps(a));
}

}  // namespace
}  // namespace rotary
