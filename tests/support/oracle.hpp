// Test oracles independent of the library: MPFR angles, float ulps, random data, error checks.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "rotary/tensor.hpp"

namespace rotary::test {

/// cos and sin of position * inv_freq (exact real product), times factor, from MPFR at 256 bits,
/// rounded to double.
struct Exact {
  double cos;
  double sin;
};
Exact mpfr_cos_sin(int64_t position, double inv_freq, double factor = 1.0);

/// |stored - exact| in float32 ulps of the exact value, exact being cos (or sin) of
/// position * inv_freq times factor at 256 bits. ulp(x) = 2^(floor(log2|x|) - 23), >= 2^-149.
double table_error_ulps(float stored, int64_t position, double inv_freq, double factor, bool sine);

/// Numerators p < limit of the continued-fraction convergents of (π/2)/inv_freq: the positions
/// whose angle p * inv_freq falls closest to a multiple of π/2.
std::vector<int64_t> near_quarter_turns(double inv_freq, int64_t limit);

/// One element of storage type `dtype` at p: v written (f16/bf16 rounded to nearest even, f64
/// widened), and read back widened to double. The conversions are the library's (src/half.hpp).
void store_element(DType dtype, void* p, float v);
double load_element(DType dtype, const void* p);

/// Runs fn, expects rotary::Error whose message contains `needle`.
void expect_error(const std::function<void()>& fn, const std::string& needle);

std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f);
std::vector<double> random_doubles(size_t n, uint64_t seed);

}  // namespace rotary::test

#define EXPECT_ROTARY_ERROR(statement, needle) \
  ::rotary::test::expect_error([&] { statement; }, needle)
