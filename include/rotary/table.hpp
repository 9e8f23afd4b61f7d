// rotary — precomputed cos/sin rows for a set of positions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "rotary/schedule.hpp"

namespace rotary {

/// How a table's angles are formed.
///   exact:      the real number p * inv_freq (double parameters), the default.
///   hf_float32: transformers' float32 pipeline, for matching a model's training numerics:
///               angle = fl32(f * fl32(p)); value = fl32(fl32(cos angle) * fl32(g)), with f
///               transformers' float32 inv_freq (Schedule::inv_freq_hf32; the float32 nearest
///               inv_freq for a Schedule without it) and the cos of the float angle correctly
///               rounded: within 2 ulps of transformers' forward (torch's float32 cos and sin are
///               within 1 ulp of these, then both sides multiply by fl32(g)). Off the exact angle
///               by up to ~1e-2 rad near p = 2^20.
///               One exception: inv_freq_hf32 takes the power base^(2j/d) correctly rounded, and
///               torch's float32 pow is not on a few pairs (which ones depends on the CPU's vector
///               unit and on the tensor's length; on x86 AVX2/AVX512, pair 37 of base 1e6 at
///               head_dim 128: Qwen2, Qwen2.5, Qwen3, CodeLlama; pair 19 of base 5e6: Qwen3-VL).
///               There f is one ulp from transformers' and the angle up to 2^-21 * p * f from its
///               angle (at p = 2^31 - 1: 0.06 rad on Qwen's pair 37, 2 rad on Qwen3-VL's pair
///               19). To rotate by a model's own angles bit for bit, pass its cos/sin
///               (ApplyArgs::caller_angles).
/// Table values are the same bits on every machine, compiler, C library and CPU target, and equal
/// the float rows apply computes on the fly (NaNs compare as NaN): the exact angles come from the
/// project's own double-double reduction and polynomials (src/math/exact_angle.hpp), not libm.
enum class AngleMode { exact, hf_float32 };
/// "exact", "hf_float32"; "?" for a value that is not an AngleMode.
std::string_view to_string(AngleMode mode);

/// The largest Table: 8 * rows * pairs bytes (cos and sin, float32) must not exceed this, 64 GiB
/// (2^31 positions of a 128-wide head would take 1 TiB). Above it, build a table of the positions
/// in use (Table::at) or compute angles on the fly.
inline constexpr int64_t max_table_bytes = int64_t{1} << 36;

/// cos(p * inv_freq[i]) * attention_factor and sin(...) * attention_factor, float32, one row of
/// `pairs()` values per position, cos and sin in separate arrays (pair order, whatever the pairing):
///
///   cos: row 0 [c0 c1 ... c_{r/2-1}]  row 1 [c0 c1 ...] ...
///   sin: row 0 [s0 s1 ... s_{r/2-1}]  row 1 [s0 s1 ...] ...
///
/// Accuracy: every value is within 1 ulp of the exact real value (checked against MPFR at 256 bits
/// for positions up to 2^31 - 1); in practice it is the correctly rounded float or a neighbour at
/// 0.5 + 2^-28 ulp. Building allocates 8 * rows * pairs bytes (at most max_table_bytes) and uses
/// all OpenMP threads (at most one per processor and per row); a built Table is immutable and safe
/// to share between threads.
class Table {
 public:
  /// Positions first, first+1, ..., first+count-1. Throws rotary::Error unless the schedule is
  /// valid (validate; for hf_float32 also what Schedule::inv_freq_hf32 says), 0 <= first,
  /// 0 <= count, first + count <= 2^31, the table fits max_table_bytes and mode is a named
  /// AngleMode.
  static Table range(const Schedule& schedule, int64_t first, int64_t count,
                     AngleMode mode = AngleMode::exact);
  /// One row per listed position, in the given order (duplicates allowed). Throws rotary::Error
  /// naming the first position outside [0, 2^31), or as range does.
  static Table at(const Schedule& schedule, std::span<const int64_t> positions,
                  AngleMode mode = AngleMode::exact);

  const Schedule& schedule() const { return schedule_; }
  AngleMode mode() const { return mode_; }
  int64_t rows() const { return rows_; }
  int64_t pairs() const { return schedule_.pairs(); }
  /// The position of each row.
  int64_t position(int64_t row) const { return is_range_ ? first_ + row : positions_[row]; }
  /// Whether the rows hold one range of positions, position(0) + row (Table::range, or Table::at of
  /// consecutive positions): row_of is then O(1).
  bool is_range() const { return is_range_; }
  /// The row holding `position`, if any (range: O(1); list: O(log rows)).
  std::optional<int64_t> row_of(int64_t position) const;

  std::span<const float> cos() const { return cos_; }
  std::span<const float> sin() const { return sin_; }
  const float* cos_row(int64_t row) const { return cos_.data() + row * pairs(); }
  const float* sin_row(int64_t row) const { return sin_.data() + row * pairs(); }

 private:
  Table(const Schedule& schedule, int64_t rows);
  void fill();

  Schedule schedule_;
  AngleMode mode_ = AngleMode::exact;
  int64_t rows_ = 0;
  bool is_range_ = true;
  int64_t first_ = 0;
  std::vector<int64_t> positions_;                     // list tables: position of each row
  std::vector<std::pair<int64_t, int64_t>> lookup_;    // list tables: sorted (position, row)
  std::vector<float> cos_;
  std::vector<float> sin_;
};

/// Fills cos_out[i], sin_out[i] (i < schedule.pairs()) for one position, with the same values a
/// Table holds. Throws rotary::Error if the schedule is not valid (as Table::range), position is
/// outside [0, 2^31), mode is not a named AngleMode or an output is null. No allocation.
void table_row(const Schedule& schedule, int64_t position, float* cos_out, float* sin_out,
               AngleMode mode = AngleMode::exact);

/// How far transformers' float32 pipeline (AngleMode::hf_float32, its float32 inv_freq included)
/// strays from the exact angles at one position. Throws as table_row does.
struct Float32Drift {
  double max_angle_error = 0;  ///< radians, |fl32 angle - exact angle|, worst pair
  int64_t worst_pair = 0;
  double max_ulps = 0;         ///< worst |fl32-pipeline cos or sin - exact table value|, float ulps
};
Float32Drift hf_float32_drift(const Schedule& schedule, int64_t position);

}  // namespace rotary
