// The CUDA kernels without a GPU: their body (src/cuda/rope_body.hpp), compiled here by the host
// compiler, played over every block and thread of the launch grid (src/cuda/emulate.hpp) and
// compared BYTE FOR BYTE with rotary::apply's scalar reference (Backend::reference): every element
// of every buffer, guard zones and untouched poison included (NaNs compared as NaN). No CUDA call
// is made. The calls are tests/support/cuda_calls.hpp's, which test_cuda_device runs on a GPU.
//
// Why the host compiler: the body is the same source the device compiles, and everything that can
// go wrong in it apart from the device's arithmetic — index math over any strides, which item a
// thread takes, the grid-stride token loop, shared-memory angles against per-item angles, the tail
// copy, position reads and checks, angle values — is plain integer and IEEE code that the host runs
// the same way. The device's arithmetic differs only in spelling (the explicitly rounded intrinsics
// in rotate.hpp, half.hpp and exact_angle.hpp, each the correctly rounded operation the host
// performs), which the PTX lint (tests/cuda_ptx_check.cmake) and, on a GPU, the device tests check.
// Built by g++ it also runs under the sanitizer build.
//
// Outputs start as NaN patterns (poison) so a missed write shows; a probe counts the body's stores
// so a double write shows even where it would write the same value.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda/emulate.hpp"
#include "kernel/args.hpp"
#include "rotary/apply.hpp"
#include "support/cuda_calls.hpp"
#include "support/oracle.hpp"
#if ROTARY_TEST_CUDA_API
#include "cuda/launch.hpp"
#include "rotary/cuda.hpp"
#endif

namespace rotary {
namespace {

using namespace test;  // the calls (support/cuda_calls.hpp)
using detail::KernelArgs;
using detail::cuda::LaunchShape;

// Every store of the emulated bodies, by address, and every 16-byte access of the fast body that
// is not 16-byte aligned (a fault on a GPU).
struct CountingProbe {
  static inline std::unordered_map<const void*, int>* counts = nullptr;
  static inline int64_t misaligned = 0;
  static void stored(const void* p) { ++(*counts)[p]; }
  static void vector(const void* p) { misaligned += reinterpret_cast<uintptr_t>(p) % 16 != 0 ? 1 : 0; }
};

// A fast launch shape in words.
std::string shape_name(const detail::cuda::FastShape& s) {
  return "fast launch " + std::to_string(s.chunks) + "x" + std::to_string(s.rows) + " threads, tiles of " +
         std::to_string(1 << s.tile_shift) + ", " + std::to_string(s.groups) + " groups of " +
         std::to_string(s.group_heads) + " heads, grid " + std::to_string(s.grid);
}

// Runs `c` with `run(kernel)` (an emulated kernel over copies of arenas from `seed`) and checks every
// byte of every arena against the reference, each output element stored exactly once and every
// vector access aligned. `kind` names the kernel in failures.
template <class Run>
void check_run(const Call& c, uint64_t seed, const std::string& kind, Run run) {
  std::vector<Arena> got = make_arenas(c, seed);
  const std::vector<Arena> want = reference_result(c, got);
  const std::optional<Table> table = table_of(c);
  CallerAngles angles;
  const ApplyArgs args = args_of(c, got, table ? &*table : nullptr, &angles);
  validate(c.schedule, args);
  const KernelArgs kernel = detail::make_kernel_args(c.schedule, args);
  std::unordered_map<const void*, int> counts;
  CountingProbe::counts = &counts;
  CountingProbe::misaligned = 0;
  const std::string what = c.describe() + ", " + run(kernel);

  const std::string difference = first_difference(c, got, want);
  ASSERT_TRUE(difference.empty()) << kind << ": " << what << ": " << difference;
  int64_t expected = 0;
  const int64_t tail = c.head_dim - c.schedule.rotary_dim;
  for (const auto& [heads, in_place] : {std::pair{c.heads_q, c.q_in_place}, std::pair{c.heads_k, c.k_in_place}}) {
    expected += c.batch * c.seq * heads * (c.schedule.rotary_dim + (c.copy_tail && !in_place ? tail : 0));
  }
  ASSERT_EQ(static_cast<int64_t>(counts.size()), expected) << kind << ": " << what << ": elements stored";
  for (const auto& [address, n] : counts) {
    ASSERT_EQ(n, 1) << kind << ": " << what << ": an element stored " << n << " times";
  }
  ASSERT_EQ(CountingProbe::misaligned, 0) << kind << ": " << what << ": 16-byte accesses not 16-byte aligned";
}

// The choice of kernel for `c` (from the arguments over its arenas; every copy of them is aligned
// alike, so every copy gets the same choice).
detail::cuda::KernelChoice choice_of(const Call& c) {
  std::vector<Arena> arenas = make_arenas(c, 0);
  const std::optional<Table> table = table_of(c);
  CallerAngles angles;
  return detail::cuda::choose_kernel(detail::make_kernel_args(c.schedule, args_of(c, arenas, table ? &*table : nullptr, &angles)));
}

// Runs `c` through the kernel the dispatcher picks (on a device of 1, 4 or 132 SMs, drawn from the
// seed: the launch shapes of small and large devices), and, when the fast kernels may take it,
// through both: the general kernel with the call's shape and a fast kernel with a random shape.
void check_call(const Call& c, uint64_t seed) {
  using namespace detail::cuda;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  const int multiprocessors = pick(rng, {1, 4, 132});
  auto general = [&](const KernelArgs& kernel) {
    emulate<CountingProbe>(kernel, c.default_shape ? launch_shape(kernel) : c.shape);
    return std::string("general kernel");
  };
  check_run(c, seed, "dispatched", [&](const KernelArgs& kernel) {
    if (choose_kernel(kernel).kind != KernelKind::fast) return general(kernel);
    const FastShape shape = fast_launch_shape(kernel, multiprocessors);
    emulate_fast<CountingProbe>(kernel, shape);
    return shape_name(shape) + " (" + std::to_string(multiprocessors) + " SMs)";
  });
  if (::testing::Test::HasFatalFailure() || choice_of(c).kind != KernelKind::fast) return;
  check_run(c, seed, "general, forced", general);
  if (::testing::Test::HasFatalFailure()) return;
  check_run(c, seed, "fast, random shape", [&](const KernelArgs& kernel) {
    const FastShape shape = random_fast_shape(kernel, rng);
    emulate_fast<CountingProbe>(kernel, shape);
    return shape_name(shape);
  });
}

// Checks every call of `calls`, stopping at the first failure; returns how many the fast kernels
// took.
int check_calls(const std::vector<SeededCall>& calls) {
  int fast = 0;
  for (const SeededCall& s : calls) {
    SCOPED_TRACE(s.model);
    check_call(s.call, s.seed);
    if (::testing::Test::HasFatalFailure()) return fast;
    fast += choice_of(s.call).kind == detail::cuda::KernelKind::fast ? 1 : 0;
  }
  return fast;
}

// The sweep: random descriptors (every layout, partial rotary at any offset, 1-4 streams), every
// dtype, q and k with odd head counts in every memory order (negative strides, fused-QKV slices,
// gaps), in and out of place, both directions, table, exact and the caller's angles (either
// index, every columns form and dtype, any strides), every position kind across [0, 2^31), and
// launch shapes from one thread to more blocks than tokens.
TEST(CudaEmulation, RandomCallsMatchTheReferenceBitForBit) {
  const std::vector<SeededCall> calls = random_calls();
  const int fast = check_calls(calls);
  if (HasFatalFailure()) return;
  // Every feature of the call came up often enough to count.
  expect_coverage(calls, 20, /*launch_shapes=*/true);
  std::printf("%d of %zu calls went to the fast kernels (and to both)\n", fast, calls.size());
  EXPECT_GE(fast, 20);
}

// The fast kernels' sweep: calls they take (and a few they refuse, views moved off the 16-byte
// grid), through the dispatcher's choice and both kernels.
TEST(CudaEmulation, FastKernelCallsMatchTheReferenceBitForBit) {
  const std::vector<SeededCall> calls = fast_calls();
  const int fast = check_calls(calls);
  if (HasFatalFailure()) return;
  expect_fast_coverage(calls, 15);
  std::printf("%d of %zu calls went to the fast kernels\n", fast, calls.size());
  EXPECT_GE(fast, kFastCalls * 8 / 10);
}

// Zeros, infinities, NaN, subnormals and values near each format's overflow: every value bit for bit,
// NaN where the reference has NaN (the write count still catches a missed write over poison).
TEST(CudaEmulation, SpecialValuesMatchTheReference) { check_calls(special_value_calls()); }

// transformers' float32 angles (numerics hf_float32), from a table of that mode and computed on the
// fly, through the kernel the dispatcher picks and, where legal, both: the reference's bits.
TEST(CudaEmulation, HfFloat32CallsMatchTheReferenceBitForBit) {
  const std::vector<SeededCall> calls = hf_float32_calls();
  const int fast = check_calls(calls);
  if (HasFatalFailure()) return;
  int on_the_fly = 0;
  for (const SeededCall& s : calls) on_the_fly += s.call.table ? 0 : 1;
  std::printf("%zu hf_float32 calls: %d on the fly, %d through the fast kernels\n", calls.size(), on_the_fly, fast);
  EXPECT_GE(on_the_fly, 200);
  EXPECT_GE(fast, 100);
}

// undo (the true inverse: 1/g, xPos σ^-1, the other way round) through the kernel the dispatcher
// picks and, where legal, both: the reference's bits.
TEST(CudaEmulation, UndoCallsMatchTheReferenceBitForBit) {
  const std::vector<SeededCall> calls = undo_calls();
  const int fast = check_calls(calls);
  if (HasFatalFailure()) return;
  int xpos = 0, factor = 0;
  for (const SeededCall& s : calls) {
    xpos += s.call.schedule.xpos() ? 1 : 0;
    factor += s.call.schedule.attention_factor != 1.0 ? 1 : 0;
  }
  std::printf("%zu undo calls: %d with xPos, %d with an attention factor != 1, %d through the fast kernels\n",
              calls.size(), xpos, factor, fast);
  EXPECT_GE(xpos, 40);
  EXPECT_GE(factor, 100);
  EXPECT_GE(fast, 100);
}

// Shapes and settings of real models, with positions across the whole context: all but the
// block_half(2) layout go to the fast kernels.
TEST(CudaEmulation, RealModelShapes) {
  const std::vector<SeededCall> calls = real_model_calls();
  const int fast = check_calls(calls);
  if (HasFatalFailure()) return;
  int block_half = 0;
  for (const SeededCall& s : calls) block_half += s.call.schedule.blocks > 1 ? 1 : 0;
  EXPECT_EQ(fast, static_cast<int>(calls.size()) - block_half);
}

// Exact angles at positions where float32 angles break down: the ends of the range, powers of two
// and their neighbours, and the positions whose angle falls closest to a multiple of π/2.
TEST(CudaEmulation, ExactAnglesAcrossTheWholePositionRange) { check_calls(whole_range_calls()); }

// The grid is an implementation detail: any block size (not a warp multiple, one thread), any grid
// (one block for every token, fewer blocks than tokens, more), angles shared or per item, give the
// same bytes.
TEST(CudaEmulation, EveryLaunchShapeGivesTheSameBytes) {
  std::mt19937_64 rng(3);
  Call c = random_call(rng, DType::bf16);
  c.schedule = make_schedule(Spec{.head_dim = 96, .rotary_dim = 64, .pairing = Pairing::interleaved,
                                  .rotary_offset = 16, .stream_layout = StreamLayout::sections,
                                  .sections = {10, 11, 11}});
  c.head_dim = 96;
  c.batch = 2;
  c.seq = 5;
  c.heads_q = 3;
  c.heads_k = 1;
  c.q_in_place = false;
  c.k_in_place = true;
  c.copy_tail = true;
  c.table = false;
  c.caller = false;
  per_token_positions(c, 3, [&](int64_t) { return uniform(rng, 0, max_position_limit - 1); });
  lay_out(c);
  c.default_shape = false;
  int shapes = 0;
  for (int threads : {1, 2, 31, 32, 64, 256}) {
    for (int64_t blocks : {int64_t{1}, int64_t{3}, c.batch * c.seq, 2 * c.batch * c.seq}) {
      for (bool shared : {false, true}) {
        c.shape = LaunchShape{.blocks = blocks, .threads = threads, .shared_angles = shared};
        check_call(c, 77);
        if (HasFatalFailure()) return;
        ++shapes;
      }
    }
  }
  EXPECT_EQ(shapes, 6 * 4 * 2);
}

// Per-token positions live in device memory, where the host cannot check them: a kernel skips a
// token whose position it cannot use (nothing of it read or written), sets its bit in the error
// word, and rotates every other token as the reference does.
TEST(CudaEmulation, UnusablePositionsAreSkippedAndFlagged) {
  for (const BadPosition& bad : bad_positions()) {
    for (int stream : {0, 2}) {  // the bad entry in the first stream, or only in the last
      Call c = bad_position_call(bad);
      const std::vector<Arena> start = make_arenas(c, 9);
      std::vector<Arena> want = reference_result(c, start);  // every position usable
      std::vector<Arena> got = start;
      make_position_bad(c, bad, stream);
      const std::optional<Table> table = table_of(c);
      CallerAngles angles;
      KernelArgs kernel = detail::make_kernel_args(c.schedule, args_of(c, got, table ? &*table : nullptr, &angles));
      uint32_t error = 0;
      kernel.error = &error;
      // The call suits the fast kernels but with xPos: the dispatcher's choice, then the general
      // kernel too.
      const bool fast_legal = detail::cuda::choose_kernel(kernel).kind == detail::cuda::KernelKind::fast;
      ASSERT_EQ(fast_legal, bad.source != BadPosition::xpos);
      keep_skipped_token(c, start, want);
      for (const bool fast : {fast_legal, false}) {
        const std::string what = std::string(fast ? "fast" : "general") + " kernel, position " +
                                 std::to_string(bad.value) + " in stream " + std::to_string(stream);
        std::vector<Arena> run = start;
        KernelArgs on = detail::make_kernel_args(c.schedule, args_of(c, run, table ? &*table : nullptr, &angles));
        error = 0;
        on.error = &error;
        if (fast) {
          detail::cuda::emulate_dispatched(on, 132);
        } else {
          detail::cuda::emulate(on, detail::cuda::launch_shape(on));
        }
        EXPECT_EQ(error, bad.bit) << what;
        const std::string difference = first_difference(c, run, want);
        ASSERT_TRUE(difference.empty()) << what << ": " << difference;
      }
    }
  }
}

// The descriptor's channels as KernelArgs spells them: Schedule::channels for every pair of every
// layout, offset and width.
TEST(KernelArgs, ChannelsAreTheSchedules) {
  int checked = 0;
  for (Pairing pairing : {Pairing::half, Pairing::interleaved}) {
    for (int64_t blocks : {1, 2, 4}) {
      if (blocks > 1 && pairing == Pairing::interleaved) continue;
      for (int64_t d : {8, 24, 64, 72, 128, 256}) {
        for (int64_t r = 2 * blocks; r <= d; r += 2 * blocks) {
          for (int64_t offset : {int64_t{0}, (d - r) / 2, d - r}) {
            Schedule s{.head_dim = d, .rotary_dim = r, .pairing = pairing, .inv_freq = default_inv_freq(10000, r),
                       .rotary_offset = offset, .blocks = blocks};
            std::vector<float> q(static_cast<size_t>(d));
            const ApplyArgs args{.q = TensorView::bshd(q.data(), DType::f32, 1, 1, 1, d)};
            validate(s, args);
            const KernelArgs k = detail::make_kernel_args(s, args);
            for (int64_t j = 0; j < s.pairs(); ++j) {
              const int64_t a = k.rotary_offset + (j / k.block_pairs) * k.block_width +
                                (j % k.block_pairs) * k.pair_step;
              ASSERT_EQ(std::pair(a, a + k.partner), s.channels(j))
                  << to_string(s.channel_layout()) << " blocks " << blocks << " d " << d << " r " << r << " offset "
                  << offset << " pair " << j;
              ++checked;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 10000);
}

TEST(KernelArgs, TablesMustBeOneContiguousRange) {
  const Schedule s = make_schedule(Spec{.head_dim = 8});
  const std::vector<int64_t> contiguous = {5, 6, 7};
  const detail::TableRows r = detail::table_range(Table::at(s, contiguous));
  EXPECT_EQ(r.first, 5);
  EXPECT_EQ(r.rows, 3);
  const detail::TableRows range = detail::table_range(Table::range(s, 100, 10));
  EXPECT_EQ(range.first, 100);
  EXPECT_EQ(range.rows, 10);
  const std::vector<int64_t> gap = {5, 7};
  EXPECT_ROTARY_ERROR(detail::table_range(Table::at(s, gap)),
                      "table positions are not one contiguous range: row 1 holds position 7 after position 5");
  const std::vector<int64_t> repeated = {5, 5};
  EXPECT_ROTARY_ERROR(detail::table_range(Table::at(s, repeated)), "row 1 holds position 5 after position 5");
}

// The caller's cos/sin as KernelCallerAngles spells them, and never together with a table.
TEST(KernelArgs, CallerAnglesAreSpelledOut) {
  const Schedule s = make_schedule(Spec{.head_dim = 8});
  std::vector<float> q(16);
  std::vector<uint16_t> cos(64), sin(64);
  CallerAngles angles{.index = CallerAngles::Index::per_position, .columns = CallerAngles::Columns::repeated,
                      .cos = cos.data(), .sin = sin.data() + 63, .dtype = DType::bf16, .shape = {1, 7, 8},
                      .cos_strides = {0, 8, 1}, .sin_strides = {5, -8, -1}};
  const ApplyArgs args{.q = TensorView::bshd(q.data(), DType::f32, 2, 1, 1, 8), .angles = &angles};
  validate(s, args);
  KernelArgs k = detail::make_kernel_args(s, args);
  EXPECT_EQ(k.angle_source, detail::KernelAngleSource::caller);
  EXPECT_EQ(k.angles.cos, cos.data());
  EXPECT_EQ(k.angles.sin, sin.data() + 63);
  EXPECT_EQ(k.angles.dtype, DType::bf16);
  EXPECT_TRUE(k.angles.per_position);
  EXPECT_FALSE(k.angles.broadcast);
  EXPECT_EQ(k.angles.column_step, 2);
  EXPECT_EQ(k.angles.rows, 7);
  EXPECT_EQ(std::vector<int64_t>(k.angles.cos_strides, k.angles.cos_strides + 3), (std::vector<int64_t>{0, 8, 1}));
  EXPECT_EQ(std::vector<int64_t>(k.angles.sin_strides, k.angles.sin_strides + 3), (std::vector<int64_t>{5, -8, -1}));

  angles.index = CallerAngles::Index::per_token;
  angles.columns = CallerAngles::Columns::halves;
  angles.shape = {1, 1, 8};  // one row set for both batch rows
  k = detail::make_kernel_args(s, args);
  EXPECT_FALSE(k.angles.per_position);
  EXPECT_TRUE(k.angles.broadcast);
  EXPECT_EQ(k.angles.column_step, 1);
  angles.shape = {2, 1, 8};
  angles.columns = CallerAngles::Columns::pairs;
  angles.shape[2] = 4;
  validate(s, args);
  k = detail::make_kernel_args(s, args);
  EXPECT_FALSE(k.angles.broadcast);
  EXPECT_EQ(k.angles.column_step, 1);

  const detail::TableRows range = detail::table_range(Table::range(s, 0, 4));
  EXPECT_ROTARY_ERROR(detail::make_kernel_args(s, args, &range), "angles and table are both set");
}

// Per-position angles index rows by the position itself: rows up to 2^31 (here aliased, row
// stride 0) take every position below 2^31, the last one included.
TEST(CudaEmulation, PerPositionAnglesAcrossTheWholeRange) { check_calls(whole_range_angle_calls()); }

// ---- The fast kernels: dispatch, launch shapes, division ----

// The fast kernels' grid is an implementation detail too: any tile size, rows per block, head
// groups and grid (blocks looping over tiles) give the same bytes, for each pairing, with the tail
// copied for q and not for k (in place), the rotated slice in the middle of the head, M-RoPE.
TEST(CudaEmulation, EveryFastLaunchShapeGivesTheSameBytes) {
  using namespace detail::cuda;
  int shapes = 0;
  for (const Pairing pairing : {Pairing::half, Pairing::interleaved}) {
    for (const DType dtype : {DType::bf16, DType::f32}) {
      Call c;
      c.schedule = make_schedule(Spec{.head_dim = 96, .rotary_dim = 64, .pairing = pairing, .rotary_offset = 16,
                                      .stream_layout = StreamLayout::sections, .sections = {10, 11, 11}});
      c.dtype = dtype;
      c.head_dim = 96;
      c.batch = 3;
      c.seq = 7;
      c.heads_q = 5;
      c.heads_k = 2;
      c.in_order = 1;  // bhsd
      c.k_order = 0;
      c.q_in_place = false;
      c.k_in_place = true;
      std::mt19937_64 rng(4);
      per_token_positions(c, 3, [&](int64_t) { return uniform(rng, 0, max_position_limit - 1); });
      lay_out(c);
      std::vector<Arena> arenas = make_arenas(c, 0);
      const KernelArgs probe = detail::make_kernel_args(c.schedule, args_of(c, arenas, nullptr));
      ASSERT_EQ(choose_kernel(probe).kind, KernelKind::fast) << describe(choose_kernel(probe));
      const int chunks = fast_chunks(probe);
      for (int tile_shift = 0; tile_shift <= kFastMaxTileShift; ++tile_shift) {
        const int tile = 1 << tile_shift;
        for (int rows : {tile, 2 * tile, kFastMaxThreads / chunks / tile * tile}) {
          for (int group_heads : {1, 3, 7}) {
            for (int64_t grid : {int64_t{1}, int64_t{2}, (c.batch * c.seq + tile - 1) / tile}) {
              const FastShape shape{.chunks = chunks, .rows = rows, .tile_shift = tile_shift, .group_heads = group_heads,
                                    .groups = (7 + group_heads - 1) / group_heads, .grid = grid};
              check_run(c, 78, "fast", [&](const KernelArgs& kernel) {
                emulate_fast<CountingProbe>(kernel, shape);
                return shape_name(shape);
              });
              if (HasFatalFailure()) return;
              ++shapes;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(shapes, 2 * 2 * 4 * 3 * 3 * 3);
}

// n / d by a precomputed multiplier, for every kind of divisor (1, powers of two and their
// neighbours, 2^63) and dividend (0, the divisor's multiples and their neighbours, 2^64 - 1),
// against the division operator.
TEST(FastKernels, DivisionByAnInvariantDivisorIsExact) {
  using detail::cuda::Divmod64;
  std::mt19937_64 rng(12);
  std::vector<uint64_t> divisors = {1, 2, 3, 5, 7, 641, 4096, 4097, uint64_t{1} << 32, (uint64_t{1} << 32) + 1,
                                    (uint64_t{1} << 63) - 1, uint64_t{1} << 63};
  for (int e = 1; e < 63; ++e) {
    for (const int64_t d : {-1, 1}) divisors.push_back((uint64_t{1} << e) + static_cast<uint64_t>(d));
  }
  for (int i = 0; i < 200; ++i) divisors.push_back(1 + rng() % (uint64_t{1} << (1 + rng() % 63)));
  int64_t checked = 0;
  for (const uint64_t d : divisors) {
    const Divmod64 divide = Divmod64::make(d);
    std::vector<uint64_t> dividends = {0, 1, d - 1, d, d + 1, ~uint64_t{0}, ~uint64_t{0} - 1, ~uint64_t{0} / d * d,
                                       ~uint64_t{0} / d * d - 1};
    for (int i = 0; i < 200; ++i) {
      const uint64_t n = rng() >> (rng() % 64);
      dividends.push_back(n);
      dividends.push_back(n / d * d);
      dividends.push_back(n / d * d - 1);
    }
    for (const uint64_t n : dividends) {
      ASSERT_EQ(divide.quotient(n), n / d) << n << " / " << d;
      ++checked;
    }
  }
  EXPECT_GT(checked, 100000);
}

// The dispatcher's choice, from the arguments alone (the pointers are numbers here, never read).
class KernelChoiceTest : public ::testing::Test {
 protected:
  static unsigned char* at(uintptr_t offset) { return reinterpret_cast<unsigned char*>(uintptr_t{0x7f0000000000} + offset); }
  // Llama-3.1-8B decode or prefill: q [batch, seq, 32, 128] and k [batch, seq, 8, 128], bf16, bshd.
  static ApplyArgs llama(int64_t batch, int64_t seq, DType dtype = DType::bf16) {
    return ApplyArgs{.q = TensorView::bshd(at(0), dtype, batch, seq, 32, 128),
                     .k = TensorView::bshd(at(uintptr_t{1} << 36), dtype, batch, seq, 8, 128)};
  }
  static detail::cuda::KernelChoice choose(const Schedule& s, const ApplyArgs& a) {
    validate_shapes(s, a);
    return detail::cuda::choose_kernel(detail::make_kernel_args(s, a, nullptr));
  }
  Schedule llama_schedule = make_schedule(Spec{.head_dim = 128, .base = 500000});
};

TEST_F(KernelChoiceTest, ModelLayoutsGoToTheFastKernels) {
  using detail::cuda::KernelKind;
  const Schedule& s = llama_schedule;
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    EXPECT_EQ(choose(s, llama(1, 1, dtype)).kind, KernelKind::fast) << to_string(dtype);
    EXPECT_EQ(choose(s, llama(1, 4096, dtype)).kind, KernelKind::fast) << to_string(dtype);
    EXPECT_EQ(choose(s, llama(64, 1, dtype)).kind, KernelKind::fast) << to_string(dtype);
  }
  // transformers' [batch, heads, seq, head_dim] after the projection's transpose.
  ApplyArgs bhsd{.q = TensorView::bhsd(at(0), DType::bf16, 2, 32, 100, 128),
                 .k = TensorView::bhsd(at(uintptr_t{1} << 36), DType::bf16, 2, 8, 100, 128)};
  EXPECT_EQ(choose(s, bhsd).kind, KernelKind::fast);
  // q and k as slices of a fused QKV projection [tokens, 32 + 2 * 8 heads, 128], out of place.
  const std::array<int64_t, 4> fused = {48 * 128 * 7, 48 * 128, 128, 1};
  ApplyArgs qkv{.q = TensorView{.data = at(0), .dtype = DType::bf16, .shape = {1, 7, 32, 128}, .strides = fused},
                .k = TensorView{.data = at(32 * 128 * 2), .dtype = DType::bf16, .shape = {1, 7, 8, 128}, .strides = fused},
                .q_out = TensorView::bshd(at(uintptr_t{1} << 37), DType::bf16, 1, 7, 32, 128),
                .k_out = TensorView::bshd(at(uintptr_t{1} << 38), DType::bf16, 1, 7, 8, 128)};
  EXPECT_EQ(choose(s, qkv).kind, KernelKind::fast);
  // Partial rotary: DeepSeek-V3's 64 of 192 (interleaved, last), Phi's 32 of 80 (half, first), GLM's
  // 64 of 128 interleaved.
  const Schedule deepseek = make_schedule(Spec{.head_dim = 192, .rotary_dim = 64, .pairing = Pairing::interleaved,
                                               .rotary_offset = 128});
  EXPECT_EQ(choose(deepseek, {.q = TensorView::bshd(at(0), DType::bf16, 1, 9, 16, 192)}).kind, KernelKind::fast);
  const Schedule phi = make_schedule(Spec{.head_dim = 80, .rotary_dim = 32});
  EXPECT_EQ(choose(phi, {.q = TensorView::bshd(at(0), DType::f16, 1, 9, 32, 80)}).kind, KernelKind::fast);
  // M-RoPE (Qwen2-VL sections [16, 24, 24]) with three streams of per-token positions.
  const Schedule qwen = make_schedule(Spec{.head_dim = 128, .base = 1e6, .stream_layout = StreamLayout::sections,
                                           .sections = {16, 24, 24}});
  const int64_t* device_positions = reinterpret_cast<const int64_t*>(at(uintptr_t{1} << 39));
  ApplyArgs mrope = llama(1, 5);
  mrope.positions = Positions::per_token(std::span(device_positions, 15), 3);
  EXPECT_EQ(choose(qwen, mrope).kind, KernelKind::fast);
  // A dimension of length 1 never multiplies its stride: any stride will do there.
  ApplyArgs decode = llama(1, 1);
  decode.q.strides[0] = decode.q.strides[1] = 3;
  EXPECT_EQ(choose(s, decode).kind, KernelKind::fast);
}

TEST_F(KernelChoiceTest, EveryOtherCallGoesToTheGeneralKernelSayingWhy) {
  using detail::cuda::describe;
  const Schedule& s = llama_schedule;
  EXPECT_EQ(describe(choose(s, llama(1, 4, DType::f64))), "general: f64 data (the fast kernels take f32, f16 and bf16)");
  EXPECT_EQ(describe(choose(with_xpos(s, 512.0, 0.0), llama(1, 4))),
            "general: xPos (the fast kernels share one angle row between q and k)");
  const Schedule axial = make_schedule(Spec{.head_dim = 64, .base = 100, .blocks = 2,
                                            .stream_layout = StreamLayout::axial, .sections = {16, 16}});
  EXPECT_EQ(describe(choose(axial, {.q = TensorView::bshd(at(0), DType::bf16, 1, 4, 12, 64)})),
            "general: block_half pairing (the fast kernels take half and interleaved)");
  const Schedule wide = make_schedule(Spec{.head_dim = 512});
  EXPECT_EQ(describe(choose(wide, {.q = TensorView::bshd(at(0), DType::bf16, 1, 4, 8, 512)})),
            "general: rotary_dim above 256");
  // 20 pairs of bf16: the partner lies 40 bytes on, not a whole vector; head_dim 100 is 12.5 vectors.
  const Schedule partial = make_schedule(Spec{.head_dim = 128, .rotary_dim = 40});
  const std::string split = "general: head_dim, rotary_offset or the pairing's partner distance is not a whole "
                            "number of 16-byte vectors";
  EXPECT_EQ(describe(choose(partial, llama(1, 4))), split);
  const Schedule odd = make_schedule(Spec{.head_dim = 100});
  EXPECT_EQ(describe(choose(odd, {.q = TensorView::bshd(at(0), DType::bf16, 1, 4, 8, 100)})), split);
  // ... but 40 interleaved channels are 5 vectors.
  const Schedule interleaved = make_schedule(Spec{.head_dim = 128, .rotary_dim = 40, .pairing = Pairing::interleaved});
  EXPECT_EQ(describe(choose(interleaved, llama(1, 4))), "fast");
  // The views: a head_dim stride, a misaligned pointer or stride, offsets beyond 32 bits.
  ApplyArgs strided = llama(1, 4);
  strided.k.strides = {4 * 8 * 256, 8 * 256, 256, 2};
  EXPECT_EQ(describe(choose(s, strided)), "general: k's head_dim stride is not 1");
  ApplyArgs misaligned = llama(1, 4);
  misaligned.q.data = at(2);
  EXPECT_EQ(describe(choose(s, misaligned)), "general: q's data or a stride is not a multiple of 16 bytes");
  ApplyArgs out = llama(1, 4);
  out.q_out = TensorView::bshd(at(uintptr_t{1} << 37), DType::bf16, 1, 4, 32, 128);
  out.k_out = TensorView::bshd(at((uintptr_t{1} << 38) + 8), DType::bf16, 1, 4, 8, 128);
  EXPECT_EQ(describe(choose(s, out)), "general: k_out's data or a stride is not a multiple of 16 bytes");
  ApplyArgs gaps = llama(1, 4);
  gaps.q.strides = {4 * 32 * 132, 32 * 132, 132, 1};  // heads 264 bytes apart
  EXPECT_EQ(describe(choose(s, gaps)), "general: q's data or a stride is not a multiple of 16 bytes");
  ApplyArgs far = llama(1, 4);
  far.k.strides = {int64_t{1} << 40, int64_t{1} << 34, int64_t{1} << 28, 1};  // heads 2^29 bytes apart
  EXPECT_EQ(describe(choose(s, far)), "general: k's offsets within a token exceed 32 bits");
  far.k.strides[2] = 153391664;  // the last of 8 heads ends at 7 * 306783328 + 256 bytes < 2^31
  EXPECT_EQ(describe(choose(s, far)), "fast");
  far.k.strides[2] = 153391672;  // 7 * 306783344 + 256 bytes > 2^31 - 1
  EXPECT_EQ(describe(choose(s, far)), "general: k's offsets within a token exceed 32 bits");
  const Schedule long_tail = make_schedule(Spec{.head_dim = 4096, .rotary_dim = 64});
  EXPECT_EQ(describe(choose(long_tail, {.q = TensorView::bshd(at(0), DType::f32, 1, 4, 1, 4096),
                                        .q_out = TensorView::bshd(at(uintptr_t{1} << 36), DType::f32, 1, 4, 1, 4096)})),
            "general: more than 256 16-byte vectors per head");
}

// The launch shapes of the benchmark's cases on an H100/H200 (132 SMs): prefill in tiles of 8
// tokens with every head per block; decode and batched decode spread over blocks of 64 threads,
// one angle cell each.
TEST_F(KernelChoiceTest, LaunchShapesFillTheGpu) {
  using namespace detail::cuda;
  const Schedule& s = llama_schedule;
  auto shape_of = [&](const ApplyArgs& a) { return fast_launch_shape(detail::make_kernel_args(s, a, nullptr), 132); };
  const FastShape prefill = shape_of(llama(1, 4096));
  EXPECT_EQ(shape_name(prefill), "fast launch 8x32 threads, tiles of 8, 1 groups of 40 heads, grid 512");
  const FastShape decode = shape_of(llama(1, 1));
  EXPECT_EQ(shape_name(decode), "fast launch 8x8 threads, tiles of 1, 5 groups of 8 heads, grid 1");
  const FastShape batched = shape_of(llama(64, 1));
  EXPECT_EQ(shape_name(batched), "fast launch 8x8 threads, tiles of 1, 5 groups of 8 heads, grid 64");
  const FastShape f32_decode = shape_of(llama(1, 1, DType::f32));
  EXPECT_EQ(shape_name(f32_decode), "fast launch 16x4 threads, tiles of 1, 10 groups of 4 heads, grid 1");
  // 2M tokens: 2^18 tiles, under the grid's cap; beyond 2^23 tokens blocks loop over tiles.
  EXPECT_EQ(shape_of(llama(1, int64_t{1} << 21)).grid, int64_t{1} << 18);
  EXPECT_EQ(shape_of(llama(1, (int64_t{1} << 24) + 5)).grid, kFastMaxGrid);
}

#if ROTARY_TEST_CUDA_API
// The CUDA API's own checks, all made on the host before any CUDA call (this test makes none: the
// pointers below are never dereferenced, as no call gets past its checks).
TEST(CudaApi, ErrorsNameTheArgumentBeforeAnyCudaCall) {
  const Schedule s = make_schedule(Spec{.head_dim = 128});
  auto* device = reinterpret_cast<void*>(uintptr_t{0x7f0000000000});  // never dereferenced
  const TensorView q = TensorView::bshd(device, DType::bf16, 2, 3, 4, 128);
  const Table host_table = Table::range(s, 0, 8);
  EXPECT_ROTARY_ERROR(cuda::apply(s, {.q = q, .table = &host_table}, nullptr),
                      "table is a host Table: give its cuda::DeviceTable in Options::table");
  EXPECT_ROTARY_ERROR(cuda::apply(s, {.q = TensorView::bshd(device, DType::bf16, 2, 3, 4, 64)}, nullptr),
                      "q.head_dim=64 differs from the schedule's head_dim=128");
  EXPECT_ROTARY_ERROR(cuda::apply(s, {.q = q, .positions = Positions::sequential(max_position_limit - 2)}, nullptr),
                      "offset=2147483646 with seq=3 must keep positions in [0, 2^31)");
  // Per-token positions in device memory (apart from q: positions an output overlaps are refused):
  // their count and streams are checked, never their values.
  const auto* positions = reinterpret_cast<const int32_t*>(uintptr_t{0x7f0040000000});
  EXPECT_ROTARY_ERROR(cuda::apply(s, {.q = q, .positions = Positions::per_token(std::span(positions, 5))}, nullptr),
                      "positions has 5 entries but batch*seq=6");
  EXPECT_ROTARY_ERROR(cuda::apply(s, {.q = q, .positions = Positions::per_token(std::span(positions, 6), 2)}, nullptr),
                      "positions has 2 streams but the schedule reads 1");
  Schedule wide = s;
  wide.head_dim = wide.rotary_dim = 2 * (cuda::max_pairs + 1);
  wide.inv_freq = default_inv_freq(10000, wide.rotary_dim);
  const TensorView q_wide = TensorView::bshd(device, DType::f32, 1, 3, 1, wide.head_dim);
  const ApplyArgs wide_args{.q = q_wide, .positions = Positions::per_token(std::span(positions, 3))};
  EXPECT_ROTARY_ERROR(cuda::apply(wide, wide_args, nullptr),
                      "rotary_dim=4098 has more than cuda::max_pairs=2048 pairs");
  const std::vector<int64_t> gap = {0, 2};
  EXPECT_ROTARY_ERROR(cuda::DeviceTable(Table::at(s, gap)), "table positions are not one contiguous range");
}

// The caller's cos/sin in device memory: their shape, width, aliasing and the host-known
// (sequential) positions are checked on the host, as rotary::validate checks them.
TEST(CudaApi, CallerAnglesAreCheckedOnTheHost) {
  const Schedule s = make_schedule(Spec{.head_dim = 128});
  auto* device = reinterpret_cast<unsigned char*>(uintptr_t{0x7f0000000000});  // never dereferenced
  const TensorView q = TensorView::bshd(device, DType::bf16, 2, 3, 4, 128);
  const CallerAngles angles{.index = CallerAngles::Index::per_position, .cos = device + (1 << 20),
                            .sin = device + (2 << 20), .dtype = DType::f32, .shape = {1, 4, 128},
                            .cos_strides = {512, 128, 1}, .sin_strides = {512, 128, 1}};
  EXPECT_ROTARY_ERROR(cuda::apply(s, {.q = q, .positions = Positions::sequential(2), .angles = &angles}, nullptr),
                      "positions[2]=4 is beyond the 4 rows of the per_position cos/sin");
  CallerAngles narrow = angles;
  narrow.shape[2] = 64;
  EXPECT_ROTARY_ERROR(cuda::apply(s, {.q = q, .angles = &narrow}, nullptr),
                      "angles width=64 must be 128 (rotary_dim=128, columns halves)");
  CallerAngles aliased = angles;
  aliased.sin = device;
  EXPECT_ROTARY_ERROR(cuda::apply(s, {.q = q, .angles = &aliased}, nullptr), "q (in place) overlaps angles.sin");
  const cuda::DeviceTable empty(Table::range(s, 0, 0));  // no rows: nothing allocated
  EXPECT_ROTARY_ERROR(cuda::apply(s, {.q = q, .angles = &angles}, nullptr, {.table = &empty}),
                      "angles and Options::table are both set (give one source of angles)");
}

// What the build holds and whether this machine runs it: the architectures CMake built (sm_90 among
// them here), and without a usable device, why not.
TEST(CudaApi, BuildInfoNamesTheArchitecturesAndTheDevice) {
  const cuda::BuildInfo info = cuda::build_info();
  EXPECT_NE(std::find(info.architectures.begin(), info.architectures.end(), "sm_90"), info.architectures.end());
  EXPECT_GE(info.runtime_version, 12010);
  EXPECT_EQ(info.usable, info.why_not.empty());
  if (info.devices == 0) {
    EXPECT_FALSE(info.usable);
    EXPECT_TRUE(info.device.empty());
  } else {
    EXPECT_FALSE(info.device.empty());
  }
}

// check_positions' message names the rule of every bit the kernels set (the fused kernels' slot
// bit included), and says so when the word holds bits no kernel sets.
TEST(CudaApi, CheckPositionsNamesEveryFlag) {
  using detail::cuda::positions_message;
  EXPECT_EQ(positions_message(cuda::position_out_of_range),
            "positions: a per-token position was outside [0, 2^31) (those tokens were left unrotated)");
  EXPECT_EQ(positions_message(cuda::position_not_in_table),
            "positions: a per-token position was fractional or not a row of the table (those tokens were left "
            "unrotated)");
  EXPECT_EQ(positions_message(cuda::position_not_in_angles),
            "positions: a per-token position was fractional or not below the rows of the per_position cos/sin "
            "(those tokens were left unrotated)");
  EXPECT_EQ(positions_message(cuda::position_out_of_range | cuda::position_not_in_angles),
            "positions: a per-token position was outside [0, 2^31); fractional or not below the rows of the "
            "per_position cos/sin (those tokens were left unrotated)");
  EXPECT_EQ(positions_message(cuda::slot_out_of_range),
            "slots: a slot was beyond its cache's capacity (those tokens' cache writes were skipped)");
  EXPECT_EQ(positions_message(cuda::slot_out_of_range | cuda::position_out_of_range),
            "positions: a per-token position was outside [0, 2^31) (those tokens were left unrotated); slots: a slot "
            "was beyond its cache's capacity (those tokens' cache writes were skipped)");
  EXPECT_EQ(positions_message(cuda::slot_duplicate),
            "slots: a slot was listed twice (neither token's cache writes were made)");
  EXPECT_EQ(positions_message(cuda::slot_duplicate | cuda::slot_out_of_range),
            "slots: a slot was beyond its cache's capacity (those tokens' cache writes were skipped); slots: a slot "
            "was listed twice (neither token's cache writes were made)");
  EXPECT_EQ(positions_message(cuda::scale_invalid),
            "scales: a scale was not finite and > 0 (nothing was written)");
  EXPECT_EQ(positions_message(0x80 | cuda::position_out_of_range),
            "positions: the error word holds 0x81, bits no kernel sets (was it zeroed before the calls?)");
  EXPECT_ROTARY_ERROR(cuda::check_positions(nullptr, nullptr), "error is null");
}
#endif

}  // namespace
}  // namespace rotary
