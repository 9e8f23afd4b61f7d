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

#include "../half.hpp"
#include "../rotate.hpp"
#include "cpu.hpp"

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

// One token's angles. Float rows (f32/f16/bf16) point into the table when they can; double rows
// serve f64 storage. `layout` is what the vector kernels read (PrepareLayout).
struct TokenAngles {
  const float* c = nullptr;
  const float* s = nullptr;
  const double* dc = nullptr;
  const double* ds = nullptr;
  const float* layout = nullptr;
};

// Per-thread scratch: the angle rows (pairs = rotary_dim / 2 each) and the layout.
struct Scratch {
  AngleScratch angles;
  float* layout;  // 2 * rotary_dim
};

bool any_contiguous(const Plan& plan) {
  for (int o = 0; o < plan.operand_count; ++o) {
    const Operand& op = plan.operands[static_cast<size_t>(o)];
    if (op.in_strides[3] == 1 && op.out_strides[3] == 1) return true;
  }
  return false;
}

// xpos_operand: the operand whose xPos scale the row takes (null: no xPos).
TokenAngles prepare_angles(const Plan& plan, int64_t token, int64_t t, const Scratch& scratch,
                           bool build_layout, const Operand* xpos_operand) {
  TokenAngles angles;
  if (plan.dtype == DType::f64) {
    DoubleRow row = double_angle_row(plan, token, t, scratch.angles, /*vectorised=*/true);
    if (xpos_operand != nullptr) row = xpos_double_row(plan, token, t, row, *xpos_operand, scratch.angles);
    angles.dc = row.c;
    angles.ds = row.s;
    return angles;
  }
  FloatRow row = float_angle_row(plan, token, t, scratch.angles, /*vectorised=*/true);
  if (xpos_operand != nullptr) row = xpos_float_row(plan, token, t, row, *xpos_operand, scratch.angles);
  angles.c = row.c;
  angles.s = row.s;
  if (build_layout) {
    // Per block (block_half): block k's pairs and layout at k * w/2 and 2 * k * w.
    const bool interleaved = plan.pairing == Pairing::interleaved;
    const int64_t w = plan.rotary_dim / plan.blocks;
    for (int64_t k = 0; k < plan.blocks; ++k) {
      const float* c = angles.c + k * (w / 2);
      const float* s = angles.s + k * (w / 2);
      float* layout = scratch.layout + 2 * k * w;
      switch (plan.dtype) {
        case DType::f32: prepare_layout_f32(c, s, w / 2, interleaved, layout); break;
        case DType::f16: prepare_layout_f16(c, s, w / 2, interleaved, layout); break;
        case DType::bf16: prepare_layout_bf16(c, s, w / 2, interleaved, layout); break;
        case DType::f64: break;
      }
    }
    angles.layout = scratch.layout;
  }
  return angles;
}

// Any strides (and f64 storage): scalar, the same operations as the vector kernels and the
// reference (detail::rotate_pair). Value is float for f32/f16/bf16, double for f64.
template <class T, class Value, class Load, class Store>
void rotate_strided(const Plan& plan, const Operand& op, int64_t in_offset, int64_t out_offset,
                    int64_t heads, const Value* c, const Value* s, Load load, Store store) {
  const int64_t h = plan.rotary_dim / 2;
  const Schedule& schedule = *plan.schedule;
  const int64_t slice_end = plan.rotary_offset + plan.rotary_dim;
  const auto* in = static_cast<const T*>(op.in);
  auto* out = static_cast<T*>(op.out);
  const int64_t sx = op.in_strides[3];
  const int64_t sy = op.out_strides[3];
  for (int64_t head = 0; head < heads; ++head) {
    const T* x = in + in_offset + head * op.in_strides[2];
    T* y = out + out_offset + head * op.out_strides[2];
    for (int64_t i = 0; i < h; ++i) {
      const auto [ia, ib] = schedule.channels(i);
      Value a_out, b_out;
      rotate_pair(load(x[ia * sx]), load(x[ib * sx]), c[i], s[i], a_out, b_out);
      y[ia * sy] = store(a_out);
      y[ib * sy] = store(b_out);
    }
    if (!op.in_place && plan.copy_tail) {
      for (int64_t j = 0; j < plan.rotary_offset; ++j) y[j * sy] = x[j * sx];
      for (int64_t j = slice_end; j < plan.head_dim; ++j) y[j * sy] = x[j * sx];
    }
  }
}

void rotate_block(const Plan& plan, const Operand& op, int64_t b, int64_t token_in_seq,
                  int64_t first_head, int64_t heads, const TokenAngles& angles, bool stream) {
  const int64_t in_offset =
      b * op.in_strides[0] + token_in_seq * op.in_strides[1] + first_head * op.in_strides[2];
  const int64_t out_offset =
      b * op.out_strides[0] + token_in_seq * op.out_strides[1] + first_head * op.out_strides[2];
  const bool contiguous = op.in_strides[3] == 1 && op.out_strides[3] == 1;
  if (contiguous && plan.dtype != DType::f64) {
    const int64_t es = size_of(plan.dtype);
    RowArgs args;
    args.in = static_cast<const unsigned char*>(op.in) + in_offset * es;
    args.out = static_cast<unsigned char*>(op.out) + out_offset * es;
    args.heads = heads;
    args.in_head_stride = op.in_strides[2];
    args.out_head_stride = op.out_strides[2];
    args.rotary_dim = plan.rotary_dim;
    args.head_dim = plan.head_dim;
    args.rotary_offset = plan.rotary_offset;
    args.blocks = plan.blocks;
    args.interleaved = plan.pairing == Pairing::interleaved;
    args.copy_tail = !op.in_place && plan.copy_tail;
    args.stream = stream && !op.in_place;
    args.c = angles.c;
    args.s = angles.s;
    args.layout = angles.layout;
    switch (plan.dtype) {
      case DType::f32: rotate_heads_f32(args); break;
      case DType::f16: rotate_heads_f16(args); break;
      case DType::bf16: rotate_heads_bf16(args); break;
      case DType::f64: break;
    }
    return;
  }
  const auto same = [](auto v) { return v; };
  switch (plan.dtype) {
    case DType::f32:
      rotate_strided<float>(plan, op, in_offset, out_offset, heads, angles.c, angles.s, same, same);
      break;
    case DType::f64:
      rotate_strided<double>(plan, op, in_offset, out_offset, heads, angles.dc, angles.ds, same, same);
      break;
    case DType::f16:
      rotate_strided<uint16_t>(plan, op, in_offset, out_offset, heads, angles.c, angles.s,
                               [](uint16_t v) { return f16_to_f32(v); },
                               [](float v) { return f32_to_f16(v); });
      break;
    case DType::bf16:
      rotate_strided<uint16_t>(plan, op, in_offset, out_offset, heads, angles.c, angles.s,
                               [](uint16_t v) { return bf16_to_f32(v); },
                               [](float v) { return f32_to_bf16(v); });
      break;
  }
}

// per_token caller angles whose row strides are 0: every token reads the same row.
bool broadcast_caller_row(const Plan& plan) {
  if (plan.angles == nullptr || plan.angles->index != CallerAngles::Index::per_token) return false;
  const CallerAngles& a = *plan.angles;
  return a.cos_strides[0] == 0 && a.cos_strides[1] == 0 && a.sin_strides[0] == 0 && a.sin_strides[1] == 0;
}

void run_blocks(const Plan& plan, int64_t first, int64_t last, int64_t split, bool stream,
                const Scratch& scratch) {
  const bool build_layout = plan.dtype != DType::f64 && any_contiguous(plan);
  // The caller's cos/sin broadcast over every token (rerotate's one row): built once.
  const bool same_row = broadcast_caller_row(plan) && first < last;
  TokenAngles one_row;
  if (same_row) {
    const int64_t token = first / split;
    one_row = prepare_angles(plan, token, token % plan.seq, scratch, build_layout, nullptr);
  }
  for (int64_t block = first; block < last; ++block) {
    const int64_t token = block / split;
    const int64_t part = block % split;
    const int64_t b = token / plan.seq;
    const int64_t t = token % plan.seq;
    const bool xpos = plan.schedule->xpos();
    TokenAngles angles = one_row;
    if (!xpos && !same_row) angles = prepare_angles(plan, token, t, scratch, build_layout, nullptr);
    for (int o = 0; o < plan.operand_count; ++o) {
      const Operand& op = plan.operands[static_cast<size_t>(o)];
      const int64_t h0 = part * op.heads / split;
      const int64_t h1 = (part + 1) * op.heads / split;
      if (h1 <= h0) continue;
      // xPos: the row scaled for this operand (a query's or a key's σ), built per operand.
      if (xpos) angles = prepare_angles(plan, token, t, scratch, build_layout, &op);
      rotate_block(plan, op, b, t, h0, h1 - h0, angles, stream);
    }
  }
  if (stream) stream_fence();
}

// Runs blocks [first, last) with scratch on the stack when it fits.
void run_with_scratch(const Plan& plan, int64_t first, int64_t last, int64_t split, bool stream) {
  const int64_t r = plan.rotary_dim;
  const int64_t h = r / 2;
  auto carve = [&](float* floats, double* doubles) {
    return Scratch{AngleScratch{floats, floats + h, doubles, doubles + h, doubles + 2 * h},
                   floats + r};
  };
  if (r <= kStackRotaryDim) {
    alignas(64) std::array<float, 3 * kStackRotaryDim> floats;
    alignas(64) std::array<double, 3 * kStackRotaryDim / 2> doubles;
    run_blocks(plan, first, last, split, stream, carve(floats.data(), doubles.data()));
  } else {
    std::vector<float> floats(static_cast<size_t>(3 * r));
    std::vector<double> doubles(static_cast<size_t>(3 * h));
    run_blocks(plan, first, last, split, stream, carve(floats.data(), doubles.data()));
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

ScopedStreamMinBytes::ScopedStreamMinBytes(int64_t bytes)
    : previous_(stream_min_bytes_override.exchange(bytes)) {}
ScopedStreamMinBytes::~ScopedStreamMinBytes() { stream_min_bytes_override.store(previous_); }

int64_t streamed_call_count() { return streamed_calls.load(); }

int useful_threads(int requested, int64_t blocks) {
  // Counted once: omp_get_num_procs() asks the kernel for the affinity mask (~1.5 µs a call).
  static const int processors = omp_get_num_procs();
  const int64_t wanted = requested > 0 ? requested : omp_get_max_threads();
  const int64_t team = std::min<int64_t>({wanted, processors, max_threads, blocks});
  return static_cast<int>(std::max<int64_t>(team, 1));
}

void cpu_apply(const Plan& plan) {
  const int64_t tokens = plan.batch * plan.seq;
  int64_t elements = 0;
  bool out_of_place = false;
  int64_t max_heads = 1;
  for (int o = 0; o < plan.operand_count; ++o) {
    const Operand& op = plan.operands[static_cast<size_t>(o)];
    elements += tokens * op.heads * plan.head_dim;
    out_of_place = out_of_place || !op.in_place;
    max_heads = std::max(max_heads, op.heads);
  }
  const int64_t bytes = 2 * elements * size_of(plan.dtype);
  const bool stream = out_of_place && bytes >= stream_min_bytes();
  if (stream) streamed_calls.fetch_add(1, std::memory_order_relaxed);
  // At most tokens * max_heads threads, so that blocks >= threads whatever the split below.
  const int threads = bytes < kParallelBytes ? 1 : useful_threads(plan.threads, tokens * max_heads);
  // Few tokens (decode): split heads too, so every thread gets a block.
  int64_t split = 1;
  if (threads > 1 && tokens < 4 * threads) {
    split = std::min<int64_t>(max_heads, (4 * threads + tokens - 1) / tokens);
  }
  const int64_t blocks = tokens * split;
  if (threads <= 1) {
    run_with_scratch(plan, 0, blocks, split, stream);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    // Static, contiguous chunks: each thread one range of blocks.
    const int64_t count = omp_get_num_threads();
    const int64_t me = omp_get_thread_num();
    const int64_t first = blocks * me / count;
    const int64_t last = blocks * (me + 1) / count;
    run_with_scratch(plan, first, last, split, stream);
  }
}

}  // namespace rotary::detail
