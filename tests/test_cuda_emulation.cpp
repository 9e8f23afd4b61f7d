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

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda/emulate.hpp"
#include "kernel_args.hpp"
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

// Every store of the emulated body, by address.
struct CountingProbe {
  static inline std::unordered_map<const void*, int>* counts = nullptr;
  static void stored(const void* p) { ++(*counts)[p]; }
};

// Runs `c` through the reference and the emulated grid; every byte of every arena must agree, and
// the body must store each output element exactly once.
void check_call(const Call& c, uint64_t seed) {
  std::vector<Arena> got = make_arenas(c, seed);
  const std::vector<Arena> want = reference_result(c, got);
  const std::optional<Table> table = table_of(c);
  CallerAngles angles;
  const ApplyArgs args = args_of(c, got, table ? &*table : nullptr, &angles);
  validate(c.schedule, args);
  const KernelArgs kernel = detail::make_kernel_args(c.schedule, args);
  std::unordered_map<const void*, int> counts;
  CountingProbe::counts = &counts;
  detail::cuda::emulate<CountingProbe>(kernel, c.default_shape ? detail::cuda::launch_shape(kernel) : c.shape);

  const std::string what = c.describe();
  const std::string difference = first_difference(c, got, want);
  ASSERT_TRUE(difference.empty()) << what << ": " << difference;
  int64_t expected = 0;
  const int64_t tail = c.head_dim - c.schedule.rotary_dim;
  for (const auto& [heads, in_place] : {std::pair{c.heads_q, c.q_in_place}, std::pair{c.heads_k, c.k_in_place}}) {
    expected += c.batch * c.seq * heads * (c.schedule.rotary_dim + (c.copy_tail && !in_place ? tail : 0));
  }
  ASSERT_EQ(static_cast<int64_t>(counts.size()), expected) << what << ": elements stored";
  for (const auto& [address, n] : counts) ASSERT_EQ(n, 1) << what << ": an element stored " << n << " times";
}

// Checks every call of `calls`, stopping at the first failure.
void check_calls(const std::vector<SeededCall>& calls) {
  for (const SeededCall& s : calls) {
    SCOPED_TRACE(s.model);
    check_call(s.call, s.seed);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// The sweep: random descriptors (every layout, partial rotary at any offset, 1-4 streams), every
// dtype, q and k with odd head counts in every memory order (negative strides, fused-QKV slices,
// gaps), in and out of place, both directions, table, exact and the caller's angles (either
// index, every columns form and dtype, any strides), every position kind across [0, 2^31), and
// launch shapes from one thread to more blocks than tokens.
TEST(CudaEmulation, RandomCallsMatchTheReferenceBitForBit) {
  const std::vector<SeededCall> calls = random_calls();
  check_calls(calls);
  if (HasFatalFailure()) return;
  // Every feature of the call came up often enough to count.
  expect_coverage(calls, 20, /*launch_shapes=*/true);
}

// Zeros, infinities, NaN, subnormals and values near each format's overflow: every value bit for bit,
// NaN where the reference has NaN (the write count still catches a missed write over poison).
TEST(CudaEmulation, SpecialValuesMatchTheReference) { check_calls(special_value_calls()); }

// Shapes and settings of real models, with positions across the whole context.
TEST(CudaEmulation, RealModelShapes) { check_calls(real_model_calls()); }

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
      detail::cuda::emulate(kernel, detail::cuda::launch_shape(kernel));
      EXPECT_EQ(error, bad.bit) << "position " << bad.value << " in stream " << stream;
      keep_skipped_token(c, start, want);
      const std::string difference = first_difference(c, got, want);
      ASSERT_TRUE(difference.empty()) << "position " << bad.value << " in stream " << stream << ": " << difference;
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
                  << to_string(s.layout()) << " blocks " << blocks << " d " << d << " r " << r << " offset "
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
  const detail::TableRange r = detail::table_range(Table::at(s, contiguous));
  EXPECT_EQ(r.first, 5);
  EXPECT_EQ(r.rows, 3);
  const detail::TableRange range = detail::table_range(Table::range(s, 100, 10));
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

  const detail::TableRange range = detail::table_range(Table::range(s, 0, 4));
  EXPECT_ROTARY_ERROR(detail::make_kernel_args(s, args, &range), "angles and table are both set");
}

// Per-position angles index rows by the position itself: rows up to 2^31 (here aliased, row
// stride 0) take every position below 2^31, the last one included.
TEST(CudaEmulation, PerPositionAnglesAcrossTheWholeRange) { check_calls(whole_range_angle_calls()); }

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
  // Per-token positions in device memory: their count and streams are checked, never their values.
  const auto* positions = static_cast<const int32_t*>(device);
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

// check_positions' message names the rule of every bit the kernels set, and says so when the
// word holds bits no kernel sets.
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
  EXPECT_EQ(positions_message(0x10 | cuda::position_out_of_range),
            "positions: the error word holds 0x11, bits no kernel sets (was it zeroed before the calls?)");
  EXPECT_ROTARY_ERROR(cuda::check_positions(nullptr, nullptr), "error is null");
}
#endif

}  // namespace
}  // namespace rotary
