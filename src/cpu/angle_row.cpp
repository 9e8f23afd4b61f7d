// The CPU's angle rows: the kernel layer's angle semantics (src/kernel/angles.hpp) for a whole
// token at once, with two fast paths of the same bits: a pointer into the Table's row (one stream,
// forward), and the vectorised exact row (cos_sin_row_f32 / cos_sin_row, Highway) for exact angles.
#include <array>

#include "../kernel/angles.hpp"
#include "cpu.hpp"

namespace rotary::detail {
namespace {

// Per pair: the position of its stream, into scratch (multi-stream schedules only); else null and
// every pair reads stream 0's position, returned in `first`.
const double* pair_positions(const KernelArgs& args, int64_t token, int64_t s, const AngleScratch& scratch,
                             double& first) {
  std::array<double, max_streams> p{};
  for (int k = 0; k < args.streams; ++k) p[static_cast<size_t>(k)] = position_of(args.positions, token, s, k);
  first = p[0];
  if (args.pair_stream == nullptr) return nullptr;
  const int64_t pairs = args.rotary_dim / 2;
  for (int64_t j = 0; j < pairs; ++j) scratch.pair_position[j] = p[static_cast<size_t>(args.pair_stream[j])];
  return scratch.pair_position;
}

// Every pair from pair_angle, into c/s.
template <class Value>
void pair_by_pair(const KernelArgs& args, int64_t token, int64_t s, Value* c, Value* sn) {
  const PairArrays pairs = pair_arrays(args);
  const int64_t b = token / args.seq;
  for (int64_t j = 0; j < args.rotary_dim / 2; ++j) {
    const AngleCell<Value> cell = pair_angle<Value>(args, pairs, token, b, s, j);
    c[j] = cell.c;
    sn[j] = cell.s;
  }
}

}  // namespace

FloatRow float_angle_row(const KernelArgs& args, int64_t token, int64_t s, const AngleScratch& scratch) {
  if (args.angle_source == KernelAngleSource::table && args.pair_stream == nullptr && !args.inverse) {
    const int64_t at = table_row(args, token, s, 0) * (args.rotary_dim / 2);
    return {args.table.cos + at, args.table.sin + at};
  }
  if (args.angle_source != KernelAngleSource::exact) {
    pair_by_pair(args, token, s, scratch.c, scratch.s);
    return {scratch.c, scratch.s};
  }
  double first = 0;
  const double* pp = pair_positions(args, token, s, scratch, first);
  cos_sin_row_f32(first, pp, args.inv_freq, args.rotary_dim / 2, args.attention_factor, args.inverse ? -1.0f : 1.0f,
                  scratch.c, scratch.s);
  return {scratch.c, scratch.s};
}

DoubleRow double_angle_row(const KernelArgs& args, int64_t token, int64_t s, const AngleScratch& scratch) {
  if (args.angle_source != KernelAngleSource::exact) {
    pair_by_pair(args, token, s, scratch.dc, scratch.ds);
    return {scratch.dc, scratch.ds};
  }
  double first = 0;
  const double* pp = pair_positions(args, token, s, scratch, first);
  const int64_t pairs = args.rotary_dim / 2;
  cos_sin_row(first, pp, args.inv_freq, pairs, args.attention_factor, scratch.dc, scratch.ds);
  if (args.inverse) {
    for (int64_t j = 0; j < pairs; ++j) scratch.ds[j] = -scratch.ds[j];
  }
  return {scratch.dc, scratch.ds};
}

namespace {

// Row values times pair j's σ for operand `op` (xpos_angle), into c/s (row may alias them: each
// value is read before it is written).
template <class Value>
void scale_row(const KernelArgs& args, int64_t token, int64_t s, const Value* row_c, const Value* row_s,
               const KernelOperand& op, Value* c, Value* sn) {
  const PairArrays pairs = pair_arrays(args);
  for (int64_t j = 0; j < args.rotary_dim / 2; ++j) {
    const AngleCell<Value> cell = xpos_angle(args, pairs, token, s, j, op.key, AngleCell<Value>{row_c[j], row_s[j]});
    c[j] = cell.c;
    sn[j] = cell.s;
  }
}

}  // namespace

FloatRow xpos_float_row(const KernelArgs& args, int64_t token, int64_t s, FloatRow row, const KernelOperand& op,
                        const AngleScratch& scratch) {
  scale_row(args, token, s, row.c, row.s, op, scratch.c, scratch.s);
  return {scratch.c, scratch.s};
}

DoubleRow xpos_double_row(const KernelArgs& args, int64_t token, int64_t s, DoubleRow row, const KernelOperand& op,
                          const AngleScratch& scratch) {
  scale_row(args, token, s, row.c, row.s, op, scratch.dc, scratch.ds);
  return {scratch.dc, scratch.ds};
}

}  // namespace rotary::detail
