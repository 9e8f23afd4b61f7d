// The fused operations' CUDA work split played on the host (support/fused_emulation.hpp): per
// token, the angle row filled by `threads` threads (as a block's threads fill shared memory), the
// all-heads norms, then one item (head) per warp, its norm factor then its 32 lanes, in an order
// unlike the CPU loop's. The body is src/fused/body.hpp, the one the CPU runs: the results must
// equal rotary::rope_store's and qk_norm_rope's bit for bit (CPU == CUDA without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cuda/emulate.hpp"
#include "fused/body.hpp"
#include "fused/fused_args.hpp"
#include "kernel/args.hpp"
#include "support/fused_cases.hpp"
#include "support/fused_emulation.hpp"

namespace rotary {
namespace {

TEST(FusedEmulation, RopeStoreGridEqualsTheCpu) {
  int seed = 1;
  for (const DType cache : {DType::bf16, DType::fp8_e4m3, DType::i8}) {
    for (const int64_t d : {64, 128, 256}) {
      test::StoreCase c;
      c.schedule = make_schedule(Spec{.head_dim = d, .rotary_dim = d / 2, .pairing = Pairing::interleaved});
      c.cache_dtype = cache;
      c.scaled = is_quantised_dtype(cache);
      c.per_head_scale = true;
      c.seed = ++seed;
      SCOPED_TRACE(c.name());
      test::StoreSetup cpu(c), gpu(c);
      rope_store(c.schedule, cpu.store_args());
      const RopeStoreArgs args = gpu.store_args();
      detail::validate_rope_store(c.schedule, args, true);
      test::emulate_fused_grid(detail::make_rope_store_args(c.schedule, args, nullptr), 32);
      EXPECT_TRUE(cpu.q == gpu.q);
      EXPECT_TRUE(cpu.k_cache_bytes == gpu.k_cache_bytes);
      EXPECT_TRUE(cpu.v_cache_bytes == gpu.v_cache_bytes);
    }
  }
}

TEST(FusedEmulation, QkNormRopeGridEqualsTheCpu) {
  int seed = 50;
  for (const NormScope scope : {NormScope::head, NormScope::all_heads}) {
    for (const NormOrder order : {NormOrder::norm_then_rope, NormOrder::rope_then_norm}) {
      test::NormCase c{.schedule = make_schedule(Spec{.head_dim = 128}), .dtype = DType::bf16, .seed = ++seed};
      c.scope = scope;
      c.order = order;
      c.store = true;
      c.v_norm = true;
      SCOPED_TRACE(c.name());
      test::NormSetup cpu(c), gpu(c);
      qk_norm_rope(c.schedule, cpu.norm_args());
      const QkNormRopeArgs args = gpu.norm_args();
      detail::validate_qk_norm_rope(c.schedule, args, true);
      test::emulate_fused_grid(detail::make_qk_norm_rope_args(c.schedule, args, nullptr), 64);
      EXPECT_TRUE(cpu.q == gpu.q);
      EXPECT_TRUE(cpu.k_cache_bytes == gpu.k_cache_bytes);
      EXPECT_TRUE(cpu.v_cache_bytes == gpu.v_cache_bytes);
    }
  }
}

// rerotate_cache's split: per slot the angle row, then a warp per head, its 32 lanes (in reverse).
TEST(FusedEmulation, RerotateCacheGridEqualsTheCpu) {
  const Schedule schedule = make_schedule(Spec{.head_dim = 128, .rotary_dim = 96, .base = 500000.0});
  std::mt19937 rng(77);
  for (const DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    for (const bool out_of_place : {false, true}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + (out_of_place ? " out of place" : " in place"));
      const int64_t blocks = 6, block = 16, heads = 3, d = 128, count = 40;
      const int64_t es = size_of(dtype);
      std::vector<unsigned char> cpu_in(static_cast<size_t>(blocks * block * heads * d * es));
      for (auto& byte : cpu_in) byte = static_cast<unsigned char>(rng() % 0x70);  // finite codes and values
      std::vector<unsigned char> gpu_in = cpu_in, cpu_out(cpu_in.size(), 0x11), gpu_out(cpu_in.size(), 0x11);
      std::vector<int64_t> slots(static_cast<size_t>(count)), delta(static_cast<size_t>(count));
      std::vector<int64_t> all(static_cast<size_t>(blocks * block));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t i = 0; i < count; ++i) {
        slots[static_cast<size_t>(i)] = i == 7 ? -1 : all[static_cast<size_t>(i)];
        delta[static_cast<size_t>(i)] = static_cast<int64_t>(rng() % 3001) - 1500;
      }
      const float scale = 0.11f;
      const auto args = [&](std::vector<unsigned char>& in, std::vector<unsigned char>& out) {
        RerotateCacheArgs a{.cache = CacheView::nhd(in.data(), dtype, blocks, block, heads, d),
                            .slots = Slots::of(std::span<const int64_t>(slots))};
        if (out_of_place) a.out = CacheView::nhd(out.data(), dtype, blocks, block, heads, d);
        a.delta = delta.data();
        if (is_quantised_dtype(dtype)) a.quant = CacheQuant{.scale = &scale};
        return a;
      };
      rerotate_cache(schedule, args(cpu_in, cpu_out));
      const RerotateCacheArgs gpu = args(gpu_in, gpu_out);
      detail::validate_rerotate_cache(schedule, gpu, true);
      test::emulate_rerotate_grid(detail::make_rerotate_args(schedule, gpu, nullptr), 64);
      EXPECT_TRUE(cpu_in == gpu_in);
      EXPECT_TRUE(cpu_out == gpu_out);
    }
  }
}

// Raw keys rotated once to their positions, exact and with transformers' float32 numerics, M-RoPE
// streams too: the device's split equals the CPU.
TEST(FusedEmulation, RerotateCacheRawKeysEqualTheCpuInEveryNumerics) {
  int seed = 90;
  for (const AngleMode numerics : {AngleMode::exact, AngleMode::hf_float32}) {
    for (const DType cache : {DType::bf16, DType::fp8_e5m2, DType::i8}) {
      test::RerotateCase c;
      c.schedule = make_schedule(Spec{.head_dim = 64, .schedule = ScheduleType::yarn, .factor = 2.0,
                                      .original_max_position = 4096});
      c.cache_dtype = cache;
      c.raw = true;
      c.layout = seed % 2 ? test::Layout::hnd : test::Layout::nhd;
      c.seed = ++seed;
      SCOPED_TRACE(c.name() + (numerics == AngleMode::exact ? " exact" : " hf_float32"));
      test::RerotateSetup cpu(c), gpu(c);
      RerotateCacheArgs a = cpu.args(), b = gpu.args();
      a.numerics = b.numerics = numerics;
      rerotate_cache(c.schedule, a);
      detail::validate_rerotate_cache(c.schedule, b, false);
      test::emulate_rerotate_grid(detail::make_rerotate_args(c.schedule, b, nullptr), 64);
      EXPECT_TRUE(cpu.cache_bytes == gpu.cache_bytes) << test::first_difference(cpu.cache_bytes, gpu.cache_bytes);
    }
  }
}

// Raw positions in device memory: an unusable one (negative, beyond 2^31, not a row of a device
// table) is flagged as apply's kernels flag it and its keys are left; the rest equal the CPU's
// call without those entries. With a DeviceTable's rows the angles are the host Table's.
TEST(FusedEmulation, RerotateCacheRawPositionsAreCheckedAndATablesRowsRead) {
  for (const bool with_table : {false, true}) {
    SCOPED_TRACE(with_table ? "a device table's rows" : "exact angles");
    test::RerotateCase c;
    c.schedule = make_schedule(Spec{.head_dim = 64, .rotary_dim = 48});
    c.cache_dtype = DType::fp8_e4m3;
    c.raw = true;
    c.tokens = 12;
    c.seed = 70;
    test::RerotateSetup cpu(c), gpu(c);
    const Table table = Table::range(c.schedule, 0, 100001);  // the setup's positions are below 100001
    std::vector<size_t> bad;
    for (size_t t = 0; t < gpu.slots.size() && bad.size() < 3; ++t) {
      if (gpu.slots[t] >= 0) bad.push_back(t);
    }
    gpu.positions[bad[0]] = -3;
    gpu.positions[bad[1]] = int64_t{1} << 31;
    gpu.positions[bad[2]] = with_table ? 100001 : 7;  // beyond the table's rows, or a usable one
    for (size_t i = 0; i < (with_table ? 3u : 2u); ++i) cpu.slots[bad[i]] = -1;
    cpu.positions[bad[2]] = 7;  // the CPU checks every entry's position, skipped ones too
    RerotateCacheArgs a = cpu.args();
    if (with_table) a.table = &table;
    rerotate_cache(c.schedule, a);
    const RerotateCacheArgs b = gpu.args();
    detail::validate_rerotate_cache(c.schedule, b, false);  // a device call's: positions not read
    const detail::TableRows rows = detail::table_range(table);
    uint32_t error = 0;
    detail::RerotateKernelArgs r = detail::make_rerotate_args(c.schedule, b, with_table ? &rows : nullptr);
    r.rope.error = &error;
    test::emulate_rerotate_grid(r, 64);
    EXPECT_EQ(error, detail::kPositionOutOfRange | (with_table ? detail::kPositionNotInTable : 0u));
    EXPECT_TRUE(cpu.cache_bytes == gpu.cache_bytes) << test::first_difference(cpu.cache_bytes, gpu.cache_bytes);
  }
}

// A slot beyond a cache's capacity reaches the kernels only from device memory (the host checks
// host slots): the grid skips that token's cache writes, never writing past the cache, and still
// writes the others and q, flagging slot_out_of_range.
TEST(FusedEmulation, ASlotBeyondTheCacheIsNeverWritten) {
  const Schedule s = make_schedule(Spec{.head_dim = 64});
  const int64_t tokens = 4, d = 64, capacity = 8;
  std::vector<float> q(static_cast<size_t>(tokens * 2 * d), 1.0f), k(static_cast<size_t>(tokens * d), 1.0f);
  std::vector<float> v = k;
  // k and v caches of 2 blocks x 4 slots x 1 head, each followed by a guard of zeros.
  const size_t cache = static_cast<size_t>(capacity * d), guard = 64 * 64 * 2;
  std::vector<float> k_mem(cache + guard, 0.0f), v_mem(cache + guard, 0.0f);
  const std::vector<int64_t> slots = {0, 1, 99, 2};
  RopeStoreArgs a;
  a.rope.q = TensorView::bshd(q.data(), DType::f32, 1, tokens, 2, d);
  a.rope.k = TensorView::bshd(k.data(), DType::f32, 1, tokens, 1, d);
  a.cache.slots = Slots::of(std::span<const int64_t>(slots));
  a.cache.k_cache = CacheView::nhd(k_mem.data(), DType::f32, 2, 4, 1, d);
  a.cache.v_cache = CacheView::nhd(v_mem.data(), DType::f32, 2, 4, 1, d);
  a.cache.v = TensorView::bshd(v.data(), DType::f32, 1, tokens, 1, d);
  detail::validate_rope_store(s, a, false);  // a device call's validation: slot values not read
  uint32_t error = 0;
  detail::FusedKernelArgs f = detail::make_rope_store_args(s, a, nullptr);
  f.rope.error = &error;
  test::emulate_fused_grid(f, 32);
  EXPECT_EQ(error, detail::kSlotOutOfRange);
  for (const auto* mem : {&k_mem, &v_mem}) {
    for (size_t i = cache; i < mem->size(); ++i) ASSERT_EQ((*mem)[i], 0.0f) << "written past the cache at " << i;
    for (const int64_t slot : {0, 1, 2}) EXPECT_NE((*mem)[static_cast<size_t>(slot * d)], 0.0f) << "slot " << slot;
  }
}

// ---- rope_store's fast kernel (src/cuda/fast_store_body.hpp) ----

/// A device call's kernel arguments for `setup`'s store (validated as the CUDA entry points do, a
/// table as a DeviceTable's range), with an error word.
struct DeviceStore {
  RopeStoreArgs args;
  std::optional<detail::TableRows> rows;
  uint32_t error = 0;
  detail::FusedKernelArgs f;
  DeviceStore(const Schedule& s, test::StoreSetup& setup, const std::function<void(RopeStoreArgs&)>& edit = {})
      : args(setup.store_args()) {
    if (edit) edit(args);
    detail::validate_rope_store(s, args, false);
    if (setup.table) rows = detail::table_range(*setup.table);
    f = detail::make_rope_store_args(s, args, rows ? &*rows : nullptr);
    f.rope.error = &error;
  }
};

/// The fast kernel's grid, with the launch a device of `multiprocessors` SMs picks (or `shape`), on
/// the case `cpu` holds after the CPU's rope_store: q, k and both caches equal byte for byte, no
/// error raised. False (nothing run) when the fast kernel does not take the case.
bool expect_fast_store_equals_cpu(const test::StoreCase& c, const test::StoreSetup& cpu, int multiprocessors,
                                  std::optional<detail::cuda::FastShape> shape = {}) {
  test::StoreSetup fast(c);
  DeviceStore call(c.schedule, fast);
  if (detail::cuda::fast_store_refusal(call.f) != nullptr) return false;
  const detail::cuda::FastShape launch = shape ? *shape : detail::cuda::fast_store_launch_shape(call.f, multiprocessors);
  SCOPED_TRACE(fmt::format("fast store: {} SMs, chunks={} rows={} tile_shift={} group_heads={} groups={} grid={}",
                           multiprocessors, launch.chunks, launch.rows, launch.tile_shift, launch.group_heads,
                           launch.groups, launch.grid));
  detail::cuda::emulate_fast_store(call.f, launch);
  EXPECT_EQ(call.error, 0u);
  EXPECT_TRUE(cpu.q == fast.q) << "q " << test::first_difference(cpu.q, fast.q);
  EXPECT_TRUE(cpu.k == fast.k) << "k";
  EXPECT_TRUE(cpu.k_cache_bytes == fast.k_cache_bytes) << "k_cache " << test::first_difference(cpu.k_cache_bytes, fast.k_cache_bytes);
  EXPECT_TRUE(cpu.v_cache_bytes == fast.v_cache_bytes) << "v_cache " << test::first_difference(cpu.v_cache_bytes, fast.v_cache_bytes);
  return true;
}

// ---- The CPU suite's case grids (tests/test_fused.cpp) through the device's split ----

// A device call's form of a case: validated as the CUDA entry points validate (nothing in device
// memory read), a table given as a DeviceTable's range of rows, the block's thread count as a launch
// of its size would have it.
// Also runs rope_store's fast kernel where it takes the case (expect_fast_store_equals_cpu, with the
// launches of a 132-SM H100/H200 and of one SM: one-token tiles with heads split into groups, and
// multi-token tiles); returns whether it did.
bool expect_store_grid_equals_cpu(const test::StoreCase& c, int threads) {
  SCOPED_TRACE(c.name() + " threads=" + std::to_string(threads));
  test::StoreSetup cpu(c), gpu(c);
  rope_store(c.schedule, cpu.store_args());
  const RopeStoreArgs args = gpu.store_args();
  detail::validate_rope_store(c.schedule, args, false);
  std::optional<detail::TableRows> rows;
  if (gpu.table) rows = detail::table_range(*gpu.table);
  uint32_t error = 0;
  detail::FusedKernelArgs f = detail::make_rope_store_args(c.schedule, args, rows ? &*rows : nullptr);
  f.rope.error = &error;
  f.check_duplicates = threads == 64;  // the check changes nothing with distinct slots
  test::emulate_fused_grid(f, threads);
  EXPECT_EQ(error, 0u);
  EXPECT_TRUE(cpu.q == gpu.q) << "q " << test::first_difference(cpu.q, gpu.q);
  EXPECT_TRUE(cpu.k == gpu.k) << "k";
  EXPECT_TRUE(cpu.k_cache_bytes == gpu.k_cache_bytes) << "k_cache " << test::first_difference(cpu.k_cache_bytes, gpu.k_cache_bytes);
  EXPECT_TRUE(cpu.v_cache_bytes == gpu.v_cache_bytes) << "v_cache " << test::first_difference(cpu.v_cache_bytes, gpu.v_cache_bytes);
  const bool fast = expect_fast_store_equals_cpu(c, cpu, 132);
  if (fast) expect_fast_store_equals_cpu(c, cpu, 1);
  return fast;
}

/// qk_norm_rope through the fast kernel's grid (kNorm), as expect_fast_store_equals_cpu: false
/// (nothing run) when the fast kernel does not take the case.
bool expect_fast_norm_equals_cpu(const test::NormCase& c, const test::NormSetup& cpu, int multiprocessors,
                                 std::optional<detail::cuda::FastShape> shape = {}) {
  test::NormSetup fast(c);
  const QkNormRopeArgs args = fast.norm_args();
  detail::validate_qk_norm_rope(c.schedule, args, false);
  uint32_t error = 0;
  detail::FusedKernelArgs f = detail::make_qk_norm_rope_args(c.schedule, args, nullptr);
  f.rope.error = &error;
  if (detail::cuda::fast_store_refusal(f) != nullptr) return false;
  const detail::cuda::FastShape launch = shape ? *shape : detail::cuda::fast_store_launch_shape(f, multiprocessors);
  SCOPED_TRACE(fmt::format("fast norm: {} SMs, chunks={} rows={} tile_shift={} group_heads={} groups={} grid={}",
                           multiprocessors, launch.chunks, launch.rows, launch.tile_shift, launch.group_heads,
                           launch.groups, launch.grid));
  detail::cuda::emulate_fast_store(f, launch);
  EXPECT_EQ(error, 0u);
  EXPECT_TRUE(cpu.q == fast.q) << "q " << test::first_difference(cpu.q, fast.q);
  EXPECT_TRUE(cpu.k == fast.k) << "k " << test::first_difference(cpu.k, fast.k);
  EXPECT_TRUE(cpu.v == fast.v) << "v";
  EXPECT_TRUE(cpu.k_cache_bytes == fast.k_cache_bytes) << "k_cache";
  EXPECT_TRUE(cpu.v_cache_bytes == fast.v_cache_bytes) << "v_cache";
  return true;
}

// Also runs the fast kernel where it takes the case (132 SMs and one); returns whether it did.
bool expect_norm_grid_equals_cpu(const test::NormCase& c, int threads) {
  SCOPED_TRACE(c.name() + " threads=" + std::to_string(threads));
  test::NormSetup cpu(c), gpu(c);
  qk_norm_rope(c.schedule, cpu.norm_args());
  const QkNormRopeArgs args = gpu.norm_args();
  detail::validate_qk_norm_rope(c.schedule, args, false);
  uint32_t error = 0;
  detail::FusedKernelArgs f = detail::make_qk_norm_rope_args(c.schedule, args, nullptr);
  f.rope.error = &error;
  test::emulate_fused_grid(f, threads);
  EXPECT_EQ(error, 0u);
  EXPECT_TRUE(cpu.q == gpu.q) << "q " << test::first_difference(cpu.q, gpu.q);
  EXPECT_TRUE(cpu.k == gpu.k) << "k " << test::first_difference(cpu.k, gpu.k);
  EXPECT_TRUE(cpu.v == gpu.v) << "v " << test::first_difference(cpu.v, gpu.v);
  EXPECT_TRUE(cpu.k_cache_bytes == gpu.k_cache_bytes) << "k_cache";
  EXPECT_TRUE(cpu.v_cache_bytes == gpu.v_cache_bytes) << "v_cache";
  const bool fast = expect_fast_norm_equals_cpu(c, cpu, 132);
  if (fast) expect_fast_norm_equals_cpu(c, cpu, 1);
  return fast;
}

constexpr int kLaunchThreads[] = {32, 64, 256};

TEST(FusedEmulation, RopeStoreOverEveryLayoutBlockSizeHeadDimAndPairing) {
  const std::vector<test::StoreCase> cases = test::layout_grid();
  for (size_t i = 0; i < cases.size(); ++i) {
    const bool fast = expect_store_grid_equals_cpu(cases[i], kLaunchThreads[i % 3]);
    // bf16 caches of the data's dtype, 16-byte rows: the fast kernel takes every case it can rotate
    // (rotary_dim <= 256), so the grid above held it against the CPU.
    EXPECT_EQ(fast, cases[i].schedule.rotary_dim <= 256) << cases[i].name();
  }
}

TEST(FusedEmulation, RopeStoreOverGqaRatiosPartialRotaryOffsetsDtypesAndScales) {
  std::vector<test::StoreCase> cases = test::gqa_grid({DType::f32, DType::f16, DType::bf16, DType::f64});
  for (const std::vector<test::StoreCase>& more : {test::quantised_grid(), test::fp8_extremes_grid()}) {
    cases.insert(cases.end(), more.begin(), more.end());
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const bool fast = expect_store_grid_equals_cpu(cases[i], kLaunchThreads[i % 3]);
    // The fast kernel takes caches of the data's dtype (f32, f16, bf16; not f64) and quantised ones
    // (fp8 e4m3/e5m2, int8, per tensor or per head, both scale modes), and refuses a cache of another
    // model dtype, which the general kernel serves (held against the CPU above).
    const bool taken = cases[i].dtype != DType::f64 &&
                       (cases[i].cache_dtype == cases[i].dtype || is_quantised_dtype(cases[i].cache_dtype));
    EXPECT_EQ(fast, taken) << cases[i].name();
  }
}

TEST(FusedEmulation, RopeStoreWithMropeEveryAngleSourceXposAndMlaRows) {
  int seed = 400;
  test::StoreCase c;
  c.schedule = make_schedule(Spec{.head_dim = 128, .stream_layout = StreamLayout::sections, .sections = {16, 24, 24}});
  c.mrope = true;
  c.seed = ++seed;
  // The fast kernel takes M-RoPE, every angle source (its phase A is apply's) and MLA's k_pass, not
  // xPos: the general kernel's.
  EXPECT_TRUE(expect_store_grid_equals_cpu(c, 64));
  c.schedule = make_schedule(Spec{.head_dim = 128, .rotary_dim = 64, .pairing = Pairing::interleaved,
                                  .stream_layout = StreamLayout::sections, .sections = {8, 12, 12}});  // GLM-4.1V
  EXPECT_TRUE(expect_store_grid_equals_cpu(c, 256));
  for (const test::AngleSource source :
       {test::AngleSource::table, test::AngleSource::caller, test::AngleSource::hf_float32, test::AngleSource::exact}) {
    test::StoreCase s;
    s.schedule = make_schedule(Spec{.head_dim = 64, .schedule = ScheduleType::yarn, .factor = 4.0,
                                    .original_max_position = 4096});
    s.source = source;
    s.seed = ++seed;
    EXPECT_TRUE(expect_store_grid_equals_cpu(s, 64));
  }
  test::StoreCase x;
  x.schedule = with_xpos(make_schedule(Spec{.head_dim = 64, .pairing = Pairing::interleaved}), 512.0);
  x.seed = ++seed;
  EXPECT_FALSE(expect_store_grid_equals_cpu(x, 32));
  const test::StoreCase mla = test::deepseek_mla_case(++seed);  // latent rows [kv_c 512 | k_pe 64]
  EXPECT_TRUE(expect_store_grid_equals_cpu(mla, 256));
  // The latent row in fp8 (a scale each for kv_c and k_pe, both modes), from f32 into int8, a narrow
  // kv_c (96) in a token pool, half pairing.
  for (const ScaleMode mode : {ScaleMode::divide, ScaleMode::multiply}) {
    test::StoreCase fp8 = mla;
    fp8.cache_dtype = DType::fp8_e4m3;
    fp8.scaled = true;
    fp8.mode = mode;
    fp8.seed = ++seed;
    EXPECT_TRUE(expect_store_grid_equals_cpu(fp8, 64));
  }
  test::StoreCase i8 = mla;
  i8.dtype = DType::f32;
  i8.cache_dtype = DType::i8;
  i8.scaled = true;
  i8.magnitude = 200.0f;
  i8.seed = ++seed;
  EXPECT_TRUE(expect_store_grid_equals_cpu(i8, 32));
  test::StoreCase narrow = mla;
  narrow.schedule = make_schedule(Spec{.head_dim = 64, .pairing = Pairing::half});
  narrow.pass_dim = 96;
  narrow.block_size = 1;
  narrow.dtype = narrow.cache_dtype = DType::f16;
  narrow.seed = ++seed;
  EXPECT_TRUE(expect_store_grid_equals_cpu(narrow, 256));
}

TEST(FusedEmulation, QkNormRopeOverEveryModelsNormDtypeAndHeadDim) {
  int seed = 900;
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (const int64_t d : {64, 128, 256, 512}) {
      test::NormCase qwen3{.schedule = make_schedule(Spec{.head_dim = d}), .dtype = dtype, .seed = ++seed};
      // The fast kernel takes the norm before the rotation per head (Qwen3, Gemma 3) up to
      // rotary_dim 256; the general kernel the rest (v's norm, all heads, the norm after).
      EXPECT_EQ(expect_norm_grid_equals_cpu(qwen3, kLaunchThreads[seed % 3]), d <= 256);
      test::NormCase gemma3 = qwen3;  // 1 + w, all float32
      gemma3.rounding = NormRounding::gemma;
      gemma3.weight_offset = 1.0f;
      EXPECT_EQ(expect_norm_grid_equals_cpu(gemma3, 256), d <= 256);
      test::NormCase gemma4 = gemma3;  // + weightless v norm, cache write
      gemma4.v_norm = true;
      gemma4.store = true;
      EXPECT_FALSE(expect_norm_grid_equals_cpu(gemma4, 32));
    }
    test::NormCase olmo2{.schedule = make_schedule(Spec{.head_dim = 128}), .dtype = dtype, .seed = ++seed};
    olmo2.scope = NormScope::all_heads;
    olmo2.rounding = NormRounding::gemma;
    EXPECT_FALSE(expect_norm_grid_equals_cpu(olmo2, 64));
    test::NormCase llama4{.schedule = make_schedule(Spec{.head_dim = 128, .pairing = Pairing::interleaved}),
                          .dtype = dtype, .seed = ++seed};
    llama4.order = NormOrder::rope_then_norm;
    llama4.weights = false;
    llama4.rounding = NormRounding::gemma;
    EXPECT_FALSE(expect_norm_grid_equals_cpu(llama4, 64));
    test::NormCase partial{.schedule = make_schedule(Spec{.head_dim = 128, .rotary_dim = 64}), .dtype = dtype,
                           .seed = ++seed};
    partial.store = true;
    EXPECT_TRUE(expect_norm_grid_equals_cpu(partial, 32));
    test::NormCase mrope{.schedule = make_schedule(Spec{.head_dim = 128, .stream_layout = StreamLayout::sections,
                                                        .sections = {16, 24, 24}}),
                         .dtype = dtype, .seed = ++seed};
    mrope.mrope = true;
    EXPECT_TRUE(expect_norm_grid_equals_cpu(mrope, 256));
    test::NormCase rope_all = olmo2;
    rope_all.order = NormOrder::rope_then_norm;
    rope_all.store = true;
    EXPECT_FALSE(expect_norm_grid_equals_cpu(rope_all, 32));
  }
}

// Gemma 4's v norm into a v_out laid out head-major ([b, h, s, d]) while v is token-major: the
// general kernel writes v_out at its own strides, as the CPU does (and nothing beyond them).
TEST(FusedEmulation, VNormIntoAVOutOfItsOwnLayoutEqualsTheCpu) {
  for (const DType dtype : {DType::bf16, DType::f32}) {
    test::NormCase c{.schedule = make_schedule(Spec{.head_dim = 128}), .dtype = dtype, .seed = 4200};
    c.rounding = NormRounding::gemma;
    c.weight_offset = 1.0f;
    c.v_norm = true;
    c.tokens = 9;
    SCOPED_TRACE(c.name());
    const int64_t d = c.schedule.head_dim, hk = c.heads_k, es = size_of(dtype), guard = 32;
    test::NormSetup cpu(c), gpu(c);
    test::Buffer cpu_out(static_cast<size_t>((c.tokens * hk * d + 2 * guard) * es), 0x6b), gpu_out = cpu_out;
    auto with_out = [&](test::NormSetup& s, test::Buffer& out) {
      QkNormRopeArgs a = s.norm_args();
      a.v_out = TensorView{.data = out.data() + guard * es, .dtype = dtype, .shape = {1, c.tokens, hk, d},
                           .strides = {c.tokens * hk * d, d, c.tokens * d, 1}};
      return a;
    };
    qk_norm_rope(c.schedule, with_out(cpu, cpu_out));
    const QkNormRopeArgs args = with_out(gpu, gpu_out);
    detail::validate_qk_norm_rope(c.schedule, args, false);
    uint32_t error = 0;
    detail::FusedKernelArgs f = detail::make_qk_norm_rope_args(c.schedule, args, nullptr);
    f.rope.error = &error;
    test::emulate_fused_grid(f, 64);
    EXPECT_EQ(error, 0u);
    EXPECT_TRUE(cpu_out == gpu_out) << test::first_difference(cpu_out, gpu_out);
    EXPECT_TRUE(cpu.v == gpu.v && cpu.q == gpu.q && cpu.k == gpu.k);
    EXPECT_NE(cpu_out, test::Buffer(cpu_out.size(), 0x6b)) << "v_out written";
  }
}

// ---- Duplicate slots on the device (FusedOptions::check_duplicate_slots) ----

// Two tokens sharing a slot: the grid writes neither token's cache rows, flags slot_duplicate, and
// leaves everything else as the CPU call with those two slots set to -1 leaves it.
TEST(FusedEmulation, ASlotTwoTokensShareIsWrittenByNeitherAndFlagged) {
  for (const bool i32 : {false, true}) {
    for (const int threads : {32, 256}) {
      test::StoreCase c;
      c.schedule = make_schedule(Spec{.head_dim = 128});
      c.tokens = 40;  // more tokens than a block of 32 threads: each thread scans several
      c.seed = threads + (i32 ? 1 : 0);
      SCOPED_TRACE(std::string(i32 ? "int32" : "int64") + " slots, threads " + std::to_string(threads));
      test::StoreSetup cpu(c), gpu(c);
      std::vector<int64_t> valid;
      for (size_t t = 0; t < gpu.slots.size(); ++t) {
        if (gpu.slots[t] >= 0) valid.push_back(static_cast<int64_t>(t));
      }
      const auto first = static_cast<size_t>(valid[3]), second = static_cast<size_t>(valid.back());
      gpu.slots[second] = gpu.slots[first];
      cpu.slots[first] = cpu.slots[second] = -1;
      rope_store(c.schedule, cpu.store_args());
      RopeStoreArgs args = gpu.store_args();
      const std::vector<int32_t> slots32(gpu.slots.begin(), gpu.slots.end());
      if (i32) args.cache.slots = Slots::of(std::span<const int32_t>(slots32));
      detail::validate_rope_store(c.schedule, args, false);
      uint32_t error = 0;
      detail::FusedKernelArgs f = detail::make_rope_store_args(c.schedule, args, nullptr);
      f.rope.error = &error;
      f.check_duplicates = true;
      test::emulate_fused_grid(f, threads);
      EXPECT_EQ(error, detail::kSlotDuplicate);
      EXPECT_TRUE(cpu.q == gpu.q) << "q";
      EXPECT_TRUE(cpu.k_cache_bytes == gpu.k_cache_bytes) << test::first_difference(cpu.k_cache_bytes, gpu.k_cache_bytes);
      EXPECT_TRUE(cpu.v_cache_bytes == gpu.v_cache_bytes) << test::first_difference(cpu.v_cache_bytes, gpu.v_cache_bytes);
    }
  }
  // qk_norm_rope's cache write takes the same check.
  test::NormCase c{.schedule = make_schedule(Spec{.head_dim = 64}), .dtype = DType::bf16, .seed = 5};
  c.store = true;
  c.tokens = 9;
  test::NormSetup cpu(c), gpu(c);
  std::vector<size_t> valid;
  for (size_t t = 0; t < gpu.slots.size(); ++t) {
    if (gpu.slots[t] >= 0) valid.push_back(t);
  }
  gpu.slots[valid[0]] = gpu.slots[valid[1]];
  cpu.slots[valid[0]] = cpu.slots[valid[1]] = -1;
  qk_norm_rope(c.schedule, cpu.norm_args());
  const QkNormRopeArgs args = gpu.norm_args();
  detail::validate_qk_norm_rope(c.schedule, args, false);  // a device call's: slot values not read
  uint32_t error = 0;
  detail::FusedKernelArgs f = detail::make_qk_norm_rope_args(c.schedule, args, nullptr);
  f.rope.error = &error;
  f.check_duplicates = true;
  test::emulate_fused_grid(f, 64);
  EXPECT_EQ(error, detail::kSlotDuplicate);
  EXPECT_TRUE(cpu.q == gpu.q && cpu.k == gpu.k) << "q, k";
  EXPECT_TRUE(cpu.k_cache_bytes == gpu.k_cache_bytes) << "k_cache";
  EXPECT_TRUE(cpu.v_cache_bytes == gpu.v_cache_bytes) << "v_cache";
}

// rerotate_cache: a slot listed twice is turned by neither entry (not twice, not racing) and flagged.
TEST(FusedEmulation, ASlotListedTwiceIsNotRerotatedAndFlagged) {
  const Schedule schedule = make_schedule(Spec{.head_dim = 64});
  const int64_t blocks = 4, block = 16, heads = 2, d = 64, count = 20;
  std::mt19937 rng(9);
  std::vector<unsigned char> cpu_cache(static_cast<size_t>(blocks * block * heads * d * 2));
  for (auto& byte : cpu_cache) byte = static_cast<unsigned char>(rng() % 0x70);
  std::vector<unsigned char> gpu_cache = cpu_cache;
  std::vector<int64_t> gpu_slots(static_cast<size_t>(count)), delta(static_cast<size_t>(count));
  std::iota(gpu_slots.begin(), gpu_slots.end(), 30);
  for (auto& x : delta) x = static_cast<int64_t>(rng() % 2001) - 1000;
  gpu_slots[17] = gpu_slots[2];
  std::vector<int64_t> cpu_slots = gpu_slots;
  cpu_slots[17] = cpu_slots[2] = -1;
  const auto args = [&](std::vector<unsigned char>& cache, const std::vector<int64_t>& slots) {
    RerotateCacheArgs a{.cache = CacheView::nhd(cache.data(), DType::bf16, blocks, block, heads, d),
                        .slots = Slots::of(std::span<const int64_t>(slots))};
    a.delta = delta.data();
    return a;
  };
  rerotate_cache(schedule, args(cpu_cache, cpu_slots));
  const RerotateCacheArgs gpu = args(gpu_cache, gpu_slots);
  detail::validate_rerotate_cache(schedule, gpu, false);
  uint32_t error = 0;
  detail::RerotateKernelArgs r = detail::make_rerotate_args(schedule, gpu, nullptr);
  r.rope.error = &error;
  r.check_duplicates = true;
  test::emulate_rerotate_grid(r, 32);
  EXPECT_EQ(error, detail::kSlotDuplicate);
  EXPECT_TRUE(cpu_cache == gpu_cache);
}

// ---- Scales in device memory ----

// A scale not finite and > 0 (a cache's per head, q_out's, rerotate_cache's): the grid writes
// nothing at all (as the host refuses such host scales) and flags scale_invalid.
TEST(FusedEmulation, AScaleNotFiniteAndPositiveWritesNothingAndIsFlagged) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const float bad : {0.0f, -0.5f, nan, inf, -0.0f}) {
    for (const int which : {0, 1, 2}) {  // k_scale's head 1, v_scale, q_out's scale
      SCOPED_TRACE("scale " + std::to_string(bad) + " in " + std::to_string(which));
      test::StoreCase c;
      c.schedule = make_schedule(Spec{.head_dim = 64});
      c.cache_dtype = DType::fp8_e4m3;
      c.scaled = true;
      c.per_head_scale = true;
      c.seed = 7 + which;
      test::StoreSetup s(c);
      if (which == 0) s.k_scales[1] = bad;
      if (which == 1) s.v_scales[0] = bad;
      RopeStoreArgs args = s.store_args();
      std::vector<unsigned char> q_out(static_cast<size_t>(c.tokens * c.heads_q * 64), 0x3c);
      const float q_scale = which == 2 ? bad : 1.0f;
      args.q_quantized = TensorView::bshd(q_out.data(), DType::fp8_e4m3, 1, c.tokens, c.heads_q, 64);
      args.q_quant = CacheQuant{.scale = &q_scale};
      detail::validate_rope_store(c.schedule, args, false);  // a device call's: scale values not read
      const test::Buffer q = s.q, k_cache = s.k_cache_bytes, v_cache = s.v_cache_bytes;
      const std::vector<unsigned char> q_out_before = q_out;
      uint32_t error = 0;
      detail::FusedKernelArgs f = detail::make_rope_store_args(c.schedule, args, nullptr);
      f.rope.error = &error;
      test::emulate_fused_grid(f, 64);
      EXPECT_EQ(error, detail::kScaleInvalid);
      EXPECT_TRUE(q == s.q && k_cache == s.k_cache_bytes && v_cache == s.v_cache_bytes && q_out == q_out_before)
          << "written";
      EXPECT_ANY_THROW(validate(c.schedule, args)) << "the host refuses the same scale";
    }
  }
  // rerotate_cache
  const Schedule schedule = make_schedule(Spec{.head_dim = 64});
  std::vector<unsigned char> cache(static_cast<size_t>(2 * 16 * 2 * 64), 0x21);
  const std::vector<unsigned char> before = cache;
  const std::vector<int64_t> slots = {3, 9}, delta = {5, -7};
  const float scales[2] = {0.5f, std::numeric_limits<float>::quiet_NaN()};
  RerotateCacheArgs a{.cache = CacheView::nhd(cache.data(), DType::fp8_e5m2, 2, 16, 2, 64),
                      .slots = Slots::of(std::span<const int64_t>(slots))};
  a.delta = delta.data();
  a.quant = CacheQuant{.scale = scales, .count = 2};
  detail::validate_rerotate_cache(schedule, a, false);
  uint32_t error = 0;
  detail::RerotateKernelArgs r = detail::make_rerotate_args(schedule, a, nullptr);
  r.rope.error = &error;
  test::emulate_rerotate_grid(r, 32);
  EXPECT_EQ(error, detail::kScaleInvalid);
  EXPECT_TRUE(cache == before);
}

// ---- rope_store's fast kernel: launch shapes, skips and flags, out-of-place outputs, refusals ----

/// Every launch shape of the fast store grid that fits a block: tiles of 1-8 tokens, rows from one
/// per token (each thread loops over its heads) to a full block, head groups from one to a head per
/// group, grids from one block (looping over every tile) to a block per tile.
std::vector<detail::cuda::FastShape> fast_store_shapes(const detail::FusedKernelArgs& f) {
  std::vector<detail::cuda::FastShape> shapes;
  const int chunks = detail::cuda::fast_store_chunks(f);
  const detail::cuda::FastCopied copied = detail::cuda::fast_store_copied(f);  // v, or MLA's k_pass
  const int64_t heads = f.rope.operands[0].heads + f.rope.operands[1].heads + (copied.flat ? copied.flat->heads : 0);
  for (int shift = 0; shift <= 3; ++shift) {
    const int tile = 1 << shift;
    const int max_rows = 256 / chunks / tile * tile;
    if (max_rows < tile) continue;
    const int64_t tiles = (f.rope.tokens + tile - 1) / tile;
    for (const int rows : {tile, 2 * tile, max_rows}) {
      if (rows > max_rows) continue;
      for (const int64_t groups : {int64_t{1}, int64_t{2}, heads}) {
        for (const int64_t grid : {int64_t{1}, int64_t{3}, tiles}) {
          detail::cuda::FastShape shape;
          shape.chunks = chunks;
          shape.rows = rows;
          shape.tile_shift = shift;
          shape.group_heads = static_cast<int>((heads + groups - 1) / groups);
          shape.groups = static_cast<int>((heads + shape.group_heads - 1) / shape.group_heads);
          shape.grid = std::min(grid, tiles);
          shapes.push_back(shape);
        }
      }
    }
  }
  return shapes;
}

TEST(FusedEmulation, RopeStoreFastKernelOverEveryLaunchShape) {
  std::vector<test::StoreCase> cases;
  test::StoreCase c;  // Llama-like: bf16, half pairing, GQA 4
  c.schedule = test::schedule_of(128, 128, Pairing::half);
  c.heads_q = 8;
  c.heads_k = 2;
  c.tokens = 37;
  c.seed = 700;
  cases.push_back(c);
  // f32, interleaved, a slice at an offset (pass-through vectors on both sides), v twice k's width
  // (v's vectors beyond the registers' reach: the remainder loop).
  c.schedule = test::schedule_of(96, 64, Pairing::interleaved, 16);
  c.dtype = c.cache_dtype = DType::f32;
  c.layout = test::Layout::hnd;
  c.v_dim = 192;
  c.seed = 701;
  cases.push_back(c);
  // f16, half pairing of a quarter of the head, v four times k's width, block size 1 (a token pool).
  c.schedule = test::schedule_of(64, 16, Pairing::half);
  c.dtype = c.cache_dtype = DType::f16;
  c.layout = test::Layout::nhd;
  c.block_size = 1;
  c.v_dim = 256;
  c.heads_q = 3;
  c.heads_k = 3;
  c.seed = 702;
  cases.push_back(c);
  // bf16, head_dim 256, v narrower than k.
  c.schedule = test::schedule_of(256, 256, Pairing::interleaved);
  c.dtype = c.cache_dtype = DType::bf16;
  c.block_size = 64;
  c.v_dim = 64;
  c.heads_q = 4;
  c.heads_k = 4;
  c.tokens = 11;
  c.seed = 703;
  cases.push_back(c);
  // Quantised caches: fp8 e5m2 per head, multiplying, bf16 half pairing (8 codes a vector); int8 per
  // tensor from f32 interleaved with v twice k's width (4 codes a vector; the remainder loop
  // quantises too), values beyond int8's range.
  c.schedule = test::schedule_of(128, 128, Pairing::half);
  c.cache_dtype = DType::fp8_e5m2;
  c.scaled = true;
  c.per_head_scale = true;
  c.mode = ScaleMode::multiply;
  c.v_dim = 128;
  c.heads_q = 8;
  c.heads_k = 2;
  c.tokens = 21;
  c.seed = 704;
  cases.push_back(c);
  c.schedule = test::schedule_of(64, 32, Pairing::interleaved, 16);
  c.dtype = DType::f32;
  c.cache_dtype = DType::i8;
  c.per_head_scale = false;
  c.mode = ScaleMode::divide;
  c.magnitude = 200.0f;
  c.v_dim = 128;
  c.seed = 705;
  cases.push_back(c);
  // MLA (DeepSeek-V3): latent rows [kv_c 512 | k_pe 64], k_pass copied as v would be, in bf16 and in
  // fp8 e4m3 (a scale each for kv_c and k_pe).
  test::StoreCase mla = test::deepseek_mla_case(706);
  mla.tokens = 19;
  cases.push_back(mla);
  mla.cache_dtype = DType::fp8_e4m3;
  mla.scaled = true;
  mla.seed = 707;
  cases.push_back(mla);
  for (const test::StoreCase& sc : cases) {
    SCOPED_TRACE(sc.name() + fmt::format(" v_dim={}", sc.v_dim));
    test::StoreSetup cpu(sc), probe(sc);
    rope_store(sc.schedule, cpu.store_args());
    const DeviceStore call(sc.schedule, probe);
    ASSERT_EQ(detail::cuda::fast_store_refusal(call.f), nullptr);
    const std::vector<detail::cuda::FastShape> shapes = fast_store_shapes(call.f);
    ASSERT_GE(shapes.size(), 20u);
    for (const detail::cuda::FastShape& shape : shapes) ASSERT_TRUE(expect_fast_store_equals_cpu(sc, cpu, 0, shape));
  }
}

// Device semantics the CPU refuses up front: a position no angle serves (the token skipped: none of
// q, k, v written) and a slot beyond the caches (no cache written, flagged), with int64 and int32
// slots. The fast kernel must leave every byte and the error word as the general kernel does.
TEST(FusedEmulation, RopeStoreFastKernelSkipsAndFlagsAsTheGeneralKernel) {
  for (const bool i32 : {false, true}) {
    for (const Pairing pairing : {Pairing::half, Pairing::interleaved}) {
      test::StoreCase c;
      c.schedule = test::schedule_of(64, 64, pairing);
      c.tokens = 9;
      c.seed = i32 ? 720 : 721;
      SCOPED_TRACE(c.name() + (i32 ? " int32 slots" : " int64 slots"));
      test::StoreSetup general(c), fast(c);
      std::vector<int32_t> slots32[2];
      test::StoreSetup* setups[2] = {&general, &fast};
      std::optional<DeviceStore> calls[2];
      for (int i = 0; i < 2; ++i) {
        test::StoreSetup& s = *setups[i];
        s.positions[2] = -3;                        // position_out_of_range
        s.slots[4] = s.k_cache.capacity() + 5;      // slot_out_of_range
        s.slots[6] = -1;                            // skipped
        slots32[i].assign(s.slots.begin(), s.slots.end());
        calls[i].emplace(c.schedule, s, [&](RopeStoreArgs& a) {
          if (i32) a.cache.slots = Slots::of(std::span<const int32_t>(slots32[i]));
        });
      }
      ASSERT_EQ(detail::cuda::fast_store_refusal(calls[1]->f), nullptr);
      test::emulate_fused_grid(calls[0]->f, 64);
      detail::cuda::emulate_fast_store(calls[1]->f, detail::cuda::fast_store_launch_shape(calls[1]->f, 132));
      EXPECT_EQ(calls[0]->error, detail::kPositionOutOfRange | detail::kSlotOutOfRange);
      EXPECT_EQ(calls[1]->error, calls[0]->error);
      EXPECT_TRUE(general.q == fast.q) << test::first_difference(general.q, fast.q);
      EXPECT_TRUE(general.k == fast.k);
      EXPECT_TRUE(general.k_cache_bytes == fast.k_cache_bytes) << test::first_difference(general.k_cache_bytes, fast.k_cache_bytes);
      EXPECT_TRUE(general.v_cache_bytes == fast.v_cache_bytes) << test::first_difference(general.v_cache_bytes, fast.v_cache_bytes);
      // And what that is: token 2's q unrotated (its input bytes), its slot's rows never written.
      test::StoreSetup input(c);
      const int64_t row = c.heads_q * c.schedule.head_dim * 2;
      EXPECT_TRUE(std::equal(fast.q.begin() + 2 * row, fast.q.begin() + 3 * row, input.q.begin() + 2 * row));
    }
  }
}

// q_out and k_out out of place (their pass-through channels copied, before and after the slice),
// k_out = k in place, and v's cache in HND: equal to the CPU's rope_store with the same outputs.
TEST(FusedEmulation, RopeStoreFastKernelWritesQOutAndKOut) {
  for (const bool k_in_place : {false, true}) {
    test::StoreCase c;
    c.schedule = test::schedule_of(128, 64, Pairing::half, 32);
    c.heads_q = 6;
    c.heads_k = 2;
    c.tokens = 13;
    c.seed = k_in_place ? 730 : 731;
    SCOPED_TRACE(c.name() + (k_in_place ? " k_out=k" : " k_out apart"));
    test::StoreSetup cpu(c);
    const size_t q_bytes = cpu.q.size(), k_bytes = cpu.k.size();
    test::Buffer cpu_q_out(q_bytes, 0x5a), cpu_k_out(k_bytes, 0x5a);
    auto outputs = [&](test::StoreSetup& s, test::Buffer& q_out, test::Buffer& k_out) {
      return [&s, &q_out, &k_out, k_in_place](RopeStoreArgs& a) {
        a.rope.q_out = s.view(q_out, s.c.heads_q);
        a.rope.k_out = k_in_place ? a.rope.k : s.view(k_out, s.c.heads_k);
      };
    };
    RopeStoreArgs cpu_args = cpu.store_args();
    outputs(cpu, cpu_q_out, cpu_k_out)(cpu_args);
    rope_store(c.schedule, cpu_args);
    for (const int sms : {132, 1}) {  // each on fresh buffers: k_out = k rotates k in place
      test::StoreSetup fast(c);
      test::Buffer fast_q_out(q_bytes, 0x5a), fast_k_out(k_bytes, 0x5a);
      DeviceStore call(c.schedule, fast, outputs(fast, fast_q_out, fast_k_out));
      ASSERT_EQ(detail::cuda::fast_store_refusal(call.f), nullptr);
      detail::cuda::emulate_fast_store(call.f, detail::cuda::fast_store_launch_shape(call.f, sms));
      EXPECT_EQ(call.error, 0u);
      EXPECT_TRUE(cpu_q_out == fast_q_out) << test::first_difference(cpu_q_out, fast_q_out);
      EXPECT_TRUE(cpu.q == fast.q) << "q read only";
      EXPECT_TRUE(cpu_k_out == fast_k_out) << test::first_difference(cpu_k_out, fast_k_out);
      EXPECT_TRUE(cpu.k == fast.k) << test::first_difference(cpu.k, fast.k);
      EXPECT_TRUE(cpu.k_cache_bytes == fast.k_cache_bytes);
      EXPECT_TRUE(cpu.v_cache_bytes == fast.v_cache_bytes);
    }
    EXPECT_NE(cpu_q_out, test::Buffer(q_bytes, 0x5a)) << "q_out written";
  }
}

// What the fast kernel leaves to the general one, each named.
TEST(FusedEmulation, RopeStoreFastKernelRefusesWhatItDoesNotServe) {
  test::StoreCase c;
  c.schedule = test::schedule_of(64, 64, Pairing::half);
  test::StoreSetup base(c);
  EXPECT_EQ(detail::cuda::fast_store_refusal(DeviceStore(c.schedule, base).f), nullptr);
  auto refusal = [&](const test::StoreCase& sc, const std::function<void(RopeStoreArgs&)>& edit,
                     const std::function<void(detail::FusedKernelArgs&)>& edit_f = {}) {
    test::StoreSetup s(sc);
    DeviceStore call(sc.schedule, s, edit);
    if (edit_f) edit_f(call.f);
    const char* why = detail::cuda::fast_store_refusal(call.f);
    return std::string(why == nullptr ? "taken" : why);
  };
  test::StoreCase f16_cache = c;  // bf16 data
  f16_cache.cache_dtype = DType::f16;
  EXPECT_EQ(refusal(f16_cache, {}), "k_cache of another model dtype");
  test::StoreCase fp8 = c;
  fp8.cache_dtype = DType::fp8_e4m3;
  fp8.scaled = true;
  EXPECT_EQ(refusal(fp8, {}), "taken");
  EXPECT_EQ(refusal(fp8, [](RopeStoreArgs& a) { a.cache.v_cache.dtype = DType::fp8_e5m2; }),
            "k_cache and v_cache of different dtypes");
  // An fp8 cache's rows 4 bytes into an 8-byte vector of codes (bf16 data: 8 codes a vector).
  EXPECT_EQ(refusal(fp8, [](RopeStoreArgs& a) { a.cache.k_cache.data = static_cast<unsigned char*>(a.cache.k_cache.data) + 4; }),
            "k_cache's rows");
  EXPECT_EQ(refusal(c, {}, [](detail::FusedKernelArgs& f) { f.check_duplicates = true; }), "the device duplicate check");
  test::StoreCase xpos = c;
  xpos.schedule = with_xpos(c.schedule, 512.0);
  EXPECT_EQ(refusal(xpos, {}), "q or k not taken by apply's fast kernels");
  test::StoreCase f64 = c;
  f64.dtype = f64.cache_dtype = DType::f64;
  EXPECT_EQ(refusal(f64, {}), "q or k not taken by apply's fast kernels");
  // A v cache whose rows start 2 bytes into a vector.
  EXPECT_EQ(refusal(c, [](RopeStoreArgs& a) { a.cache.v_cache.data = static_cast<unsigned char*>(a.cache.v_cache.data) + 2; }),
            "v_cache's rows");
  EXPECT_EQ(refusal(c, [](RopeStoreArgs& a) { a.cache.k_cache.data = static_cast<unsigned char*>(a.cache.k_cache.data) + 8; }),
            "k_cache's rows");
  // MLA: k_pass takes v's place, so not beside a v; its cache of k_cache's dtype, its rows whole vectors.
  test::StoreCase mla = c;
  mla.layout = test::Layout::mla;
  mla.heads_k = 1;
  mla.pass_dim = 512;
  EXPECT_EQ(refusal(mla, {}), "taken");
  EXPECT_EQ(refusal(mla, {}, [&](detail::FusedKernelArgs& f) { f.v = f.k_pass; }), "k_pass beside v");
  EXPECT_EQ(refusal(mla, {}, [](detail::FusedKernelArgs& f) { f.k_pass_cache.dtype = DType::f16; }),
            "k_cache and k_pass_cache of different dtypes");
  EXPECT_EQ(refusal(mla, {}, [](detail::FusedKernelArgs& f) { f.k_pass_cache.offset += 4; }), "k_pass_cache's rows");
  EXPECT_EQ(refusal(mla, [](RopeStoreArgs& a) { a.cache.k_pass.data = static_cast<unsigned char*>(a.cache.k_pass.data) + 2; }),
            "k_pass's rows");
  // Sizes past the kernel's 32-bit row offsets and its grid (refused by their arguments alone:
  // fast_store_refusal reads no data). One v head of 2^31 bytes; more heads than gridDim.y groups.
  EXPECT_EQ(refusal(c, {}, [](detail::FusedKernelArgs& f) {
              f.v.heads = 1;
              f.v.dim = int64_t{1} << 30;  // bf16
              f.v_cache.head_dim = f.v.dim;
            }),
            "v_cache's rows");
  EXPECT_EQ(refusal(c, {}, [](detail::FusedKernelArgs& f) { f.v.heads = detail::cuda::kFastMaxGroups; }),
            "more than 65535 heads a token");
}

// qk_norm_rope's fast kernel (the norm before the rotation, per head) over every launch shape:
// llama and gemma roundings, weights in the data's dtype, in float32 and none, an offset weight,
// partial rotary at an offset (pass-through channels normalised in place), with and without the
// cache write, half and interleaved pairing.
TEST(FusedEmulation, QkNormRopeFastKernelOverEveryLaunchShape) {
  std::vector<test::NormCase> cases;
  test::NormCase qwen3{.schedule = test::schedule_of(128, 128, Pairing::half), .dtype = DType::bf16, .seed = 760};
  qwen3.heads_q = 8;
  qwen3.tokens = 19;
  qwen3.store = true;
  cases.push_back(qwen3);
  test::NormCase gemma3 = qwen3;
  gemma3.schedule = test::schedule_of(64, 32, Pairing::interleaved, 16);
  gemma3.dtype = DType::f16;
  gemma3.rounding = NormRounding::gemma;
  gemma3.weight_offset = 1.0f;
  gemma3.store = false;
  gemma3.seed = 761;
  cases.push_back(gemma3);
  test::NormCase plain = qwen3;  // no weights, f32, a slice after a pass-through part
  plain.schedule = test::schedule_of(96, 64, Pairing::half, 32);
  plain.dtype = DType::f32;
  plain.weights = false;
  plain.seed = 762;
  cases.push_back(plain);
  for (const test::NormCase& c : cases) {
    SCOPED_TRACE(c.name());
    test::NormSetup cpu(c), probe(c);
    qk_norm_rope(c.schedule, cpu.norm_args());
    const QkNormRopeArgs args = probe.norm_args();
    detail::validate_qk_norm_rope(c.schedule, args, false);
    const detail::FusedKernelArgs f = detail::make_qk_norm_rope_args(c.schedule, args, nullptr);
    ASSERT_EQ(detail::cuda::fast_store_refusal(f), nullptr);
    const std::vector<detail::cuda::FastShape> shapes = fast_store_shapes(f);
    ASSERT_GE(shapes.size(), 20u);
    for (const detail::cuda::FastShape& shape : shapes) ASSERT_TRUE(expect_fast_norm_equals_cpu(c, cpu, 0, shape));
  }
}

// A quantised cache's scale in device memory that is not finite and > 0: the fast kernel, as the
// general one, writes nothing at all (q included) and flags scale_invalid.
TEST(FusedEmulation, RopeStoreFastKernelWithAnUnusableScaleWritesNothing) {
  for (const float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    test::StoreCase c;
    c.schedule = test::schedule_of(64, 64, Pairing::half);
    c.cache_dtype = DType::fp8_e4m3;
    c.scaled = true;
    c.per_head_scale = true;
    c.seed = 740;
    SCOPED_TRACE(fmt::format("v scale of head 1: {}", bad));
    test::StoreSetup input(c), general(c), fast(c);
    general.v_scales[1] = bad;
    fast.v_scales[1] = bad;
    DeviceStore g(c.schedule, general), q(c.schedule, fast);
    ASSERT_EQ(detail::cuda::fast_store_refusal(q.f), nullptr);
    test::emulate_fused_grid(g.f, 64);
    detail::cuda::emulate_fast_store(q.f, detail::cuda::fast_store_launch_shape(q.f, 132));
    EXPECT_EQ(g.error, detail::kScaleInvalid);
    EXPECT_EQ(q.error, detail::kScaleInvalid);
    EXPECT_TRUE(fast.q == input.q && fast.k_cache_bytes == input.k_cache_bytes && fast.v_cache_bytes == input.v_cache_bytes);
    EXPECT_TRUE(general.q == input.q);
  }
}

// Thousands of heads in one qk_norm_rope call: the norm factors' shared memory (a float per head of
// the group and token of the tile) would pass the 48 KiB a block gets without opting in; the launch
// splits the heads into more groups instead (the shape checked here; any shape's bytes are held
// against the CPU by the launch-shape tests). Arguments by hand: no memory behind them is touched.
TEST(FusedEmulation, FastNormLaunchFitsSharedMemoryForThousandsOfHeads) {
  for (const int64_t heads_k : {8, 256, 1024}) {
    detail::FusedKernelArgs f;
    f.rope.dtype = DType::bf16;
    f.rope.batch = 1;
    f.rope.seq = f.rope.tokens = 8192;
    f.rope.head_dim = f.rope.rotary_dim = 128;
    f.rope.block_pairs = f.rope.partner = 64;
    f.rope.block_width = 128;
    f.rope.pair_step = 1;
    f.rope.operand_count = 2;
    f.rope.operands[0].heads = 4 * heads_k;
    f.rope.operands[1].heads = heads_k;
    f.norm = true;
    f.slots = &f;  // a cache write: v's heads join the head list
    f.k_cache.block_size = f.v_cache.block_size = 16;
    f.has_v_cache = true;
    f.v.heads = heads_k;
    f.v.dim = 128;
    const int64_t heads = 6 * heads_k;
    for (const int sms : {1, 132}) {
      SCOPED_TRACE(fmt::format("{} heads, {} SMs", heads, sms));
      const detail::cuda::FastShape shape = detail::cuda::fast_store_launch_shape(f, sms);
      EXPECT_LE(detail::cuda::fast_store_shared_bytes(detail::cuda::fast_store_args(f, shape)),
                detail::cuda::kFastStoreMaxShared);
      EXPECT_GE(int64_t{shape.group_heads} * shape.groups, heads);
      EXPECT_LT(int64_t{shape.group_heads} * (shape.groups - 1), heads);
      EXPECT_EQ(shape.rows % (1 << shape.tile_shift), 0);
      EXPECT_LE(shape.chunks * shape.rows, 256);
      if (heads_k == 1024) {  // the default shape alone would not fit
        const detail::cuda::FastShape unfitted = detail::cuda::fast_store_shape_of(f, sms);
        EXPECT_GT(detail::cuda::fast_store_shared_bytes(detail::cuda::fast_store_args(f, unfitted)),
                  detail::cuda::kFastStoreMaxShared);
      }
    }
  }
}

// The norm kernel's device semantics beside the store's (RopeStoreFastKernelSkipsAndFlagsAsTheGeneralKernel):
// q_out and k_out apart from q and k, int32 slots, a position no angle serves, a slot beyond the
// caches: every byte and the error word as the general kernel leaves them.
TEST(FusedEmulation, QkNormRopeFastKernelSkipsFlagsAndWritesOutputsAsTheGeneralKernel) {
  test::NormCase c{.schedule = test::schedule_of(128, 64, Pairing::half, 32), .dtype = DType::bf16, .seed = 780};
  c.tokens = 11;
  c.store = true;
  test::NormSetup general(c), fast(c);
  test::NormSetup* setups[2] = {&general, &fast};
  std::vector<int32_t> slots32[2];
  test::Buffer q_out[2], k_out[2];
  uint32_t error[2] = {0, 0};
  detail::FusedKernelArgs f[2];
  QkNormRopeArgs args[2];
  for (int i = 0; i < 2; ++i) {
    test::NormSetup& s = *setups[i];
    s.positions[3] = -7;                  // position_out_of_range: token 3 skipped
    s.slots[5] = 64 + 9;                  // beyond the 64-slot caches: no cache write, flagged
    slots32[i].assign(s.slots.begin(), s.slots.end());
    q_out[i].assign(s.q.size(), 0x77);
    k_out[i].assign(s.k.size(), 0x77);
    args[i] = s.norm_args();
    s.write.slots = Slots::of(std::span<const int32_t>(slots32[i]));
    args[i].rope.q_out = s.view(q_out[i], c.heads_q);
    args[i].rope.k_out = s.view(k_out[i], c.heads_k);
    detail::validate_qk_norm_rope(c.schedule, args[i], false);
    f[i] = detail::make_qk_norm_rope_args(c.schedule, args[i], nullptr);
    f[i].rope.error = &error[i];
  }
  ASSERT_EQ(detail::cuda::fast_store_refusal(f[1]), nullptr);
  test::emulate_fused_grid(f[0], 64);
  detail::cuda::emulate_fast_store(f[1], detail::cuda::fast_store_launch_shape(f[1], 132));
  EXPECT_EQ(error[0], detail::kPositionOutOfRange | detail::kSlotOutOfRange);
  EXPECT_EQ(error[1], error[0]);
  EXPECT_TRUE(q_out[0] == q_out[1]) << test::first_difference(q_out[0], q_out[1]);
  EXPECT_TRUE(k_out[0] == k_out[1]) << test::first_difference(k_out[0], k_out[1]);
  EXPECT_TRUE(general.q == fast.q && general.k == fast.k) << "q and k read only";
  EXPECT_TRUE(general.k_cache_bytes == fast.k_cache_bytes) << test::first_difference(general.k_cache_bytes, fast.k_cache_bytes);
  EXPECT_TRUE(general.v_cache_bytes == fast.v_cache_bytes);
  EXPECT_NE(q_out[1], test::Buffer(q_out[1].size(), 0x77)) << "q_out written";
}

}  // namespace
}  // namespace rotary

