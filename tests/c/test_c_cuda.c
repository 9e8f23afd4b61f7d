/* The CUDA backend's C ABI (rotary/rotary_cuda.h) from C, without a GPU: every argument error is
 * raised on the host before any CUDA call, so the pointers below are never dereferenced; each
 * returns ROTARY_ERROR_INVALID_ARGUMENT with a message naming the value and sets *out to NULL.
 * Where a call does reach the CUDA runtime (a table's upload), it succeeds on a GPU and fails with
 * ROTARY_ERROR_CUDA, naming the CUDA call, without one. Built as C11 with -pedantic -Wall -Wextra
 * -Werror. Prints each failure; exit status 1 if any. */
#include "rotary/rotary_cuda.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(condition) check((condition), #condition, __LINE__)
static void check(int ok, const char* what, int line) {
  if (!ok) {
    fprintf(stderr, "test_c_cuda.c:%d: CHECK failed: %s\n", line, what);
    ++failures;
  }
}

/* `status` is `expected` and rotary_last_error() contains `needle` (the value the message names). */
#define EXPECT_STATUS(call, expected, needle) expect_status((call), (expected), (needle), #call, __LINE__)
#define EXPECT_ERROR(call, needle) EXPECT_STATUS(call, ROTARY_ERROR_INVALID_ARGUMENT, needle)
static void expect_status(int status, int expected, const char* needle, const char* what, int line) {
  const char* message = rotary_last_error();
  if (status != expected) {
    fprintf(stderr, "test_c_cuda.c:%d: %s returned %d (message '%s'); expected %d naming '%s'\n", line,
            what, status, message, expected, needle);
    ++failures;
  } else if (strstr(message, needle) == NULL) {
    fprintf(stderr, "test_c_cuda.c:%d: %s: message '%s' lacks '%s'\n", line, what, message, needle);
    ++failures;
  }
}

/* An address in device memory as far as the host knows: never dereferenced here. */
static void* device_pointer(uintptr_t offset) { return (void*)((uintptr_t)0x7f0000000000u + offset); }

static void apply_errors(const rotary_schedule* schedule, const rotary_table* host_table) {
  rotary_apply_args args;
  rotary_positions positions;
  rotary_cuda_options options;
  memset(&args, 0, sizeof args);
  memset(&positions, 0, sizeof positions);
  memset(&options, 0, sizeof options);
  CHECK(rotary_tensor_bshd(device_pointer(0), ROTARY_BF16, 2, 3, 4, 128, &args.q) == ROTARY_OK);

  EXPECT_ERROR(rotary_cuda_apply(NULL, &args, NULL, NULL, NULL), "schedule is NULL");
  EXPECT_ERROR(rotary_cuda_apply(schedule, NULL, NULL, NULL, NULL), "args is NULL");
  args.table = host_table;
  EXPECT_ERROR(rotary_cuda_apply(schedule, &args, NULL, NULL, &options),
               "args.table is a host table: give its rotary_cuda_table_create copy in options.table");
  args.table = NULL;

  /* rotary_apply's rules, named as rotary_apply names them. */
  args.q.shape[3] = 64;
  EXPECT_ERROR(rotary_cuda_apply(schedule, &args, NULL, NULL, NULL),
               "q.head_dim=64 differs from the schedule's head_dim=128");
  args.q.shape[3] = 128;
  args.q.dtype = (rotary_dtype)9;
  EXPECT_ERROR(rotary_cuda_apply(schedule, &args, NULL, NULL, NULL), "q.dtype=9 is not ROTARY_F32");
  args.q.dtype = ROTARY_BF16;
  args.offset = 2147483646;
  EXPECT_ERROR(rotary_cuda_apply(schedule, &args, NULL, NULL, NULL),
               "offset=2147483646 with seq=3 must keep positions in [0, 2^31)");
  args.offset = 0;
  CHECK(rotary_tensor_bshd(device_pointer(2), ROTARY_BF16, 2, 3, 4, 128, &args.q_out) == ROTARY_OK);
  EXPECT_ERROR(rotary_cuda_apply(schedule, &args, NULL, NULL, NULL), "q_out overlaps input q");
  memset(&args.q_out, 0, sizeof args.q_out);

  /* Per-token positions in device memory: their count and streams are checked, not their values. */
  positions.kind = ROTARY_POSITIONS_I32;
  positions.data = device_pointer(1u << 20);
  positions.count = 5;
  EXPECT_ERROR(rotary_cuda_apply(schedule, &args, &positions, NULL, NULL), "positions has 5 entries but batch*seq=6");
  positions.count = 6;
  positions.streams = 2;
  EXPECT_ERROR(rotary_cuda_apply(schedule, &args, &positions, NULL, NULL),
               "positions has 2 streams but the schedule reads 1");
  positions.streams = 1;
  positions.kind = (rotary_position_kind)7;
  EXPECT_ERROR(rotary_cuda_apply(schedule, &args, &positions, NULL, NULL), "positions.kind=7 is not a rotary_position_kind");
  positions.kind = ROTARY_POSITIONS_I64;
  args.offset = 5;
  EXPECT_ERROR(rotary_cuda_apply(schedule, &args, &positions, NULL, NULL),
               "args.positions, positions_i32, positions_count and offset must be 0 when positions are given");
  args.offset = 0;
  args.inverse = 4; /* 2 and 3 are ROTARY_UNDO and ROTARY_UNDO_INVERSE */
  EXPECT_ERROR(rotary_cuda_apply(schedule, &args, &positions, NULL, &options), "inverse=4 is not a rotary_direction");
}

static void table_errors(const rotary_schedule* schedule) {
  const int64_t gap[] = {0, 2};
  rotary_table* gapped = NULL;
  rotary_table* contiguous = NULL;
  rotary_cuda_table* device = (rotary_cuda_table*)device_pointer(0);
  int status;

  EXPECT_ERROR(rotary_cuda_table_create(NULL, &device), "table is NULL");
  CHECK(device == NULL);
  CHECK(rotary_table_at(schedule, gap, 2, ROTARY_ANGLES_EXACT, &gapped) == ROTARY_OK);
  EXPECT_ERROR(rotary_cuda_table_create(gapped, NULL), "out is NULL");
  device = (rotary_cuda_table*)device_pointer(0);
  EXPECT_ERROR(rotary_cuda_table_create(gapped, &device),
               "table positions are not one contiguous range: row 1 holds position 2 after position 0");
  CHECK(device == NULL);
  rotary_table_free(gapped);

  /* The upload is the first CUDA call: it works on a GPU, and without one names the CUDA error. */
  CHECK(rotary_table_range(schedule, 0, 8, ROTARY_ANGLES_EXACT, &contiguous) == ROTARY_OK);
  status = rotary_cuda_table_create(contiguous, &device);
  if (status == ROTARY_OK) {
    CHECK(device != NULL);
    rotary_cuda_table_free(device);
  } else {
    EXPECT_STATUS(status, ROTARY_ERROR_CUDA, "CUDA cudaMalloc (table cos) failed: ");
    CHECK(device == NULL);
  }
  rotary_table_free(contiguous);
  rotary_cuda_table_free(NULL);
}

/* The fused calls on a device: their host checks, named as rotary_rope_store and the others name
 * them, and the C encoding's own (a host table, the host copy of the slots). */
static void fused_errors(const rotary_schedule* schedule, const rotary_table* host_table) {
  rotary_rope_store_args store;
  rotary_qk_norm_rope_args norm;
  rotary_rerotate_cache_args re;
  rotary_cuda_fused_options options;
  rotary_slots host;
  const int64_t repeated[6] = {4, 9, 4, -1, 0, 1};
  memset(&store, 0, sizeof store);
  memset(&norm, 0, sizeof norm);
  memset(&re, 0, sizeof re);
  memset(&options, 0, sizeof options);
  CHECK(rotary_tensor_bshd(device_pointer(0), ROTARY_BF16, 2, 3, 4, 128, &store.rope.q) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(device_pointer(1u << 20), ROTARY_BF16, 2, 3, 2, 128, &store.rope.k) == ROTARY_OK);
  CHECK(rotary_cache_view_nhd(device_pointer(1u << 22), ROTARY_FP8_E4M3, 4, 16, 2, 128, 0, 0, &store.cache.k_cache) ==
        ROTARY_OK);
  store.cache.slots.kind = ROTARY_SLOTS_I64;
  store.cache.slots.data = device_pointer(1u << 24);
  store.cache.slots.count = 6;

  EXPECT_ERROR(rotary_cuda_rope_store(NULL, &store, NULL, NULL), "schedule is NULL");
  EXPECT_ERROR(rotary_cuda_rope_store(schedule, NULL, NULL, NULL), "args is NULL");
  store.rope.table = host_table;
  EXPECT_ERROR(rotary_cuda_rope_store(schedule, &store, NULL, &options),
               "args.rope.table is a host table: give its rotary_cuda_table_create copy in options.table");
  store.rope.table = NULL;
  /* rotary_rope_store's rules, named as it names them. */
  store.cache.k_cache.heads = 3;
  EXPECT_ERROR(rotary_cuda_rope_store(schedule, &store, NULL, NULL), "k_cache.heads=3");
  store.cache.k_cache.heads = 2;
  store.cache.slots.count = 5;
  EXPECT_ERROR(rotary_cuda_rope_store(schedule, &store, NULL, NULL), "slots has 5 entries");
  store.cache.slots.count = 6;
  /* The host copy of the slots: checked as rotary_rope_store checks them. */
  host.kind = ROTARY_SLOTS_I64;
  host.data = repeated;
  host.count = 6;
  options.host_slots = &host;
  EXPECT_ERROR(rotary_cuda_rope_store(schedule, &store, NULL, &options), "slots[2]=4 repeats slots[0]");
  host.kind = (rotary_slot_kind)5;
  EXPECT_ERROR(rotary_cuda_rope_store(schedule, &store, NULL, &options),
               "options.host_slots.kind=5 is not ROTARY_SLOTS_I64 or ROTARY_SLOTS_I32");
  options.host_slots = NULL;
  /* The device's duplicate check: a flag, and only with an error word to flag into. */
  options.check_duplicate_slots = 2;
  EXPECT_ERROR(rotary_cuda_rope_store(schedule, &store, NULL, &options),
               "options.check_duplicate_slots=2 must be 0 or 1");
  options.check_duplicate_slots = 1;
  EXPECT_ERROR(rotary_cuda_rope_store(schedule, &store, NULL, &options),
               "options.check_duplicate_slots needs options.error");
  EXPECT_ERROR(rotary_cuda_rerotate_cache(schedule, &re, NULL, &options),
               "options.check_duplicate_slots needs options.error");
  options.check_duplicate_slots = 0;
  CHECK(ROTARY_CUDA_SLOT_DUPLICATE == 32u && ROTARY_CUDA_SCALE_INVALID == 64u);

  norm.rope = store.rope;
  norm.q_weight.data = device_pointer(1u << 26);
  norm.q_weight.dtype = ROTARY_BF16;
  norm.q_weight.count = 64;
  EXPECT_ERROR(rotary_cuda_qk_norm_rope(NULL, &norm, NULL, NULL), "schedule is NULL");
  EXPECT_ERROR(rotary_cuda_qk_norm_rope(schedule, &norm, NULL, NULL), "q_weight");
  norm.q_weight.count = 128;
  norm.order = (rotary_norm_order)3;
  EXPECT_ERROR(rotary_cuda_qk_norm_rope(schedule, &norm, NULL, NULL), "order=3");

  re.cache = store.cache.k_cache;
  re.slots = store.cache.slots;
  re.delta = (const int64_t*)device_pointer(1u << 27);
  EXPECT_ERROR(rotary_cuda_rerotate_cache(schedule, NULL, NULL, NULL), "args is NULL");
  re.table = host_table;
  EXPECT_ERROR(rotary_cuda_rerotate_cache(schedule, &re, NULL, NULL),
               "args.table is a host table: give its rotary_cuda_table_create copy in options.table (raw mode)");
  re.table = NULL;
  re.mode = (rotary_rerotate_mode)4;
  EXPECT_ERROR(rotary_cuda_rerotate_cache(schedule, &re, NULL, NULL), "mode=4");
  CHECK(ROTARY_CUDA_SLOT_OUT_OF_RANGE == 16u);
}

int main(void) {
  rotary_spec spec;
  rotary_schedule* schedule = NULL;
  rotary_table* host_table = NULL;
  memset(&spec, 0, sizeof spec);
  spec.head_dim = 128;
  CHECK(ROTARY_ERROR_CUDA == 4);
  if (rotary_schedule_from_spec(&spec, -1, &schedule) != ROTARY_OK ||
      rotary_table_range(schedule, 0, 4, ROTARY_ANGLES_EXACT, &host_table) != ROTARY_OK) {
    fprintf(stderr, "test_c_cuda.c: setup failed: %s\n", rotary_last_error());
    return 1;
  }
  apply_errors(schedule, host_table);
  table_errors(schedule);
  fused_errors(schedule, host_table);
  EXPECT_ERROR(rotary_cuda_check_positions(NULL, NULL),
               "error is NULL (give the rotary_cuda_options.error of the calls to check)");
  rotary_table_free(host_table);
  rotary_schedule_free(schedule);
  if (failures > 0) {
    fprintf(stderr, "test_c_cuda.c: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_c_cuda.c: all checks passed\n");
  return 0;
}
