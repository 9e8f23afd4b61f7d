// 16-bit conversions against independent references: the compiler's _Float16, and a bfloat16
// rounding written from the definition.
#include <bit>
#include <cmath>
#include <random>

#include "math/half.hpp"
#include "support/oracle.hpp"

namespace rotary::detail {
namespace {

// bfloat16 nearest-even from the definition: the two neighbours, pick the closer, ties to even.
uint16_t bf16_by_definition(float f) {
  if (std::isnan(f)) return 0x7fc0;
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const auto down = static_cast<uint16_t>(u >> 16);
  const uint16_t up = static_cast<uint16_t>(down + 1);
  if ((u & 0xffffu) == 0) return down;
  const double x = f;
  const double lo = bf16_to_f32(down);
  const double hi = (down & 0x7fffu) == 0x7f7fu ? std::copysign(0x1p128, x) : bf16_to_f32(up);
  const double dl = std::fabs(x - lo), dh = std::fabs(hi - x);
  if (dl < dh) return down;
  if (dh < dl) return up;
  return (down & 1u) ? up : down;
}

std::vector<float> interesting_floats() {
  std::vector<float> out = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f,
                            0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-26f, 1e-30f, 3.4e38f,
                            INFINITY, -INFINITY, 0x1.002p0f, 0x1.001p0f, 0x1.003p0f, 0x1.ff8p-15f};
  std::mt19937 rng(1);
  for (int i = 0; i < 2000000; ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (!std::isnan(f)) out.push_back(f);
  }
  std::uniform_real_distribution<float> small(-70000.0f, 70000.0f);
  for (int i = 0; i < 200000; ++i) out.push_back(small(rng));
  return out;
}

#ifdef __FLT16_MAX__
TEST(Half, F32ToF16MatchesCompiler) {
  for (float f : interesting_floats()) {
    const _Float16 h = static_cast<_Float16>(f);
    ASSERT_EQ(f32_to_f16(f), std::bit_cast<uint16_t>(h)) << std::hexfloat << f;
  }
}

TEST(Half, F16ToF32IsExactForAllValues) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float mine = f16_to_f32(h);
    const float compiler = static_cast<float>(std::bit_cast<_Float16>(h));
    if (std::isnan(compiler)) {
      ASSERT_TRUE(std::isnan(mine));
      ASSERT_TRUE(std::isnan(f16_to_f32(f32_to_f16(mine))));
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(mine), std::bit_cast<uint32_t>(compiler)) << bits;
      ASSERT_EQ(f32_to_f16(mine), h) << bits;  // round trip
    }
  }
}
#endif

TEST(Half, F32ToBf16MatchesDefinition) {
  for (float f : interesting_floats()) {
    ASSERT_EQ(f32_to_bf16(f), bf16_by_definition(f)) << std::hexfloat << f;
  }
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float f = bf16_to_f32(static_cast<uint16_t>(bits));
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), bits);
    }
  }
}

}  // namespace
}  // namespace rotary::detail
