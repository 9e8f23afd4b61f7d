// The CPU path: one OpenMP loop over (token, head-range) blocks; per-target kernels stay
// single-threaded. Every output element is a pure function of its input pair and its token's
// angles, so the results are bit-identical for any thread count.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "../half.hpp"
#include "cpu.hpp"

namespace rotary::detail {
namespace {

// Below this many bytes moved, a fork/join costs more than the work.
constexpr int64_t kParallelBytes = int64_t{1} << 18;
// Scratch for one token's angles lives on the stack up to this rotary_dim.
constexpr int64_t kStackRotaryDim = 1024;

// One token's angles, in the layout RowArgs documents.
void prepare_angles(const Plan& plan, int64_t position, double* c, double* s, double* work_c,
                    double* work_s) {
  const int64_t h = plan.rotary_dim / 2;
  if (plan.table != nullptr) {
    const int64_t row = *plan.table->row_of(position);
    const float* tc = plan.table->cos_row(row);
    const float* ts = plan.table->sin_row(row);
    for (int64_t i = 0; i < h; ++i) {
      work_c[i] = tc[i];
      work_s[i] = ts[i];
    }
  } else {
    cos_sin_row(position, plan.schedule->inv_freq.data(), h, plan.schedule->attention_factor,
                work_c, work_s);
  }
  const double sign = plan.inverse ? -1.0 : 1.0;
  if (plan.pairing == Pairing::interleaved) {
    for (int64_t i = 0; i < h; ++i) {
      const double si = sign * work_s[i];
      c[2 * i] = work_c[i];
      c[2 * i + 1] = si;
      s[2 * i] = -si;
      s[2 * i + 1] = work_c[i];
    }
  } else {
    for (int64_t i = 0; i < h; ++i) {
      c[i] = work_c[i];
      s[i] = sign * work_s[i];
    }
  }
}

// Any strides: scalar, the same double operations as the vector kernels and the reference.
template <class T, class Load, class Store>
void rotate_strided(const Plan& plan, const Operand& op, int64_t in_offset, int64_t out_offset,
                    int64_t heads, const double* c, const double* s, Load load, Store store) {
  const int64_t h = plan.rotary_dim / 2;
  const bool interleaved = plan.pairing == Pairing::interleaved;
  const auto* in = static_cast<const T*>(op.in);
  auto* out = static_cast<T*>(op.out);
  for (int64_t head = 0; head < heads; ++head) {
    const T* x = in + in_offset + head * op.in_strides[2];
    T* y = out + out_offset + head * op.out_strides[2];
    const int64_t sx = op.in_strides[3];
    const int64_t sy = op.out_strides[3];
    for (int64_t i = 0; i < h; ++i) {
      const int64_t ia = interleaved ? 2 * i : i;
      const int64_t ib = interleaved ? 2 * i + 1 : i + h;
      const double ci = interleaved ? c[2 * i] : c[i];
      const double si = interleaved ? c[2 * i + 1] : s[i];
      const double a = load(x[ia * sx]);
      const double b = load(x[ib * sx]);
      y[ia * sy] = store(a * ci - b * si);
      y[ib * sy] = store(a * si + b * ci);
    }
    if (!op.in_place && plan.copy_tail) {
      for (int64_t j = plan.rotary_dim; j < plan.head_dim; ++j) y[j * sy] = x[j * sx];
    }
  }
}

void rotate_block(const Plan& plan, const Operand& op, int64_t b, int64_t token_in_seq,
                  int64_t first_head, int64_t heads, const double* c, const double* s) {
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
    args.interleaved = plan.pairing == Pairing::interleaved;
    args.copy_tail = !op.in_place && plan.copy_tail;
    args.c = c;
    args.s = s;
    switch (plan.dtype) {
      case DType::f32: rotate_heads_f32(args); break;
      case DType::f16: rotate_heads_f16(args); break;
      case DType::bf16: rotate_heads_bf16(args); break;
      case DType::f64: break;
    }
    return;
  }
  switch (plan.dtype) {
    case DType::f32:
      rotate_strided<float>(plan, op, in_offset, out_offset, heads, c, s,
                            [](float v) { return static_cast<double>(v); },
                            [](double v) { return static_cast<float>(v); });
      break;
    case DType::f64:
      rotate_strided<double>(plan, op, in_offset, out_offset, heads, c, s,
                             [](double v) { return v; }, [](double v) { return v; });
      break;
    case DType::f16:
      rotate_strided<uint16_t>(plan, op, in_offset, out_offset, heads, c, s,
                               [](uint16_t v) { return static_cast<double>(f16_to_f32(v)); },
                               [](double v) { return f32_to_f16(static_cast<float>(v)); });
      break;
    case DType::bf16:
      rotate_strided<uint16_t>(plan, op, in_offset, out_offset, heads, c, s,
                               [](uint16_t v) { return static_cast<double>(bf16_to_f32(v)); },
                               [](double v) { return f32_to_bf16(static_cast<float>(v)); });
      break;
  }
}

void run_blocks(const Plan& plan, int64_t first, int64_t last, int64_t split, double* c, double* s,
                double* work_c, double* work_s) {
  for (int64_t block = first; block < last; ++block) {
    const int64_t token = block / split;
    const int64_t part = block % split;
    const int64_t b = token / plan.seq;
    const int64_t t = token % plan.seq;
    prepare_angles(plan, plan.positions.at(token, t), c, s, work_c, work_s);
    for (int o = 0; o < plan.operand_count; ++o) {
      const Operand& op = plan.operands[static_cast<size_t>(o)];
      const int64_t h0 = part * op.heads / split;
      const int64_t h1 = (part + 1) * op.heads / split;
      if (h1 > h0) rotate_block(plan, op, b, t, h0, h1 - h0, c, s);
    }
  }
}

// Runs blocks [first, last) with scratch on the stack when it fits.
void run_with_scratch(const Plan& plan, int64_t first, int64_t last, int64_t split) {
  const int64_t r = plan.rotary_dim;
  if (r <= kStackRotaryDim) {
    std::array<double, 3 * kStackRotaryDim> scratch;
    run_blocks(plan, first, last, split, scratch.data(), scratch.data() + r, scratch.data() + 2 * r,
               scratch.data() + 2 * r + r / 2);
  } else {
    std::vector<double> scratch(static_cast<size_t>(3 * r));
    run_blocks(plan, first, last, split, scratch.data(), scratch.data() + r, scratch.data() + 2 * r,
               scratch.data() + 2 * r + r / 2);
  }
}

}  // namespace

void cpu_apply(const Plan& plan) {
  const int64_t tokens = plan.batch * plan.seq;
  int64_t elements = 0;
  int64_t max_heads = 1;
  for (int o = 0; o < plan.operand_count; ++o) {
    elements += tokens * plan.operands[static_cast<size_t>(o)].heads * plan.head_dim;
    max_heads = std::max(max_heads, plan.operands[static_cast<size_t>(o)].heads);
  }
  const int64_t bytes = 2 * elements * size_of(plan.dtype);
  int threads = plan.threads > 0 ? plan.threads : omp_get_max_threads();
  if (bytes < kParallelBytes) threads = 1;
  // Few tokens (decode): split heads too, so every thread gets a block.
  int64_t split = 1;
  if (threads > 1 && tokens < 4 * threads) {
    split = std::min<int64_t>(max_heads, (4 * threads + tokens - 1) / tokens);
  }
  const int64_t blocks = tokens * split;
  if (threads <= 1) {
    run_with_scratch(plan, 0, blocks, split);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    // Static, contiguous chunks: each thread one range of blocks.
    const int64_t count = omp_get_num_threads();
    const int64_t me = omp_get_thread_num();
    const int64_t first = blocks * me / count;
    const int64_t last = blocks * (me + 1) / count;
    run_with_scratch(plan, first, last, split);
  }
}

}  // namespace rotary::detail
