// The cache dtypes' codes (src/math/quant.hpp) against an independent oracle (support/quant_oracle.hpp):
// every fp8 code decoded, every midpoint between neighbouring codes and its float neighbours
// encoded (ties to even), ±max and beyond (saturation), infinities, NaN, the subnormals and below;
// int8 likewise; the scale's two directions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "math/quant.hpp"
#include "support/quant_oracle.hpp"

namespace rotary {
namespace {

using detail::float_to_fp8;
using detail::fp8_to_float;
using detail::kE4M3;
using detail::kE5M2;

struct Format {
  const char* name;
  bool e4m3;
  const detail::Fp8Format* f;
};
const Format kFormats[] = {{"e4m3", true, &kE4M3}, {"e5m2", false, &kE5M2}};

void expect_code(const Format& fmt, float x) {
  const uint8_t want = test::oracle_fp8_code(x, fmt.e4m3);
  const uint8_t got = float_to_fp8(x, *fmt.f);
  EXPECT_EQ(static_cast<int>(got), static_cast<int>(want))
      << fmt.name << " x=" << x << " (" << std::hexfloat << x << std::defaultfloat << ")";
}

TEST(FusedQuant, EveryFp8CodeDecodesAsTheFormulaSays) {
  for (const Format& fmt : kFormats) {
    for (int c = 0; c < 256; ++c) {
      const double want = test::oracle_fp8_value(static_cast<uint8_t>(c), fmt.e4m3);
      const float got = fp8_to_float(static_cast<uint8_t>(c), *fmt.f);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << fmt.name << " code " << c;
      } else {
        EXPECT_EQ(static_cast<double>(got), want) << fmt.name << " code " << c;
      }
    }
  }
}

TEST(FusedQuant, EveryFiniteCodeRoundTripsAndEveryMidpointRoundsToEven) {
  for (const Format& fmt : kFormats) {
    std::vector<float> values;
    for (int c = 0; c < 0x80; ++c) {
      const float v = fp8_to_float(static_cast<uint8_t>(c), *fmt.f);
      if (std::isfinite(v)) values.push_back(v);
    }
    for (size_t n = 0; n < values.size(); ++n) {
      for (const float sign : {1.0f, -1.0f}) {
        const float v = sign * values[n];
        expect_code(fmt, v);
        EXPECT_EQ(fp8_to_float(float_to_fp8(v, *fmt.f), *fmt.f), v) << fmt.name;
        if (n + 1 < values.size()) {
          const float mid = sign * static_cast<float>((static_cast<double>(values[n]) + values[n + 1]) / 2);
          expect_code(fmt, mid);  // a tie: the even code
          expect_code(fmt, std::nextafter(mid, 0.0f));
          expect_code(fmt, std::nextafter(mid, sign * INFINITY));
        }
      }
    }
  }
}

TEST(FusedQuant, SaturatesAtMaxKeepsNaNAndFlushesBelowHalfTheSmallestSubnormal) {
  for (const Format& fmt : kFormats) {
    const float max = fmt.f->max_value;
    for (const float x : {max, std::nextafter(max, INFINITY), max * 1.03f, max * 1.1f, 1e30f, INFINITY, -max,
                          -1e30f, -INFINITY}) {
      expect_code(fmt, x);
      EXPECT_EQ(std::fabs(fp8_to_float(float_to_fp8(x, *fmt.f), *fmt.f)), max) << fmt.name << " x=" << x;
    }
    const float nan = std::nanf("");
    EXPECT_TRUE(std::isnan(fp8_to_float(float_to_fp8(nan, *fmt.f), *fmt.f)));
    EXPECT_EQ(float_to_fp8(-nan, *fmt.f) & 0x80, 0x80) << "NaN keeps its sign";
    const float smallest = std::ldexp(1.0f, fmt.f->min_exponent - fmt.f->mantissa_bits);
    for (const float x : {smallest, smallest / 2, std::nextafter(smallest / 2, 1.0f), smallest / 4, smallest * 1.5f,
                          smallest * 2.5f, 1e-30f, std::numeric_limits<float>::denorm_min(), 0.0f, -0.0f,
                          -smallest / 2}) {
      expect_code(fmt, x);
    }
  }
}

TEST(FusedQuant, RandomFloatsOverEveryBinadeMatchTheOracle) {
  std::mt19937 rng(25);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-24, 18);
  for (const Format& fmt : kFormats) {
    for (int n = 0; n < 20000; ++n) {
      const float x = (n & 1 ? -1.0f : 1.0f) * std::ldexp(mantissa(rng), exponent(rng));
      expect_code(fmt, x);
    }
  }
}

TEST(FusedQuant, Int8RoundsHalfToEvenSaturatesAt127AndMapsNaNToZero) {
  for (const float x : {0.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, 127.0f, 127.49f, 127.5f, 128.0f,
                        1e9f, INFINITY, -126.5f, -127.5f, -128.0f, -1e9f, -INFINITY, 0.49999997f}) {
    EXPECT_EQ(static_cast<int>(detail::float_to_i8(x)), static_cast<int>(test::oracle_i8(x))) << "x=" << x;
  }
  EXPECT_EQ(detail::float_to_i8(std::nanf("")), 0);
  EXPECT_EQ(detail::float_to_i8(-1e9f), -127) << "never -128";
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-140.0f, 140.0f);
  for (int n = 0; n < 20000; ++n) {
    const float x = uniform(rng);
    ASSERT_EQ(static_cast<int>(detail::float_to_i8(x)), static_cast<int>(test::oracle_i8(x))) << "x=" << x;
  }
}

TEST(FusedQuant, DivideAndMultiplyAreDifferentConventions) {
  // x / s and x * (1/s) differ in the last bit for some x: both directions are honoured exactly.
  const float s = 3.0f;
  int differ = 0;
  for (int i = 1; i < 4000; ++i) {
    const float x = static_cast<float>(i) * 0.37f;
    EXPECT_EQ(detail::scale_for_code(x, s, detail::ScaleOp::divide), x / s);
    EXPECT_EQ(detail::scale_for_code(x, 1.0f / s, detail::ScaleOp::multiply), x * (1.0f / s));
    differ += (x / s) != x * (1.0f / s);
    EXPECT_EQ(detail::scale_from_code(x, s, detail::ScaleOp::divide), x * s);
    EXPECT_EQ(detail::scale_from_code(x, s, detail::ScaleOp::multiply), x / s);
  }
  EXPECT_GT(differ, 0);
}

}  // namespace
}  // namespace rotary
