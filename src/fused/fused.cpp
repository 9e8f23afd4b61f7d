// The fused operations (rotary/fused.hpp): validation, the kernel arguments, the CPU entry points
// (the vectorised rows of src/fused/cpu_rows.cpp; for Backend::reference and f64, one OpenMP loop
// over tokens running the ROTARY_HD body of src/fused/body.hpp per token), and rerotate_cache's
// loop over the body.
#include "rotary/fused.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "apply_internal.hpp"
#include "cpu/cpu.hpp"
#include "fused/fused_args.hpp"
#include "fused/body.hpp"
#include "kernel/args.hpp"
#include "memory.hpp"
#include "rotary/error.hpp"

namespace rotary {

namespace {

// a * b, or an Error naming the product when it leaves int64.
int64_t checked_product(int64_t a, int64_t b, const char* what) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    throw Error(fmt::format("CacheView: {} = {} * {} leaves int64", what, a, b));
  }
  return product;
}

void check_block_size(int64_t block_size) {
  if (block_size < 1) throw Error(fmt::format("CacheView: block_size={} must be >= 1", block_size));
}

int64_t row_width_or(int64_t row_width, int64_t head_dim, int64_t offset) {
  if (head_dim < 0 || offset < 0 || offset > max_view_bytes || head_dim > max_view_bytes) {
    throw Error(fmt::format("CacheView: offset={} and head_dim={} must be in [0, 2^60]", offset, head_dim));
  }
  const int64_t width = row_width == 0 ? head_dim + offset : row_width;
  if (offset + head_dim > width) {
    throw Error(fmt::format("CacheView: columns [offset={}, offset + head_dim={}) do not fit row_width={}", offset,
                            offset + head_dim, width));
  }
  return width;
}

}  // namespace

CacheView CacheView::nhd(void* data, DType dtype, int64_t num_blocks, int64_t block_size, int64_t heads,
                         int64_t head_dim, int64_t offset, int64_t row_width) {
  check_block_size(block_size);
  const int64_t w = row_width_or(row_width, head_dim, offset);
  const int64_t token = checked_product(heads, w, "heads * row_width");
  return CacheView{.data = data, .dtype = dtype, .block_size = block_size, .num_blocks = num_blocks,
                   .heads = heads, .head_dim = head_dim,
                   .strides = {checked_product(block_size, token, "block_size * heads * row_width"), token, w, 1},
                   .offset = offset};
}

CacheView CacheView::hnd(void* data, DType dtype, int64_t num_blocks, int64_t block_size, int64_t heads,
                         int64_t head_dim, int64_t offset, int64_t row_width) {
  check_block_size(block_size);
  const int64_t w = row_width_or(row_width, head_dim, offset);
  const int64_t head = checked_product(block_size, w, "block_size * row_width");
  return CacheView{.data = data, .dtype = dtype, .block_size = block_size, .num_blocks = num_blocks,
                   .heads = heads, .head_dim = head_dim,
                   .strides = {checked_product(heads, head, "heads * block_size * row_width"), w, head, 1},
                   .offset = offset};
}

std::vector<int64_t> slots_from_page_table(std::span<const int32_t> kv_indices, std::span<const int32_t> kv_indptr,
                                           std::span<const int32_t> batch_indices,
                                           std::span<const int32_t> position_in_request, int64_t block_size) {
  if (block_size < 1) throw Error(fmt::format("block_size={} must be >= 1", block_size));
  if (batch_indices.size() != position_in_request.size()) {
    throw Error(fmt::format("batch_indices has {} entries but position_in_request has {} (one per token each)",
                            batch_indices.size(), position_in_request.size()));
  }
  if (kv_indptr.empty()) throw Error("kv_indptr is empty (it has batch + 1 entries)");
  const auto requests = static_cast<int64_t>(kv_indptr.size()) - 1;
  std::vector<int64_t> slots(batch_indices.size());
  for (size_t i = 0; i < batch_indices.size(); ++i) {
    const int64_t r = batch_indices[i];
    if (r < 0) {
      slots[i] = -1;  // padding
      continue;
    }
    if (r >= requests) {
      throw Error(fmt::format("batch_indices[{}]={} is beyond the {} requests of kv_indptr", i, r, requests));
    }
    const int64_t p = position_in_request[i];
    if (p < 0) throw Error(fmt::format("position_in_request[{}]={} must be >= 0", i, p));
    const int64_t first = kv_indptr[static_cast<size_t>(r)];
    const int64_t last = kv_indptr[static_cast<size_t>(r) + 1];
    if (first < 0 || last < first || last > static_cast<int64_t>(kv_indices.size())) {
      throw Error(fmt::format("kv_indptr[{}..{}]=[{}, {}] is not a range of kv_indices' {} entries", r, r + 1, first,
                              last, kv_indices.size()));
    }
    const int64_t page = first + p / block_size;
    if (page >= last) {
      throw Error(fmt::format("position_in_request[{}]={} needs page {} of request {}, which has {} pages", i, p,
                              p / block_size, r, last - first));
    }
    const int64_t physical = kv_indices[static_cast<size_t>(page)];
    if (physical < 0) throw Error(fmt::format("kv_indices[{}]={} must be >= 0", page, physical));
    int64_t slot = 0;
    if (__builtin_mul_overflow(physical, block_size, &slot) || __builtin_add_overflow(slot, p % block_size, &slot)) {
      throw Error(fmt::format("kv_indices[{}]={} * block_size={} leaves int64 (the slot of token {})", page, physical,
                              block_size, i));
    }
    slots[i] = slot;
  }
  return slots;
}

namespace detail {
namespace {

TensorView as_view(const CacheView& c) {
  return TensorView{.data = static_cast<char*>(c.data) + c.offset * c.strides[3] * size_of(c.dtype),
                    .dtype = c.dtype, .shape = {c.num_blocks, c.block_size, c.heads, c.head_dim},
                    .strides = c.strides};
}

bool cache_dtype(DType d) { return is_model_dtype(d) || is_quantised_dtype(d); }

void check_cache(const CacheView& c, const char* name, int64_t heads, int64_t head_dim, DType data_dtype) {
  if (!cache_dtype(c.dtype)) throw Error(fmt::format("{}.dtype={} is not a dtype", name, static_cast<int>(c.dtype)));
  if (c.block_size < 1) throw Error(fmt::format("{}.block_size={} must be >= 1", name, c.block_size));
  if (c.num_blocks < 0) throw Error(fmt::format("{}.num_blocks={} must be >= 0", name, c.num_blocks));
  if (c.offset < 0) throw Error(fmt::format("{}.offset={} must be >= 0", name, c.offset));
  if (c.offset > max_view_bytes) throw Error(fmt::format("{}.offset={} must be at most 2^60", name, c.offset));
  int64_t offset_bytes = 0;  // as_view's first channel: offset * strides[3] elements on
  if (__builtin_mul_overflow(c.offset, c.strides[3], &offset_bytes) ||
      __builtin_mul_overflow(offset_bytes, size_of(c.dtype), &offset_bytes)) {
    throw Error(fmt::format("{}.offset={} * strides[3]={} leaves int64", name, c.offset, c.strides[3]));
  }
  if (c.heads != heads) throw Error(fmt::format("{}.heads={} differs from the data's heads={}", name, c.heads, heads));
  if (c.head_dim != head_dim) {
    throw Error(fmt::format("{}.head_dim={} differs from the data's head_dim={}", name, c.head_dim, head_dim));
  }
  int64_t capacity = 0;
  if (__builtin_mul_overflow(c.num_blocks, c.block_size, &capacity)) {
    throw Error(fmt::format("{}: num_blocks={} * block_size={} overflows int64", name, c.num_blocks, c.block_size));
  }
  if (c.data == nullptr && capacity > 0 && heads > 0 && head_dim > 0) {
    throw Error(fmt::format("{}.data is null but it holds {} slots", name, capacity));
  }
  TensorView v = as_view(c);
  v.data = c.data;  // the span check reads only strides and extents
  TensorView with_offset = v;
  with_offset.shape[3] = c.offset + c.head_dim;
  if (exceeds_max_view_bytes(with_offset)) {
    throw Error(fmt::format("{} spans max_view_bytes (2^60) or more", name));
  }
  if (self_overlaps(as_view(c))) {
    throw Error(fmt::format("{} strides [{}, {}, {}, {}] make elements overlap", name, c.strides[0], c.strides[1],
                            c.strides[2], c.strides[3]));
  }
  if (data_dtype == DType::f64 && c.dtype != DType::f64) {
    throw Error(fmt::format("{}.dtype={}: f64 data goes to f64 caches only", name, to_string(c.dtype)));
  }
  if (c.dtype == DType::f64 && data_dtype != DType::f64) {
    throw Error(fmt::format("{}.dtype=f64 takes f64 data only, not {}", name, to_string(data_dtype)));
  }
}

void check_quant(const CacheQuant& q, const char* name, DType dtype, int64_t heads, bool host_values) {
  if (q.mode != ScaleMode::divide && q.mode != ScaleMode::multiply) {
    throw Error(fmt::format("{}.mode={} is not divide or multiply", name, static_cast<int>(q.mode)));
  }
  if (q.scale == nullptr) return;
  if (!is_quantised_dtype(dtype)) {
    throw Error(fmt::format("{}.scale is set but the dtype is {} (only fp8_e4m3, fp8_e5m2 and i8 take a scale)", name,
                            to_string(dtype)));
  }
  if (q.count != 1 && q.count != heads) {
    throw Error(fmt::format("{}.count={} must be 1 (per tensor) or heads={} (per head)", name, q.count, heads));
  }
  if (!host_values) return;
  for (int64_t i = 0; i < q.count; ++i) {
    const float s = q.scale[i];
    if (!(std::isfinite(s) && s > 0)) throw Error(fmt::format("{}.scale[{}]={} must be finite and > 0", name, i, s));
  }
}

// Slots: count, range against every capacity, no duplicate.
void check_slots(const Slots& slots, int64_t tokens, std::initializer_list<std::pair<const CacheView*, const char*>> caches) {
  if (slots.count != tokens) {
    throw Error(fmt::format("slots has {} entries but the call has batch*seq={} tokens", slots.count, tokens));
  }
  if (tokens > 0 && slots.data == nullptr) throw Error("slots data is null");
  if (tokens > max_view_bytes / 8) {  // no array of them fits in memory
    throw Error(fmt::format("slots.count={} is more entries than an array can hold", tokens));
  }
  std::vector<std::pair<int64_t, int64_t>> used;
  used.reserve(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) {
    const int64_t slot = slots.at(i);
    if (slot < 0) continue;
    for (const auto& [cache, name] : caches) {
      if (cache == nullptr || !cache->is_set()) continue;
      if (slot >= cache->capacity()) {
        throw Error(fmt::format("slots[{}]={} is beyond {}'s capacity {} (num_blocks={} * block_size={})", i, slot,
                                name, cache->capacity(), cache->num_blocks, cache->block_size));
      }
    }
    used.emplace_back(slot, i);
  }
  std::sort(used.begin(), used.end());
  for (size_t n = 1; n < used.size(); ++n) {
    if (used[n].first == used[n - 1].first) {
      const auto [first, second] = std::minmax(used[n].second, used[n - 1].second);
      throw Error(fmt::format("slots[{}]={} repeats slots[{}] (each slot is written by one token)", second,
                              used[n].first, first));
    }
  }
}

void check_flat(const TensorView& v, const char* name, const TensorView& like, DType dtype) {
  detail::check_view(v, name);
  if (v.dtype != dtype) {
    throw Error(fmt::format("{}.dtype={} must be {}", name, to_string(v.dtype), to_string(dtype)));
  }
  if (v.batch() != like.batch() || v.seq() != like.seq()) {
    throw Error(fmt::format("{} shape {} disagrees with q shape {} in batch or seq", name, shape_text(v),
                            shape_text(like)));
  }
}

// Every output and input pair that must not share memory. An output written in place names its
// input (in_place_of): it may be that input's view exactly, and no other region's.
struct Region {
  TensorView view;
  const char* name;
  bool output;
  const char* in_place_of = nullptr;
  bool checked = true;  ///< passed a span check (else an array's bytes_view: may_overlap decides)
};

// An array the kernels read as they go (slots, positions, scales, weights): an input region.
Region array_region(const void* data, int64_t count, int64_t element_bytes, const char* name) {
  return Region{bytes_view(data, count, element_bytes), name, false, nullptr, false};
}

// Every region passed a span check first (apply's validate_shapes for q, k and their outputs,
// check_flat, check_cache, q_quantized's check_view): may_overlap_checked's precondition.
void check_disjoint(const std::vector<Region>& regions) {
  // Each region's byte span once (an empty region's meets nothing): most pairs are told apart by
  // their spans alone (a decode call's validation is most of its cost).
  constexpr size_t kMost = 32;
  if (regions.size() > kMost) throw Error(fmt::format("internal: {} regions to check", regions.size()));
  std::array<ByteSpan, kMost> spans;
  for (size_t i = 0; i < regions.size(); ++i) {
    const Region& r = regions[i];
    ROTARY_DASSERT(!r.checked || r.view.is_empty() || !exceeds_max_view_bytes(r.view));
    spans[i] = r.checked || r.view.is_empty() ? byte_span_checked(r.view) : byte_span(r.view);
  }
  for (size_t i = 0; i < regions.size(); ++i) {
    if (!regions[i].output) continue;
    for (size_t j = 0; j < regions.size(); ++j) {
      if (j == i || (regions[j].output && j < i) || !spans_meet(spans[i], spans[j])) continue;
      // In place: an output may be its own input exactly (not another input: a cache that is k
      // itself, a v that is q); two outputs never coincide.
      const bool own_input = !regions[j].output && regions[i].in_place_of != nullptr &&
                             std::strcmp(regions[i].in_place_of, regions[j].name) == 0;
      if (own_input && same_view(regions[i].view, regions[j].view)) continue;
      const bool overlap = regions[i].checked && regions[j].checked
                               ? may_overlap_checked(regions[i].view, regions[j].view)
                               : may_overlap(regions[i].view, regions[j].view);
      if (overlap) {
        throw Error(fmt::format("{} overlaps {} (caches and outputs must be disjoint from each other and from the "
                                "inputs)", regions[i].name, regions[j].name));
      }
    }
  }
}

// The rope part's views as apply would see them, and cache write checks. `host`: slots and scales in
// host memory (their values read).
void check_cache_write(const Schedule& schedule, const ApplyArgs& rope, const CacheWrite& w, bool host,
                       std::vector<Region>& regions) {
  if (!rope.k.is_set()) throw Error("k is not set: a cache write stores k (rope.k)");
  const DType dtype = rope.q.dtype;
  check_cache(w.k_cache, "k_cache", rope.k.heads(), schedule.head_dim, dtype);
  check_quant(w.k_quant, "k_quant", w.k_cache.dtype, w.k_cache.heads, host);
  regions.push_back({as_view(w.k_cache), "k_cache", true});
  regions.push_back(array_region(w.slots.data, w.slots.count, w.slots.is_i64 ? 8 : 4, "slots"));
  regions.push_back(array_region(w.k_quant.scale, w.k_quant.count, 4, "k_quant.scale"));
  if (w.v_cache.is_set() != w.v.is_set()) {
    throw Error(w.v.is_set() ? "v is set but v_cache is not" : "v_cache is set but v is not");
  }
  if (w.v.is_set()) {
    check_flat(w.v, "v", rope.q, dtype);
    check_cache(w.v_cache, "v_cache", w.v.heads(), w.v.head_dim(), dtype);
    check_quant(w.v_quant, "v_quant", w.v_cache.dtype, w.v_cache.heads, host);
    regions.push_back({w.v, "v", false});
    regions.push_back({as_view(w.v_cache), "v_cache", true});
    regions.push_back(array_region(w.v_quant.scale, w.v_quant.count, 4, "v_quant.scale"));
  }
  if (w.k_pass_cache.is_set() != w.k_pass.is_set()) {
    throw Error(w.k_pass.is_set() ? "k_pass is set but k_pass_cache is not" : "k_pass_cache is set but k_pass is not");
  }
  if (w.k_pass.is_set()) {
    check_flat(w.k_pass, "k_pass", rope.q, dtype);
    check_cache(w.k_pass_cache, "k_pass_cache", w.k_pass.heads(), w.k_pass.head_dim(), dtype);
    check_quant(w.k_pass_quant, "k_pass_quant", w.k_pass_cache.dtype, w.k_pass_cache.heads, host);
    regions.push_back({w.k_pass, "k_pass", false});
    regions.push_back({as_view(w.k_pass_cache), "k_pass_cache", true});
    regions.push_back(array_region(w.k_pass_quant.scale, w.k_pass_quant.count, 4, "k_pass_quant.scale"));
  }
  int64_t tokens = 0;
  if (__builtin_mul_overflow(rope.q.batch(), rope.q.seq(), &tokens)) {
    throw Error(fmt::format("q shape {}: batch * seq leaves int64 (slots holds one entry per token)",
                            shape_text(rope.q)));
  }
  if (host) {
    check_slots(w.slots, tokens, {{&w.k_cache, "k_cache"}, {&w.v_cache, "v_cache"}, {&w.k_pass_cache, "k_pass_cache"}});
  } else if (w.slots.count != tokens) {
    throw Error(fmt::format("slots has {} entries but the call has batch*seq={} tokens", w.slots.count, tokens));
  }
}

void check_common_rope(const ApplyArgs& rope) {
  if (!rope.copy_tail) {
    throw Error("copy_tail=false (C: skip_tail_copy=1) is not supported by the fused operations (they write whole "
                "heads)");
  }
}

// The rope's views for the aliasing checks: q, k (inputs), and what is written of them: q_out, or q
// in place (write_q), k_out, or k in place (write_k; k_in_place: an unset k_out writes k).
void rope_regions(const ApplyArgs& rope, bool write_q, bool write_k, bool k_in_place, std::vector<Region>& regions) {
  regions.push_back({rope.q, "q", false});
  if (rope.k.is_set()) regions.push_back({rope.k, "k", false});
  // What the rows read besides q and k, token by token: no output (a cache included) may overlap it.
  regions.push_back({positions_view(rope.positions), "positions", false, nullptr, false});
  const CallerAngles* angles = uses_old_names(rope) ? folded(rope).caller_angles : rope.caller_angles;
  if (angles != nullptr) {
    regions.push_back({angle_view(*angles, angles->cos, angles->cos_strides), "angles.cos", false, nullptr, false});
    regions.push_back({angle_view(*angles, angles->sin, angles->sin_strides), "angles.sin", false, nullptr, false});
  }
  const auto written = [&](const TensorView& out, const TensorView& in, const char* name, const char* in_place,
                           const char* input) {
    const bool same = !out.is_set() || same_view(out, in);
    regions.push_back({out.is_set() ? out : in, same ? in_place : name, true, input});
  };
  if (write_q) written(rope.q_out, rope.q, "q_out", "q (in place)", "q");
  if (write_k && rope.k.is_set() && (rope.k_out.is_set() || k_in_place)) {
    written(rope.k_out, rope.k, "k_out", "k (in place)", "k");
  }
}

KernelCache kernel_cache(const CacheView& c, const CacheQuant& q) {
  KernelCache k;
  k.data = c.data;
  k.dtype = c.dtype;
  k.block_size = c.block_size;
  k.capacity = c.capacity();
  k.head_dim = c.head_dim;
  for (size_t d = 0; d < 4; ++d) k.strides[d] = c.strides[d];
  k.offset = c.offset;
  k.scale = q.scale;
  k.per_head = q.scale != nullptr && q.count > 1;
  k.op = q.mode == ScaleMode::multiply ? ScaleOp::multiply : ScaleOp::divide;
  return k;
}

KernelFlat kernel_flat(const TensorView& in, const TensorView& out) {
  KernelFlat f;
  f.in = in.data;
  f.out = out.data;
  f.dtype = in.is_set() ? in.dtype : out.dtype;
  const TensorView& shape = in.is_set() ? in : out;
  f.heads = shape.heads();
  f.dim = shape.head_dim();
  for (size_t d = 0; d < 4; ++d) f.strides[d] = shape.strides[d];
  const TensorView& written = out.is_set() ? out : shape;  // each view at its own strides
  for (size_t d = 0; d < 4; ++d) f.out_strides[d] = written.strides[d];
  return f;
}

void add_cache_write(FusedKernelArgs& f, const CacheWrite& w) {
  f.slots = w.slots.data;
  f.slots_i64 = w.slots.is_i64;
  f.k_cache = kernel_cache(w.k_cache, w.k_quant);
  if (w.v_cache.is_set()) {
    f.has_v_cache = true;
    f.v_cache = kernel_cache(w.v_cache, w.v_quant);
  }
  if (w.k_pass.is_set()) {
    f.has_k_pass = true;
    f.k_pass = kernel_flat(w.k_pass, TensorView{});
    f.k_pass_cache = kernel_cache(w.k_pass_cache, w.k_pass_quant);
  }
}

}  // namespace

// ---- validation shared by the CPU and CUDA entry points ----

void validate_rope_store(const Schedule& schedule, const RopeStoreArgs& args, bool host) {
  check_common_rope(args.rope);
  // k is read only (its rotated rows go to the cache) unless k_out is set.
  if (detail::uses_old_names(args.rope)) {
    detail::validate_reading_k(schedule, detail::folded(args.rope), host);
  } else {
    detail::validate_reading_k(schedule, args.rope, host);
  }
  std::vector<Region> regions;
  regions.reserve(24);  // a call has at most about twenty: one allocation
  check_cache_write(schedule, args.rope, args.cache, host, regions);
  const bool quantised_q = args.q_quantized.is_set();
  if (quantised_q) {
    const TensorView& qq = args.q_quantized;
    detail::check_view(TensorView{.data = qq.data, .dtype = DType::f32, .shape = qq.shape, .strides = qq.strides},
                       "q_quantized");
    if (!is_quantised_dtype(qq.dtype)) {
      throw Error(fmt::format("q_quantized.dtype={} must be fp8_e4m3, fp8_e5m2 or i8", to_string(qq.dtype)));
    }
    if (args.rope.q.dtype == DType::f64) {  // as the caches: f64 data goes to f64 outputs only
      throw Error(fmt::format("q_quantized.dtype={} takes f32, f16 or bf16 data, not f64", to_string(qq.dtype)));
    }
    if (qq.shape != args.rope.q.shape) {
      throw Error(fmt::format("q_quantized shape {} differs from q shape {}", shape_text(qq), shape_text(args.rope.q)));
    }
    check_quant(args.q_quant, "q_quant", qq.dtype, qq.heads(), host);
    regions.push_back({qq, "q_quantized", true});
    regions.push_back(array_region(args.q_quant.scale, args.q_quant.count, 4, "q_quant.scale"));
  } else if (args.q_quant.scale != nullptr) {
    throw Error("q_quant.scale is set but q_quantized is not");
  }
  const bool write_q = !quantised_q || args.rope.q_out.is_set();
  rope_regions(args.rope, write_q, args.rope.k_out.is_set(), false, regions);  // k itself is only read
  check_disjoint(regions);
}

FusedKernelArgs make_rope_store_args(const Schedule& schedule, const RopeStoreArgs& args, const TableRows* table) {
  FusedKernelArgs f;
  f.rope = make_kernel_args(schedule, args.rope, table);
  f.write_q = !args.q_quantized.is_set() || args.rope.q_out.is_set();
  f.write_k = args.rope.k_out.is_set();
  if (args.q_quantized.is_set()) {
    f.q_quantized = kernel_flat(TensorView{}, args.q_quantized);
    f.q_scale = kernel_cache(CacheView{}, args.q_quant);
  }
  add_cache_write(f, args.cache);
  if (args.cache.v.is_set()) f.v = kernel_flat(args.cache.v, TensorView{});
  return f;
}

void validate_qk_norm_rope(const Schedule& schedule, const QkNormRopeArgs& args, bool host) {
  check_common_rope(args.rope);
  if (args.store != nullptr) {  // k goes to the cache, and is written only through k_out (as rope_store)
    detail::validate_reading_k(schedule, detail::uses_old_names(args.rope) ? detail::folded(args.rope) : args.rope,
                               host);
  } else if (host) {
    rotary::validate(schedule, args.rope);
  } else {
    rotary::validate_shapes(schedule, args.rope);
  }
  const DType dtype = args.rope.q.dtype;
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16) {
    throw Error(fmt::format("q.dtype={}: qk_norm_rope takes f32, f16 or bf16 data", to_string(dtype)));
  }
  if (!std::isfinite(args.eps) || args.eps < 0) throw Error(fmt::format("eps={} must be finite and >= 0", args.eps));
  if (!std::isfinite(args.weight_offset)) throw Error(fmt::format("weight_offset={} must be finite", args.weight_offset));
  if (args.order != NormOrder::norm_then_rope && args.order != NormOrder::rope_then_norm) {
    throw Error(fmt::format("order={} is not norm_then_rope or rope_then_norm", static_cast<int>(args.order)));
  }
  if (args.rounding != NormRounding::llama && args.rounding != NormRounding::gemma) {
    throw Error(fmt::format("rounding={} is not llama or gemma", static_cast<int>(args.rounding)));
  }
  if (args.scope != NormScope::head && args.scope != NormScope::all_heads) {
    throw Error(fmt::format("scope={} is not head or all_heads", static_cast<int>(args.scope)));
  }
  const auto check_weight = [&](const NormWeight& w, const char* name, int64_t heads) {
    if (w.data == nullptr) return;
    if (w.dtype != DType::f32 && w.dtype != dtype) {
      throw Error(fmt::format("{}.dtype={} must be f32 or the data's dtype {}", name, to_string(w.dtype),
                              to_string(dtype)));
    }
    const int64_t want = args.scope == NormScope::all_heads ? heads * schedule.head_dim : schedule.head_dim;
    if (w.count != want) {
      throw Error(fmt::format("{}.count={} must be {} ({})", name, w.count, want,
                              args.scope == NormScope::all_heads ? "heads * head_dim: scope all_heads" : "head_dim"));
    }
  };
  check_weight(args.q_weight, "q_weight", args.rope.q.heads());
  if (args.k_weight.data != nullptr && !args.rope.k.is_set()) throw Error("k_weight is set but k is not");
  if (args.rope.k.is_set()) check_weight(args.k_weight, "k_weight", args.rope.k.heads());
  std::vector<Region> regions;
  regions.reserve(24);  // a call has at most about twenty: one allocation
  regions.push_back(array_region(args.q_weight.data, args.q_weight.count, size_of(args.q_weight.dtype), "q_weight"));
  regions.push_back(array_region(args.k_weight.data, args.k_weight.count, size_of(args.k_weight.dtype), "k_weight"));
  const bool has_v = args.v.is_set();
  if ((args.v_norm || args.store != nullptr) == false && has_v) {
    throw Error("v is set but neither v_norm nor store is (v is read only to be normed or stored)");
  }
  if (args.v_norm && !has_v) throw Error("v_norm is set but v is not");
  if (has_v) {
    check_flat(args.v, "v", args.rope.q, dtype);
    regions.push_back({args.v, "v", false});
  }
  if (args.v_out.is_set()) {
    if (!args.v_norm || args.store != nullptr) throw Error("v_out is set but v is not normed in place (v_norm without store)");
    check_flat(args.v_out, "v_out", args.rope.q, dtype);
    if (args.v_out.shape != args.v.shape) {
      throw Error(fmt::format("v_out shape {} differs from v shape {}", shape_text(args.v_out), shape_text(args.v)));
    }
  }
  if (args.v_norm && args.store == nullptr) {  // v normed into v_out, or in place
    const bool same = !args.v_out.is_set() || same_view(args.v_out, args.v);
    regions.push_back({args.v_out.is_set() ? args.v_out : args.v, same ? "v (in place)" : "v_out", true, "v"});
  }
  if (args.store != nullptr) {
    CacheWrite w = *args.store;
    w.v = args.v;
    check_cache_write(schedule, args.rope, w, host, regions);
  }
  const bool write_k = args.store == nullptr || args.rope.k_out.is_set();
  rope_regions(args.rope, true, write_k, args.store == nullptr, regions);
  check_disjoint(regions);
}

FusedKernelArgs make_qk_norm_rope_args(const Schedule& schedule, const QkNormRopeArgs& args, const TableRows* table) {
  FusedKernelArgs f;
  f.rope = make_kernel_args(schedule, args.rope, table);
  f.write_q = true;
  f.write_k = args.store == nullptr || args.rope.k_out.is_set();
  f.norm = true;
  f.rope_then_norm = args.order == NormOrder::rope_then_norm;
  f.gemma = args.rounding == NormRounding::gemma;
  f.all_heads = args.scope == NormScope::all_heads;
  f.v_norm = args.v_norm;
  f.eps = args.eps;
  f.weight_offset = args.weight_offset;
  f.q_weight = KernelWeight{args.q_weight.data, args.q_weight.dtype};
  f.k_weight = KernelWeight{args.k_weight.data, args.k_weight.dtype};
  if (args.store != nullptr) add_cache_write(f, *args.store);
  if (args.v.is_set()) {
    const bool write_v = args.v_norm && args.store == nullptr;
    f.v = kernel_flat(args.v, write_v ? (args.v_out.is_set() ? args.v_out : args.v) : TensorView{});
  }
  return f;
}

void validate_rerotate_cache(const Schedule& schedule, const RerotateCacheArgs& args, bool host) {
  validate(schedule);
  if (schedule.xpos()) {
    throw Error("rerotate_cache does not move xPos keys (their scale moves with them): use rerotate on a gathered copy");
  }
  if (args.mode != RerotateMode::delta && args.mode != RerotateMode::raw) {
    throw Error(fmt::format("mode={} is not delta or raw", static_cast<int>(args.mode)));
  }
  if (args.rotated != Direction::forward && args.rotated != Direction::inverse) {
    throw Error(fmt::format("rotated={} is not forward or inverse", static_cast<int>(args.rotated)));
  }
  if (args.threads < 0 || args.threads > max_threads) {
    throw Error(fmt::format("threads={} must be in [0, {}]", args.threads, max_threads));
  }
  const CacheView& c = args.cache;
  if (!c.is_set()) throw Error("cache is not set");
  if (c.dtype == DType::f64) throw Error("cache.dtype=f64: rerotate_cache turns f32, f16, bf16, fp8 and i8 caches");
  check_cache(c, "cache", c.heads, schedule.head_dim, c.dtype);
  check_quant(args.quant, "quant", c.dtype, c.heads, host);
  if (args.out.is_set()) {
    const CacheView& o = args.out;
    check_cache(o, "out", c.heads, schedule.head_dim, c.dtype);
    if (o.dtype != c.dtype) {
      throw Error(fmt::format("out.dtype={} differs from cache.dtype={}", to_string(o.dtype), to_string(c.dtype)));
    }
    if (o.capacity() != c.capacity()) {
      throw Error(fmt::format("out holds {} slots but cache holds {}", o.capacity(), c.capacity()));
    }
    const bool same = o.data == c.data && o.strides == c.strides && o.offset == c.offset && o.block_size == c.block_size;
    if (!same && may_overlap(as_view(o), as_view(c))) {
      throw Error("out overlaps cache (give the same view for in place, or disjoint memory)");
    }
  }
  const int64_t count = args.slots.count;
  if (count < 0) throw Error(fmt::format("slots.count={} must be >= 0", count));
  if (host) {
    check_slots(args.slots, count, {{&args.cache, "cache"}});
  } else if (count > 0 && args.slots.data == nullptr) {
    throw Error("slots data is null");
  }
  if (args.mode == RerotateMode::delta) {
    if (args.numerics.has_value() && *args.numerics != AngleMode::exact) {
      throw Error("numerics=hf_float32 is for raw mode (delta mode turns keys by exact angles of their deltas)");
    }
    if (args.table != nullptr) throw Error("table is for raw mode (delta mode turns keys by exact angles of their deltas)");
    if (args.positions.kind != Positions::Kind::sequential || args.positions.offset != 0) {
      throw Error("positions is for raw mode (delta mode moves each slot's keys by its delta)");
    }
    if (args.delta_streams != 1 && args.delta_streams != schedule.streams) {
      throw Error(fmt::format("delta_streams={} must be 1 (every stream) or the schedule's streams={}",
                              args.delta_streams, schedule.streams));
    }
    if (count > 0 && args.delta == nullptr) throw Error("delta is null (delta mode)");
    if (host) {
      for (int64_t i = 0; i < args.delta_streams * count; ++i) {
        const int64_t d = args.delta[i];
        if (d <= -max_position_limit || d >= max_position_limit) {
          throw Error(args.delta_streams == 1 ? fmt::format("delta[{}]={} must be in (-2^31, 2^31)", i, d)
                                              : fmt::format("delta[{}][{}]={} must be in (-2^31, 2^31)", i / count,
                                                            i % count, d));
        }
      }
    }
  } else {
    if (args.delta != nullptr) throw Error("delta is for delta mode (raw mode rotates stored keys to positions)");
    // apply's rules for the positions (and table, numerics): keys [1, count, heads, head_dim].
    const TensorView keys{.data = c.data, .dtype = DType::f32, .shape = {1, count, 0, schedule.head_dim},
                          .strides = {0, 0, 0, 1}};
    const ApplyArgs raw{.q = keys, .positions = args.positions, .table = args.table, .numerics = args.numerics};
    if (host) {
      rotary::validate(schedule, raw);
    } else {
      rotary::validate_shapes(schedule, raw);
    }
  }
  // What the rows read as they go (slots, deltas or positions, the scale): the cache they write may
  // not overlap it (a slot rewritten by an earlier slot's keys would send later keys elsewhere).
  const bool to_out = args.out.is_set();
  const TensorView written = as_view(to_out ? args.out : c);
  int64_t deltas = 0;
  if (args.mode == RerotateMode::delta && __builtin_mul_overflow(count, std::max(args.delta_streams, 1), &deltas)) {
    deltas = std::numeric_limits<int64_t>::max();  // bytes_view answers it conservatively
  }
  const std::pair<TensorView, const char*> read[] = {
      {bytes_view(args.slots.data, count, args.slots.is_i64 ? 8 : 4), "slots"},
      {bytes_view(args.delta, deltas, 8), "delta"},
      {args.mode == RerotateMode::raw ? positions_view(args.positions) : TensorView{.dtype = DType::i8}, "positions"},
      {bytes_view(args.quant.scale, args.quant.count, 4), "quant.scale"}};
  for (const auto& [view, name] : read) {
    if (may_overlap(written, view)) {
      throw Error(fmt::format("{} overlaps {} (the cache written must not share memory with what is read)",
                              to_out ? "out" : "cache (in place)", name));
    }
  }
}

RerotateKernelArgs make_rerotate_args(const Schedule& schedule, const RerotateCacheArgs& args, const TableRows* table) {
  RerotateKernelArgs r;
  const int64_t count = args.slots.count;
  const TensorView keys{.data = args.cache.data, .dtype = DType::f32, .shape = {1, count, 0, schedule.head_dim},
                        .strides = {0, 0, 0, 1}};
  ApplyArgs raw{.q = keys, .positions = args.positions, .direction = args.rotated, .numerics = args.numerics};
  if (args.mode == RerotateMode::delta) {
    raw.positions = Positions::sequential(0);
    raw.numerics = std::nullopt;
  }
  r.rope = make_kernel_args(schedule, raw, args.mode == RerotateMode::raw ? table : nullptr);
  r.rope.tokens = count;
  r.raw = args.mode == RerotateMode::raw;
  r.delta = args.delta;
  r.delta_streams = args.delta_streams;
  r.count = count;
  r.slots = args.slots.data;
  r.slots_i64 = args.slots.is_i64;
  r.heads = args.cache.heads;
  r.in = kernel_cache(args.cache, args.quant);
  r.out = kernel_cache(args.out.is_set() ? args.out : args.cache, args.quant);
  r.rotated_inverse = args.rotated == Direction::inverse;
  return r;
}

// ---- the CPU loop ----

namespace {

// useful_threads (the processor count read once: asking for it costs a system call) over at most
// one block per token and per 256 KiB moved.
int team_size(int requested, int64_t tokens, int64_t bytes_per_token) {
  const int64_t by_work = std::max<int64_t>(1, tokens * bytes_per_token / (256 * 1024));
  return useful_threads(requested, std::min(tokens, by_work));
}

template <class T>
void run_fused(const FusedKernelArgs& f, int threads) {
  using Value = typename Storage<T>::Value;
  const PairArrays pairs = pair_arrays(f.rope);
  const int64_t tokens = f.rope.tokens;
  const int64_t items = fused_items(f);
  const int64_t bytes = items * f.rope.head_dim * size_of(f.rope.dtype) * 2;
  const int team = team_size(threads, tokens, bytes);
  uint32_t error = 0;
#pragma omp parallel num_threads(team) reduction(| : error)
  {
    std::vector<AngleCell<Value>> cells(static_cast<size_t>(std::max<int64_t>(f.rope.rotary_dim / 2, 1)));
    FusedKernelArgs local = f;
    local.rope.error = &error;
#pragma omp for schedule(static)
    for (int64_t token = 0; token < tokens; ++token) {
      fused_angles<Value>(local, pairs, token, 0, 1, cells.data());  // or reports an unusable position
      if (token_error(local.rope, token) != 0) continue;
      float token_r[2];
      fused_token_norms<T>(local, pairs, cells.data(), token, token_r);
      for (int64_t item = 0; item < items; ++item) {
        fused_item<T>(local, pairs, cells.data(), token, item,
                      fused_item_factor<T>(local, pairs, cells.data(), token, item, token_r));
      }
    }
  }
  if (f.rope.error != nullptr) *f.rope.error |= error;
}

void run_rerotate(const RerotateKernelArgs& r, int threads) {
  const PairArrays pairs = pair_arrays(r.rope);
  const int team = team_size(threads, r.count, r.heads * r.rope.head_dim * size_of(r.in.dtype) * 2);
#pragma omp parallel num_threads(team)
  {
    std::vector<AngleCell<float>> cells(static_cast<size_t>(std::max<int64_t>(r.rope.rotary_dim / 2, 1)));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < r.count; ++i) {
      const int64_t slot = r.slots_i64 ? static_cast<const int64_t*>(r.slots)[i]
                                       : static_cast<int64_t>(static_cast<const int32_t*>(r.slots)[i]);
      if (slot < 0) continue;
      for (int64_t j = 0; j < r.rope.rotary_dim / 2; ++j) cells[static_cast<size_t>(j)] = rerotate_angle(r, pairs, i, j);
      for (int64_t h = 0; h < r.heads; ++h) rerotate_item(r, pairs, cells.data(), i, h);
    }
  }
}

}  // namespace

void check_host_slots(const Slots& host_slots, const Slots& slots, int64_t tokens,
                      std::initializer_list<std::pair<const CacheView*, const char*>> caches) {
  if (host_slots.count != slots.count || host_slots.is_i64 != slots.is_i64) {
    throw Error(fmt::format("host_slots ({} {} entries) must match slots ({} {} entries)", host_slots.count,
                            host_slots.is_i64 ? "int64" : "int32", slots.count, slots.is_i64 ? "int64" : "int32"));
  }
  check_slots(host_slots, tokens, caches);
}

void cpu_fused(const FusedKernelArgs& f, int threads, Backend backend) {
  if (f.rope.tokens == 0) return;
  if (backend != Backend::reference) {
    const int64_t bytes = fused_items(f) * f.rope.head_dim * size_of(f.rope.dtype) * 2;
    if (cpu_fused_rows(f, team_size(threads, f.rope.tokens, bytes))) return;
  }
  with_storage(f.rope.dtype, [&]<class T>() { run_fused<T>(f, backend == Backend::reference ? 1 : threads); });
}

void cpu_rerotate_cache(const RerotateKernelArgs& r, int threads, Backend backend) {
  if (r.count == 0) return;
  if (backend != Backend::reference) {
    const int64_t bytes = r.heads * r.rope.head_dim * size_of(r.in.dtype) * 2;
    if (cpu_rerotate_rows(r, team_size(threads, r.count, bytes))) return;
  }
  run_rerotate(r, backend == Backend::reference ? 1 : threads);
}

}  // namespace detail

// ---- public entry points ----

void validate(const Schedule& schedule, const RopeStoreArgs& args) {
  if (detail::uses_old_names(args.rope)) {
    validate(schedule, detail::folded_rope(args));
    return;
  }
  detail::validate_rope_store(schedule, args, true);
}

void rope_store(const Schedule& schedule, const RopeStoreArgs& args) {
  if (detail::uses_old_names(args.rope)) {
    rope_store(schedule, detail::folded_rope(args));
    return;
  }
  detail::validate_rope_store(schedule, args, true);
  std::vector<int64_t> row_index;
  std::optional<detail::TableRows> rows;
  if (args.rope.table != nullptr) {
    rows = detail::table_rows(*args.rope.table, args.rope.positions, args.rope.q.seq(), row_index);
  }
  const detail::FusedKernelArgs f = detail::make_rope_store_args(schedule, args, rows ? &*rows : nullptr);
  detail::cpu_fused(f, args.rope.threads, args.rope.backend);
}

void validate(const Schedule& schedule, const QkNormRopeArgs& args) {
  if (detail::uses_old_names(args.rope)) {
    validate(schedule, detail::folded_rope(args));
    return;
  }
  detail::validate_qk_norm_rope(schedule, args, true);
}

void qk_norm_rope(const Schedule& schedule, const QkNormRopeArgs& args) {
  if (detail::uses_old_names(args.rope)) {
    qk_norm_rope(schedule, detail::folded_rope(args));
    return;
  }
  detail::validate_qk_norm_rope(schedule, args, true);
  std::vector<int64_t> row_index;
  std::optional<detail::TableRows> rows;
  if (args.rope.table != nullptr) {
    rows = detail::table_rows(*args.rope.table, args.rope.positions, args.rope.q.seq(), row_index);
  }
  const detail::FusedKernelArgs f = detail::make_qk_norm_rope_args(schedule, args, rows ? &*rows : nullptr);
  detail::cpu_fused(f, args.rope.threads, args.rope.backend);
}

void validate(const Schedule& schedule, const RerotateCacheArgs& args) {
  detail::validate_rerotate_cache(schedule, args, true);
}

void rerotate_cache(const Schedule& schedule, const RerotateCacheArgs& args) {
  detail::validate_rerotate_cache(schedule, args, true);
  std::vector<int64_t> row_index;
  std::optional<detail::TableRows> rows;
  if (args.mode == RerotateMode::raw && args.table != nullptr) {
    rows = detail::table_rows(*args.table, args.positions, args.slots.count, row_index);
  }
  const detail::RerotateKernelArgs r = detail::make_rerotate_args(schedule, args, rows ? &*rows : nullptr);
  detail::cpu_rerotate_cache(r, args.threads, args.backend);
}

}  // namespace rotary
