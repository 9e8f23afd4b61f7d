// The descriptor's rules: what every kernel may assume about a Schedule.
#include <cmath>

#include <fmt/format.h>

#include "rotary/error.hpp"
#include "rotary/schedule.hpp"

namespace rotary {
namespace {

void check_channels(const Schedule& schedule) {
  if (schedule.head_dim <= 0) {
    throw Error(fmt::format("head_dim={} must be > 0", schedule.head_dim));
  }
  if (schedule.rotary_dim <= 0 || schedule.rotary_dim % 2 != 0 ||
      schedule.rotary_dim > schedule.head_dim) {
    throw Error(fmt::format("rotary_dim={} must be even, > 0 and <= head_dim={}",
                            schedule.rotary_dim, schedule.head_dim));
  }
  if (schedule.rotary_offset < 0 || schedule.rotary_offset > schedule.head_dim - schedule.rotary_dim) {
    throw Error(fmt::format("rotary_offset={} must be in [0, head_dim - rotary_dim = {}]",
                            schedule.rotary_offset, schedule.head_dim - schedule.rotary_dim));
  }
  if (schedule.pairing != Pairing::interleaved && schedule.pairing != Pairing::half) {
    throw Error(fmt::format("pairing={} is not interleaved or half", static_cast<int>(schedule.pairing)));
  }
  if (schedule.blocks < 1) {
    throw Error(fmt::format("blocks={} must be >= 1", schedule.blocks));
  }
  if (schedule.blocks > 1) {
    if (schedule.pairing != Pairing::half) {
      throw Error(fmt::format("blocks={} needs pairing half (block_half), not {}", schedule.blocks,
                              to_string(schedule.pairing)));
    }
    if (schedule.rotary_dim % (2 * schedule.blocks) != 0) {
      throw Error(fmt::format("blocks={} must divide rotary_dim/2={} (block_half: equal blocks of "
                              "half-paired channels)", schedule.blocks, schedule.pairs()));
    }
  }
}

void check_streams(const Schedule& schedule) {
  if (schedule.streams < 1 || schedule.streams > max_streams) {
    throw Error(fmt::format("streams={} must be in [1, {}]", schedule.streams, max_streams));
  }
  if (schedule.pair_stream.empty()) return;
  if (static_cast<int64_t>(schedule.pair_stream.size()) != schedule.pairs()) {
    throw Error(fmt::format("pair_stream has {} values but rotary_dim/2={}",
                            schedule.pair_stream.size(), schedule.pairs()));
  }
  for (size_t j = 0; j < schedule.pair_stream.size(); ++j) {
    const int stream = schedule.pair_stream[j];
    if (stream < 0 || stream >= schedule.streams) {
      throw Error(fmt::format("pair_stream[{}]={} must be in [0, streams={})", j, stream,
                              schedule.streams));
    }
  }
}

void check_frequencies(const Schedule& schedule) {
  if (static_cast<int>(schedule.type) < static_cast<int>(ScheduleType::default_) ||
      static_cast<int>(schedule.type) > static_cast<int>(ScheduleType::last)) {
    throw Error(fmt::format("type={} is not a schedule type", static_cast<int>(schedule.type)));
  }
  if (static_cast<int64_t>(schedule.inv_freq.size()) != schedule.pairs()) {
    throw Error(fmt::format("inv_freq has {} values but rotary_dim/2={}", schedule.inv_freq.size(),
                            schedule.pairs()));
  }
  // One branch-free pass (apply calls this per call); NaN fails both comparisons, inf the second.
  auto in_range = [](double f) { return f >= 0 && f <= max_inv_freq; };
  bool all_in_range = true;
  for (const double f : schedule.inv_freq) all_in_range &= in_range(f);
  if (!all_in_range) {
    for (size_t i = 0; i < schedule.inv_freq.size(); ++i) {
      if (!in_range(schedule.inv_freq[i])) {
        throw Error(fmt::format("inv_freq[{}]={} must be finite, >= 0 and <= 2^20 (check factor)", i,
                                schedule.inv_freq[i]));
      }
    }
  }
  const double g = schedule.attention_factor;
  if (!std::isfinite(g) || g <= 0) {
    throw Error(fmt::format("attention_factor={} must be finite and > 0", g));
  }
  if (!(g >= min_attention_factor && g <= max_attention_factor)) {
    throw Error(fmt::format("attention_factor={} must round to a normal float32, in [2^-126, "
                            "3.40282347e+38] (cos and sin times it are stored as float32)", g));
  }
}

void check_xpos(const Schedule& schedule) {
  if (!schedule.xpos()) return;
  const double gamma = schedule.xpos_scale_base;
  if (!std::isfinite(gamma) || gamma <= 0) {
    throw Error(fmt::format("xpos_scale_base={} must be finite and > 0 (0: no xPos)", gamma));
  }
  if (!std::isfinite(schedule.xpos_center)) {
    throw Error(fmt::format("xpos_center={} must be finite", schedule.xpos_center));
  }
  if (static_cast<int64_t>(schedule.xpos_log_zeta.size()) != schedule.pairs()) {
    throw Error(fmt::format("xpos_log_zeta has {} values but rotary_dim/2={}", schedule.xpos_log_zeta.size(),
                            schedule.pairs()));
  }
  for (size_t j = 0; j < schedule.xpos_log_zeta.size(); ++j) {
    const double l = schedule.xpos_log_zeta[j];
    if (!(l < 0) || !std::isfinite(l)) {
      throw Error(fmt::format("xpos_log_zeta[{}]={} must be finite and < 0", j, l));
    }
  }
  const double g = schedule.attention_factor;
  if (!(g >= xpos_min_attention_factor && g <= xpos_max_attention_factor)) {
    throw Error(fmt::format("attention_factor={} must be in [2^-10, 2^12] with xPos (cos and sin times it "
                            "and the xPos scale must stay normal float32 values)", g));
  }
}

}  // namespace

std::string_view to_string(ChannelLayout layout) {
  switch (layout) {
    case ChannelLayout::half: return "half";
    case ChannelLayout::interleaved: return "interleaved";
    case ChannelLayout::block_half: return "block_half";
  }
  return "?";
}

void validate(const Schedule& schedule) {
  check_channels(schedule);
  check_streams(schedule);
  check_frequencies(schedule);
  check_xpos(schedule);
}

}  // namespace rotary
