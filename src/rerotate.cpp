#include "rotary/rerotate.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "rotary/angle.hpp"
#include "rotary/error.hpp"
#include "math/xpos.hpp"

namespace rotary {
namespace {

// apply's arguments for the keys: k travels as ApplyArgs::k beside an empty q of the same batch and
// seq (a set view with 0 heads rotates nothing), so apply's messages name k and k_out. `on_output`:
// in place on k_out (a second pass continuing the first's output).
ApplyArgs keys_args(const Schedule& schedule, const RotatedKeys& keys, Direction direction,
                    bool on_output = false) {
  if (!keys.k.is_set()) throw Error("k is not set (k is TensorView{}: data null, shape all 0)");
  const TensorView& k = on_output ? keys.k_out : keys.k;
  const TensorView no_query{.data = k.data, .dtype = k.dtype,
                            .shape = {k.batch(), k.seq(), 0, schedule.head_dim}, .strides = k.strides};
  return ApplyArgs{.q = no_query, .k = k, .k_out = on_output ? TensorView{} : keys.k_out,
                   .positions = keys.positions, .direction = direction, .copy_tail = keys.copy_tail,
                   .threads = keys.threads, .backend = keys.backend};
}

Direction opposite(Direction d) { return d == Direction::forward ? Direction::inverse : Direction::forward; }

std::string delta_name(std::span<const int64_t> delta, int stream) {
  return delta.size() == 1 ? std::string("delta") : fmt::format("delta[{}]", stream);
}

void check_delta(const Schedule& schedule, std::span<const int64_t> delta) {
  if (delta.size() != 1 && delta.size() != static_cast<size_t>(schedule.streams)) {
    throw Error(fmt::format("delta has {} values; give 1 (every stream) or one per stream (streams={})",
                            delta.size(), schedule.streams));
  }
  for (size_t s = 0; s < delta.size(); ++s) {
    if (delta[s] <= -max_position_limit || delta[s] >= max_position_limit) {
      throw Error(fmt::format("{}={} must be in (-2^31, 2^31)", delta_name(delta, static_cast<int>(s)),
                              delta[s]));
    }
  }
}

// Every key's position p (validated by apply: in [0, 2^31)) plus its stream's delta stays in
// [0, 2^31). Sequential positions are checked at their two ends.
void check_moved_positions(const Schedule& schedule, const ApplyArgs& args, std::span<const int64_t> delta) {
  const Positions& p = args.positions;
  const int64_t batch = args.k.batch(), seq = args.k.seq();
  if (batch == 0 || seq == 0) return;
  const auto limit = static_cast<double>(max_position_limit);
  for (int s = 0; s < schedule.streams; ++s) {
    const int64_t d = delta[delta.size() == 1 ? 0 : static_cast<size_t>(s)];
    if (p.kind == Positions::Kind::sequential) {
      const int64_t token = p.offset + d < 0 ? 0 : p.offset + seq - 1 + d >= max_position_limit ? seq - 1 : -1;
      if (token < 0) continue;
      throw Error(fmt::format("position {} of token {} (offset={}) + {}={} leaves [0, 2^31)", p.offset + token,
                              token, p.offset, delta_name(delta, s), d));
    }
    const int stream = p.streams == 1 ? 0 : s;
    for (int64_t i = 0; i < p.count; ++i) {
      const double at = p.value(i, i, stream);
      const double moved = at + static_cast<double>(d);  // exact for integers: |at|, |d| < 2^31
      if (moved >= 0 && moved < limit) continue;
      const std::string where = p.streams > 1 ? fmt::format("positions[{}][{}]", stream, i)
                                              : fmt::format("positions[{}]", i);
      throw Error(fmt::format("{}={} + {}={} leaves [0, 2^31)", where, at, delta_name(delta, s), d));
    }
  }
  if (!schedule.xpos()) return;
  // xPos: the moved keys' scale must stay in range: every p + delta within reach of the centre.
  const double reach = xpos_reach(schedule);
  const double c = schedule.xpos_center;
  for (int s = 0; s < schedule.streams; ++s) {
    const int64_t d = delta[delta.size() == 1 ? 0 : static_cast<size_t>(s)];
    const int stream = p.streams == 1 ? 0 : s;
    const int64_t count = p.kind == Positions::Kind::sequential ? seq : p.count;
    for (int64_t i = 0; i < count; ++i) {
      const double at = p.kind == Positions::Kind::sequential ? static_cast<double>(p.offset + i)
                                                               : p.value(i, i, stream);
      const double moved = at + static_cast<double>(d);
      if (std::fabs(moved - c) <= reach) continue;
      const std::string where = p.kind == Positions::Kind::sequential
                                    ? fmt::format("position {} of token {} (offset={})", at, i, p.offset)
                                : p.streams > 1 ? fmt::format("positions[{}][{}]={}", stream, i, at)
                                                : fmt::format("positions[{}]={}", i, at);
      throw Error(fmt::format("{} + {}={} = {} is beyond xPos's reach: |position - xpos_center={}| must be <= {:.1f} "
                              "with xpos_scale_base={} (shift by less, or in the other direction)",
                              where, delta_name(delta, s), d, moved, c, reach, schedule.xpos_scale_base));
    }
  }
}

// The schedule without xPos: what the passes below rotate with (their angles carry the scale).
Schedule without_xpos(const Schedule& schedule) {
  Schedule plain = schedule;
  plain.xpos_scale_base = 0;
  plain.xpos_center = 0;
  plain.xpos_log_zeta.clear();
  return plain;
}

// validate(schedule) with the schedule's role in the message.
void validate_named(const Schedule& schedule, const char* role) {
  try {
    validate(schedule);
  } catch (const Error& e) {
    throw Error(fmt::format("{} schedule: {}", role, e.what()));
  }
}

template <typename T>
void check_same(const T& from, const T& to, const char* field) {
  if (from != to) throw Error(fmt::format("schedules differ in {}: from {}, to {}", field, from, to));
}

void check_compatible(const Schedule& from, const Schedule& to) {
  check_same(from.head_dim, to.head_dim, "head_dim");
  check_same(from.rotary_dim, to.rotary_dim, "rotary_dim");
  check_same(to_string(from.pairing), to_string(to.pairing), "pairing");
  check_same(from.blocks, to.blocks, "blocks");
  check_same(from.rotary_offset, to.rotary_offset, "rotary_offset");
  check_same(from.streams, to.streams, "streams");
  check_same(from.xpos_scale_base, to.xpos_scale_base, "xpos_scale_base");
  check_same(from.xpos_center, to.xpos_center, "xpos_center");
  for (int64_t j = 0; j < from.pairs(); ++j) {
    if (from.stream_of(j) != to.stream_of(j)) {
      throw Error(fmt::format("schedules differ in pair_stream: pair {} reads stream {} in from, {} in to", j,
                              from.stream_of(j), to.stream_of(j)));
    }
  }
}

}  // namespace

void rerotate(const Schedule& schedule, const RotatedKeys& keys, std::span<const int64_t> delta) {
  validate(schedule);
  check_delta(schedule, delta);
  // Under xPos the keys' scale moves too: pair j times ζ_j^(-Δ/γ), folded into the angles below,
  // which a schedule without xPos applies as given.
  const Schedule plain = without_xpos(schedule);
  ApplyArgs args = keys_args(plain, keys, Direction::forward);
  // One row of cos/sin per pair, broadcast over every token (stride 0): the angle does not depend
  // on the key's position, only on its stream's delta.
  const int64_t pairs = schedule.pairs();
  std::vector<float> cos(static_cast<size_t>(pairs)), sin(static_cast<size_t>(pairs));
  const CallerAngles angles{.index = CallerAngles::Index::per_token, .columns = CallerAngles::Columns::pairs,
                            .cos = cos.data(), .sin = sin.data(), .dtype = DType::f32,
                            .shape = {1, keys.k.seq(), pairs}, .cos_strides = {0, 0, 1},
                            .sin_strides = {0, 0, 1}};
  args.caller_angles = &angles;
  validate(plain, args);
  check_moved_positions(schedule, args, delta);
  // xPos: the scale ζ_j^(-Δ/γ) of a long jump can leave float range (up to e^160 across the whole
  // reach) although the moved keys do not: it is then split over n passes, each e^(t/n) with
  // |t/n| <= xpos_max_log; the first pass also turns, the others only scale (sin 0).
  int passes = 1;
  if (schedule.xpos()) {
    for (int64_t j = 0; j < pairs; ++j) {
      const auto d = static_cast<double>(delta[delta.size() == 1 ? 0 : static_cast<size_t>(schedule.stream_of(j))]);
      const double t = std::fabs(schedule.xpos_log_zeta[static_cast<size_t>(j)] * d / schedule.xpos_scale_base);
      passes = std::max(passes, static_cast<int>(std::ceil(t / xpos_max_log)));
    }
  }
  const bool turned_back = keys.rotated == Direction::inverse;
  for (int pass = 0; pass < passes; ++pass) {
    for (int64_t j = 0; j < pairs; ++j) {
      const int64_t d = delta[delta.size() == 1 ? 0 : static_cast<size_t>(schedule.stream_of(j))];
      const double scale =
          schedule.xpos() ? detail::xpos_scale(schedule.xpos_log_zeta[static_cast<size_t>(j)],
                                               static_cast<double>(d) / passes, 0.0, schedule.xpos_scale_base,
                                               /*key=*/true)
                          : 1.0;
      CosSin e{1.0, 0.0};
      if (pass == 0) e = exact_cos_sin(d < 0 ? -d : d, schedule.inv_freq[static_cast<size_t>(j)]);
      // Rounding is symmetric, so float(-x) == -float(x): turning back is sin negated.
      cos[static_cast<size_t>(j)] = static_cast<float>(e.cos * scale);
      sin[static_cast<size_t>(j)] = static_cast<float>(((d < 0) != turned_back ? -e.sin : e.sin) * scale);
    }
    // Later passes continue on the output (in place there).
    if (pass > 0 && keys.k_out.is_set()) {
      args = keys_args(plain, keys, Direction::forward, /*on_output=*/true);
      args.caller_angles = &angles;
    }
    apply(plain, args);
  }
}

void switch_schedule(const Schedule& from, const Schedule& to, const RotatedKeys& keys) {
  validate_named(from, "from");
  validate_named(to, "to");
  check_compatible(from, to);
  const double ratio = to.attention_factor / from.attention_factor;
  if (!(ratio >= min_attention_factor && ratio <= max_attention_factor)) {
    throw Error(fmt::format("attention_factor ratio to/from = {}/{} = {} must be a normal float32",
                            to.attention_factor, from.attention_factor, ratio));
  }
  // The two passes' schedules: the frequency differences split by sign, so each pair turns in one.
  // Without xPos: the keys keep the scale they have (both schedules' is the same, checked above).
  Schedule up = without_xpos(from);
  up.inv_freq_hf32.clear();
  up.attention_factor = ratio;
  Schedule down = up;
  down.attention_factor = 1.0;
  bool any_up = false, any_down = false;
  for (size_t j = 0; j < up.inv_freq.size(); ++j) {
    const double diff = to.inv_freq[j] - from.inv_freq[j];
    up.inv_freq[j] = std::max(diff, 0.0);
    down.inv_freq[j] = std::max(-diff, 0.0);
    any_up = any_up || diff > 0;
    any_down = any_down || diff < 0;
  }
  const Direction forward = keys.rotated;
  const ApplyArgs first = keys_args(from, keys, forward);
  // Else pass 1 is the identity: needed only to copy the keys to k_out when nothing turns.
  const bool run_up = any_up || ratio != 1.0 || (!any_down && keys.k_out.is_set());
  validate(up, first);  // shapes and positions, the second pass's too, before any write
  if (run_up) apply(up, first);
  if (!any_down) return;
  apply(down, keys_args(from, keys, opposite(forward), run_up && keys.k_out.is_set()));
}

}  // namespace rotary
