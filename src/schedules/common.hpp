// Internal: what the schedules' formulas share — the unscaled frequencies of a stream layout, the
// NTK base, and the pieces of transformers' float32 replay.
#pragma once

#include <cstdint>
#include <numbers>
#include <optional>
#include <vector>

#include "rotary/spec.hpp"

namespace rotary::detail {

inline constexpr double two_pi = 2.0 * std::numbers::pi;

/// The frequencies before the schedule scales them: base^(-2j/r) over the rotated slice, or the
/// stream layout's own (axial: per axis, base^(-2k / (2 s_a)); axial_even_odd: f_2k to axis 0,
/// f_(2k+1) to axis 1).
std::vector<double> unscaled_inv_freq(const Spec& spec, double base);

/// NTK-aware scaling of the base: base * scale^(r/(r-2)).
double ntk_base(double base, double scale, int64_t rotary_dim);

/// Throws "base after S scaling is B: factor or seq_len too large" unless `base` is finite.
void require_finite_base(const Spec& spec, double base);

/// The rule across fields of the schedules whose base exponent is r/(r-2) (ntk, dynamic).
void check_rotary_dim_above_two(const Spec& spec);

// ---- transformers' float32 inv_freq (Schedule::inv_freq_hf32) ----
// transformers 5.23 computes inv_freq in float32 tensors (modeling_rope_utils.py's
// _compute_*_parameters; the models' compute_default_rope_parameters for default). Each float
// operation in a schedule's hf_float32 is one torch operation on CPU, in its order: IEEE float32,
// correctly rounded. pow too: base ** x is the float32 nearest base^x (a double pow rounded once).
// torch's own CPU pow is not correctly rounded on about 1.6% of these inputs (its vectorised 1-ulp
// pow runs over whole vector blocks, libm's powf over the rest, so its result depends on the
// machine and on the tensor's length): there rotary keeps the correctly rounded power, one ulp from
// torch's. A Python number meeting a float32 tensor is first rounded to float32 (f32()), in
// comparisons too; `number / tensor` is tensor.reciprocal() * number (torch's __rtruediv__), so
// 1.0 / t is one correctly rounded reciprocal. The library is compiled with -ffp-contract=off: no
// product is fused into a sum.

inline float f32(double x) { return static_cast<float>(x); }

/// base ** (torch.arange(0, r, 2).float() / r), laid out as unscaled_inv_freq lays out its
/// frequencies: one tensor per axis (Qwen and Gemma 4 vision towers: dim 2 * s_a), Pixtral's
/// even/odd split of one tensor, or one tensor over the slice (pos_freqs).
std::vector<float> hf_powers_of(const Spec& spec, float base);

/// 1 / v for each v: one correctly rounded float32 reciprocal each.
std::vector<float> reciprocals(std::vector<float> values);

/// For the schedules transformers lacks: the float32 nearest each exact frequency.
std::vector<float> float32_nearest(const Spec& spec, std::optional<int64_t> seq_len,
                                   const std::vector<double>& exact);

}  // namespace rotary::detail
