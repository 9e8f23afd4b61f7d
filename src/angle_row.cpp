// The one angle-row builder (kernel.hpp): positions per stream -> each pair's position -> cos and
// sin from the Table, the caller's tensors, or exact angles on the fly.
#include <array>
#include <type_traits>

#include "cpu/cpu.hpp"
#include "half.hpp"
#include "kernel.hpp"
#include "math/xpos.hpp"
#include "rotary/angle.hpp"

namespace rotary::detail {
namespace {

// The token's position in each stream the schedule reads. A single-stream Positions serves
// every stream (text tokens of an M-RoPE model: t = h = w).
std::array<double, max_streams> stream_positions(const Plan& plan, int64_t token, int64_t t) {
  std::array<double, max_streams> p{};
  const int streams = plan.schedule->streams;
  for (int k = 0; k < streams; ++k) {
    p[static_cast<size_t>(k)] = plan.positions.value(token, t, plan.positions.streams == 1 ? 0 : k);
  }
  return p;
}

// Per pair: the position of its stream, into scratch (multi-stream schedules only).
const double* pair_positions(const Plan& plan, const std::array<double, max_streams>& p,
                             const AngleScratch& scratch) {
  const Schedule& schedule = *plan.schedule;
  if (schedule.pair_stream.empty()) return nullptr;
  const int64_t pairs = schedule.pairs();
  for (int64_t j = 0; j < pairs; ++j) {
    scratch.pair_position[j] = p[static_cast<size_t>(schedule.pair_stream[static_cast<size_t>(j)])];
  }
  return scratch.pair_position;
}

double load_angle(const CallerAngles& a, const void* base, int64_t index) {
  switch (a.dtype) {
    case DType::f32: return static_cast<const float*>(base)[index];
    case DType::f64: return static_cast<const double*>(base)[index];
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(base)[index]);
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(base)[index]);
  }
  return 0;
}

// The caller's value for every pair, widened to Value, sin negated for the inverse.
template <class Value>
void caller_row(const Plan& plan, int64_t token, int64_t t, const std::array<double, max_streams>& p,
                Value* c, Value* s) {
  const CallerAngles& a = *plan.angles;
  const Schedule& schedule = *plan.schedule;
  const int64_t pairs = schedule.pairs();
  const int64_t step = a.columns == CallerAngles::Columns::repeated ? 2 : 1;
  const Value sign = plan.inverse ? Value(-1) : Value(1);
  for (int64_t j = 0; j < pairs; ++j) {
    int64_t first = 0;  // index along dimension 0
    int64_t row = 0;    // index along dimension 1
    if (a.index == CallerAngles::Index::per_token) {
      first = a.shape[0] == 1 ? 0 : token / plan.seq;
      row = t;
    } else {
      row = static_cast<int64_t>(p[static_cast<size_t>(schedule.stream_of(j))]);
    }
    const int64_t column = j * step;
    const int64_t ci = first * a.cos_strides[0] + row * a.cos_strides[1] + column * a.cos_strides[2];
    const int64_t si = first * a.sin_strides[0] + row * a.sin_strides[1] + column * a.sin_strides[2];
    c[j] = static_cast<Value>(load_angle(a, a.cos, ci));
    s[j] = sign * static_cast<Value>(load_angle(a, a.sin, si));
  }
}

// Table rows: pair j from the row of its stream's position (positions are whole numbers here).
template <class Value>
void table_rows(const Plan& plan, const std::array<double, max_streams>& p, Value* c, Value* s) {
  const Schedule& schedule = *plan.schedule;
  const Table& table = *plan.table;
  std::array<int64_t, max_streams> rows{};
  for (int k = 0; k < schedule.streams; ++k) {
    rows[static_cast<size_t>(k)] = *table.row_of(static_cast<int64_t>(p[static_cast<size_t>(k)]));
  }
  const Value sign = plan.inverse ? Value(-1) : Value(1);
  const int64_t pairs = schedule.pairs();
  // By runs of pairs that share a stream (M-RoPE sections: a few long runs), each a contiguous
  // copy from its row.
  for (int64_t first = 0; first < pairs;) {
    const int stream = schedule.stream_of(first);
    int64_t end = first + 1;
    while (end < pairs && schedule.stream_of(end) == stream) ++end;
    const int64_t row = rows[static_cast<size_t>(stream)];
    const float* cos_row = table.cos_row(row);
    const float* sin_row = table.sin_row(row);
    for (int64_t j = first; j < end; ++j) {
      c[j] = static_cast<Value>(cos_row[j]);
      s[j] = sign * static_cast<Value>(sin_row[j]);
    }
    first = end;
  }
}

}  // namespace

FloatRow float_angle_row(const Plan& plan, int64_t token, int64_t t, const AngleScratch& scratch,
                         bool vectorised) {
  const Schedule& schedule = *plan.schedule;
  const int64_t pairs = schedule.pairs();
  const std::array<double, max_streams> p = stream_positions(plan, token, t);
  if (plan.angles != nullptr) {
    caller_row(plan, token, t, p, scratch.c, scratch.s);
    return {scratch.c, scratch.s};
  }
  if (plan.table != nullptr) {
    if (schedule.pair_stream.empty() && !plan.inverse) {
      const int64_t row = *plan.table->row_of(static_cast<int64_t>(p[0]));
      return {plan.table->cos_row(row), plan.table->sin_row(row)};
    }
    table_rows(plan, p, scratch.c, scratch.s);
    return {scratch.c, scratch.s};
  }
  const double* pp = pair_positions(plan, p, scratch);
  const double g = plan.attention_factor;
  const float sign = plan.inverse ? -1.0f : 1.0f;
  if (vectorised) {
    cos_sin_row_f32(p[0], pp, schedule.inv_freq.data(), pairs, g, sign, scratch.c, scratch.s);
  } else {
    for (int64_t j = 0; j < pairs; ++j) {
      const CosSin cs = exact_cos_sin_real(pp != nullptr ? pp[j] : p[0],
                                           schedule.inv_freq[static_cast<size_t>(j)]);
      scratch.c[j] = static_cast<float>(cs.cos * g);
      scratch.s[j] = sign * static_cast<float>(cs.sin * g);
    }
  }
  return {scratch.c, scratch.s};
}

DoubleRow double_angle_row(const Plan& plan, int64_t token, int64_t t, const AngleScratch& scratch,
                           bool vectorised) {
  const Schedule& schedule = *plan.schedule;
  const int64_t pairs = schedule.pairs();
  const std::array<double, max_streams> p = stream_positions(plan, token, t);
  if (plan.angles != nullptr) {
    caller_row(plan, token, t, p, scratch.dc, scratch.ds);
    return {scratch.dc, scratch.ds};
  }
  if (plan.table != nullptr) {
    table_rows(plan, p, scratch.dc, scratch.ds);
    return {scratch.dc, scratch.ds};
  }
  const double* pp = pair_positions(plan, p, scratch);
  const double g = plan.attention_factor;
  if (vectorised) {
    cos_sin_row(p[0], pp, schedule.inv_freq.data(), pairs, g, scratch.dc, scratch.ds);
  } else {
    for (int64_t j = 0; j < pairs; ++j) {
      const CosSin cs = exact_cos_sin_real(pp != nullptr ? pp[j] : p[0],
                                           schedule.inv_freq[static_cast<size_t>(j)]);
      scratch.dc[j] = cs.cos * g;
      scratch.ds[j] = cs.sin * g;
    }
  }
  if (plan.inverse) {
    for (int64_t j = 0; j < pairs; ++j) scratch.ds[j] = -scratch.ds[j];
  }
  return {scratch.dc, scratch.ds};
}

namespace {

// Pair j's σ for operand op at the token's positions p.
double xpos_sigma(const Schedule& schedule, const std::array<double, max_streams>& p, int64_t j, bool key) {
  return xpos_scale(schedule.xpos_log_zeta[static_cast<size_t>(j)], p[static_cast<size_t>(schedule.stream_of(j))],
                    schedule.xpos_center, schedule.xpos_scale_base, key);
}

// Row values times pair j's σ for operand `op`, into c/s (row may alias them: each value is read
// before it is written). Float rows are rounded once more, double rows keep the double product.
template <class Value>
void scale_row(const Plan& plan, int64_t token, int64_t t, const Value* row_c, const Value* row_s,
               const Operand& op, Value* c, Value* s) {
  const Schedule& schedule = *plan.schedule;
  const std::array<double, max_streams> p = stream_positions(plan, token, t);
  for (int64_t j = 0; j < schedule.pairs(); ++j) {
    const double sigma = xpos_sigma(schedule, p, j, op.key);
    const Value cj = row_c[j];
    const Value sj = row_s[j];
    if constexpr (std::is_same_v<Value, float>) {
      c[j] = xpos_scaled(cj, sigma);
      s[j] = xpos_scaled(sj, sigma);
    } else {
      c[j] = ieee::mul(cj, sigma);
      s[j] = ieee::mul(sj, sigma);
    }
  }
}

}  // namespace

FloatRow xpos_float_row(const Plan& plan, int64_t token, int64_t t, FloatRow row, const Operand& op,
                        const AngleScratch& scratch) {
  scale_row(plan, token, t, row.c, row.s, op, scratch.c, scratch.s);
  return {scratch.c, scratch.s};
}

DoubleRow xpos_double_row(const Plan& plan, int64_t token, int64_t t, DoubleRow row, const Operand& op,
                          const AngleScratch& scratch) {
  scale_row(plan, token, t, row.c, row.s, op, scratch.dc, scratch.ds);
  return {scratch.dc, scratch.ds};
}

}  // namespace rotary::detail
