// rotary — the frequencies a Spec stands for.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "rotary/spec.hpp"

namespace rotary {

/// The data every kernel needs: which channels rotate, how they pair, and at what frequency.
/// Kernels never learn which schedule produced it.
struct Schedule {
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;
  Pairing pairing = Pairing::half;
  ScheduleType type = ScheduleType::default_;
  std::vector<double> inv_freq;    ///< rotary_dim/2 angular frequencies, radians per position, finite, > 0
  double attention_factor = 1.0;   ///< multiplied into cos and sin, a normal float32 (spec.hpp)

  int64_t pairs() const { return rotary_dim / 2; }
  bool operator==(const Schedule&) const = default;
};

/// Largest inv_freq accepted (radians per position). Beyond it angles at large positions exceed what
/// an exact reduction in double-double handles, and a pair would turn more than 2^20 rad per token.
inline constexpr double max_inv_freq = 1048576.0;

/// The unscaled frequencies base^(-2i/r), i in [0, r/2), in double.
std::vector<double> default_inv_freq(double base, int64_t rotary_dim);

/// Computes inv_freq and attention_factor in double exactly as DESIGN.md §2 writes them.
/// `seq_len` is n for the schedules that depend on the current sequence length (dynamic: NTK base
/// grows when n > L; longrope: long factors when n > L); unset means n <= L. Other schedules ignore it.
/// llama3 follows transformers' comparisons, with λ_i = 2π/default_i: λ_i < L/hf kept, λ_i > L/lf
/// divided by s, L/hf <= λ_i <= L/lf smoothed — so λ_i == L/lf gets t = 0 (divided by s, as the band
/// above) and λ_i == L/hf gets t = 1 (kept). lf == hf (Llama 4 Scout) leaves two bands; a wavelength
/// then exactly equal to L/lf is an error (transformers computes 0/0 = NaN there).
/// Throws rotary::Error (validate(spec), seq_len < 0, a non-finite or out-of-range result, a computed
/// attention_factor outside [min_attention_factor, max_attention_factor]). Allocates; thread-safe.
Schedule make_schedule(const Spec& spec, std::optional<int64_t> seq_len = std::nullopt);

/// Checks a Schedule built by hand (or received from elsewhere): head_dim > 0, rotary_dim even and
/// <= head_dim, rotary_dim/2 inv_freq values each finite, > 0 and <= max_inv_freq, attention_factor
/// in [min_attention_factor, max_attention_factor] (a normal float32). Throws rotary::Error naming
/// the first broken rule.
void validate(const Schedule& schedule);

/// The monotone schedule's default constant c for window N and first default frequency f0:
/// the largest c with (N-1) * c * f0 <= 2π (1 - 2^-10).
double monotone_default_scale(int64_t max_length, double first_inv_freq);

}  // namespace rotary
