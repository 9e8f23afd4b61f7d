// Internal: the kernel boundary. What a validated apply call hands to every backend — the
// reference (src/reference), the CPU (src/cpu) and CUDA (src/cuda) — as plain data only (raw
// pointers, element strides, counts, scalars): no std::vector, no Table or Schedule, no function
// that looks anything up. A host builds it (make_kernel_args); the backends read it through the
// shared ROTARY_HD layer beside this header (angles.hpp, pairs.hpp, storage.hpp); every pointer in
// it addresses memory of the device that runs the kernel.
#pragma once

#include <cstdint>
#include <vector>

#include "rotary/positions.hpp"
#include "rotary/tensor.hpp"

namespace rotary {
struct ApplyArgs;
struct Schedule;
class Table;
}  // namespace rotary

namespace rotary::detail {

/// One tensor to rotate (q or k), [batch, seq, heads, head_dim] with element strides of any sign,
/// read from `in` and written to `out` (the same memory and strides when in_place).
struct KernelOperand {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t heads = 0;
  int64_t in_strides[4] = {};
  int64_t out_strides[4] = {};
  bool in_place = true;
  bool key = false;  ///< xPos: scaled as a key (ζ^-(p - c)/γ), else as a query
};

/// Token positions, as rotary::Positions says (streams one after the other, `count` entries each,
/// a count of seq broadcast over the batch), with the entry type spelled out.
struct KernelPositions {
  enum class Kind : int32_t { sequential, i32, i64, f32, f64 };
  Kind kind = Kind::sequential;
  int64_t offset = 0;          ///< sequential: token (b, s) is at offset + s
  const void* data = nullptr;  ///< per token
  int64_t count = 0;           ///< per token: entries per stream, batch * seq or seq
  int32_t streams = 1;         ///< per token: 1 (serving every stream) or the schedule's
};

/// Where cos and sin come from.
///   table:  rows of a table, `pairs` floats each, cos and sin times the attention factor (Table's
///           values), indexed without any search (TableRows)
///   exact:  computed on the fly from inv_freq (detail::cos_sin_of_product, src/math/exact_angle.hpp)
///           times attention_factor, rounded once to float (f32/f16/bf16) or kept in double (f64)
///   caller: the caller's cos/sin tensors (CallerAngles, as KernelCallerAngles spells them),
///           already times the attention factor
///   hf_float32: transformers' float32 pipeline on the fly (AngleMode::hf_float32): angle =
///           fl32(f * fl32(p)) with f its float32 inv_freq (inv_freq_hf32, or the float nearest
///           inv_freq), cos and sin of that float angle exactly, each rounded to float and times
///           fl32(attention_factor) in float: the values Table::at(..., hf_float32) holds
enum class KernelAngleSource : int32_t { table, exact, caller, hf_float32 };

/// A table's rows. A range table holds positions first, first + 1, ..., first + rows - 1: the row of
/// position p is p - first. A list table (Table::at) holds any positions: row_index gives, for each
/// entry of the call's positions (detail::position_entry: per token and stream; s for sequential
/// positions), the row of its position, resolved once per call by the host.
struct TableRows {
  const float* cos = nullptr;  ///< rows * pairs values, row-major
  const float* sin = nullptr;
  int64_t first = 0;
  int64_t rows = 0;
  const int64_t* row_index = nullptr;  ///< list tables: the row of each position entry; null: a range
};

/// The caller's cos/sin (rotary::CallerAngles) as plain data. Pair j of token (b, s) reads element
///   first * strides[0] + row * strides[1] + j * column_step * strides[2]
/// of cos and of sin, with
///   per_token:    first = b (0 when broadcast: one [1, seq, width] row set for every batch row),
///                 row = s
///   per_position: first = 0, row = the token's position in the pair's stream (a whole number
///                 below rows)
/// column_step is 2 for repeated columns ([c_0 c_0 c_1 c_1 ...]), else 1 (pairs, and halves, whose
/// second half repeats the first). The value is widened as the CPU's caller_row does: loaded, made
/// a double, then cast to the compute type (float, or double for f64 data).
struct KernelCallerAngles {
  const void* cos = nullptr;
  const void* sin = nullptr;
  DType dtype = DType::f32;
  bool per_position = false;
  bool broadcast = false;  ///< per_token: shape [1, seq, width]
  int64_t column_step = 1;
  int64_t rows = 0;        ///< per_position: rows of the tensors
  int64_t cos_strides[3] = {};
  int64_t sin_strides[3] = {};
};

/// Bits of KernelArgs::error, set by a kernel for a token whose position it cannot use. Such a
/// token is skipped: nothing of it is read or written.
inline constexpr uint32_t kPositionOutOfRange = 1;   ///< not in [0, 2^31) (NaN included)
inline constexpr uint32_t kPositionNotInTable = 2;   ///< table source: fractional, or not a row
inline constexpr uint32_t kPositionNotInAngles = 4;  ///< per_position caller angles: fractional,
                                                     ///< or not below their rows
inline constexpr uint32_t kPositionBeyondXposReach = 8;  ///< xPos: |p - xpos_center| > xpos_reach

/// One apply call for a kernel. Pair j (j < rotary_dim / 2) of a head rotates channels
///   a = rotary_offset + (j / block_pairs) * block_width + (j % block_pairs) * pair_step,  b = a + partner
///   half:          block_pairs = r/2,   block_width = r,   pair_step = 1, partner = r/2
///   interleaved:   block_pairs = r/2,   block_width = r,   pair_step = 2, partner = 1
///   block_half(B): block_pairs = r/2B,  block_width = r/B, pair_step = 1, partner = r/2B
/// (Schedule::channels, as numbers), by the angle of position p_j * inv_freq[j], p_j the token's
/// position in stream pair_stream[j] (pair_stream null: stream 0). Channels outside
/// [rotary_offset, rotary_offset + rotary_dim) are copied from in to out when copy_tail and the
/// operand is not in place, else left alone. Every operand shares dtype, batch, seq and head_dim.
struct KernelArgs {
  DType dtype = DType::f32;
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t tokens = 0;  ///< batch * seq, or 0 when every operand is empty (nothing to do)
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;
  int64_t rotary_offset = 0;
  int64_t block_pairs = 0;
  int64_t block_width = 0;
  int64_t pair_step = 1;
  int64_t partner = 0;
  KernelOperand operands[2] = {};
  int32_t operand_count = 0;
  KernelPositions positions{};
  const double* inv_freq = nullptr;   ///< rotary_dim / 2 values (exact source)
  const float* inv_freq_hf32 = nullptr;  ///< hf_float32 source: transformers' float32 inv_freq, or
                                         ///< null: the float nearest inv_freq
  const int* pair_stream = nullptr;   ///< rotary_dim / 2 stream indices, or null: all stream 0
  int32_t streams = 1;                ///< streams the schedule reads
  double attention_factor = 1.0;      ///< exact source (tables hold it already)
  KernelAngleSource angle_source = KernelAngleSource::exact;
  TableRows table{};                  ///< table source
  KernelCallerAngles angles{};        ///< caller source
  /// xPos (Schedule::xpos): pair j's row value times σ = e^±t, t = ln ζ_j (p - c)/γ, rounded once
  /// more (src/math/xpos.hpp computes ln ζ_j from j and rotary_dim: nothing per pair to pass).
  double xpos_scale_base = 0;         ///< γ; 0: no xPos
  double xpos_center = 0;             ///< c
  double xpos_reach = 0;              ///< the largest |p - c| served (rotary::xpos_reach)
  bool inverse = false;
  bool copy_tail = true;
  uint32_t* error = nullptr;  ///< optional: kPosition* bits or'ed in for skipped tokens
  int32_t threads = 0;        ///< CPU: OpenMP threads (ApplyArgs::threads); other backends ignore it
};

/// What hf_float32 angles need of Schedule::inv_freq_hf32: empty, or one value per pair, each finite,
/// >= 0 and <= max_inv_freq. Throws rotary::Error naming the value (src/table.cpp).
void check_hf_float32_frequencies(const Schedule& schedule);

/// The number of half-paired blocks of the rotated slice (block_half; 1 otherwise).
inline int64_t slice_blocks(const KernelArgs& args) { return args.rotary_dim / args.block_width; }

/// The contiguous range a Table covers, or throws rotary::Error "table positions are not one
/// contiguous range ..." (Table::at with gaps, repeats or another order). O(rows); allocates nothing.
TableRows table_range(const Table& table);

/// The rows of `table` for a call with these positions and batch * seq tokens: a range table as
/// table_range gives it; a list table with row_index filled into `row_index` (one entry per
/// position entry: streams * count per token, seq sequential), every position looked up once.
/// Positions must be in the table (validate checked them).
TableRows table_rows(const Table& table, const Positions& positions, int64_t seq, std::vector<int64_t>& row_index);

/// The kernel arguments of a call that passed rotary::validate(schedule, args), with the angles
/// from args.caller_angles (the caller's cos/sin), else from `table` (null: exact on the fly; args.table
/// is not read). The result points into schedule, args' views, positions and angles, and table:
/// they must outlive its use. Throws rotary::Error "angles and table are both set" when args.caller_angles
/// and `table` are. ApplyArgs::undo is folded in: the other direction, the reciprocal factor, and
/// each operand's xPos role swapped.
KernelArgs make_kernel_args(const Schedule& schedule, const ApplyArgs& args, const TableRows* table);

/// The same with args.table, a range table (its table_range; null: exact on the fly), as the source.
KernelArgs make_kernel_args(const Schedule& schedule, const ApplyArgs& args);

}  // namespace rotary::detail
