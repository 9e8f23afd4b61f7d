#include "support/oracle.hpp"

#include <mpfr.h>

#include <cmath>
#include <cstring>

#include "math/half.hpp"
#include "rotary/error.hpp"

namespace rotary::test {
namespace {

constexpr mpfr_prec_t kBits = 256;

struct Mp {
  mpfr_t v;
  Mp() { mpfr_init2(v, kBits); }
  ~Mp() { mpfr_clear(v); }
  Mp(const Mp&) = delete;
  Mp& operator=(const Mp&) = delete;
};

void exact_angle(Mp& angle, int64_t position, double inv_freq) {
  mpfr_set_si(angle.v, static_cast<long>(position), MPFR_RNDN);
  Mp f;
  mpfr_set_d(f.v, inv_freq, MPFR_RNDN);
  mpfr_mul(angle.v, angle.v, f.v, MPFR_RNDN);  // exact: 31 + 53 bits << 256
}

}  // namespace

Exact mpfr_cos_sin(int64_t position, double inv_freq, double factor) {
  Mp angle, s, c;
  exact_angle(angle, position, inv_freq);
  mpfr_sin_cos(s.v, c.v, angle.v, MPFR_RNDN);
  mpfr_mul_d(s.v, s.v, factor, MPFR_RNDN);
  mpfr_mul_d(c.v, c.v, factor, MPFR_RNDN);
  return {mpfr_get_d(c.v, MPFR_RNDN), mpfr_get_d(s.v, MPFR_RNDN)};
}

double table_error_ulps(float stored, int64_t position, double inv_freq, double factor, bool sine) {
  Mp angle, value, diff;
  exact_angle(angle, position, inv_freq);
  if (sine) mpfr_sin(value.v, angle.v, MPFR_RNDN);
  else mpfr_cos(value.v, angle.v, MPFR_RNDN);
  mpfr_mul_d(value.v, value.v, factor, MPFR_RNDN);
  mpfr_set_flt(diff.v, stored, MPFR_RNDN);
  mpfr_sub(diff.v, diff.v, value.v, MPFR_RNDN);
  mpfr_abs(diff.v, diff.v, MPFR_RNDN);
  long ulp_exponent = -149;
  if (!mpfr_zero_p(value.v)) {
    // value = m 2^e with 0.5 <= |m| < 1: float ulp in that binade is 2^(e - 24)
    ulp_exponent = std::max(static_cast<long>(mpfr_get_exp(value.v)) - 24, -149L);
  }
  mpfr_mul_2si(diff.v, diff.v, -ulp_exponent, MPFR_RNDN);
  return mpfr_get_d(diff.v, MPFR_RNDU);
}

std::vector<int64_t> near_quarter_turns(double inv_freq, int64_t limit) {
  Mp x, one;
  mpfr_const_pi(x.v, MPFR_RNDN);
  mpfr_div_2ui(x.v, x.v, 1, MPFR_RNDN);
  mpfr_div_d(x.v, x.v, inv_freq, MPFR_RNDN);
  // h_n = a_n h_{n-1} + h_{n-2}
  std::vector<int64_t> out;
  long double h_prev = 1, h_prev2 = 0;
  for (int n = 0; n < 60; ++n) {
    Mp a;
    mpfr_floor(a.v, x.v);
    const double an = mpfr_get_d(a.v, MPFR_RNDN);
    const long double h = an * h_prev + h_prev2;
    if (h >= static_cast<long double>(limit)) break;
    if (h >= 1) out.push_back(static_cast<int64_t>(h));
    h_prev2 = h_prev;
    h_prev = h;
    mpfr_sub(x.v, x.v, a.v, MPFR_RNDN);
    if (mpfr_zero_p(x.v)) break;
    mpfr_ui_div(x.v, 1, x.v, MPFR_RNDN);
  }
  return out;
}

void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected rotary::Error containing '" << needle << "', nothing was thrown";
  } catch (const rotary::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' lacks '" << needle << "'";
  }
}

std::vector<float> random_floats(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  return out;
}

std::vector<double> random_doubles(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> out(n);
  for (double& x : out) x = normal(rng);
  return out;
}

void store_element(DType dtype, void* p, float v) {
  switch (dtype) {
    case DType::f32: std::memcpy(p, &v, 4); break;
    case DType::f64: { const double d = v; std::memcpy(p, &d, 8); break; }
    case DType::f16: { const uint16_t h = detail::f32_to_f16(v); std::memcpy(p, &h, 2); break; }
    case DType::bf16: { const uint16_t h = detail::f32_to_bf16(v); std::memcpy(p, &h, 2); break; }
    default: break;  // cache dtypes: tests/test_fused*.cpp store them themselves
  }
}

double load_element(DType dtype, const void* p) {
  switch (dtype) {
    case DType::f32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::f64: { double v; std::memcpy(&v, p, 8); return v; }
    case DType::f16: { uint16_t v; std::memcpy(&v, p, 2); return detail::f16_to_f32(v); }
    case DType::bf16: { uint16_t v; std::memcpy(&v, p, 2); return detail::bf16_to_f32(v); }
    default: break;  // cache dtypes: tests/test_fused*.cpp read them themselves
  }
  return 0;
}

}  // namespace rotary::test
