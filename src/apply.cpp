#include "rotary/apply.hpp"

#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "cpu/cpu.hpp"
#include "kernel.hpp"
#include "memory.hpp"
#include "rotary/error.hpp"

namespace rotary {
namespace {

using detail::may_overlap;
using detail::same_view;
using detail::shape_text;

void check_view(const TensorView& v, const char* name, const Schedule& schedule) {
  detail::check_view(v, name);
  if (v.head_dim() != schedule.head_dim) {
    throw Error(fmt::format("{}.head_dim={} differs from the schedule's head_dim={}", name,
                            v.head_dim(), schedule.head_dim));
  }
}

// `out` is an explicit output (checked as a view first) or the input itself, in place.
void check_output(const TensorView& out, const char* name, const TensorView& in,
                  const char* in_name, const Schedule& schedule) {
  if (!same_view(out, in)) check_view(out, name, schedule);
  if (out.dtype != in.dtype) {
    throw Error(fmt::format("{}.dtype={} differs from {}.dtype={}", name, to_string(out.dtype),
                            in_name, to_string(in.dtype)));
  }
  if (out.shape != in.shape) {
    throw Error(fmt::format("{} shape {} differs from {} shape {}", name, shape_text(out), in_name,
                            shape_text(in)));
  }
  if (detail::self_overlaps(out)) {
    throw Error(fmt::format("{} strides [{}, {}, {}, {}] make elements overlap", name,
                            out.strides[0], out.strides[1], out.strides[2], out.strides[3]));
  }
}

void check_position_value(int64_t position, int64_t index, const Table* table) {
  if (position < 0 || position >= max_position_limit) {
    throw Error(fmt::format("positions[{}]={} must be in [0, 2^31)", index, position));
  }
  if (table != nullptr && !table->row_of(position)) {
    throw Error(fmt::format("positions[{}]={} is not in the table", index, position));
  }
}

// batch and seq are >= 0 (checked); their product may still leave int64 for an empty view.
void check_positions(const Positions& positions, int64_t batch, int64_t seq, const Table* table) {
  using Kind = Positions::Kind;
  switch (positions.kind) {
    case Kind::sequential: {
      if (positions.offset < 0 || positions.offset >= max_position_limit ||
          (seq > 0 && positions.offset > max_position_limit - seq)) {
        throw Error(fmt::format("offset={} with seq={} must keep positions in [0, 2^31)",
                                positions.offset, seq));
      }
      if (table == nullptr || batch == 0) return;
      for (int64_t s = 0; s < seq; ++s) check_position_value(positions.offset + s, s, table);
      return;
    }
    case Kind::per_token_i32:
    case Kind::per_token_i64: {
      int64_t tokens = 0;
      if (__builtin_mul_overflow(batch, seq, &tokens)) {
        throw Error(fmt::format("positions has {} entries but batch*seq={}*{} exceeds 2^63",
                                positions.count, batch, seq));
      }
      if (positions.count != tokens) {
        throw Error(fmt::format("positions has {} entries but batch*seq={}", positions.count, tokens));
      }
      if (tokens > 0 && positions.data == nullptr) throw Error("positions data is null");
      for (int64_t i = 0; i < tokens; ++i) check_position_value(positions.at(i, 0), i, table);
      return;
    }
  }
  throw Error(fmt::format("positions.kind={} is not sequential or per_token",
                          static_cast<int>(positions.kind)));
}

// The table's schedule is bit-for-bit this one (a Table validates its schedule when built).
bool same_schedule(const Table& table, const Schedule& schedule) {
  const Schedule& mine = table.schedule();
  return mine.head_dim == schedule.head_dim && mine.rotary_dim == schedule.rotary_dim &&
         mine.pairing == schedule.pairing && mine.type == schedule.type &&
         std::bit_cast<uint64_t>(mine.attention_factor) == std::bit_cast<uint64_t>(schedule.attention_factor) &&
         mine.inv_freq.size() == schedule.inv_freq.size() &&
         std::memcmp(mine.inv_freq.data(), schedule.inv_freq.data(), mine.inv_freq.size() * sizeof(double)) == 0;
}

}  // namespace

void validate(const Schedule& schedule, const ApplyArgs& args) {
  const bool table_matches = args.table != nullptr && same_schedule(*args.table, schedule);
  if (!table_matches) validate(schedule);
  if (!args.q.is_set()) throw Error("q is not set (q is TensorView{}: data null, shape all 0)");
  check_view(args.q, "q", schedule);
  const bool has_k = args.k.is_set();
  if (has_k) {
    check_view(args.k, "k", schedule);
    if (args.k.dtype != args.q.dtype) {
      throw Error(fmt::format("k.dtype={} differs from q.dtype={}", to_string(args.k.dtype),
                              to_string(args.q.dtype)));
    }
    if (args.k.batch() != args.q.batch() || args.k.seq() != args.q.seq()) {
      throw Error(fmt::format("k shape {} disagrees with q shape {} in batch or seq",
                              shape_text(args.k), shape_text(args.q)));
    }
  } else if (args.k_out.is_set()) {
    throw Error("k_out is set but k is not");
  }
  if (args.threads < 0 || args.threads > max_threads) {
    throw Error(fmt::format("threads={} must be in [0, {}]", args.threads, max_threads));
  }
  if (args.direction != Direction::forward && args.direction != Direction::inverse) {
    throw Error(fmt::format("direction={} is not forward or inverse", static_cast<int>(args.direction)));
  }
  if (args.backend != Backend::automatic && args.backend != Backend::reference &&
      args.backend != Backend::cpu) {
    throw Error(fmt::format("backend={} is not automatic, reference or cpu", static_cast<int>(args.backend)));
  }

  // Effective outputs: the input itself when in place.
  const TensorView q_out = args.q_out.is_set() ? args.q_out : args.q;
  check_output(q_out, args.q_out.is_set() ? "q_out" : "q (in place)", args.q, "q", schedule);
  TensorView k_out{};
  if (has_k) {
    k_out = args.k_out.is_set() ? args.k_out : args.k;
    check_output(k_out, args.k_out.is_set() ? "k_out" : "k (in place)", args.k, "k", schedule);
  }
  // Aliasing: an output may coincide exactly with its own input (in place); otherwise it must not
  // share an element with any input or with the other output.
  struct Named {
    const TensorView* view;
    const char* name;
  };
  const Named outputs[2] = {{&q_out, args.q_out.is_set() ? "q_out" : "q (in place)"},
                            {&k_out, args.k_out.is_set() ? "k_out" : "k (in place)"}};
  const Named inputs[2] = {{&args.q, "q"}, {&args.k, "k"}};
  const int count = has_k ? 2 : 1;
  for (int o = 0; o < count; ++o) {
    for (int i = 0; i < count; ++i) {
      const TensorView& out = *outputs[o].view;
      const TensorView& in = *inputs[i].view;
      if (o == i && same_view(out, in)) continue;
      if (may_overlap(out, in)) {
        throw Error(fmt::format("{} overlaps input {} (outputs must be the input itself or disjoint)",
                                outputs[o].name, inputs[i].name));
      }
    }
  }
  if (has_k && may_overlap(q_out, k_out)) {
    throw Error(fmt::format("{} overlaps {}", outputs[0].name, outputs[1].name));
  }
  if (args.table != nullptr && !table_matches) {
    throw Error("table was built from a different schedule than the one passed to apply");
  }
  check_positions(args.positions, args.q.batch(), args.q.seq(), args.table);
}

void apply(const Schedule& schedule, const ApplyArgs& args) {
  validate(schedule, args);
  detail::Plan plan;
  plan.dtype = args.q.dtype;
  plan.batch = args.q.batch();
  plan.seq = args.q.seq();
  plan.head_dim = schedule.head_dim;
  plan.rotary_dim = schedule.rotary_dim;
  plan.pairing = schedule.pairing;
  plan.inverse = args.direction == Direction::inverse;
  plan.copy_tail = args.copy_tail;
  plan.positions = args.positions;
  plan.table = args.table;
  plan.schedule = &schedule;
  plan.threads = args.threads;
  auto add = [&](const TensorView& in, const TensorView& out) {
    const TensorView& target = out.is_set() ? out : in;
    detail::Operand op;
    op.in = in.data;
    op.out = target.data;
    op.heads = in.heads();
    op.in_strides = in.strides;
    op.out_strides = target.strides;
    op.in_place = !out.is_set() || same_view(out, in);
    plan.operands[static_cast<size_t>(plan.operand_count++)] = op;
  };
  add(args.q, args.q_out);
  if (args.k.is_set()) add(args.k, args.k_out);
  // Empty q and k: nothing to do (and batch * seq, which no output bounds then, is never formed).
  if (args.q.is_empty() && (!args.k.is_set() || args.k.is_empty())) return;
  if (args.backend == Backend::reference) {
    detail::reference_apply(plan);
  } else {
    detail::cpu_apply(plan);
  }
}

}  // namespace rotary
