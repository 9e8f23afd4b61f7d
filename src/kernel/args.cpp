#include "args.hpp"

#include <fmt/format.h>

#include "../apply_internal.hpp"
#include "../memory.hpp"
#include "rotary/apply.hpp"
#include "math/hd.hpp"
#include "rotary/error.hpp"

namespace rotary::detail {
namespace {

KernelPositions kernel_positions(const Positions& p) {
  using Kind = Positions::Kind;
  KernelPositions out;
  out.offset = p.offset;
  out.data = p.data;
  out.count = p.count;
  out.streams = p.streams;
  switch (p.kind) {
    case Kind::sequential: out.kind = KernelPositions::Kind::sequential; break;
    case Kind::per_token_i32: out.kind = KernelPositions::Kind::i32; break;
    case Kind::per_token_i64: out.kind = KernelPositions::Kind::i64; break;
    case Kind::per_token_f32: out.kind = KernelPositions::Kind::f32; break;
    case Kind::per_token_f64: out.kind = KernelPositions::Kind::f64; break;
  }
  return out;
}

// `in` and its output (`out`, or `in` itself when unset), as ApplyArgs says, into `op` (a
// KernelArgs member, written in place).
void set_kernel_operand(KernelOperand& op, const TensorView& in, const TensorView& out) {
  const TensorView& target = out.is_set() ? out : in;
  op.in = in.data;
  op.out = target.data;
  op.heads = in.heads();
  for (size_t d = 0; d < 4; ++d) {
    op.in_strides[d] = in.strides[d];
    op.out_strides[d] = target.strides[d];
  }
  op.in_place = !out.is_set() || same_view(out, in);
}

KernelCallerAngles kernel_angles(const CallerAngles& a) {
  KernelCallerAngles out;
  out.cos = a.cos;
  out.sin = a.sin;
  out.dtype = a.dtype;
  out.per_position = a.index == CallerAngles::Index::per_position;
  out.broadcast = !out.per_position && a.shape[0] == 1;
  out.column_step = a.columns == CallerAngles::Columns::repeated ? 2 : 1;
  out.rows = out.per_position ? a.shape[1] : 0;
  for (size_t d = 0; d < 3; ++d) {
    out.cos_strides[d] = a.cos_strides[d];
    out.sin_strides[d] = a.sin_strides[d];
  }
  return out;
}

}  // namespace

TableRows table_range(const Table& table) {
  TableRows range{.cos = table.cos().data(), .sin = table.sin().data(), .first = 0,
                  .rows = table.rows()};
  if (table.rows() == 0) return range;
  range.first = table.position(0);
  if (table.is_range()) return range;
  for (int64_t r = 1; r < table.rows(); ++r) {
    if (table.position(r) != range.first + r) {
      throw Error(fmt::format("table positions are not one contiguous range: row {} holds position "
                              "{} after position {} (build it with Table::range)",
                              r, table.position(r), table.position(r - 1)));
    }
  }
  return range;
}

TableRows table_rows(const Table& table, const Positions& positions, int64_t seq, std::vector<int64_t>& row_index) {
  if (table.is_range() || table.rows() == 0) return table_range(table);
  // A list table: each position entry's row, looked up once for the whole call.
  const bool sequential = positions.kind == Positions::Kind::sequential;
  const int64_t entries = sequential ? seq : positions.streams * positions.count;
  row_index.resize(static_cast<size_t>(entries));
  for (int64_t i = 0; i < entries; ++i) {
    const int64_t count = sequential ? seq : positions.count;
    const int stream = static_cast<int>(i / count);
    const int64_t entry = i % count;
    const auto position = static_cast<int64_t>(positions.value(entry, entry, stream));
    const std::optional<int64_t> row = table.row_of(position);
    ROTARY_DASSERT(row.has_value());  // validate: every position has its row
    row_index[static_cast<size_t>(i)] = row ? *row : -1;
  }
  return TableRows{.cos = table.cos().data(), .sin = table.sin().data(), .first = 0, .rows = table.rows(),
                   .row_index = row_index.data()};
}

// The deprecated ApplyArgs::angles, for callers that come to make_kernel_args directly (out of line
// and cold: the folded copy's frame stays off the per-call path).
[[gnu::noinline, gnu::cold]] KernelArgs kernel_args_with_old_names(const Schedule& schedule, const ApplyArgs& args,
                                                                   const TableRows* table) {
  return make_kernel_args(schedule, folded(args), table);
}

KernelArgs make_kernel_args(const Schedule& schedule, const ApplyArgs& args, const TableRows* table) {
  KernelArgs k;  // the one object returned (named return value: built in the caller's slot)
  if (uses_old_names(args)) [[unlikely]] {
    k = kernel_args_with_old_names(schedule, args, table);
    return k;
  }
  if (args.caller_angles != nullptr && table != nullptr) {
    throw Error("angles and table are both set (give one source of angles)");
  }
  k.dtype = args.q.dtype;
  k.batch = args.q.batch();
  k.seq = args.q.seq();
  k.head_dim = schedule.head_dim;
  k.rotary_dim = schedule.rotary_dim;
  k.rotary_offset = schedule.rotary_offset;
  const int64_t pairs = schedule.pairs();
  const int64_t blocks = schedule.blocks > 1 ? schedule.blocks : 1;
  ROTARY_DASSERT(pairs > 0 && pairs % blocks == 0);  // validate(schedule)
  k.block_pairs = pairs / blocks;
  k.block_width = schedule.rotary_dim / blocks;
  const bool interleaved = blocks == 1 && schedule.pairing == Pairing::interleaved;
  k.pair_step = interleaved ? 2 : 1;
  k.partner = interleaved ? 1 : k.block_pairs;
  set_kernel_operand(k.operands[0], args.q, args.q_out);
  // undo divides out σ: a query's is a key's inverse scale and the other way round.
  k.operands[0].key = args.q_is_key != args.undo;
  k.operand_count = 1;
  if (args.k.is_set()) {
    set_kernel_operand(k.operands[1], args.k, args.k_out);
    k.operands[1].key = !args.undo;
    k.operand_count = 2;
  }
  // Nothing to do when every operand is empty (then batch * seq, bounded by no view, is not formed).
  const bool any = !args.q.is_empty() || (args.k.is_set() && !args.k.is_empty());
  k.tokens = any ? k.batch * k.seq : 0;
  k.positions = kernel_positions(args.positions);
  k.inv_freq = schedule.inv_freq.data();
  k.pair_stream = schedule.pair_stream.empty() ? nullptr : schedule.pair_stream.data();
  k.streams = schedule.streams;
  k.attention_factor = args.undo ? 1.0 / schedule.attention_factor : schedule.attention_factor;
  if (args.caller_angles != nullptr) {
    k.angle_source = KernelAngleSource::caller;
    k.angles = kernel_angles(*args.caller_angles);
  } else if (table != nullptr) {
    k.angle_source = KernelAngleSource::table;
    k.table = *table;
  } else if (numerics_of(args) == AngleMode::hf_float32) {
    k.angle_source = KernelAngleSource::hf_float32;
    k.inv_freq_hf32 = schedule.inv_freq_hf32.empty() ? nullptr : schedule.inv_freq_hf32.data();
  }
  if (schedule.xpos()) {
    k.xpos_scale_base = schedule.xpos_scale_base;
    k.xpos_center = schedule.xpos_center;
    k.xpos_reach = xpos_reach(schedule);
  }
  k.inverse = (args.direction == Direction::inverse) != args.undo;
  k.copy_tail = args.copy_tail;
  k.threads = args.threads;
  return k;
}

KernelArgs make_kernel_args(const Schedule& schedule, const ApplyArgs& args) {
  if (args.table == nullptr) return make_kernel_args(schedule, args, nullptr);
  const TableRows range = table_range(*args.table);
  return make_kernel_args(schedule, args, &range);
}

}  // namespace rotary::detail
