// The cases of the fused operations' tests (test_fused.cpp, test_fused_emulation.cpp): data,
// poisoned caches, shuffled slots, and the compositions' own pieces written out here — the
// reference scatter (cache addressing by its formula, values through support/quant_oracle.hpp),
// the reference RMSNorm (the documented order: squares summed in double in index order, then
// fl32(mean), fl32(mean + eps), fl32(1 / sqrt) in double), and the gather/rerotate/scatter of keys.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "math/half.hpp"
#include "rotary/apply.hpp"
#include "rotary/fused.hpp"
#include "rotary/rerotate.hpp"
#include "rotary/table.hpp"
#include "support/quant_oracle.hpp"

namespace rotary::test {

using Buffer = std::vector<unsigned char>;
enum class Layout { nhd, hnd, contiguous, mla };
enum class AngleSource { exact, table, caller, hf_float32 };

inline const char* layout_name(Layout l) {
  return l == Layout::nhd ? "NHD" : l == Layout::hnd ? "HND" : l == Layout::contiguous ? "contiguous" : "MLA";
}

inline bool same_bytes(const Buffer& a, const Buffer& b, DType) { return a == b; }
inline std::string first_difference(const Buffer& a, const Buffer& b) {
  if (a.size() != b.size()) return fmt::format("sizes {} and {}", a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return fmt::format("byte {}: {:#04x} vs {:#04x}", i, a[i], b[i]);
  }
  return "none";
}

inline void store_value(DType dtype, unsigned char* base, int64_t i, float v) {
  oracle_store(dtype, base, i, v, 1.0f, ScaleMode::divide);
}
inline float load_value(DType dtype, const unsigned char* base, int64_t i) {
  switch (dtype) {
    case DType::f32: { float v; std::memcpy(&v, base + 4 * i, 4); return v; }
    case DType::f16: { uint16_t v; std::memcpy(&v, base + 2 * i, 2); return detail::f16_to_f32(v); }
    case DType::bf16: { uint16_t v; std::memcpy(&v, base + 2 * i, 2); return detail::bf16_to_f32(v); }
    case DType::fp8_e4m3: return static_cast<float>(oracle_fp8_value(base[i], true));
    case DType::fp8_e5m2: return static_cast<float>(oracle_fp8_value(base[i], false));
    case DType::i8: return static_cast<float>(static_cast<int8_t>(base[i]));
    default: return 0;
  }
}

inline Buffer random_values(DType dtype, int64_t n, std::mt19937& rng, float magnitude) {
  std::normal_distribution<float> normal(0.0f, magnitude);
  Buffer b(static_cast<size_t>(n * size_of(dtype)));
  for (int64_t i = 0; i < n; ++i) store_value(dtype, b.data(), i, normal(rng));
  return b;
}

/// A cache of `dtype` in `layout`, its bytes poisoned (0xa5 everywhere), and its view.
struct Cache {
  Buffer bytes;
  CacheView view;
};
inline void make_cache(Layout layout, DType dtype, int64_t blocks, int64_t block, int64_t heads, int64_t dim,
                       Buffer& bytes, CacheView& view, int64_t offset = 0, int64_t row = 0) {
  const int64_t width = row == 0 ? dim + offset : row;
  bytes.assign(static_cast<size_t>(blocks * block * heads * width * size_of(dtype)), 0xa5);
  view = layout == Layout::hnd ? CacheView::hnd(bytes.data(), dtype, blocks, block, heads, dim, offset, row)
                               : CacheView::nhd(bytes.data(), dtype, blocks, block, heads, dim, offset, row);
}

/// The element (slot, h, d) of a cache, by fused.hpp's formula.
inline int64_t cache_element(const CacheView& c, int64_t slot, int64_t h, int64_t d) {
  return (slot / c.block_size) * c.strides[0] + (slot % c.block_size) * c.strides[1] + h * c.strides[2] +
         (c.offset + d) * c.strides[3];
}

/// `count` distinct slots of [0, capacity), shuffled (a shuffled block table), two of them -1.
inline std::vector<int64_t> shuffled_slots(int64_t count, int64_t capacity, std::mt19937& rng) {
  std::vector<int64_t> all(static_cast<size_t>(capacity));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(count));
  if (count > 3) all[1] = -1;
  if (count > 5) all[static_cast<size_t>(count) - 2] = -1;
  return all;
}

struct StoreCase {
  Schedule schedule;
  Layout layout = Layout::nhd;
  int64_t block_size = 16;
  DType dtype = DType::bf16;
  DType cache_dtype = DType::bf16;
  int64_t heads_q = 4;
  int64_t heads_k = 2;
  int64_t tokens = 9;
  int64_t v_dim = 0;  ///< 0: head_dim
  bool scaled = false;
  bool per_head_scale = false;
  ScaleMode mode = ScaleMode::divide;
  float magnitude = 2.0f;
  int seed = 1;
  bool mrope = false;
  AngleSource source = AngleSource::exact;
  int64_t pass_dim = 0;  ///< MLA: kv_c width
  std::string name() const {
    return fmt::format("d={} r={} off={} {} {} block={} {} -> {} hq={} hk={} scale={}{} mode={} source={} mrope={}",
                       schedule.head_dim, schedule.rotary_dim, schedule.rotary_offset,
                       schedule.pairing == Pairing::half ? "half" : "interleaved", layout_name(layout), block_size,
                       to_string(dtype), to_string(cache_dtype), heads_q, heads_k, scaled, per_head_scale ? "/head" : "",
                       mode == ScaleMode::divide ? "divide" : "multiply", static_cast<int>(source), mrope);
  }
};

/// DeepSeek-V3's MLA write: 16 query heads of the 64-channel rope part, one latent row [kv_c 512 |
/// k_pe 64] per slot (k_pe rotated, interleaved), blocks of 64 slots.
inline StoreCase deepseek_mla_case(int seed) {
  StoreCase c;
  c.schedule = make_schedule(Spec{.head_dim = 64, .pairing = Pairing::interleaved});
  c.layout = Layout::mla;
  c.heads_q = 16;
  c.heads_k = 1;
  c.pass_dim = 512;
  c.block_size = 64;
  c.seed = seed;
  return c;
}

/// Buffers and views of one StoreCase.
struct StoreSetup {
  StoreCase c;
  int64_t d;
  Buffer q, k, v, k_pass, k_input;
  Buffer k_cache_bytes, v_cache_bytes;
  CacheView k_cache{}, v_cache{}, k_pass_cache{};
  std::vector<int64_t> slots, positions;
  std::vector<float> k_scales, v_scales;
  CacheQuant k_quant{}, v_quant{};
  std::optional<Table> table;
  std::vector<float> caller_cos, caller_sin;
  CallerAngles caller{};

  explicit StoreSetup(const StoreCase& sc) : c(sc), d(sc.schedule.head_dim) {
    std::mt19937 rng(static_cast<uint32_t>(c.seed));
    if (c.v_dim == 0) c.v_dim = d;
    q = random_values(c.dtype, c.tokens * c.heads_q * d, rng, c.magnitude);
    k = random_values(c.dtype, c.tokens * c.heads_k * d, rng, c.magnitude);
    v = random_values(c.dtype, c.tokens * c.heads_k * c.v_dim, rng, c.magnitude);
    k_input = k;
    const int64_t blocks = std::max<int64_t>(2, (3 * c.tokens + c.block_size - 1) / c.block_size);
    if (c.layout == Layout::mla) {
      k_pass = random_values(c.dtype, c.tokens * c.pass_dim, rng, c.magnitude);
      const int64_t row = c.pass_dim + d;
      make_cache(Layout::nhd, c.cache_dtype, blocks, c.block_size, 1, d, k_cache_bytes, k_cache, c.pass_dim, row);
      k_pass_cache = CacheView::nhd(k_cache_bytes.data(), c.cache_dtype, blocks, c.block_size, 1, c.pass_dim, 0, row);
    } else {
      make_cache(c.layout, c.cache_dtype, blocks, c.block_size, c.heads_k, d, k_cache_bytes, k_cache);
      make_cache(c.layout, c.cache_dtype, blocks, c.block_size, c.heads_k, c.v_dim, v_cache_bytes, v_cache);
    }
    slots = shuffled_slots(c.tokens, blocks * c.block_size, rng);
    const int streams = c.mrope ? 3 : 1;
    const bool small = c.source != AngleSource::exact || c.schedule.xpos();
    std::uniform_int_distribution<int64_t> position(0, small ? 2047 : 1000000);
    positions.resize(static_cast<size_t>(streams * c.tokens));
    for (int64_t& p : positions) p = position(rng);
    if (c.scaled) {
      std::uniform_real_distribution<float> scale(0.5f, 2.0f);
      const int64_t n = c.per_head_scale ? c.heads_k : 1;
      for (int64_t i = 0; i < n; ++i) k_scales.push_back(scale(rng));
      for (int64_t i = 0; i < n; ++i) v_scales.push_back(scale(rng));
      k_quant = CacheQuant{.scale = k_scales.data(), .count = n, .mode = c.mode};
      v_quant = CacheQuant{.scale = v_scales.data(), .count = n, .mode = c.mode};
    }
    if (c.source == AngleSource::table) table = Table::range(c.schedule, 0, 2048);
    if (c.source == AngleSource::caller) {
      const int64_t width = c.schedule.rotary_dim / 2;
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      caller_cos.resize(static_cast<size_t>(2048 * width));
      caller_sin.resize(caller_cos.size());
      for (float& x : caller_cos) x = u(rng);
      for (float& x : caller_sin) x = u(rng);
      caller = CallerAngles{.index = CallerAngles::Index::per_position, .columns = CallerAngles::Columns::pairs,
                            .cos = caller_cos.data(), .sin = caller_sin.data(), .shape = {1, 2048, width},
                            .cos_strides = {0, width, 1}, .sin_strides = {0, width, 1}};
    }
  }
  const CacheQuant* k_quant_ptr() const { return &k_quant; }
  const CacheQuant* v_quant_ptr() const { return &v_quant; }
  TensorView view(Buffer& b, int64_t heads, int64_t dim = 0) const {
    return TensorView::bshd(b.data(), c.dtype, 1, c.tokens, heads, dim == 0 ? d : dim);
  }
  ApplyArgs rope_args() {
    ApplyArgs a{.q = view(q, c.heads_q), .k = view(k, c.heads_k),
                .positions = Positions::per_token(std::span<const int64_t>(positions), c.mrope ? 3 : 1)};
    if (table) a.table = &*table;
    if (c.source == AngleSource::caller) a.caller_angles = &caller;
    if (c.source == AngleSource::hf_float32) a.numerics = AngleMode::hf_float32;
    return a;
  }
  RopeStoreArgs store_args() {
    RopeStoreArgs a{.rope = rope_args()};
    a.cache.slots = Slots::of(std::span<const int64_t>(slots));
    a.cache.k_cache = k_cache;
    a.cache.k_quant = k_quant;
    if (c.layout == Layout::mla) {
      a.cache.k_pass = TensorView::bshd(k_pass.data(), c.dtype, 1, c.tokens, 1, c.pass_dim);
      a.cache.k_pass_cache = k_pass_cache;
      a.cache.k_pass_quant = v_quant;  // a scale of its own (v's draw): one taken for the other would show
    } else {
      a.cache.v = view(v, c.heads_k, c.v_dim);
      a.cache.v_cache = v_cache;
      a.cache.v_quant = v_quant;
    }
    return a;
  }
  /// The reference scatter: src [tokens, heads, dim] of the data dtype into `ref` (a copy of the
  /// cache's buffer) at each token's slot, through the oracle quantiser.
  void scatter(const Buffer& src, int64_t heads, int64_t dim, const CacheView& cache, Buffer& ref,
               const CacheQuant* quant) const {
    const Buffer& owner = cache.data == static_cast<const void*>(v_cache_bytes.data()) ? v_cache_bytes : k_cache_bytes;
    const int64_t base = static_cast<const unsigned char*>(cache.data) - owner.data();
    for (int64_t t = 0; t < c.tokens; ++t) {
      const int64_t slot = slots[static_cast<size_t>(t)];
      if (slot < 0) continue;
      for (int64_t h = 0; h < heads; ++h) {
        const float s = quant != nullptr && quant->scale != nullptr ? quant->scale[quant->count > 1 ? h : 0] : 1.0f;
        const ScaleMode mode = quant != nullptr ? quant->mode : ScaleMode::divide;
        for (int64_t e = 0; e < dim; ++e) {
          const float x = load_value(c.dtype, src.data(), (t * heads + h) * dim + e);
          oracle_store(cache.dtype, ref.data() + base, cache_element(cache, slot, h, e), x, s, mode);
        }
      }
    }
  }
};

// ---- rope_store's case grids (tests/test_fused.cpp against the composition; tests/test_fused_emulation.cpp
// through the device's split) ----

inline Schedule schedule_of(int64_t head_dim, int64_t rotary_dim, Pairing pairing, int64_t offset = 0) {
  return make_schedule(Spec{.head_dim = head_dim, .rotary_dim = rotary_dim, .pairing = pairing,
                            .rotary_offset = offset});
}

/// Every layout, block size 1/16/64 (contiguous: rows of 32), head_dim 64-512, both pairings; bf16.
inline std::vector<StoreCase> layout_grid() {
  std::vector<StoreCase> cases;
  int seed = 0;
  for (const Layout layout : {Layout::nhd, Layout::hnd, Layout::contiguous}) {
    for (const int64_t block : {1, 16, 64}) {
      for (const int64_t d : {64, 80, 96, 128, 192, 256, 512}) {
        for (const Pairing pairing : {Pairing::half, Pairing::interleaved}) {
          StoreCase c;
          c.schedule = schedule_of(d, d, pairing);
          c.layout = layout;
          c.block_size = layout == Layout::contiguous ? 32 : block;
          c.dtype = DType::bf16;
          c.cache_dtype = DType::bf16;
          c.seed = ++seed;
          c.tokens = 7;
          cases.push_back(c);
        }
      }
    }
  }
  return cases;
}

/// GQA ratios 1-16, partial rotary and a slice at an offset, each of `dtypes` (cache of the same).
inline std::vector<StoreCase> gqa_grid(std::initializer_list<DType> dtypes) {
  std::vector<StoreCase> cases;
  int seed = 100;
  for (const int64_t ratio : {1, 2, 4, 8, 16}) {
    for (const DType dtype : dtypes) {
      for (const auto& [d, r, off] : {std::tuple{128, 64, 0}, std::tuple{80, 32, 0}, std::tuple{192, 64, 128}}) {
        StoreCase c;
        c.schedule = schedule_of(d, r, ratio % 2 ? Pairing::half : Pairing::interleaved, off);
        c.heads_k = 2;
        c.heads_q = 2 * ratio;
        c.dtype = dtype;
        c.cache_dtype = dtype;
        c.seed = ++seed;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

/// Quantised caches (and f16/f32 ones), per tensor and per head, both scale modes, values beyond
/// ±max (saturation).
inline std::vector<StoreCase> quantised_grid() {
  std::vector<StoreCase> cases;
  int seed = 200;
  for (const DType cache : {DType::fp8_e4m3, DType::fp8_e5m2, DType::i8, DType::f16, DType::f32}) {
    for (const DType dtype : {DType::bf16, DType::f32}) {
      for (const bool per_head : {false, true}) {
        for (const ScaleMode mode : {ScaleMode::divide, ScaleMode::multiply}) {
          StoreCase c;
          c.schedule = schedule_of(64, 64, Pairing::half);
          c.dtype = dtype;
          c.cache_dtype = cache;
          c.scaled = is_quantised_dtype(cache);
          c.per_head_scale = per_head;
          c.mode = mode;
          c.magnitude = cache == DType::i8 ? 200.0f : 600.0f;  // beyond ±max: saturation
          c.seed = ++seed;
          cases.push_back(c);
        }
      }
    }
  }
  return cases;
}

/// fp8 stores from e5m2's and e4m3's subnormals to beyond ±max.
inline std::vector<StoreCase> fp8_extremes_grid() {
  std::vector<StoreCase> cases;
  for (const DType cache : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    for (const float magnitude : {2e-5f, 1e-3f, 448.0f, 57344.0f, 1e5f}) {
      StoreCase c;
      c.schedule = schedule_of(64, 64, Pairing::interleaved);
      c.dtype = DType::f32;
      c.cache_dtype = cache;
      c.scaled = true;
      c.magnitude = magnitude;
      c.seed = 300 + static_cast<int>(magnitude);
      cases.push_back(c);
    }
  }
  return cases;
}

// ---- qk_norm_rope ----

struct NormCase {
  Schedule schedule;
  DType dtype = DType::bf16;
  int seed = 1;
  int64_t heads_q = 4;
  int64_t heads_k = 2;
  int64_t tokens = 5;
  NormOrder order = NormOrder::norm_then_rope;
  NormRounding rounding = NormRounding::llama;
  NormScope scope = NormScope::head;
  float weight_offset = 0.0f;
  float eps = 1e-6f;
  bool weights = true;
  bool v_norm = false;
  bool store = false;
  bool mrope = false;
  bool identity_rope = false;
  std::string name() const {
    return fmt::format("d={} r={} {} {} order={} rounding={} scope={} offset={} weights={} v_norm={} store={}",
                       schedule.head_dim, schedule.rotary_dim, schedule.pairing == Pairing::half ? "half" : "interleaved",
                       to_string(dtype), static_cast<int>(order), static_cast<int>(rounding), static_cast<int>(scope),
                       weight_offset, weights, v_norm, store);
  }
};

struct NormSetup {
  NormCase c;
  int64_t d;
  Buffer q, k, v, q_weight, k_weight;
  DType weight_dtype;
  Buffer k_cache_bytes, v_cache_bytes;
  CacheView k_cache{}, v_cache{};
  std::vector<int64_t> slots, positions;
  CacheWrite write{};

  explicit NormSetup(const NormCase& nc) : c(nc), d(nc.schedule.head_dim) {
    std::mt19937 rng(static_cast<uint32_t>(c.seed));
    q = random_values(c.dtype, c.tokens * c.heads_q * d, rng, 3.0f);
    k = random_values(c.dtype, c.tokens * c.heads_k * d, rng, 3.0f);
    v = random_values(c.dtype, c.tokens * c.heads_k * d, rng, 3.0f);
    // llama rounding: the weight in the data's dtype (as the checkpoints hold it); gemma: float32.
    weight_dtype = c.rounding == NormRounding::llama ? c.dtype : DType::f32;
    const int64_t per = c.scope == NormScope::all_heads ? d : d;
    q_weight = random_values(weight_dtype, (c.scope == NormScope::all_heads ? c.heads_q : 1) * per, rng, 1.0f);
    k_weight = random_values(weight_dtype, (c.scope == NormScope::all_heads ? c.heads_k : 1) * per, rng, 1.0f);
    make_cache(Layout::nhd, c.dtype, 4, 16, c.heads_k, d, k_cache_bytes, k_cache);
    make_cache(Layout::hnd, c.dtype, 4, 16, c.heads_k, d, v_cache_bytes, v_cache);
    slots = shuffled_slots(c.tokens, 64, rng);
    const int streams = c.mrope ? 3 : 1;
    std::uniform_int_distribution<int64_t> position(0, 200000);
    positions.resize(static_cast<size_t>(streams * c.tokens));
    for (int64_t& p : positions) p = c.identity_rope ? 0 : position(rng);
  }
  TensorView view(Buffer& b, int64_t heads) const { return TensorView::bshd(b.data(), c.dtype, 1, c.tokens, heads, d); }
  ApplyArgs rope_args() {
    return ApplyArgs{.q = view(q, c.heads_q), .k = view(k, c.heads_k),
                     .positions = Positions::per_token(std::span<const int64_t>(positions), c.mrope ? 3 : 1)};
  }
  QkNormRopeArgs norm_args() {
    QkNormRopeArgs a{.rope = rope_args(), .eps = c.eps, .weight_offset = c.weight_offset, .order = c.order,
                     .rounding = c.rounding, .scope = c.scope, .v_norm = c.v_norm};
    if (c.weights) {
      const int64_t per = c.scope == NormScope::all_heads ? d : d;
      a.q_weight = NormWeight{q_weight.data(), weight_dtype, (c.scope == NormScope::all_heads ? c.heads_q : 1) * per};
      a.k_weight = NormWeight{k_weight.data(), weight_dtype, (c.scope == NormScope::all_heads ? c.heads_k : 1) * per};
    }
    if (c.v_norm || c.store) a.v = view(v, c.heads_k);
    if (c.store) {
      write = CacheWrite{.slots = Slots::of(std::span<const int64_t>(slots)), .k_cache = k_cache, .v_cache = v_cache};
      a.store = &write;
    }
    return a;
  }
  /// The reference RMSNorm, in place on `b` [tokens, heads, d] of the data dtype.
  void reference_norm(Buffer& b, int64_t heads, const Buffer& weight) const {
    const bool all = c.scope == NormScope::all_heads;
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int64_t h0 = 0; h0 < heads; h0 += all ? heads : 1) {
        const int64_t n_heads = all ? heads : 1;
        const int64_t first = (t * heads + h0) * d;
        const int64_t n = n_heads * d;
        double sum = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double x = load_value(c.dtype, b.data(), first + i);
          sum += x * x;
        }
        const auto mean = static_cast<float>(sum / static_cast<double>(n));
        const float var = mean + c.eps;
        const auto r = static_cast<float>(1.0 / std::sqrt(static_cast<double>(var)));
        for (int64_t i = 0; i < n; ++i) {
          const float y = load_value(c.dtype, b.data(), first + i) * r;
          float out;
          if (!c.weights) {
            out = y;
          } else {
            const float w = load_value(weight_dtype, weight.data(), all ? i : i % d) + c.weight_offset;
            const float w_eff = c.weight_offset == 0.0f ? load_value(weight_dtype, weight.data(), all ? i : i % d) : w;
            if (c.rounding == NormRounding::llama) {
              const float yr = c.dtype == DType::bf16 ? detail::bf16_to_f32(detail::f32_to_bf16(y))
                               : c.dtype == DType::f16 ? detail::f16_to_f32(detail::f32_to_f16(y))
                                                       : y;
              out = yr * w_eff;
            } else {
              out = y * w_eff;
            }
          }
          store_value(c.dtype, b.data(), first + i, out);
        }
      }
    }
  }
  void reference_v_norm(Buffer& b) const {
    NormSetup plain = *this;
    plain.c.weights = false;
    plain.c.scope = NormScope::head;
    plain.reference_norm(b, c.heads_k, Buffer{});
  }
  void scatter(const Buffer& src, int64_t heads, int64_t dim, const CacheView& cache, Buffer& ref,
               const CacheQuant*) const {
    const Buffer& owner = cache.data == static_cast<const void*>(v_cache_bytes.data()) ? v_cache_bytes : k_cache_bytes;
    (void)owner;
    for (int64_t t = 0; t < c.tokens; ++t) {
      const int64_t slot = slots[static_cast<size_t>(t)];
      if (slot < 0) continue;
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t e = 0; e < dim; ++e) {
          store_value(cache.dtype, ref.data(), cache_element(cache, slot, h, e),
                      load_value(c.dtype, src.data(), (t * heads + h) * dim + e));
        }
      }
    }
  }
};

// ---- rerotate_cache ----

struct RerotateCase {
  Schedule schedule;
  DType cache_dtype = DType::bf16;
  Layout layout = Layout::nhd;
  bool raw = false;
  int seed = 1;
  int64_t heads = 2;
  int64_t tokens = 7;
  int64_t block_size = 16;
  std::string name() const {
    return fmt::format("d={} r={} {} {} raw={}", schedule.head_dim, schedule.rotary_dim, to_string(cache_dtype),
                       layout_name(layout), raw);
  }
};

struct RerotateSetup {
  RerotateCase c;
  int64_t d;
  Buffer cache_bytes;
  CacheView cache{};
  std::vector<int64_t> slots, delta, positions;
  float scale = 0.05f;

  explicit RerotateSetup(const RerotateCase& rc) : c(rc), d(rc.schedule.head_dim) {
    std::mt19937 rng(static_cast<uint32_t>(c.seed));
    const int64_t blocks = 4;
    make_cache(c.layout, c.cache_dtype, blocks, c.block_size, c.heads, d, cache_bytes, cache);
    // Every element a value (quantised: codes of normal(0, 2) / scale).
    std::normal_distribution<float> normal(0.0f, 2.0f);
    const int64_t elements = static_cast<int64_t>(cache_bytes.size()) / size_of(c.cache_dtype);
    for (int64_t i = 0; i < elements; ++i) {
      oracle_store(c.cache_dtype, cache_bytes.data(), i, normal(rng), scale, ScaleMode::divide);
    }
    slots = shuffled_slots(c.tokens, blocks * c.block_size, rng);
    std::uniform_int_distribution<int64_t> shift(-5000, 5000), position(0, 100000);
    for (int64_t i = 0; i < c.tokens; ++i) delta.push_back(shift(rng));
    for (int64_t i = 0; i < c.tokens; ++i) positions.push_back(position(rng));
  }
  bool quantised() const { return is_quantised_dtype(c.cache_dtype); }
  RerotateCacheArgs args() {
    RerotateCacheArgs a{.cache = cache, .slots = Slots::of(std::span<const int64_t>(slots))};
    if (c.raw) {
      a.mode = RerotateMode::raw;
      a.positions = Positions::per_token(std::span<const int64_t>(positions));
    } else {
      a.delta = delta.data();
    }
    if (quantised()) a.quant = CacheQuant{.scale = &scale};
    return a;
  }
  /// Gather each slot's keys (dequantised: fl32(code * scale)), rerotate (or apply, raw) them one
  /// token at a time, quantise and scatter back.
  Buffer composition() const {
    Buffer ref = cache_bytes;
    const DType work = quantised() ? DType::f32 : c.cache_dtype;
    for (int64_t t = 0; t < c.tokens; ++t) {
      const int64_t slot = slots[static_cast<size_t>(t)];
      if (slot < 0) continue;
      Buffer keys(static_cast<size_t>(c.heads * d * size_of(work)));
      for (int64_t h = 0; h < c.heads; ++h) {
        for (int64_t e = 0; e < d; ++e) {
          float x = load_value(c.cache_dtype, cache_bytes.data(), cache_element(cache, slot, h, e));
          if (quantised()) x = x * scale;
          store_value(work, keys.data(), h * d + e, x);
        }
      }
      const TensorView k = TensorView::bshd(keys.data(), work, 1, 1, c.heads, d);
      if (c.raw) {
        apply(c.schedule, ApplyArgs{.q = k, .positions = Positions::per_token(std::span<const int64_t>(&positions[static_cast<size_t>(t)], 1))});
      } else {
        const int64_t at = 6000;  // any position p with p + delta in range: rerotate ignores it
        rerotate(c.schedule, RotatedKeys{.k = k, .positions = Positions::sequential(at)},
                 std::span<const int64_t>(&delta[static_cast<size_t>(t)], 1));
      }
      for (int64_t h = 0; h < c.heads; ++h) {
        for (int64_t e = 0; e < d; ++e) {
          oracle_store(c.cache_dtype, ref.data(), cache_element(cache, slot, h, e), load_value(work, keys.data(), h * d + e),
                       scale, ScaleMode::divide);
        }
      }
    }
    return ref;
  }
};

}  // namespace rotary::test
