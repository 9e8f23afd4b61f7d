// rotary — converting between interleaved and half pairing.
#pragma once

#include <cstdint>
#include <vector>

#include "rotary/spec.hpp"
#include "rotary/tensor.hpp"

namespace rotary {

/// For one head: source[j] is the channel of the `from` layout that lands in channel j of the `to`
/// layout. Channels >= rotary_dim map to themselves.
///   interleaved -> half: out[i] = in[2i], out[i + r/2] = in[2i + 1]   (Meta -> Hugging Face)
///   half -> interleaved: out[2i] = in[i], out[2i + 1] = in[i + r/2]
/// RoPE with pairing `to` on permuted vectors equals RoPE with pairing `from`, permuted; so
/// permuting the rows of W_q and W_k (and their biases) gives the same attention scores.
/// Throws rotary::Error for bad head_dim / rotary_dim, or `from` / `to` not a named Pairing.
std::vector<int64_t> pairing_permutation(int64_t head_dim, int64_t rotary_dim, Pairing from,
                                         Pairing to);

/// Rows of a projection weight [num_heads * head_dim, ...] (or a bias, row_bytes = element size).
struct PermuteRowsArgs {
  int64_t num_heads = 0;   ///< query heads for W_q, key/value heads for W_k (GQA)
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;  ///< 0 means head_dim
  int64_t row_bytes = 0;   ///< bytes per row: columns * element size
  Pairing from = Pairing::interleaved;
  Pairing to = Pairing::half;
};

/// Copies src's rows into dst permuted per head. src and dst must not overlap (throws if they do).
/// Works for any dtype: rows move as bytes. num_heads * head_dim * row_bytes must stay below
/// max_view_bytes (tensor.hpp); 0 rows copy nothing (src and dst may then be null).
void permute_rows(const void* src, void* dst, const PermuteRowsArgs& args);

/// The same permutation on activations: channel j of every out head = channel source[j] of in.
/// in and out: set, same shape and dtype, not overlapping, each meeting the view rules of apply
/// (non-null data unless empty, span < max_view_bytes); empty views copy nothing.
void permute_channels(const TensorView& in, const TensorView& out, int64_t rotary_dim, Pairing from,
                      Pairing to);

}  // namespace rotary
