// Internal: the fast CUDA kernels' body and the host's choice between them and the general kernel
// (src/cuda/rope_body.hpp). Written once as ROTARY_HD code over explicit (block, thread) indices,
// like the general body: nvcc compiles it for the device (src/cuda/apply.cu) and the host compiler
// plays it block by block, phase by phase (src/cuda/emulate.hpp), where the tests compare it bit for
// bit with the reference.
//
// What the fast kernels take (choose_kernel says why a call goes to the general kernel instead):
// f32, f16 or bf16 data; half or interleaved pairing (not block_half); no xPos; rotary_dim <= 256;
// every row of q, k and their outputs unit-strided along head_dim and 16-byte aligned (base
// pointers and every stride of a dimension longer than one, in bytes, multiples of 16); the rotated
// slice and the pass-through channels in whole 16-byte vectors (head_dim, rotary_offset and the
// pairing's partner distance multiples of V = 16 / element size: 4 floats, 8 halves); one token's
// offsets within 32 bits. Every angle source (a table, exact on the fly, the caller's cos/sin at any
// strides), every kind of positions (sequential, per token in int32/int64/f32/f64, broadcast, M-RoPE
// streams) and any count of tokens and heads.
//
// Work split. A block takes a tile of T tokens (T = 1, 2, 4 or 8) and a group of G consecutive heads
// of the concatenated head list [q heads, k heads] (all of them unless a small call is spread over
// the GPU). Its threads form a (chunks, rows) grid: thread (x, y) owns chunk slot x of every head it
// visits — slot x < C_rot is the x-th rotated chunk (half pairing: the 16-byte vector at channel
// offset + xV and its partner at offset + r/2 + xV, V pairs; interleaved: the vector at offset + xV,
// V/2 pairs), a slot beyond is a pass-through vector copied bit for bit (out-of-place operands with
// copy_tail) — and the token t = y mod T; its heads are y / T, y / T + rows / T, ... (rows a multiple
// of T, so a thread's token is fixed across the tile; no division by a run-time value but token /
// seq, done with a precomputed multiplier, Divmod64, once per thread and per angle cell of a tile).
// For each tile:
//   phase A (fast_phase_a): the thread loads its first head (FastThread::kPrefetch, held in
//           registers across the barrier, so that the load's latency overlaps the angles: a decode
//           call's only load), then fills shared memory with the tile's angle rows, one (token,
//           pair) cell at a time: (c, s) as float, already times the attention factor and signed for
//           the inverse (pair_angle, the general kernel's code: the same bits), and each token's
//           position error (its bit raised once; a skipped token is neither computed nor written);
//   barrier;
//   phase B (fast_phase_b): the thread reads its V (half) or V/2 (interleaved) angle cells once, the
//           same for every head it visits; rotates and stores the prefetched head, then the others
//           in batches of FastThread::kBatch (four vectors in flight: every load of a batch before
//           its first store);
//   barrier (the next tile overwrites shared memory).
// A 16-byte vector is loaded whole before any of it is stored and belongs to one thread, so in-place
// calls are race-free. Index arithmetic: a token's row addresses in 64 bits once per tile, offsets
// within a token in 32 bits (choose_kernel checks that they fit).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "rope_body.hpp"

namespace rotary::detail::cuda {

// ---- 64-bit division by an invariant divisor ----

/// The high 64 bits of a * b.
ROTARY_HD inline uint64_t mul_hi(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  __extension__ typedef unsigned __int128 Wide;
  return static_cast<uint64_t>((static_cast<Wide>(a) * b) >> 64);
#endif
}

/// n / d for any n < 2^64 and a fixed d in [1, 2^63] with one high multiply, two shifts and two
/// adds (Granlund and Montgomery, "Division by invariant integers using multiplication", 1994,
/// figure 4.1): l = ceil(log2 d), m = floor(2^64 (2^l - d) / d) + 1, t = mulhi(m, n),
/// q = (t + ((n - t) >> min(l, 1))) >> max(l - 1, 0). A 64-bit division on the GPU is a subroutine
/// of ~70 instructions; this is ~8.
struct Divmod64 {
  uint64_t divisor = 1;
  uint64_t magic = 1;
  uint32_t shift1 = 0;
  uint32_t shift2 = 0;

  /// Host code: the multiplier of d (1 <= d <= 2^63).
  static Divmod64 make(uint64_t d) {
    uint32_t l = 0;
    while (l < 63 && (uint64_t{1} << l) < d) ++l;
    __extension__ typedef unsigned __int128 Wide;
    const Wide numerator = static_cast<Wide>((uint64_t{1} << l) - d) << 64;
    return {.divisor = d, .magic = static_cast<uint64_t>(numerator / d) + 1, .shift1 = std::min<uint32_t>(l, 1),
            .shift2 = l > 0 ? l - 1 : 0};
  }
  ROTARY_HD uint64_t quotient(uint64_t n) const {
    const uint64_t t = mul_hi(magic, n);
    return (t + ((n - t) >> shift1)) >> shift2;
  }
};

// ---- 16-byte vectors ----

/// One 16-byte access: 4 floats or 8 halves, little-endian lanes (lane 2i in the low half of w[i]).
struct alignas(16) Vec16 {
  uint32_t w[4];
};

/// Loads and stores whole vectors: LDG.E.128 / STG.E.128 on the device (p is 16-byte aligned:
/// choose_kernel checked every base and stride); on the host a byte copy (no aliasing assumption
/// about memory written as elements).
ROTARY_HD inline Vec16 load_vec(const unsigned char* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const Vec16*>(p);
#else
  Vec16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}
ROTARY_HD inline void store_vec(unsigned char* p, const Vec16& v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<Vec16*>(p) = v;
#else
  std::memcpy(p, &v, sizeof v);
#endif
}

/// A vector's lanes as floats and back, per storage type (the shared conversions of src/half.hpp).
template <class T>
struct Lanes;
template <>
struct Lanes<float> {
  static constexpr int kCount = 4;
  using Bits = uint32_t;
  ROTARY_HD static void unpack(const Vec16& v, float (&x)[4]) {
    ROTARY_UNROLL
    for (int i = 0; i < 4; ++i) x[i] = float_from_bits(v.w[i]);
  }
  ROTARY_HD static Vec16 pack(const float (&x)[4]) {
    Vec16 v;
    ROTARY_UNROLL
    for (int i = 0; i < 4; ++i) v.w[i] = float_bits(x[i]);
    return v;
  }
};
template <class Half>
struct HalfLanes {
  static constexpr int kCount = 8;
  using Bits = uint16_t;
  ROTARY_HD static void unpack(const Vec16& v, float (&x)[8]) {
    ROTARY_UNROLL
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = Half::to_f32(static_cast<uint16_t>(v.w[i] & 0xffffu));
      x[2 * i + 1] = Half::to_f32(static_cast<uint16_t>(v.w[i] >> 16));
    }
  }
  ROTARY_HD static Vec16 pack(const float (&x)[8]) {
    Vec16 v;
    ROTARY_UNROLL
    for (int i = 0; i < 4; ++i) v.w[i] = Half::pack(x[2 * i], x[2 * i + 1]);
    return v;
  }
};
struct Bf16Conversions {
  ROTARY_HD static float to_f32(uint16_t h) { return bf16_to_f32(h); }
  ROTARY_HD static uint32_t pack(float lo, float hi) { return pack_bf16x2(lo, hi); }
};
struct F16Conversions {
  ROTARY_HD static float to_f32(uint16_t h) { return f16_to_f32_exact(h); }
  ROTARY_HD static uint32_t pack(float lo, float hi) { return pack_f16x2(lo, hi); }
};
template <>
struct Lanes<BF16> : HalfLanes<Bf16Conversions> {};
template <>
struct Lanes<F16> : HalfLanes<F16Conversions> {};

// ---- The host's choice of kernel ----

inline constexpr int64_t kFastMaxPairs = 128;      ///< rotary_dim <= 256 (launch parameters)
inline constexpr int kFastMaxThreads = 256;        ///< threads per block
inline constexpr int kFastMaxTileShift = 3;        ///< tiles of at most 8 tokens
inline constexpr int64_t kFastMaxGrid = int64_t{1} << 20;  ///< more tiles: blocks loop over them
inline constexpr int kFastMaxGroups = 65535;       ///< gridDim.y

enum class KernelKind { general, fast };

/// Why a call goes to the general kernel (none: it does not).
enum class GeneralReason {
  none,
  dtype,             ///< f64 data
  xpos,              ///< xPos scales differ between q and k
  pairing,           ///< block_half(B), B > 1
  rotary_dim,        ///< more than kFastMaxPairs pairs
  vector_split,      ///< head_dim, rotary_offset or the partner distance not in whole vectors
  channel_stride,    ///< a view's head_dim stride is not 1
  alignment,         ///< a view's data or a stride (of a dimension longer than 1) not 16-byte aligned
  index_range,       ///< one token's offsets do not fit in 32 bits
  chunks,            ///< more 16-byte chunks per head than threads in a block
};

/// The kernel that runs a call, and why not the fast one; `view` names the offending view (q, k,
/// q_out, k_out) for the per-view reasons.
struct KernelChoice {
  KernelKind kind = KernelKind::general;
  GeneralReason reason = GeneralReason::none;
  const char* view = "";
};

/// Elements per 16-byte vector of `dtype`.
inline int64_t vector_lanes(DType dtype) { return 16 / size_of(dtype); }

/// Which kernel runs `args` (a call that passed validation), and why not the fast one. Pure: reads
/// the arguments (pointers as numbers, never what they point to), no device query.
inline KernelChoice choose_kernel(const KernelArgs& args) {
  auto general = [](GeneralReason reason, const char* view = "") {
    return KernelChoice{.kind = KernelKind::general, .reason = reason, .view = view};
  };
  if (args.dtype == DType::f64) return general(GeneralReason::dtype);
  if (args.xpos_scale_base != 0) return general(GeneralReason::xpos);
  const int64_t pairs = args.rotary_dim / 2;
  const bool half = args.pair_step == 1 && args.block_pairs == pairs && args.partner == pairs;
  const bool interleaved = args.pair_step == 2 && args.block_pairs == pairs && args.partner == 1;
  if (!half && !interleaved) return general(GeneralReason::pairing);
  if (pairs > kFastMaxPairs) return general(GeneralReason::rotary_dim);
  const int64_t lanes = vector_lanes(args.dtype);
  if (args.head_dim % lanes != 0 || args.rotary_offset % lanes != 0 || (half ? pairs : args.rotary_dim) % lanes != 0) {
    return general(GeneralReason::vector_split);
  }
  const int64_t es = size_of(args.dtype);
  const int64_t tail_chunks = (args.head_dim - args.rotary_dim) / lanes;
  const int64_t rotated_chunks = half ? pairs / lanes : args.rotary_dim / lanes;
  if (rotated_chunks + tail_chunks > kFastMaxThreads) return general(GeneralReason::chunks);
  const int64_t extent[3] = {args.batch, args.seq, 0};
  for (int o = 0; o < args.operand_count; ++o) {
    const KernelOperand& op = args.operands[o];
    if (op.heads == 0) continue;
    for (int side = 0; side < 2; ++side) {
      const char* names[2][2] = {{"q", "q_out"}, {"k", "k_out"}};
      const char* view = names[o][side];
      const int64_t* strides = side == 0 ? op.in_strides : op.out_strides;
      const auto address = reinterpret_cast<uintptr_t>(side == 0 ? op.in : op.out);
      if (strides[3] != 1) return general(GeneralReason::channel_stride, view);
      bool aligned = address % 16 == 0;
      for (int d = 0; d < 3; ++d) {
        const int64_t length = d == 2 ? op.heads : extent[d];
        if (length > 1 && (strides[d] * es) % 16 != 0) aligned = false;
      }
      if (!aligned) return general(GeneralReason::alignment, view);
      // Byte offsets within a token, (heads - 1) * |head stride| + head_dim, in an int32.
      const int64_t head_bytes = (strides[2] < 0 ? -strides[2] : strides[2]) * es;
      const int64_t room = (int64_t{1} << 31) - 1 - args.head_dim * es;
      if (op.heads > (int64_t{1} << 29) || (op.heads > 1 && head_bytes > room / (op.heads - 1))) {
        return general(GeneralReason::index_range, view);
      }
    }
  }
  return KernelChoice{.kind = KernelKind::fast};
}

/// The choice in words: "fast", or "general: <reason>".
inline std::string describe(const KernelChoice& choice) {
  if (choice.kind == KernelKind::fast) return "fast";
  const std::string view = choice.view;
  switch (choice.reason) {
    case GeneralReason::dtype: return "general: f64 data (the fast kernels take f32, f16 and bf16)";
    case GeneralReason::xpos: return "general: xPos (the fast kernels share one angle row between q and k)";
    case GeneralReason::pairing: return "general: block_half pairing (the fast kernels take half and interleaved)";
    case GeneralReason::rotary_dim: return "general: rotary_dim above 256";
    case GeneralReason::vector_split:
      return "general: head_dim, rotary_offset or the pairing's partner distance is not a whole number of "
             "16-byte vectors";
    case GeneralReason::channel_stride: return "general: " + view + "'s head_dim stride is not 1";
    case GeneralReason::alignment:
      return "general: " + view + "'s data or a stride is not a multiple of 16 bytes";
    case GeneralReason::index_range: return "general: " + view + "'s offsets within a token exceed 32 bits";
    case GeneralReason::chunks: return "general: more than 256 16-byte vectors per head";
    case GeneralReason::none: break;
  }
  return "general";
}

// ---- The fast launch ----

/// A fast launch: blocks of (chunks, rows) threads, grid (grid, groups); each block takes tiles of
/// 2^tile_shift tokens (tiles blockIdx.x, + grid, ...) and heads [blockIdx.y * group_heads, ...).
struct FastShape {
  int chunks = 0;      ///< blockDim.x: rotated chunk slots, then pass-through slots, per head
  int rows = 0;        ///< blockDim.y: a multiple of 2^tile_shift
  int tile_shift = 0;  ///< log2 tokens per tile
  int group_heads = 0; ///< heads per block (the last group may have fewer)
  int groups = 1;      ///< gridDim.y
  int64_t grid = 0;    ///< gridDim.x; blocks loop over tiles
};

/// Chunk slots per head: rotated chunks, plus pass-through chunks when an operand copies its tail.
inline int fast_rotated_chunks(const KernelArgs& args) {
  const int64_t lanes = vector_lanes(args.dtype);
  const bool half = args.pair_step == 1;
  return static_cast<int>(half ? args.rotary_dim / 2 / lanes : args.rotary_dim / lanes);
}
inline bool fast_copies_tail(const KernelArgs& args, const KernelOperand& op) {
  return args.copy_tail && !op.in_place && args.head_dim > args.rotary_dim && op.heads > 0;
}
inline int fast_chunks(const KernelArgs& args) {
  bool tail = false;
  for (int o = 0; o < args.operand_count; ++o) tail = tail || fast_copies_tail(args, args.operands[o]);
  const int64_t tail_chunks = tail ? (args.head_dim - args.rotary_dim) / vector_lanes(args.dtype) : 0;
  return fast_rotated_chunks(args) + static_cast<int>(tail_chunks);
}

/// The launch the device uses for a fast call (host code; `multiprocessors`: the device's SM
/// count). Large calls: tiles of up to 8 tokens, all heads per block, 256 threads, so that a
/// thread rotates several heads of one token after computing one or two angle cells. Calls of too
/// few tiles to give every SM two blocks (decode, short batches): one token per tile and the heads
/// split into groups, each block at least as many threads as its token has pairs (one angle cell
/// per thread: the exact angle's ~100 dependent double operations run once, in parallel).
/// The same rule for any fast kernel's work: `chunks` thread columns per head, `heads` heads and
/// `pairs` angle cells per token, `tokens` tokens (rope_store's fast kernel, fast_store_body.hpp,
/// counts v's heads too).
inline FastShape fast_shape_of(int chunks, int64_t heads, int64_t pairs, int64_t tokens, int multiprocessors) {
  FastShape shape;
  shape.chunks = chunks;
  const int64_t target = 2 * static_cast<int64_t>(std::max(multiprocessors, 1));
  const int max_rows = kFastMaxThreads / shape.chunks;
  int shift = 0;
  while (shift < kFastMaxTileShift && (2 << shift) <= max_rows && (tokens >> (shift + 1)) >= target) ++shift;
  shape.tile_shift = shift;
  const int64_t tile = int64_t{1} << shift;
  const int64_t tiles = (tokens + tile - 1) / tile;
  int64_t groups = 1;
  if (tiles < target && heads > 1) {
    groups = std::min<int64_t>(heads, (target + tiles - 1) / tiles);
    // At least one angle cell per thread's worth of heads per block, and a warp.
    const int64_t min_heads = std::max<int64_t>((std::max<int64_t>(pairs, 32) + shape.chunks - 1) / shape.chunks, 1);
    groups = std::min(groups, std::max<int64_t>(heads / min_heads, 1));
  }
  groups = std::min<int64_t>(groups, kFastMaxGroups);
  const int64_t group_heads = (heads + groups - 1) / std::max<int64_t>(groups, 1);
  shape.group_heads = static_cast<int>(std::max<int64_t>(group_heads, 1));
  shape.groups = static_cast<int>((heads + shape.group_heads - 1) / shape.group_heads);
  if (shape.groups < 1) shape.groups = 1;
  const int64_t rows_needed = tile * shape.group_heads;
  const int64_t rows_fit = max_rows / tile * tile;
  shape.rows = static_cast<int>(std::max<int64_t>(std::min(rows_needed, rows_fit), tile));
  shape.grid = std::min(tiles, kFastMaxGrid);
  return shape;
}
inline FastShape fast_launch_shape(const KernelArgs& args, int multiprocessors) {
  const int64_t heads = args.operands[0].heads + (args.operand_count > 1 ? args.operands[1].heads : 0);
  return fast_shape_of(fast_chunks(args), heads, args.rotary_dim / 2, args.tokens, multiprocessors);
}

// ---- The kernel's arguments ----

/// One operand (q or k) as the fast body addresses it: row addresses in bytes.
struct FastOperand {
  const unsigned char* in = nullptr;
  unsigned char* out = nullptr;
  int64_t in_token[2] = {};   ///< bytes per batch row and per sequence step
  int64_t out_token[2] = {};
  int32_t in_head = 0;        ///< bytes per head
  int32_t out_head = 0;
  int32_t heads = 0;
  bool copy_tail = false;     ///< pass-through chunks copied (out of place, ApplyArgs::copy_tail)
};

/// The fast kernel's own arguments (host-built from KernelArgs and a FastShape).
struct FastArgs {
  FastOperand operands[2];
  int32_t heads_q = 0;         ///< operands[0].heads: concatenated head g < heads_q is q's
  int32_t heads = 0;           ///< q's and k's
  int32_t pairs = 0;           ///< rotary_dim / 2: cells per token in shared memory
  int32_t rotated_chunks = 0;  ///< chunk slots x < rotated_chunks rotate
  int32_t offset_bytes = 0;    ///< rotary_offset in bytes
  int32_t partner_bytes = 0;   ///< half: r/2 in bytes (the partner vector); interleaved: 0
  int32_t rotary_bytes = 0;    ///< rotary_dim in bytes
  int32_t offset_chunks = 0;   ///< rotary_offset in vectors (pass-through chunks before the slice)
  int32_t tile_shift = 0;
  int32_t group_heads = 0;
  int64_t tokens = 0;
  int64_t tiles = 0;
  Divmod64 seq;                ///< token -> (b, s)
};

inline FastArgs fast_args(const KernelArgs& args, const FastShape& shape) {
  FastArgs f;
  const int64_t es = size_of(args.dtype);
  for (int o = 0; o < args.operand_count; ++o) {
    const KernelOperand& op = args.operands[o];
    FastOperand& out = f.operands[o];
    out.in = static_cast<const unsigned char*>(op.in);
    out.out = static_cast<unsigned char*>(op.out);
    for (int d = 0; d < 2; ++d) {
      out.in_token[d] = op.in_strides[d] * es;
      out.out_token[d] = op.out_strides[d] * es;
    }
    // (A single head's stride is never multiplied: choose_kernel bounds it only for more heads.)
    out.in_head = op.heads > 1 ? static_cast<int32_t>(op.in_strides[2] * es) : 0;
    out.out_head = op.heads > 1 ? static_cast<int32_t>(op.out_strides[2] * es) : 0;
    out.heads = static_cast<int32_t>(op.heads);
    out.copy_tail = fast_copies_tail(args, op);
  }
  f.heads_q = f.operands[0].heads;
  f.heads = f.operands[0].heads + f.operands[1].heads;
  f.pairs = static_cast<int32_t>(args.rotary_dim / 2);
  f.rotated_chunks = fast_rotated_chunks(args);
  f.offset_bytes = static_cast<int32_t>(args.rotary_offset * es);
  f.partner_bytes = args.pair_step == 1 ? static_cast<int32_t>(args.rotary_dim / 2 * es) : 0;
  f.rotary_bytes = static_cast<int32_t>(args.rotary_dim * es);
  f.offset_chunks = static_cast<int32_t>(args.rotary_offset / vector_lanes(args.dtype));
  f.tile_shift = shape.tile_shift;
  f.group_heads = shape.group_heads;
  f.tokens = args.tokens;
  f.tiles = (args.tokens + (int64_t{1} << shape.tile_shift) - 1) >> shape.tile_shift;
  f.seq = Divmod64::make(static_cast<uint64_t>(std::max<int64_t>(args.seq, 1)));
  return f;
}

/// Shared memory of a fast block: the tile's cos and sin rows (float, 2^tile_shift * pairs each)
/// and each token's position error.
inline int64_t fast_shared_bytes(const FastArgs& f) {
  return (int64_t{2} * f.pairs * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(sizeof(uint32_t)))
         << f.tile_shift;
}
struct FastShared {
  float* cos = nullptr;
  float* sin = nullptr;
  uint32_t* skip = nullptr;
};
ROTARY_HD inline FastShared fast_shared(unsigned char* memory, const FastArgs& f) {
  float* cos = reinterpret_cast<float*>(memory);
  float* sin = cos + (f.pairs << f.tile_shift);
  return {cos, sin, reinterpret_cast<uint32_t*>(sin + (f.pairs << f.tile_shift))};
}

// ---- The body ----

/// A thread's state across a tile's barrier: the first heads it loaded in phase A (registers on the
/// device: every index below is a compile-time constant of an unrolled loop).
/// A batch of four 16-byte vectors in flight per thread in phase B (two heads with half pairing, four
/// with interleaved): with at most 80 registers (apply.cu's __launch_bounds__) three blocks of 256
/// threads stay resident per SM, 768 threads x 64 bytes = 48 KB of loads in flight, above the
/// ~26 KB per SM that an H100/H200's copy rate needs over ~0.8 us of memory latency. One head is
/// loaded before the angles, so that a decode call's only load overlaps them.
template <bool kHalf>
struct FastThread {
  static constexpr int kPrefetch = 1;             ///< heads loaded before the angles
  static constexpr int kBatch = kHalf ? 2 : 4;    ///< heads in flight in phase B
  static constexpr int kVectors = kHalf ? 2 : 1;  ///< vectors of a rotated chunk
  Vec16 data[kPrefetch][kVectors];
};

/// A thread's token: where its rows of q and k (in and out) start.
struct FastToken {
  const unsigned char* q_in;
  unsigned char* q_out;
  const unsigned char* k_in;
  unsigned char* k_out;
};

ROTARY_HD inline FastToken fast_token(const FastArgs& f, int64_t token) {
  const auto b = static_cast<int64_t>(f.seq.quotient(static_cast<uint64_t>(token)));
  const int64_t s = token - b * static_cast<int64_t>(f.seq.divisor);
  const FastOperand& q = f.operands[0];
  const FastOperand& k = f.operands[1];
  return {q.in + (b * q.in_token[0] + s * q.in_token[1]), q.out + (b * q.out_token[0] + s * q.out_token[1]),
          k.in + (b * k.in_token[0] + s * k.in_token[1]), k.out + (b * k.out_token[0] + s * k.out_token[1])};
}

ROTARY_HD inline int min_int(int a, int b) { return a < b ? a : b; }

/// Where chunk x of concatenated head g (q's heads, then k's) of a token lies: its (first) vector's
/// in and out addresses. Rotated chunk x starts x * 16 bytes into the rotated slice; pass-through
/// chunk k = x - rotated_chunks at k * 16 bytes, counting the channels before and after the slice.
/// False when the slot has nothing to do in that head (a pass-through slot of an operand that copies
/// no tail).
ROTARY_HD inline bool fast_row(const FastArgs& f, const FastToken& token, int g, int x, bool rotate,
                               const unsigned char*& in, unsigned char*& out) {
  const bool is_k = g >= f.heads_q;
  const int head = is_k ? g - f.heads_q : g;
  int32_t channel_bytes;
  if (rotate) {
    channel_bytes = f.offset_bytes + x * 16;
  } else {
    if (!(is_k ? f.operands[1].copy_tail : f.operands[0].copy_tail)) return false;
    const int k = x - f.rotated_chunks;
    channel_bytes = k * 16 + (k < f.offset_chunks ? 0 : f.rotary_bytes);
  }
  in = (is_k ? token.k_in : token.q_in) + (head * (is_k ? f.operands[1].in_head : f.operands[0].in_head) + channel_bytes);
  out = (is_k ? token.k_out : token.q_out) + (head * (is_k ? f.operands[1].out_head : f.operands[0].out_head) + channel_bytes);
  return true;
}

template <bool kHalf>
ROTARY_HD inline void fast_load(const FastArgs& f, const unsigned char* in, bool rotate,
                                Vec16 (&data)[FastThread<kHalf>::kVectors]) {
  data[0] = load_vec(in);
  if constexpr (kHalf) {
    if (rotate) data[1] = load_vec(in + f.partner_bytes);
  }
}

/// A thread's angles for its chunk of its token: the same for every head it visits, read from
/// shared memory once per tile. Half pairing: pairs xV .. xV + V - 1; interleaved: V/2 pairs from
/// xV/2.
template <class T, bool kHalf>
struct FastAngles {
  static constexpr int kPairs = kHalf ? Lanes<T>::kCount : Lanes<T>::kCount / 2;
  float cos[kPairs];
  float sin[kPairs];
};

// Shared-memory reads in 16-byte (or 8-byte) pieces: the cells are aligned to their size (the
// rows have pairs % 4 == 0 cells when a piece holds 4, pairs % 2 == 0 when it holds 2).
struct alignas(16) Floats4 {
  float v[4];
};
struct alignas(8) Floats2 {
  float v[2];
};
template <int N>
ROTARY_HD inline void load_cells(const float* from, float (&to)[N]) {
  if constexpr (N % 4 == 0) {
    ROTARY_UNROLL
    for (int i = 0; i < N; i += 4) {
      const Floats4 piece = *reinterpret_cast<const Floats4*>(from + i);
      ROTARY_UNROLL
      for (int k = 0; k < 4; ++k) to[i + k] = piece.v[k];
    }
  } else {
    static_assert(N == 2);
    const Floats2 piece = *reinterpret_cast<const Floats2*>(from);
    to[0] = piece.v[0];
    to[1] = piece.v[1];
  }
}

/// Rotates (or copies) one loaded chunk and stores it at `out`.
template <class T, bool kHalf, class Probe>
ROTARY_HD inline void fast_store(const FastArgs& f, unsigned char* out, bool rotate,
                                 const Vec16 (&data)[FastThread<kHalf>::kVectors], const FastAngles<T, kHalf>& angle) {
  using L = Lanes<T>;
  constexpr int V = L::kCount;
  using Bits = typename L::Bits;
  if (!rotate) {
    store_vec(out, data[0]);
    Probe::vector(out);
    for (int i = 0; i < V; ++i) Probe::stored(reinterpret_cast<const Bits*>(out) + i);
    return;
  }
  if constexpr (kHalf) {
    // Lane i of the first vector with lane i of its partner.
    float a[V], b[V], a_out[V], b_out[V];
    L::unpack(data[0], a);
    L::unpack(data[1], b);
    ROTARY_UNROLL
    for (int i = 0; i < V; ++i) rotate_pair(a[i], b[i], angle.cos[i], angle.sin[i], a_out[i], b_out[i]);
    store_vec(out, L::pack(a_out));
    store_vec(out + f.partner_bytes, L::pack(b_out));
    Probe::vector(out);
    Probe::vector(out + f.partner_bytes);
    for (int i = 0; i < V; ++i) {
      Probe::stored(reinterpret_cast<const Bits*>(out) + i);
      Probe::stored(reinterpret_cast<const Bits*>(out + f.partner_bytes) + i);
    }
  } else {
    // Lanes (2i, 2i + 1).
    float e[V], e_out[V];
    L::unpack(data[0], e);
    ROTARY_UNROLL
    for (int i = 0; i < V / 2; ++i) {
      rotate_pair(e[2 * i], e[2 * i + 1], angle.cos[i], angle.sin[i], e_out[2 * i], e_out[2 * i + 1]);
    }
    store_vec(out, L::pack(e_out));
    Probe::vector(out);
    for (int i = 0; i < V; ++i) Probe::stored(reinterpret_cast<const Bits*>(out) + i);
  }
}

/// Phase A's angle cells of tile `tile`, thread (x, y) of a (chunks, rows) block taking cells
/// y * chunks + x, + chunks * rows, ...: cell c is pair c >> tile_shift of token c & tile_mask. The
/// thread with a token's pair 0 records its position error (raised once) and calls
/// on_token(t, token) (rope_store's fast kernel reads the token's slot there).
template <class OnToken>
ROTARY_HD inline void fast_angle_cells(const KernelArgs& args, const FastArgs& f, const PairArrays& pairs, int64_t tile,
                                       int x, int y, int chunks, int rows, const FastShared& sh, OnToken&& on_token) {
  const int tile_mask = (1 << f.tile_shift) - 1;
  const int64_t first = tile << f.tile_shift;
  const int cells = f.pairs << f.tile_shift;
  for (int c = y * chunks + x; c < cells; c += chunks * rows) {
    const int t = c & tile_mask;
    const int j = c >> f.tile_shift;
    const int64_t cell_token = first + t;
    if (cell_token >= f.tokens) continue;
    const auto b = static_cast<int64_t>(f.seq.quotient(static_cast<uint64_t>(cell_token)));
    const int64_t s = cell_token - b * static_cast<int64_t>(f.seq.divisor);
    const uint32_t error = token_error(args, cell_token, s);
    if (j == 0) {
      sh.skip[t] = error;
      raise_error(args.error, error);
      on_token(t, cell_token);
    }
    if (error != 0) continue;
    const AngleCell<float> angle = pair_angle<float>(args, pairs, cell_token, b, s, j);
    sh.cos[t * f.pairs + j] = angle.c;
    sh.sin[t * f.pairs + j] = angle.s;
  }
}

/// Phase A of tile `tile` for thread (x, y) of a (chunks, rows) block in head group `group`.
template <class T, bool kHalf>
ROTARY_HD inline void fast_phase_a(const KernelArgs& args, const FastArgs& f, const PairArrays& pairs, int64_t tile,
                                   int group, int x, int y, int chunks, int rows, const FastShared& sh,
                                   FastThread<kHalf>& th) {
  const int tile_mask = (1 << f.tile_shift) - 1;
  const int64_t first = tile << f.tile_shift;
  {
    const int64_t token = first + (y & tile_mask);
    const int head0 = group * f.group_heads;
    const int heads = min_int(f.group_heads, f.heads - head0);
    const int first_row = y >> f.tile_shift;
    const int row_step = rows >> f.tile_shift;
    const bool rotate = x < f.rotated_chunks;
    if (token < f.tokens && first_row < heads) {
      const FastToken at = fast_token(f, token);
      ROTARY_UNROLL
      for (int i = 0; i < FastThread<kHalf>::kPrefetch; ++i) {
        const int h = first_row + i * row_step;
        const unsigned char* in;
        unsigned char* out;
        if (h < heads && fast_row(f, at, head0 + h, x, rotate, in, out)) fast_load<kHalf>(f, in, rotate, th.data[i]);
      }
    }
  }
  fast_angle_cells(args, f, pairs, tile, x, y, chunks, rows, sh, [](int, int64_t) {});
}

/// Phase B of the tile (after the barrier): the thread's angles once, then the prefetched heads,
/// then the rest in batches of kBatch (every load of a batch before its first store).
template <class T, bool kHalf, class Probe>
ROTARY_HD inline void fast_phase_b(const FastArgs& f, int64_t tile, int group, int x, int y, int rows,
                                   const FastShared& sh, const FastThread<kHalf>& th) {
  using Thread = FastThread<kHalf>;
  constexpr int kBatch = Thread::kBatch;
  const int t = y & ((1 << f.tile_shift) - 1);
  const int64_t token = (tile << f.tile_shift) + t;
  const int head0 = group * f.group_heads;
  const int heads = min_int(f.group_heads, f.heads - head0);
  const int first_row = y >> f.tile_shift;
  if (token >= f.tokens || first_row >= heads || sh.skip[t] != 0) return;
  const bool rotate = x < f.rotated_chunks;
  FastAngles<T, kHalf> angle{};  // pass-through slots read none
  if (rotate) {
    constexpr int kPairs = FastAngles<T, kHalf>::kPairs;
    load_cells(sh.cos + t * f.pairs + x * kPairs, angle.cos);
    load_cells(sh.sin + t * f.pairs + x * kPairs, angle.sin);
  }
  const FastToken at = fast_token(f, token);
  const int row_step = rows >> f.tile_shift;
  ROTARY_UNROLL
  for (int i = 0; i < Thread::kPrefetch; ++i) {
    const int h = first_row + i * row_step;
    const unsigned char* in;
    unsigned char* out;
    if (h < heads && fast_row(f, at, head0 + h, x, rotate, in, out)) {
      fast_store<T, kHalf, Probe>(f, out, rotate, th.data[i], angle);
    }
  }
  for (int base = first_row + Thread::kPrefetch * row_step; base < heads; base += kBatch * row_step) {
    Vec16 data[kBatch][Thread::kVectors];
    unsigned char* out[kBatch];
    bool live[kBatch];
    ROTARY_UNROLL
    for (int i = 0; i < kBatch; ++i) {
      const int h = base + i * row_step;
      const unsigned char* in;
      live[i] = h < heads && fast_row(f, at, head0 + h, x, rotate, in, out[i]);
      if (live[i]) fast_load<kHalf>(f, in, rotate, data[i]);
    }
    ROTARY_UNROLL
    for (int i = 0; i < kBatch; ++i) {
      if (live[i]) fast_store<T, kHalf, Probe>(f, out[i], rotate, data[i], angle);
    }
  }
}

}  // namespace rotary::detail::cuda
