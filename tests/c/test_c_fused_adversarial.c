/* Adversarial tests of the C ABI of the fused operations (rotary/rotary.h: rotary_cache_view_*,
 * rotary_rope_store, rotary_qk_norm_rope, rotary_rerotate_cache, rotary_slots_from_page_table).
 *
 * What the C layer adds over the C++ API: struct-to-C++ translation, NULL pointers, enum values out
 * of range, 0-means-default fields, dtype codes of caches vs model tensors, counts and offsets that
 * overflow, messages naming the C argument, the per-thread last error, and "a refused call leaves
 * every caller buffer byte-for-byte untouched".
 *
 * Calls that may crash (UBSan/ASan abort, SIGSEGV) run in a forked child, before the parent has used
 * OpenMP (libgomp is not fork-safe), so that one failure does not hide the others; the binary exits
 * 1 when any check fails.
 *
 * Built as C11 with -pedantic -Wall -Wextra (as test_c_api.c). */
#define _POSIX_C_SOURCE 200809L

#include "rotary/rotary.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;

#define CHECK(condition) check((condition), #condition, __LINE__)
static void check(int ok, const char* what, int line) {
  if (!ok) {
    fprintf(stderr, "test_c_fused_adversarial.c:%d: CHECK failed: %s\n", line, what);
    ++failures;
  }
}

/* `status` is ROTARY_ERROR_INVALID_ARGUMENT and the message contains `needle`. */
#define EXPECT_ERROR(call, needle) expect_error((call), (needle), #call, __LINE__)
static void expect_error(int status, const char* needle, const char* what, int line) {
  const char* message = rotary_last_error();
  if (status != ROTARY_ERROR_INVALID_ARGUMENT) {
    fprintf(stderr, "test_c_fused_adversarial.c:%d: %s returned %d (message '%s'); expected "
            "ROTARY_ERROR_INVALID_ARGUMENT naming '%s'\n", line, what, status, message ? message : "(null)", needle);
    ++failures;
  } else if (message == NULL || strstr(message, needle) == NULL) {
    fprintf(stderr, "test_c_fused_adversarial.c:%d: %s: message '%s' lacks '%s'\n", line, what,
            message ? message : "(null)", needle);
    ++failures;
  }
}

/* ---- data ---- */

static uint32_t lcg_state = 4242u;
static float next_value(void) { /* in [-2, 2) */
  lcg_state = lcg_state * 1664525u + 1013904223u;
  return (float)((double)(lcg_state >> 8) / 16777216.0 * 4.0 - 2.0);
}
static void fill_random(float* values, int64_t count) {
  int64_t i;
  for (i = 0; i < count; ++i) values[i] = next_value();
}

static rotary_schedule* default_schedule(int64_t head_dim) {
  rotary_spec spec;
  rotary_schedule* schedule = NULL;
  memset(&spec, 0, sizeof spec);
  spec.head_dim = head_dim;
  if (rotary_schedule_from_spec(&spec, -1, &schedule) != ROTARY_OK) {
    fprintf(stderr, "default_schedule: %s\n", rotary_last_error());
    abort();
  }
  return schedule;
}

/* ---- running a call that may crash in a child process ---- */

enum { CHILD_PASS = 0, CHILD_FAIL = 3 };

/* Runs body() in a child; returns 1 when it passed, 0 otherwise (printing how it ended). */
static int in_child(int (*body)(void), const char* name) {
  pid_t pid;
  int status = 0;
  fflush(stdout);
  fflush(stderr);
  pid = fork();
  if (pid < 0) {
    perror("fork");
    abort();
  }
  if (pid == 0) {
    alarm(60);
    _exit(body() ? CHILD_PASS : CHILD_FAIL);
  }
  if (waitpid(pid, &status, 0) != pid) abort();
  if (WIFEXITED(status) && WEXITSTATUS(status) == CHILD_PASS) return 1;
  if (WIFEXITED(status) && WEXITSTATUS(status) == CHILD_FAIL) {
    fprintf(stderr, "%s: the call returned, but not as the rules say (see above)\n", name);
  } else if (WIFSIGNALED(status)) {
    fprintf(stderr, "%s: CRASHED with signal %d\n", name, WTERMSIG(status));
  } else {
    fprintf(stderr, "%s: CRASHED (sanitizer report above, exit status %d)\n", name, WEXITSTATUS(status));
  }
  return 0;
}

/* ---- a rope_store fixture: q [1, 4, 2, 16] f32, k and v [1, 4, 1, 16], k and v NHD caches of
 * 2 blocks of 4 slots, every buffer poisoned and snapshotted ---- */

enum { T = 4, QH = 2, KH = 1, D = 16, BLOCKS = 2, BS = 4, CAP = BLOCKS * BS };

typedef struct {
  rotary_schedule* schedule;
  float q[T * QH * D], k[T * KH * D], v[T * KH * D], q_out[T * QH * D], k_out[T * KH * D], v_out[T * KH * D];
  float k_pass[T * KH * D];
  float k_cache[CAP * KH * D], v_cache[CAP * KH * D], k_pass_cache[CAP * KH * D];
  int8_t q_quantized[T * QH * D];
  float weight[QH * D];
  int64_t slots[T];
} buffers;

static buffers* snapshot_of = NULL;

static void buffers_init(buffers* b) {
  memset(b, 0, sizeof *b);
  b->schedule = default_schedule(D);
  fill_random(b->q, T * QH * D);
  fill_random(b->k, T * KH * D);
  fill_random(b->v, T * KH * D);
  fill_random(b->k_pass, T * KH * D);
  fill_random(b->weight, QH * D);
  memset(b->q_out, 0x5a, sizeof b->q_out);
  memset(b->k_out, 0x5a, sizeof b->k_out);
  memset(b->v_out, 0x5a, sizeof b->v_out);
  memset(b->k_cache, 0x5a, sizeof b->k_cache);
  memset(b->v_cache, 0x5a, sizeof b->v_cache);
  memset(b->k_pass_cache, 0x5a, sizeof b->k_pass_cache);
  memset(b->q_quantized, 0x5a, sizeof b->q_quantized);
  b->slots[0] = 5;
  b->slots[1] = -1;
  b->slots[2] = 0;
  b->slots[3] = 7;
}

/* Every caller buffer of `b` equals the snapshot taken by take_snapshot. */
static void take_snapshot(const buffers* b) {
  if (snapshot_of == NULL) snapshot_of = malloc(sizeof *snapshot_of);
  if (snapshot_of == NULL) abort();
  memcpy(snapshot_of, b, sizeof *b);
}
static int untouched(const buffers* b) { return memcmp(snapshot_of, b, sizeof *b) == 0; }

/* Valid rope_store args on `b`: q in place, k read only, k and v into their caches. */
static void store_args(buffers* b, rotary_rope_store_args* a) {
  memset(a, 0, sizeof *a);
  CHECK(rotary_tensor_bshd(b->q, ROTARY_F32, 1, T, QH, D, &a->rope.q) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(b->k, ROTARY_F32, 1, T, KH, D, &a->rope.k) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(b->v, ROTARY_F32, 1, T, KH, D, &a->cache.v) == ROTARY_OK);
  a->rope.offset = 3;
  a->cache.slots.kind = ROTARY_SLOTS_I64;
  a->cache.slots.data = b->slots;
  a->cache.slots.count = T;
  CHECK(rotary_cache_view_nhd(b->k_cache, ROTARY_F32, BLOCKS, BS, KH, D, 0, 0, &a->cache.k_cache) == ROTARY_OK);
  CHECK(rotary_cache_view_nhd(b->v_cache, ROTARY_F32, BLOCKS, BS, KH, D, 0, 0, &a->cache.v_cache) == ROTARY_OK);
}

/* A refused call: INVALID_ARGUMENT, the message names `needle`, and no byte of b changed. */
#define EXPECT_REFUSED(b, call, needle)                                                          \
  do {                                                                                           \
    take_snapshot(b);                                                                            \
    EXPECT_ERROR(call, needle);                                                                  \
    if (!untouched(b)) {                                                                         \
      fprintf(stderr, "test_c_fused_adversarial.c:%d: %s wrote to a caller buffer on refusal\n", \
              __LINE__, #call);                                                                  \
      ++failures;                                                                                \
    }                                                                                            \
  } while (0)

static void set_raw_enum(void* field, int value) { memcpy(field, &value, sizeof value); }

/* ================================================================================================
 * Crash-prone cases (each in a child). Each returns 1 when the library behaved as its rules say.
 * ================================================================================================ */

/* Cache offset overflow: a cache view whose `offset` is near INT64_MAX (or whose channel stride is
 * huge) is refused naming the offset, before offset * strides[3] * size_of(dtype) or offset +
 * head_dim is formed (once undefined behaviour: UBSan aborted the process). */
static int child_cache_offset_overflow(void) {
  static buffers b;
  rotary_rope_store_args a;
  int status;
  buffers_init(&b);
  store_args(&b, &a);
  a.cache.k_cache.offset = INT64_MAX - 4;
  take_snapshot(&b);
  status = rotary_rope_store(b.schedule, &a);
  if (status != ROTARY_ERROR_INVALID_ARGUMENT || !untouched(&b)) return 0;
  return strstr(rotary_last_error(), "k_cache.offset=") != NULL;
}

static int child_cache_stride_overflow(void) {
  static buffers b;
  rotary_rope_store_args a;
  int status;
  buffers_init(&b);
  store_args(&b, &a);
  a.cache.v_cache.offset = 3;
  a.cache.v_cache.strides[3] = INT64_MIN / 2;
  take_snapshot(&b);
  status = rotary_rope_store(b.schedule, &a);
  if (status != ROTARY_ERROR_INVALID_ARGUMENT || !untouched(&b)) return 0;
  return strstr(rotary_last_error(), "v_cache.offset=3") != NULL;
}

/* Cache view constructors: rotary_cache_view_nhd / _hnd whose block_size * heads * row_width (or
 * offset + head_dim) leaves int64 fail with a zeroed *out, as rotary_tensor_bshd does (they once
 * returned wrapped strides with ROTARY_OK). */
static int child_nhd_stride_overflow(void) {
  static float data[16];
  rotary_cache_view view;
  int status;
  memset(&view, 0x5a, sizeof view);
  status = rotary_cache_view_nhd(data, ROTARY_F32, 1, (int64_t)1 << 40, (int64_t)1 << 20, 16, 0, 0, &view);
  if (status == ROTARY_OK) {
    fprintf(stderr, "rotary_cache_view_nhd(block_size=2^40, heads=2^20, head_dim=16) returned OK, strides "
            "[%lld, %lld, %lld, %lld]\n", (long long)view.strides[0], (long long)view.strides[1],
            (long long)view.strides[2], (long long)view.strides[3]);
    return 0;
  }
  {
    rotary_cache_view zero;
    memset(&zero, 0, sizeof zero);
    return memcmp(&view, &zero, sizeof view) == 0;
  }
}

static int child_hnd_offset_overflow(void) {
  static float data[16];
  rotary_cache_view view;
  int status;
  status = rotary_cache_view_hnd(data, ROTARY_F32, 1, 1, 1, 16, INT64_MAX - 4, 0, &view);
  if (status == ROTARY_OK) return 0;
  return strstr(rotary_last_error(), "offset") != NULL;
}

/* Page table: kv_indices[page] * block_size leaving int64 is an error naming block_size, slots_out
 * untouched (it once wrapped to a negative slot, "skip this token", with ROTARY_OK). */
static int child_page_table_overflow(void) {
  const int32_t kv_indices[1] = {3}, kv_indptr[2] = {0, 1}, batch[1] = {0}, pos[1] = {1};
  int64_t out[1] = {-77};
  const int status = rotary_slots_from_page_table(kv_indices, 1, kv_indptr, 2, batch, pos, 1, (int64_t)1 << 62, out);
  if (status == ROTARY_OK) {
    fprintf(stderr, "rotary_slots_from_page_table(block_size=2^62) returned OK with slot %lld\n", (long long)out[0]);
    return 0;
  }
  return out[0] == -77 && strstr(rotary_last_error(), "block_size") != NULL;
}

/* Empty q, batch * seq beyond int64: a rope_store whose q and k are empty (0 heads) but whose
 * batch * seq leaves int64 cannot have one slot per token: refused naming batch * seq (the product
 * was once formed unchecked). */
static int child_empty_token_overflow(void) {
  static float cache[16];
  static int64_t slots[1] = {0};
  rotary_rope_store_args a;
  rotary_schedule* schedule = default_schedule(D);
  int status;
  memset(&a, 0, sizeof a);
  a.rope.q.dtype = ROTARY_F32;
  a.rope.q.shape[0] = (int64_t)1 << 40;
  a.rope.q.shape[1] = (int64_t)1 << 30; /* positions stay below 2^31; batch * seq = 2^70 */
  a.rope.q.shape[2] = 0;
  a.rope.q.shape[3] = D;
  a.rope.k = a.rope.q;
  a.cache.slots.kind = ROTARY_SLOTS_I64;
  a.cache.slots.data = slots;
  a.cache.slots.count = 0;
  CHECK(rotary_cache_view_nhd(cache, ROTARY_F32, 1, 1, 0, D, 0, 0, &a.cache.k_cache) == ROTARY_OK);
  status = rotary_rope_store(schedule, &a);
  rotary_schedule_free(schedule);
  return status == ROTARY_ERROR_INVALID_ARGUMENT && strstr(rotary_last_error(), "batch * seq") != NULL;
}

/* A slots array inside the cache it addresses: rerotate_cache checks the slots on the host, then
 * the rows read slots[i] as they write the cache. When the array lies in a row an earlier slot
 * rewrites, a later slot became whatever the rotated keys' bits were and the write landed out of
 * bounds. The call is refused ("cache (in place) overlaps slots"), the cache and the memory after
 * it untouched. */
static int child_rerotate_slots_alias_cache(void) {
  /* An i8 cache of 4 slots, 1 head x 16 channels (16 bytes a slot), nhd, block 1, then a guard
   * region. The int32 slot array {1, 2} lies in slot 1's row: slots[1] is channels 4..7. */
  static int32_t words[(4 * D + 4096) / 4];
  int8_t* memory = (int8_t*)words;
  int8_t* cache = memory;
  int32_t* slots = words + D / 4; /* row 1 */
  static const int64_t delta[2] = {1000, 1000};
  rotary_schedule* schedule = default_schedule(D);
  rotary_rerotate_cache_args a;
  int status;
  int64_t i;
  slots[0] = 1; /* token 0 turns row 1, which holds the slot array itself */
  slots[1] = 2; /* bytes: channel 4 = 2, channels 5..7 = 0 */
  /* Half pairing: channel 4 pairs with channel 12, turned by 1000 * inv_freq[4] = 10 rad:
   * 2 cos 10 - 21 sin 10 = 9.75, rounded to the i8 code 10; channels 5..7 pair with zeros and stay
   * 0. So after token 0, slots[1] reads 10: beyond the 4-slot cache. */
  cache[1 * D + 12] = 21;
  for (i = 0; i < D; ++i) cache[2 * D + i] = (int8_t)(i + 1); /* slot 2's keys */
  for (i = 4 * D; i < 4 * D + 4096; ++i) memory[i] = 17;   /* the guard region after the cache */
  memset(&a, 0, sizeof a);
  CHECK(rotary_cache_view_nhd(cache, ROTARY_I8, 4, 1, 1, D, 0, 0, &a.cache) == ROTARY_OK);
  a.slots.kind = ROTARY_SLOTS_I32;
  a.slots.data = slots;
  a.slots.count = 2;
  a.delta = delta;
  a.threads = 1;
  status = rotary_rerotate_cache(schedule, &a);
  rotary_schedule_free(schedule);
  for (i = 4 * D; i < 4 * D + 4096; ++i) {
    if (memory[i] != 17) {
      fprintf(stderr, "rerotate_cache returned %d and wrote beyond the cache (byte %lld past its end; "
              "slots[1] now %d)\n", status, (long long)(i - 4 * D), (int)slots[1]);
      return 0;
    }
  }
  if (status != ROTARY_ERROR_INVALID_ARGUMENT || strstr(rotary_last_error(), "overlaps slots") == NULL) {
    fprintf(stderr, "rerotate_cache with slots inside the cache returned %d: '%s'\n", status, rotary_last_error());
    return 0;
  }
  return slots[0] == 1 && slots[1] == 2 && cache[1 * D + 12] == 21 && cache[2 * D] == 1;
}

/* The same aliasing through rope_store: the slot array lies in k_cache row 5, which token 0 writes;
 * token 1's slot then read k's float bits, and the fused body skipped a slot beyond the cache: the
 * call returned ROTARY_OK without storing token 1. It is refused ("k_cache overlaps slots"), every
 * buffer untouched. */
static int child_rope_store_slots_alias_cache(void) {
  static buffers b;
  rotary_rope_store_args a;
  int64_t* slots;
  int status, d, stored;
  buffers_init(&b);
  store_args(&b, &a);
  a.cache.v_cache.data = NULL;
  memset(&a.cache.v_cache, 0, sizeof a.cache.v_cache);
  memset(&a.cache.v, 0, sizeof a.cache.v);
  slots = (int64_t*)(void*)(b.k_cache + 5 * D); /* row of slot 5 */
  slots[0] = 5;
  slots[1] = 6;
  slots[2] = -1;
  slots[3] = -1;
  for (d = 0; d < D; ++d) b.k[0 * KH * D + d] = 3.0e38f; /* token 0's k: bits 0x7f... once stored */
  a.cache.slots.data = slots;
  a.rope.threads = 1;
  take_snapshot(&b);
  status = rotary_rope_store(b.schedule, &a);
  stored = status == ROTARY_ERROR_INVALID_ARGUMENT && strstr(rotary_last_error(), "k_cache overlaps slots") != NULL;
  if (!stored) fprintf(stderr, "rope_store with slots inside k_cache returned %d: '%s'\n", status, rotary_last_error());
  return stored && slots[0] == 5 && slots[1] == 6 && untouched(&b);
}

/* ================================================================================================
 * In-process cases.
 * ================================================================================================ */

/* Valid calls: the C struct translation gives rotary_apply's bits for q, and the scatter of
 * rotary_apply(k) into the cache; int32 vs int64 slots, args.positions vs rotary_positions, and
 * the reference vs cpu backends give the same bits. */
static void test_valid_rope_store_translation(void) {
  static buffers b, r;
  rotary_rope_store_args a;
  rotary_apply_args ref;
  int64_t t, h, d;
  int variant;
  buffers_init(&b);
  memcpy(&r, &b, sizeof r);
  memset(&ref, 0, sizeof ref);
  CHECK(rotary_tensor_bshd(r.q, ROTARY_F32, 1, T, QH, D, &ref.q) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(r.k, ROTARY_F32, 1, T, KH, D, &ref.k) == ROTARY_OK);
  ref.offset = 3;
  CHECK(rotary_apply(b.schedule, &ref) == ROTARY_OK);
  for (t = 0; t < T; ++t) {
    if (b.slots[t] < 0) continue;
    for (h = 0; h < KH; ++h) {
      for (d = 0; d < D; ++d) {
        r.k_cache[(b.slots[t] * KH + h) * D + d] = r.k[(t * KH + h) * D + d];
        r.v_cache[(b.slots[t] * KH + h) * D + d] = b.v[(t * KH + h) * D + d];
      }
    }
  }
  for (variant = 0; variant < 4; ++variant) {
    static buffers c;
    const int64_t positions[T] = {3, 4, 5, 6};
    const int32_t positions32[T] = {3, 4, 5, 6};
    const int32_t slots32[T] = {5, -1, 0, 7};
    rotary_positions p;
    memcpy(&c, &b, sizeof c);
    store_args(&c, &a);
    if (variant == 1) {
      a.cache.slots.kind = ROTARY_SLOTS_I32;
      a.cache.slots.data = slots32;
      a.rope.offset = 0;
      a.rope.positions = positions;
      a.rope.positions_count = T;
    } else if (variant == 2) {
      memset(&p, 0, sizeof p);
      p.kind = ROTARY_POSITIONS_I32;
      p.data = positions32;
      p.count = T;
      a.rope.offset = 0;
      a.positions = &p;
    } else if (variant == 3) {
      a.rope.backend = ROTARY_BACKEND_REFERENCE;
    }
    CHECK(rotary_rope_store(c.schedule, &a) == ROTARY_OK);
    CHECK(memcmp(c.q, r.q, sizeof c.q) == 0);
    CHECK(memcmp(c.k, b.k, sizeof c.k) == 0); /* k read only */
    CHECK(memcmp(c.k_cache, r.k_cache, sizeof c.k_cache) == 0);
    CHECK(memcmp(c.v_cache, r.v_cache, sizeof c.v_cache) == 0);
  }
  rotary_schedule_free(b.schedule);
}

/* Refusals of rope_store: each names the C argument and leaves every buffer untouched. */
static void test_rope_store_refusals(void) {
  static buffers b;
  rotary_rope_store_args a, bad;
  const float scale_zero = 0.0f, scales2[2] = {1.0f, 2.0f};
  rotary_positions p;
  const int64_t pos[T] = {0, 1, 2, 3};
  buffers_init(&b);
  store_args(&b, &a);

  EXPECT_REFUSED(&b, rotary_rope_store(NULL, &a), "schedule is NULL");
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, NULL), "args is NULL");

  /* enum values C can hold but C++ must not load */
  bad = a; set_raw_enum(&bad.cache.k_cache.dtype, 99);
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_cache.dtype=99");
  /* Negative enum values are named as the caller wrote them: a C enum without negative constants
   * has an unsigned underlying type in C++, which once showed -1 as 4294967295 (every enum: quant
   * mode, order, backend, ...). */
  bad = a; set_raw_enum(&bad.cache.v_cache.dtype, -1);
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "v_cache.dtype=-1");
  bad = a; set_raw_enum(&bad.cache.slots.kind, 2);
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "slots.kind=2");
  bad = a; set_raw_enum(&bad.cache.k_quant.mode, 2);
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_quant.mode=2");
  bad = a; set_raw_enum(&bad.cache.v_quant.mode, -5);
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "v_quant.mode=-5");
  bad = a; set_raw_enum(&bad.cache.k_pass_quant.mode, 7);
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_pass_quant.mode=7");
  bad = a; set_raw_enum(&bad.q_quant.mode, 3);
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "q_quant.mode=3");
  bad = a; set_raw_enum(&bad.q_quantized.dtype, 42);
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "q_quantized.dtype=42");
  bad = a; set_raw_enum(&bad.cache.v.dtype, 17);
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "v.dtype=17");
  bad = a; set_raw_enum(&bad.rope.backend, 9);
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "backend=9");
  bad = a; bad.rope.inverse = 4;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "inverse=4");

  /* NULL pointers and counts */
  bad = a; bad.cache.slots.data = NULL;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "slots.data is NULL");
  bad = a; bad.cache.slots.count = -1;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "slots.count=-1");
  bad = a; bad.cache.slots.count = INT64_MAX;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "slots has 9223372036854775807 entries");
  bad = a; bad.cache.k_cache.data = NULL;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_cache.data is null");
  bad = a; bad.cache.v.data = NULL;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "v.data is null");
  memset(&p, 0, sizeof p);
  p.kind = ROTARY_POSITIONS_I64;
  p.count = T; /* data NULL */
  bad = a; bad.rope.offset = 0; bad.positions = &p;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "positions.data is NULL");
  p.data = pos;
  bad = a; bad.positions = &p; /* offset 3 still set */
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "offset");
  bad = a; bad.rope.offset = 0; bad.positions = &p; p.streams = -2;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "streams=-2");
  p.streams = 0; set_raw_enum(&p.kind, 11);
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "positions.kind=11");
  p.kind = ROTARY_POSITIONS_I64; p.count = -4;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "positions.count=-4");

  /* cache geometry */
  bad = a; bad.cache.k_cache.offset = -1;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_cache.offset=-1");
  bad = a; bad.cache.k_cache.block_size = -4;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_cache.block_size=-4");
  bad = a; bad.cache.k_cache.num_blocks = -1;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_cache.num_blocks=-1");
  bad = a; bad.cache.v_cache.num_blocks = INT64_MAX; bad.cache.v_cache.block_size = 4;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "v_cache: num_blocks=9223372036854775807 * block_size=4");
  bad = a; bad.cache.k_cache.heads = 3;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_cache.heads=3");
  bad = a; bad.cache.k_cache.strides[0] = 0;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_cache strides [0,");
  bad = a; bad.cache.v_cache.num_blocks = (int64_t)1 << 56;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "v_cache spans");
  bad = a; memset(&bad.cache.k_cache, 0, sizeof bad.cache.k_cache); /* absent k cache */
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_cache");
  bad = a; bad.cache.v_cache.data = b.k_cache; /* v cache on k cache */
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "overlaps");
  bad = a; bad.cache.k_cache.data = b.q; /* cache on q (q's 128 floats = the cache's 128) */
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "overlaps");

  /* dtype codes: model tensors vs caches */
  bad = a; bad.rope.q.dtype = ROTARY_FP8_E4M3; bad.rope.k.dtype = ROTARY_FP8_E4M3;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "q.dtype=fp8_e4m3");
  bad = a; bad.cache.v.dtype = ROTARY_I8;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "v.dtype");
  bad = a; bad.cache.k_cache.dtype = ROTARY_F64;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_cache.dtype=f64");
  bad = a; bad.q_quantized = a.rope.q; bad.q_quantized.data = b.q_quantized; /* f32: not a code */
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "q_quantized.dtype=f32");
  bad = a; bad.q_quantized = a.rope.q; bad.q_quantized.data = b.q_quantized; bad.q_quantized.dtype = ROTARY_I8;
  bad.q_quantized.shape[2] = 1;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "q_quantized shape");

  /* scales */
  bad = a; bad.cache.k_quant.scale = &scale_zero; /* f32 cache takes no scale */
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_quant.scale is set");
  bad = a; bad.cache.k_cache.dtype = ROTARY_FP8_E4M3; bad.cache.k_quant.scale = &scale_zero;
  bad.cache.k_cache.data = b.q_quantized; /* 8 slots of 16 bytes fit */
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_quant.scale[0]=0");
  bad.cache.k_quant.scale = scales2; bad.cache.k_quant.count = 2;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_quant.count=2");
  bad.cache.k_quant.count = -1;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_quant.count=-1");
  bad = a; bad.q_quant.scale = scales2;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "q_quant.scale is set but q_quantized is not");

  /* k_pass without its cache and the reverse */
  bad = a; CHECK(rotary_tensor_bshd(b.k_pass, ROTARY_F32, 1, T, KH, D, &bad.cache.k_pass) == ROTARY_OK);
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "k_pass is set but k_pass_cache is not");

  /* slots */
  {
    int64_t dup[T] = {5, -1, 5, 7}, beyond[T] = {5, -1, 0, 8};
    bad = a; bad.cache.slots.data = dup;
    EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "slots[2]=5 repeats slots[0]");
    bad.cache.slots.data = beyond;
    EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "slots[3]=8 is beyond k_cache's capacity 8");
  }

  /* The refusal names the C field skip_tail_copy (C++'s copy_tail is a name the C caller never
   * wrote). */
  bad = a; bad.rope.skip_tail_copy = 1;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "skip_tail_copy");
  bad.rope.skip_tail_copy = 2;
  EXPECT_REFUSED(&b, rotary_rope_store(b.schedule, &bad), "skip_tail_copy=2");

  rotary_schedule_free(b.schedule);
}

/* qk_norm_rope refusals, the C-only fields (eps 0 default, enums, weights, store pointer). */
static void test_qk_norm_rope_refusals(void) {
  static buffers b;
  rotary_qk_norm_rope_args a, bad;
  rotary_rope_store_args s;
  rotary_cache_write store;
  buffers_init(&b);
  memset(&a, 0, sizeof a);
  CHECK(rotary_tensor_bshd(b.q, ROTARY_F32, 1, T, QH, D, &a.rope.q) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(b.k, ROTARY_F32, 1, T, KH, D, &a.rope.k) == ROTARY_OK);
  a.q_weight.data = b.weight;
  a.q_weight.dtype = ROTARY_F32;
  a.q_weight.count = D;
  store_args(&b, &s);
  store = s.cache;

  EXPECT_REFUSED(&b, rotary_qk_norm_rope(NULL, &a), "schedule is NULL");
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, NULL), "args is NULL");
  bad = a; set_raw_enum(&bad.order, -1);
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "order=-1");
  bad = a; set_raw_enum(&bad.rounding, 2);
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "rounding=2");
  bad = a; set_raw_enum(&bad.scope, 1000);
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "scope=1000");
  bad = a; bad.v_norm = 2;
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "v_norm=2");
  bad = a; set_raw_enum(&bad.q_weight.dtype, 77);
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "q_weight.dtype=77");
  bad = a; set_raw_enum(&bad.k_weight.dtype, 8);
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "k_weight.dtype=8");
  bad = a; bad.q_weight.dtype = ROTARY_FP8_E4M3;
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "q_weight.dtype=fp8_e4m3");
  bad = a; bad.q_weight.count = -16;
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "q_weight.count=-16");
  bad = a; bad.q_weight.count = INT64_MAX;
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "q_weight.count=9223372036854775807");
  bad = a; bad.eps = -1.0f;
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "eps=-1");
  bad = a; bad.eps = (float)NAN;
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "eps=");
  bad = a; bad.weight_offset = (float)INFINITY;
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "weight_offset=inf");
  bad = a; bad.k_weight = a.q_weight; memset(&bad.rope.k, 0, sizeof bad.rope.k);
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "k_weight is set but k is not");
  bad = a; bad.v_norm = 1;
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "v_norm is set but v is not");
  bad = a; CHECK(rotary_tensor_bshd(b.v, ROTARY_F32, 1, T, KH, D, &bad.v) == ROTARY_OK);
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "v is set but neither");
  bad = a; bad.v_norm = 1; CHECK(rotary_tensor_bshd(b.v, ROTARY_F32, 1, T, KH, D, &bad.v) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(b.q, ROTARY_F32, 1, T, KH, D, &bad.v_out) == ROTARY_OK); /* v_out on q */
  EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "overlaps");
  {
    static double q64[T * QH * D], k64[T * KH * D];
    bad = a;
    CHECK(rotary_tensor_bshd(q64, ROTARY_F64, 1, T, QH, D, &bad.rope.q) == ROTARY_OK);
    CHECK(rotary_tensor_bshd(k64, ROTARY_F64, 1, T, KH, D, &bad.rope.k) == ROTARY_OK);
    bad.q_weight.data = NULL;
    EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "q.dtype=f64");
  }
  /* store: slots refused in the store (named as in rope_store) */
  {
    rotary_cache_write bad_store = store;
    int64_t dup[T] = {5, -1, 5, 7};
    bad = a; bad_store.slots.data = dup; bad.store = &bad_store;
    CHECK(rotary_tensor_bshd(b.v, ROTARY_F32, 1, T, KH, D, &bad.v) == ROTARY_OK);
    EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "slots[2]=5 repeats slots[0]");
    bad_store = store; bad_store.k_cache.data = b.k; /* the cache on k, the input */
    EXPECT_REFUSED(&b, rotary_qk_norm_rope(b.schedule, &bad), "overlaps");
  }
  /* A valid call (store, v stored) succeeds; eps 0 means 1e-6 (checked against eps=1e-6 bits). */
  {
    static buffers c, e;
    rotary_qk_norm_rope_args ok;
    rotary_rope_store_args sc, se;
    rotary_cache_write wc, we;
    memcpy(&c, &b, sizeof c);
    memcpy(&e, &b, sizeof e);
    store_args(&c, &sc);
    store_args(&e, &se);
    wc = sc.cache;
    we = se.cache;
    memset(&ok, 0, sizeof ok);
    CHECK(rotary_tensor_bshd(c.q, ROTARY_F32, 1, T, QH, D, &ok.rope.q) == ROTARY_OK);
    CHECK(rotary_tensor_bshd(c.k, ROTARY_F32, 1, T, KH, D, &ok.rope.k) == ROTARY_OK);
    CHECK(rotary_tensor_bshd(c.v, ROTARY_F32, 1, T, KH, D, &ok.v) == ROTARY_OK);
    ok.q_weight.data = c.weight; ok.q_weight.dtype = ROTARY_F32; ok.q_weight.count = D;
    ok.store = &wc;
    CHECK(rotary_qk_norm_rope(c.schedule, &ok) == ROTARY_OK);
    CHECK(rotary_tensor_bshd(e.q, ROTARY_F32, 1, T, QH, D, &ok.rope.q) == ROTARY_OK);
    CHECK(rotary_tensor_bshd(e.k, ROTARY_F32, 1, T, KH, D, &ok.rope.k) == ROTARY_OK);
    CHECK(rotary_tensor_bshd(e.v, ROTARY_F32, 1, T, KH, D, &ok.v) == ROTARY_OK);
    ok.q_weight.data = e.weight;
    ok.store = &we;
    ok.eps = 1e-6f;
    CHECK(rotary_qk_norm_rope(e.schedule, &ok) == ROTARY_OK);
    CHECK(memcmp(c.q, e.q, sizeof c.q) == 0);
    CHECK(memcmp(c.k_cache, e.k_cache, sizeof c.k_cache) == 0);
    CHECK(memcmp(c.v_cache, e.v_cache, sizeof c.v_cache) == 0);
    CHECK(memcmp(c.k, b.k, sizeof c.k) == 0); /* with store and no k_out, k is not written */
    CHECK(memcmp(c.v, b.v, sizeof c.v) == 0);
  }
  rotary_schedule_free(b.schedule);
}

/* rerotate_cache refusals, and the fields rerotate ignores in one mode. */
static void test_rerotate_refusals(void) {
  static float cache[CAP * D], out[CAP * D];
  static float snapshot[CAP * D], snapshot_out[CAP * D];
  const int64_t slots[3] = {2, -1, 5}, delta[3] = {10, 20, 30};
  const int64_t big_delta[3] = {10, (int64_t)1 << 31, 30};
  rotary_schedule* schedule = default_schedule(D);
  rotary_rerotate_cache_args a, bad;
  rotary_positions p;
  const int64_t pos[3] = {1, 2, 3};
  rotary_table* table = NULL;
  int status;
  fill_random(cache, CAP * D);
  memset(out, 0x5a, sizeof out);
  memset(&a, 0, sizeof a);
  CHECK(rotary_cache_view_nhd(cache, ROTARY_F32, BLOCKS, BS, 1, D, 0, 0, &a.cache) == ROTARY_OK);
  a.slots.data = slots;
  a.slots.count = 3;
  a.delta = delta;
  memcpy(snapshot, cache, sizeof cache);
  memcpy(snapshot_out, out, sizeof out);
#define REROTATE_REFUSED(args, needle)                                                 \
  do {                                                                                 \
    EXPECT_ERROR(rotary_rerotate_cache(schedule, args), needle);                       \
    CHECK(memcmp(snapshot, cache, sizeof cache) == 0 && memcmp(snapshot_out, out, sizeof out) == 0); \
  } while (0)
  REROTATE_REFUSED(NULL, "args is NULL");
  EXPECT_ERROR(rotary_rerotate_cache(NULL, &a), "schedule is NULL");
  bad = a; set_raw_enum(&bad.mode, 2);
  REROTATE_REFUSED(&bad, "mode=2");
  bad = a; bad.inverse = 2;
  REROTATE_REFUSED(&bad, "inverse=2");
  bad = a; set_raw_enum(&bad.backend, -3);
  REROTATE_REFUSED(&bad, "backend=-3");
  bad = a; set_raw_enum(&bad.numerics, 5);
  REROTATE_REFUSED(&bad, "numerics=5");
  bad = a; set_raw_enum(&bad.quant.mode, 4);
  REROTATE_REFUSED(&bad, "quant.mode=4");
  bad = a; set_raw_enum(&bad.cache.dtype, 12);
  REROTATE_REFUSED(&bad, "cache.dtype=12");
  bad = a; set_raw_enum(&bad.slots.kind, 3);
  REROTATE_REFUSED(&bad, "slots.kind=3");
  bad = a; bad.threads = -1;
  REROTATE_REFUSED(&bad, "threads=-1");
  bad = a; bad.delta = NULL;
  REROTATE_REFUSED(&bad, "delta is null");
  bad = a; bad.delta = big_delta;
  REROTATE_REFUSED(&bad, "delta[1]=2147483648");
  bad = a; bad.delta_streams = -2;
  REROTATE_REFUSED(&bad, "delta_streams=-2");
  bad = a; bad.slots.count = -3;
  REROTATE_REFUSED(&bad, "slots.count=-3");
  bad = a; bad.slots.data = NULL;
  REROTATE_REFUSED(&bad, "slots.data is NULL");
  bad = a; bad.cache.dtype = ROTARY_F64;
  REROTATE_REFUSED(&bad, "cache.dtype=f64");
  bad = a; bad.cache.head_dim = 8;
  REROTATE_REFUSED(&bad, "cache.head_dim=8");
  bad = a; memset(&bad.cache, 0, sizeof bad.cache);
  REROTATE_REFUSED(&bad, "cache is not set");
  bad = a; CHECK(rotary_cache_view_nhd(out, ROTARY_F32, BLOCKS, BS, 1, D, 0, 0, &bad.out) == ROTARY_OK);
  bad.out.dtype = ROTARY_BF16;
  REROTATE_REFUSED(&bad, "out.dtype=bf16");
  bad = a; CHECK(rotary_cache_view_nhd(out, ROTARY_F32, 1, BS, 1, D, 0, 0, &bad.out) == ROTARY_OK);
  REROTATE_REFUSED(&bad, "out holds 4 slots");
  bad = a; CHECK(rotary_cache_view_nhd(cache + 1, ROTARY_F32, BLOCKS, BS, 1, D, 0, 0, &bad.out) == ROTARY_OK);
  REROTATE_REFUSED(&bad, "out overlaps cache");
  bad = a; bad.quant.scale = (const float*)delta; /* f32 cache takes no scale */
  REROTATE_REFUSED(&bad, "quant.scale is set");
  CHECK(rotary_table_range(schedule, 0, 16, ROTARY_ANGLES_EXACT, &table) == ROTARY_OK);
  bad = a; bad.table = table;
  REROTATE_REFUSED(&bad, "table is for raw mode");
  memset(&p, 0, sizeof p);
  p.kind = ROTARY_POSITIONS_I64;
  p.data = pos;
  p.count = 2; /* 3 slots */
  bad = a; bad.mode = ROTARY_REROTATE_RAW; bad.delta = NULL; bad.positions = &p;
  REROTATE_REFUSED(&bad, "positions has 2 entries");
  p.count = 3; set_raw_enum(&p.kind, 4);
  REROTATE_REFUSED(&bad, "positions.kind=4");
  p.kind = ROTARY_POSITIONS_I64;

  /* A field of the other mode is refused, as a table is in delta mode: a caller who set raw-mode
   * positions but forgot mode=ROTARY_REROTATE_RAW once got ROTARY_OK and keys turned by the deltas
   * (and raw mode ignored a delta). */
  bad = a; bad.positions = &p;
  REROTATE_REFUSED(&bad, "positions is for raw mode");
  bad = a; bad.mode = ROTARY_REROTATE_RAW; bad.positions = &p; /* delta still set */
  REROTATE_REFUSED(&bad, "delta is for delta mode");
  memcpy(cache, snapshot, sizeof cache);

  /* A slot count no array can hold is an invalid argument naming slots.count (it was once
   * ROTARY_ERROR_INTERNAL "vector::reserve", before any value was read). */
  bad = a; bad.slots.count = INT64_MAX;
  status = rotary_rerotate_cache(schedule, &bad);
  if (status != ROTARY_ERROR_INVALID_ARGUMENT || strstr(rotary_last_error(), "slots.count") == NULL) {
    fprintf(stderr, "rerotate_cache(slots.count=INT64_MAX) returned %d, message '%s'\n", status,
            rotary_last_error());
    ++failures;
  }
  CHECK(memcmp(snapshot, cache, sizeof cache) == 0);

  /* Valid: out-of-place equals in place, and cache unchanged by the out-of-place call. */
  {
    static float in_place[CAP * D];
    memcpy(in_place, cache, sizeof cache);
    bad = a;
    CHECK(rotary_cache_view_nhd(out, ROTARY_F32, BLOCKS, BS, 1, D, 0, 0, &bad.out) == ROTARY_OK);
    CHECK(rotary_rerotate_cache(schedule, &bad) == ROTARY_OK);
    CHECK(memcmp(snapshot, cache, sizeof cache) == 0);
    bad = a;
    CHECK(rotary_cache_view_nhd(in_place, ROTARY_F32, BLOCKS, BS, 1, D, 0, 0, &bad.cache) == ROTARY_OK);
    CHECK(rotary_rerotate_cache(schedule, &bad) == ROTARY_OK);
    CHECK(memcmp(in_place + 2 * D, out + 2 * D, D * sizeof(float)) == 0);
    CHECK(memcmp(in_place + 5 * D, out + 5 * D, D * sizeof(float)) == 0);
  }
#undef REROTATE_REFUSED
  rotary_table_free(table);
  rotary_schedule_free(schedule);
}

/* A model turning pairs by -angle (NanoChat): rerotate's `inverse` flag is flipped by the C layer
 * (c_api.cpp rerotate_cache_args) as rotary_apply's direction is. Keys rotated by rotary_apply at p
 * and moved by +delta match keys rotated by rotary_apply at p + delta, in both flag settings. */
static void test_rerotate_rotates_backward(void) {
  const char* config = "{\"model_type\": \"nanochat\", \"hidden_size\": 64, \"num_attention_heads\": 4,"
                       " \"max_position_embeddings\": 2048}";
  rotary_schedule* schedule = NULL;
  static float keys[2 * D], moved[2 * D];
  const int64_t slots[2] = {0, 1}, delta[2] = {37, 100}, pos[2] = {5, 11}, pos_moved[2] = {42, 111};
  rotary_apply_args apply;
  rotary_rerotate_cache_args a;
  int inverse, i;
  CHECK(rotary_schedule_from_hf_config(config, -1, &schedule) == ROTARY_OK);
  if (schedule == NULL) return;
  CHECK(rotary_schedule_head_dim(schedule) == D);
  for (inverse = 0; inverse <= 1; ++inverse) {
    double worst = 0.0;
    fill_random(keys, 2 * D);
    memcpy(moved, keys, sizeof keys);
    memset(&apply, 0, sizeof apply);
    apply.inverse = inverse;
    CHECK(rotary_tensor_bshd(keys, ROTARY_F32, 1, 2, 1, D, &apply.q) == ROTARY_OK);
    apply.positions = pos;
    apply.positions_count = 2;
    CHECK(rotary_apply(schedule, &apply) == ROTARY_OK);
    CHECK(rotary_tensor_bshd(moved, ROTARY_F32, 1, 2, 1, D, &apply.q) == ROTARY_OK);
    apply.positions = pos_moved;
    CHECK(rotary_apply(schedule, &apply) == ROTARY_OK);
    memset(&a, 0, sizeof a);
    CHECK(rotary_cache_view_nhd(keys, ROTARY_F32, 2, 1, 1, D, 0, 0, &a.cache) == ROTARY_OK);
    a.slots.data = slots;
    a.slots.count = 2;
    a.delta = delta;
    a.inverse = inverse;
    CHECK(rotary_rerotate_cache(schedule, &a) == ROTARY_OK);
    for (i = 0; i < 2 * D; ++i) worst = fmax(worst, fabs((double)keys[i] - (double)moved[i]));
    CHECK(worst <= 1e-5);
  }
  rotary_schedule_free(schedule);
}

/* Page table: NULL arrays, negative counts, bad entries; slots_out untouched on every refusal. */
static void test_page_table(void) {
  const int32_t kv_indices[3] = {4, 1, 7}, kv_indptr[3] = {0, 2, 3}, batch[3] = {0, -1, 1}, pos[3] = {5, 0, 2};
  const int32_t bad_page[3] = {4, -1, 7}, bad_batch[3] = {0, 2, 1}, bad_pos[3] = {5, 0, 4};
  int64_t out[3] = {-9, -9, -9};
  const int64_t poison[3] = {-9, -9, -9};
#define PAGE_REFUSED(call, needle)                          \
  do {                                                      \
    EXPECT_ERROR(call, needle);                             \
    CHECK(memcmp(out, poison, sizeof out) == 0);            \
  } while (0)
  PAGE_REFUSED(rotary_slots_from_page_table(NULL, 3, kv_indptr, 3, batch, pos, 3, 4, out), "kv_indices is NULL");
  PAGE_REFUSED(rotary_slots_from_page_table(kv_indices, -1, kv_indptr, 3, batch, pos, 3, 4, out), "kv_indices_count=-1");
  PAGE_REFUSED(rotary_slots_from_page_table(kv_indices, 3, NULL, 3, batch, pos, 3, 4, out), "kv_indptr is NULL");
  PAGE_REFUSED(rotary_slots_from_page_table(kv_indices, 3, kv_indptr, 0, batch, pos, 3, 4, out), "kv_indptr is empty");
  PAGE_REFUSED(rotary_slots_from_page_table(kv_indices, 3, kv_indptr, 3, NULL, pos, 3, 4, out), "batch_indices is NULL");
  PAGE_REFUSED(rotary_slots_from_page_table(kv_indices, 3, kv_indptr, 3, batch, NULL, 3, 4, out), "position_in_request is NULL");
  PAGE_REFUSED(rotary_slots_from_page_table(kv_indices, 3, kv_indptr, 3, batch, pos, -2, 4, out), "tokens=-2");
  PAGE_REFUSED(rotary_slots_from_page_table(kv_indices, 3, kv_indptr, 3, batch, pos, 3, 0, out), "block_size=0");
  PAGE_REFUSED(rotary_slots_from_page_table(kv_indices, 3, kv_indptr, 3, batch, pos, 3, -4, out), "block_size=-4");
  PAGE_REFUSED(rotary_slots_from_page_table(bad_page, 3, kv_indptr, 3, batch, pos, 3, 4, out), "kv_indices[1]=-1");
  PAGE_REFUSED(rotary_slots_from_page_table(kv_indices, 3, kv_indptr, 3, bad_batch, pos, 3, 4, out), "batch_indices[1]=2");
  PAGE_REFUSED(rotary_slots_from_page_table(kv_indices, 3, kv_indptr, 3, batch, bad_pos, 3, 4, out), "position_in_request[2]=4");
  PAGE_REFUSED(rotary_slots_from_page_table(kv_indices, 3, kv_indptr, 3, batch, pos, 3, 4, NULL), "slots_out is NULL");
  CHECK(rotary_slots_from_page_table(kv_indices, 3, kv_indptr, 3, batch, pos, 3, 4, out) == ROTARY_OK);
  CHECK(out[0] == 1 * 4 + 1 && out[1] == -1 && out[2] == 7 * 4 + 2);
  CHECK(rotary_slots_from_page_table(NULL, 0, kv_indptr, 1, NULL, NULL, 0, 4, NULL) == ROTARY_OK);
#undef PAGE_REFUSED
}

/* Cache view constructors: NULL out, bad geometry zeroes *out, block_size 0. */
static void test_cache_view_constructors(void) {
  static float data[64];
  rotary_cache_view view, zero;
  memset(&zero, 0, sizeof zero);
  EXPECT_ERROR(rotary_cache_view_nhd(data, ROTARY_F32, 1, 1, 1, 16, 0, 0, NULL), "out is NULL");
  memset(&view, 0x5a, sizeof view);
  EXPECT_ERROR(rotary_cache_view_nhd(data, ROTARY_F32, 1, 1, 1, 16, 8, 16, &view), "row_width=16");
  CHECK(memcmp(&view, &zero, sizeof view) == 0);
  memset(&view, 0x5a, sizeof view);
  EXPECT_ERROR(rotary_cache_view_hnd(data, ROTARY_F32, 1, 1, 1, -16, 0, 0, &view), "head_dim=-16");
  CHECK(memcmp(&view, &zero, sizeof view) == 0);
  memset(&view, 0x5a, sizeof view);
  EXPECT_ERROR(rotary_cache_view_nhd(data, ROTARY_F32, 1, 1, 1, 16, -1, 0, &view), "offset=-1");
  CHECK(memcmp(&view, &zero, sizeof view) == 0);
  /* An MLA pair of views on one row: [kv_c 12 | k_pe 16] of width 28. */
  CHECK(rotary_cache_view_nhd(data, ROTARY_BF16, 1, 2, 1, 16, 12, 28, &view) == ROTARY_OK);
  CHECK(view.strides[0] == 56 && view.strides[1] == 28 && view.strides[2] == 28 && view.strides[3] == 1 &&
        view.offset == 12 && view.dtype == ROTARY_BF16 && view.data == data);

  /* block_size 0: the constructors refuse it naming block_size=0 and zero *out (they once returned
   * strides[0] = 0, a view whose blocks all alias block 0, which rope_store then refused naming no
   * block_size). */
  {
    static buffers b;
    rotary_rope_store_args a;
    int status;
    buffers_init(&b);
    store_args(&b, &a);
    memset(&view, 0x5a, sizeof view);
    status = rotary_cache_view_nhd(b.k_cache, ROTARY_F32, CAP, 0, KH, D, 0, 0, &view);
    CHECK(status == ROTARY_ERROR_INVALID_ARGUMENT && strstr(rotary_last_error(), "block_size=0") != NULL);
    CHECK(memcmp(&view, &zero, sizeof view) == 0);
    memset(&view, 0x5a, sizeof view);
    status = rotary_cache_view_hnd(b.k_cache, ROTARY_F32, CAP, 0, KH, D, 0, 0, &view);
    CHECK(status == ROTARY_ERROR_INVALID_ARGUMENT && strstr(rotary_last_error(), "block_size=0") != NULL);
    (void)a;
    rotary_schedule_free(b.schedule);
  }
}

/* The last error is per thread: a thread failing in a loop never sees another thread's message, and
 * successful calls leave it as it was. */
typedef struct {
  int which;
  int bad;
} thread_result;

static void* error_thread(void* arg) {
  thread_result* r = arg;
  static const int64_t dup[T] = {1, 1, -1, -1};
  static const int64_t beyond[T] = {99, -1, -1, -1};
  int i;
  buffers* b = malloc(sizeof *b);
  rotary_rope_store_args a, bad;
  if (b == NULL) abort();
  buffers_init(b);
  store_args(b, &a);
  a.rope.threads = 1;
  for (i = 0; i < 300; ++i) {
    bad = a;
    bad.cache.slots.data = r->which == 0 ? dup : beyond;
    if (rotary_rope_store(b->schedule, &bad) != ROTARY_ERROR_INVALID_ARGUMENT) ++r->bad;
    if (rotary_rope_store(b->schedule, &a) != ROTARY_OK) ++r->bad; /* success: message stays */
    if (strstr(rotary_last_error(), r->which == 0 ? "repeats slots[0]" : "slots[0]=99 is beyond") == NULL) ++r->bad;
  }
  rotary_schedule_free(b->schedule);
  free(b);
  return NULL;
}

static void test_last_error_per_thread(void) {
  pthread_t threads[4];
  thread_result results[4];
  int i;
  for (i = 0; i < 4; ++i) {
    results[i].which = i % 2;
    results[i].bad = 0;
    CHECK(pthread_create(&threads[i], NULL, error_thread, &results[i]) == 0);
  }
  for (i = 0; i < 4; ++i) {
    CHECK(pthread_join(threads[i], NULL) == 0);
    CHECK(results[i].bad == 0);
  }
}

/* rotary_qk_norm_rope_args.store's v "is ignored: v below is the one stored" (rotary.h): a garbage
 * dtype there is not read (it was once refused as "v.dtype=...", naming the v the caller set
 * correctly). */
static void test_store_v_ignored(void) {
  static buffers b;
  rotary_qk_norm_rope_args a;
  rotary_rope_store_args s;
  rotary_cache_write store;
  int status;
  buffers_init(&b);
  store_args(&b, &s);
  store = s.cache;
  set_raw_enum(&store.v.dtype, 99); /* ignored per rotary.h */
  memset(&a, 0, sizeof a);
  CHECK(rotary_tensor_bshd(b.q, ROTARY_F32, 1, T, QH, D, &a.rope.q) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(b.k, ROTARY_F32, 1, T, KH, D, &a.rope.k) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(b.v, ROTARY_F32, 1, T, KH, D, &a.v) == ROTARY_OK);
  a.store = &store;
  status = rotary_qk_norm_rope(b.schedule, &a);
  if (status != ROTARY_OK) {
    fprintf(stderr, "qk_norm_rope refused the ignored store->v: '%s'\n", rotary_last_error());
    ++failures;
  }
  rotary_schedule_free(b.schedule);
}

int main(void) {
  int isolated = 0;
  /* Crash-prone cases first, in children, before the parent process starts OpenMP threads. */
  isolated += !in_child(child_cache_offset_overflow, "rope_store k_cache.offset=INT64_MAX-4");
  isolated += !in_child(child_cache_stride_overflow, "rope_store v_cache.offset=3, strides[3]=INT64_MIN/2");
  isolated += !in_child(child_nhd_stride_overflow, "rotary_cache_view_nhd strides overflow");
  isolated += !in_child(child_hnd_offset_overflow, "rotary_cache_view_hnd offset=INT64_MAX-4");
  isolated += !in_child(child_page_table_overflow, "rotary_slots_from_page_table block_size=2^62");
  isolated += !in_child(child_empty_token_overflow, "rope_store empty q [2^40, 2^30, 0, 16]");
  isolated += !in_child(child_rerotate_slots_alias_cache, "rerotate_cache slots inside the cache");
  isolated += !in_child(child_rope_store_slots_alias_cache, "rope_store slots inside k_cache");
  failures += isolated;

  test_valid_rope_store_translation();
  test_rope_store_refusals();
  test_qk_norm_rope_refusals();
  test_rerotate_refusals();
  test_rerotate_rotates_backward();
  test_page_table();
  test_cache_view_constructors();
  test_store_v_ignored();
  test_last_error_per_thread();
  free(snapshot_of);
  if (failures != 0) {
    fprintf(stderr, "test_c_fused_adversarial: %d check(s) failed (%d in crash-isolated cases)\n", failures, isolated);
    return 1;
  }
  printf("test_c_fused_adversarial: all checks passed\n");
  return 0;
}
