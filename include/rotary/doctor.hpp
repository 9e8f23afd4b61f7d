// rotary — the precision doctor: where a model's RoPE loses precision over its context, and the
// rotary setting that avoids each loss.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rotary/hf_config.hpp"
#include "rotary/schedule.hpp"
#include "rotary/spec.hpp"

namespace rotary {

/// How far transformers' float32 angle may stray from the exact one before the doctor calls it a
/// hazard: 1e-3 rad.
inline constexpr double doctor_threshold_rad = 1e-3;

/// What the doctor examines: positions 0 .. context-1 of one sequence.
struct DoctorOptions {
  /// The sequence length; unset: the model's own (context_length(spec, max_position_embeddings)).
  /// Given, it must be in [1, 2^31].
  std::optional<int64_t> context{};
  /// The config's max_position_embeddings (ModelRope's; 0: none), for the default context.
  int64_t max_position_embeddings = 0;
};

/// transformers' float32 angle pipeline against the exact angle. Pair j's angle error at position
/// p is |fl32(f_j * fl32(p)) - p * inv_freq[j]|, f_j being transformers' own float32 inv_freq
/// (Schedule::inv_freq_hf32) and p * inv_freq[j] the exact real product: the error of the angle
/// itself, not reduced modulo 2π, as AngleMode::hf_float32 forms it and hf_float32_drift (the drift
/// line of `rotary info`) measures it. The angle "strays" where this error exceeds threshold_rad.
struct Float32DriftReport {
  double threshold_rad = doctor_threshold_rad;
  std::optional<int64_t> first_position{};  ///< the first position where some pair strays; unset: none
  int64_t first_pair = -1;                  ///< the lowest pair straying there; -1: none
  /// Per pair, the first position where it strays (unset: it never does within the context).
  std::vector<std::optional<int64_t>> first_position_per_pair;
  int64_t last_position = 0;                ///< the context's last position (at most 2^31 - 1)
  double max_rad_at_context = 0;            ///< the worst pair's error at last_position
  int64_t worst_pair_at_context = 0;
  double max_ulps_at_context = 0;           ///< the worst cos/sin there, in float32 ulps (hf_float32_drift)
  std::vector<double> rad_at_context_per_pair;  ///< each pair's error at last_position
};

/// Where a bf16 cos/sin cache (cos and sin times attention_factor as rotary's float32 table holds
/// them, rounded to the nearest bfloat16, ties to even, as torch's .to(torch.bfloat16)) stops telling
/// adjacent positions apart: the first position p, p + 1 < context, at which some pair's bf16 cos
/// and bf16 sin both equal those of position p + 1, and the lowest such pair. Pairs with inv_freq 0
/// (which never turn) are left out.
struct Bf16Resolution {
  std::optional<int64_t> first_position{};  ///< unset: every turning pair tells every p from p + 1
  int64_t pair = -1;
};

/// One finding. `kind` is one of
///   float32_drift      transformers' float32 angles stray more than threshold_rad (position: where first)
///   bf16_resolution    a bf16 cos/sin cache loses position resolution (position: Bf16Resolution's)
///   wrap               pairs complete a full turn within the context, so their angle difference is not
///                      monotone in distance (He & Xu's requirement c3; position: the shortest wrap
///                      distance, i.e. the first position whose distance from position 0 wraps a pair)
///   longrope_switch    transformers switches LongRoPE's short factors for the long ones when the
///                      sequence grows past the original length L (position: L)
///   dynamic_ntk_switch transformers' dynamic NTK base starts growing past L (position: L)
///   yarn_ramp          YaRN's original length and the pairs it keeps, blends and interpolates (position: L)
///   llama3_bands       the same for Llama 3's frequency bands (position: L)
///   xpos_range         xPos positions further than xpos_reach from xpos_center, which apply refuses
///                      (position: the first refused one)
/// `detail` is one line: what was found and the rotary setting that avoids it.
struct Hazard {
  std::string kind;
  std::optional<int64_t> position{};
  std::string detail;
};

/// The doctor's findings for one model at one context.
struct DoctorReport {
  int64_t context = 0;                    ///< positions 0 .. context-1 (the model's own length may exceed 2^31)
  std::string context_source;             ///< "given", or how the settings state it (ContextLength::source)
  int64_t positions = 0;                  ///< positions examined: min(context, 2^31)
  Schedule schedule;                      ///< the schedule at sequence length `positions` (dynamic,
                                          ///< longrope: what the model runs at its full context)
  Float32DriftReport float32_drift;
  Bf16Resolution bf16_resolution;
  /// Per pair, ceil(2π / inv_freq) in double: the first distance at which the pair's angle
  /// difference completes a turn (He & Xu's c3); an integer. Unset for a pair that never turns
  /// (inv_freq 0) or whose distance exceeds the double range (a subnormal inv_freq).
  std::vector<std::optional<double>> wrap_distance;
  std::vector<int64_t> wrapping_pairs;    ///< pairs whose wrap distance is <= positions - 1
  std::vector<Hazard> hazards;            ///< the findings, in the order of Hazard's list
};

/// Examines a Spec over positions 0 .. context-1: transformers' float32 angle drift (the first
/// position and pair above doctor_threshold_rad, each pair's at the last position), the bf16 cos/sin
/// resolution, each pair's wrap distance, and the schedule's switch points. Throws rotary::Error
/// (validate(spec); "context=N must be in [1, 2^31]"; "context is needed: ..." when options.context
/// is unset and the settings state no length; make_schedule's errors at that length; transformers'
/// float32 inv_freq not finite, as hf_float32_drift). Fast: no pair's error can exceed the threshold
/// below the first position where a bound nondecreasing in p does (a binary search), and a scan from
/// there finds the first that does; bf16 candidates are screened by a necessary condition in double
/// before the table's own values are compared, the slowest pairs first, each later one scanned only
/// up to the best position so far. Measured single-threaded: 2-7 ms for Llama-3.1-8B, Qwen2.5 and
/// Phi-3.5 at 2^20 positions, under 0.6 s for the heads tried at 2^31. Allocates; thread-safe.
DoctorReport doctor(const Spec& spec, const DoctorOptions& options = {});
/// The same for a resolved config, its max_position_embeddings setting the default context.
DoctorReport doctor(const ModelRope& model, std::optional<int64_t> context = std::nullopt);

/// The report as one line of JSON (`rotary doctor --json`, rotary.doctor):
///   {"context", "context_source", "positions", "schedule",
///    "float32_drift": {"threshold_rad", "first_position" (null: none), "first_pair",
///                      "first_position_per_pair", "last_position", "max_rad_at_context",
///                      "worst_pair_at_context", "max_ulps_at_context", "rad_at_context_per_pair"},
///    "bf16_resolution": {"first_position", "pair"}, "wrap_distance": [per pair, null for inv_freq 0],
///    "wrapping_pairs": [...], "hazards": [{"kind", "position", "detail"}]}
std::string to_json(const DoctorReport& report);
/// The report for a reader: a header, one line per hazard, one per check that found none.
std::string to_text(const DoctorReport& report);

}  // namespace rotary
