#include "rotary/apply.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <optional>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "apply_internal.hpp"
#include "kernel/args.hpp"
#include "kernel/backend.hpp"
#include "memory.hpp"
#include "rotary/error.hpp"

namespace rotary {
namespace {

using detail::may_overlap;
using detail::may_overlap_checked;
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
  if (out.shape[0] != in.shape[0] || out.shape[1] != in.shape[1] || out.shape[2] != in.shape[2] ||
      out.shape[3] != in.shape[3]) {  // element by element: no memcmp per call
    throw Error(fmt::format("{} shape {} differs from {} shape {}", name, shape_text(out), in_name,
                            shape_text(in)));
  }
  if (detail::self_overlaps_checked(out)) {  // out passed check_view (here or as the input)
    throw Error(fmt::format("{} strides [{}, {}, {}, {}] make elements overlap", name,
                            out.strides[0], out.strides[1], out.strides[2], out.strides[3]));
  }
}

// A position as the user wrote it: whole numbers in full (3000000000, not 3e+09), others as the
// shortest text that reads back the same double.
std::string position_text(double position) {
  if (std::isfinite(position) && position == std::trunc(position) && std::fabs(position) < 0x1p63) {
    return fmt::format("{}", static_cast<int64_t>(position));
  }
  return fmt::format("{}", position);
}

// Entry i of stream k as the caller wrote it: integers in full, even beyond 2^53.
std::string entry_text(const Positions& positions, int64_t i, int k) {
  const int64_t at = k * positions.count + i;
  switch (positions.kind) {
    case Positions::Kind::per_token_i32: return std::to_string(static_cast<const int32_t*>(positions.data)[at]);
    case Positions::Kind::per_token_i64: return std::to_string(static_cast<const int64_t*>(positions.data)[at]);
    default: return position_text(positions.value(i, i, k));
  }
}

// Entry `index` (of stream `stream`, per-token positions) is a position: in [0, 2^31), a whole
// number when a table or per-position caller angles index rows by it, and in them.
// text(): the entry as the caller wrote it (for messages only).
template <class Text>
// row_out: where the table row found for the position goes (null: not wanted).
void check_position_value(double position, int64_t index, int stream, int streams,
                          const Table* table, int64_t angle_rows, bool hf_float32, Text text,
                          int64_t* row_out = nullptr) {
  // Formatted only on error: this runs once per position on every call.
  const auto where = [&] {
    return streams > 1 ? fmt::format("positions[{}][{}]", stream, index)
                       : fmt::format("positions[{}]", index);
  };
  if (!(position >= 0 && position < static_cast<double>(max_position_limit))) {
    throw Error(fmt::format("{}={} must be in [0, 2^31)", where(), text()));
  }
  if (table == nullptr && angle_rows < 0 && !hf_float32) return;
  if (position != static_cast<double>(static_cast<int64_t>(position))) {
    if (table == nullptr && angle_rows < 0) {
      throw Error(fmt::format("{}={} is fractional; numerics=hf_float32 takes whole positions (transformers' "
                              "float32 pipeline casts integer positions)", where(), position));
    }
    throw Error(fmt::format("{}={} is fractional; a {} holds whole positions only (use exact "
                            "angles: no table)", where(), position,
                            table != nullptr ? "table" : "per_position cos/sin tensor"));
  }
  const auto whole = static_cast<int64_t>(position);
  if (table != nullptr) {
    const std::optional<int64_t> row = table->row_of(whole);
    if (!row) throw Error(fmt::format("{}={} is not in the table", where(), whole));
    if (row_out != nullptr) *row_out = *row;
  }
  if (angle_rows >= 0 && whole >= angle_rows) {
    throw Error(fmt::format("{}={} is beyond the {} rows of the per_position cos/sin", where(), whole,
                            angle_rows));
  }
}

// Per-token positions whose caller gave their shape (Positions::with_shape): each stream
// [rows, seq] with rows = batch or 1. Entry counts alone cannot tell [batch, seq] from a
// transposed [seq, batch] or a [batch * seq, 1] column.
void check_positions_shape(const std::array<int64_t, 2>& shape, int streams, int64_t batch, int64_t seq) {
  const auto [rows, cols] = shape;
  if (cols == seq && (rows == batch || rows == 1)) return;
  const std::string given = streams > 1 ? fmt::format("[{}, {}, {}]", streams, rows, cols)
                                        : fmt::format("[{}, {}]", rows, cols);
  const std::string lead = streams > 1 ? fmt::format("{}, ", streams) : "";
  throw Error(fmt::format("positions shape {} must be [{}batch={}, seq={}] or [{}1, seq={}] (one row for "
                          "every batch row){}", given, lead, batch, seq, lead, seq,
                          rows == seq && cols == batch ? ": it looks transposed" : ""));
}

// xPos: every position within xpos_reach of the centre, else ζ^((p - c)/γ) leaves float range.
// lowest/highest: the call's extreme positions; where(p) names the entry holding p.
template <class Where>
void check_xpos_extent(const Schedule& schedule, double lowest, double highest, Where where) {
  const double reach = xpos_reach(schedule);
  const double c = schedule.xpos_center;
  const bool low_out = c - lowest > reach;
  const bool high_out = highest - c > reach;
  if (!low_out && !high_out) return;
  const double p = high_out ? highest : lowest;
  const std::string advice =
      highest - lowest <= 2 * reach
          ? fmt::format("xpos_center={} serves this call's positions [{}, {}]", (lowest + highest) / 2,
                        lowest, highest)
          : fmt::format("no one xpos_center serves this call's positions [{}, {}] (they span more than "
                        "2*{:.1f}): split the call, or shift cached keys back with rerotate",
                        lowest, highest, reach);
  throw Error(fmt::format("{} is beyond xPos's reach: |position - xpos_center={}| must be <= {:.1f} with "
                          "xpos_scale_base={} (further, zeta^((p - c)/gamma) leaves float range); {}",
                          where(p), c, reach, schedule.xpos_scale_base, advice));
}

// batch and seq are >= 0 (checked); their product may still leave int64 for an empty view.
// angle_rows: rows of per_position caller angles, else -1.
// Returns the lowest and highest position read (when read_entries, or sequential), else nullopt.
std::optional<std::pair<double, double>> check_positions(const Positions& positions, const Schedule& schedule,
                                                        int64_t batch, int64_t seq, const Table* table,
                                                        int64_t angle_rows, bool hf_float32, bool read_entries,
                                                        std::vector<int64_t>* rows_out) {
  using Kind = Positions::Kind;
  // A list table's rows, as table_rows lays them out (one per position entry), recorded by the
  // search that checks each position, so that apply searches once.
  if (table == nullptr || table->is_range() || table->rows() == 0 || !read_entries) rows_out = nullptr;
  if (positions.streams < 1 || positions.streams > max_streams) {
    throw Error(fmt::format("positions streams={} must be in [1, {}]", positions.streams, max_streams));
  }
  if (positions.streams != 1 && positions.streams != schedule.streams) {
    throw Error(schedule.streams == 1
                    ? fmt::format("positions has {} streams but the schedule reads 1",
                                  positions.streams)
                    : fmt::format("positions has {} streams but the schedule reads {} (give {} or "
                                  "1, one stream serving all)", positions.streams,
                                  schedule.streams, schedule.streams));
  }
  switch (positions.kind) {
    case Kind::sequential: {
      if (positions.offset < 0 || positions.offset >= max_position_limit ||
          (seq > 0 && positions.offset > max_position_limit - seq)) {
        throw Error(fmt::format("offset={} with seq={} must keep positions in [0, 2^31)",
                                positions.offset, seq));
      }
      if (batch == 0 || seq == 0) return std::nullopt;
      const std::pair<double, double> extent{static_cast<double>(positions.offset),
                                             static_cast<double>(positions.offset + seq - 1)};
      if (schedule.xpos()) {
        check_xpos_extent(schedule, static_cast<double>(positions.offset),
                          static_cast<double>(positions.offset + seq - 1), [&](double p) {
                            return fmt::format("position {} (offset={} + {})", p, positions.offset,
                                               static_cast<int64_t>(p) - positions.offset);
                          });
      }
      if (table == nullptr && angle_rows < 0) return extent;
      if (rows_out != nullptr) rows_out->resize(static_cast<size_t>(seq));
      for (int64_t s = 0; s < seq; ++s) {
        check_position_value(static_cast<double>(positions.offset + s), s, 0, 1, table, angle_rows, false,
                             [&] { return std::to_string(positions.offset + s); },
                             rows_out != nullptr ? rows_out->data() + s : nullptr);
      }
      return extent;
    }
    case Kind::per_token_i32:
    case Kind::per_token_i64:
    case Kind::per_token_f32:
    case Kind::per_token_f64: {
      int64_t tokens = 0;
      if (__builtin_mul_overflow(batch, seq, &tokens)) {
        throw Error(fmt::format("positions has {} entries but batch*seq={}*{} exceeds 2^63",
                                positions.count, batch, seq));
      }
      // One row for every batch row ([seq]) serves an empty batch too: nothing to rotate.
      if (positions.count != tokens && positions.count != seq) {
        throw Error(fmt::format("positions has {} entries{} but batch*seq={} (or seq={}: one row "
                                "for every batch row)", positions.count,
                                positions.streams > 1 ? " per stream" : "", tokens, seq));
      }
      if (positions.shape) check_positions_shape(*positions.shape, positions.streams, batch, seq);
      if (tokens > 0 && positions.data == nullptr) throw Error("positions data is null");
      if (!read_entries || tokens == 0) return std::nullopt;
      const int64_t per_stream = positions.count;
      double lowest = max_position_limit;
      double highest = 0;
      if (rows_out != nullptr) rows_out->resize(static_cast<size_t>(positions.streams * per_stream));
      for (int k = 0; k < positions.streams; ++k) {
        for (int64_t i = 0; i < per_stream; ++i) {
          const double p = positions.value(i, i, k);
          check_position_value(p, i, k, positions.streams, table, angle_rows, hf_float32,
                               [&] { return entry_text(positions, i, k); },
                               rows_out != nullptr ? rows_out->data() + k * per_stream + i : nullptr);
          lowest = std::min(lowest, p);
          highest = std::max(highest, p);
        }
      }
      if (schedule.xpos()) {
        check_xpos_extent(schedule, lowest, highest, [&](double p) {
          for (int k = 0; k < positions.streams; ++k) {
            for (int64_t i = 0; i < per_stream; ++i) {
              if (positions.value(i, i, k) != p) continue;
              return positions.streams > 1 ? fmt::format("positions[{}][{}]={}", k, i, position_text(p))
                                           : fmt::format("positions[{}]={}", i, position_text(p));
            }
          }
          return fmt::format("position {}", p);
        });
      }
      return std::pair{lowest, highest};
    }
  }
  throw Error(fmt::format("positions.kind={} is not sequential or per_token",
                          static_cast<int>(positions.kind)));
}


// Shape rules of caller angles; returns the rows of a per_position tensor, else -1.
int64_t check_caller_angles(const CallerAngles& a, const Schedule& schedule, int64_t batch,
                            int64_t seq) {
  using Index = CallerAngles::Index;
  using Columns = CallerAngles::Columns;
  if (a.index != Index::per_token && a.index != Index::per_position) {
    throw Error(fmt::format("angles.index={} is not per_token or per_position", static_cast<int>(a.index)));
  }
  if (a.columns != Columns::pairs && a.columns != Columns::halves && a.columns != Columns::repeated) {
    throw Error(fmt::format("angles.columns={} is not pairs, halves or repeated",
                            static_cast<int>(a.columns)));
  }
  detail::check_view(detail::angle_view(a, a.cos, a.cos_strides), "angles.cos");
  detail::check_view(detail::angle_view(a, a.sin, a.sin_strides), "angles.sin");
  const int64_t width = a.columns == Columns::pairs ? schedule.pairs() : schedule.rotary_dim;
  if (a.shape[2] != width) {
    throw Error(fmt::format("angles width={} must be {} (rotary_dim={}, columns {})", a.shape[2],
                            width, schedule.rotary_dim,
                            a.columns == Columns::pairs ? "pairs" : a.columns == Columns::halves ? "halves" : "repeated"));
  }
  if (a.index == Index::per_token) {
    if ((a.shape[0] != batch && a.shape[0] != 1) || a.shape[1] != seq) {
      throw Error(fmt::format("per_token angles shape [{}, {}, {}] must be [batch={} or 1, seq={}, {}]",
                              a.shape[0], a.shape[1], a.shape[2], batch, seq, width));
    }
    return -1;
  }
  if (a.shape[0] != 1 || a.shape[1] < 1) {
    throw Error(fmt::format("per_position angles shape [{}, {}, {}] must be [1, rows >= 1, {}]",
                            a.shape[0], a.shape[1], a.shape[2], width));
  }
  return a.shape[1];
}

// The table's schedule is bit-for-bit this one (a Table validates its schedule when built).
bool same_schedule(const Table& table, const Schedule& schedule) {
  const Schedule& mine = table.schedule();
  return mine.head_dim == schedule.head_dim && mine.rotary_dim == schedule.rotary_dim &&
         mine.pairing == schedule.pairing && mine.type == schedule.type &&
         std::bit_cast<uint64_t>(mine.attention_factor) == std::bit_cast<uint64_t>(schedule.attention_factor) &&
         mine.rotary_offset == schedule.rotary_offset && mine.blocks == schedule.blocks &&
         mine.streams == schedule.streams && mine.pair_stream == schedule.pair_stream &&
         std::bit_cast<uint64_t>(mine.xpos_scale_base) == std::bit_cast<uint64_t>(schedule.xpos_scale_base) &&
         std::bit_cast<uint64_t>(mine.xpos_center) == std::bit_cast<uint64_t>(schedule.xpos_center) &&
         mine.xpos_log_zeta == schedule.xpos_log_zeta &&
         mine.inv_freq.size() == schedule.inv_freq.size() &&
         std::memcmp(mine.inv_freq.data(), schedule.inv_freq.data(), mine.inv_freq.size() * sizeof(double)) == 0;
}

}  // namespace

namespace {

// validate's body; read_entries false skips the per-token position entries' values.
// rows_out: a list table's row per position entry (check_positions), when wanted. k_read_only: an
// unset k_out leaves k unwritten (validate_reading_k), not rotated in place.
std::optional<std::pair<double, double>> validate_call(const Schedule& schedule, const ApplyArgs& args,
                                                      bool read_entries, std::vector<int64_t>* rows_out = nullptr,
                                                      bool k_read_only = false) {
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

  // Effective outputs: the input itself when in place (unset, or given as the input's own view: named
  // so, as the caller sees it).
  const TensorView q_out = args.q_out.is_set() ? args.q_out : args.q;
  const char* q_out_name = args.q_out.is_set() && !same_view(args.q_out, args.q) ? "q_out" : "q (in place)";
  check_output(q_out, q_out_name, args.q, "q", schedule);
  TensorView k_out{};
  const char* k_out_name = args.k_out.is_set() && !same_view(args.k_out, args.k) ? "k_out" : "k (in place)";
  const bool k_written = has_k && (args.k_out.is_set() || !k_read_only);
  if (k_written) {
    k_out = args.k_out.is_set() ? args.k_out : args.k;
    check_output(k_out, k_out_name, args.k, "k", schedule);
  }
  // Aliasing: an output may coincide exactly with its own input (in place); otherwise it must not
  // share an element with any input or with the other output.
  struct Named {
    const TensorView* view;
    const char* name;
  };
  const Named outputs[2] = {{&q_out, q_out_name}, {&k_out, k_out_name}};
  const Named inputs[2] = {{&args.q, "q"}, {&args.k, "k"}};
  const int count = has_k ? 2 : 1;
  const int written = k_written ? 2 : 1;
  // In place, output o is input o: (k_out, q) is the pair (q_out, k) again, and (q_out, k_out) too,
  // so each distinct pair of views is checked once (a decode call's validation is most of its cost).
  const bool q_in_place = same_view(q_out, args.q);
  const bool k_in_place = k_written && same_view(k_out, args.k);
  for (int o = 0; o < written; ++o) {
    for (int i = 0; i < count; ++i) {
      const TensorView& out = *outputs[o].view;
      const TensorView& in = *inputs[i].view;
      if (o == i && (o == 0 ? q_in_place : k_in_place)) continue;
      if (o == 1 && i == 0 && q_in_place && k_in_place) continue;  // (k, q) was (q, k)
      if (may_overlap_checked(out, in)) {  // every view passed check_view
        throw Error(fmt::format("{} overlaps input {} (outputs must be the input itself or disjoint)",
                                outputs[o].name, inputs[i].name));
      }
    }
  }
  if (k_written && !(q_in_place && k_in_place) && may_overlap_checked(q_out, k_out)) {
    throw Error(fmt::format("{} overlaps {}", outputs[0].name, outputs[1].name));
  }
  if (args.table != nullptr && !table_matches) {
    throw Error("table was built from a different schedule than the one passed to apply");
  }
  int64_t angle_rows = -1;
  if (args.caller_angles != nullptr) {
    if (args.table != nullptr) throw Error("angles and table are both set (give one source of angles)");
    angle_rows = check_caller_angles(*args.caller_angles, schedule, args.q.batch(), args.q.seq());
    for (const Named& out : outputs) {
      if (out.view == &k_out && !k_written) continue;
      for (const auto& [data, strides, name] :
           {std::tuple{args.caller_angles->cos, args.caller_angles->cos_strides, "angles.cos"},
            std::tuple{args.caller_angles->sin, args.caller_angles->sin_strides, "angles.sin"}}) {
        if (may_overlap(*out.view, detail::angle_view(*args.caller_angles, data, strides))) {
          throw Error(fmt::format("{} overlaps {} (outputs must not share memory with inputs)",
                                  out.name, name));
        }
      }
    }
  }
  if (schedule.xpos() && args.caller_angles != nullptr) {
    throw Error("angles (the caller's cos/sin) cannot serve an xPos schedule: xPos scales q and k apart "
                "(use a table or exact angles)");
  }
  if (args.q_is_key && has_k) throw Error("q_is_key is set but so is k (q_is_key: a call on keys alone)");
  if (args.numerics && *args.numerics != AngleMode::exact && *args.numerics != AngleMode::hf_float32) {
    throw Error(fmt::format("numerics={} is not exact or hf_float32", static_cast<int>(*args.numerics)));
  }
  if (args.numerics && args.table != nullptr && args.table->mode() != *args.numerics) {
    throw Error(fmt::format("numerics={} but the table holds {} angles (build it with that AngleMode)",
                            to_string(*args.numerics), to_string(args.table->mode())));
  }
  if (args.caller_angles != nullptr && args.numerics == AngleMode::hf_float32) {
    throw Error("numerics=hf_float32 cannot apply to the caller's cos/sin (angles): they are the caller's own "
                "values");
  }
  const bool hf_on_the_fly = numerics_of(args) == AngleMode::hf_float32 && args.table == nullptr;
  if (hf_on_the_fly) detail::check_hf_float32_frequencies(schedule);  // positions: check_positions
  if (args.undo && args.caller_angles != nullptr) {
    throw Error("undo cannot take the caller's cos/sin (angles): they hold a factor undo cannot divide out "
                "(rotate them with direction=inverse, which undoes them when cos^2 + sin^2 = 1)");
  }
  if (args.undo && args.table != nullptr && schedule.attention_factor != 1.0) {
    throw Error(fmt::format("undo with attention_factor={} needs exact angles (table=nullptr): a table holds "
                            "cos and sin times the factor", schedule.attention_factor));
  }
  const std::optional<std::pair<double, double>> extent = check_positions(
      args.positions, schedule, args.q.batch(), args.q.seq(), args.table, angle_rows, hf_on_the_fly, read_entries,
      rows_out);
  // Per-token positions are read token by token as the kernels go: an output over them would turn
  // later tokens by what earlier ones wrote.
  const TensorView positions = detail::positions_view(args.positions);
  for (const Named& out : outputs) {
    if (out.view == &k_out && !k_written) continue;
    if (may_overlap(*out.view, positions)) {
      throw Error(fmt::format("{} overlaps positions (outputs must not share memory with inputs)", out.name));
    }
  }
  return extent;
}

}  // namespace

TensorView detail::angle_view(const CallerAngles& a, const void* data, const std::array<int64_t, 3>& strides) {
  return TensorView{.data = const_cast<void*>(data), .dtype = a.dtype,
                    .shape = {a.shape[0], a.shape[1], 1, a.shape[2]},
                    .strides = {strides[0], strides[1], 0, strides[2]}};
}

TensorView detail::positions_view(const Positions& positions) {
  int64_t bytes = 0;
  switch (positions.kind) {
    case Positions::Kind::per_token_i32:
    case Positions::Kind::per_token_f32: bytes = 4; break;
    case Positions::Kind::per_token_i64:
    case Positions::Kind::per_token_f64: bytes = 8; break;
    default: return TensorView{.dtype = DType::i8};  // sequential (or not a kind: refused elsewhere)
  }
  int64_t entries = 0;  // every stream's
  if (__builtin_mul_overflow(positions.count, std::max(positions.streams, 1), &entries)) {
    entries = std::numeric_limits<int64_t>::max();  // bytes_view answers it conservatively
  }
  return detail::bytes_view(positions.data, entries, bytes);
}

ApplyArgs detail::folded(const ApplyArgs& args) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  const CallerAngles* old = args.angles;
  if (args.caller_angles != nullptr && old != nullptr && args.caller_angles != old) {
    throw Error("caller_angles and angles (its old name) are both set, to different cos/sin (give caller_angles)",
                "caller_angles");
  }
  ApplyArgs out = args;
  if (old != nullptr) out.caller_angles = old;
  out.angles = nullptr;
#pragma GCC diagnostic pop
  return out;
}

void validate_shapes(const Schedule& schedule, const ApplyArgs& args) {
  if (detail::uses_old_names(args)) {
    validate_shapes(schedule, detail::folded(args));
    return;
  }
  validate_call(schedule, args, /*read_entries=*/false);
}

void validate(const Schedule& schedule, const ApplyArgs& args) {
  if (detail::uses_old_names(args)) {
    validate(schedule, detail::folded(args));
    return;
  }
  validate_call(schedule, args, /*read_entries=*/true);
}

std::optional<std::pair<double, double>> detail::validate_extent(const Schedule& schedule, const ApplyArgs& args) {
  return validate_call(schedule, args, /*read_entries=*/true);
}

void detail::validate_reading_k(const Schedule& schedule, const ApplyArgs& args, bool read_entries) {
  validate_call(schedule, args, read_entries, nullptr, /*k_read_only=*/true);
}

namespace {

// apply after validation; row_index: a list table's rows as validation found them (empty: found here).
void run_validated(const Schedule& schedule, const ApplyArgs& args, std::vector<int64_t>& row_index) {
  // Empty q and k: nothing to do (and batch * seq, which no output bounds then, is never formed).
  if (args.q.is_empty() && (!args.k.is_set() || args.k.is_empty())) return;
  std::optional<detail::TableRows> rows;
  if (args.table != nullptr) {
    if (!row_index.empty()) {
      rows = detail::TableRows{.cos = args.table->cos().data(), .sin = args.table->sin().data(), .first = 0,
                               .rows = args.table->rows(), .row_index = row_index.data()};
    } else {
      // A list table (Table::at): each position's row, looked up once here for the whole call.
      rows = detail::table_rows(*args.table, args.positions, args.q.seq(), row_index);
    }
  }
  detail::backend_entry(args.backend).run(detail::make_kernel_args(schedule, args, rows ? &*rows : nullptr));
}

}  // namespace

namespace {

// Out of line and cold, so that the folded copy's frame stays off apply's path.
[[gnu::noinline, gnu::cold]] void apply_with_old_names(const Schedule& schedule, const ApplyArgs& args) {
  apply(schedule, detail::folded(args));
}

}  // namespace

void apply(const Schedule& schedule, const ApplyArgs& args) {
  if (detail::uses_old_names(args)) [[unlikely]] {
    apply_with_old_names(schedule, args);
    return;
  }
  std::vector<int64_t> row_index;  // a list table's rows: each position searched once, while validating
  validate_call(schedule, args, /*read_entries=*/true, &row_index);
  run_validated(schedule, args, row_index);
}

void detail::apply_validated(const Schedule& schedule, const ApplyArgs& args) {
  std::vector<int64_t> row_index;
  run_validated(schedule, args, row_index);
}

}  // namespace rotary
