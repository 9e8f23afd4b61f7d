#include "support/cuda_calls.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>

#include "kernel/args.hpp"

namespace rotary::test {

// ---- Memory ----

uint64_t poison_bits(DType dtype) {
  switch (dtype) {
    case DType::f32: return 0x7fc12345u;
    case DType::f64: return 0x7ff8123456789abcull;
    default: return 0x7e55u;  // a NaN in both f16 and bf16
  }
}

Arena::Arena(DType t, int64_t n) : dtype(t), elements(n), bytes(static_cast<size_t>((n + 2 * kGuard) * size_of(t))) {
  const uint64_t p = poison_bits(dtype);
  const auto es = static_cast<size_t>(size_of(dtype));
  for (size_t i = 0; i < bytes.size(); i += es) std::memcpy(&bytes[i], &p, es);
}

void Arena::set_double(int64_t element, double v) {
  if (dtype == DType::f64) {
    std::memcpy(at(element), &v, sizeof v);
  } else {
    set(element, static_cast<float>(v));
  }
}

const char* order_name(int order) {
  static const char* names[] = {"bshd", "bhsd", "seq,d reversed", "strided d", "all negative", "fused-qkv"};
  return names[order];
}

const char* angle_order_name(int order) {
  static const char* names[] = {"contiguous", "cos|sin rows in one buffer", "rows,columns reversed",
                                "strided columns with gaps", "column-major, batch reversed"};
  return names[order];
}

const char* columns_name(CallerAngles::Columns columns) {
  switch (columns) {
    case CallerAngles::Columns::pairs: return "pairs";
    case CallerAngles::Columns::halves: return "halves";
    default: return "repeated";
  }
}

std::string Call::describe() const {
  std::string s = std::string(to_string(dtype)) + " " + std::string(to_string(schedule.channel_layout())) +
                  " blocks " + std::to_string(schedule.blocks) + " head_dim " + std::to_string(head_dim) +
                  " rotary_dim " + std::to_string(schedule.rotary_dim) + " offset " +
                  std::to_string(schedule.rotary_offset) + " streams " + std::to_string(schedule.streams) +
                  "/" + std::to_string(position_streams) + " b " + std::to_string(batch) + " s " +
                  std::to_string(seq) + " hq " + std::to_string(heads_q) + " hk " + std::to_string(heads_k) +
                  " in " + order_name(in_order) + " out " + order_name(out_order) +
                  (q_in_place ? " q in place" : " q out of place") +
                  (k_in_place ? " k in place" : " k out of place") +
                  (copy_tail ? "" : " no tail copy") +
                  (direction == Direction::inverse ? " inverse" : " forward") + (undo ? " undo" : "") +
                  (hf_float32 ? " hf_float32" : "") +
                  " positions kind " + std::to_string(static_cast<int>(kind)) + (broadcast ? " broadcast" : "") +
                  (table ? " table first " + std::to_string(table_first) : caller ? "" : " exact");
  if (caller) {
    const auto dims = angle_shape();
    s += std::string(" caller angles ") + (per_position() ? "per_position " : "per_token ") +
         columns_name(angle_columns) + " " + std::string(to_string(angle_dtype)) + " [" +
         std::to_string(dims[0]) + ", " + std::to_string(dims[1]) + ", " + std::to_string(dims[2]) + "] " +
         (angle_rows_alias ? "rows aliased" : angle_order_name(angle_order));
  }
  if (k_order >= 0 || k_out_order >= 0) {
    s += std::string(" k ") + order_name(k_order >= 0 ? k_order : 0) + " k_out " +
         order_name(k_out_order >= 0 ? k_out_order : 0);
  }
  if (shift != 0) s += " views shifted by " + std::to_string(shift);
  if (!default_shape) {
    s += " launch " + std::to_string(shape.blocks) + "x" + std::to_string(shape.threads) +
         (shape.shared_angles ? " shared" : " per-item angles");
  }
  return s;
}

namespace {

// Memory orders of one view in an arena of its own: returns the placement and the arena's size.
//   0 bshd   1 bhsd   2 seq and head_dim reversed (negative strides)   3 head_dim stride 2 with
//   gaps between heads   4 every stride negative
Placed place(int order, int arena, int64_t b, int64_t s, int64_t h, int64_t d, int64_t& extent) {
  Placed p{.arena = arena, .shape = {b, s, h, d}};
  extent = b * s * h * d;
  switch (order) {
    case 0: p.strides = {s * h * d, h * d, d, 1}; break;
    case 1: p.strides = {h * s * d, d, s * d, 1}; break;
    case 2:
      p.strides = {s * h * d, -h * d, d, -1};
      p.offset = (s - 1) * h * d + (d - 1);
      break;
    case 3: {
      const int64_t w = 2 * d + 3;
      p.strides = {s * h * w, h * w, w, 2};
      extent = b * s * h * w;
      break;
    }
    default:
      p.strides = {-s * h * d, -h * d, -d, -1};
      p.offset = extent - 1;
      break;
  }
  if (extent == 0) p.offset = 0;  // an empty view: no element, any pointer
  return p;
}

// The caller's cos and sin of `c` in arenas of their own (after the views'), cos as c.angle_order
// says: 0 contiguous; 1 one buffer of rows [cos | sin] (vLLM's cos_sin_cache, sin beside cos);
// 2 rows and columns reversed (negative strides); 3 columns 3 apart with gaps between rows;
// 4 column-major, dimension 0 reversed. sin (but with order 1) in the next of 0, 2, 3, 4, so that
// mixing up cos's and sin's strides shows. angle_rows_alias: row stride 0.
void lay_out_angles(Call& c) {
  const auto [d0, d1, w] = c.angle_shape();
  auto add = [&](int64_t extent) {
    c.arena_sizes.push_back(extent);
    c.arena_types.push_back(c.angle_dtype);
    return static_cast<int>(c.arena_sizes.size()) - 1;
  };
  if (c.angle_rows_alias) {
    c.cos_at = PlacedAngles{.arena = add(w), .strides = {0, 0, 1}};
    c.sin_at = PlacedAngles{.arena = add(2 * w), .offset = 2 * w - 1, .strides = {0, 0, -2}};
    return;
  }
  if (c.angle_order == 1) {
    const int arena = add(d0 * d1 * 2 * w);
    c.cos_at = PlacedAngles{.arena = arena, .strides = {d1 * 2 * w, 2 * w, 1}};
    c.sin_at = PlacedAngles{.arena = arena, .offset = w, .strides = {d1 * 2 * w, 2 * w, 1}};
    return;
  }
  auto place_one = [&](int order) {
    switch (order) {
      case 2: return PlacedAngles{.arena = add(d0 * d1 * w), .offset = (d1 - 1) * w + (w - 1), .strides = {d1 * w, -w, -1}};
      case 3: return PlacedAngles{.arena = add(d0 * d1 * (3 * w + 2)), .strides = {d1 * (3 * w + 2), 3 * w + 2, 3}};
      case 4: return PlacedAngles{.arena = add(d0 * d1 * w), .offset = (d0 - 1) * d1 * w, .strides = {-d1 * w, 1, d1}};
      default: return PlacedAngles{.arena = add(d0 * d1 * w), .strides = {d1 * w, w, 1}};
    }
  };
  c.cos_at = place_one(c.angle_order);
  c.sin_at = place_one(c.angle_order == 0 ? 2 : c.angle_order == 4 ? 0 : c.angle_order + 1);
}

constexpr float kSpecials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-40f, -3e-39f, 0x1p-126f,
                               6.0e-8f, -5.9e-5f, 65504.0f, -65000.0f, 3.3e38f, -3.0e38f, 1.0f, -2.5f};

// The caller's cos and sin: every element a random double in [-1.25, 1.25] (an f64 tensor keeps
// all its bits, so widening to float rounds), or a special value. The duplicate columns (halves,
// repeated) get values of their own: reading one instead of the pair's column shows.
void fill_angles(const Call& c, std::vector<Arena>& arenas, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform_angle(-1.25, 1.25);
  const auto [d0, d1, w] = c.angle_shape();
  const int64_t rows = c.angle_rows_alias ? 1 : d1;
  for (const PlacedAngles* p : {&c.cos_at, &c.sin_at}) {
    Arena& arena = arenas[static_cast<size_t>(p->arena)];
    for (int64_t i0 = 0; i0 < d0; ++i0)
      for (int64_t i1 = 0; i1 < rows; ++i1)
        for (int64_t column = 0; column < w; ++column) {
          const double v = c.special_values && rng() % 4 == 0
                               ? static_cast<double>(kSpecials[rng() % std::size(kSpecials)])
                               : uniform_angle(rng);
          arena.set_double(p->element(i0, i1, column), v);
        }
  }
}

TensorView view_at(const Call& c, const Placed& p, const ArenaBases& bases) {
  if (p.arena < 0) return TensorView{};
  unsigned char* data = bases[static_cast<size_t>(p.arena)] + (kGuard + p.offset) * size_of(c.dtype);
  return TensorView{.data = data, .dtype = c.dtype, .shape = p.shape, .strides = p.strides};
}

// The caller's cos/sin of `c` in the arenas at `bases`.
CallerAngles angles_at(const Call& c, const ArenaBases& bases) {
  const int64_t es = size_of(c.angle_dtype);
  return CallerAngles{.index = c.angle_index, .columns = c.angle_columns,
                      .cos = bases[static_cast<size_t>(c.cos_at.arena)] + (kGuard + c.cos_at.offset) * es,
                      .sin = bases[static_cast<size_t>(c.sin_at.arena)] + (kGuard + c.sin_at.offset) * es,
                      .dtype = c.angle_dtype, .shape = c.angle_shape(), .cos_strides = c.cos_at.strides,
                      .sin_strides = c.sin_at.strides};
}

// Names an element of an arena by the views that hold it.
std::string where(const Call& c, int arena, int64_t element) {
  const std::pair<const Placed*, const char*> views[] = {
      {&c.q, "q"}, {&c.k, "k"}, {&c.q_out, "q_out"}, {&c.k_out, "k_out"}};
  if (arena == c.cos_at.arena || arena == c.sin_at.arena) return "an element of the caller's cos/sin";
  for (const auto& [v, name] : views) {
    if (v->arena != arena) continue;
    for (int64_t b = 0; b < v->shape[0]; ++b)
      for (int64_t s = 0; s < v->shape[1]; ++s)
        for (int64_t h = 0; h < v->shape[2]; ++h)
          for (int64_t d = 0; d < v->shape[3]; ++d)
            if (v->element(b, s, h, d) == element) {
              return std::string(name) + " batch " + std::to_string(b) + " token " + std::to_string(s) +
                     " head " + std::to_string(h) + " channel " + std::to_string(d);
            }
  }
  return "an element outside every view (guard or gap)";
}

}  // namespace

void lay_out(Call& c) {
  c.arena_sizes.clear();
  c.arena_types.clear();
  c.cos_at = c.sin_at = PlacedAngles{};
  auto own = [&](int order, int64_t heads) {
    int64_t extent = 0;
    Placed p = place(order, static_cast<int>(c.arena_sizes.size()), c.batch, c.seq, heads, c.head_dim, extent);
    p.offset += c.shift;
    c.arena_sizes.push_back(extent + c.shift);
    c.arena_types.push_back(c.dtype);
    return p;
  };
  // q and k as slices of one fused QKV buffer [b, s, hq + 2 hk, d] (v never touched).
  auto fused = [&](Placed& q, Placed& k) {
    const int64_t total = c.heads_q + 2 * std::max<int64_t>(c.heads_k, 1);
    const std::array<int64_t, 4> strides = {c.seq * total * c.head_dim, total * c.head_dim, c.head_dim, 1};
    const int arena = static_cast<int>(c.arena_sizes.size());
    c.arena_sizes.push_back(c.batch * c.seq * total * c.head_dim);
    c.arena_types.push_back(c.dtype);
    q = Placed{.arena = arena, .offset = 0, .shape = {c.batch, c.seq, c.heads_q, c.head_dim}, .strides = strides};
    k = Placed{.arena = arena, .offset = c.heads_q * c.head_dim,
               .shape = {c.batch, c.seq, c.heads_k, c.head_dim}, .strides = strides};
  };
  if (c.in_order == 5) {
    fused(c.q, c.k);
  } else {
    c.q = own(c.in_order, c.heads_q);
    c.k = c.heads_k > 0 ? own(c.k_order >= 0 ? c.k_order : (c.in_order + 1) % 5, c.heads_k) : Placed{};
  }
  if (c.heads_k == 0) c.k = Placed{};
  c.q_out = Placed{};
  c.k_out = Placed{};
  if (c.out_order == 5 && !c.q_in_place && !c.k_in_place && c.heads_k > 0) {
    fused(c.q_out, c.k_out);
  } else {
    if (!c.q_in_place) c.q_out = own(c.out_order == 5 ? 0 : c.out_order, c.heads_q);
    if (!c.k_in_place && c.heads_k > 0) {
      c.k_out = own(c.k_out_order >= 0 ? c.k_out_order : c.out_order == 5 ? 2 : (c.out_order + 3) % 5, c.heads_k);
    }
  }
  if (c.caller) lay_out_angles(c);
}

std::vector<Arena> make_arenas(const Call& c, uint64_t seed) {
  std::vector<Arena> arenas;
  for (size_t i = 0; i < c.arena_sizes.size(); ++i) arenas.emplace_back(c.arena_types[i], c.arena_sizes[i]);
  std::mt19937_64 rng(seed);
  if (c.caller) fill_angles(c, arenas, rng);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (const Placed* v : {&c.q, &c.k}) {
    if (v->arena < 0) continue;
    Arena& arena = arenas[static_cast<size_t>(v->arena)];
    for (int64_t b = 0; b < v->shape[0]; ++b)
      for (int64_t s = 0; s < v->shape[1]; ++s)
        for (int64_t h = 0; h < v->shape[2]; ++h)
          for (int64_t d = 0; d < v->shape[3]; ++d) {
            const float x = c.special_values ? kSpecials[rng() % std::size(kSpecials)] : normal(rng);
            arena.set(v->element(b, s, h, d), x);
          }
  }
  return arenas;
}

std::optional<Table> table_of(const Call& c) {
  if (!c.table) return std::nullopt;
  return Table::range(c.schedule, c.table_first, c.table_rows,
                      c.hf_float32 ? AngleMode::hf_float32 : AngleMode::exact);
}

std::vector<Arena> reference_result(const Call& c, std::vector<Arena> arenas) {
  const std::optional<Table> table = table_of(c);
  CallerAngles angles;
  apply(c.schedule, args_of(c, arenas, table ? &*table : nullptr, &angles));
  return arenas;
}

const void* position_data(const Call& c) {
  switch (c.kind) {
    case Positions::Kind::per_token_i32: return c.p32.data();
    case Positions::Kind::per_token_i64: return c.p64.data();
    case Positions::Kind::per_token_f32: return c.pf32.data();
    case Positions::Kind::per_token_f64: return c.pf64.data();
    default: return nullptr;
  }
}

size_t position_bytes(const Call& c) {
  switch (c.kind) {
    case Positions::Kind::per_token_i32: return c.p32.size() * sizeof(int32_t);
    case Positions::Kind::per_token_i64: return c.p64.size() * sizeof(int64_t);
    case Positions::Kind::per_token_f32: return c.pf32.size() * sizeof(float);
    case Positions::Kind::per_token_f64: return c.pf64.size() * sizeof(double);
    default: return 0;
  }
}

Positions positions_at(const Call& c, const void* data) {
  const int streams = c.position_streams;
  switch (c.kind) {
    case Positions::Kind::per_token_i32:
      return Positions::per_token(std::span(static_cast<const int32_t*>(data), c.p32.size()), streams);
    case Positions::Kind::per_token_i64:
      return Positions::per_token(std::span(static_cast<const int64_t*>(data), c.p64.size()), streams);
    case Positions::Kind::per_token_f32:
      return Positions::per_token(std::span(static_cast<const float*>(data), c.pf32.size()), streams);
    case Positions::Kind::per_token_f64:
      return Positions::per_token(std::span(static_cast<const double*>(data), c.pf64.size()), streams);
    default: return Positions::sequential(c.offset);
  }
}

ArenaBases bases_of(std::vector<Arena>& arenas) {
  ArenaBases bases;
  for (Arena& arena : arenas) bases.push_back(arena.bytes.data());
  return bases;
}

ApplyArgs args_at(const Call& c, const ArenaBases& bases, const Positions& positions, const Table* table,
                  CallerAngles* angles) {
  if (c.caller) *angles = angles_at(c, bases);
  return ApplyArgs{.q = view_at(c, c.q, bases), .k = view_at(c, c.k, bases),
                   .q_out = view_at(c, c.q_out, bases), .k_out = view_at(c, c.k_out, bases),
                   .positions = positions, .direction = c.direction, .table = table,
                   .angles = c.caller ? angles : nullptr,
                   .numerics = c.hf_float32 ? std::optional(AngleMode::hf_float32) : std::nullopt,
                   .copy_tail = c.copy_tail, .undo = c.undo,
                   .backend = Backend::reference};
}

ApplyArgs args_of(const Call& c, std::vector<Arena>& arenas, const Table* table, CallerAngles* angles) {
  return args_at(c, bases_of(arenas), positions_at(c, position_data(c)), table, angles);
}

std::string first_difference(const Call& c, const std::vector<Arena>& got, const std::vector<Arena>& want) {
  for (size_t a = 0; a < want.size(); ++a) {
    if (got[a].bytes == want[a].bytes) continue;
    const auto es = static_cast<size_t>(size_of(got[a].dtype));
    for (int64_t element = -kGuard; element < got[a].elements + kGuard; ++element) {
      if (std::memcmp(got[a].at(element), want[a].at(element), es) == 0) continue;
      if (std::isnan(got[a].get(element)) && std::isnan(want[a].get(element))) continue;
      return "arena " + std::to_string(a) + " element " + std::to_string(element) + " (" +
             where(c, static_cast<int>(a), element) + ") is " + std::to_string(got[a].get(element)) +
             ", the reference has " + std::to_string(want[a].get(element));
    }
  }
  return "";
}

// ---- Random calls ----

namespace {

// A hand-built descriptor (schedule.hpp): any layout, partial rotary at any offset, 1..4 streams
// with a random pair -> stream map, frequencies including zeros and the largest allowed.
Schedule random_schedule(std::mt19937_64& rng) {
  Schedule s;
  s.head_dim = pick<int64_t>(rng, {2, 4, 6, 8, 12, 16, 18, 34, 40, 64, 80, 96, 128, 160, 256});
  const int layout = static_cast<int>(rng() % 3);
  s.blocks = layout == 2 ? pick<int64_t>(rng, {2, 4}) : 1;
  s.pairing = layout == 1 ? Pairing::interleaved : Pairing::half;
  const int64_t unit = 2 * s.blocks;
  if (s.head_dim < unit) s.blocks = 1;
  const int64_t units = s.head_dim / (2 * s.blocks);
  s.rotary_dim = rng() % 2 == 0 ? units * 2 * s.blocks : uniform(rng, 1, units) * 2 * s.blocks;
  s.rotary_offset = rng() % 3 == 0 ? uniform(rng, 0, s.head_dim - s.rotary_dim) : 0;
  s.inv_freq = default_inv_freq(pick<double>(rng, {10000.0, 500000.0, 1e6, 100.0}), s.rotary_dim);
  if (rng() % 4 == 0) s.inv_freq.back() = 0.0;  // proportional RoPE's unturned pairs
  if (rng() % 8 == 0) s.inv_freq.front() = max_inv_freq;
  s.attention_factor = pick<double>(rng, {1.0, 1.0, 1.2079441541679836, 0.7});
  if (rng() % 3 == 0) {
    s.streams = static_cast<int>(uniform(rng, 2, 4));
    s.pair_stream.resize(static_cast<size_t>(s.pairs()));
    for (int& k : s.pair_stream) k = static_cast<int>(uniform(rng, 0, s.streams - 1));
  }
  validate(s);
  return s;
}

// Positions: whole numbers anywhere in [0, 2^31) — the ends, powers of two and their neighbours,
// random — or rows of the table or of per_position caller angles; float kinds hold fractional
// positions (exact angles, per_token caller angles) or whole ones (rows: a table placed below 2^24
// for float32, caller angles' rows used below 2^24).
void random_positions(Call& c, std::mt19937_64& rng) {
  const int64_t limit = max_position_limit;
  c.kind = pick(rng, {Positions::Kind::sequential, Positions::Kind::per_token_i32, Positions::Kind::per_token_i64,
                      Positions::Kind::per_token_f32, Positions::Kind::per_token_f64});
  const bool f32 = c.kind == Positions::Kind::per_token_f32;
  // The rows the positions index, [first, first + rows), if any.
  int64_t first = 0, rows = 0;
  if (c.table) {
    c.table_rows = c.seq + uniform(rng, 0, 5);
    const int64_t top = (f32 ? int64_t{1} << 24 : limit) - c.table_rows;
    c.table_first = pick<int64_t>(rng, {0, 1, 4095, top, uniform(rng, 0, top)});
    first = c.table_first;
    rows = c.table_rows;
  } else if (c.per_position()) {
    rows = f32 ? std::min(c.angle_rows, int64_t{1} << 24) : c.angle_rows;
    if (c.kind == Positions::Kind::sequential && rows < c.seq) c.kind = Positions::Kind::per_token_i64;
  }
  if (c.kind == Positions::Kind::sequential) {
    c.offset = rows > 0 ? uniform(rng, first, first + rows - c.seq)
                        : pick<int64_t>(rng, {0, 1, limit - c.seq, uniform(rng, 0, limit - c.seq)});
    return;
  }
  c.position_streams = rng() % 2 == 0 ? 1 : c.schedule.streams;
  c.broadcast = rng() % 4 == 0;
  const int64_t n = (c.broadcast ? c.seq : c.batch * c.seq) * c.position_streams;
  for (int64_t i = 0; i < n; ++i) {
    int64_t p = 0;
    if (rows > 0) {
      p = first + pick<int64_t>(rng, {0, rows - 1, uniform(rng, 0, rows - 1), uniform(rng, 0, rows - 1)});
    } else {
      const int e = static_cast<int>(uniform(rng, 0, 30));
      p = pick<int64_t>(rng, {0, 1, limit - 1, (int64_t{1} << e) - 1, int64_t{1} << e, (int64_t{1} << e) + 1,
                              uniform(rng, 0, limit - 1), uniform(rng, 0, limit - 1)});
    }
    c.p32.push_back(static_cast<int32_t>(p));
    c.p64.push_back(p);
    // exact angles: the float just below p (fractional under 2^24), any float below 2^31 being a
    // position; rows: p itself, a whole float below 2^24
    c.pf32.push_back(rows > 0 ? static_cast<float>(p) : std::nextafter(static_cast<float>(p), 0.0f));
    c.pf64.push_back(rows > 0 ? static_cast<double>(p) : std::min(static_cast<double>(p) + 0.375, limit - 0.5));
  }
}

// The caller's cos/sin: either index, any columns and dtype, broadcast or per-batch rows, 1 to
// seq + 20 rows (fewer than seq too, with per-token positions), rows aliased up to 2^31, every
// memory order.
void random_caller_angles(Call& c, std::mt19937_64& rng) {
  c.caller = true;
  c.angle_index = rng() % 2 == 0 ? CallerAngles::Index::per_token : CallerAngles::Index::per_position;
  c.angle_columns = pick(rng, {CallerAngles::Columns::pairs, CallerAngles::Columns::halves,
                               CallerAngles::Columns::repeated});
  c.angle_dtype = pick(rng, {DType::f32, DType::f16, DType::bf16, DType::f64});
  c.angle_order = static_cast<int>(uniform(rng, 0, 4));
  if (c.angle_index == CallerAngles::Index::per_token) {
    c.angle_broadcast = c.batch == 1 || rng() % 3 == 0;
    return;
  }
  c.angle_rows_alias = rng() % 8 == 0;
  c.angle_rows = c.angle_rows_alias ? pick<int64_t>(rng, {max_position_limit, uniform(rng, 1, max_position_limit)})
                                    : uniform(rng, 1, c.seq + 20);
}

}  // namespace

Call random_call(std::mt19937_64& rng, DType dtype) {
  Call c;
  c.schedule = random_schedule(rng);
  c.dtype = dtype;
  c.head_dim = c.schedule.head_dim;
  c.batch = uniform(rng, 1, 3);
  c.seq = uniform(rng, 1, 6);
  c.heads_q = pick<int64_t>(rng, {1, 3, 5, 7, 2, 0});
  c.heads_k = pick<int64_t>(rng, {0, 1, 2, 3});
  if (c.heads_q == 0 && c.heads_k == 0) c.heads_k = 1;
  c.in_order = static_cast<int>(uniform(rng, 0, 5));
  c.out_order = static_cast<int>(uniform(rng, 0, 5));
  c.q_in_place = rng() % 2 == 0;
  c.k_in_place = rng() % 2 == 0;
  c.copy_tail = rng() % 4 != 0;
  c.direction = rng() % 2 == 0 ? Direction::forward : Direction::inverse;
  const int source = static_cast<int>(rng() % 3);  // a table, exact angles, the caller's
  c.table = source == 0;
  if (source == 2) random_caller_angles(c, rng);
  // xPos (not with the caller's angles): scale bases whose reach covers [0, 2^31) from the centre.
  const double g = c.schedule.attention_factor;
  if (source != 2 && rng() % 4 == 0 && g >= xpos_min_attention_factor && g <= xpos_max_attention_factor) {
    c.schedule = with_xpos(c.schedule, pick(rng, {1e9, 4e8}), pick(rng, {0.0, 1e9, 12345.5}));
  }
  random_positions(c, rng);
  c.default_shape = rng() % 2 == 0;
  if (!c.default_shape) {
    const int64_t tokens = c.batch * c.seq;
    c.shape.blocks = pick<int64_t>(rng, {1, 2, 3, tokens, tokens + 2});
    c.shape.threads = pick(rng, {1, 7, 32, 33, 64, 256});
    c.shape.shared_angles = rng() % 2 == 0;
  }
  lay_out(c);
  return c;
}

namespace {

// Frequencies, attention factor and streams of a descriptor, as random_schedule draws them.
void random_frequencies(Schedule& s, std::mt19937_64& rng) {
  s.inv_freq = default_inv_freq(pick<double>(rng, {10000.0, 500000.0, 1e6, 100.0}), s.rotary_dim);
  if (rng() % 4 == 0) s.inv_freq.back() = 0.0;
  if (rng() % 8 == 0) s.inv_freq.front() = max_inv_freq;
  s.attention_factor = pick<double>(rng, {1.0, 1.0, 1.2079441541679836, 0.7});
  if (rng() % 3 == 0) {
    s.streams = static_cast<int>(uniform(rng, 2, 4));
    s.pair_stream.resize(static_cast<size_t>(s.pairs()));
    for (int& k : s.pair_stream) k = static_cast<int>(uniform(rng, 0, s.streams - 1));
  }
}

}  // namespace

Call random_fast_call(std::mt19937_64& rng, DType dtype) {
  Call c;
  const int64_t lanes = 16 / size_of(dtype);
  Schedule& s = c.schedule;
  s.pairing = rng() % 2 == 0 ? Pairing::half : Pairing::interleaved;
  const int64_t unit = s.pairing == Pairing::half ? 2 * lanes : lanes;  // rotary_dim in whole vectors
  s.head_dim = pick<int64_t>(rng, {16, 32, 48, 64, 80, 96, 128, 192, 256, 320});
  const int64_t most = std::min<int64_t>(s.head_dim, 2 * detail::cuda::kFastMaxPairs) / unit;
  s.rotary_dim = (rng() % 2 == 0 ? most : uniform(rng, 1, most)) * unit;
  const int64_t free_vectors = (s.head_dim - s.rotary_dim) / lanes;
  s.rotary_offset = pick<int64_t>(rng, {0, 0, free_vectors, uniform(rng, 0, free_vectors)}) * lanes;
  random_frequencies(s, rng);
  validate(s);
  c.dtype = dtype;
  c.head_dim = s.head_dim;
  c.batch = uniform(rng, 1, 3);
  c.seq = uniform(rng, 1, 9);
  c.heads_q = pick<int64_t>(rng, {1, 2, 3, 5, 8, 0});
  c.heads_k = pick<int64_t>(rng, {0, 1, 2, 4});
  if (c.heads_q == 0 && c.heads_k == 0) c.heads_k = 1;
  c.in_order = pick(rng, {0, 1, 5});
  c.out_order = pick(rng, {0, 1, 5});
  c.k_order = pick(rng, {0, 1});
  c.k_out_order = pick(rng, {0, 1});
  c.q_in_place = rng() % 2 == 0;
  c.k_in_place = rng() % 2 == 0;
  c.copy_tail = rng() % 4 != 0;
  c.direction = rng() % 2 == 0 ? Direction::forward : Direction::inverse;
  const int source = static_cast<int>(rng() % 3);  // a table, exact angles, the caller's
  c.table = source == 0;
  if (source == 2) random_caller_angles(c, rng);
  random_positions(c, rng);
  // A few views off the 16-byte grid (one element, half a vector): the general kernel's.
  if (rng() % 10 == 0) c.shift = pick<int64_t>(rng, {1, lanes / 2});
  c.default_shape = rng() % 2 == 0;
  if (!c.default_shape) {
    const int64_t tokens = c.batch * c.seq;
    c.shape.blocks = pick<int64_t>(rng, {1, 2, 3, tokens, tokens + 2});
    c.shape.threads = pick(rng, {1, 7, 32, 33, 64, 256});
    c.shape.shared_angles = rng() % 2 == 0;
  }
  lay_out(c);
  return c;
}

detail::cuda::FastShape random_fast_shape(const detail::KernelArgs& args, std::mt19937_64& rng) {
  using namespace detail::cuda;
  FastShape shape;
  shape.chunks = fast_chunks(args);
  const int max_rows = kFastMaxThreads / shape.chunks;
  int max_shift = 0;
  while (max_shift < kFastMaxTileShift && (2 << max_shift) <= max_rows) ++max_shift;
  shape.tile_shift = static_cast<int>(uniform(rng, 0, max_shift));
  const int tile = 1 << shape.tile_shift;
  const int64_t heads = args.operands[0].heads + (args.operand_count > 1 ? args.operands[1].heads : 0);
  shape.group_heads = static_cast<int>(uniform(rng, 1, std::max<int64_t>(heads, 1)));
  shape.groups = static_cast<int>((heads + shape.group_heads - 1) / shape.group_heads);
  shape.rows = tile * static_cast<int>(uniform(rng, 1, max_rows / tile));
  const int64_t tiles = (args.tokens + tile - 1) / tile;
  shape.grid = uniform(rng, 1, std::max<int64_t>(tiles, 1));
  return shape;
}

Call model_call(const Spec& spec, DType dtype, int64_t heads_q, int64_t heads_k) {
  Call c;
  c.schedule = make_schedule(spec);
  c.dtype = dtype;
  c.head_dim = spec.head_dim;
  c.batch = 2;
  c.seq = 3;
  c.heads_q = heads_q;
  c.heads_k = heads_k;
  c.in_order = 5;  // q and k as slices of the model's fused QKV projection
  return c;
}

std::vector<std::string> features(const Call& c) {
  std::vector<std::string> f = {std::string(to_string(c.dtype)), std::string(to_string(c.schedule.channel_layout())),
                                c.table ? "table" : c.caller ? "caller angles" : "exact",
                                c.direction == Direction::inverse ? "inverse" : "forward",
                                "positions kind " + std::to_string(static_cast<int>(c.kind)),
                                std::string("in ") + order_name(c.in_order),
                                std::string("out ") + order_name(c.out_order)};
  if (c.q_in_place || c.k_in_place) f.push_back("in place");
  if (!c.q_in_place || (c.heads_k > 0 && !c.k_in_place)) f.push_back("out of place");
  if (c.heads_k > 0) f.push_back("q and k");
  if (c.schedule.xpos()) f.push_back(c.heads_k > 0 ? "xpos, q and k" : "xpos");
  if (c.heads_q == 0) f.push_back("q empty");
  if (c.schedule.rotary_dim < c.head_dim) f.push_back(c.copy_tail ? "partial, tail copied" : "partial, no tail copy");
  if (c.schedule.rotary_offset > 0) f.push_back("rotary_offset");
  if (c.schedule.streams > 1) f.push_back(c.position_streams > 1 ? "streams" : "streams, one given");
  if (c.broadcast) f.push_back("broadcast positions");
  if (!c.default_shape && !c.shape.shared_angles) f.push_back("per-item angles");
  if (!c.default_shape && c.shape.blocks < c.batch * c.seq) f.push_back("grid-stride tokens");
  if (!c.default_shape && c.shape.threads % 32 != 0) f.push_back("odd block size");
  if (c.caller) {
    f.push_back(c.per_position() ? "angles per_position" : "angles per_token");
    f.push_back(std::string("angles ") + columns_name(c.angle_columns));
    f.push_back("angles " + std::string(to_string(c.angle_dtype)));
    f.push_back(c.angle_rows_alias ? "angles rows aliased" : std::string("angles ") + angle_order_name(c.angle_order));
    if (c.angle_broadcast) f.push_back("angles broadcast");
    if (c.per_position() && c.schedule.streams > 1) f.push_back("angles per_position, streams");
    if (c.per_position() && c.angle_rows < c.seq) f.push_back("angles fewer rows than seq");
  }
  return f;
}

// ---- The cases ----

std::vector<SeededCall> random_calls(int count) {
  std::mt19937_64 rng(2026);
  std::vector<SeededCall> calls;
  for (int i = 0; i < count; ++i) {
    Call c = random_call(rng, pick(rng, {DType::f32, DType::f16, DType::bf16, DType::f64}));
    calls.push_back({.call = std::move(c), .seed = static_cast<uint64_t>(i)});
  }
  return calls;
}

std::vector<SeededCall> fast_calls(int count) {
  std::mt19937_64 rng(2027);
  std::vector<SeededCall> calls;
  for (int i = 0; i < count; ++i) {
    Call c = random_fast_call(rng, pick(rng, {DType::f32, DType::f16, DType::bf16}));
    calls.push_back({.call = std::move(c), .seed = static_cast<uint64_t>(50000 + i)});
  }
  return calls;
}

void expect_fast_coverage(const std::vector<SeededCall>& calls, int floor) {
  std::map<std::string, int> seen;
  for (const SeededCall& s : calls) {
    for (const std::string& f : features(s.call)) ++seen[f];
    if (s.call.shift != 0) ++seen["views off the 16-byte grid"];
    if (s.call.seq > 1 && s.call.batch > 1) ++seen["batch and seq"];
  }
  const char* expected[] = {"f32", "f16", "bf16", "half", "interleaved", "table", "exact", "caller angles", "inverse",
                            "forward", "positions kind 0", "positions kind 1", "positions kind 2",
                            "positions kind 3", "positions kind 4", "in bshd", "in bhsd", "in fused-qkv",
                            "out fused-qkv", "in place", "out of place", "q and k", "q empty",
                            "partial, tail copied", "partial, no tail copy", "rotary_offset", "streams",
                            "streams, one given", "broadcast positions", "angles per_position", "angles per_token",
                            "angles pairs", "angles halves", "angles repeated", "angles rows aliased",
                            "angles broadcast", "views off the 16-byte grid", "batch and seq"};
  for (const char* f : expected) EXPECT_GE(seen[f], floor) << f;
  std::string summary;
  for (const auto& [f, n] : seen) summary += f + " " + std::to_string(n) + ", ";
  std::printf("%zu fast-sweep calls: %s\n", calls.size(), summary.c_str());
}

void expect_coverage(const std::vector<SeededCall>& calls, int floor, bool launch_shapes) {
  std::map<std::string, int> seen;
  for (const SeededCall& s : calls) {
    for (const std::string& f : features(s.call)) ++seen[f];
  }
  const char* expected[] = {"f32", "f16", "bf16", "f64", "half", "interleaved", "block_half", "table", "exact",
                            "inverse", "forward", "positions kind 0", "positions kind 1", "positions kind 2",
                            "positions kind 3", "positions kind 4", "in bshd", "in bhsd", "in seq,d reversed",
                            "in strided d", "in all negative", "in fused-qkv", "out fused-qkv", "in place",
                            "out of place", "q and k", "q empty", "partial, tail copied", "partial, no tail copy",
                            "rotary_offset", "streams", "streams, one given", "broadcast positions",
                            "caller angles", "angles per_position", "angles per_token", "angles pairs",
                            "angles halves", "angles repeated", "angles f32", "angles f16", "angles bf16",
                            "angles f64", "angles contiguous", "angles cos|sin rows in one buffer",
                            "angles rows,columns reversed", "angles strided columns with gaps",
                            "angles column-major, batch reversed", "angles rows aliased", "angles broadcast",
                            "angles per_position, streams", "angles fewer rows than seq", "xpos", "xpos, q and k"};
  for (const char* f : expected) EXPECT_GE(seen[f], floor) << f;
  // The emulated launch shapes' (the device always launches launch_shape's).
  const std::vector<std::string> launch = {"per-item angles", "grid-stride tokens", "odd block size"};
  if (launch_shapes) {
    for (const std::string& f : launch) EXPECT_GE(seen[f], floor) << f;
  }
  std::string summary;
  for (const auto& [f, n] : seen) {
    if (launch_shapes || std::find(launch.begin(), launch.end(), f) == launch.end()) {
      summary += f + " " + std::to_string(n) + ", ";
    }
  }
  std::printf("%zu calls: %s\n", calls.size(), summary.c_str());
}

std::vector<SeededCall> undo_calls(int count) {
  std::mt19937_64 rng(2028), fast_rng(2029);
  std::vector<SeededCall> calls;
  for (int i = 0; static_cast<int>(calls.size()) < count; ++i) {
    const bool fast = i % 2 == 1;
    Call c = fast ? random_fast_call(fast_rng, pick(fast_rng, {DType::f32, DType::f16, DType::bf16}))
                  : random_call(rng, pick(rng, {DType::f32, DType::f16, DType::bf16, DType::f64}));
    if (c.caller || (c.table && c.schedule.attention_factor != 1.0)) continue;  // apply refuses them
    c.undo = true;
    calls.push_back({.call = std::move(c), .seed = static_cast<uint64_t>(70000 + i)});
  }
  return calls;
}

std::vector<SeededCall> hf_float32_calls(int count) {
  std::mt19937_64 rng(2030), fast_rng(2031);
  std::vector<SeededCall> calls;
  for (int i = 0; static_cast<int>(calls.size()) < count; ++i) {
    const bool fast = i % 2 == 1;
    Call c = fast ? random_fast_call(fast_rng, pick(fast_rng, {DType::f32, DType::f16, DType::bf16}))
                  : random_call(rng, pick(rng, {DType::f32, DType::f16, DType::bf16, DType::f64}));
    const bool fractional = !c.table && (c.kind == Positions::Kind::per_token_f32 ||
                                         c.kind == Positions::Kind::per_token_f64);
    if (c.caller || fractional) continue;  // apply refuses them
    c.hf_float32 = true;
    calls.push_back({.call = std::move(c), .seed = static_cast<uint64_t>(90000 + i)});
  }
  return calls;
}

std::vector<SeededCall> special_value_calls() {
  std::mt19937_64 rng(7);
  std::vector<SeededCall> calls;
  for (int i = 0; i < 200; ++i) {
    Call c = random_call(rng, pick(rng, {DType::f32, DType::f16, DType::bf16, DType::f64}));
    c.special_values = true;
    calls.push_back({.call = std::move(c), .seed = static_cast<uint64_t>(1000 + i)});
  }
  return calls;
}

std::vector<SeededCall> real_model_calls() {
  struct Model {
    const char* name;
    Spec spec;
    int64_t heads_q, heads_k;
  };
  const Model models[] = {
      // Llama-3.1-8B: 32 q heads, 8 kv heads, head_dim 128, llama3 scaling
      {"Llama-3.1-8B", Spec{.head_dim = 128, .base = 500000, .schedule = ScheduleType::llama3, .factor = 8.0,
                            .original_max_position = 8192, .low_freq_factor = 1.0, .high_freq_factor = 4.0},
       32, 8},
      // Qwen2-VL-7B: M-RoPE sections [16, 24, 24] over 64 pairs, 28 q heads, 4 kv heads
      {"Qwen2-VL-7B", Spec{.head_dim = 128, .base = 1e6, .stream_layout = StreamLayout::sections,
                           .sections = {16, 24, 24}},
       28, 4},
      // Qwen3-VL: interleaved M-RoPE sections [24, 20, 20]
      {"Qwen3-VL", Spec{.head_dim = 128, .base = 5e6, .stream_layout = StreamLayout::interleaved_sections,
                        .sections = {24, 20, 20}},
       32, 8},
      // GLM-4.1V: partial rotary (64 of 128), interleaved pairs, sections [8, 12, 12]
      {"GLM-4.1V", Spec{.head_dim = 128, .rotary_dim = 64, .pairing = Pairing::interleaved,
                        .stream_layout = StreamLayout::sections, .sections = {8, 12, 12}},
       32, 2},
      // nope-first (DeepSeek-V4's layout): the rotated 64 channels last in a 192-wide head
      {"nope-first", Spec{.head_dim = 192, .rotary_dim = 64, .pairing = Pairing::interleaved, .rotary_offset = 128},
       16, 1},
      // Gemma 4's vision tower layout: block_half(2), one block per image axis, base 100
      {"block_half(2) axial", Spec{.head_dim = 64, .base = 100, .blocks = 2, .stream_layout = StreamLayout::axial,
                                   .sections = {16, 16}},
       12, 12},
      // YaRN (factor 4, as Qwen2.5 long context), attention factor != 1
      {"YaRN x4", Spec{.head_dim = 128, .base = 1e6, .schedule = ScheduleType::yarn, .factor = 4.0,
                       .original_max_position = 32768},
       28, 4},
  };
  std::mt19937_64 rng(11);
  std::vector<SeededCall> calls;
  for (const Model& m : models) {
    for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
      // exact angles, a table, vLLM's per-position cos/sin cache (float32 [rows, rotary_dim],
      // halves; M-RoPE reads row p of each pair's stream), transformers' per-token cos/sin in
      // the model's dtype ([batch, seq, rotary_dim], halves, or repeated for interleaved pairs)
      for (int source : {0, 1, 2, 3}) {
        for (Direction direction : {Direction::forward, Direction::inverse}) {
          Call c = model_call(m.spec, dtype, m.heads_q, m.heads_k);
          c.direction = direction;
          c.q_in_place = c.k_in_place = direction == Direction::forward;
          c.out_order = 5;
          c.table = source == 1;
          c.caller = source >= 2;
          const int streams = c.schedule.streams;
          if (source == 2) {
            c.angle_index = CallerAngles::Index::per_position;
            c.angle_rows = 1024;
            per_token_positions(c, streams, [&](int64_t) { return pick<int64_t>(rng, {0, 1023, uniform(rng, 0, 1023)}); });
          } else if (source == 3) {
            c.angle_dtype = dtype;
            c.angle_columns = m.spec.pairing == Pairing::interleaved ? CallerAngles::Columns::repeated
                                                                      : CallerAngles::Columns::halves;
            per_token_positions(c, streams, [&](int64_t) { return uniform(rng, 0, max_position_limit - 1); });
          } else if (c.table) {
            c.table_first = max_position_limit - 64;  // the last rows of the context
            c.table_rows = 64;
            per_token_positions(c, streams, [&](int64_t) { return c.table_first + uniform(rng, 0, 63); });
          } else {
            per_token_positions(c, streams, [&](int64_t i) {
              return pick<int64_t>(rng, {0, 1, 8191, 8192, 131072, 1 << 20, max_position_limit - 1,
                                         uniform(rng, 0, max_position_limit - 1), i});
            });
          }
          lay_out(c);
          const uint64_t seed = rng();
          calls.push_back({.call = std::move(c), .seed = seed, .model = m.name});
        }
      }
    }
  }
  return calls;
}

std::vector<SeededCall> whole_range_calls() {
  Call c = model_call(Spec{.head_dim = 128, .base = 500000}, DType::f32, 3, 1);
  std::vector<int64_t> positions = {0, 1, 2, 131071, 131072, max_position_limit - 2, max_position_limit - 1};
  for (int e = 3; e <= 30; e += 3) {
    for (int64_t d : {-1, 0, 1}) positions.push_back((int64_t{1} << e) + d);
  }
  for (double f : {c.schedule.inv_freq[0], c.schedule.inv_freq[1], c.schedule.inv_freq[40]}) {
    for (int64_t p : near_quarter_turns(f, max_position_limit)) positions.push_back(p);
  }
  c.batch = 1;
  c.seq = static_cast<int64_t>(positions.size());
  std::vector<SeededCall> calls;
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    c.dtype = dtype;
    per_token_positions(c, 1, [&](int64_t i) { return positions[static_cast<size_t>(i)]; });
    lay_out(c);
    calls.push_back({.call = c, .seed = 5});
  }
  return calls;
}

std::vector<SeededCall> whole_range_angle_calls() {
  std::mt19937_64 rng(17);
  std::vector<SeededCall> calls;
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    Call c = model_call(Spec{.head_dim = 128, .base = 5e6, .stream_layout = StreamLayout::interleaved_sections,
                             .sections = {24, 20, 20}},  // Qwen3-VL
                        dtype, 4, 2);
    c.caller = true;
    c.angle_index = CallerAngles::Index::per_position;
    c.angle_dtype = pick(rng, {DType::f32, DType::f64});
    c.angle_rows_alias = true;
    c.angle_rows = max_position_limit;
    per_token_positions(c, 3, [&](int64_t i) {
      return i % 3 == 0 ? max_position_limit - 1 : uniform(rng, 0, max_position_limit - 1);
    });
    lay_out(c);
    calls.push_back({.call = std::move(c), .seed = 21});
  }
  return calls;
}

// ---- Unusable positions ----

std::vector<BadPosition> bad_positions() {
  using enum BadPosition::Source;
  const double limit = static_cast<double>(max_position_limit);
  return {
      {exact, Positions::Kind::per_token_i64, -1, detail::kPositionOutOfRange},
      {exact, Positions::Kind::per_token_i64, limit, detail::kPositionOutOfRange},
      {exact, Positions::Kind::per_token_i32, -2147483648.0, detail::kPositionOutOfRange},
      {exact, Positions::Kind::per_token_f64, NAN, detail::kPositionOutOfRange},
      {exact, Positions::Kind::per_token_f32, -0.5, detail::kPositionOutOfRange},
      {table, Positions::Kind::per_token_i64, 999, detail::kPositionNotInTable},   // below the rows
      {table, Positions::Kind::per_token_i64, 1008, detail::kPositionNotInTable},  // past the rows
      {table, Positions::Kind::per_token_f64, 1001.5, detail::kPositionNotInTable},
      {table, Positions::Kind::per_token_i64, -5, detail::kPositionOutOfRange},
      {angles, Positions::Kind::per_token_i64, 1008, detail::kPositionNotInAngles},  // rows
      {angles, Positions::Kind::per_token_i32, 2147483647.0, detail::kPositionNotInAngles},
      {angles, Positions::Kind::per_token_f64, 1001.5, detail::kPositionNotInAngles},
      {angles, Positions::Kind::per_token_f32, 0.25, detail::kPositionNotInAngles},
      {angles, Positions::Kind::per_token_i64, -1, detail::kPositionOutOfRange},
      {angles, Positions::Kind::per_token_i64, limit, detail::kPositionOutOfRange},
      {angles, Positions::Kind::per_token_f64, NAN, detail::kPositionOutOfRange},
      {xpos, Positions::Kind::per_token_i64, 5200, detail::kPositionBeyondXposReach},
      {xpos, Positions::Kind::per_token_f64, 4087.5, detail::kPositionBeyondXposReach},
      {xpos, Positions::Kind::per_token_i64, -1, detail::kPositionOutOfRange},
  };
}

Call bad_position_call(const BadPosition& bad) {
  Call c = model_call(Spec{.head_dim = 64, .rotary_dim = 48, .stream_layout = StreamLayout::sections,
                           .sections = {8, 8, 8}},
                      DType::f32, 3, 1);
  if (bad.source == BadPosition::xpos) c.schedule = with_xpos(c.schedule, 64.0, 0.0);
  c.q_in_place = false;  // q out of place (skipped: poison stays), k in place (input stays)
  c.table = bad.source == BadPosition::table;
  c.table_first = 1000;
  c.table_rows = 8;
  c.caller = bad.source == BadPosition::angles;
  c.angle_index = CallerAngles::Index::per_position;
  c.angle_columns = CallerAngles::Columns::pairs;
  c.angle_rows = 1008;
  c.kind = bad.kind;
  c.position_streams = 3;
  const int64_t n = 3 * c.batch * c.seq;
  for (int64_t i = 0; i < n; ++i) {
    c.p32.push_back(static_cast<int32_t>(1000 + i % 8));
    c.p64.push_back(1000 + i % 8);
    c.pf32.push_back(static_cast<float>(1000 + i % 8));
    c.pf64.push_back(static_cast<double>(1000 + i % 8));
  }
  lay_out(c);
  return c;
}

void make_position_bad(Call& c, const BadPosition& bad, int stream) {
  const size_t at = static_cast<size_t>(stream * c.batch * c.seq + kBadToken);
  switch (bad.kind) {  // only the kind in use: a NaN or 2^31 has no int32 (the cast would be UB)
    case Positions::Kind::per_token_i32: c.p32[at] = static_cast<int32_t>(bad.value); break;
    case Positions::Kind::per_token_i64: c.p64[at] = static_cast<int64_t>(bad.value); break;
    case Positions::Kind::per_token_f32: c.pf32[at] = static_cast<float>(bad.value); break;
    default: c.pf64[at] = bad.value; break;
  }
}

void keep_skipped_token(const Call& c, const std::vector<Arena>& start, std::vector<Arena>& want) {
  const int64_t b = kBadToken / c.seq, s = kBadToken % c.seq;
  const auto es = static_cast<size_t>(size_of(c.dtype));
  for (const Placed* out : {&c.q_out, &c.q, &c.k_out, &c.k}) {
    if (out->arena < 0) continue;
    for (int64_t h = 0; h < out->shape[2]; ++h) {
      for (int64_t d = 0; d < c.head_dim; ++d) {
        const int64_t e = out->element(b, s, h, d);
        std::memcpy(want[static_cast<size_t>(out->arena)].at(e), start[static_cast<size_t>(out->arena)].at(e), es);
      }
    }
  }
}

}  // namespace rotary::test
