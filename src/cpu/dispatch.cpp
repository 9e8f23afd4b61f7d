// The CPU path: one OpenMP loop over (token, head-range) blocks; per-target kernels stay
// single-threaded. Every output element is a pure function of its input pair and its token's
// angles, so the results are bit-identical for any thread count.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "../kernel/pairs.hpp"
#include "../kernel/storage.hpp"
#include "../math/hd.hpp"
#include "cpu.hpp"
#include "rotary/apply.hpp"

namespace rotary::detail {
namespace {

// Below this many bytes moved, a fork/join costs more than the work.
constexpr int64_t kParallelBytes = int64_t{1} << 18;
// Scratch for one token's angles lives on the stack up to this rotary_dim.
constexpr int64_t kStackRotaryDim = 1024;

// Out of place, calls moving at least this many bytes (read + written) store non-temporally
// (RowArgs::stream): their output cannot stay in the last-level cache anyway. The cache as the
// kernel reports it to this machine (sysfs: a VM's share), else as the processor reports it
// (sysconf), else 32 MiB.
int64_t last_level_cache_bytes() {
  static const int64_t bytes = [] {
    int64_t found = 0;
    if (FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r")) {
      long long kib = 0;
      char unit = 0;
      if (std::fscanf(f, "%lld%c", &kib, &unit) == 2 && unit == 'K' && kib > 0) found = kib << 10;
      std::fclose(f);
    }
#ifdef _SC_LEVEL3_CACHE_SIZE
    if (found <= 0) found = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    return found > 0 ? found : int64_t{32} << 20;
  }();
  return bytes;
}
std::atomic<int64_t> stream_min_bytes_override{-1};
std::atomic<int64_t> streamed_calls{0};
std::atomic<int64_t> prefetch_min_bytes_override{-1};
std::atomic<int64_t> prefetched_calls{0};
std::atomic<int64_t> prefetch_distances{0};

// One token's angles. Float rows (f32/f16/bf16) point into the table when they can; double rows
// serve f64 storage. `lanes` is what the vector kernels read (PrepareLanes).
struct TokenAngles {
  const float* c = nullptr;
  const float* s = nullptr;
  const double* dc = nullptr;
  const double* ds = nullptr;
  const float* lanes = nullptr;
};

// Per-thread scratch: the angle rows (pairs = rotary_dim / 2 each) and the lanes.
struct Scratch {
  AngleScratch angles;
  float* lanes;  // 2 * rotary_dim
};

bool any_contiguous(const KernelArgs& args) {
  for (int o = 0; o < args.operand_count; ++o) {
    const KernelOperand& op = args.operands[o];
    if (op.in_strides[3] == 1 && op.out_strides[3] == 1) return true;
  }
  return false;
}

// xpos_operand: the operand whose xPos scale the row takes (null: no xPos).
TokenAngles prepare_angles(const KernelArgs& args, int64_t token, int64_t t, const Scratch& scratch,
                           bool build_lanes, const KernelOperand* xpos_operand) {
  TokenAngles angles;
  if (args.dtype == DType::f64) {
    DoubleRow row = double_angle_row(args, token, t, scratch.angles);
    if (xpos_operand != nullptr) row = xpos_double_row(args, token, t, row, *xpos_operand, scratch.angles);
    angles.dc = row.c;
    angles.ds = row.s;
    return angles;
  }
  FloatRow row = float_angle_row(args, token, t, scratch.angles);
  if (xpos_operand != nullptr) row = xpos_float_row(args, token, t, row, *xpos_operand, scratch.angles);
  angles.c = row.c;
  angles.s = row.s;
  if (build_lanes) {
    // Per block (block_half): block k's pairs and lanes at k * w/2 and 2 * k * w.
    const bool interleaved = args.pair_step == 2;
    const int64_t blocks = slice_blocks(args);
    const int64_t w = args.rotary_dim / blocks;
    for (int64_t k = 0; k < blocks; ++k) {
      const float* c = angles.c + k * (w / 2);
      const float* s = angles.s + k * (w / 2);
      float* lanes = scratch.lanes + 2 * k * w;
      switch (args.dtype) {
        case DType::f32: prepare_lanes_f32(c, s, w / 2, interleaved, lanes); break;
        case DType::f16: prepare_lanes_f16(c, s, w / 2, interleaved, lanes); break;
        case DType::bf16: prepare_lanes_bf16(c, s, w / 2, interleaved, lanes); break;
        default: break;  // f64: no lanes; cache dtypes never reach apply (validate refuses them)
      }
    }
    angles.lanes = scratch.lanes;
  }
  return angles;
}

// Any strides (and f64 storage): the kernel layer's scalar head loop (src/kernel/pairs.hpp), the
// reference's and the CUDA general kernel's, over this token's row.
template <class T, class Value>
void rotate_strided(const KernelArgs& args, const KernelOperand& op, HeadOffsets at, int64_t heads, const Value* c,
                    const Value* s) {
  for (int64_t head = 0; head < heads; ++head) {
    const HeadOffsets h{at.in + head * op.in_strides[2], at.out + head * op.out_strides[2]};
    rotate_head<T>(args, op, h, [&](int64_t j) { return AngleCell<Value>{c[j], s[j]}; });
  }
}

// Bytes from a head's row to the same head of the token to prefetch (RowArgs::prefetch_in/out).
struct PrefetchBytes {
  int64_t in = 0;
  int64_t out = 0;
};

// The token `token + ahead` whose rows a call that streams from memory prefetches, ahead far enough
// that the operand's rows in between span kPrefetchDistance bytes; none at or past `limit`.
PrefetchBytes prefetch_ahead(const KernelArgs& args, const KernelOperand& op, int64_t token, int64_t limit,
                             bool stream) {
  const int64_t es = size_of(args.dtype);
  const int64_t row_bytes = std::max<int64_t>(op.heads * args.head_dim * es, 1);
  const int64_t ahead = std::max<int64_t>((kPrefetchDistance + row_bytes - 1) / row_bytes, 1);
  const int64_t later = token + ahead;
  if (later >= limit) return {};
  const HeadOffsets here = head_offsets(op, token / args.seq, token % args.seq, 0);
  const HeadOffsets there = head_offsets(op, later / args.seq, later % args.seq, 0);
  PrefetchBytes p{(there.in - here.in) * es, 0};
  // The destination's lines: read before they are written, unless the stores stream.
  if (!op.in_place && !stream) p.out = (there.out - here.out) * es;
  if (p.in != 0 || p.out != 0) count_prefetch_distance();
  return p;
}

// norm: the fused norm (RowNorm; r null: none), which only the contiguous rows take (cpu_apply_tokens).
void rotate_block(const KernelArgs& args, const KernelOperand& op, int64_t b, int64_t token_in_seq,
                  int64_t first_head, int64_t heads, const TokenAngles& angles, bool stream,
                  PrefetchBytes prefetch, const RowNorm& norm) {
  const HeadOffsets at = head_offsets(op, b, token_in_seq, first_head);
  const bool contiguous = op.in_strides[3] == 1 && op.out_strides[3] == 1;
  // cpu_rows.cpp's one_pass_norm gives a norm to such rows only.
  ROTARY_DASSERT(norm.r == nullptr || (contiguous && args.dtype != DType::f64 && slice_blocks(args) == 1));
  if (contiguous && args.dtype != DType::f64) {
    const int64_t es = size_of(args.dtype);
    RowArgs row;
    row.in = static_cast<const unsigned char*>(op.in) + at.in * es;
    row.out = static_cast<unsigned char*>(op.out) + at.out * es;
    row.heads = heads;
    row.in_head_stride = op.in_strides[2];
    row.out_head_stride = op.out_strides[2];
    row.rotary_dim = args.rotary_dim;
    row.head_dim = args.head_dim;
    row.rotary_offset = args.rotary_offset;
    row.blocks = slice_blocks(args);
    row.interleaved = args.pair_step == 2;
    row.copy_tail = copies_tail(args, op) || norm.r != nullptr;  // with a norm: every channel written
    row.stream = stream && !op.in_place;
    row.caller_angles = args.angle_source == KernelAngleSource::caller;
    row.prefetch_in = prefetch.in;
    row.prefetch_out = prefetch.out;
    row.c = angles.c;
    row.s = angles.s;
    row.lanes = angles.lanes;
    if (norm.r != nullptr) {
      row.norm = norm;
      row.norm.r = norm.r + first_head * norm.r_stride;
      if (norm.w != nullptr) row.norm.w = norm.w + first_head * norm.w_head_stride;
    }
    switch (args.dtype) {
      case DType::f32: rotate_heads_f32(row); break;
      case DType::f16: rotate_heads_f16(row); break;
      case DType::bf16: rotate_heads_bf16(row); break;
      default: break;  // f64 takes the strided path; cache dtypes never reach apply
    }
    return;
  }
  switch (args.dtype) {
    case DType::f32: rotate_strided<float>(args, op, at, heads, angles.c, angles.s); break;
    case DType::f64: rotate_strided<double>(args, op, at, heads, angles.dc, angles.ds); break;
    case DType::f16: rotate_strided<F16>(args, op, at, heads, angles.c, angles.s); break;
    case DType::bf16: rotate_strided<BF16>(args, op, at, heads, angles.c, angles.s); break;
    default: break;  // cache dtypes never reach apply (validate refuses them)
  }
}

// per_token caller angles whose row strides are 0: every token reads the same row.
bool broadcast_caller_row(const KernelArgs& args) {
  if (args.angle_source != KernelAngleSource::caller || args.angles.per_position) return false;
  const KernelCallerAngles& a = args.angles;
  return a.cos_strides[0] == 0 && a.cos_strides[1] == 0 && a.sin_strides[0] == 0 && a.sin_strides[1] == 0;
}

// prefetch_limit: tokens below it may be prefetched (whole tokens only); 0: none.
// norms: per operand (null: none).
void run_blocks(const KernelArgs& args, int64_t first, int64_t last, int64_t split, bool stream,
                int64_t prefetch_limit, const RowNorm* norms, const Scratch& scratch) {
  const bool build_lanes = args.dtype != DType::f64 && any_contiguous(args);
  // The caller's cos/sin broadcast over every token (rerotate's one row): built once.
  const bool same_row = broadcast_caller_row(args) && first < last;
  TokenAngles one_row;
  if (same_row) {
    const int64_t token = first / split;
    one_row = prepare_angles(args, token, token % args.seq, scratch, build_lanes, nullptr);
  }
  const bool xpos = args.xpos_scale_base != 0;
  for (int64_t block = first; block < last; ++block) {
    const bool whole = split == 1;  // one block per token (prefill, batched decode): no division
    const int64_t token = whole ? block : block / split;
    const int64_t part = whole ? 0 : block % split;
    const int64_t b = token / args.seq;
    const int64_t t = token % args.seq;
    TokenAngles angles = one_row;
    if (!xpos && !same_row) angles = prepare_angles(args, token, t, scratch, build_lanes, nullptr);
    for (int o = 0; o < args.operand_count; ++o) {
      const KernelOperand& op = args.operands[o];
      const int64_t h0 = whole ? 0 : part * op.heads / split;
      const int64_t h1 = whole ? op.heads : (part + 1) * op.heads / split;
      if (h1 <= h0) continue;
      // xPos: the row scaled for this operand (a query's or a key's σ), built per operand.
      if (xpos) angles = prepare_angles(args, token, t, scratch, build_lanes, &op);
      // Whole tokens only (a split token's parts are cache-resident decode rows).
      const PrefetchBytes ahead =
          prefetch_limit > 0 && whole ? prefetch_ahead(args, op, token, prefetch_limit, stream) : PrefetchBytes{};
      rotate_block(args, op, b, t, h0, h1 - h0, angles, stream, ahead, norms != nullptr ? norms[o] : RowNorm{});
    }
  }
  if (stream) stream_fence();
}

// Runs blocks [first, last) with scratch on the stack when it fits.
void run_with_scratch(const KernelArgs& args, int64_t first, int64_t last, int64_t split, bool stream,
                      int64_t prefetch_limit, const RowNorm* norms = nullptr) {
  const int64_t r = args.rotary_dim;
  const int64_t h = r / 2;
  auto carve = [&](float* floats, double* doubles) {
    return Scratch{AngleScratch{floats, floats + h, doubles, doubles + h, doubles + 2 * h},
                   floats + r};
  };
  if (r <= kStackRotaryDim) {
    alignas(64) std::array<float, 3 * kStackRotaryDim> floats;
    alignas(64) std::array<double, 3 * kStackRotaryDim / 2> doubles;
    run_blocks(args, first, last, split, stream, prefetch_limit, norms, carve(floats.data(), doubles.data()));
  } else {
    std::vector<float> floats(static_cast<size_t>(3 * r));
    std::vector<double> doubles(static_cast<size_t>(3 * h));
    run_blocks(args, first, last, split, stream, prefetch_limit, norms, carve(floats.data(), doubles.data()));
  }
}

}  // namespace

void stream_fence() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_sfence();
#endif
}

int64_t stream_min_bytes() {
  const int64_t forced = stream_min_bytes_override.load(std::memory_order_relaxed);
  return forced >= 0 ? forced : last_level_cache_bytes();
}

namespace {
std::atomic<int64_t>& min_bytes_override(Threshold which) {
  return which == Threshold::stream ? stream_min_bytes_override : prefetch_min_bytes_override;
}
}  // namespace

ScopedMinBytes::ScopedMinBytes(Threshold which, int64_t bytes)
    : which_(which), previous_(min_bytes_override(which).exchange(bytes)) {}
ScopedMinBytes::~ScopedMinBytes() { min_bytes_override(which_).store(previous_); }

int64_t streamed_call_count() { return streamed_calls.load(); }

int64_t prefetch_min_bytes() {
  const int64_t forced = prefetch_min_bytes_override.load(std::memory_order_relaxed);
  return forced >= 0 ? forced : kPrefetchMinBytes;
}

int64_t prefetched_call_count() { return prefetched_calls.load(); }
void count_prefetched_call() { prefetched_calls.fetch_add(1, std::memory_order_relaxed); }
int64_t prefetch_distance_count() { return prefetch_distances.load(); }
void count_prefetch_distance() {
  // Counted only under a test's override: the rows ask once per token, and an atomic add there
  // would cost every call.
  if (prefetch_min_bytes_override.load(std::memory_order_relaxed) >= 0) {
    prefetch_distances.fetch_add(1, std::memory_order_relaxed);
  }
}

int useful_threads(int requested, int64_t blocks) {
  // Counted once: omp_get_num_procs() asks the kernel for the affinity mask (~1.5 µs a call).
  static const int processors = omp_get_num_procs();
  const int64_t wanted = requested > 0 ? requested : omp_get_max_threads();
  const int64_t team = std::min<int64_t>({wanted, processors, max_threads, blocks});
  return static_cast<int>(std::max<int64_t>(team, 1));
}

void cpu_apply_tokens(const KernelArgs& args, int64_t first, int64_t last, int64_t prefetch_limit,
                      const RowNorm* norms) {
  if (first < last) run_with_scratch(args, first, last, 1, false, prefetch_limit, norms);
}

void cpu_apply(const KernelArgs& args) {
  const int64_t tokens = args.tokens;
  int64_t elements = 0;
  bool out_of_place = false;
  int64_t max_heads = 1;
  for (int o = 0; o < args.operand_count; ++o) {
    const KernelOperand& op = args.operands[o];
    elements += tokens * op.heads * args.head_dim;
    out_of_place = out_of_place || !op.in_place;
    max_heads = std::max(max_heads, op.heads);
  }
  const int64_t bytes = 2 * elements * size_of(args.dtype);
  const bool stream = out_of_place && bytes >= stream_min_bytes();
  if (stream) streamed_calls.fetch_add(1, std::memory_order_relaxed);
  const bool prefetch = bytes >= prefetch_min_bytes();
  if (prefetch) count_prefetched_call();
  // At most tokens * max_heads threads, so that blocks >= threads whatever the split below.
  const int threads = bytes < kParallelBytes ? 1 : useful_threads(args.threads, tokens * max_heads);
  // Few tokens (decode): split heads too, so every thread gets a block.
  int64_t split = 1;
  if (threads > 1 && tokens < 4 * threads) {
    split = std::min<int64_t>(max_heads, (4 * threads + tokens - 1) / tokens);
  }
  const int64_t blocks = tokens * split;
  if (threads <= 1) {
    run_with_scratch(args, 0, blocks, split, stream, prefetch ? blocks : 0);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    // Static, contiguous chunks: each thread one range of blocks.
    const int64_t count = omp_get_num_threads();
    const int64_t me = omp_get_thread_num();
    const int64_t first = blocks * me / count;
    const int64_t last = blocks * (me + 1) / count;
    run_with_scratch(args, first, last, split, stream, prefetch ? last : 0);
  }
}

}  // namespace rotary::detail
