#include "schedules/common.hpp"

#include <cmath>

#include <fmt/format.h>

#include "rotary/error.hpp"
#include "rotary/schedule.hpp"

namespace rotary::detail {
namespace {

// Pixtral's axial_even_odd order: f's even elements to axis 0 (the first `half`), its odd ones to
// axis 1 (both the double frequencies and transformers' float32 powers are laid out this way).
template <typename T>
std::vector<T> even_then_odd(const std::vector<T>& f, size_t half) {
  std::vector<T> out(f.size());
  for (size_t k = 0; k < half; ++k) {
    out[k] = f[2 * k];
    out[half + k] = f[2 * k + 1];
  }
  return out;
}

// base ** (torch.arange(0, 2n, 2).float() / dim): one float32 tensor of n powers (pos_freqs).
std::vector<float> hf_powers(float base, int64_t dim, int64_t n) {
  std::vector<float> exponents(static_cast<size_t>(n));
  for (size_t i = 0; i < exponents.size(); ++i) {
    exponents[i] = static_cast<float>(2 * i) / static_cast<float>(dim);
  }
  std::vector<float> out(exponents.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = f32(std::pow(static_cast<double>(base), static_cast<double>(exponents[i])));
  }
  return out;
}

}  // namespace

std::vector<double> unscaled_inv_freq(const Spec& spec, double base) {
  const int64_t rotary_dim = spec.resolved_rotary_dim();
  switch (spec.stream_layout) {
    case StreamLayout::axial: {  // Qwen ViT: each axis base^(-2k / (2 s_a)), k < s_a
      std::vector<double> out;
      for (const int64_t s : spec.sections) {
        const std::vector<double> axis = default_inv_freq(base, 2 * s);
        out.insert(out.end(), axis.begin(), axis.end());
      }
      return out;
    }
    case StreamLayout::axial_even_odd:  // Pixtral: f_2k to axis 0, f_(2k+1) to axis 1
      return even_then_odd(default_inv_freq(base, rotary_dim), static_cast<size_t>(spec.sections[0]));
    default:
      return default_inv_freq(base, rotary_dim);
  }
}

double ntk_base(double base, double scale, int64_t rotary_dim) {
  const double r = static_cast<double>(rotary_dim);
  return base * std::pow(scale, r / (r - 2.0));
}

void require_finite_base(const Spec& spec, double base) {
  if (!std::isfinite(base)) {
    throw Error(fmt::format("base after {} scaling is {}: factor or seq_len too large", to_string(spec.schedule),
                            base), "base");
  }
}

void check_rotary_dim_above_two(const Spec& spec) {
  const int64_t r = spec.resolved_rotary_dim();
  if (r <= 2) {
    throw Error(fmt::format("rotary_dim={} must be > 2 for schedule {} (its base exponent is r/(r-2))",
                            r, to_string(spec.schedule)), "rotary_dim");
  }
}

std::vector<float> hf_powers_of(const Spec& spec, float base) {
  const int64_t rotary_dim = spec.resolved_rotary_dim();
  switch (spec.stream_layout) {
    case StreamLayout::axial: {
      std::vector<float> out;
      for (const int64_t s : spec.sections) {
        const std::vector<float> axis = hf_powers(base, 2 * s, s);
        out.insert(out.end(), axis.begin(), axis.end());
      }
      return out;
    }
    case StreamLayout::axial_even_odd:
      return even_then_odd(hf_powers(base, rotary_dim, rotary_dim / 2), static_cast<size_t>(spec.sections[0]));
    default:
      return hf_powers(base, rotary_dim, rotary_dim / 2);
  }
}

std::vector<float> reciprocals(std::vector<float> values) {
  for (float& v : values) v = 1.0f / v;
  return values;
}

std::vector<float> float32_nearest(const Spec&, std::optional<int64_t>, const std::vector<double>& exact) {
  std::vector<float> out;
  for (const double f : exact) out.push_back(f32(f));
  return out;
}

}  // namespace rotary::detail
