// src/rotate.hpp: the exact fmaf emulation against MPFR (24-bit precision, float's exponent range,
// subnormals emulated) and against hardware FMA where the CPU has one; rotate_minus's choice of
// the fused product.
#include <mpfr.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "math/rotate.hpp"
#include "support/oracle.hpp"

namespace rotary {
namespace {

// fmaf(x, y, z) correctly rounded to binary32, by MPFR.
float mpfr_fmaf(float x, float y, float z) {
  const mpfr_exp_t emin = mpfr_get_emin(), emax = mpfr_get_emax();
  mpfr_set_emin(-148);  // binary32: subnormals down to 2^-149 = 0.1b x 2^-148
  mpfr_set_emax(128);
  mpfr_t a, b, c, r;
  mpfr_inits2(24, a, b, c, r, static_cast<mpfr_ptr>(nullptr));
  mpfr_set_flt(a, x, MPFR_RNDN);
  mpfr_set_flt(b, y, MPFR_RNDN);
  mpfr_set_flt(c, z, MPFR_RNDN);
  const int inexact = mpfr_fma(r, a, b, c, MPFR_RNDN);
  mpfr_subnormalize(r, inexact, MPFR_RNDN);
  const float out = mpfr_get_flt(r, MPFR_RNDN);
  mpfr_clears(a, b, c, r, static_cast<mpfr_ptr>(nullptr));
  mpfr_set_emin(emin);
  mpfr_set_emax(emax);
  return out;
}

__attribute__((target("fma"))) float hardware_fmaf(float x, float y, float z) {
  return __builtin_fmaf(x, y, z);
}

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);  // -0 and +0 differ
}

TEST(Rotate, FmaEmulationIsCorrectlyRounded) {
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<float> unit(-2.0f, 2.0f);
  const bool has_fma = __builtin_cpu_supports("fma");
  int64_t cases = 0;
  int64_t double_rounding_cases = 0;  // where rounding through double alone would be wrong
  for (int k = 0; k < 300000; ++k) {
    float x, y, z;
    switch (k % 5) {
      case 4: {  // x*y = ±(half an ulp of z)(1 - 2^-46): the exact sum lies 2^-70 ulp off a float
                 // midpoint, so rounding to double first lands on the midpoint (double rounding)
        z = std::ldexp(1.0f + static_cast<float>(rng() % (1u << 23)) * 0x1p-23f, static_cast<int>(rng() % 40) - 20);
        if (rng() & 1) z = -z;
        int e = 0;
        std::frexp(z, &e);  // |z| in [2^(e-1), 2^e): half an ulp is 2^(e-25)
        x = std::ldexp(1.0f + 0x1p-23f, (e - 25) / 2);
        y = std::ldexp(1.0f - 0x1p-23f, (e - 25) - (e - 25) / 2) * ((rng() & 1) ? 1.0f : -1.0f);
        break;
      }
      case 0:  // any bit pattern: NaN, inf, subnormal, zero
        x = std::bit_cast<float>(static_cast<uint32_t>(rng()));
        y = std::bit_cast<float>(static_cast<uint32_t>(rng()));
        z = std::bit_cast<float>(static_cast<uint32_t>(rng()));
        break;
      case 1:  // cancellation: z close to -x*y
        x = unit(rng);
        y = unit(rng);
        z = -(x * y) * (1.0f + unit(rng) * 1e-6f);
        break;
      case 2:  // exponents far apart
        x = std::ldexp(unit(rng), static_cast<int>(rng() % 60) - 30);
        y = unit(rng);
        z = std::ldexp(unit(rng), static_cast<int>(rng() % 100) - 50);
        break;
      case 3:  // results in the subnormal range
        x = std::ldexp(unit(rng), -70);
        y = std::ldexp(unit(rng), -60);
        z = std::ldexp(unit(rng), -130);
        break;
    }
    const float got = detail::fma_f32(x, y, z);
    double_rounding_cases += (k % 5 == 4) && (static_cast<float>(static_cast<double>(x) * y + z) != got);
    const float want = mpfr_fmaf(x, y, z);
    ASSERT_TRUE(same_float(got, want)) << std::hexfloat << x << " * " << y << " + " << z << ": " << got
                                       << " vs MPFR " << want;
    if (has_fma) {
      ASSERT_TRUE(same_float(got, hardware_fmaf(x, y, z))) << std::hexfloat << x << " " << y << " " << z;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 300000);
  EXPECT_GT(double_rounding_cases, 10000);  // the cases above really need the round-to-odd step
  // 1 + 2^-23 + 2^-24 - 2^-70 lies just below the midpoint of 1 + 2^-23 and 1 + 2^-22
  EXPECT_EQ(detail::fma_f32(0x1p-12f * (1 + 0x1p-23f), 0x1p-12f * (1 - 0x1p-23f), 1 + 0x1p-23f), 1 + 0x1p-23f);
}

// rotate_minus(x, m, w, n) = x m - w n with the larger product fused: it equals the fma whose
// unfused product is the smaller one, and each choice is visible on a case built for it.
TEST(Rotate, FusesTheLargerProduct) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> unit(-2.0f, 2.0f);
  int fused_first = 0, fused_second = 0;
  for (int k = 0; k < 100000; ++k) {
    const float x = unit(rng), m = unit(rng), w = unit(rng) * (k % 2 ? 1e-3f : 1e3f), n = unit(rng);
    const float p = x * m, q = w * n;
    const float want = std::fabs(p) >= std::fabs(q) ? mpfr_fmaf(x, m, -q) : mpfr_fmaf(-w, n, p);
    ASSERT_TRUE(same_float(detail::rotate_minus(x, m, w, n), want)) << k;
    (std::fabs(p) >= std::fabs(q) ? fused_first : fused_second)++;
  }
  EXPECT_GT(fused_first, 40000);
  EXPECT_GT(fused_second, 40000);
  // a exactly representable check: 3*5 - 2*7 = 1 whichever product is fused
  EXPECT_EQ(detail::rotate_minus(3.0f, 5.0f, 2.0f, 7.0f), 1.0f);
}

}  // namespace
}  // namespace rotary
