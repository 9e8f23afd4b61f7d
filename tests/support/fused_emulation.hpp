// The fused operations' CUDA general kernels played on the host (test_fused_emulation.cpp, and
// test_fused_fuzz.cpp, which holds them against the CPU over random calls). The body is
// src/fused/body.hpp, the one the CPU runs, split as the device splits it: per token, the angle row
// filled by `threads` threads (fused_angles with thread/threads, as a block's threads fill shared
// memory), the all-heads norms, then one item (head) per warp, its norm factor then its 32 lanes, in
// an order unlike the CPU loop's. The results must equal the CPU's bit for bit (CPU == CUDA without
// a GPU). rope_store's fast kernel has its own emulation beside the launcher (src/cuda/emulate.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "fused/body.hpp"
#include "fused/fused_args.hpp"

namespace rotary::test {

template <class T>
void emulate_fused_grid_as(const detail::FusedKernelArgs& f, int threads) {
  using Value = typename detail::Storage<T>::Value;
  const detail::PairArrays pairs = detail::pair_arrays(f.rope);
  std::vector<detail::AngleCell<Value>> shared(static_cast<size_t>(f.rope.rotary_dim / 2));
  const int64_t items = detail::fused_items(f);
  if (!detail::fused_scales_usable(f)) {  // every block alike: nothing written, flagged once
    if (f.rope.error != nullptr) *f.rope.error |= detail::kScaleInvalid;
    return;
  }
  for (int64_t token = f.rope.tokens - 1; token >= 0; --token) {  // blocks in any order
    for (int t = 0; t < threads; ++t) detail::fused_angles<Value>(f, pairs, token, t, threads, shared.data());
    const int64_t slot = detail::raw_token_slot(f, token);
    if (f.rope.error != nullptr && f.slots != nullptr && detail::slot_beyond_caches(f, slot)) {
      *f.rope.error |= detail::kSlotOutOfRange;
    }
    // The duplicate check: the block's threads each scan their share of the slots, then or.
    bool shared_slot = false;
    for (int t = 0; f.check_duplicates && f.slots != nullptr && t < threads; ++t) {
      shared_slot = detail::slot_shared(f.slots, f.slots_i64, f.rope.tokens, token, slot, t, threads) || shared_slot;
    }
    if (shared_slot && f.rope.error != nullptr) *f.rope.error |= detail::kSlotDuplicate;
    if (detail::token_error(f.rope, token) != 0) continue;
    float token_r[2];
    detail::fused_token_norms<T>(f, pairs, shared.data(), token, token_r);
    // A warp per item: the factor first (its first thread), then its 32 lanes, here in reverse.
    for (int64_t item = items - 1; item >= 0; --item) {
      const float r = detail::fused_item_factor<T>(f, pairs, shared.data(), token, item, token_r);
      for (int64_t lane = 31; lane >= 0; --lane) {
        detail::fused_item<T>(f, pairs, shared.data(), token, item, r, lane, 32, shared_slot);
      }
    }
  }
}

/// rope_store's and qk_norm_rope's general kernel over the whole grid, blocks of `threads` threads.
inline void emulate_fused_grid(const detail::FusedKernelArgs& f, int threads) {
  detail::with_storage(f.rope.dtype, [&]<class T>() { emulate_fused_grid_as<T>(f, threads); });
}

/// rerotate_kernel's split: per slot entry (blocks in any order) the range flag, the duplicate check
/// (the block's threads each scanning their share), the angle row, then a warp per head, its 32
/// lanes (in reverse).
inline void emulate_rerotate_grid(const detail::RerotateKernelArgs& r, int threads) {
  const detail::PairArrays pairs = detail::pair_arrays(r.rope);
  std::vector<detail::AngleCell<float>> cells(static_cast<size_t>(r.rope.rotary_dim / 2));
  if (!detail::scales_usable(r.in, r.heads)) {
    if (r.rope.error != nullptr) *r.rope.error |= detail::kScaleInvalid;
    return;
  }
  for (int64_t i = r.count - 1; i >= 0; --i) {
    const int64_t slot = detail::slot_entry(r.slots, r.slots_i64, i);
    if (slot >= r.in.capacity || (r.out.data != nullptr && slot >= r.out.capacity)) {
      if (r.rope.error != nullptr) *r.rope.error |= detail::kSlotOutOfRange;
      continue;
    }
    bool shared = false;
    for (int t = 0; r.check_duplicates && t < threads; ++t) {
      shared = detail::slot_shared(r.slots, r.slots_i64, r.count, i, slot, t, threads) || shared;
    }
    if (shared) {
      if (r.rope.error != nullptr) *r.rope.error |= detail::kSlotDuplicate;
      continue;
    }
    if (const uint32_t bad = r.raw ? detail::token_error(r.rope, i) : 0; bad != 0) {
      if (r.rope.error != nullptr) *r.rope.error |= bad;
      continue;
    }
    if (slot < 0) continue;
    for (int64_t j = 0; j < r.rope.rotary_dim / 2; ++j) cells[static_cast<size_t>(j)] = detail::rerotate_angle(r, pairs, i, j);
    for (int64_t h = r.heads - 1; h >= 0; --h) {
      for (int64_t lane = 31; lane >= 0; --lane) detail::rerotate_item(r, pairs, cells.data(), i, h, lane, 32);
    }
  }
}

}  // namespace rotary::test
