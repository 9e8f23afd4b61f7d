// The cases of the CUDA kernels' tests, shared by the host emulation of the kernels' grid
// (test_cuda_emulation) and the runs on a device (test_cuda_device), so that both check the same
// calls with the same seeds. A Call is one rotary::apply call described as data (schedule, dtype,
// shapes, memory orders, positions, angle source, launch shape), laid out over arenas: buffers of
// elements with guard zones before and after, poisoned with NaN patterns so that a missed write
// shows. The reference backend's result over copies of the arenas is what every kernel must
// produce, byte for byte (NaNs compared as NaN). No CUDA call here: this builds with or without a
// CUDA toolkit.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cuda/fast_body.hpp"
#include "cuda/rope_body.hpp"
#include "rotary/apply.hpp"
#include "rotary/spec.hpp"
#include "rotary/table.hpp"
#include "support/oracle.hpp"

namespace rotary::test {

// ---- Memory: arenas of elements with guard zones, poisoned ----

/// A NaN of each dtype (one pattern for f16 and bf16) that no rotation produces.
uint64_t poison_bits(DType dtype);

/// Elements before and after every arena: 16 of them, so that element 0 lies 16-byte aligned (the
/// arena's bytes start 64-byte aligned on the host, 256-byte aligned in cudaMalloc's memory), as a
/// fast kernel needs (src/cuda/fast_body.hpp); Call::shift moves the views off that alignment.
inline constexpr int64_t kGuard = 16;

/// Bytes on 64-byte boundaries (a std::vector's allocation is 16-byte aligned at best).
template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  template <class U>
  bool operator==(const Aligned64<U>&) const { return true; }
};
using Bytes = std::vector<unsigned char, Aligned64<unsigned char>>;

/// `elements` elements of `dtype` between two guards of kGuard elements, every one poisoned.
/// Element e (guards: -kGuard .. -1 and elements .. elements + kGuard - 1) lies at at(e).
struct Arena {
  DType dtype = DType::f32;
  int64_t elements = 0;
  Bytes bytes;

  Arena(DType t, int64_t n);
  unsigned char* at(int64_t element) { return bytes.data() + (kGuard + element) * size_of(dtype); }
  const unsigned char* at(int64_t element) const { return bytes.data() + (kGuard + element) * size_of(dtype); }
  void set(int64_t element, float v) { store_element(dtype, at(element), v); }
  /// v itself in an f64 arena (every bit of a double), else v rounded to the arena's dtype.
  void set_double(int64_t element, double v);
  double get(int64_t element) const { return load_element(dtype, at(element)); }
};

/// A [batch, seq, heads, head_dim] view placed in an arena: element (b, s, h, d) at
/// offset + b*strides[0] + s*strides[1] + h*strides[2] + d*strides[3].
struct Placed {
  int arena = -1;  ///< -1: absent
  int64_t offset = 0;
  std::array<int64_t, 4> shape{};
  std::array<int64_t, 4> strides{};
  int64_t element(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return offset + b * strides[0] + s * strides[1] + h * strides[2] + d * strides[3];
  }
};

/// The caller's cos or sin placed in an arena: element (i0, i1, column) at
/// offset + i0*strides[0] + i1*strides[1] + column*strides[2].
struct PlacedAngles {
  int arena = -1;
  int64_t offset = 0;
  std::array<int64_t, 3> strides{};
  int64_t element(int64_t i0, int64_t i1, int64_t column) const {
    return offset + i0 * strides[0] + i1 * strides[1] + column * strides[2];
  }
};

/// Names of the memory orders of q and k (0..5) and of the caller's cos/sin (0..4).
const char* order_name(int order);
const char* angle_order_name(int order);
const char* columns_name(CallerAngles::Columns columns);

// ---- One call: schedule, views, positions, angles, launch ----

struct Call {
  Schedule schedule;
  DType dtype = DType::f32;
  int64_t batch = 1, seq = 1, heads_q = 1, heads_k = 0, head_dim = 2;
  int in_order = 0, out_order = 0;  // 5: q and k slices of one fused [b, s, hq + 2hk, d] buffer
  int k_order = -1, k_out_order = -1;  // k's and k_out's own orders (0..4); -1: derived from q's
  int64_t shift = 0;  // elements every view of an arena of its own is moved by (off 16-byte alignment)
  bool q_in_place = true, k_in_place = true, copy_tail = true;
  Direction direction = Direction::forward;
  bool undo = false;  // ApplyArgs::undo: 1/g, xPos σ^-1, the other way round
  bool hf_float32 = false;  // ApplyArgs::numerics hf_float32: transformers' float32 angles (a table of
                            // that mode, or on the fly)
  Positions::Kind kind = Positions::Kind::sequential;
  int64_t offset = 0;
  int position_streams = 1;
  bool broadcast = false;  // per-token count = seq (one row for every batch row)
  std::vector<int32_t> p32;
  std::vector<int64_t> p64;
  std::vector<float> pf32;
  std::vector<double> pf64;
  bool table = false;
  int64_t table_first = 0, table_rows = 0;
  // The caller's cos/sin (ApplyArgs::angles) instead of a table or exact angles.
  bool caller = false;
  CallerAngles::Index angle_index = CallerAngles::Index::per_token;
  CallerAngles::Columns angle_columns = CallerAngles::Columns::halves;
  DType angle_dtype = DType::f32;
  bool angle_broadcast = false;     // per_token: [1, seq, width], one row set for every batch row
  int64_t angle_rows = 0;           // per_position
  int angle_order = 0;              // angle_order_name
  bool angle_rows_alias = false;    // per_position: row stride 0 (every row one memory), so rows
                                    // may reach 2^31 in a few bytes
  // The general kernel's launch the emulation plays (the device launches detail::cuda::launch_shape's
  // for cuda::apply, this one when the tests run the general kernel themselves).
  bool default_shape = true;
  detail::cuda::LaunchShape shape;
  bool special_values = false;  // inputs from zeros, infinities, NaN, subnormals, overflow edges

  std::vector<int64_t> arena_sizes;
  std::vector<DType> arena_types;
  Placed q, k, q_out, k_out;
  PlacedAngles cos_at, sin_at;

  bool per_position() const { return caller && angle_index == CallerAngles::Index::per_position; }
  int64_t angle_width() const {
    return angle_columns == CallerAngles::Columns::pairs ? schedule.pairs() : schedule.rotary_dim;
  }
  std::array<int64_t, 3> angle_shape() const {
    if (per_position()) return {1, angle_rows, angle_width()};
    return {angle_broadcast ? 1 : batch, seq, angle_width()};
  }
  std::string describe() const;
};

/// Lays out the views of `c` (in arenas numbered from 0) from its shapes and orders, and the
/// caller's cos/sin in arenas of their own after them.
void lay_out(Call& c);

/// Arenas poisoned, the inputs' elements (q, k and the caller's cos/sin) set to random normals (or
/// special values) drawn from `seed`.
std::vector<Arena> make_arenas(const Call& c, uint64_t seed);

/// The host Table of `c` (Table::range(schedule, table_first, table_rows)), if it reads one.
std::optional<Table> table_of(const Call& c);

/// `arenas` after rotary::apply's scalar reference (Backend::reference) ran `c` over them.
std::vector<Arena> reference_result(const Call& c, std::vector<Arena> arenas);

/// The per-token positions of `c` of its kind (p32, p64, pf32 or pf64): their first entry and
/// size in bytes; null and 0 when sequential.
const void* position_data(const Call& c);
size_t position_bytes(const Call& c);
/// The positions of `c`, per-token entries read from `data` (host or device memory).
Positions positions_at(const Call& c, const void* data);

/// Where the arenas of a call lie: arena a's first byte (its leading guard) at bases[a], in host or
/// device memory.
using ArenaBases = std::vector<unsigned char*>;
ArenaBases bases_of(std::vector<Arena>& arenas);

/// The call's arguments over arenas at `bases`, with `positions` and `table`; with caller angles,
/// `angles` receives them (it must outlive the arguments). Backend::reference.
ApplyArgs args_at(const Call& c, const ArenaBases& bases, const Positions& positions, const Table* table,
                  CallerAngles* angles);
/// args_at over host arenas and the call's own positions.
ApplyArgs args_of(const Call& c, std::vector<Arena>& arenas, const Table* table, CallerAngles* angles = nullptr);

/// The first element of any arena (guards and gaps included) that differs from the reference,
/// named by the views that hold it; empty when none does. NaNs compare as NaN: which operand's
/// payload and sign a NaN result carries is up to the compiler's operand order (and a GPU makes
/// canonical NaNs); every other value bit for bit.
std::string first_difference(const Call& c, const std::vector<Arena>& got, const std::vector<Arena>& want);

// ---- Random calls ----

template <class T>
T pick(std::mt19937_64& rng, std::initializer_list<T> values) {
  return *(values.begin() + static_cast<std::ptrdiff_t>(rng() % values.size()));
}
inline int64_t uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

/// A random call: a hand-built descriptor (any layout, partial rotary at any offset, 1-4 streams),
/// q and k with odd head counts in any memory order, in or out of place, either direction, a table,
/// exact or the caller's angles, xPos, any position kind across [0, 2^31), a random launch shape.
Call random_call(std::mt19937_64& rng, DType dtype);

/// Per-token positions, `streams` rows of batch * seq entries, drawn by `draw`.
template <class Draw>
void per_token_positions(Call& c, int streams, Draw draw) {
  c.kind = Positions::Kind::per_token_i64;
  c.position_streams = streams;
  c.p64.clear();
  for (int64_t i = 0; i < streams * c.batch * c.seq; ++i) c.p64.push_back(draw(i));
}

/// A random call the fast kernels can take (src/cuda/fast_body.hpp's choose_kernel; most of them:
/// a few are moved off alignment, Call::shift, or given an odd view): f32, f16 or bf16, half or
/// interleaved pairing, the rotated slice in whole 16-byte vectors at any vector offset, q and k
/// in bshd, bhsd or fused-QKV order, every angle source and position kind, no xPos.
Call random_fast_call(std::mt19937_64& rng, DType dtype);

/// A launch shape of the fast kernels for `args` drawn from `rng`: any tile size, rows, head
/// groups, and grids smaller than the tiles (blocks looping over them).
detail::cuda::FastShape random_fast_shape(const detail::KernelArgs& args, std::mt19937_64& rng);

/// A model's call: batch 2, seq 3, q and k as slices of the model's fused QKV projection.
Call model_call(const Spec& spec, DType dtype, int64_t heads_q, int64_t heads_k);

/// What a call exercises, for the sweep's coverage count.
std::vector<std::string> features(const Call& c);

// ---- The cases, each generated from its own seeds ----

/// A call and the seed of its arenas' values.
struct SeededCall {
  Call call;
  uint64_t seed = 0;
  const char* model = "";  ///< real_model_calls: the model's name
};

inline constexpr int kRandomCalls = 4000;

/// The first `count` calls of the sweep: random_call over every dtype (seed 2026), arenas from
/// seed i.
std::vector<SeededCall> random_calls(int count = kRandomCalls);

/// Every feature of the sweep's calls came up at least `floor` times (with `launch_shapes`, the
/// features of the emulated launch shapes too); prints the counts.
void expect_coverage(const std::vector<SeededCall>& calls, int floor, bool launch_shapes);

inline constexpr int kFastCalls = 1500;

/// random_fast_call over f32, f16 and bf16 (seed 2027), arenas from seed 50000 + i.
std::vector<SeededCall> fast_calls(int count = kFastCalls);

/// Every feature of the fast sweep's calls came up at least `floor` times; prints the counts.
void expect_fast_coverage(const std::vector<SeededCall>& calls, int floor);

/// Random calls whose inputs and caller cos/sin are zeros, infinities, NaN, subnormals and values
/// near each format's overflow.
std::vector<SeededCall> special_value_calls();

/// ApplyArgs::undo over the sweep's calls and the fast sweep's (seeds 2028, 2029): every call
/// that may take it (no caller angles; a table only where the attention factor is 1), xPos in
/// about a quarter, half through random_fast_call.
std::vector<SeededCall> undo_calls(int count = 600);

/// ApplyArgs::numerics = hf_float32 over the sweep's calls and the fast sweep's (seeds 2030, 2031):
/// every call that may take it (whole positions, no caller angles), half with a table of that mode
/// and half computed on the fly.
std::vector<SeededCall> hf_float32_calls(int count = 600);

/// Shapes and settings of real models (Llama-3.1-8B, Qwen2-VL, Qwen3-VL, GLM-4.1V, nope-first,
/// block_half(2) axial, YaRN) in bf16, f16 and f32, with exact angles, a table at the end of the
/// context, per-position and per-token caller cos/sin, forward in place and inverse out of place.
std::vector<SeededCall> real_model_calls();

/// Exact angles at positions where float32 angles break down: the ends of the range, powers of two
/// and their neighbours, the positions whose angle falls closest to a multiple of π/2.
std::vector<SeededCall> whole_range_calls();

/// Per-position caller cos/sin with rows up to 2^31 (row stride 0): every position below 2^31.
std::vector<SeededCall> whole_range_angle_calls();

// ---- Unusable per-token positions: skipped by the kernels and flagged ----

/// One unusable position and the error bit (detail::kPosition*) it sets.
struct BadPosition {
  enum Source { exact, table, angles, xpos };  // angles: per_position, rows 0 .. 1007; xpos: exact
                                               // angles, gamma 64 (reach 4087), centre 0
  Source source;
  Positions::Kind kind;
  double value;
  uint32_t bit;
};
std::vector<BadPosition> bad_positions();

/// The token (batch 1, seq position 1) whose position make_position_bad spoils.
inline constexpr int64_t kBadToken = 4;

/// The call of `bad` (M-RoPE, three streams, f32, q out of place, k in place), every position
/// usable: table rows and per-position angle rows 1000 .. 1007.
Call bad_position_call(const BadPosition& bad);
/// Puts bad.value at token kBadToken of position stream `stream` (only in the kind in use: a NaN
/// or 2^31 has no int32).
void make_position_bad(Call& c, const BadPosition& bad, int stream);
/// The reference `want` (every position usable) with the outputs of token kBadToken as they were in
/// `start`: a skipped token's outputs keep what they held before the call.
void keep_skipped_token(const Call& c, const std::vector<Arena>& start, std::vector<Arena>& want);

}  // namespace rotary::test
