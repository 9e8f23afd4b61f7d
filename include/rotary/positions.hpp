// rotary — token positions: one stream per token for text, several for multimodal RoPE.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "rotary/error.hpp"

namespace rotary {

/// Positions are int32-sized: 0 <= position < max_position_limit (fractional ones too).
inline constexpr int64_t max_position_limit = int64_t{1} << 31;

/// The most position streams one call takes. Text models use 1; M-RoPE 3 (temporal, height,
/// width, transformers' order); vision towers 2 (height, width); HunYuan 4.
inline constexpr int max_streams = 8;

/// Which position each token has, in each of S streams (Schedule::streams; pair j of a head turns
/// by the position of its stream Schedule::stream_of(j)).
///   sequential:  token s of every batch row is at offset + s in every stream (prefill, or decode
///                with one offset; text tokens of an M-RoPE model have equal t = h = w).
///   per_token:   S arrays, one after the other, of `count` entries each, row-major, int32, int64,
///                float32 or float64 — transformers' M-RoPE `position_ids` [S, batch, seq]:
///                entry (stream, b, s) at data[stream * count + b * seq + s]. count is batch * seq,
///                or seq: one [S, 1, seq] row broadcast over the batch.
/// Every position lies in [0, 2^31). Fractional positions (float kinds; Qwen3-Omni's audio time
/// steps) turn pair j by the real number p * inv_freq[j], p the float's exact value, reduced
/// exactly as integer positions are; a Table holds whole positions only, so a float position used
/// with a Table must be a whole number in it. Non-owning: the array must outlive the call.
///
/// Shape: a span is flat, so apply can only count its entries. A caller that knows its array's
/// shape (a numpy array, a .npy file, a torch tensor) says it with with_shape(rows, seq): each
/// stream is then [rows, seq] with rows = batch or 1, and apply refuses any other shape, so that a
/// transposed [seq, batch] array, [batch * seq, 1] or [1, batch * seq] is an error instead of
/// tokens rotated at other tokens' positions (their entry counts are right).
struct Positions {
  enum class Kind { sequential, per_token_i32, per_token_i64, per_token_f32, per_token_f64 };
  Kind kind = Kind::sequential;
  int64_t offset = 0;          ///< sequential only
  const void* data = nullptr;  ///< per_token only
  int64_t count = 0;           ///< per_token only: entries per stream, batch * seq or seq
  int streams = 1;             ///< S in [1, max_streams]: streams given (per_token), or 1
  /// per_token only: each stream's [rows, seq] as the caller's array has it, or unset: a flat
  /// array of `count` entries per stream (batch * seq, or seq for one row serving every batch row).
  std::optional<std::array<int64_t, 2>> shape = std::nullopt;

  static Positions sequential(int64_t offset = 0) { return Positions{.offset = offset}; }
  static Positions per_token(std::span<const int32_t> positions, int streams = 1) {
    return make(Kind::per_token_i32, positions.data(), positions.size(), streams);
  }
  static Positions per_token(std::span<const int64_t> positions, int streams = 1) {
    return make(Kind::per_token_i64, positions.data(), positions.size(), streams);
  }
  static Positions per_token(std::span<const float> positions, int streams = 1) {
    return make(Kind::per_token_f32, positions.data(), positions.size(), streams);
  }
  static Positions per_token(std::span<const double> positions, int streams = 1) {
    return make(Kind::per_token_f64, positions.data(), positions.size(), streams);
  }

  /// These positions, each stream shaped [rows, seq] (see Shape above). Throws unless they are
  /// per-token positions holding rows * seq entries per stream, rows >= 0 and seq >= 0.
  Positions with_shape(int64_t rows, int64_t seq) const {
    if (kind == Kind::sequential) throw Error("positions shape is for per-token positions, not sequential ones");
    if (rows < 0 || seq < 0) {
      throw Error("positions shape [" + std::to_string(rows) + ", " + std::to_string(seq) +
                  "] must have extents >= 0");
    }
    // rows * seq == count without forming a product that may overflow.
    const bool fits = seq == 0 ? count == 0 : (count % seq == 0 && count / seq == rows);
    if (!fits) {
      throw Error("positions shape [" + std::to_string(rows) + ", " + std::to_string(seq) + "] does not hold " +
                  std::to_string(count) + " entries per stream");
    }
    Positions out = *this;
    out.shape = std::array<int64_t, 2>{rows, seq};
    return out;
  }

  bool is_fractional() const { return kind == Kind::per_token_f32 || kind == Kind::per_token_f64; }

  /// Position of token index = b * seq + s in stream 0 as an integer (fractional kinds truncate).
  /// Unchecked: call it only on positions that passed apply's validate.
  int64_t at(int64_t index, int64_t s) const { return static_cast<int64_t>(value(index, s, 0)); }

  /// Position of token (b, s), index = b * seq + s, in `stream`, as a double (exact: integers below
  /// 2^31 and floats are doubles). A broadcast row (count < index + 1) reads entry s. Unchecked.
  double value(int64_t index, int64_t s, int stream) const {
    const int64_t i = stream * count + (index < count ? index : s);
    switch (kind) {
      case Kind::per_token_i32: return static_cast<const int32_t*>(data)[i];
      case Kind::per_token_i64: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
      case Kind::per_token_f32: return static_cast<const float*>(data)[i];
      case Kind::per_token_f64: return static_cast<const double*>(data)[i];
      default: return static_cast<double>(offset + s);
    }
  }

 private:
  // `size` entries in all: `streams` arrays of size / streams each.
  static Positions make(Kind kind, const void* data, size_t size, int streams) {
    if (streams < 1 || streams > max_streams) {
      throw Error("positions streams=" + std::to_string(streams) + " must be in [1, " +
                  std::to_string(max_streams) + "]");
    }
    if (size % static_cast<size_t>(streams) != 0) {
      throw Error("positions has " + std::to_string(size) + " entries, not a multiple of streams=" +
                  std::to_string(streams));
    }
    return Positions{.kind = kind, .data = data,
                     .count = static_cast<int64_t>(size / static_cast<size_t>(streams)),
                     .streams = streams};
  }
};

}  // namespace rotary
