// Pairing conversion: the permutation, weights, activations, and RoPE commuting with it.
#include <numeric>

#include "rotary/apply.hpp"
#include "rotary/pairing.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

TEST(ChannelLayout, PermutationWrittenOut) {
  // head_dim 8, rotary_dim 6: interleaved pairs (0,1)(2,3)(4,5) -> half pairs (0,3)(1,4)(2,5)
  EXPECT_EQ(pairing_permutation(8, 6, Pairing::interleaved, Pairing::half),
            (std::vector<int64_t>{0, 2, 4, 1, 3, 5, 6, 7}));
  EXPECT_EQ(pairing_permutation(8, 6, Pairing::half, Pairing::interleaved),
            (std::vector<int64_t>{0, 3, 1, 4, 2, 5, 6, 7}));
  EXPECT_EQ(pairing_permutation(4, 0, Pairing::half, Pairing::half), (std::vector<int64_t>{0, 1, 2, 3}));
  // The two directions are inverse permutations.
  const auto there = pairing_permutation(128, 64, Pairing::interleaved, Pairing::half);
  const auto back = pairing_permutation(128, 64, Pairing::half, Pairing::interleaved);
  for (size_t j = 0; j < 128; ++j) EXPECT_EQ(there[static_cast<size_t>(back[j])], static_cast<int64_t>(j));
  EXPECT_ROTARY_ERROR(pairing_permutation(8, 7, Pairing::half, Pairing::interleaved), "rotary_dim=7");
  EXPECT_ROTARY_ERROR(pairing_permutation(0, 0, Pairing::half, Pairing::interleaved), "head_dim=0");
}

TEST(ChannelLayout, RopeCommutesWithThePermutation) {
  // interleaved RoPE of x == permute^-1( half RoPE of permute(x) ), partial rotary included.
  const int64_t d = 48, r = 32, seq = 6, heads = 3;
  const Schedule inter = make_schedule(Spec{.head_dim = d, .rotary_dim = r, .pairing = Pairing::interleaved});
  const Schedule half = make_schedule(Spec{.head_dim = d, .rotary_dim = r, .pairing = Pairing::half});
  const std::vector<double> x = test::random_doubles(static_cast<size_t>(seq * heads * d), 5);
  std::vector<double> a = x, px(x.size()), back(x.size());
  const auto view = [&](std::vector<double>& v) { return TensorView::bshd(v.data(), DType::f64, 1, seq, heads, d); };
  apply(inter, {.q = view(a), .positions = Positions::sequential(1234567)});
  permute_channels(view(const_cast<std::vector<double>&>(x)), view(px), r, Pairing::interleaved, Pairing::half);
  apply(half, {.q = view(px), .positions = Positions::sequential(1234567)});
  permute_channels(view(px), view(back), r, Pairing::half, Pairing::interleaved);
  for (size_t j = 0; j < x.size(); ++j) EXPECT_EQ(back[j], a[j]) << j;  // same arithmetic, same bits
}

TEST(ChannelLayout, PermuteRowsRoundTripAndBias) {
  const int64_t heads = 4, d = 8, cols = 3;
  std::vector<float> w(static_cast<size_t>(heads * d * cols));
  std::iota(w.begin(), w.end(), 0.0f);
  std::vector<float> half(w.size()), back(w.size());
  permute_rows(w.data(), half.data(), {.num_heads = heads, .head_dim = d, .row_bytes = cols * 4});
  permute_rows(half.data(), back.data(), {.num_heads = heads, .head_dim = d, .row_bytes = cols * 4,
                                          .from = Pairing::half, .to = Pairing::interleaved});
  EXPECT_EQ(back, w);
  // Row j of head h in the half layout is row 2j (j < 4) or 2(j-4)+1 of the interleaved head.
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < d; ++j) {
      const int64_t src = j < 4 ? 2 * j : 2 * (j - 4) + 1;
      EXPECT_EQ(half[static_cast<size_t>((h * d + j) * cols)], w[static_cast<size_t>((h * d + src) * cols)]);
    }
  // A bias is one element per row.
  std::vector<uint16_t> bias(static_cast<size_t>(heads * d)), bias_half(bias.size());
  std::iota(bias.begin(), bias.end(), uint16_t{0});
  permute_rows(bias.data(), bias_half.data(), {.num_heads = heads, .head_dim = d, .row_bytes = 2});
  EXPECT_EQ(bias_half[1], 2);
  EXPECT_EQ(bias_half[4], 1);
}

TEST(ChannelLayout, Errors) {
  std::vector<float> w(64);
  EXPECT_ROTARY_ERROR(permute_rows(w.data(), w.data() + 4, {.num_heads = 1, .head_dim = 8, .row_bytes = 4}),
                      "src and dst overlap");
  EXPECT_ROTARY_ERROR(permute_rows(w.data(), w.data(), {.num_heads = -1, .head_dim = 8, .row_bytes = 4}),
                      "num_heads=-1");
  EXPECT_ROTARY_ERROR(permute_rows(w.data(), w.data(), {.num_heads = 1, .head_dim = 8, .row_bytes = 0}),
                      "row_bytes=0");
  std::vector<float> out(64, 7.0f);
  const auto in_view = TensorView::bshd(w.data(), DType::f32, 1, 2, 4, 8);
  auto out_view = TensorView::bshd(out.data(), DType::f32, 1, 2, 4, 8);
  out_view.dtype = DType::bf16;
  EXPECT_ROTARY_ERROR(permute_channels(in_view, out_view, 8, Pairing::half, Pairing::interleaved),
                      "out.dtype=bf16 differs from in.dtype=f32");
  EXPECT_ROTARY_ERROR(permute_channels(in_view, in_view, 8, Pairing::half, Pairing::interleaved),
                      "in and out overlap");
  EXPECT_EQ(out, std::vector<float>(64, 7.0f));
}

TEST(ChannelLayout, SizesAndViewsAreCheckedWithoutOverflow) {
  std::vector<float> w(64), out(64, 7.0f);
  // rows * row_bytes beyond int64: refused before any pointer arithmetic or copy.
  EXPECT_ROTARY_ERROR(permute_rows(w.data(), out.data(), {.num_heads = INT64_MAX / 8 + 1, .head_dim = 8, .row_bytes = 4}),
                      "num_heads=1152921504606846976 * head_dim=8 * row_bytes=4 must be < 2^60 bytes");
  EXPECT_ROTARY_ERROR(permute_rows(w.data(), out.data(), {.num_heads = int64_t{1} << 40, .head_dim = 8, .row_bytes = int64_t{1} << 20}),
                      "must be < 2^60 bytes");
  // No rows: nothing to copy, null buffers allowed.
  EXPECT_NO_THROW(permute_rows(nullptr, nullptr, {.num_heads = 0, .head_dim = 8, .row_bytes = 4}));
  EXPECT_ROTARY_ERROR(pairing_permutation(8, 0, static_cast<Pairing>(7), Pairing::half), "from=7 is not interleaved or half");
  EXPECT_ROTARY_ERROR(pairing_permutation(8, 0, Pairing::half, static_cast<Pairing>(-1)), "to=-1 is not interleaved or half");
  // Views: the rules of apply, named in or out.
  const auto in_view = TensorView::bshd(w.data(), DType::f32, 1, 2, 4, 8);
  auto wild = TensorView::bshd(out.data(), DType::f32, 1, 2, 4, 8);
  wild.strides[1] = INT64_MIN;
  EXPECT_ROTARY_ERROR(permute_channels(in_view, wild, 8, Pairing::half, Pairing::interleaved),
                      "out strides [64, -9223372036854775808, 8, 1] with shape [1, 2, 4, 8] span 2^60 bytes or more");
  TensorView null_in = in_view;
  null_in.data = nullptr;
  EXPECT_ROTARY_ERROR(permute_channels(null_in, TensorView::bshd(out.data(), DType::f32, 1, 2, 4, 8), 8, Pairing::half,
                                       Pairing::interleaved),
                      "in.data is null but in shape [1, 2, 4, 8] is not empty");
  TensorView odd = in_view;
  odd.dtype = static_cast<DType>(9);
  EXPECT_ROTARY_ERROR(permute_channels(odd, odd, 8, Pairing::half, Pairing::interleaved), "in.dtype=9 is not f32");
  EXPECT_EQ(out, std::vector<float>(64, 7.0f));
  // Empty views (torch's: data null) copy nothing, however large their other extents.
  const TensorView empty{.data = nullptr, .shape = {INT64_MAX, 0, INT64_MAX, 8}, .strides = {INT64_MIN, 1, INT64_MAX, 1}};
  EXPECT_NO_THROW(permute_channels(empty, empty, 8, Pairing::half, Pairing::interleaved));
}

}  // namespace
}  // namespace rotary
