// The fused operations' CUDA work split played on the host: per token, the angle row filled by
// `threads` threads (fused_angles with thread/threads, as a block's threads fill shared memory),
// the all-heads norms, then one item (head) per warp, its norm factor then its 32 lanes, in an order
// unlike the CPU loop's. The body
// is src/fused/body.hpp, the one the CPU runs: the results must equal rotary::rope_store's and
// qk_norm_rope's bit for bit (CPU == CUDA without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "fused/body.hpp"
#include "fused/fused_args.hpp"
#include "kernel/args.hpp"
#include "support/fused_cases.hpp"

namespace rotary {
namespace {

template <class T>
void emulate_grid(const detail::FusedKernelArgs& f, int threads) {
  using Value = typename detail::Storage<T>::Value;
  const detail::PairArrays pairs = detail::pair_arrays(f.rope);
  std::vector<detail::AngleCell<Value>> shared(static_cast<size_t>(f.rope.rotary_dim / 2));
  const int64_t items = detail::fused_items(f);
  if (!detail::fused_scales_usable(f)) {  // every block alike: nothing written, flagged once
    if (f.rope.error != nullptr) *f.rope.error |= detail::kScaleInvalid;
    return;
  }
  for (int64_t token = f.rope.tokens - 1; token >= 0; --token) {  // blocks in any order
    for (int t = 0; t < threads; ++t) detail::fused_angles<Value>(f, pairs, token, t, threads, shared.data());
    const int64_t slot = detail::raw_token_slot(f, token);
    if (f.rope.error != nullptr && f.slots != nullptr && detail::slot_beyond_caches(f, slot)) {
      *f.rope.error |= detail::kSlotOutOfRange;
    }
    // The duplicate check: the block's threads each scan their share of the slots, then or.
    bool shared_slot = false;
    for (int t = 0; f.check_duplicates && f.slots != nullptr && t < threads; ++t) {
      shared_slot = detail::slot_shared(f.slots, f.slots_i64, f.rope.tokens, token, slot, t, threads) || shared_slot;
    }
    if (shared_slot && f.rope.error != nullptr) *f.rope.error |= detail::kSlotDuplicate;
    if (detail::token_error(f.rope, token) != 0) continue;
    float token_r[2];
    detail::fused_token_norms<T>(f, pairs, shared.data(), token, token_r);
    // A warp per item: the factor first (its first thread), then its 32 lanes, here in reverse.
    for (int64_t item = items - 1; item >= 0; --item) {
      const float r = detail::fused_item_factor<T>(f, pairs, shared.data(), token, item, token_r);
      for (int64_t lane = 31; lane >= 0; --lane) {
        detail::fused_item<T>(f, pairs, shared.data(), token, item, r, lane, 32, shared_slot);
      }
    }
  }
}

void emulate(const detail::FusedKernelArgs& f, int threads) {
  detail::with_storage(f.rope.dtype, [&]<class T>() { emulate_grid<T>(f, threads); });
}

// rerotate_kernel's split: per slot entry (blocks in any order) the range flag, the duplicate check
// (the block's threads each scanning their share), the angle row, then a warp per head, its 32 lanes
// (in reverse).
void emulate_rerotate(const detail::RerotateKernelArgs& r, int threads) {
  const detail::PairArrays pairs = detail::pair_arrays(r.rope);
  std::vector<detail::AngleCell<float>> cells(static_cast<size_t>(r.rope.rotary_dim / 2));
  if (!detail::scales_usable(r.in, r.heads)) {
    if (r.rope.error != nullptr) *r.rope.error |= detail::kScaleInvalid;
    return;
  }
  for (int64_t i = r.count - 1; i >= 0; --i) {
    const int64_t slot = detail::slot_entry(r.slots, r.slots_i64, i);
    if (slot >= r.in.capacity || (r.out.data != nullptr && slot >= r.out.capacity)) {
      if (r.rope.error != nullptr) *r.rope.error |= detail::kSlotOutOfRange;
      continue;
    }
    bool shared = false;
    for (int t = 0; r.check_duplicates && t < threads; ++t) {
      shared = detail::slot_shared(r.slots, r.slots_i64, r.count, i, slot, t, threads) || shared;
    }
    if (shared) {
      if (r.rope.error != nullptr) *r.rope.error |= detail::kSlotDuplicate;
      continue;
    }
    if (const uint32_t bad = r.raw ? detail::token_error(r.rope, i) : 0; bad != 0) {
      if (r.rope.error != nullptr) *r.rope.error |= bad;
      continue;
    }
    if (slot < 0) continue;
    for (int64_t j = 0; j < r.rope.rotary_dim / 2; ++j) cells[static_cast<size_t>(j)] = detail::rerotate_angle(r, pairs, i, j);
    for (int64_t h = r.heads - 1; h >= 0; --h) {
      for (int64_t lane = 31; lane >= 0; --lane) detail::rerotate_item(r, pairs, cells.data(), i, h, lane, 32);
    }
  }
}

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
      emulate(detail::make_rope_store_args(c.schedule, args, nullptr), 32);
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
      emulate(detail::make_qk_norm_rope_args(c.schedule, args, nullptr), 64);
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
      emulate_rerotate(detail::make_rerotate_args(schedule, gpu, nullptr), 64);
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
      emulate_rerotate(detail::make_rerotate_args(c.schedule, b, nullptr), 64);
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
    emulate_rerotate(r, 64);
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
  emulate(f, 32);
  EXPECT_EQ(error, detail::kSlotOutOfRange);
  for (const auto* mem : {&k_mem, &v_mem}) {
    for (size_t i = cache; i < mem->size(); ++i) ASSERT_EQ((*mem)[i], 0.0f) << "written past the cache at " << i;
    for (const int64_t slot : {0, 1, 2}) EXPECT_NE((*mem)[static_cast<size_t>(slot * d)], 0.0f) << "slot " << slot;
  }
}

// ---- The CPU suite's case grids (tests/test_fused.cpp) through the device's split ----

// A device call's form of a case: validated as the CUDA entry points validate (nothing in device
// memory read), a table given as a DeviceTable's range of rows, the block's thread count as a launch
// of its size would have it.
void expect_store_grid_equals_cpu(const test::StoreCase& c, int threads) {
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
  emulate(f, threads);
  EXPECT_EQ(error, 0u);
  EXPECT_TRUE(cpu.q == gpu.q) << "q " << test::first_difference(cpu.q, gpu.q);
  EXPECT_TRUE(cpu.k == gpu.k) << "k";
  EXPECT_TRUE(cpu.k_cache_bytes == gpu.k_cache_bytes) << "k_cache " << test::first_difference(cpu.k_cache_bytes, gpu.k_cache_bytes);
  EXPECT_TRUE(cpu.v_cache_bytes == gpu.v_cache_bytes) << "v_cache " << test::first_difference(cpu.v_cache_bytes, gpu.v_cache_bytes);
}

void expect_norm_grid_equals_cpu(const test::NormCase& c, int threads) {
  SCOPED_TRACE(c.name() + " threads=" + std::to_string(threads));
  test::NormSetup cpu(c), gpu(c);
  qk_norm_rope(c.schedule, cpu.norm_args());
  const QkNormRopeArgs args = gpu.norm_args();
  detail::validate_qk_norm_rope(c.schedule, args, false);
  uint32_t error = 0;
  detail::FusedKernelArgs f = detail::make_qk_norm_rope_args(c.schedule, args, nullptr);
  f.rope.error = &error;
  emulate(f, threads);
  EXPECT_EQ(error, 0u);
  EXPECT_TRUE(cpu.q == gpu.q) << "q " << test::first_difference(cpu.q, gpu.q);
  EXPECT_TRUE(cpu.k == gpu.k) << "k " << test::first_difference(cpu.k, gpu.k);
  EXPECT_TRUE(cpu.v == gpu.v) << "v " << test::first_difference(cpu.v, gpu.v);
  EXPECT_TRUE(cpu.k_cache_bytes == gpu.k_cache_bytes) << "k_cache";
  EXPECT_TRUE(cpu.v_cache_bytes == gpu.v_cache_bytes) << "v_cache";
}

constexpr int kLaunchThreads[] = {32, 64, 256};

TEST(FusedEmulation, RopeStoreOverEveryLayoutBlockSizeHeadDimAndPairing) {
  const std::vector<test::StoreCase> cases = test::layout_grid();
  for (size_t i = 0; i < cases.size(); ++i) expect_store_grid_equals_cpu(cases[i], kLaunchThreads[i % 3]);
}

TEST(FusedEmulation, RopeStoreOverGqaRatiosPartialRotaryOffsetsDtypesAndScales) {
  std::vector<test::StoreCase> cases = test::gqa_grid({DType::f32, DType::f16, DType::bf16, DType::f64});
  for (const std::vector<test::StoreCase>& more : {test::quantised_grid(), test::fp8_extremes_grid()}) {
    cases.insert(cases.end(), more.begin(), more.end());
  }
  for (size_t i = 0; i < cases.size(); ++i) expect_store_grid_equals_cpu(cases[i], kLaunchThreads[i % 3]);
}

TEST(FusedEmulation, RopeStoreWithMropeEveryAngleSourceXposAndMlaRows) {
  int seed = 400;
  test::StoreCase c;
  c.schedule = make_schedule(Spec{.head_dim = 128, .stream_layout = StreamLayout::sections, .sections = {16, 24, 24}});
  c.mrope = true;
  c.seed = ++seed;
  expect_store_grid_equals_cpu(c, 64);
  c.schedule = make_schedule(Spec{.head_dim = 128, .rotary_dim = 64, .pairing = Pairing::interleaved,
                                  .stream_layout = StreamLayout::sections, .sections = {8, 12, 12}});  // GLM-4.1V
  expect_store_grid_equals_cpu(c, 256);
  for (const test::AngleSource source :
       {test::AngleSource::table, test::AngleSource::caller, test::AngleSource::hf_float32, test::AngleSource::exact}) {
    test::StoreCase s;
    s.schedule = make_schedule(Spec{.head_dim = 64, .schedule = ScheduleType::yarn, .factor = 4.0,
                                    .original_max_position = 4096});
    s.source = source;
    s.seed = ++seed;
    expect_store_grid_equals_cpu(s, 64);
  }
  test::StoreCase x;
  x.schedule = with_xpos(make_schedule(Spec{.head_dim = 64, .pairing = Pairing::interleaved}), 512.0);
  x.seed = ++seed;
  expect_store_grid_equals_cpu(x, 32);
  test::StoreCase mla;  // DeepSeek-V3's latent rows [kv_c 512 | k_pe 64]
  mla.schedule = make_schedule(Spec{.head_dim = 64, .pairing = Pairing::interleaved});
  mla.layout = test::Layout::mla;
  mla.heads_q = 16;
  mla.heads_k = 1;
  mla.pass_dim = 512;
  mla.block_size = 64;
  mla.seed = ++seed;
  expect_store_grid_equals_cpu(mla, 256);
}

TEST(FusedEmulation, QkNormRopeOverEveryModelsNormDtypeAndHeadDim) {
  int seed = 900;
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (const int64_t d : {64, 128, 256, 512}) {
      test::NormCase qwen3{.schedule = make_schedule(Spec{.head_dim = d}), .dtype = dtype, .seed = ++seed};
      expect_norm_grid_equals_cpu(qwen3, kLaunchThreads[seed % 3]);
      test::NormCase gemma3 = qwen3;  // 1 + w, all float32
      gemma3.rounding = NormRounding::gemma;
      gemma3.weight_offset = 1.0f;
      expect_norm_grid_equals_cpu(gemma3, 256);
      test::NormCase gemma4 = gemma3;  // + weightless v norm, cache write
      gemma4.v_norm = true;
      gemma4.store = true;
      expect_norm_grid_equals_cpu(gemma4, 32);
    }
    test::NormCase olmo2{.schedule = make_schedule(Spec{.head_dim = 128}), .dtype = dtype, .seed = ++seed};
    olmo2.scope = NormScope::all_heads;
    olmo2.rounding = NormRounding::gemma;
    expect_norm_grid_equals_cpu(olmo2, 64);
    test::NormCase llama4{.schedule = make_schedule(Spec{.head_dim = 128, .pairing = Pairing::interleaved}),
                          .dtype = dtype, .seed = ++seed};
    llama4.order = NormOrder::rope_then_norm;
    llama4.weights = false;
    llama4.rounding = NormRounding::gemma;
    expect_norm_grid_equals_cpu(llama4, 64);
    test::NormCase partial{.schedule = make_schedule(Spec{.head_dim = 128, .rotary_dim = 64}), .dtype = dtype,
                           .seed = ++seed};
    partial.store = true;
    expect_norm_grid_equals_cpu(partial, 32);
    test::NormCase mrope{.schedule = make_schedule(Spec{.head_dim = 128, .stream_layout = StreamLayout::sections,
                                                        .sections = {16, 24, 24}}),
                         .dtype = dtype, .seed = ++seed};
    mrope.mrope = true;
    expect_norm_grid_equals_cpu(mrope, 256);
    test::NormCase rope_all = olmo2;
    rope_all.order = NormOrder::rope_then_norm;
    rope_all.store = true;
    expect_norm_grid_equals_cpu(rope_all, 32);
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
      emulate(f, threads);
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
  emulate(f, 64);
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
  emulate_rerotate(r, 32);
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
      emulate(f, 64);
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
  emulate_rerotate(r, 32);
  EXPECT_EQ(error, detail::kScaleInvalid);
  EXPECT_TRUE(cache == before);
}

}  // namespace
}  // namespace rotary

