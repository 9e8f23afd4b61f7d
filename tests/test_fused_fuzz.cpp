// A randomised differential test of the fused operations (rotary/fused.hpp): rope_store,
// qk_norm_rope and rerotate_cache, each random call run on
//   ref   : Backend::reference (the body, one thread), the baseline
//   cpu1  : Backend::automatic, threads 1 (the vectorised rows)
//   cpu2  : Backend::automatic, threads 2
//   emu   : the CUDA general kernel's split played on the host (support/fused_emulation.hpp)
//   fast  : rope_store's and qk_norm_rope's fast CUDA kernel (emulate_fast_store) with the launches
//           of a 1-, 4- and 132-SM device, where fast_store_refusal takes the call
// and compared byte for byte over one arena holding every buffer of the call (inputs, outputs,
// caches and the poisoned gaps between them), so that a write at a wrong place or past a buffer
// shows as well as a wrong value. A NaN result equals any NaN of its dtype (any NaN code of a
// quantised cache): its sign and payload are not part of the contract (apply.hpp, fused.hpp). The
// paths share the views' addressing, so what they would all get wrong alike is held apart: the
// gaps (between regions, and in a cache's region the bytes no element of its views: pads, gaps
// between channels) and the inputs a call only reads stay as they were, and v_out holds what v_norm
// leaves in v in place. A call the library rejects (rotary::Error) must leave the arena untouched,
// and every path must reject it; a call drawn with a value the library must refuse must be rejected.
// The calls: layouts (fused QKV, head-major, channel strides, misaligned rows; v_out unlike v),
// paged, contiguous and MLA caches of every dtype with scales, a quarter of them laid out as neither
// nhd nor hnd lays them out (channel gaps, reversed rows, heads interleaved, padded rows, tokens and
// blocks, negative head, token and block strides, rarely strides the library must refuse:
// cache_layout), rerotate_cache's out in blocks of another size, shuffled, skipped and int32 slots,
// M-RoPE, xPos, partial rotary at offsets, every angle source, special values (NaN, infinities,
// subnormals, the dtype's largest) and f64 data.
//
// 300 calls per operation keep the test near 10 s in a Release build and 30 s under the sanitizers
// (one core); the environment runs more: FUZZ_ITERS (calls per operation), FUZZ_SEED, FUZZ_ONLY
// (one iteration to replay, as a failure names it), FUZZ_VERBOSE=1 (print every call).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cuda/emulate.hpp"
#include "fused/body.hpp"
#include "fused/fused_args.hpp"
#include "kernel/args.hpp"
#include "rotary/error.hpp"
#include "support/fused_emulation.hpp"

namespace rotary {
namespace {

// ---- The arena: every buffer of a call in one allocation, poisoned gaps between them ----

struct Region {
  std::string name;
  size_t off = 0;
  size_t bytes = 0;
  DType dtype = DType::f32;
};

struct Arena {
  std::vector<Region> regions;
  size_t size = 0;
  // A region at a 64-byte boundary (plus `misalign` bytes), a gap of 64..192 bytes before it.
  size_t add(const std::string& name, size_t bytes, DType dtype, std::mt19937& rng, size_t misalign = 0) {
    size = (size + 63) / 64 * 64 + 64 * (1 + rng() % 2);
    const size_t off = size + misalign;
    size = off + bytes;
    regions.push_back(Region{name, off, bytes, dtype});
    return off;
  }
  std::string where(size_t byte) const {
    for (const Region& r : regions) {
      if (byte >= r.off && byte < r.off + r.bytes) {
        const size_t es = static_cast<size_t>(size_of(r.dtype));
        return fmt::format("{} + {} (element {} of {})", r.name, byte - r.off, (byte - r.off) / es, to_string(r.dtype));
      }
    }
    return "a gap between regions";
  }
};

// One arena's bytes, 64-byte aligned as the regions' offsets assume.
struct Memory {
  unsigned char* p = nullptr;
  explicit Memory(size_t bytes) : p(static_cast<unsigned char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64))) {}
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  ~Memory() { std::free(p); }
};

// ---- Values ----

void put(DType dtype, unsigned char* base, int64_t i, double x) {
  switch (dtype) {
    case DType::f64: std::memcpy(base + 8 * i, &x, 8); break;
    case DType::f32: { const auto f = static_cast<float>(x); std::memcpy(base + 4 * i, &f, 4); break; }
    case DType::f16: { const uint16_t b = detail::f32_to_f16(static_cast<float>(x)); std::memcpy(base + 2 * i, &b, 2); break; }
    case DType::bf16: { const uint16_t b = detail::f32_to_bf16(static_cast<float>(x)); std::memcpy(base + 2 * i, &b, 2); break; }
    default: base[i] = static_cast<unsigned char>(static_cast<int64_t>(x)); break;
  }
}

struct ValueGen {
  double magnitude = 1.0;
  double special = 0.0;  // probability of a special value
  DType dtype = DType::f32;
  double draw(std::mt19937& rng) const {
    if (special > 0 && std::uniform_real_distribution<double>(0.0, 1.0)(rng) < special) {
      const double tiny = dtype == DType::f16 ? 3e-6 : dtype == DType::f64 ? 1e-310 : 2e-39;  // subnormals
      const double big = dtype == DType::f16 ? 65504.0 : dtype == DType::bf16 ? 3.3e38 : dtype == DType::f32 ? 3.4e38 : 1e308;
      switch (rng() % 8) {
        case 0: return std::numeric_limits<double>::quiet_NaN();
        case 1: return std::numeric_limits<double>::infinity();
        case 2: return -std::numeric_limits<double>::infinity();
        case 3: return tiny * (1 + rng() % 7);
        case 4: return -tiny * (1 + rng() % 7);
        case 5: return -0.0;
        case 6: return big;
        default: return -big;
      }
    }
    std::normal_distribution<double> n(0.0, magnitude);
    return n(rng);
  }
};

// ---- A random call ----

template <class T>
T pick(std::mt19937& rng, std::initializer_list<T> list) {
  return *(list.begin() + rng() % list.size());
}
bool chance(std::mt19937& rng, double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
int64_t uniform(std::mt19937& rng, int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }

struct VSpec {  // a TensorView at an arena offset
  bool set = false;
  size_t off = 0;
  TensorView v{};
  TensorView at(unsigned char* base) const {
    if (!set) return TensorView{};
    TensorView t = v;
    t.data = base + off;
    return t;
  }
};
struct CSpec {  // a CacheView at an arena offset
  bool set = false;
  size_t off = 0;
  CacheView c{};
  CacheView at(unsigned char* base) const {
    if (!set) return CacheView{};
    CacheView t = c;
    t.data = base + off;
    return t;
  }
};

enum class Op { store, norm, rerotate };

struct Case {
  Op op = Op::store;
  // Shapes the fast kernels take (16-byte rows, no channel stride, norm before rope per head), drawn
  // for about half the calls: uniform draws alone would rarely reach the fast kernel.
  bool friendly = false;
  std::string text;      // the configuration in words
  Schedule schedule;
  bool xpos = false;
  DType dtype = DType::bf16;
  int64_t batch = 1, seq = 1, tokens = 1;
  Arena arena;
  std::vector<unsigned char> initial;
  // views
  VSpec q, k, q_out, k_out, v, v_out, k_pass, q_quantized;
  bool k_out_in_place = false;
  CSpec k_cache, v_cache, k_pass_cache, rr_cache, rr_out;
  int odd_caches = 0;  // caches laid out unlike nhd and hnd (cache_layout)
  // slots, positions, scales
  std::vector<int64_t> slots64;
  std::vector<int32_t> slots32;
  bool slots_i32 = false;
  int64_t slot_count = 0;
  std::vector<int64_t> pos64;
  std::vector<int32_t> pos32;
  int pos_kind = 0;  // 0 sequential, 1 i64, 2 i32
  int64_t seq_offset = 0;
  int pos_streams = 1;
  std::vector<float> k_scales, v_scales, p_scales, q_scales, rr_scales;
  CacheQuant k_quant{}, v_quant{}, p_quant{}, q_quant{}, rr_quant{};
  // angle source
  std::optional<Table> table;
  std::optional<AngleMode> numerics;
  std::vector<float> caller_cos, caller_sin;
  CallerAngles caller{};
  bool use_caller = false;
  // norm
  std::vector<unsigned char> q_weight, k_weight;
  NormWeight qw{}, kw{};
  float eps = 1e-6f, weight_offset = 0.0f;
  NormOrder order = NormOrder::norm_then_rope;
  NormRounding rounding = NormRounding::llama;
  NormScope scope = NormScope::head;
  bool v_norm = false;
  bool store = false;
  // rerotate
  std::vector<int64_t> delta;
  int delta_streams = 1;
  bool raw = false;
  Direction rotated = Direction::forward;
  // A value drawn that the library may refuse: a position or delta out of range, more tokens than
  // slots (accepted when skipped slots leave none of them reaching it, as may be).
  bool intend_invalid = false;
  const char* must_reject = nullptr;  // why every path must reject the call

  Slots slots() const {
    return slots_i32 ? Slots{slots32.data(), false, slot_count} : Slots{slots64.data(), true, slot_count};
  }
  Positions positions() const {
    if (pos_kind == 0) return Positions::sequential(seq_offset);
    if (pos_kind == 1) return Positions::per_token(std::span<const int64_t>(pos64), pos_streams);
    return Positions::per_token(std::span<const int32_t>(pos32), pos_streams);
  }
  ApplyArgs rope(unsigned char* base) const {
    const TensorView k_in = k.at(base);
    return ApplyArgs{.q = q.at(base), .k = k_in, .q_out = q_out.at(base), .k_out = k_out_in_place ? k_in : k_out.at(base),
                     .positions = positions(), .table = table ? &*table : nullptr,
                     .caller_angles = use_caller ? &caller : nullptr, .numerics = numerics};
  }
  CacheWrite write(unsigned char* base) const {
    CacheWrite w;
    w.slots = slots();
    w.k_cache = k_cache.at(base);
    w.v_cache = v_cache.at(base);
    w.v = op == Op::store ? v.at(base) : TensorView{};
    w.k_quant = k_quant;
    w.v_quant = v_quant;
    w.k_pass = k_pass.at(base);
    w.k_pass_cache = k_pass_cache.at(base);
    w.k_pass_quant = p_quant;
    return w;
  }
  RopeStoreArgs store_args(unsigned char* base) const {
    RopeStoreArgs a{.rope = rope(base), .cache = write(base)};
    a.q_quantized = q_quantized.at(base);
    a.q_quant = q_quant;
    return a;
  }
  // qk_norm_rope's args; `w` receives the cache write (store) and must outlive the call.
  QkNormRopeArgs norm_args(unsigned char* base, CacheWrite& w) const {
    QkNormRopeArgs a{.rope = rope(base), .q_weight = qw, .k_weight = kw, .eps = eps, .weight_offset = weight_offset,
                     .order = order, .rounding = rounding, .scope = scope, .v_norm = v_norm};
    a.v = v.at(base);
    a.v_out = v_out.at(base);
    if (store) {
      w = write(base);
      a.store = &w;
    }
    return a;
  }
  RerotateCacheArgs rerotate_args(unsigned char* base) const {
    RerotateCacheArgs a{.cache = rr_cache.at(base), .out = rr_out.at(base), .slots = slots()};
    a.mode = raw ? RerotateMode::raw : RerotateMode::delta;
    a.delta = delta.data();
    a.delta_streams = delta_streams;
    if (raw) {
      a.positions = positions();
      if (table) a.table = &*table;
      a.numerics = numerics;
    }
    a.rotated = rotated;
    a.quant = rr_quant;
    return a;
  }
};

void fill_region(const Region& r, unsigned char* base, const ValueGen& g, std::mt19937& rng) {
  const int64_t es = size_of(r.dtype);
  for (int64_t i = 0; i < static_cast<int64_t>(r.bytes) / es; ++i) put(r.dtype, base + r.off, i, g.draw(rng));
}

// Scales: none / per tensor / per head, mode, rarely an invalid value (`invalid` set: kBadScale).
constexpr const char* kBadScale = "a scale not finite and > 0, or on a model-dtype cache";
CacheQuant make_quant(std::mt19937& rng, DType dtype, int64_t heads, std::vector<float>& store, bool& invalid,
                      std::string& text, const char* name) {
  CacheQuant q;
  if (!is_quantised_dtype(dtype)) {
    if (chance(rng, 0.01)) {  // a scale on a model-dtype cache: rejected
      store = {1.0f};
      q.scale = store.data();
      invalid = true;
      text += fmt::format(" {}=scale-on-model-dtype", name);
    }
    return q;
  }
  const int kind = static_cast<int>(rng() % 5);  // 0 none, 1-2 per tensor, 3-4 per head
  q.mode = chance(rng, 0.5) ? ScaleMode::divide : ScaleMode::multiply;
  if (kind == 0) {
    text += fmt::format(" {}=none/{}", name, q.mode == ScaleMode::divide ? "div" : "mul");
    return q;
  }
  const int64_t n = kind <= 2 ? 1 : heads;
  store.resize(static_cast<size_t>(n));
  for (float& s : store) {
    s = static_cast<float>(std::exp2(std::uniform_real_distribution<double>(-6, 6)(rng)));
    if (chance(rng, 0.3)) s = pick(rng, {0.5f, 1.0f, 2.0f, 0.125f, 1e-3f, 300.0f});
  }
  if (chance(rng, 0.01)) {
    store[rng() % store.size()] = pick(rng, {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                                             std::numeric_limits<float>::infinity()});
    invalid = true;
  }
  q.scale = store.data();
  q.count = n;
  text += fmt::format(" {}=[{}]{}/{}", name, fmt::join(store, ","), n > 1 ? "perhead" : "", q.mode == ScaleMode::divide ? "div" : "mul");
  return q;
}

// q, k (and v / k_pass when `with_v`) views: separate buffers (bshd or bhsd, channel stride 1 or 2) or
// one fused QKV buffer per token.
void plan_inputs(Case& c, std::mt19937& rng, int64_t hq, int64_t hk, int64_t hv, int64_t dv, bool with_v,
                 const char* v_name, VSpec& v_spec) {
  const int64_t d = c.schedule.head_dim;
  const int64_t es = size_of(c.dtype);
  const int mode = static_cast<int>(rng() % 10);
  auto simple = [&](const char* name, VSpec& s, int64_t heads, int64_t dim) {
    const int64_t cs = !c.friendly && chance(rng, 0.08) ? 2 : 1;
    const bool bhsd = chance(rng, 0.25);
    const size_t mis = !c.friendly && chance(rng, 0.05) ? static_cast<size_t>(es * uniform(rng, 1, 3)) : 0;
    const size_t bytes = static_cast<size_t>(c.batch * c.seq * heads * dim * cs * es);
    s.set = true;
    s.off = c.arena.add(name, bytes, c.dtype, rng, mis);
    s.v = bhsd ? TensorView::bhsd(nullptr, c.dtype, c.batch, heads, c.seq, dim)
               : TensorView::bshd(nullptr, c.dtype, c.batch, c.seq, heads, dim);
    for (auto& st : s.v.strides) st *= cs;
    c.text += fmt::format(" {}:{}{}{}", name, bhsd ? "bhsd" : "bshd", cs > 1 ? "/cs2" : "", mis ? fmt::format("/mis{}", mis) : "");
  };
  if (mode < 3) {  // one fused QKV buffer: [batch, seq, hq*d + hk*d + hv*dv + pad]
    const int64_t pad = chance(rng, 0.5) ? 0 : c.friendly ? pick<int64_t>(rng, {8, 16, 64}) : pick<int64_t>(rng, {8, 16, 3, 64});
    const int64_t width = hq * d + hk * d + (with_v ? hv * dv : 0) + pad;
    const size_t off = c.arena.add("qkv", static_cast<size_t>(c.batch * c.seq * width * es), c.dtype, rng);
    auto at = [&](VSpec& s, int64_t first, int64_t heads, int64_t dim) {
      s.set = true;
      s.off = off + static_cast<size_t>(first * es);
      s.v = TensorView{.data = nullptr, .dtype = c.dtype, .shape = {c.batch, c.seq, heads, dim},
                       .strides = {c.seq * width, width, dim, 1}};
    };
    at(c.q, 0, hq, d);
    at(c.k, hq * d, hk, d);
    if (with_v) at(v_spec, hq * d + hk * d, hv, dv);
    c.text += fmt::format(" fused-qkv(width={})", width);
  } else {
    simple("q", c.q, hq, d);
    simple("k", c.k, hk, d);
    if (with_v) simple(v_name, v_spec, hv, dv);
  }
}

// Where a cache's elements lie: strides {block, token in block, head, channel} over rows of `width`
// columns, the elements they reach (the lowest to the highest, inclusive) and data's place among
// them: column 0 of slot 0's head 0, which a negative stride puts after the region's start.
struct CacheLayout {
  std::array<int64_t, 4> strides{};
  int64_t reach = 0;  // elements
  int64_t lead = 0;   // elements from the region's start to data
  bool odd = false;   // strides neither nhd nor hnd gives
  bool meets = false;  // a stride that makes two elements meet: the call must be rejected (kMeets)
};
constexpr const char* kMeets = "a cache whose strides make elements meet";

// nhd's (layout 0) or hnd's (layout 1) strides, or, for about one cache in four, strides neither
// gives: channels 2 or 3 apart (gaps), reversed rows (a negative channel stride: data at the row's
// last element in memory), heads interleaved channel by channel (head stride 1, channel stride at
// least heads), row pitches, token and block strides padded past what the dimensions inside them
// reach, and negative head, token-in-block and block strides. Each stride lies beyond what the
// dimensions inside it reach, so no two elements meet and the library must take the view. In a
// fast-friendly call the channels stay contiguous and the pads whole 16 elements, so that the fast
// kernel takes some of these too. Rarely (one such cache in 25) a dimension's stride is cut to
// that of one inside it, both of two elements or more in the view (of `dim` channels), so that two
// elements meet and the library must refuse the view; no stride grows, so every element still lies
// in the region.
CacheLayout cache_layout(const Case& c, std::mt19937& rng, int layout, int64_t block, int64_t num_blocks, int64_t heads,
                         int64_t width, int64_t dim) {
  CacheLayout l;
  const std::array<int64_t, 4> extent{num_blocks, block, heads, width};
  // The dimensions from the innermost out; pad: elements past each one's reach, before the next one's stride.
  std::array<int, 4> order = layout == 1 ? std::array<int, 4>{3, 1, 2, 0} : std::array<int, 4>{3, 2, 1, 0};
  std::array<int64_t, 4> pad{};
  std::array<bool, 4> negative{};
  int64_t step = 1;  // the channels' distance in a row of their own
  l.odd = chance(rng, 0.25);
  if (l.odd) {
    for (int64_t& p : pad) p = c.friendly ? pick<int64_t>(rng, {0, 0, 16, 32}) : pick<int64_t>(rng, {0, 0, 0, 1, 3, 8, 64});
    if (!c.friendly) {
      step = pick<int64_t>(rng, {1, 1, 2, 3});
      negative[3] = chance(rng, 0.35);
      if (heads > 1 && chance(rng, 0.15)) order = {2, 3, 1, 0};  // heads inside a row
    }
    for (int d = 0; d < 3; ++d) negative[d] = chance(rng, 0.35);
  }
  int64_t reach = 1;  // what the dimensions so far reach
  for (int i = 0; i < 4; ++i) {
    const int d = order[i];
    const int64_t magnitude = i == 0 ? (d == 3 ? step : 1) : (d == 3 ? step : 1) * (reach + pad[i - 1]);
    l.strides[d] = negative[d] ? -magnitude : magnitude;
    const int64_t span = magnitude * std::max<int64_t>(extent[d] - 1, 0);
    reach += span;
    if (negative[d]) l.lead += span;
  }
  l.reach = num_blocks * block * heads * width == 0 ? 0 : reach;
  if (l.reach == 0) l.lead = 0;
  if (l.odd && chance(rng, 0.04)) {
    const std::array<int64_t, 4> view{num_blocks, block, heads, dim};
    const int i = static_cast<int>(uniform(rng, 1, 3));  // the outer dimension's place in `order`
    const int j = static_cast<int>(uniform(rng, 0, i - 1));  // the inner one's
    const int d = order[static_cast<size_t>(i)], e = order[static_cast<size_t>(j)];
    if (view[d] > 1 && view[e] > 1) {  // index 1 of d meets index 1 of e (or both at 1 meet both at 0)
      l.strides[d] = (l.strides[d] < 0 ? -1 : 1) * std::abs(l.strides[e]);
      l.meets = true;
    }
  }
  return l;
}

// A cache of `dtype` for `heads` x `dim` per slot at columns [offset, offset + dim) of rows of `row`
// columns (0: dim + offset) in a region of its own, laid out by cache_layout; or, with `share`, the
// same rows as `share`'s view (MLA: another column range of its rows).
CSpec plan_cache(Case& c, std::mt19937& rng, const char* name, int layout, int64_t block, int64_t num_blocks,
                 int64_t heads, int64_t dim, DType dtype, int64_t offset = 0, int64_t row = 0, const CSpec* share = nullptr) {
  CSpec s;
  s.set = true;
  if (share != nullptr) {
    s.off = share->off;
    s.c = share->c;
    s.c.head_dim = dim;
    s.c.offset = offset;
    return s;
  }
  const int64_t width = row == 0 ? dim + offset : row;
  const int64_t es = size_of(dtype);
  const CacheLayout l = cache_layout(c, rng, layout, block, num_blocks, heads, width, dim);
  s.off = c.arena.add(name, static_cast<size_t>(l.reach * es), dtype, rng) + static_cast<size_t>(l.lead * es);
  if (l.odd) {
    s.c = CacheView{.data = nullptr, .dtype = dtype, .block_size = block, .num_blocks = num_blocks, .heads = heads,
                    .head_dim = dim, .strides = l.strides, .offset = offset};
    ++c.odd_caches;
    if (l.meets) c.must_reject = kMeets;
    c.text += fmt::format(" {}:strides=[{}]/lead={}{}", name, fmt::join(l.strides, ","), l.lead, l.meets ? "/meets" : "");
  } else {
    s.c = layout == 1 ? CacheView::hnd(nullptr, dtype, num_blocks, block, heads, dim, offset, row)
                      : CacheView::nhd(nullptr, dtype, num_blocks, block, heads, dim, offset, row);
  }
  return s;
}

DType model_dtype(std::mt19937& rng, bool f64_ok) {
  const int r = static_cast<int>(rng() % 20);
  if (r < 8) return DType::bf16;
  if (r < 13) return DType::f16;
  if (r < 18 || !f64_ok) return DType::f32;
  return DType::f64;
}

// The schedule: head_dim, rotary_dim, offset, pairing, blocks, M-RoPE, a scaled schedule, xPos.
void plan_schedule(Case& c, std::mt19937& rng, bool allow_xpos) {
  Spec s;
  const int r = c.friendly ? 0 : static_cast<int>(rng() % 20);
  if (r < 14) {
    s.head_dim = pick<int64_t>(rng, {16, 24, 32, 40, 48, 64, 64, 72, 80, 96, 112, 128, 128, 128, 136, 160, 192, 256, 256, 320, 384, 512});
  } else if (r < 18) {
    s.head_dim = 2 * uniform(rng, 4, 130);  // even, often not a multiple of 8
  } else {
    s.head_dim = 2 * uniform(rng, 4, 70) + 1;  // odd
  }
  const int rr = static_cast<int>(rng() % 10);
  if (rr < 5) {
    s.rotary_dim = 0;
  } else if (rr < 8) {
    s.rotary_dim = std::max<int64_t>(2, (s.head_dim / 2 / 8) * 8);
    if (s.rotary_dim > s.head_dim) s.rotary_dim = 2;
    if (rr == 7) s.rotary_dim = std::min<int64_t>(64, s.head_dim / 2 * 2);
  } else {
    s.rotary_dim = 2 * uniform(rng, 1, s.head_dim / 2);
  }
  if (chance(rng, 0.005)) s.rotary_dim = s.head_dim | 1;  // odd: rejected
  if (c.friendly) {
    s.rotary_dim = chance(rng, 0.5) ? 0 : std::max<int64_t>(16, s.head_dim / 2 / 16 * 16);
  }
  const int64_t rd = s.resolved_rotary_dim();
  if (c.friendly && rd < s.head_dim && chance(rng, 0.35)) {
    s.rotary_offset = (s.head_dim - rd) / 8 * 8 * (rng() % 2);
  } else if (rd < s.head_dim && chance(rng, 0.35)) {
    s.rotary_offset = chance(rng, 0.5) ? s.head_dim - rd : uniform(rng, 0, s.head_dim - rd);
  }
  s.pairing = chance(rng, 0.5) ? Pairing::half : Pairing::interleaved;
  s.base = pick(rng, {10000.0, 10000.0, 500000.0, 1000000.0, 100.0});
  if (!c.friendly && s.pairing == Pairing::half && chance(rng, 0.05)) {
    const int64_t b = pick<int64_t>(rng, {2, 4});
    if (rd % (2 * b) == 0) s.blocks = b;
  }
  if (chance(rng, 0.15) && rd / 2 >= 3 && s.blocks == 1) {
    const int64_t pairs = rd / 2;
    const int64_t a = uniform(rng, 1, pairs - 2);
    const int64_t b = uniform(rng, 1, pairs - a - 1);
    s.sections = {a, b, pairs - a - b};
    s.stream_layout = pick(rng, {StreamLayout::sections, StreamLayout::interleaved_sections});
  }
  const int sched = static_cast<int>(rng() % 12);
  if (sched == 0) {
    s.schedule = ScheduleType::yarn;
    s.factor = 4.0;
    s.original_max_position = 4096;
  } else if (sched == 1) {
    s.schedule = ScheduleType::linear;
    s.factor = 2.0;
  } else if (sched == 2) {
    s.attention_factor = pick(rng, {0.5, 1.25, 3.0});
  }
  c.schedule = make_schedule(s);  // may throw: the caller retries
  c.xpos = allow_xpos && !c.friendly && chance(rng, 0.04);
  if (c.xpos) c.schedule = with_xpos(c.schedule, 512.0);
  c.text += fmt::format("{}head_dim={} rotary_dim={} offset={} {} blocks={} base={} sched={} sections=[{}]/{} xpos={}",
                        c.friendly ? "[fast-friendly] " : "", s.head_dim, rd, s.rotary_offset, s.pairing == Pairing::half ? "half" : "interleaved", s.blocks,
                        s.base, static_cast<int>(s.schedule), fmt::join(s.sections, ","),
                        static_cast<int>(s.stream_layout), c.xpos);
}

// Positions, the angle source, tokens.
void plan_positions(Case& c, std::mt19937& rng, int64_t count, bool allow_caller) {
  const int src = static_cast<int>(rng() % 20);
  // 0-10 exact, 11-14 table, 15-17 hf_float32, 18-19 caller
  int64_t limit = pick<int64_t>(rng, {16, 2048, 2048, int64_t{1} << 20, int64_t{1} << 20});
  if (c.xpos) limit = 64;
  const bool use_table = src >= 11 && src <= 14;
  c.use_caller = allow_caller && src >= 18 && !c.xpos;
  if (use_table || c.use_caller) limit = std::min<int64_t>(limit, 2048);
  c.pos_streams = c.schedule.streams > 1 && chance(rng, 0.8) ? c.schedule.streams : 1;
  c.pos_kind = static_cast<int>(rng() % 5 == 0 ? 0 : rng() % 3 == 0 ? 2 : 1);
  if (c.pos_kind == 0) {
    c.seq_offset = uniform(rng, 0, std::max<int64_t>(0, limit - c.seq - 1));
  } else {
    const bool broadcast = c.batch > 1 && chance(rng, 0.2);
    const int64_t n = (broadcast ? count / c.batch : count) * c.pos_streams;
    c.pos64.resize(static_cast<size_t>(n));
    for (int64_t& p : c.pos64) p = uniform(rng, 0, limit - 1);
    if (!c.pos64.empty() && chance(rng, 0.01)) {  // an unusable position (rerotate_cache may have no entries)
      c.pos64[rng() % c.pos64.size()] = pick<int64_t>(rng, {-1, int64_t{1} << 31});
      c.intend_invalid = true;
    }
    c.pos32.assign(c.pos64.begin(), c.pos64.end());
    if (c.pos_kind == 2) {
      for (size_t i = 0; i < c.pos64.size(); ++i) {
        if (c.pos64[i] != c.pos32[i]) c.pos_kind = 1;  // keep the out-of-range value in int64
      }
    }
  }
  if (use_table) {
    const AngleMode mode = chance(rng, 0.3) ? AngleMode::hf_float32 : AngleMode::exact;
    c.table = Table::range(c.schedule, 0, limit, mode);
    c.text += fmt::format(" angles=table({} rows, {})", limit, mode == AngleMode::exact ? "exact" : "hf32");
  } else if (src >= 15 && src <= 17) {
    c.numerics = AngleMode::hf_float32;
    c.text += " angles=hf_float32";
  } else if (c.use_caller) {
    const int64_t width = c.schedule.rotary_dim / 2;
    c.caller_cos.resize(static_cast<size_t>(limit * width));
    c.caller_sin.resize(c.caller_cos.size());
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& x : c.caller_cos) x = u(rng);
    for (float& x : c.caller_sin) x = u(rng);
    c.caller = CallerAngles{.index = CallerAngles::Index::per_position, .columns = CallerAngles::Columns::pairs,
                            .cos = c.caller_cos.data(), .sin = c.caller_sin.data(), .shape = {1, limit, width},
                            .cos_strides = {0, width, 1}, .sin_strides = {0, width, 1}};
    c.text += " angles=caller";
  } else {
    c.text += " angles=exact";
  }
  c.text += fmt::format(" positions={}{} streams={} limit={}",
                        c.pos_kind == 0 ? "sequential" : c.pos_kind == 1 ? "i64" : "i32",
                        c.pos_kind == 0 ? fmt::format("({})", c.seq_offset) : fmt::format("[{}]", fmt::join(c.pos64, ",")),
                        c.pos_streams, limit);
}

// Slots for `count` tokens over caches of `capacity`; contiguous: token (b, s) -> b * block + s.
void plan_slots(Case& c, std::mt19937& rng, int64_t count, int64_t capacity, bool contiguous, int64_t block) {
  c.slot_count = count;
  c.slots64.resize(static_cast<size_t>(count));
  if (contiguous) {
    for (int64_t t = 0; t < count; ++t) c.slots64[static_cast<size_t>(t)] = (t / c.seq) * block + t % c.seq;
  } else {
    std::vector<int64_t> all(static_cast<size_t>(capacity));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int64_t t = 0; t < count; ++t) {
      c.slots64[static_cast<size_t>(t)] = t < capacity ? all[static_cast<size_t>(t)] : capacity + t;  // beyond: rejected
    }
    if (count > capacity) c.intend_invalid = true;
  }
  const double skip = pick(rng, {0.0, 0.1, 0.5, 1.0});
  for (int64_t& s : c.slots64) {
    if (chance(rng, skip * 0.5)) s = chance(rng, 0.8) ? -1 : -uniform(rng, 2, 1000);
  }
  if (count > 1 && chance(rng, 0.015)) {  // a duplicate: rejected
    c.slots64[0] = c.slots64[static_cast<size_t>(count - 1)] = std::max<int64_t>(c.slots64[0], 0);
    c.must_reject = "a slot two tokens share";
  } else if (count > 0 && chance(rng, 0.015)) {  // beyond the capacity: rejected
    c.slots64[rng() % static_cast<size_t>(count)] = capacity + static_cast<int64_t>(rng() % 3);
    c.must_reject = "a slot beyond the caches";
  }
  c.slots_i32 = chance(rng, 0.4);
  c.slots32.assign(c.slots64.begin(), c.slots64.end());
  c.text += fmt::format(" slots={}[{}] capacity={}", c.slots_i32 ? "i32" : "i64", fmt::join(c.slots64, ","), capacity);
}

DType cache_dtype_for(std::mt19937& rng, DType data) {
  const int r = static_cast<int>(rng() % 20);
  if (r < 9) return data;
  if (r < 12) {  // another model dtype
    DType d = pick(rng, {DType::f32, DType::f16, DType::bf16});
    if (data == DType::f64 && !chance(rng, 0.1)) d = DType::f64;
    return d;
  }
  if (data == DType::f64 && !chance(rng, 0.1)) return DType::f64;
  return pick(rng, {DType::fp8_e4m3, DType::fp8_e5m2, DType::i8});
}

// The cache write of rope_store (and qk_norm_rope's store): layout, block size, dtypes, scales,
// slots. v: hv heads of dv (0: no v); mla: k_pass instead of v.
void plan_write(Case& c, std::mt19937& rng, int64_t hk, int64_t hv, int64_t dv, bool mla, int64_t pass_dim) {
  const int64_t d = c.schedule.head_dim;
  int layout = static_cast<int>(rng() % 4);  // 0 nhd, 1 hnd, 2 contiguous, 3 token pool
  int64_t block = pick<int64_t>(rng, {1, 2, 7, 8, 16, 16, 32, 64});
  int64_t blocks;
  if (layout == 2) {
    block = c.seq + uniform(rng, 0, 5);
    blocks = c.batch + uniform(rng, 0, 1);
  } else {
    if (layout == 3) block = 1;
    blocks = (c.tokens + uniform(rng, 0, 2 * c.tokens) + block - 1) / block + uniform(rng, 0, 1);
    if (chance(rng, 0.02)) blocks = c.tokens / block;  // maybe too small (rejected when a slot is beyond)
  }
  const int cache_layout = layout == 1 ? 1 : 0;
  const DType kd = cache_dtype_for(rng, c.dtype);
  const DType vd = chance(rng, 0.8) ? kd : cache_dtype_for(rng, c.dtype);
  const int64_t row_pad = chance(rng, 0.1) ? (c.friendly ? pick<int64_t>(rng, {8, 16}) : pick<int64_t>(rng, {8, 16, 3, 1})) : 0;
  c.text += fmt::format(" cache={} block={} blocks={} k_cache={} {}={} row_pad={}",
                        std::string(layout == 0 ? "NHD" : layout == 1 ? "HND" : layout == 2 ? "contiguous" : "pool"),
                        block, blocks, to_string(kd), mla ? "k_pass_cache" : "v_cache", to_string(vd), row_pad);
  bool invalid = false;
  if (mla) {
    const int64_t row = pass_dim + d + row_pad;
    // kv_c's columns first (DeepSeek's rows), at times k's; the pad after both.
    const bool k_first = chance(rng, 0.2);
    c.k_cache = plan_cache(c, rng, "mla_cache", 0, block, blocks, 1, d, kd, k_first ? 0 : pass_dim, row);
    c.k_pass_cache = plan_cache(c, rng, "k_pass_cache", 0, block, blocks, 1, pass_dim, kd, k_first ? d : 0, row,
                                &c.k_cache);
    if (k_first) c.text += " k-first";
    c.k_quant = make_quant(rng, kd, 1, c.k_scales, invalid, c.text, "k_quant");
    c.p_quant = make_quant(rng, kd, 1, c.p_scales, invalid, c.text, "k_pass_quant");
  } else {
    c.k_cache = plan_cache(c, rng, "k_cache", cache_layout, block, blocks, hk, d, kd, 0, row_pad ? d + row_pad : 0);
    c.k_quant = make_quant(rng, kd, hk, c.k_scales, invalid, c.text, "k_quant");
    if (dv > 0) {
      c.v_cache = plan_cache(c, rng, "v_cache", cache_layout, block, blocks, hv, dv, vd, 0, row_pad ? dv + row_pad : 0);
      c.v_quant = make_quant(rng, vd, hv, c.v_scales, invalid, c.text, "v_quant");
    }
  }
  if (invalid) c.must_reject = kBadScale;
  plan_slots(c, rng, c.tokens, blocks * block, layout == 2, block);
}

void finish(Case& c, std::mt19937& rng, double magnitude, double special) {
  // Poison everything (random bytes, about half of them 0xa5), then write the inputs. The caches
  // are most of the arena: their bytes come from splitmix64, eight per step (mt19937 per byte was
  // most of the test's time).
  Memory m(c.arena.size);
  uint64_t state = rng();
  const auto splitmix64 = [&state] {
    uint64_t z = state += 0x9e3779b97f4a7c15;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
    z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
    return z ^ (z >> 31);
  };
  for (size_t i = 0; i < c.arena.size; i += 8) {
    const uint64_t bytes = splitmix64(), poison = splitmix64();
    for (size_t j = 0; j < 8 && i + j < c.arena.size; ++j) {
      m.p[i + j] = static_cast<unsigned char>((poison >> j) & 1 ? 0xa5 : bytes >> (8 * j));
    }
  }
  ValueGen g{magnitude, special, c.dtype};
  for (const Region& r : c.arena.regions) {
    const bool input = r.name == "q" || r.name == "k" || r.name == "v" || r.name == "qkv" || r.name == "k_pass";
    if (input) fill_region(r, m.p, g, rng);
    if (r.name == "rr_cache" || r.name == "rr_out") {
      ValueGen cg{magnitude, special, r.dtype};
      const int64_t es = size_of(r.dtype);
      for (int64_t i = 0; i < static_cast<int64_t>(r.bytes) / es; ++i) {
        if (is_quantised_dtype(r.dtype)) {
          m.p[r.off + static_cast<size_t>(i)] = chance(rng, special) ? static_cast<unsigned char>(rng())
                                                                     : static_cast<unsigned char>(rng() % 0x70 | (rng() & 0x80));
        } else {
          put(r.dtype, m.p + r.off, i, cg.draw(rng));
        }
      }
    }
  }
  c.initial.assign(m.p, m.p + c.arena.size);
  c.text += fmt::format(" magnitude={} special={}", magnitude, special);
}

void plan_values(Case& c, std::mt19937& rng) {
  double magnitude = pick(rng, {1.0, 1.0, 3.0, 1e-3, 100.0, 1e4, 6e4, 1e30});
  if (c.dtype == DType::f16 && magnitude > 1e4) magnitude = 3e4;
  const double special = pick(rng, {0.0, 0.0, 0.0, 0.01, 0.05});
  finish(c, rng, magnitude, special);
}

void plan_tokens(Case& c, std::mt19937& rng) {
  c.batch = chance(rng, 0.7) ? 1 : uniform(rng, 2, 4);
  c.seq = uniform(rng, 1, std::max<int64_t>(1, 70 / c.batch));
  if (chance(rng, 0.3)) c.seq = uniform(rng, 1, 4);
  c.tokens = c.batch * c.seq;
  c.text += fmt::format(" batch={} seq={}", c.batch, c.seq);
}

void plan_heads(std::mt19937& rng, int64_t d, int64_t& hq, int64_t& hk) {
  hk = pick<int64_t>(rng, {1, 1, 2, 2, 3, 4, 8});
  hq = hk * pick<int64_t>(rng, {1, 1, 2, 4, 8, 16});
  if (chance(rng, 0.1)) hq = uniform(rng, 1, 12);
  const int64_t budget = 32768;  // elements per token in q
  while (hq * d > budget && hq > 1) hq /= 2;
}

// v_norm's v_out in its own region, laid out unlike v (a v read from a fused QKV buffer into a
// contiguous v_out, a head-major v_out for a token-major v): v_out is written at its own strides.
// q_out (30% of calls) and k_out: its own buffer or k in place, each one draw in k_out_draws.
void plan_outputs(Case& c, std::mt19937& rng, int64_t hq, int64_t hk, int k_out_draws) {
  const int64_t d = c.schedule.head_dim;
  if (chance(rng, 0.3)) {
    c.q_out.set = true;
    c.q_out.off = c.arena.add("q_out", static_cast<size_t>(c.tokens * hq * d * size_of(c.dtype)), c.dtype, rng);
    c.q_out.v = TensorView::bshd(nullptr, c.dtype, c.batch, c.seq, hq, d);
  }
  const int ko = static_cast<int>(rng() % static_cast<uint32_t>(k_out_draws));
  if (ko == 0) {
    c.k_out.set = true;
    c.k_out.off = c.arena.add("k_out", static_cast<size_t>(c.tokens * hk * d * size_of(c.dtype)), c.dtype, rng);
    c.k_out.v = TensorView::bshd(nullptr, c.dtype, c.batch, c.seq, hk, d);
  } else if (ko == 1) {
    c.k_out_in_place = true;
  }
}

void plan_v_out(Case& c, std::mt19937& rng) {
  const TensorView& v = c.v.v;
  const int64_t es = size_of(c.dtype);
  // The same element addresses as v: the strides of every dimension longer than one agree.
  auto same_layout = [&](const TensorView& t) {
    for (int i = 0; i < 4; ++i) {
      if (v.shape[i] > 1 && t.strides[i] != v.strides[i]) return false;
    }
    return true;
  };
  TensorView out;
  bool bhsd = false;
  int64_t cs = 1, pad = 0;
  for (int tries = 0;; ++tries) {
    bhsd = chance(rng, 0.5);
    cs = chance(rng, 0.2) ? 2 : 1;
    pad = pick<int64_t>(rng, {0, 0, 3, 8});
    if (tries == 8) cs = v.strides[3] + 1;  // the channel stride alone sets v_out apart (v has dv > 1 channels)
    const int64_t s = v.shape[1], h = v.shape[2];
    const int64_t row = v.shape[3] * cs + pad;  // one head's channels, then `pad` elements
    out = TensorView{.data = nullptr, .dtype = c.dtype, .shape = v.shape,
                     .strides = bhsd ? std::array<int64_t, 4>{h * s * row, row, s * row, cs}
                                     : std::array<int64_t, 4>{s * h * row, h * row, row, cs}};
    if (!same_layout(out) || tries == 8) break;
  }
  const size_t mis = chance(rng, 0.2) ? static_cast<size_t>(es * uniform(rng, 1, 3)) : 0;
  int64_t span = 1;
  for (int i = 0; i < 4; ++i) span += (out.shape[i] - 1) * out.strides[i];
  c.v_out.set = true;
  c.v_out.off = c.arena.add("v_out", static_cast<size_t>(span * es), c.dtype, rng, mis);
  c.v_out.v = out;
  c.text += fmt::format(" v_out:{}{}{}{}", bhsd ? "bhsd" : "bshd", cs > 1 ? fmt::format("/cs{}", cs) : "",
                        pad ? fmt::format("/pad{}", pad) : "", mis ? fmt::format("/mis{}", mis) : "");
}

Case make_store_case(uint32_t seed) {
  std::mt19937 rng(seed);
  const bool friendly = chance(rng, 0.45);
  for (;;) {
    Case c;
    c.op = Op::store;
    c.friendly = friendly;
    try {
      plan_schedule(c, rng, true);
    } catch (const Error&) {
      continue;
    }
    c.dtype = model_dtype(rng, true);
    const int64_t d = c.schedule.head_dim;
    plan_tokens(c, rng);
    int64_t hq, hk;
    plan_heads(rng, d, hq, hk);
    const bool mla = chance(rng, 0.15);
    if (mla) hk = 1;
    const int64_t hv = chance(rng, 0.85) ? hk : uniform(rng, 1, 4);
    const int64_t dv = mla || chance(rng, 0.15) ? 0 : (chance(rng, 0.8) ? d : pick<int64_t>(rng, {8, 16, 64, 128, 96, 10, 7}));
    const int64_t pass_dim = mla ? pick<int64_t>(rng, {512, 64, 128, 96, 16, 24, 8, 10}) : 0;
    c.text += fmt::format(" dtype={} hq={} hk={} hv={} dv={} mla={} pass_dim={}", to_string(c.dtype), hq, hk, hv, dv, mla, pass_dim);
    plan_inputs(c, rng, hq, hk, mla ? 1 : hv, mla ? pass_dim : dv, mla || dv > 0, mla ? "k_pass" : "v", mla ? c.k_pass : c.v);
    plan_outputs(c, rng, hq, hk, 5);
    // f64 data goes to f64 outputs only: a quantised q_out is rejected (it once wrote doubles into
    // its 1-byte codes). Drawn more often with f64 data, so that a short run meets it.
    if (chance(rng, c.dtype == DType::f64 ? 0.5 : 0.1)) {
      if (c.dtype == DType::f64) c.must_reject = "q_quantized with f64 data";
      const DType qd = pick(rng, {DType::fp8_e4m3, DType::fp8_e5m2, DType::i8});
      c.q_quantized.set = true;
      c.q_quantized.off = c.arena.add("q_quantized", static_cast<size_t>(c.tokens * hq * d), qd, rng);
      c.q_quantized.v = TensorView::bshd(nullptr, qd, c.batch, c.seq, hq, d);
      bool invalid = false;
      c.q_quant = make_quant(rng, qd, hq, c.q_scales, invalid, c.text, "q_quant");
      if (invalid) c.must_reject = kBadScale;
    }
    c.text += fmt::format(" q_out={} k_out={} q_quantized={}", c.q_out.set, c.k_out_in_place ? "k" : c.k_out.set ? "own" : "none",
                          c.q_quantized.set ? std::string(to_string(c.q_quantized.v.dtype)) : "none");
    plan_write(c, rng, hk, hv, dv, mla, pass_dim);
    plan_positions(c, rng, c.tokens, true);
    plan_values(c, rng);
    return c;
  }
}

Case make_norm_case(uint32_t seed) {
  std::mt19937 rng(seed);
  const bool friendly = chance(rng, 0.45);
  for (;;) {
    Case c;
    c.op = Op::norm;
    c.friendly = friendly;
    try {
      plan_schedule(c, rng, true);
    } catch (const Error&) {
      continue;
    }
    c.dtype = model_dtype(rng, chance(rng, 0.1));
    if (c.dtype == DType::f64) c.must_reject = "qk_norm_rope with f64 data";
    const int64_t d = c.schedule.head_dim;
    plan_tokens(c, rng);
    int64_t hq, hk;
    plan_heads(rng, d, hq, hk);
    c.order = c.friendly || chance(rng, 0.6) ? NormOrder::norm_then_rope : NormOrder::rope_then_norm;
    c.rounding = chance(rng, 0.5) ? NormRounding::llama : NormRounding::gemma;
    c.scope = c.friendly || chance(rng, 0.75) ? NormScope::head : NormScope::all_heads;
    c.weight_offset = pick(rng, {0.0f, 0.0f, 1.0f, -0.5f, 0.25f});
    c.eps = pick(rng, {1e-6f, 1e-5f, 0.0f, 1e-3f, 1e-30f});
    c.store = chance(rng, 0.45);
    c.v_norm = !c.friendly && chance(rng, 0.3);
    const bool with_v = c.store || c.v_norm;
    const int64_t hv = chance(rng, 0.85) ? hk : uniform(rng, 1, 4);
    const int64_t dv = chance(rng, 0.8) ? d : pick<int64_t>(rng, {8, 16, 64, 128, 96, 10});
    c.text += fmt::format(" dtype={} hq={} hk={} hv={} dv={} order={} rounding={} scope={} w_off={} eps={} store={} v_norm={}",
                          to_string(c.dtype), hq, hk, hv, dv, c.order == NormOrder::norm_then_rope ? "norm_then_rope" : "rope_then_norm",
                          c.rounding == NormRounding::llama ? "llama" : "gemma", c.scope == NormScope::head ? "head" : "all_heads",
                          c.weight_offset, c.eps, c.store, c.v_norm);
    plan_inputs(c, rng, hq, hk, hv, dv, with_v, "v", c.v);
    // Weights.
    auto weight = [&](std::vector<unsigned char>& buf, NormWeight& w, int64_t heads, const char* name) {
      const int kind = static_cast<int>(rng() % 4);  // 0 none, 1 f32, 2 data dtype, 3 f32 or data
      if (kind == 0) return;
      DType wd = kind == 1 ? DType::f32 : kind == 2 ? c.dtype : pick(rng, {DType::f32, c.dtype});
      if (chance(rng, 0.01)) {
        wd = c.dtype == DType::bf16 ? DType::f16 : DType::bf16;  // neither f32 nor the data's
        c.must_reject = "a norm weight of another dtype";
      }
      const int64_t n = (c.scope == NormScope::all_heads ? heads : 1) * d;
      buf.resize(static_cast<size_t>(n * size_of(wd)));
      ValueGen g{pick(rng, {1.0, 0.1, 3.0}), pick(rng, {0.0, 0.0, 0.02}), wd};
      for (int64_t i = 0; i < n; ++i) put(wd, buf.data(), i, g.draw(rng) + (chance(rng, 0.5) ? 1.0 : 0.0));
      w = NormWeight{buf.data(), wd, n};
      c.text += fmt::format(" {}={}[{}]", name, to_string(wd), n);
    };
    weight(c.q_weight, c.qw, hq, "q_weight");
    weight(c.k_weight, c.kw, hk, "k_weight");
    if (c.v_norm && !c.store && chance(rng, 0.8)) plan_v_out(c, rng);
    plan_outputs(c, rng, hq, hk, 4);
    c.text += fmt::format(" q_out={} k_out={} v_out={}", c.q_out.set, c.k_out_in_place ? "k" : c.k_out.set ? "own" : "none", c.v_out.set);
    if (c.store) plan_write(c, rng, hk, hv, with_v ? dv : 0, false, 0);
    plan_positions(c, rng, c.tokens, true);
    plan_values(c, rng);
    return c;
  }
}

Case make_rerotate_case(uint32_t seed) {
  std::mt19937 rng(seed);
  for (;;) {
    Case c;
    c.op = Op::rerotate;
    try {
      plan_schedule(c, rng, false);
    } catch (const Error&) {
      continue;
    }
    if (chance(rng, 0.01)) {
      c.schedule = with_xpos(c.schedule, 512.0);
      c.xpos = true;
      c.must_reject = "rerotate_cache with xPos";
    }
    const int64_t d = c.schedule.head_dim;
    const DType cd = pick(rng, {DType::bf16, DType::bf16, DType::f16, DType::f32, DType::fp8_e4m3, DType::fp8_e5m2, DType::i8});
    c.dtype = cd;
    const int64_t heads = pick<int64_t>(rng, {1, 1, 2, 3, 4, 8});
    const int layout = static_cast<int>(rng() % 4);  // nhd, hnd, pool, mla-like offset
    int64_t block = layout == 2 ? 1 : pick<int64_t>(rng, {1, 2, 7, 16, 16, 64});
    c.raw = chance(rng, 0.35);
    c.batch = 1;
    c.seq = uniform(rng, 0, 70);
    if (chance(rng, 0.3)) c.seq = uniform(rng, 1, 4);
    c.tokens = c.seq;
    const int64_t blocks = (c.tokens + uniform(rng, 0, 2 * c.tokens) + block - 1) / block + 1;
    int64_t offset = 0, row = 0, h = heads;
    if (layout == 3) {
      h = 1;
      offset = pick<int64_t>(rng, {512, 64, 8, 3});
      row = offset + d + pick<int64_t>(rng, {0, 0, 8});
    } else if (chance(rng, 0.1)) {
      row = d + pick<int64_t>(rng, {8, 3});
    }
    c.text += fmt::format(" dtype={} heads={} layout={} block={} blocks={} offset={} row={} raw={}", to_string(cd), h,
                          layout, block, blocks, offset, row, c.raw);
    c.rr_cache = plan_cache(c, rng, "rr_cache", layout == 1 ? 1 : 0, block, blocks, h, d, cd, offset, row);
    if (chance(rng, 0.35)) {
      // Blocks of its own size at times (the same capacity): out's slots addressed unlike the cache's.
      const int64_t out_block = chance(rng, 0.15) ? pick<int64_t>(rng, {1, blocks * block}) : block;
      c.rr_out = plan_cache(c, rng, "rr_out", layout == 1 ? 1 : 0, out_block, blocks * block / out_block, h, d, cd,
                            offset, row);
      c.text += fmt::format(" out=own(block={})", out_block);
    } else if (chance(rng, 0.2)) {
      c.rr_out = c.rr_cache;  // the same view: in place
      c.text += " out=same-view";
    }
    bool invalid = false;
    c.rr_quant = make_quant(rng, cd, h, c.rr_scales, invalid, c.text, "quant");
    if (invalid) c.must_reject = kBadScale;
    c.rotated = chance(rng, 0.3) ? Direction::inverse : Direction::forward;
    plan_slots(c, rng, c.tokens, blocks * block, false, block);
    if (c.raw) {
      plan_positions(c, rng, c.tokens, false);
    } else {
      c.delta_streams = c.schedule.streams > 1 && chance(rng, 0.5) ? c.schedule.streams : 1;
      c.delta.resize(static_cast<size_t>(c.delta_streams * c.tokens));
      const int64_t range = pick<int64_t>(rng, {16, 5000, int64_t{1} << 20, int64_t{1} << 30});
      const bool same = chance(rng, 0.3);  // an eviction: every key moved by one delta
      const int64_t one = uniform(rng, -range, range);
      for (int64_t& x : c.delta) x = same ? one : uniform(rng, -range, range);
      if (!c.delta.empty() && chance(rng, 0.01)) {
        c.delta[0] = int64_t{1} << 31;
        c.intend_invalid = true;
      }
      c.text += fmt::format(" delta_streams={} delta=[{}]", c.delta_streams, fmt::join(c.delta, ","));
    }
    c.text += fmt::format(" rotated={}", c.rotated == Direction::forward ? "forward" : "inverse");
    finish(c, rng, pick(rng, {1.0, 2.0, 100.0, 1e4, 1e30}), pick(rng, {0.0, 0.0, 0.01, 0.05}));
    return c;
  }
}

// ---- Running the paths ----

// What a run of one operation did, per path: the coverage the test asserts at its end.
struct Stats {
  int64_t configs = 0, rejected = 0, rejected_intended = 0, accepted_intended = 0;
  int64_t ref = 0, cpu1 = 0, cpu2 = 0, emu = 0, fast = 0, fast_runs = 0;
  int64_t v_out = 0;  // accepted calls with a v_out of its own
  int64_t odd = 0, odd_ran = 0;  // calls with a cache laid out unlike nhd and hnd, and those accepted
  int64_t failures = 0;
  std::map<std::string, int64_t> must_reject;  // calls every path rejected, by why they must be
  std::map<std::string, int64_t> refusals;     // fast_store_refusal's reasons
};

// Whether the element of `dtype` at p is a NaN (a NaN code of a quantised dtype).
bool is_nan_at(DType dtype, const unsigned char* p) {
  switch (dtype) {
    case DType::f64: { double v; std::memcpy(&v, p, 8); return std::isnan(v); }
    case DType::f32: { float v; std::memcpy(&v, p, 4); return std::isnan(v); }
    case DType::f16: { uint16_t v; std::memcpy(&v, p, 2); return (v & 0x7c00) == 0x7c00 && (v & 0x3ff) != 0; }
    case DType::bf16: { uint16_t v; std::memcpy(&v, p, 2); return (v & 0x7f80) == 0x7f80 && (v & 0x7f) != 0; }
    case DType::fp8_e4m3: return (p[0] & 0x7f) == 0x7f;
    case DType::fp8_e5m2: return (p[0] & 0x7c) == 0x7c && (p[0] & 3) != 0;
    default: return false;
  }
}

// "" when the arenas agree; else the first differing byte with its region and element, and how many
// bytes differ. Bytes of an element that is a NaN in both agree: the contract leaves a NaN's sign and
// payload to the path. A gap between regions never holds a NaN: any change there is a difference.
std::string difference(const Case& c, const std::vector<unsigned char>& a, const unsigned char* b) {
  if (std::memcmp(a.data(), b, a.size()) == 0) return "";
  size_t first = a.size(), n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    bool nan = false;
    for (const Region& r : c.arena.regions) {
      if (i >= r.off && i < r.off + r.bytes) {
        const size_t es = static_cast<size_t>(size_of(r.dtype));
        const size_t e = r.off + (i - r.off) / es * es;
        nan = is_nan_at(r.dtype, a.data() + e) && is_nan_at(r.dtype, b + e);
        break;
      }
    }
    if (nan) continue;
    if (first == a.size()) first = i;
    ++n;
  }
  if (n == 0) return "";
  return fmt::format("first differing byte {} ({}): {:#04x} vs {:#04x}; {} bytes differ", first, c.arena.where(first),
                     a[first], b[first], n);
}

void report(Stats& st, uint32_t seed, const Case& c, const std::string& what) {
  ++st.failures;
  ADD_FAILURE() << "seed " << seed << ": " << what << "\n  config: " << c.text;
}

// One path: run `call` on a fresh arena; nullopt: it threw rotary::Error (the arena must then be
// untouched), else the arena's bytes.
template <class F>
std::optional<std::vector<unsigned char>> run_path(const Case& c, F&& call, std::string& error, bool& untouched) {
  Memory m(c.arena.size);
  std::memcpy(m.p, c.initial.data(), c.arena.size);
  try {
    call(m.p);
  } catch (const Error& e) {
    error = e.what();
    untouched = std::memcmp(m.p, c.initial.data(), c.arena.size) == 0;
    return std::nullopt;
  }
  return std::vector<unsigned char>(m.p, m.p + c.arena.size);
}

bool verbose() { return std::getenv("FUZZ_VERBOSE") != nullptr; }

// Whether the call may write `r`: the paths compared share the views' addressing (KernelFlat,
// CacheView), so a write at a wrong place would be one they all agree on; what they must never write
// is checked apart. An input is written in place only: q and k without their outputs, v by v_norm
// without v_out, rerotate_cache's keys without `out`; k_pass never.
bool written(const Case& c, const Region& r) {
  if (r.name == "k_pass") return false;
  if (r.name == "q") return !c.q_out.set;
  if (r.name == "k") return !c.k_out.set || c.k_out_in_place;
  if (r.name == "v") return c.op == Op::norm && c.v_norm && !c.store && !c.v_out.set;
  if (r.name == "rr_cache") return !c.rr_out.set || c.rr_out.off == c.rr_cache.off;
  return true;
}

bool is_cache(const Region& r) {
  return r.name == "k_cache" || r.name == "v_cache" || r.name == "mla_cache" || r.name == "rr_cache" || r.name == "rr_out";
}

// "" when the bytes of the caches' regions that are no element of their views (pads, gaps between
// channels, columns beyond the views') are as before the call: the views' elements, every slot's,
// copied from `after` onto the bytes before the call give `after` there.
std::string cache_gaps_written(const Case& c, const std::vector<unsigned char>& after) {
  std::vector<unsigned char> expect = c.initial;
  for (const CSpec* s : {&c.k_cache, &c.v_cache, &c.k_pass_cache, &c.rr_cache, &c.rr_out}) {
    if (!s->set) continue;
    const CacheView& v = s->c;
    const int64_t es = size_of(v.dtype);
    for (int64_t b = 0; b < v.num_blocks; ++b) {
      for (int64_t t = 0; t < v.block_size; ++t) {
        for (int64_t h = 0; h < v.heads; ++h) {
          const int64_t row = static_cast<int64_t>(s->off) + (b * v.strides[0] + t * v.strides[1] + h * v.strides[2] +
                                                              v.offset * v.strides[3]) * es;
          if (v.strides[3] == 1) {
            std::memcpy(expect.data() + row, after.data() + row, static_cast<size_t>(v.head_dim * es));
            continue;
          }
          for (int64_t d = 0; d < v.head_dim; ++d) {
            const int64_t at = row + d * v.strides[3] * es;
            std::memcpy(expect.data() + at, after.data() + at, static_cast<size_t>(es));
          }
        }
      }
    }
  }
  for (const Region& r : c.arena.regions) {
    if (!is_cache(r) || std::memcmp(expect.data() + r.off, after.data() + r.off, r.bytes) == 0) continue;
    size_t i = r.off;
    while (expect[i] == after[i]) ++i;
    return fmt::format("{} + {}, no element of the cache's views, was written", r.name, i - r.off);
  }
  return "";
}

// "" when the gaps between regions (and within caches: cache_gaps_written) and the regions the call
// may not write are as before the call.
std::string outside_outputs(const Case& c, const std::vector<unsigned char>& after) {
  std::vector<Region> regions = c.arena.regions;
  std::sort(regions.begin(), regions.end(), [](const Region& a, const Region& b) { return a.off < b.off; });
  const auto changed = [&](size_t from, size_t to) {
    return to > from && std::memcmp(after.data() + from, c.initial.data() + from, to - from) != 0;
  };
  size_t end = 0;  // of the regions so far
  for (const Region& r : regions) {
    if (changed(end, r.off)) return fmt::format("the gap before {} was written", r.name);
    if (!written(c, r) && changed(r.off, r.off + r.bytes)) return fmt::format("{} (an input only) was written", r.name);
    end = std::max(end, r.off + r.bytes);
  }
  if (changed(end, after.size())) return "the gap after the last region was written";
  return cache_gaps_written(c, after);
}

// v_norm into v_out leaves in v_out, element for element through each view's own strides, what it
// leaves in v in place (the reference both times): a v_out laid out unlike v is read back at its
// own layout, not at v's.
std::string v_out_difference(const Case& c, const std::vector<unsigned char>& ref) {
  Memory m(c.arena.size);
  std::memcpy(m.p, c.initial.data(), c.arena.size);
  try {
    CacheWrite w;
    QkNormRopeArgs a = c.norm_args(m.p, w);
    a.v_out = TensorView{};
    a.rope.backend = Backend::reference;
    qk_norm_rope(c.schedule, a);
  } catch (const Error& e) {
    return fmt::format("v_norm in place rejected ({}) a call it ran into v_out", e.what());
  }
  const TensorView& v = c.v.v;
  const TensorView& out = c.v_out.v;
  const int64_t es = size_of(c.dtype);
  const auto byte_at = [es](const TensorView& t, int64_t b, int64_t s, int64_t h, int64_t ch) {
    return (b * t.strides[0] + s * t.strides[1] + h * t.strides[2] + ch * t.strides[3]) * es;
  };
  for (int64_t b = 0; b < v.shape[0]; ++b) {
    for (int64_t s = 0; s < v.shape[1]; ++s) {
      for (int64_t h = 0; h < v.shape[2]; ++h) {
        for (int64_t ch = 0; ch < v.shape[3]; ++ch) {
          const unsigned char* in_place = m.p + c.v.off + byte_at(v, b, s, h, ch);
          const unsigned char* into = ref.data() + c.v_out.off + byte_at(out, b, s, h, ch);
          if (std::memcmp(in_place, into, static_cast<size_t>(es)) == 0) continue;
          if (is_nan_at(c.dtype, in_place) && is_nan_at(c.dtype, into)) continue;
          return fmt::format("v_out differs from v normed in place at batch {}, token {}, head {}, channel {}", b, s, h, ch);
        }
      }
    }
  }
  return "";
}

// The reference, then the automatic backend at 1 and 2 threads against it. `cpu(backend, threads)`
// makes a call on an arena. nullopt: the reference rejected the call, the others were then held to
// reject it too and to leave the arena untouched.
template <class Cpu>
std::optional<std::vector<unsigned char>> run_cpu_paths(Stats& st, uint32_t seed, const Case& c, Cpu cpu) {
  ++st.configs;
  if (c.odd_caches > 0) ++st.odd;
  if (verbose()) {
    fmt::print("seed {}: {}\n", seed, c.text);
    std::fflush(stdout);
  }
  std::string err_ref;
  bool untouched = true;
  auto ref = run_path(c, cpu(Backend::reference, 1), err_ref, untouched);
  if (!ref) {
    ++st.rejected;
    if (c.intend_invalid) ++st.rejected_intended;
    if (c.must_reject != nullptr) ++st.must_reject[c.must_reject];
    if (verbose()) fmt::print("  rejected: {}\n", err_ref);
    if (!untouched) report(st, seed, c, "reference: rejected (" + err_ref + ") but the arena was written");
    for (const int threads : {1, 2}) {
      bool u = true;
      std::string e;
      if (run_path(c, cpu(Backend::automatic, threads), e, u)) {
        report(st, seed, c, fmt::format("reference rejected ({}) but automatic threads={} ran", err_ref, threads));
      } else if (!u) {
        report(st, seed, c, fmt::format("automatic threads={} rejected ({}) but wrote the arena", threads, e));
      }
    }
    return std::nullopt;
  }
  if (c.must_reject != nullptr) report(st, seed, c, fmt::format("the reference ran a call it must reject: {}", c.must_reject));
  if (c.intend_invalid) ++st.accepted_intended;
  ++st.ref;
  if (c.odd_caches > 0) ++st.odd_ran;
  for (const int threads : {1, 2}) {
    bool u = true;
    std::string err;
    const auto got = run_path(c, cpu(Backend::automatic, threads), err, u);
    ++(threads == 1 ? st.cpu1 : st.cpu2);
    if (!got) {
      report(st, seed, c, fmt::format("automatic threads={} threw ({}) where the reference ran", threads, err));
    } else if (const std::string d = difference(c, *ref, got->data()); !d.empty()) {
      report(st, seed, c, fmt::format("reference vs automatic threads={}: {}", threads, d));
    }
  }
  return ref;
}

void run_fused_case(Stats& st, uint32_t seed, const Case& c) {
  const bool norm = c.op == Op::norm;
  auto cpu = [&c, norm](Backend backend, int threads) {
    return [&c, backend, threads, norm](unsigned char* base) {
      if (norm) {
        CacheWrite w;
        QkNormRopeArgs a = c.norm_args(base, w);
        a.rope.backend = backend;
        a.rope.threads = threads;
        qk_norm_rope(c.schedule, a);
      } else {
        RopeStoreArgs a = c.store_args(base);
        a.rope.backend = backend;
        a.rope.threads = threads;
        rope_store(c.schedule, a);
      }
    };
  };
  const auto ref = run_cpu_paths(st, seed, c, cpu);
  // validate() agrees with the call.
  bool validate_threw = false;
  {
    Memory m(c.arena.size);
    std::memcpy(m.p, c.initial.data(), c.arena.size);
    try {
      if (norm) {
        CacheWrite w;
        validate(c.schedule, c.norm_args(m.p, w));
      } else {
        validate(c.schedule, c.store_args(m.p));
      }
    } catch (const Error&) {
      validate_threw = true;
    }
  }
  if (validate_threw != !ref.has_value()) {
    report(st, seed, c, fmt::format("validate {} but the reference call {}", validate_threw ? "threw" : "passed",
                                    ref ? "ran" : "threw"));
  }
  if (!ref) return;
  if (const std::string d = outside_outputs(c, *ref); !d.empty()) report(st, seed, c, "reference: " + d);
  if (c.v_out.set) {
    ++st.v_out;
    if (const std::string d = v_out_difference(c, *ref); !d.empty()) report(st, seed, c, d);
  }
  // The CUDA general kernel's split, played on the host, validated as a device call.
  std::optional<detail::TableRows> rows;
  if (c.table) rows = detail::table_range(*c.table);
  std::mt19937 launch_rng(seed);
  const int launch_threads = pick(launch_rng, {32, 64, 256, 33});
  const char* refusal = nullptr;
  {
    Memory m(c.arena.size);
    std::memcpy(m.p, c.initial.data(), c.arena.size);
    CacheWrite w;
    detail::FusedKernelArgs f;
    try {
      if (norm) {
        const QkNormRopeArgs a = c.norm_args(m.p, w);
        detail::validate_qk_norm_rope(c.schedule, a, false);
        f = detail::make_qk_norm_rope_args(c.schedule, a, rows ? &*rows : nullptr);
      } else {
        const RopeStoreArgs a = c.store_args(m.p);
        detail::validate_rope_store(c.schedule, a, false);
        f = detail::make_rope_store_args(c.schedule, a, rows ? &*rows : nullptr);
      }
    } catch (const Error& e) {
      report(st, seed, c, fmt::format("the device validation rejected ({}) a call the host ran", e.what()));
      return;
    }
    uint32_t error = 0;
    f.rope.error = &error;
    f.check_duplicates = (seed % 3) == 0;
    test::emulate_fused_grid(f, launch_threads);
    ++st.emu;
    if (error != 0) report(st, seed, c, fmt::format("general emulation raised error {:#x}", error));
    if (const std::string d = difference(c, *ref, m.p); !d.empty()) {
      report(st, seed, c, fmt::format("reference vs CUDA general emulation (threads {}, check_duplicates {}): {}",
                                      launch_threads, f.check_duplicates, d));
    }
    // The fast kernel has no duplicate check: a call asking for one goes to the general kernel.
    f.check_duplicates = false;
    refusal = detail::cuda::fast_store_refusal(f);
  }
  if (refusal != nullptr) {
    ++st.refusals[refusal];
    return;
  }
  ++st.fast;
  for (const int sms : {1, 4, 132}) {
    Memory m(c.arena.size);
    std::memcpy(m.p, c.initial.data(), c.arena.size);
    CacheWrite w;
    detail::FusedKernelArgs f;
    if (norm) {
      f = detail::make_qk_norm_rope_args(c.schedule, c.norm_args(m.p, w), rows ? &*rows : nullptr);
    } else {
      f = detail::make_rope_store_args(c.schedule, c.store_args(m.p), rows ? &*rows : nullptr);
    }
    uint32_t error = 0;
    f.rope.error = &error;
    const detail::cuda::FastShape shape = detail::cuda::fast_store_launch_shape(f, sms);
    detail::cuda::emulate_fast_store(f, shape);
    ++st.fast_runs;
    const std::string sh = fmt::format("{} SMs: chunks={} rows={} tile_shift={} group_heads={} groups={} grid={}", sms,
                                       shape.chunks, shape.rows, shape.tile_shift, shape.group_heads, shape.groups, shape.grid);
    if (error != 0) report(st, seed, c, fmt::format("fast emulation ({}) raised error {:#x}", sh, error));
    if (const std::string d = difference(c, *ref, m.p); !d.empty()) {
      report(st, seed, c, fmt::format("reference vs CUDA fast store emulation ({}): {}", sh, d));
    }
  }
}

void run_rerotate_case(Stats& st, uint32_t seed, const Case& c) {
  auto cpu = [&c](Backend backend, int threads) {
    return [&c, backend, threads](unsigned char* base) {
      RerotateCacheArgs a = c.rerotate_args(base);
      a.backend = backend;
      a.threads = threads;
      rerotate_cache(c.schedule, a);
    };
  };
  const auto ref = run_cpu_paths(st, seed, c, cpu);
  if (!ref) return;
  if (const std::string d = outside_outputs(c, *ref); !d.empty()) report(st, seed, c, "reference: " + d);
  Memory m(c.arena.size);
  std::memcpy(m.p, c.initial.data(), c.arena.size);
  const RerotateCacheArgs a = c.rerotate_args(m.p);
  std::optional<detail::TableRows> rows;
  if (c.table && c.raw) rows = detail::table_range(*c.table);
  detail::RerotateKernelArgs r;
  try {
    detail::validate_rerotate_cache(c.schedule, a, false);
    r = detail::make_rerotate_args(c.schedule, a, rows ? &*rows : nullptr);
  } catch (const Error& e) {
    report(st, seed, c, fmt::format("the device validation rejected ({}) a call the host ran", e.what()));
    return;
  }
  uint32_t error = 0;
  r.rope.error = &error;
  r.check_duplicates = seed % 2 == 0;
  const int threads = (seed % 3 == 0) ? 32 : 64;
  test::emulate_rerotate_grid(r, threads);
  ++st.emu;
  if (error != 0) report(st, seed, c, fmt::format("rerotate emulation raised error {:#x}", error));
  if (const std::string d = difference(c, *ref, m.p); !d.empty()) {
    report(st, seed, c, fmt::format("reference vs CUDA rerotate emulation: {}", d));
  }
}

constexpr int64_t kDefaultIters = 300;  // per operation: CI's time (the file's head)

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : std::strtoll(v, nullptr, 10);
}

void print_stats(const char* op, const Stats& st) {
  fmt::print("[{}] configs={} rejected={} (maybe-invalid rejected={}, maybe-invalid accepted={}) ref={} cpu1={} cpu2={} "
             "emu={} fast-taken={} fast-runs={} v_out={} odd-caches={} (ran {}) failures={}\n",
             op, st.configs, st.rejected, st.rejected_intended, st.accepted_intended, st.ref, st.cpu1, st.cpu2, st.emu,
             st.fast, st.fast_runs, st.v_out, st.odd, st.odd_ran, st.failures);
  for (const auto& [why, n] : st.must_reject) fmt::print("    rejected as it must be ({}x): {}\n", n, why);
  for (const auto& [why, n] : st.refusals) fmt::print("    fast kernel refused ({}x): {}\n", n, why);
}

// The least share of a run's calls each path must see, a third or less of what the generator gives
// (every run prints its counts): a generator change that starves a path fails here rather than
// leaving the path untested. Held in runs of kCoverageIters calls or more, where chance alone falls
// below these shares at well under one seed in a thousand.
struct Coverage {
  double ran = 0;       // accepted by the reference, run on both CPU paths and the general emulation
  double rejected = 0;  // rejected by every path, the arena untouched
  double fast = 0;      // taken by the fast kernel (each at three launches)
  double v_out = 0;     // accepted with a v_out laid out unlike v
  double odd = 0;       // accepted with a cache laid out unlike nhd and hnd (cache_layout)
  const char* must_reject = nullptr;  // a rejection the run must have met at least once
};
constexpr int64_t kCoverageIters = 200;

template <class Make, class Run>
void fuzz(const char* op, uint32_t salt, Make make, Run runner, const Coverage& coverage) {
  const int64_t iters = env_int("FUZZ_ITERS", kDefaultIters);
  const int64_t base = env_int("FUZZ_SEED", 1);
  const int64_t only = env_int("FUZZ_ONLY", -1);
  Stats st;
  for (int64_t i = 0; i < iters; ++i) {
    if (only >= 0 && i != only) continue;
    const auto seed = static_cast<uint32_t>(base * 1000003 + i * 7919 + salt);
    Case c = make(seed);
    const int64_t before = st.failures;
    runner(st, seed, c);
    if (st.failures != before) fmt::print("  ^ iteration {}: FUZZ_SEED={} FUZZ_ONLY={} replays it\n", i, base, i);
    if (st.failures > 40) break;  // enough to go on; the rest would bury the first
  }
  print_stats(op, st);
  if (only >= 0 || iters < kCoverageIters || st.failures > 40) return;
  const auto share = [&](double s) { return static_cast<int64_t>(s * static_cast<double>(iters)); };
  EXPECT_GE(st.ref, share(coverage.ran)) << op << ": too few calls accepted";
  EXPECT_GE(st.rejected, share(coverage.rejected)) << op << ": too few calls rejected";
  if (coverage.fast > 0) {
    EXPECT_GE(st.fast, share(coverage.fast)) << op << ": too few calls taken by the fast kernel";
  }
  if (coverage.v_out > 0) {
    EXPECT_GE(st.v_out, share(coverage.v_out)) << op << ": too few calls with a v_out of its own";
  }
  EXPECT_GE(st.odd_ran, share(coverage.odd)) << op << ": too few calls with caches laid out unlike nhd and hnd";
  if (coverage.must_reject != nullptr) {
    EXPECT_TRUE(st.must_reject.contains(coverage.must_reject)) << op << ": no call rejected for " << coverage.must_reject;
  }
}

// A slot's cache row below the cache's data pointer (a negative block or token-in-block stride):
// the fast CUDA store kernel marks "no cache write" by a negative row offset (fast_cache_row), so it
// once left such rows unwritten (found by the fuzz's cache layouts, cache_layout). Such caches take
// the general kernel (fast_cache_ok); here slot 1 of a [1 block, 2 tokens] f32 cache with token
// stride -64 lies 256 bytes below data, and the call runs as a device call would: the kernel
// fast_store_refusal picks, which must not be the fast one, gives the reference's bytes.
TEST(FusedFuzzRows, ACacheRowBelowDataIsWrittenOnTheDevicePath) {
  const Schedule schedule = make_schedule(Spec{.head_dim = 64});
  std::vector<float> q0(64), k(64);
  for (int i = 0; i < 64; ++i) {
    q0[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i % 7) - 0.5f;
    k[static_cast<size_t>(i)] = 0.125f * static_cast<float>(i % 5) + 0.25f;
  }
  const int64_t slot = 1;
  const auto run = [&](bool fast) {
    std::vector<float> q = q0;
    std::vector<float> cache(128, -7.0f);  // slot 1's row at [0, 64), slot 0's at [64, 128)
    RopeStoreArgs a{.rope = ApplyArgs{.q = TensorView::bshd(q.data(), DType::f32, 1, 1, 1, 64),
                                      .k = TensorView::bshd(k.data(), DType::f32, 1, 1, 1, 64),
                                      .positions = Positions::sequential(5)}};
    a.cache.slots = Slots{&slot, true, 1};
    a.cache.k_cache = CacheView{.data = cache.data() + 64, .dtype = DType::f32, .block_size = 2, .num_blocks = 1,
                                .heads = 1, .head_dim = 64, .strides = {128, -64, 64, 1}};
    if (!fast) {
      a.rope.backend = Backend::reference;
      rope_store(schedule, a);
      return cache;
    }
    detail::validate_rope_store(schedule, a, false);
    detail::FusedKernelArgs f = detail::make_rope_store_args(schedule, a, nullptr);
    uint32_t error = 0;
    f.rope.error = &error;
    EXPECT_STREQ(detail::cuda::fast_store_refusal(f), "k_cache's rows");
    if (detail::cuda::fast_store_refusal(f) == nullptr) {
      detail::cuda::emulate_fast_store(f, detail::cuda::fast_store_launch_shape(f, 1));
    } else {
      test::emulate_fused_grid(f, 64);
    }
    EXPECT_EQ(error, 0u);
    return cache;
  };
  const std::vector<float> ref = run(false);
  const std::vector<float> fast = run(true);
  ASSERT_NE(ref[0], -7.0f);  // the reference wrote slot 1's row
  EXPECT_EQ(std::memcmp(ref.data(), fast.data(), ref.size() * sizeof(float)), 0)
      << "slot 1's row: reference k[0]=" << ref[0] << ", the device's kernel " << fast[0];
}

TEST(FusedFuzz, RopeStore) {
  fuzz("rope_store", 11, make_store_case, run_fused_case,
       Coverage{.ran = 0.3, .rejected = 0.05, .fast = 0.1, .odd = 0.1, .must_reject = "q_quantized with f64 data"});
}

TEST(FusedFuzz, QkNormRope) {
  fuzz("qk_norm_rope", 23, make_norm_case, run_fused_case,
       Coverage{.ran = 0.3, .rejected = 0.02, .fast = 0.1, .v_out = 0.005, .odd = 0.05});
}

TEST(FusedFuzz, RerotateCache) {
  fuzz("rerotate_cache", 37, make_rerotate_case, run_rerotate_case, Coverage{.ran = 0.3, .rejected = 0.005, .odd = 0.07});
}

}  // namespace
}  // namespace rotary
