// Internal: rope_store's fast CUDA kernel (src/cuda/fused.cu), apply's fast kernel
// (fast_body.hpp) with the cache write folded in. Written once as ROTARY_HD code over explicit
// (block, thread) indices: nvcc compiles it for the device, and the host compiler plays it block by
// block, phase by phase (src/cuda/emulate.hpp: emulate_fast_store), where the tests hold it bit for
// bit against rotary::rope_store on the CPU.
//
// What it takes (fast_store_refusal says why a call goes to the general fused kernel instead):
// a rope_store call that apply's fast kernels would take for its q and k (choose_kernel: f32, f16
// or bf16, half or interleaved pairing, no xPos, 16-byte rows), caches of the data's dtype (the
// cache receives the bits k_out would) or both quantised alike (fp8_e4m3, fp8_e5m2, int8: kQuant,
// a vector's codes stored whole, 8 or 4 bytes, each lane quantised as the body's store_cache does)
// whose rows are whole vectors (channel stride 1, data + offset and every stride of a dimension
// longer than one aligned to a vector's bytes), v the same, or instead of v MLA's k_pass (kv_c, copied
// into its cache as v would be: fast_store_copied), and no q quantised out, no device duplicate
// check. Every angle
// source, every kind of positions, any slots (int32/int64, negative: skipped; beyond a cache:
// skipped and flagged as the general kernel does).
//
// Work split: apply's fast split over the concatenated head list [q heads, k heads, v heads].
// Thread (x, y) owns chunk slot x of each head it visits: for q and k, slot x < C_rot is a rotated
// chunk (half pairing: the vector at offset + xV and its partner r/2 later; interleaved: one
// vector) and a slot beyond is a pass-through vector (k's always goes to the cache; q's and
// k_out's when out of place, as the general kernel's body writes them); for v, slot x copies v's
// vectors x, x + C, x + 2C, ... (C = blockDim.x). Per tile:
//   phase A: the thread loads its first head's vectors (as apply's prefetch), then fills the tile's
//            angle cells; the thread with a token's pair 0 also reads the token's slot once and
//            writes, beside the token's position error, the byte offsets of its k and v cache
//            rows (-1: no cache write);
//   barrier;
//   phase B: its angle cells once, then its heads, kBatch at a time (every load of a batch before
//            its first store): rotated k stored to k_out (when asked) and to the cache row.
// A 16-byte vector is loaded whole before any of it is stored and belongs to one thread (in place
// is race-free); every output element is written by one thread alone, with the values the general
// kernel writes: CPU == CUDA bit for bit whichever kernel runs.
#pragma once

#include <cstdint>

#include "../fused/body.hpp"
#include "fast_body.hpp"

namespace rotary::detail::cuda {

/// A cache as the fast store addresses it: the row of slot s starts
///   data + (s / block_size) * block_bytes + (s % block_size) * token_bytes
/// (data already at the cache's channel offset), head h at h * head_bytes from there.
struct FastCache {
  unsigned char* data = nullptr;
  Divmod64 block;
  int64_t block_bytes = 0;
  int64_t token_bytes = 0;
  int32_t head_bytes = 0;
  int64_t capacity = 0;
  const float* scale = nullptr;  ///< quantised caches: null 1, else 1 value or one per head
  bool per_head = false;
  ScaleOp op = ScaleOp::divide;
};

/// rope_store's fast kernel arguments (host-built from FusedKernelArgs and a FastShape).
struct FastStoreArgs {
  FastArgs rope;             ///< q (operands[0], out: q_out) and k (operands[1], out: k_out)
  int32_t heads = 0;         ///< concatenated heads: q's, k's, then v's when stored
  int32_t tail_chunks = 0;   ///< pass-through vectors per q or k head
  bool write_k = false;      ///< k_out written
  bool q_tail = false;       ///< q's pass-through vectors copied to q_out (out of place)
  bool k_out_tail = false;   ///< k's to k_out (write_k, out of place)
  const void* slots = nullptr;
  bool slots_i64 = true;
  FastCache k_cache;
  bool has_v = false;
  FastCache v_cache;
  DType cache_dtype = DType::f32;  ///< both caches' (kQuant: fp8_e4m3, fp8_e5m2 or i8)
  int32_t cache_shift = 0;         ///< a data offset in bytes >> cache_shift: the cache's (kQuant: 1 or 2)
  const unsigned char* v_in = nullptr;
  int64_t v_token[2] = {};   ///< bytes per batch row and per sequence step
  int32_t v_head = 0;        ///< bytes per head
  int32_t v_vectors = 0;     ///< 16-byte vectors per v head
  int32_t chunks = 0;        ///< blockDim.x: rotated plus pass-through chunk slots
  // qk_norm_rope (norm_then_rope, head scope): each q and k head normalised before the rotation.
  bool norm = false;
  bool gemma = false;        ///< rounding: normalise and weigh in float, round once
  float eps = 0;
  float weight_offset = 0;
  KernelWeight q_weight{};   ///< data null: no weight
  KernelWeight k_weight{};
  int32_t head_dim = 0;      ///< elements per q or k head
};

// ---- The host's choice ----

/// Whether a cache's rows are whole 16-byte vectors the fast store can address (see the header
/// comment), for `heads` heads of `dim` elements of `dtype`.
inline bool fast_cache_ok(const KernelCache& c, DType dtype, int64_t heads, int64_t dim) {
  // A vector of the data (16 bytes) lands in the cache as `width` bytes: 16, or its codes.
  const bool quantised = is_quantised_dtype(c.dtype);
  if (c.data == nullptr || (c.dtype != dtype && !quantised) || c.strides[3] != 1) return false;
  const int64_t es = size_of(c.dtype);
  const int64_t width = 16 / (size_of(dtype) / es);
  if (c.block_size < 1 || (dim * es) % width != 0) return false;
  const int64_t blocks = c.capacity / c.block_size;
  const int64_t extent[3] = {blocks, c.block_size, heads};
  for (int d = 0; d < 3; ++d) {
    if (extent[d] > 1 && (c.strides[d] * es) % width != 0) return false;
  }
  // A slot's row lies at a byte offset >= 0 from data: the kernel marks "no cache write" by a
  // negative offset (fast_cache_row), so rows below data (a negative block or token stride) take
  // the general kernel.
  if ((blocks > 1 && c.strides[0] < 0) || (c.block_size > 1 && c.strides[1] < 0)) return false;
  const auto address = reinterpret_cast<uintptr_t>(static_cast<const unsigned char*>(c.data) + c.offset * es);
  if (address % static_cast<uintptr_t>(width) != 0) return false;
  const int64_t head_bytes = (c.strides[2] < 0 ? -c.strides[2] : c.strides[2]) * es;
  const int64_t room = (int64_t{1} << 31) - 1 - dim * es;  // a row's bytes and head offsets: int32
  return room >= 0 && heads <= (int64_t{1} << 29) && (heads <= 1 || head_bytes <= room / (heads - 1));
}

/// The heads the fast store copies into a cache beside q and k: v into v_cache, or, in an MLA call (no
/// v), k_pass into k_pass_cache: the kernel's "v" either way (the body copies both alike: the bits of a
/// cache of the data's dtype, else store_cache's codes). flat null: none.
struct FastCopied {
  const KernelFlat* flat = nullptr;
  const KernelCache* cache = nullptr;
};
inline FastCopied fast_store_copied(const FusedKernelArgs& f) {
  if (f.has_v_cache) return {&f.v, &f.v_cache};
  if (f.has_k_pass) return {&f.k_pass, &f.k_pass_cache};
  return {};
}

/// Whether rope_store's fast kernel takes `f` (a rope_store call that passed validation), and why
/// not: null when it does, else the reason in words.
inline const char* fast_store_refusal(const FusedKernelArgs& f) {
  if (f.norm && (f.rope_then_norm || f.all_heads || f.v_norm)) {
    return "a norm after the rotation, across all heads, or of v (qk_norm_rope's general kernel)";
  }
  if (f.slots == nullptr && !f.norm) return "no cache write";
  if (!f.write_q) return "q not written";
  if (f.q_quantized.out != nullptr) return "a quantised q_out";
  if (f.has_k_pass && f.v.in != nullptr) return "k_pass beside v";
  if (f.check_duplicates) return "the device duplicate check";
  if (f.rope.operand_count != 2 || f.rope.operands[1].heads == 0) return "no k";
  if (f.v.out != nullptr || f.v_norm) return "v written back";
  if (f.v.in != nullptr && !f.has_v_cache) return "v without a v cache";
  if (f.slots == nullptr && (f.v.in != nullptr || f.has_k_pass || !f.write_k)) return "v or k read but not written";
  if (f.rope.rotary_dim < 2) return "nothing rotated";
  if (choose_kernel(f.rope).kind != KernelKind::fast) return "q or k not taken by apply's fast kernels";
  const DType dtype = f.rope.dtype;
  if (f.slots != nullptr) {
    if (f.k_cache.dtype != dtype && !is_quantised_dtype(f.k_cache.dtype)) return "k_cache of another model dtype";
    if (f.has_v_cache && f.v_cache.dtype != f.k_cache.dtype) return "k_cache and v_cache of different dtypes";
    if (f.has_k_pass && f.k_pass_cache.dtype != f.k_cache.dtype) return "k_cache and k_pass_cache of different dtypes";
    if (f.norm && f.k_cache.dtype != dtype) return "a quantised cache with the norm";
    if (!fast_cache_ok(f.k_cache, dtype, f.rope.operands[1].heads, f.rope.head_dim)) return "k_cache's rows";
  }
  if (const FastCopied copied = fast_store_copied(f); copied.flat != nullptr) {
    const KernelFlat& v = *copied.flat;
    const bool is_v = copied.flat == &f.v;
    const int64_t es = size_of(dtype);
    if (!fast_cache_ok(*copied.cache, dtype, v.heads, v.dim)) return is_v ? "v_cache's rows" : "k_pass_cache's rows";
    const char* rows = is_v ? "v's rows" : "k_pass's rows";
    if (v.strides[3] != 1 || reinterpret_cast<uintptr_t>(v.in) % 16 != 0) return rows;
    const int64_t extent[3] = {f.rope.batch, f.rope.seq, v.heads};
    for (int d = 0; d < 3; ++d) {
      if (extent[d] > 1 && (v.strides[d] * es) % 16 != 0) return rows;
    }
    const int64_t head_bytes = (v.strides[2] < 0 ? -v.strides[2] : v.strides[2]) * es;
    const int64_t room = (int64_t{1} << 31) - 1 - v.dim * es;  // a row's bytes and head offsets: int32
    if (room < 0 || v.heads > (int64_t{1} << 29) || (v.heads > 1 && head_bytes > room / (v.heads - 1))) return rows;
  }
  // A token's heads in at most kFastMaxGroups groups, however fast_store_launch_shape splits them
  // for shared memory (one head a group at the least).
  const FastCopied copied = fast_store_copied(f);
  const int64_t heads = f.rope.operands[0].heads + f.rope.operands[1].heads + (copied.flat ? copied.flat->heads : 0);
  if (heads > kFastMaxGroups) return "more than 65535 heads a token";
  return nullptr;
}

/// Whether a call the fast store takes writes quantised caches (its kQuant kernels; never with a norm).
inline bool fast_store_quantised(const FusedKernelArgs& f) {
  return f.slots != nullptr && is_quantised_dtype(f.k_cache.dtype);
}

inline FastCache fast_cache(const KernelCache& c) {
  const int64_t es = size_of(c.dtype);
  FastCache out;
  out.data = static_cast<unsigned char*>(c.data) + c.offset * es;
  out.block = Divmod64::make(static_cast<uint64_t>(c.block_size));
  out.block_bytes = c.strides[0] * es;
  out.token_bytes = c.strides[1] * es;
  out.head_bytes = static_cast<int32_t>(c.strides[2] * es);
  out.capacity = c.capacity;
  out.scale = c.scale;
  out.per_head = c.per_head;
  out.op = c.op;
  return out;
}

/// Chunk slots per head of a call fast_store_refusal takes: rotated chunks, then pass-through ones
/// (k's always go to its cache).
inline int fast_store_chunks(const FusedKernelArgs& f) {
  const int64_t tail = (f.rope.head_dim - f.rope.rotary_dim) / vector_lanes(f.rope.dtype);
  return fast_rotated_chunks(f.rope) + static_cast<int>(tail);
}

/// fast_shape_of's launch for a fast store call, before fast_store_launch_shape fits its shared memory.
inline FastShape fast_store_shape_of(const FusedKernelArgs& f, int multiprocessors) {
  const FastCopied copied = fast_store_copied(f);
  const int64_t heads = f.rope.operands[0].heads + f.rope.operands[1].heads + (copied.flat ? copied.flat->heads : 0);
  return fast_shape_of(fast_store_chunks(f), heads, f.rope.rotary_dim / 2, f.rope.tokens, multiprocessors);
}

inline FastStoreArgs fast_store_args(const FusedKernelArgs& f, const FastShape& shape) {
  FastStoreArgs s;
  s.rope = fast_args(f.rope, shape);
  const int64_t es = size_of(f.rope.dtype);
  s.tail_chunks = static_cast<int32_t>((f.rope.head_dim - f.rope.rotary_dim) / vector_lanes(f.rope.dtype));
  s.write_k = f.write_k;
  // Pass-through channels: copied out of place; with a norm, normalised and written in place too.
  s.q_tail = f.write_q && (f.norm || !f.rope.operands[0].in_place) && s.tail_chunks > 0;
  s.k_out_tail = f.write_k && (f.norm || !f.rope.operands[1].in_place) && s.tail_chunks > 0;
  s.slots = f.slots;
  s.slots_i64 = f.slots_i64;
  if (f.slots != nullptr) {
    s.k_cache = fast_cache(f.k_cache);
    s.cache_dtype = f.k_cache.dtype;
    s.cache_shift = size_of(f.rope.dtype) == 4 * size_of(f.k_cache.dtype)   ? 2
                    : size_of(f.rope.dtype) == 2 * size_of(f.k_cache.dtype) ? 1
                                                                            : 0;
  }
  const FastCopied copied = fast_store_copied(f);
  s.has_v = copied.flat != nullptr;
  s.heads = s.rope.heads;
  if (s.has_v) {
    const KernelFlat& v = *copied.flat;
    s.v_cache = fast_cache(*copied.cache);
    s.v_in = static_cast<const unsigned char*>(v.in);
    s.v_token[0] = v.strides[0] * es;
    s.v_token[1] = v.strides[1] * es;
    s.v_head = v.heads > 1 ? static_cast<int32_t>(v.strides[2] * es) : 0;
    s.v_vectors = static_cast<int32_t>(v.dim * es / 16);
    s.heads += static_cast<int32_t>(v.heads);
  }
  s.chunks = shape.chunks;
  s.norm = f.norm;
  s.gemma = f.gemma;
  s.eps = f.eps;
  s.weight_offset = f.weight_offset;
  s.q_weight = f.q_weight;
  s.k_weight = f.k_weight;
  s.head_dim = static_cast<int32_t>(f.rope.head_dim);
  return s;
}

// ---- Shared memory: per token its k and v cache rows, then apply's cells and error words ----

// With a norm, after them: the q and k weights as normalise multiplies by them (float, head_dim
// each), and the norm factor of each (token, head of the group) of the tile.
inline int64_t fast_store_norm_floats(const FastStoreArgs& s) {
  return s.norm ? int64_t{2} * s.head_dim + (static_cast<int64_t>(s.rope.group_heads) << s.rope.tile_shift) : 0;
}
inline int64_t fast_store_shared_bytes(const FastStoreArgs& s) {
  return (int64_t{2} * static_cast<int64_t>(sizeof(int64_t)) << s.rope.tile_shift) + fast_shared_bytes(s.rope) +
         fast_store_norm_floats(s) * static_cast<int64_t>(sizeof(float));
}
/// The dynamic shared memory every device grants a block without opting in (the kernels never opt in).
inline constexpr int64_t kFastStoreMaxShared = 48 * 1024;

/// The launch a device uses for a fast store call (`multiprocessors`: its SM count): fast_shape_of's,
/// with a norm's heads split into more groups when their factors (a float per head of the group and
/// token of the tile) would take a block past kFastStoreMaxShared (thousands of heads in one call).
inline FastShape fast_store_launch_shape(const FusedKernelArgs& f, int multiprocessors) {
  FastShape shape = fast_store_shape_of(f, multiprocessors);
  const int64_t bytes = fast_store_shared_bytes(fast_store_args(f, shape));
  if (bytes <= kFastStoreMaxShared) return shape;
  const int64_t per_head = int64_t{4} << shape.tile_shift;  // only the norm's factors grow with the heads
  const int64_t rest = bytes - per_head * shape.group_heads;
  const FastCopied copied = fast_store_copied(f);
  const int64_t heads = f.rope.operands[0].heads + f.rope.operands[1].heads + (copied.flat ? copied.flat->heads : 0);
  shape.group_heads = static_cast<int>(std::max<int64_t>((kFastStoreMaxShared - rest) / per_head, 1));
  shape.groups = static_cast<int>((heads + shape.group_heads - 1) / shape.group_heads);
  const int tile = 1 << shape.tile_shift;
  shape.rows = std::max(tile, std::min(shape.rows, tile * shape.group_heads));
  return shape;
}

struct FastStoreShared {
  int64_t* k_row = nullptr;  ///< byte offset of the token's k cache row, or -1
  int64_t* v_row = nullptr;
  FastShared cells;
  float* weight[2] = {nullptr, nullptr};  ///< q's, k's (norm)
  float* r = nullptr;                     ///< [head of the group][token of the tile] (norm)
};
ROTARY_HD inline FastStoreShared fast_store_shared(unsigned char* memory, const FastStoreArgs& s) {
  auto* rows = reinterpret_cast<int64_t*>(memory);
  const int tile = 1 << s.rope.tile_shift;
  FastStoreShared sh{rows, rows + tile, fast_shared(memory + 2 * sizeof(int64_t) * static_cast<size_t>(tile), s.rope)};
  if (s.norm) {
    float* after = reinterpret_cast<float*>(sh.cells.skip + tile);
    sh.weight[0] = after;
    sh.weight[1] = after + s.head_dim;
    sh.r = after + 2 * s.head_dim;
  }
  return sh;
}

// ---- The body ----

/// A token as the tasks address it: its batch row and sequence index. The row addresses are formed
/// per task from these (two multiply-adds each) rather than held: five row pointers across phase
/// B's batches would spill the half-pairing kernels past their 80 registers.
struct FastStoreToken {
  int64_t b;
  int64_t s;
};
ROTARY_HD inline FastStoreToken fast_store_token(const FastStoreArgs& s, int64_t token) {
  const auto b = static_cast<int64_t>(s.rope.seq.quotient(static_cast<uint64_t>(token)));
  return {b, token - b * static_cast<int64_t>(s.rope.seq.divisor)};
}
// Head `head` of q (is_k false) or k of a token, in and out. Each field is selected on its own: a
// reference to operands[is_k] (an index known at run time) makes the compiler copy the launch
// parameters to local memory.
ROTARY_HD inline const unsigned char* head_in(const FastArgs& f, bool is_k, const FastStoreToken& at, int head) {
  const FastOperand& q = f.operands[0];
  const FastOperand& k = f.operands[1];
  return (is_k ? k.in : q.in) + (at.b * (is_k ? k.in_token[0] : q.in_token[0]) +
                                 at.s * (is_k ? k.in_token[1] : q.in_token[1]) + head * (is_k ? k.in_head : q.in_head));
}
ROTARY_HD inline unsigned char* head_out(const FastArgs& f, bool is_k, const FastStoreToken& at, int head) {
  const FastOperand& q = f.operands[0];
  const FastOperand& k = f.operands[1];
  return (is_k ? k.out : q.out) + (at.b * (is_k ? k.out_token[0] : q.out_token[0]) +
                                   at.s * (is_k ? k.out_token[1] : q.out_token[1]) +
                                   head * (is_k ? k.out_head : q.out_head));
}
ROTARY_HD inline const unsigned char* v_row_in(const FastStoreArgs& s, const FastStoreToken& at) {
  return s.v_in + (at.b * s.v_token[0] + at.s * s.v_token[1]);
}

ROTARY_HD inline int64_t fast_cache_row(const FastCache& c, int64_t slot) {
  const auto block = static_cast<int64_t>(c.block.quotient(static_cast<uint64_t>(slot)));
  return block * c.block_bytes + (slot - block * static_cast<int64_t>(c.block.divisor)) * c.token_bytes;
}

/// A quantised cache's scale for head h (cache_scale's rule): 1 without one.
ROTARY_HD inline float fast_cache_scale(const FastCache& c, int h) {
  return c.scale == nullptr ? 1.0f : c.scale[c.per_head ? h : 0];
}

/// Whether every scale the fast store reads is usable (scales_usable: finite and > 0): k's cache over
/// k's heads, v's over v's.
ROTARY_HD inline bool fast_scales_usable(const FastStoreArgs& s) {
  KernelCache k{};
  k.scale = s.k_cache.scale;
  k.per_head = s.k_cache.per_head;
  KernelCache v{};
  v.scale = s.v_cache.scale;
  v.per_head = s.v_cache.per_head;
  return scales_usable(k, s.rope.operands[1].heads) && (!s.has_v || scales_usable(v, s.heads - s.rope.heads));
}

/// One (head, chunk slot) of a token: `n` vectors (0: nothing to do) read at in and in + second,
/// rotated or copied, stored at out[d] and out[d] + second for each out[d] set.
/// out[0]: q_out or k_out (the data's dtype); out[1]: the k or v cache row (its second vector at
/// second >> cache_shift; kQuant: codes with `scale`).
struct FastStoreTask {
  const unsigned char* in = nullptr;
  unsigned char* out[2] = {nullptr, nullptr};
  int32_t second = 0;
  float scale = 1.0f;
  bool multiply = false;
  int32_t channel_bytes = 0;  ///< q and k: where the (first) vector starts in the head
  int n = 0;
  int operand = -1;           ///< 0 q, 1 k, -1 v
  bool rotate = false;
};

/// The task of concatenated head g, slot x, for a token at `at` whose cache rows are k_row and v_row
/// (-1: none). loading: the vectors phase A loads, before the rows are known (out unset; a head with
/// nothing to store may still be loaded).
template <bool kHalf>
ROTARY_HD inline FastStoreTask fast_store_task(const FastStoreArgs& s, const FastStoreToken& at, int g, int x,
                                               int64_t k_row, int64_t v_row, bool loading) {
  const FastArgs& f = s.rope;
  FastStoreTask task;
  if (g < f.heads) {  // q or k
    const bool is_k = g >= f.heads_q;
    const int head = is_k ? g - f.heads_q : g;
    task.rotate = x < f.rotated_chunks;
    int32_t channel_bytes;
    bool to_out;
    if (task.rotate) {
      channel_bytes = f.offset_bytes + x * 16;
      to_out = !is_k || s.write_k;
      task.n = kHalf ? 2 : 1;
      task.second = f.partner_bytes;
    } else {
      const int k = x - f.rotated_chunks;
      if (k >= s.tail_chunks) return task;
      channel_bytes = k * 16 + (k < f.offset_chunks ? 0 : f.rotary_bytes);
      to_out = is_k ? s.k_out_tail : s.q_tail;
      task.n = 1;
      if (!is_k && !to_out) task.n = 0;  // q in place: its pass-through channels stay
    }
    task.in = head_in(f, is_k, at, head) + channel_bytes;
    task.channel_bytes = channel_bytes;
    task.operand = is_k ? 1 : 0;
    if (loading) return task;
    if (to_out) task.out[0] = head_out(f, is_k, at, head) + channel_bytes;
    if (is_k && k_row >= 0) {
      task.out[1] = s.k_cache.data + (k_row + (head * s.k_cache.head_bytes + (channel_bytes >> s.cache_shift)));
      task.scale = fast_cache_scale(s.k_cache, head);
      task.multiply = s.k_cache.op == ScaleOp::multiply;
    }
  } else {  // v: vectors x (and x + chunks with two vector registers)
    const int head = g - f.heads;
    if (x >= s.v_vectors) return task;
    task.n = kHalf && x + s.chunks < s.v_vectors ? 2 : 1;
    task.second = s.chunks * 16;
    task.in = v_row_in(s, at) + (head * s.v_head + x * 16);
    if (loading) return task;
    if (v_row >= 0) {
      task.out[1] = s.v_cache.data + (v_row + (head * s.v_cache.head_bytes + ((x * 16) >> s.cache_shift)));
      task.scale = fast_cache_scale(s.v_cache, head);
      task.multiply = s.v_cache.op == ScaleOp::multiply;
    }
  }
  if (task.out[0] == nullptr && task.out[1] == nullptr) task.n = 0;
  return task;
}

/// 16-byte loads and stores of global memory. Every pointer the fast store reads or writes is in
/// global memory (the entry points check them), but pointers chosen among q, k_out and the caches
/// lose that to the compiler, which then emits generic LD/ST (an address-space test per access);
/// the assumption restores LDG.E.128 / STG.E.128 (tests/cuda_sass_check.cmake).
ROTARY_HD inline Vec16 load_global(const unsigned char* p) {
#if defined(__CUDA_ARCH__)
  __builtin_assume(__isGlobal(p));
#endif
  return load_vec(p);
}
ROTARY_HD inline void store_global(unsigned char* p, const Vec16& v) {
#if defined(__CUDA_ARCH__)
  __builtin_assume(__isGlobal(p));
#endif
  store_vec(p, v);
}

/// A vector's lanes quantised (store_converted's rule: the scale in float, one rounding to the
/// code) and stored whole at p: 8 codes (16-bit data) or 4 (f32) in one 8- or 4-byte store.
struct alignas(8) Codes8 {
  uint32_t w[2];
};
template <class T>
ROTARY_HD inline void store_codes(unsigned char* p, const Vec16& v, DType dtype, float scale, bool multiply) {
  using L = Lanes<T>;
  constexpr int V = L::kCount;
  float x[V];
  L::unpack(v, x);
  uint32_t w[V / 4] = {};
  const ScaleOp op = multiply ? ScaleOp::multiply : ScaleOp::divide;
  ROTARY_UNROLL
  for (int i = 0; i < V; ++i) {
    const float y = scale_for_code(x[i], scale, op);
    const uint8_t code = dtype == DType::fp8_e4m3   ? float_to_fp8(y, e4m3_format())
                         : dtype == DType::fp8_e5m2 ? float_to_fp8(y, e5m2_format())
                                                    : static_cast<uint8_t>(float_to_i8(y));
    w[i / 4] |= static_cast<uint32_t>(code) << (8 * (i % 4));
  }
#if defined(__CUDA_ARCH__)
  __builtin_assume(__isGlobal(p));
  if constexpr (V == 8) {
    *reinterpret_cast<Codes8*>(p) = Codes8{{w[0], w[1]}};
  } else {
    *reinterpret_cast<uint32_t*>(p) = w[0];
  }
#else
  std::memcpy(p, w, sizeof w);
#endif
}

template <bool kHalf>
ROTARY_HD inline void fast_store_load(const FastStoreTask& task, Vec16 (&data)[FastThread<kHalf>::kVectors]) {
  // Both registers written on every path (a vector written on some paths only is kept in local
  // memory across phase A's barrier by the compiler).
  data[0] = load_global(task.in);
  if constexpr (kHalf) data[1] = task.n == 2 ? load_global(task.in + task.second) : data[0];
}

/// What a normalised head's lanes need (qk_norm_rope): the head's norm factor and its weights (as
/// normalise multiplies by them; null: none), per channel.
struct FastNorm {
  float r = 1.0f;
  const float* weight = nullptr;
  bool gemma = false;
};

/// normalise (src/fused/body.hpp) of one value of channel c: x r, rounded to T at the model's point,
/// times the weight.
template <class T>
ROTARY_HD inline float fast_normalise(float x, const FastNorm& norm, int c) {
  const float y = mul_rn(x, norm.r);
  if (norm.weight == nullptr) return round_to<T>(y);
  const float weight = norm.weight[c];
  if (norm.gemma) return round_to<T>(mul_rn(y, weight));
  return round_to<T>(mul_rn(round_to<T>(y), weight));
}

/// Rotates (or copies) a task's loaded vectors and stores them at each of its outputs; with kNorm,
/// a q or k head's lanes are normalised first (`norm`), its pass-through lanes too.
template <class T, bool kHalf, bool kNorm = false, bool kQuant = false>
ROTARY_HD inline void fast_store_emit(const FastStoreTask& task, const Vec16 (&data)[FastThread<kHalf>::kVectors],
                                      const FastAngles<T, kHalf>& angle, const FastNorm& norm = {},
                                      int32_t partner = 0, const FastStoreArgs* s = nullptr) {
  static_cast<void>(partner);  // half pairing only
  using L = Lanes<T>;
  constexpr int V = L::kCount;
  Vec16 result[FastThread<kHalf>::kVectors];
  const int channel = task.channel_bytes / static_cast<int>(sizeof(typename L::Bits));
  const bool normed = kNorm && task.operand >= 0;
  if (!task.rotate) {
    ROTARY_UNROLL
    for (int i = 0; i < FastThread<kHalf>::kVectors; ++i) result[i] = data[i];
    if (normed) {  // a pass-through vector of q or k: normalised, not copied
      float e[V];
      L::unpack(data[0], e);
      ROTARY_UNROLL
      for (int i = 0; i < V; ++i) e[i] = fast_normalise<T>(e[i], norm, channel + i);
      result[0] = L::pack(e);
    }
  } else if constexpr (kHalf) {
    float a[V], b[V], a_out[V], b_out[V];
    L::unpack(data[0], a);
    L::unpack(data[1], b);
    if (normed) {
      ROTARY_UNROLL
      for (int i = 0; i < V; ++i) {
        a[i] = fast_normalise<T>(a[i], norm, channel + i);
        b[i] = fast_normalise<T>(b[i], norm, channel + partner + i);
      }
    }
    ROTARY_UNROLL
    for (int i = 0; i < V; ++i) rotate_pair(a[i], b[i], angle.cos[i], angle.sin[i], a_out[i], b_out[i]);
    result[0] = L::pack(a_out);
    result[1] = L::pack(b_out);
  } else {
    float e[V], e_out[V];
    L::unpack(data[0], e);
    if (normed) {
      ROTARY_UNROLL
      for (int i = 0; i < V; ++i) e[i] = fast_normalise<T>(e[i], norm, channel + i);
    }
    ROTARY_UNROLL
    for (int i = 0; i < V / 2; ++i) {
      rotate_pair(e[2 * i], e[2 * i + 1], angle.cos[i], angle.sin[i], e_out[2 * i], e_out[2 * i + 1]);
    }
    result[0] = L::pack(e_out);
  }
  if (task.out[0] != nullptr) {
    store_global(task.out[0], result[0]);
    if constexpr (kHalf) {
      if (task.n == 2) store_global(task.out[0] + task.second, result[1]);
    }
  }
  if (task.out[1] != nullptr) {
    if constexpr (kQuant) {  // the cache's codes of the values k_out (or v) holds
      store_codes<T>(task.out[1], result[0], s->cache_dtype, task.scale, task.multiply);
      if constexpr (kHalf) {
        if (task.n == 2) {
          store_codes<T>(task.out[1] + (task.second >> s->cache_shift), result[1], s->cache_dtype, task.scale,
                         task.multiply);
        }
      }
    } else {
      static_cast<void>(s);
      store_global(task.out[1], result[0]);
      if constexpr (kHalf) {
        if (task.n == 2) store_global(task.out[1] + task.second, result[1]);
      }
    }
  }
}

/// Phase A of tile `tile` for thread (x, y) of a (chunks, rows) block in head group `group`. With
/// kNorm no head is loaded ahead (phase N lies between; phase B loads them all) and the weights go
/// to shared memory.
template <class T, bool kHalf, bool kNorm = false>
ROTARY_HD inline void fast_store_phase_a(const KernelArgs& args, const FastStoreArgs& s, const PairArrays& pairs,
                                         int64_t tile, int group, int x, int y, int chunks, int rows,
                                         const FastStoreShared& sh, FastThread<kHalf>& th) {
  const FastArgs& f = s.rope;
  const int tile_mask = (1 << f.tile_shift) - 1;
  const int64_t first = tile << f.tile_shift;
  if constexpr (kNorm) {
    // The weights as normalise multiplies by them: w, or weight_offset + w rounded once.
    for (int c = y * chunks + x; c < 2 * s.head_dim; c += chunks * rows) {
      const int o = c >= s.head_dim ? 1 : 0;
      const int i = c - o * s.head_dim;
      const KernelWeight w = o == 0 ? s.q_weight : s.k_weight;
      if (w.data == nullptr) continue;
      float* to = o == 0 ? sh.weight[0] : sh.weight[1];  // selected: an indexed array lives in local memory
#if defined(__CUDA_ARCH__)
      to[i] = s.weight_offset == 0.0f ? load_weight(w, i) : __fadd_rn(s.weight_offset, load_weight(w, i));
#else
      to[i] = s.weight_offset == 0.0f ? load_weight(w, i) : s.weight_offset + load_weight(w, i);
#endif
    }
  } else {
    const int64_t token = first + (y & tile_mask);
    const int head0 = group * f.group_heads;
    const int heads = min_int(f.group_heads, s.heads - head0);
    const int h = y >> f.tile_shift;
    if (token < f.tokens && h < heads) {
      const FastStoreTask task = fast_store_task<kHalf>(s, fast_store_token(s, token), head0 + h, x, -1, -1, true);
      if (task.n > 0) fast_store_load<kHalf>(task, th.data[0]);
    }
  }
  // The angle cells (apply's), and each token's slot, read once: beyond a cache it writes no cache and
  // is flagged (as token_slot and the general kernel); negative: no cache write.
  fast_angle_cells(args, f, pairs, tile, x, y, chunks, rows, sh.cells, [&](int t, int64_t token) {
    const int64_t slot = s.slots == nullptr ? -1 : slot_entry(s.slots, s.slots_i64, token);
    const bool beyond = slot >= s.k_cache.capacity || (s.has_v && slot >= s.v_cache.capacity);
    if (beyond) raise_error(args.error, kSlotOutOfRange);
    const bool write = slot >= 0 && !beyond;
    sh.k_row[t] = write ? fast_cache_row(s.k_cache, slot) : -1;
    sh.v_row[t] = write && s.has_v ? fast_cache_row(s.v_cache, slot) : -1;
  });
}

/// Phase N of the tile (kNorm; after phase A's barrier): the norm factor of each (token, q or k head)
/// of the tile and group, one thread each: the head's squares summed in double in channel order
/// (head_norm's order: one thread alone, so the same bits), read as 16-byte vectors four at a time.
/// Written to sh.r[(head of the group << tile_shift) | token of the tile].
template <class T>
ROTARY_HD inline void fast_store_phase_n(const FastStoreArgs& s, int64_t tile, int group, int x, int y, int chunks,
                                         int rows, const FastStoreShared& sh) {
  using L = Lanes<T>;
  constexpr int V = L::kCount;
  const FastArgs& f = s.rope;
  const int head0 = group * f.group_heads;
  const int heads = min_int(f.group_heads, f.heads - head0);  // the group's q and k heads
  const int vectors = s.head_dim / V;
  for (int n = y * chunks + x; n < (heads << f.tile_shift); n += chunks * rows) {
    const int t = n & ((1 << f.tile_shift) - 1);
    const int64_t token = (tile << f.tile_shift) + t;
    if (token >= f.tokens || sh.cells.skip[t] != 0) continue;
    const int g = head0 + (n >> f.tile_shift);
    const bool is_k = g >= f.heads_q;
    const unsigned char* row = head_in(f, is_k, fast_store_token(s, token), is_k ? g - f.heads_q : g);
    double sum = 0;
    for (int m = 0; m < vectors; m += 4) {
      Vec16 v[4];
      ROTARY_UNROLL
      for (int i = 0; i < 4; ++i) {
        if (m + i < vectors) v[i] = load_global(row + (m + i) * 16);
      }
      ROTARY_UNROLL
      for (int i = 0; i < 4; ++i) {
        if (m + i >= vectors) break;
        float lanes[V];
        L::unpack(v[i], lanes);
        ROTARY_UNROLL
        for (int l = 0; l < V; ++l) sum = square_add(sum, lanes[l]);
      }
    }
    sh.r[n] = norm_factor(sum, s.head_dim, s.eps);
  }
}

/// A q or k task's norm (kNorm): its head's factor from phase N and its operand's weights.
ROTARY_HD inline FastNorm fast_task_norm(const FastStoreArgs& s, const FastStoreShared& sh, const FastStoreTask& task,
                                         int head_in_group, int t) {
  FastNorm norm;
  if (task.operand < 0) return norm;
  norm.r = sh.r[(head_in_group << s.rope.tile_shift) | t];
  // (Selected, not indexed by the run-time operand: an indexed array would be kept in local memory.)
  const bool q = task.operand == 0;
  norm.weight = (q ? s.q_weight.data : s.k_weight.data) == nullptr ? nullptr : q ? sh.weight[0] : sh.weight[1];
  norm.gemma = s.gemma;
  return norm;
}

/// Phase B of the tile (after the barrier). kQuant: both caches quantised (codes of s.cache_dtype).
template <class T, bool kHalf, bool kNorm = false, bool kQuant = false>
ROTARY_HD inline void fast_store_phase_b(const FastStoreArgs& s, int64_t tile, int group, int x, int y, int rows,
                                         const FastStoreShared& sh, const FastThread<kHalf>& th) {
  using Thread = FastThread<kHalf>;
  // With a norm, one head at a time: its loads hit the caches phase N just filled, and the norm's
  // work per lane leaves no registers for a second head in flight.
  constexpr int kBatch = kNorm ? 1 : Thread::kBatch;
  const FastArgs& f = s.rope;
  const int t = y & ((1 << f.tile_shift) - 1);
  const int64_t token = (tile << f.tile_shift) + t;
  const int head0 = group * f.group_heads;
  const int heads = min_int(f.group_heads, s.heads - head0);
  const int first_row = y >> f.tile_shift;
  if (token >= f.tokens || first_row >= heads || sh.cells.skip[t] != 0) return;
  const int64_t k_row = sh.k_row[t];
  const int64_t v_row = sh.v_row[t];
  FastAngles<T, kHalf> angle{};  // pass-through and v slots read none
  if (x < f.rotated_chunks) {
    constexpr int kPairs = FastAngles<T, kHalf>::kPairs;
    load_cells(sh.cells.cos + t * f.pairs + x * kPairs, angle.cos);
    load_cells(sh.cells.sin + t * f.pairs + x * kPairs, angle.sin);
  }
  const FastStoreToken at = fast_store_token(s, token);
  const int row_step = rows >> f.tile_shift;
  const int32_t partner = f.pairs;  // half pairing: the partner vector's first channel, after `channel`
  if constexpr (!kNorm) {
    const FastStoreTask task = fast_store_task<kHalf>(s, at, head0 + first_row, x, k_row, v_row, false);
    if (task.n > 0) fast_store_emit<T, kHalf, false, kQuant>(task, th.data[0], angle, {}, 0, &s);
  } else {
    static_cast<void>(th);
  }
  for (int base = first_row + (kNorm ? 0 : row_step); base < heads; base += kBatch * row_step) {
    // Only the vectors are held across the batch: each task's addresses are formed again for its
    // stores (a few integer operations; holding them would cost ~10 registers per task).
    Vec16 data[kBatch][Thread::kVectors] = {};
    bool live[kBatch];
    ROTARY_UNROLL
    for (int i = 0; i < kBatch; ++i) {
      const int h = base + i * row_step;
      live[i] = false;
      if (h < heads) {
        const FastStoreTask task = fast_store_task<kHalf>(s, at, head0 + h, x, k_row, v_row, false);
        live[i] = task.n > 0;
        if (live[i]) fast_store_load<kHalf>(task, data[i]);
      }
    }
    ROTARY_UNROLL
    for (int i = 0; i < kBatch; ++i) {
      if (live[i]) {
        const int h = base + i * row_step;
        const FastStoreTask task = fast_store_task<kHalf>(s, at, head0 + h, x, k_row, v_row, false);
        if constexpr (kNorm) {
          fast_store_emit<T, kHalf, true>(task, data[i], angle, fast_task_norm(s, sh, task, h, t), partner);
        } else {
          fast_store_emit<T, kHalf, false, kQuant>(task, data[i], angle, {}, 0, &s);
        }
      }
    }
  }
  // v heads longer than the vector registers reach (v's head_dim above k's): the rest one at a time.
  const int reach = x + Thread::kVectors * s.chunks;
  if (v_row < 0 || reach >= s.v_vectors) return;
  for (int h = first_row; h < heads; h += row_step) {
    const int v_head = head0 + h - f.heads;
    if (v_head < 0) continue;
    const unsigned char* in = v_row_in(s, at) + v_head * s.v_head;
    unsigned char* out = s.v_cache.data + (v_row + v_head * s.v_cache.head_bytes);
    for (int vec = reach; vec < s.v_vectors; vec += s.chunks) {
      if constexpr (kQuant) {
        store_codes<T>(out + ((vec * 16) >> s.cache_shift), load_global(in + vec * 16), s.cache_dtype,
                       fast_cache_scale(s.v_cache, v_head), s.v_cache.op == ScaleOp::multiply);
      } else {
        store_global(out + vec * 16, load_global(in + vec * 16));
      }
    }
  }
}

}  // namespace rotary::detail::cuda
