// Views: factories, and the aliasing analysis that guards every write.
#include "memory.hpp"
#include "rotary/tensor.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

using detail::may_overlap;
using detail::self_overlaps;

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
  EXPECT_FALSE(self_overlaps(empty));
  TensorView zero_stride = a;
  zero_stride.strides[2] = 0;
  EXPECT_TRUE(self_overlaps(zero_stride));
  EXPECT_FALSE(self_overlaps(a));
  EXPECT_FALSE(self_overlaps(TensorView::bhsd(buffer.data(), DType::f32, 2, 3, 4, 5)));
}

}  // namespace
}  // namespace rotary
