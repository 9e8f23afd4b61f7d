// Internal: what a validated apply call hands to a kernel — raw pointers and element strides.
#pragma once

#include <array>
#include <cstdint>

#include "rotary/apply.hpp"

namespace rotary::detail {

/// One tensor to rotate (q or k).
struct Operand {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t heads = 0;
  std::array<int64_t, 4> in_strides{};
  std::array<int64_t, 4> out_strides{};
  bool in_place = true;
  bool key = false;  ///< xPos: scaled as a key (ζ^-(p - c)/γ), else as a query (undo swaps them)
};

/// A validated call. Every pointer is non-null for non-empty operands; every position is in range
/// (and in the table, when there is one); at least one operand is non-empty, and every view spans
/// < max_view_bytes, so no element or byte offset a kernel forms overflows int64.
struct Plan {
  DType dtype = DType::f32;
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;
  int64_t rotary_offset = 0;  ///< first rotated channel
  int64_t blocks = 1;         ///< block_half: half pairing inside each of `blocks` blocks
  Pairing pairing = Pairing::half;
  bool inverse = false;          ///< turn by -angle (ApplyArgs' inverse, or undo of forward)
  double attention_factor = 1.0;  ///< exact angles' factor: the schedule's, or its reciprocal (undo)
  bool copy_tail = true;
  std::array<Operand, 2> operands{};
  int operand_count = 0;
  Positions positions{};
  const Table* table = nullptr;
  const CallerAngles* angles = nullptr;  ///< the caller's cos/sin (then table is null)
  const Schedule* schedule = nullptr;
  int threads = 0;
};

/// The team for one OpenMP loop over `blocks` independent blocks: `requested` threads (0:
/// omp_get_max_threads()), cut to at most omp_get_num_procs() (counted at the first call),
/// max_threads and `blocks`, and at least 1. Every OpenMP team the library starts is sized by
/// this, so no count a caller passes (or OMP_NUM_THREADS sets) asks for more threads than can run.
int useful_threads(int requested, int64_t blocks);

/// Per-thread room for one token's angles: `pairs` values in each array.
struct AngleScratch {
  float* c = nullptr;
  float* s = nullptr;
  double* dc = nullptr;
  double* ds = nullptr;
  double* pair_position = nullptr;  ///< per pair: the position of its stream (multi-stream only)
};

/// One token's angles in pair order: cos and sin times the attention factor, sin negated for the
/// inverse. Float rows are what f32/f16/bf16 rotate with (the values a Table holds: one rounding
/// to float of the exact value); double rows serve f64 storage (exact values times the factor in
/// double; Table or caller floats widened).
struct FloatRow {
  const float* c = nullptr;
  const float* s = nullptr;
};
struct DoubleRow {
  const double* c = nullptr;
  const double* s = nullptr;
};

/// The one angle-row builder of the reference and the CPU kernels: the token's position in each
/// stream (plan.positions), each pair's stream (schedule pair_stream), then its value from the
/// Table, the caller's cos/sin, or exact on-the-fly angles. `vectorised` picks how on-the-fly
/// angles are evaluated: the Highway row (CPU) or rotary::exact_cos_sin pair by pair (reference);
/// both compute the same exact values bit for bit (src/math/exact_angle.hpp) and round them once.
/// Rows may point into the Table (single stream, forward) or into scratch.
FloatRow float_angle_row(const Plan& plan, int64_t token, int64_t t, const AngleScratch& scratch,
                         bool vectorised);
DoubleRow double_angle_row(const Plan& plan, int64_t token, int64_t t, const AngleScratch& scratch,
                           bool vectorised);

/// xPos (schedule.xpos()): `row` scaled for operand `op` (a query's or a key's σ per pair, from the
/// token's positions: src/math/xpos.hpp), into scratch.c/s (row may point there: each value is read
/// before it is written). Not for caller angles (validate refuses them with xPos).
FloatRow xpos_float_row(const Plan& plan, int64_t token, int64_t t, FloatRow row, const Operand& op,
                        const AngleScratch& scratch);
DoubleRow xpos_double_row(const Plan& plan, int64_t token, int64_t t, DoubleRow row, const Operand& op,
                          const AngleScratch& scratch);

/// The scalar oracle: loops written from the formulas, double arithmetic, single-threaded.
void reference_apply(const Plan& plan);

}  // namespace rotary::detail
