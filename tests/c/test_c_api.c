/* The C ABI (rotary/rotary.h) from C: rotate and rotate back against the formulas written out
 * here in double; every error path returns non-zero with a message naming the value, leaves the
 * caller's memory untouched and sets *out to NULL; NULL arguments; the per-thread last error.
 * Built as C11 with -pedantic -Wall -Wextra -Werror. Prints each failure; exit status 1 if any. */
#define _POSIX_C_SOURCE 200809L

#include "rotary/rotary.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* apply.hpp's float32 contract: |result - exact| <= 2^-23 * g * (|a| + |b|) per pair. */
static const double kF32PairBound = 1.1920928955078125e-07; /* 2^-23 */
/* f64 computes in double with exact angles: a few double roundings. */
static const double kF64PairBound = 8.8817841970012523e-16; /* 2^-50 */
/* The reference below takes double cos/sin of the double product p * inv_freq: for positions
 * below 2^17 its own error stays under this, far inside the float bound. */
static const double kReferenceSlack = 1e-11;

static int failures = 0;

#define CHECK(condition) check((condition), #condition, __LINE__)
static void check(int ok, const char* what, int line) {
  if (!ok) {
    fprintf(stderr, "test_c_api.c:%d: CHECK failed: %s\n", line, what);
    ++failures;
  }
}

/* `status` is a failure and rotary_last_error() contains `needle` (the value the message names). */
#define EXPECT_ERROR(call, needle) expect_error((call), (needle), #call, __LINE__)
static void expect_error(int status, const char* needle, const char* what, int line) {
  const char* message = rotary_last_error();
  if (status == ROTARY_OK) {
    fprintf(stderr, "test_c_api.c:%d: %s succeeded; expected an error naming '%s'\n", line, what,
            needle);
    ++failures;
  } else if (message == NULL || strstr(message, needle) == NULL) {
    fprintf(stderr, "test_c_api.c:%d: %s: message '%s' lacks '%s'\n", line, what,
            message ? message : "(null)", needle);
    ++failures;
  }
}

/* ---- data ---- */

static uint32_t lcg_state = 12345u;
static float next_value(void) { /* in [-2, 2) */
  lcg_state = lcg_state * 1664525u + 1013904223u;
  return (float)((double)(lcg_state >> 8) / 16777216.0 * 4.0 - 2.0);
}

static float* random_floats(int64_t count) {
  float* values = malloc((size_t)count * sizeof *values);
  int64_t i;
  if (values == NULL) abort();
  for (i = 0; i < count; ++i) values[i] = next_value();
  return values;
}

static float* copy_floats(const float* from, int64_t count) {
  float* values = malloc((size_t)count * sizeof *values);
  if (values == NULL) abort();
  memcpy(values, from, (size_t)count * sizeof *values);
  return values;
}

/* ---- the formula, written out ---- */

typedef struct {
  int64_t head_dim, rotary_dim;
  double base;
  int interleaved;
} rope;

/* One head at `position`: pair i is (x[i], x[i + r/2]) (half) or (x[2i], x[2i+1]) (interleaved),
 * inv_freq_i = base^(-2i/r), phi = position * inv_freq_i,
 *   a' = a cos phi - b sin phi,   b' = a sin phi + b cos phi   (inverse: sin phi -> -sin phi),
 * channels r..d unchanged. Checks `out` against it: each rotated value within
 * `bound` * (|a| + |b|), the tail bit for bit. Returns 1 when the head matches. */
static int head_matches(const rope* r, const float* in, int64_t in_stride, const float* out,
                        int64_t out_stride, int64_t position, int inverse, double bound) {
  const int64_t half = r->rotary_dim / 2;
  int64_t i, d;
  for (i = 0; i < half; ++i) {
    const double inv_freq = pow(r->base, -2.0 * (double)i / (double)r->rotary_dim);
    const double phi = (double)position * inv_freq;
    const double c = cos(phi), s = inverse ? -sin(phi) : sin(phi);
    const int64_t ia = r->interleaved ? 2 * i : i;
    const int64_t ib = r->interleaved ? 2 * i + 1 : i + half;
    const double a = in[ia * in_stride], b = in[ib * in_stride];
    const double limit = bound * (fabs(a) + fabs(b)) + kReferenceSlack;
    if (fabs(out[ia * out_stride] - (a * c - b * s)) > limit ||
        fabs(out[ib * out_stride] - (a * s + b * c)) > limit) {
      fprintf(stderr, "  pair %lld at position %lld: got (%.9g, %.9g), formula (%.9g, %.9g)\n",
              (long long)i, (long long)position, out[ia * out_stride], out[ib * out_stride],
              a * c - b * s, a * s + b * c);
      return 0;
    }
  }
  for (d = r->rotary_dim; d < r->head_dim; ++d) {
    if (memcmp(&out[d * out_stride], &in[d * in_stride], sizeof(float)) != 0) return 0;
  }
  return 1;
}

/* Every head of `out` (a view, strides in elements) against the formula applied to `in`. */
static int tensor_matches(const rope* r, const float* in, const rotary_tensor* in_view,
                          const rotary_tensor* out_view, const int64_t* positions, int64_t offset,
                          int inverse) {
  const float* out = out_view->data;
  int64_t b, s, h;
  for (b = 0; b < in_view->shape[0]; ++b) {
    for (s = 0; s < in_view->shape[1]; ++s) {
      const int64_t position = positions ? positions[b * in_view->shape[1] + s] : offset + s;
      for (h = 0; h < in_view->shape[2]; ++h) {
        const int64_t at_in = b * in_view->strides[0] + s * in_view->strides[1] +
                              h * in_view->strides[2];
        const int64_t at_out = b * out_view->strides[0] + s * out_view->strides[1] +
                               h * out_view->strides[2];
        if (!head_matches(r, in + at_in, in_view->strides[3], out + at_out, out_view->strides[3],
                          position, inverse, kF32PairBound)) {
          fprintf(stderr, "  batch %lld, token %lld, head %lld\n", (long long)b, (long long)s,
                  (long long)h);
          return 0;
        }
      }
    }
  }
  return 1;
}

static rotary_schedule* schedule_of(const rope* r) {
  rotary_spec spec;
  rotary_schedule* schedule = NULL;
  memset(&spec, 0, sizeof spec);
  spec.head_dim = r->head_dim;
  spec.rotary_dim = r->rotary_dim;
  spec.base = r->base;
  spec.pairing = r->interleaved ? ROTARY_PAIRING_INTERLEAVED : ROTARY_PAIRING_HALF;
  if (rotary_schedule_from_spec(&spec, -1, &schedule) != ROTARY_OK) {
    fprintf(stderr, "schedule_of: %s\n", rotary_last_error());
    abort();
  }
  return schedule;
}

/* ---- rotation ---- */

/* q and k (GQA) in place, sequential positions from an offset, half pairing, partial rotary;
 * then the inverse on the result. */
static void test_half_in_place_then_inverse(void) {
  const rope r = {64, 48, 10000.0, 0};
  const int64_t batch = 2, seq = 5, q_heads = 4, k_heads = 2, offset = 1000;
  const int64_t q_count = batch * seq * q_heads * 64, k_count = batch * seq * k_heads * 64;
  rotary_schedule* schedule = schedule_of(&r);
  float* q = random_floats(q_count);
  float* k = random_floats(k_count);
  float* q_original = copy_floats(q, q_count);
  float* k_original = copy_floats(k, k_count);
  float* q_rotated;
  rotary_apply_args args;
  int64_t i;
  double worst = 0;
  memset(&args, 0, sizeof args);
  CHECK(rotary_tensor_bshd(q, ROTARY_F32, batch, seq, q_heads, 64, &args.q) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(k, ROTARY_F32, batch, seq, k_heads, 64, &args.k) == ROTARY_OK);
  args.offset = offset;
  CHECK(rotary_apply(schedule, &args) == ROTARY_OK);
  CHECK(tensor_matches(&r, q_original, &args.q, &args.q, NULL, offset, 0));
  CHECK(tensor_matches(&r, k_original, &args.k, &args.k, NULL, offset, 0));

  q_rotated = copy_floats(q, q_count);
  args.inverse = ROTARY_INVERSE;
  CHECK(rotary_apply(schedule, &args) == ROTARY_OK);
  CHECK(tensor_matches(&r, q_rotated, &args.q, &args.q, NULL, offset, 1));
  for (i = 0; i < q_count; ++i) worst = fmax(worst, fabs(q[i] - q_original[i]));
  for (i = 0; i < k_count; ++i) worst = fmax(worst, fabs(k[i] - k_original[i]));
  CHECK(worst < 4 * 4 * kF32PairBound); /* two roundings of values below 4 */

  free(q_rotated);
  free(q_original);
  free(k_original);
  free(q);
  free(k);
  rotary_schedule_free(schedule);
}

/* Interleaved pairing, out of place into q_out, int32 per-token positions: q is left alone, the
 * tail is copied. */
static void test_interleaved_out_of_place_int32_positions(void) {
  const rope r = {32, 24, 500000.0, 1};
  enum { batch = 2, seq = 4, heads = 3, dim = 32 };
  const int32_t positions32[batch * seq] = {0, 1, 7, 4095, 4097, 65535, 65537, 100000};
  int64_t positions64[batch * seq];
  float* q = random_floats(batch * seq * heads * dim);
  float* q_before = copy_floats(q, batch * seq * heads * dim);
  float* q_out = calloc(batch * seq * heads * dim, sizeof(float));
  rotary_schedule* schedule = schedule_of(&r);
  rotary_apply_args args;
  int i;
  for (i = 0; i < batch * seq; ++i) positions64[i] = positions32[i];
  memset(&args, 0, sizeof args);
  CHECK(rotary_tensor_bshd(q, ROTARY_F32, batch, seq, heads, dim, &args.q) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(q_out, ROTARY_F32, batch, seq, heads, dim, &args.q_out) == ROTARY_OK);
  args.positions_i32 = positions32;
  args.positions_count = batch * seq;
  CHECK(rotary_apply(schedule, &args) == ROTARY_OK);
  CHECK(memcmp(q, q_before, sizeof(float) * batch * seq * heads * dim) == 0);
  CHECK(tensor_matches(&r, q, &args.q, &args.q_out, positions64, 0, 0));
  free(q);
  free(q_before);
  free(q_out);
  rotary_schedule_free(schedule);
}

/* [batch, heads, seq, head_dim] memory, int64 per-token positions, the reference backend. */
static void test_bhsd_int64_positions_reference_backend(void) {
  const rope r = {16, 16, 10000.0, 0};
  enum { batch = 1, heads = 2, seq = 3, dim = 16 };
  const int64_t positions[batch * seq] = {5, 131071, 3};
  float* q = random_floats(batch * heads * seq * dim);
  float* q_before = copy_floats(q, batch * heads * seq * dim);
  rotary_schedule* schedule = schedule_of(&r);
  rotary_apply_args args;
  memset(&args, 0, sizeof args);
  CHECK(rotary_tensor_bhsd(q, ROTARY_F32, batch, heads, seq, dim, &args.q) == ROTARY_OK);
  CHECK(args.q.strides[1] == dim && args.q.strides[2] == seq * dim);
  args.positions = positions;
  args.positions_count = batch * seq;
  args.backend = ROTARY_BACKEND_REFERENCE;
  args.threads = 1;
  CHECK(rotary_apply(schedule, &args) == ROTARY_OK);
  CHECK(tensor_matches(&r, q_before, &args.q, &args.q, positions, 0, 0));
  free(q);
  free(q_before);
  rotary_schedule_free(schedule);
}

/* f64 in double arithmetic: the same formula, a double-sized bound. */
static void test_f64(void) {
  const rope r = {8, 8, 10000.0, 0};
  enum { seq = 3, dim = 8 };
  double q[seq * dim], before[seq * dim];
  rotary_schedule* schedule = schedule_of(&r);
  rotary_apply_args args;
  int64_t s, i;
  for (i = 0; i < seq * dim; ++i) q[i] = before[i] = next_value();
  memset(&args, 0, sizeof args);
  CHECK(rotary_tensor_bshd(q, ROTARY_F64, 1, seq, 1, dim, &args.q) == ROTARY_OK);
  args.offset = 77;
  CHECK(rotary_apply(schedule, &args) == ROTARY_OK);
  for (s = 0; s < seq; ++s) {
    for (i = 0; i < dim / 2; ++i) {
      const double phi = (double)(77 + s) * pow(10000.0, -2.0 * (double)i / dim);
      const double a = before[s * dim + i], b = before[s * dim + i + dim / 2];
      const double limit = kF64PairBound * (fabs(a) + fabs(b)) + 1e-13;
      CHECK(fabs(q[s * dim + i] - (a * cos(phi) - b * sin(phi))) <= limit);
      CHECK(fabs(q[s * dim + i + dim / 2] - (a * sin(phi) + b * cos(phi))) <= limit);
    }
  }
  rotary_schedule_free(schedule);
}

/* A table holds cos and sin within a float ulp; apply with it meets the same formula. */
static void test_table(void) {
  const rope r = {16, 16, 10000.0, 0};
  rotary_schedule* schedule = schedule_of(&r);
  rotary_table* table = NULL;
  rotary_table* listed = NULL;
  const int64_t list[3] = {9, 2, 9};
  float* q = random_floats(4 * 16);
  float* before = copy_floats(q, 4 * 16);
  rotary_apply_args args;
  int64_t row, i;
  CHECK(rotary_table_range(schedule, 10, 20, ROTARY_ANGLES_EXACT, &table) == ROTARY_OK);
  CHECK(rotary_table_rows(table) == 20);
  CHECK(rotary_table_pairs(table) == 8);
  for (row = 0; row < 20; ++row) {
    for (i = 0; i < 8; ++i) {
      const double phi = (double)(10 + row) * pow(10000.0, -2.0 * (double)i / 16);
      CHECK(fabs(rotary_table_cos(table)[row * 8 + i] - cos(phi)) <= 1.2e-7);
      CHECK(fabs(rotary_table_sin(table)[row * 8 + i] - sin(phi)) <= 1.2e-7);
    }
  }
  memset(&args, 0, sizeof args);
  CHECK(rotary_tensor_bshd(q, ROTARY_F32, 1, 4, 1, 16, &args.q) == ROTARY_OK);
  args.offset = 12;
  args.table = table;
  CHECK(rotary_apply(schedule, &args) == ROTARY_OK);
  CHECK(tensor_matches(&r, before, &args.q, &args.q, NULL, 12, 0));

  CHECK(rotary_table_at(schedule, list, 3, ROTARY_ANGLES_HF_FLOAT32, &listed) == ROTARY_OK);
  CHECK(rotary_table_rows(listed) == 3);
  CHECK(rotary_table_cos(listed)[0] == rotary_table_cos(listed)[2 * 8]); /* duplicate position */
  rotary_table_free(listed);
  rotary_table_free(table);
  free(q);
  free(before);
  rotary_schedule_free(schedule);
}

/* ---- constructors and accessors ---- */

static void test_spec_fields(void) {
  rotary_spec spec;
  rotary_schedule* plain = NULL;
  rotary_schedule* yarn_truncated = NULL;
  rotary_schedule* yarn_exact = NULL;
  rotary_schedule* dynamic_short = NULL;
  rotary_schedule* dynamic_long = NULL;
  int64_t i;

  memset(&spec, 0, sizeof spec); /* all defaults: base 10000, half, default schedule */
  spec.head_dim = 64;
  CHECK(rotary_schedule_from_spec(&spec, -1, &plain) == ROTARY_OK);
  CHECK(rotary_schedule_head_dim(plain) == 64);
  CHECK(rotary_schedule_rotary_dim(plain) == 64);
  CHECK(rotary_schedule_attention_factor(plain) == 1.0);
  CHECK(rotary_schedule_pairing(plain) == ROTARY_PAIRING_HALF);
  CHECK(rotary_schedule_type_of(plain) == ROTARY_SCHEDULE_DEFAULT);
  for (i = 0; i < 32; ++i) {
    const double expected = pow(10000.0, -2.0 * (double)i / 64.0);
    CHECK(fabs(rotary_schedule_inv_freq(plain)[i] - expected) <= 1e-15 * expected);
  }

  /* YaRN with truncate on (the default) and off: the ramp bounds differ. */
  spec.schedule = ROTARY_SCHEDULE_YARN;
  spec.factor = 4.0;
  spec.original_max_position = 4096;
  CHECK(rotary_schedule_from_spec(&spec, -1, &yarn_truncated) == ROTARY_OK);
  spec.truncate = ROTARY_TOGGLE_OFF;
  CHECK(rotary_schedule_from_spec(&spec, -1, &yarn_exact) == ROTARY_OK);
  CHECK(rotary_schedule_type_of(yarn_exact) == ROTARY_SCHEDULE_YARN);
  CHECK(rotary_schedule_attention_factor(yarn_exact) > 1.0);
  CHECK(memcmp(rotary_schedule_inv_freq(yarn_truncated), rotary_schedule_inv_freq(yarn_exact),
               32 * sizeof(double)) != 0);

  /* dynamic depends on seq_len: unset (< 0) is the plain schedule, 4 * L grows the base. */
  memset(&spec, 0, sizeof spec);
  spec.head_dim = 64;
  spec.schedule = ROTARY_SCHEDULE_DYNAMIC;
  spec.factor = 2.0;
  spec.max_position = 2048;
  CHECK(rotary_schedule_from_spec(&spec, -1, &dynamic_short) == ROTARY_OK);
  CHECK(rotary_schedule_from_spec(&spec, 8192, &dynamic_long) == ROTARY_OK);
  CHECK(rotary_schedule_inv_freq(dynamic_short)[1] == rotary_schedule_inv_freq(plain)[1]);
  CHECK(rotary_schedule_inv_freq(dynamic_long)[1] < rotary_schedule_inv_freq(plain)[1]);

  rotary_schedule_free(plain);
  rotary_schedule_free(yarn_truncated);
  rotary_schedule_free(yarn_exact);
  rotary_schedule_free(dynamic_short);
  rotary_schedule_free(dynamic_long);
}

static void test_longrope_factor_lists(void) {
  double short_factor[4] = {1.0, 1.0, 2.0, 2.0}, long_factor[4] = {1.0, 2.0, 4.0, 8.0};
  rotary_spec spec;
  rotary_schedule* schedule = NULL;
  memset(&spec, 0, sizeof spec);
  spec.head_dim = 8;
  spec.schedule = ROTARY_SCHEDULE_LONGROPE;
  spec.original_max_position = 4096;
  spec.max_position = 131072;
  spec.short_factor = short_factor;
  spec.short_factor_count = 4;
  spec.long_factor = long_factor;
  spec.long_factor_count = 4;
  CHECK(rotary_schedule_from_spec(&spec, 100000, &schedule) == ROTARY_OK);
  CHECK(fabs(rotary_schedule_inv_freq(schedule)[3] * 8.0 - pow(10000.0, -6.0 / 8.0)) < 1e-15);
  rotary_schedule_free(schedule);
}

static void test_hf_config_and_presets(void) {
  const char* config =
      "{\"model_type\": \"llama\", \"hidden_size\": 4096, \"num_attention_heads\": 32,"
      " \"num_key_value_heads\": 8, \"max_position_embeddings\": 131072,"
      " \"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0,"
      " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
      " \"original_max_position_embeddings\": 8192}}";
  rotary_schedule* from_config = NULL;
  rotary_schedule* from_preset = NULL;
  int64_t i, presets = 0;
  int found = 0;
  CHECK(rotary_schedule_from_hf_config(config, -1, &from_config) == ROTARY_OK);
  CHECK(rotary_schedule_from_preset("llama-3.1-8b", -1, &from_preset) == ROTARY_OK);
  CHECK(rotary_schedule_head_dim(from_config) == 128);
  CHECK(rotary_schedule_type_of(from_config) == ROTARY_SCHEDULE_LLAMA3);
  CHECK(memcmp(rotary_schedule_inv_freq(from_config), rotary_schedule_inv_freq(from_preset),
               64 * sizeof(double)) == 0);
  for (i = 0; rotary_preset_name(i) != NULL; ++i) {
    ++presets;
    found |= strcmp(rotary_preset_name(i), "llama-3.1-8b") == 0;
  }
  CHECK(presets >= 10);
  CHECK(found);
  CHECK(rotary_preset_name(-1) == NULL);
  rotary_schedule_free(from_config);
  rotary_schedule_free(from_preset);
}

/* A model whose code turns pairs by -angle (NanoChat: rotate_half = cat(x2, -x1)): ROTARY_FORWARD on
 * its schedule rotates as the model does, i.e. by -angle, and ROTARY_INVERSE undoes it. */
static void test_model_rotating_backward(void) {
  const char* config = "{\"model_type\": \"nanochat\", \"hidden_size\": 128, \"num_attention_heads\": 2,"
                       " \"max_position_embeddings\": 2048}";
  const rope r = {64, 64, 10000.0, 0};
  const int64_t seq = 3, heads = 2, offset = 500, count = seq * heads * 64;
  rotary_schedule* schedule = NULL;
  float* q;
  float* q_original;
  float* q_rotated;
  rotary_apply_args args;
  CHECK(rotary_schedule_from_hf_config(config, -1, &schedule) == ROTARY_OK);
  q = random_floats(count);
  q_original = copy_floats(q, count);
  memset(&args, 0, sizeof args);
  CHECK(rotary_tensor_bshd(q, ROTARY_F32, 1, seq, heads, 64, &args.q) == ROTARY_OK);
  args.offset = offset;
  CHECK(rotary_apply(schedule, &args) == ROTARY_OK);
  CHECK(tensor_matches(&r, q_original, &args.q, &args.q, NULL, offset, 1));
  q_rotated = copy_floats(q, count);
  args.inverse = ROTARY_INVERSE;
  CHECK(rotary_apply(schedule, &args) == ROTARY_OK);
  CHECK(tensor_matches(&r, q_rotated, &args.q, &args.q, NULL, offset, 0));
  free(q_rotated);
  free(q_original);
  free(q);
  rotary_schedule_free(schedule);
}

/* ---- errors ---- */

static void test_constructor_errors(void) {
  double one[1] = {1.0};
  rotary_spec spec;
  rotary_schedule* schedule;
  rotary_schedule* good = NULL;
  rotary_table* table;
  rotary_tensor tensor;
  const int64_t no_positions[1] = {0};
  char marker;

  /* *out is NULL after every failure, whatever it held. */
#define POISONED ((rotary_schedule*)(void*)&marker)
  memset(&spec, 0, sizeof spec);
  schedule = POISONED;
  EXPECT_ERROR(rotary_schedule_from_spec(&spec, -1, &schedule), "head_dim=0");
  CHECK(schedule == NULL);
  spec.head_dim = 64;
  spec.rotary_dim = 63;
  schedule = POISONED;
  EXPECT_ERROR(rotary_schedule_from_spec(&spec, -1, &schedule), "rotary_dim=63");
  CHECK(schedule == NULL);
  spec.rotary_dim = 0;
  spec.pairing = (rotary_pairing)5;
  EXPECT_ERROR(rotary_schedule_from_spec(&spec, -1, &schedule), "spec.pairing=5");
  spec.pairing = ROTARY_PAIRING_HALF;
  spec.schedule = (rotary_schedule_type)42;
  EXPECT_ERROR(rotary_schedule_from_spec(&spec, -1, &schedule), "spec.schedule=42");
  spec.schedule = ROTARY_SCHEDULE_YARN;
  spec.factor = 2.0;
  spec.original_max_position = 4096;
  spec.truncate = (rotary_toggle)7;
  EXPECT_ERROR(rotary_schedule_from_spec(&spec, -1, &schedule), "spec.truncate=7");
  spec.truncate = ROTARY_TOGGLE_UNSET;
  spec.factor = -3.0;
  EXPECT_ERROR(rotary_schedule_from_spec(&spec, -1, &schedule), "factor=-3");
  spec.factor = 0; /* 0 is unset */
  EXPECT_ERROR(rotary_schedule_from_spec(&spec, -1, &schedule), "schedule yarn needs factor");
  spec.schedule = ROTARY_SCHEDULE_LONGROPE;
  spec.short_factor_count = 3;
  EXPECT_ERROR(rotary_schedule_from_spec(&spec, -1, &schedule),
               "spec.short_factor is NULL but spec.short_factor_count=3");
  spec.short_factor = one;
  spec.short_factor_count = -2;
  EXPECT_ERROR(rotary_schedule_from_spec(&spec, -1, &schedule), "spec.short_factor_count=-2");
  spec.short_factor_count = 1;
  EXPECT_ERROR(rotary_schedule_from_spec(&spec, -1, &schedule), "short_factor has 1 values");
  schedule = POISONED;
  EXPECT_ERROR(rotary_schedule_from_spec(NULL, -1, &schedule), "spec is NULL");
  CHECK(schedule == NULL);
  EXPECT_ERROR(rotary_schedule_from_spec(&spec, -1, NULL), "out is NULL");

  schedule = POISONED;
  EXPECT_ERROR(rotary_schedule_from_preset("no-such-model-x", -1, &schedule), "no-such-model-x");
  CHECK(schedule == NULL);
  EXPECT_ERROR(rotary_schedule_from_preset(NULL, -1, &schedule), "name is NULL");
  EXPECT_ERROR(rotary_schedule_from_preset("llama-3.1-8b", -1, NULL), "out is NULL");
  schedule = POISONED;
  EXPECT_ERROR(rotary_schedule_from_hf_config("{\"hidden_size\": 64", -1, &schedule),
               "not valid JSON");
  CHECK(schedule == NULL);
  EXPECT_ERROR(rotary_schedule_from_hf_config(
                   "{\"hidden_size\": 64, \"num_attention_heads\": 2, \"head_dim\": \"wide\"}", -1,
                   &schedule),
               "head_dim='wide'");
  EXPECT_ERROR(rotary_schedule_from_hf_config(NULL, -1, &schedule), "config_json is NULL");
  EXPECT_ERROR(rotary_schedule_from_hf_config("{}", -1, NULL), "out is NULL");
#undef POISONED

  memset(&spec, 0, sizeof spec);
  spec.head_dim = 8;
  CHECK(rotary_schedule_from_spec(&spec, -1, &good) == ROTARY_OK);
  table = (rotary_table*)(void*)&marker;
  EXPECT_ERROR(rotary_table_range(good, -5, 3, ROTARY_ANGLES_EXACT, &table), "-5");
  CHECK(table == NULL);
  EXPECT_ERROR(rotary_table_range(good, 0, 3, (rotary_angle_mode)9, &table), "mode=9");
  EXPECT_ERROR(rotary_table_range(NULL, 0, 3, ROTARY_ANGLES_EXACT, &table), "schedule is NULL");
  EXPECT_ERROR(rotary_table_range(good, 0, 3, ROTARY_ANGLES_EXACT, NULL), "out is NULL");
  EXPECT_ERROR(rotary_table_at(good, NULL, 4, ROTARY_ANGLES_EXACT, &table),
               "positions is NULL but count=4");
  EXPECT_ERROR(rotary_table_at(good, no_positions, -1, ROTARY_ANGLES_EXACT, &table), "count=-1");
  EXPECT_ERROR(rotary_tensor_bshd(NULL, ROTARY_F32, 1, 1, 1, 8, NULL), "out is NULL");
  memset(&tensor, 0xff, sizeof tensor);
  EXPECT_ERROR(rotary_tensor_bshd(NULL, ROTARY_F32, 1, INT64_MAX / 2, 4, 8, &tensor),
               "overflows int64");
  CHECK(tensor.data == NULL && tensor.shape[0] == 0 && tensor.strides[0] == 0);
  rotary_schedule_free(good);
}

/* Each bad apply argument: non-zero, a message naming the value, q and k untouched. */
static void test_apply_errors(void) {
  const rope r = {16, 16, 10000.0, 0};
  rotary_schedule* schedule = schedule_of(&r);
  rotary_table* table = NULL;
  const int64_t positions[2] = {0, 1};
  const int32_t positions32[2] = {0, 1};
  const int64_t negative[2] = {3, -7};
  float* q = random_floats(2 * 16);
  float* k = random_floats(2 * 16);
  float* q_before = copy_floats(q, 2 * 16);
  float* k_before = copy_floats(k, 2 * 16);
  rotary_apply_args good, args;
  memset(&good, 0, sizeof good);
  CHECK(rotary_tensor_bshd(q, ROTARY_F32, 1, 2, 1, 16, &good.q) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(k, ROTARY_F32, 1, 2, 1, 16, &good.k) == ROTARY_OK);

  args = good;
  args.q.dtype = (rotary_dtype)9;
  EXPECT_ERROR(rotary_apply(schedule, &args), "q.dtype=9");
  args = good;
  args.k_out.dtype = (rotary_dtype)-4;
  EXPECT_ERROR(rotary_apply(schedule, &args), "k_out.dtype=");
  args = good;
  args.inverse = 4; /* 2 and 3 are ROTARY_UNDO and ROTARY_UNDO_INVERSE */
  EXPECT_ERROR(rotary_apply(schedule, &args), "inverse=4");
  args = good;
  args.inverse = -1;
  EXPECT_ERROR(rotary_apply(schedule, &args), "inverse=-1");
  args = good;
  args.skip_tail_copy = -1;
  EXPECT_ERROR(rotary_apply(schedule, &args), "skip_tail_copy=-1");
  args = good;
  args.backend = (rotary_backend)6;
  EXPECT_ERROR(rotary_apply(schedule, &args), "backend=6");
  args = good;
  args.threads = -3;
  EXPECT_ERROR(rotary_apply(schedule, &args), "threads=-3");
  args = good;
  args.offset = -1;
  EXPECT_ERROR(rotary_apply(schedule, &args), "offset=-1");
  args = good;
  args.positions = positions;
  args.positions_i32 = positions32;
  args.positions_count = 2;
  EXPECT_ERROR(rotary_apply(schedule, &args), "positions and positions_i32 are both set");
  args = good;
  args.positions_count = 2;
  EXPECT_ERROR(rotary_apply(schedule, &args), "positions_count=2 but positions");
  args = good;
  args.positions = positions;
  args.positions_count = 2;
  args.offset = 5;
  EXPECT_ERROR(rotary_apply(schedule, &args), "offset=5");
  args = good;
  args.positions = positions;
  args.positions_count = 3;
  EXPECT_ERROR(rotary_apply(schedule, &args), "3 entries");
  args = good;
  args.positions = negative;
  args.positions_count = 2;
  EXPECT_ERROR(rotary_apply(schedule, &args), "positions[1]=-7");
  args = good;
  args.k.shape[3] = 32;
  EXPECT_ERROR(rotary_apply(schedule, &args), "k.head_dim=32");
  args = good;
  args.q.data = NULL;
  args.q.shape[0] = args.q.shape[1] = args.q.shape[2] = args.q.shape[3] = 0;
  EXPECT_ERROR(rotary_apply(schedule, &args), "q is not set");
  args = good;
  args.k.data = NULL; /* NULL data with a non-empty shape is an error, not an absent k */
  EXPECT_ERROR(rotary_apply(schedule, &args), "k.data is null");
  args = good;
  args.q_out = args.k;
  EXPECT_ERROR(rotary_apply(schedule, &args), "overlaps");
  CHECK(rotary_table_range(schedule, 0, 1, ROTARY_ANGLES_EXACT, &table) == ROTARY_OK);
  args = good;
  args.table = table;
  EXPECT_ERROR(rotary_apply(schedule, &args), "positions[1]=1 is not in the table");
  EXPECT_ERROR(rotary_apply(NULL, &good), "schedule is NULL");
  EXPECT_ERROR(rotary_apply(schedule, NULL), "args is NULL");

  CHECK(memcmp(q, q_before, 2 * 16 * sizeof(float)) == 0);
  CHECK(memcmp(k, k_before, 2 * 16 * sizeof(float)) == 0);
  rotary_table_free(table);
  free(q);
  free(k);
  free(q_before);
  free(k_before);
  rotary_schedule_free(schedule);
}

/* Absent (all zero) and empty (an extent 0, data NULL allowed) views, as the C++ API has them. */
static void test_absent_and_empty_views(void) {
  const rope r = {16, 16, 10000.0, 0};
  rotary_schedule* schedule = schedule_of(&r);
  float q[16];
  rotary_apply_args args;
  int i;
  for (i = 0; i < 16; ++i) q[i] = 1.0f;
  memset(&args, 0, sizeof args);
  CHECK(rotary_tensor_bshd(NULL, ROTARY_F32, 1, 0, 4, 16, &args.q) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(NULL, ROTARY_BF16, 1, 0, 2, 16, &args.k) == ROTARY_OK);
  args.k.dtype = ROTARY_F32;
  CHECK(rotary_apply(schedule, &args) == ROTARY_OK); /* empty q and k: nothing to do */
  memset(&args, 0, sizeof args);
  CHECK(rotary_tensor_bshd(q, ROTARY_F32, 1, 1, 1, 16, &args.q) == ROTARY_OK);
  args.offset = 1; /* k, q_out and k_out absent: q alone, in place */
  CHECK(rotary_apply(schedule, &args) == ROTARY_OK);
  CHECK(fabs(q[0] - (cos(1.0) - sin(1.0))) < 1e-6); /* pair 0 turns 1 rad per position */
  rotary_schedule_free(schedule);
}

/* NULL objects: free is a no-op, accessors give 0 / NULL / -1 and say why. */
static void test_null_objects(void) {
  rotary_schedule_free(NULL);
  rotary_table_free(NULL);
  CHECK(rotary_schedule_head_dim(NULL) == 0);
  CHECK(strcmp(rotary_last_error(), "schedule is NULL") == 0);
  CHECK(rotary_schedule_rotary_dim(NULL) == 0);
  CHECK(rotary_schedule_inv_freq(NULL) == NULL);
  CHECK(rotary_schedule_attention_factor(NULL) == 0.0);
  CHECK(rotary_schedule_pairing(NULL) == -1);
  CHECK(rotary_schedule_type_of(NULL) == -1);
  CHECK(rotary_table_rows(NULL) == 0);
  CHECK(strcmp(rotary_last_error(), "table is NULL") == 0);
  CHECK(rotary_table_pairs(NULL) == 0);
  CHECK(rotary_table_cos(NULL) == NULL);
  CHECK(rotary_table_sin(NULL) == NULL);
}

/* ---- the last error is per thread ---- */

static void* other_thread(void* message_copy) {
  rotary_schedule* schedule = NULL;
  char* copy = message_copy;
  if (rotary_last_error()[0] != '\0') {
    snprintf(copy, 256, "a fresh thread starts with '%s'", rotary_last_error());
    return NULL;
  }
  rotary_schedule_from_preset("preset-of-thread-two", -1, &schedule);
  snprintf(copy, 256, "%s", rotary_last_error());
  return NULL;
}

static void test_last_error_per_thread(void) {
  char copy[256] = "";
  pthread_t thread;
  rotary_schedule* schedule = NULL;
  const char* mine;
  EXPECT_ERROR(rotary_schedule_from_preset("preset-of-thread-one", -1, &schedule),
               "preset-of-thread-one");
  mine = rotary_last_error();
  CHECK(pthread_create(&thread, NULL, other_thread, copy) == 0);
  CHECK(pthread_join(thread, NULL) == 0);
  CHECK(strstr(copy, "preset-of-thread-two") != NULL);
  CHECK(strstr(rotary_last_error(), "preset-of-thread-one") != NULL);
  CHECK(strstr(mine, "preset-of-thread-one") != NULL);
  /* A success leaves the message as it was, like errno. */
  CHECK(rotary_schedule_from_preset("llama-2-7b", -1, &schedule) == ROTARY_OK);
  CHECK(strstr(rotary_last_error(), "preset-of-thread-one") != NULL);
  rotary_schedule_free(schedule);
}

static void test_version(void) { CHECK(strcmp(rotary_version(), ROTARY_EXPECTED_VERSION) == 0); }

/* M-RoPE from C: a schedule with three streams (rotary_spec_ext), its descriptor read back, and
 * apply with [3, batch, seq] positions of each kind against the formula written out here (f64). */
static void test_mrope_streams_and_position_kinds(void) {
  enum { batch = 2, seq = 3, dim = 16, pairs = 8, streams = 3 };
  const int64_t sections[3] = {2, 3, 3};
  rotary_spec spec;
  rotary_spec_ext ext;
  rotary_schedule* schedule = NULL;
  double q[batch * seq * dim], before[batch * seq * dim];
  int64_t pos64[streams * batch * seq];
  int32_t pos32[streams * batch * seq];
  float pos_f32[streams * batch * seq];
  double pos_f64[streams * batch * seq];
  int kind, j, t, i;
  memset(&spec, 0, sizeof spec);
  memset(&ext, 0, sizeof ext);
  spec.head_dim = dim;
  spec.base = 1000000.0;
  ext.stream_layout = ROTARY_STREAMS_SECTIONS;
  ext.sections = sections;
  ext.sections_count = 3;
  CHECK(rotary_schedule_from_spec_ext(&spec, &ext, -1, &schedule) == ROTARY_OK);
  CHECK(rotary_schedule_streams(schedule) == 3);
  CHECK(rotary_schedule_layout(schedule) == ROTARY_LAYOUT_HALF);
  CHECK(rotary_schedule_rotary_offset(schedule) == 0);
  CHECK(rotary_schedule_blocks(schedule) == 1);
  for (j = 0; j < pairs; ++j) CHECK(rotary_schedule_pair_stream(schedule, j) == (j < 2 ? 0 : j < 5 ? 1 : 2));
  EXPECT_ERROR(rotary_schedule_pair_stream(schedule, pairs) == -1 ? ROTARY_ERROR_INVALID_ARGUMENT : ROTARY_OK,
               "pair=8 must be in [0, 8)");
  for (i = 0; i < streams * batch * seq; ++i) {
    pos64[i] = (int64_t)((i * 7919) % 5000);
    pos32[i] = (int32_t)pos64[i];
    pos_f32[i] = (float)pos64[i];
    pos_f64[i] = (double)pos64[i] + 0.25; /* fractional */
  }
  for (kind = ROTARY_POSITIONS_I64; kind <= ROTARY_POSITIONS_F64; ++kind) {
    const void* data[4] = {pos64, pos32, pos_f32, pos_f64};
    rotary_apply_args args;
    rotary_positions positions;
    for (i = 0; i < batch * seq * dim; ++i) q[i] = before[i] = next_value();
    memset(&args, 0, sizeof args);
    CHECK(rotary_tensor_bshd(q, ROTARY_F64, batch, seq, 1, dim, &args.q) == ROTARY_OK);
    positions.kind = (rotary_position_kind)kind;
    positions.data = data[kind];
    positions.count = streams * batch * seq;
    positions.streams = streams;
    CHECK(rotary_apply_positions(schedule, &args, &positions) == ROTARY_OK);
    for (t = 0; t < batch * seq; ++t) {
      for (j = 0; j < pairs; ++j) {
        const int stream = j < 2 ? 0 : j < 5 ? 1 : 2;
        const double p = kind == ROTARY_POSITIONS_F64 ? pos_f64[stream * batch * seq + t]
                                                      : (double)pos64[stream * batch * seq + t];
        const double phi = p * pow(1000000.0, -2.0 * (double)j / dim);
        const double a = before[t * dim + j], b = before[t * dim + j + pairs];
        const double limit = kF64PairBound * (fabs(a) + fabs(b)) + 1e-12;
        CHECK(fabs(q[t * dim + j] - (a * cos(phi) - b * sin(phi))) <= limit);
        CHECK(fabs(q[t * dim + j + pairs] - (a * sin(phi) + b * cos(phi))) <= limit);
      }
    }
  }
  rotary_schedule_free(schedule);
}

/* Bad positions and extension fields: named, nothing written. */
static void test_stream_errors(void) {
  enum { seq = 3, dim = 16 };
  const int64_t sections[3] = {2, 3, 3}, uneven[3] = {2, 3, 2};
  rotary_spec spec;
  rotary_spec_ext ext;
  rotary_schedule* schedule = NULL;
  rotary_apply_args args;
  rotary_positions positions;
  float q[seq * dim], before[seq * dim];
  int64_t pos[2 * seq] = {0, 1, 2, 0, 1, 2};
  double bad[3 * seq] = {0, 1, 2, 0, -1.5, 2, 0, 1, 2};
  int i;
  memset(&spec, 0, sizeof spec);
  memset(&ext, 0, sizeof ext);
  spec.head_dim = dim;
  ext.stream_layout = ROTARY_STREAMS_SECTIONS;
  ext.sections = uneven;
  ext.sections_count = 3;
  EXPECT_ERROR(rotary_schedule_from_spec_ext(&spec, &ext, -1, &schedule), "sections");
  CHECK(schedule == NULL);
  ext.stream_layout = (rotary_stream_layout)9;
  EXPECT_ERROR(rotary_schedule_from_spec_ext(&spec, &ext, -1, &schedule), "ext.stream_layout=9");
  ext.stream_layout = ROTARY_STREAMS_SECTIONS;
  ext.sections = NULL;
  EXPECT_ERROR(rotary_schedule_from_spec_ext(&spec, &ext, -1, &schedule), "ext.sections is NULL but");
  ext.sections = sections;
  CHECK(rotary_schedule_from_spec_ext(&spec, &ext, -1, &schedule) == ROTARY_OK);
  for (i = 0; i < seq * dim; ++i) q[i] = before[i] = next_value();
  memset(&args, 0, sizeof args);
  CHECK(rotary_tensor_bshd(q, ROTARY_F32, 1, seq, 1, dim, &args.q) == ROTARY_OK);
  positions.kind = ROTARY_POSITIONS_I64;
  positions.data = pos;
  positions.count = 2 * seq;
  positions.streams = 2;
  EXPECT_ERROR(rotary_apply_positions(schedule, &args, &positions), "positions has 2 streams but the schedule reads 3");
  positions.kind = ROTARY_POSITIONS_F64;
  positions.data = bad;
  positions.count = 3 * seq;
  positions.streams = 3;
  EXPECT_ERROR(rotary_apply_positions(schedule, &args, &positions), "positions[1][1]=-1.5 must be in [0, 2^31)");
  positions.kind = (rotary_position_kind)7;
  EXPECT_ERROR(rotary_apply_positions(schedule, &args, &positions), "positions.kind=7");
  positions.kind = ROTARY_POSITIONS_I64;
  positions.streams = 9;
  EXPECT_ERROR(rotary_apply_positions(schedule, &args, &positions), "positions streams=9 must be in [1, 8]");
  positions.streams = 3;
  args.offset = 4;
  EXPECT_ERROR(rotary_apply_positions(schedule, &args, &positions), "offset must be 0 when positions are given");
  CHECK(memcmp(q, before, sizeof q) == 0);
  rotary_schedule_free(schedule);
  CHECK(rotary_schedule_streams(NULL) == 0);
  CHECK(rotary_schedule_pair_stream(NULL, 0) == -1);
  /* proportional (Gemma 4) and a trailing rotated slice, through the extension */
  memset(&ext, 0, sizeof ext);
  spec.schedule = ROTARY_SCHEDULE_PROPORTIONAL;
  ext.partial_rotary_factor = 0.25;
  CHECK(rotary_schedule_from_spec_ext(&spec, &ext, -1, &schedule) == ROTARY_OK);
  CHECK(rotary_schedule_type_of(schedule) == ROTARY_SCHEDULE_PROPORTIONAL);
  CHECK(rotary_schedule_inv_freq(schedule)[1] > 0 && rotary_schedule_inv_freq(schedule)[2] == 0);
  rotary_schedule_free(schedule);
  memset(&ext, 0, sizeof ext);
  spec.schedule = ROTARY_SCHEDULE_DEFAULT;
  spec.rotary_dim = 8;
  ext.rotary_offset = 8;
  CHECK(rotary_schedule_from_spec_ext(&spec, &ext, -1, &schedule) == ROTARY_OK);
  CHECK(rotary_schedule_rotary_offset(schedule) == 8);
  rotary_schedule_free(schedule);
  ext.rotary_offset = 9;
  EXPECT_ERROR(rotary_schedule_from_spec_ext(&spec, &ext, -1, &schedule), "rotary_offset=9");
}

/* A config's layer types and vision tower through the _ex constructors. */
static void test_layer_type_and_vision(void) {
  rotary_schedule* schedule = NULL;
  CHECK(rotary_schedule_from_preset_ex("gemma-3-4b-it", "sliding_attention", 0, -1, &schedule) == ROTARY_OK);
  CHECK(rotary_schedule_type_of(schedule) == ROTARY_SCHEDULE_DEFAULT);
  CHECK(rotary_schedule_inv_freq(schedule)[1] == pow(10000.0, -2.0 / 256.0));
  rotary_schedule_free(schedule);
  CHECK(rotary_schedule_from_preset_ex("gemma-3-4b-it", NULL, 0, -1, &schedule) == ROTARY_OK);
  CHECK(rotary_schedule_type_of(schedule) == ROTARY_SCHEDULE_LINEAR);
  rotary_schedule_free(schedule);
  EXPECT_ERROR(rotary_schedule_from_preset_ex("gemma-3-4b-it", "chunked", 0, -1, &schedule), "chunked");
  CHECK(schedule == NULL);
  CHECK(rotary_schedule_from_preset_ex("qwen2.5-vl-7b-instruct", NULL, 1, -1, &schedule) == ROTARY_OK);
  CHECK(rotary_schedule_streams(schedule) == 2);
  rotary_schedule_free(schedule);
  CHECK(rotary_schedule_from_preset_ex("qwen2.5-vl-7b-instruct", "", 0, -1, &schedule) == ROTARY_OK);
  CHECK(rotary_schedule_streams(schedule) == 3);
  rotary_schedule_free(schedule);
  EXPECT_ERROR(rotary_schedule_from_hf_config_ex("{\"head_dim\": 8, \"num_attention_heads\": 1}", NULL, 2, -1,
                                                 &schedule),
               "vision=2");
}

/* xPos, written out from Sun et al.: pair i of q at position p scales by zeta_i^((p - c)/gamma), of
 * k by zeta_i^(-(p - c)/gamma), zeta_i = (2i + 0.4 r)/(1.4 r), on top of the rotation. */
static void test_xpos(void) {
  const rope r = {32, 32, 10000.0, 0};
  const double gamma = 64, center = 100;
  const int64_t position = 700, half = 16;
  rotary_schedule* plain = schedule_of(&r);
  rotary_schedule* xpos = NULL;
  float* q = random_floats(32);
  float* k = random_floats(32);
  float* q_in = copy_floats(q, 32);
  float* k_in = copy_floats(k, 32);
  rotary_apply_args args;
  int64_t i, role;
  CHECK(rotary_schedule_with_xpos(plain, gamma, center, &xpos) == ROTARY_OK);
  memset(&args, 0, sizeof args);
  CHECK(rotary_tensor_bshd(q, ROTARY_F32, 1, 1, 1, 32, &args.q) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(k, ROTARY_F32, 1, 1, 1, 32, &args.k) == ROTARY_OK);
  args.offset = position;
  CHECK(rotary_apply(xpos, &args) == ROTARY_OK);
  for (role = 0; role < 2; ++role) {
    const float* in = role == 0 ? q_in : k_in;
    const float* out = role == 0 ? q : k;
    for (i = 0; i < half; ++i) {
      const double zeta = (2.0 * (double)i + 0.4 * 32.0) / (1.4 * 32.0);
      const double t = ((double)position - center) / gamma;
      const double sigma = pow(zeta, role == 0 ? t : -t);
      const double phi = (double)position * pow(r.base, -2.0 * (double)i / 32.0);
      const double a = in[i], b = in[i + half];
      const double limit = 2 * kF32PairBound * sigma * (fabs(a) + fabs(b)) + kReferenceSlack;
      CHECK(fabs(out[i] - sigma * (a * cos(phi) - b * sin(phi))) <= limit);
      CHECK(fabs(out[i + half] - sigma * (a * sin(phi) + b * cos(phi))) <= limit);
    }
  }
  /* Beyond the reach 80 gamma / |ln(2/7)| ~ 4087 from the centre: refused, nothing written. */
  memcpy(q, q_in, 32 * sizeof *q);
  memset(&args.k, 0, sizeof args.k);
  args.offset = 4300;
  EXPECT_ERROR(rotary_apply(xpos, &args), "beyond xPos's reach");
  CHECK(memcmp(q, q_in, 32 * sizeof *q) == 0);
  rotary_schedule_free(xpos);
  xpos = (rotary_schedule*)1;
  EXPECT_ERROR(rotary_schedule_with_xpos(plain, -1.0, 0.0, &xpos), "xpos_scale_base=-1");
  CHECK(xpos == NULL);
  EXPECT_ERROR(rotary_schedule_with_xpos(plain, 512.0, NAN, &xpos), "xpos_center=nan");
  EXPECT_ERROR(rotary_schedule_with_xpos(NULL, 512.0, 0.0, &xpos), "schedule");
  /* A centre without a scale base would do nothing: refused, as Python and the CLI refuse it. */
  EXPECT_ERROR(rotary_schedule_with_xpos(plain, 0.0, 5.0, &xpos), "xpos_center=5");
  CHECK(xpos == NULL);
  free(q);
  free(k);
  free(q_in);
  free(k_in);
  rotary_schedule_free(plain);
}

/* ROTARY_UNDO is the true inverse of forward: with YaRN's attention factor g = 1 + 0.1 ln 4 and
 * xPos, forward then undo gives back q and k to a few float roundings, while ROTARY_INVERSE (the
 * transpose) leaves each pair scaled by (g sigma)^2. Undo with a table refuses g != 1. */
static void test_undo(void) {
  rotary_spec spec;
  rotary_schedule *yarn = NULL, *xpos = NULL;
  float* q = random_floats(64);
  float* k = random_floats(64);
  float* q_in = copy_floats(q, 64);
  float* k_in = copy_floats(k, 64);
  rotary_apply_args args;
  rotary_table* table = NULL;
  int64_t i, direction;
  memset(&spec, 0, sizeof spec);
  spec.head_dim = 32;
  spec.schedule = ROTARY_SCHEDULE_YARN;
  spec.factor = 4;
  spec.original_max_position = 4096;
  CHECK(rotary_schedule_from_spec(&spec, -1, &yarn) == ROTARY_OK);
  CHECK(rotary_schedule_with_xpos(yarn, 512.0, 1000.0, &xpos) == ROTARY_OK);
  for (direction = ROTARY_INVERSE; direction <= ROTARY_UNDO; ++direction) {
    double worst_q = 0, worst_k = 0;
    memcpy(q, q_in, 64 * sizeof *q);
    memcpy(k, k_in, 64 * sizeof *k);
    memset(&args, 0, sizeof args);
    CHECK(rotary_tensor_bshd(q, ROTARY_F32, 1, 2, 1, 32, &args.q) == ROTARY_OK);
    CHECK(rotary_tensor_bshd(k, ROTARY_F32, 1, 2, 1, 32, &args.k) == ROTARY_OK);
    args.offset = 3000;
    CHECK(rotary_apply(xpos, &args) == ROTARY_OK);
    args.inverse = (int)direction;
    CHECK(rotary_apply(xpos, &args) == ROTARY_OK);
    for (i = 0; i < 64; ++i) {
      worst_q = fmax(worst_q, fabs(q[i] - q_in[i]));
      worst_k = fmax(worst_k, fabs(k[i] - k_in[i]));
    }
    if (direction == ROTARY_UNDO) {
      /* |x| < 2, sigma^{+-1} < 4.2 at |p - c| = 2000: a few roundings of values below ~10. */
      CHECK(worst_q < 1e-5 && worst_k < 1e-5);
    } else {
      CHECK(worst_q > 1e-2 && worst_k > 1e-2); /* the transpose does not undo it */
    }
  }
  /* The table holds cos and sin times g: undo needs exact angles when g != 1. */
  CHECK(rotary_table_range(yarn, 0, 8, ROTARY_ANGLES_EXACT, &table) == ROTARY_OK);
  memcpy(q, q_in, 64 * sizeof *q);
  memset(&args, 0, sizeof args);
  CHECK(rotary_tensor_bshd(q, ROTARY_F32, 1, 2, 1, 32, &args.q) == ROTARY_OK);
  args.table = table;
  args.inverse = ROTARY_UNDO;
  EXPECT_ERROR(rotary_apply(yarn, &args), "undo with attention_factor=");
  CHECK(memcmp(q, q_in, 64 * sizeof *q) == 0);
  rotary_table_free(table);
  rotary_schedule_free(xpos);
  rotary_schedule_free(yarn);
  free(q);
  free(k);
  free(q_in);
  free(k_in);
}

/* rotary_rope: its angles (from its table, or on the fly beyond it) are the bits of rotary_apply
 * without a table (exact) and with a table of transformers' float32 angles (hf_float32); NULL
 * arguments, a table given and a bad mode are refused. */
static void test_rope_handle(void) {
  const rope r = {128, 128, 1000000.0, 0};
  enum { batch = 1, seq = 4, heads = 2, dim = 128 };
  const int64_t positions[batch * seq] = {0, 4097, 70000, 2147483647};
  const int64_t count = batch * seq * heads * dim;
  rotary_schedule* schedule = schedule_of(&r);
  rotary_rope* handle = NULL;
  rotary_table* hf_table = NULL;
  float* original = random_floats(count);
  float* a = copy_floats(original, count);
  float* b = copy_floats(original, count);
  rotary_apply_args args;
  rotary_positions pos;
  int mode;
  memset(&pos, 0, sizeof pos);
  pos.kind = ROTARY_POSITIONS_I64;
  pos.data = positions;
  pos.count = batch * seq;
  CHECK(rotary_rope_create(schedule, &handle) == ROTARY_OK);
  rotary_schedule_free(schedule); /* the Rope holds its own copy */
  schedule = schedule_of(&r);
  for (mode = ROTARY_ANGLES_EXACT; mode <= ROTARY_ANGLES_HF_FLOAT32; ++mode) {
    memcpy(a, original, (size_t)count * sizeof(float));
    memcpy(b, original, (size_t)count * sizeof(float));
    memset(&args, 0, sizeof args);
    CHECK(rotary_tensor_bshd(a, ROTARY_F32, batch, seq, heads, dim, &args.q) == ROTARY_OK);
    CHECK(rotary_rope_apply(handle, &args, &pos, mode) == ROTARY_OK);
    CHECK(rotary_tensor_bshd(b, ROTARY_F32, batch, seq, heads, dim, &args.q) == ROTARY_OK);
    if (mode == ROTARY_ANGLES_HF_FLOAT32) {
      CHECK(rotary_table_at(schedule, positions, batch * seq, ROTARY_ANGLES_HF_FLOAT32, &hf_table) == ROTARY_OK);
      args.table = hf_table;
    }
    CHECK(rotary_apply_positions(schedule, &args, &pos) == ROTARY_OK);
    CHECK(memcmp(a, b, (size_t)count * sizeof(float)) == 0);
    CHECK(memcmp(a, original, (size_t)count * sizeof(float)) != 0);
  }
  /* errors: nothing written */
  memcpy(a, original, (size_t)count * sizeof(float));
  memset(&args, 0, sizeof args);
  CHECK(rotary_tensor_bshd(a, ROTARY_F32, batch, seq, heads, dim, &args.q) == ROTARY_OK);
  expect_error(rotary_rope_apply(handle, &args, &pos, 7), "mode=7", "bad mode", __LINE__);
  args.table = hf_table;
  expect_error(rotary_rope_apply(handle, &args, &pos, ROTARY_ANGLES_EXACT), "args.table", "table", __LINE__);
  args.table = NULL;
  expect_error(rotary_rope_apply(NULL, &args, &pos, ROTARY_ANGLES_EXACT), "rope is NULL", "NULL rope", __LINE__);
  expect_error(rotary_rope_apply(handle, NULL, &pos, ROTARY_ANGLES_EXACT), "args is NULL", "NULL args", __LINE__);
  rotary_rope_free(handle);
  handle = (rotary_rope*)&count; /* any non-NULL value: a failed create sets it to NULL */
  expect_error(rotary_rope_create(NULL, &handle), "schedule is NULL", "NULL schedule", __LINE__);
  CHECK(handle == NULL);
  CHECK(memcmp(a, original, (size_t)count * sizeof(float)) == 0);
  rotary_rope_free(NULL);

  rotary_schedule_free(schedule);
  rotary_table_free(hf_table);
  free(original);
  free(a);
  free(b);
}

/* ---- fused operations: rope_store and qk_norm_rope against rotary_apply plus a scatter and a
 * quantiser written out here ---- */

/* OCP E4M3FN: code -> value (0x7f / 0xff NaN). */
static double e4m3_value(unsigned code) {
  const unsigned exponent = (code >> 3) & 15u, mantissa = code & 7u;
  const double magnitude = exponent == 0 ? (double)mantissa * ldexp(1.0, -9)
                                         : (1.0 + (double)mantissa / 8.0) * ldexp(1.0, (int)exponent - 7);
  return (code & 0x80u) ? -magnitude : magnitude;
}

/* Nearest code, ties to the even code (mantissa bit 0 clear), saturating to +-448, NaN kept. */
static uint8_t e4m3_encode(float x) {
  const unsigned sign = signbit(x) ? 0x80u : 0u;
  const double a = fabs((double)x);
  unsigned code, best = 0;
  double best_distance = INFINITY;
  if (isnan(x)) return (uint8_t)(sign | 0x7fu);
  if (a >= 448.0) return (uint8_t)(sign | 0x7eu);
  for (code = 0; code <= 0x7eu; ++code) {
    const double distance = fabs(e4m3_value(code) - a);
    if (distance < best_distance || (distance == best_distance && (code & 1u) == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return (uint8_t)(sign | best);
}

/* The element offset of (slot, h, d) in a cache view, as rotary.h writes it out. */
static int64_t cache_at(const rotary_cache_view* c, int64_t slot, int64_t h, int64_t d) {
  const int64_t block_size = c->block_size == 0 ? 1 : c->block_size;
  return (slot / block_size) * c->strides[0] + (slot % block_size) * c->strides[1] + h * c->strides[2] +
         (c->offset + d) * c->strides[3];
}

/* Reference scatter of src [tokens, heads, head_dim] (contiguous, element_size bytes each) into the
 * cache at the slots: the bytes as they are (same dtype), or, for an e4m3 cache (src f32), the code
 * of x / scale (divide) or x * scale (multiply) computed in float. */
static void scatter(const rotary_cache_view* c, void* cache, const void* src, size_t element_size,
                    const int64_t* slots, int64_t tokens, float scale, int multiply) {
  int64_t t, h, d;
  for (t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    for (h = 0; h < c->heads; ++h) {
      for (d = 0; d < c->head_dim; ++d) {
        const int64_t from = (t * c->heads + h) * c->head_dim + d, to = cache_at(c, slots[t], h, d);
        if (c->dtype == ROTARY_FP8_E4M3) {
          const float x = ((const float*)src)[from];
          const float y = multiply ? x * scale : x / scale;
          ((uint8_t*)cache)[to] = e4m3_encode(y);
        } else {
          memcpy((char*)cache + (size_t)to * element_size, (const char*)src + (size_t)from * element_size,
                 element_size);
        }
      }
    }
  }
}

/* Random finite halves with exponents 2^-2 .. 2^1 (bits: f16 data need no conversion here). */
static uint16_t* random_halves(int64_t count) {
  uint16_t* values = malloc((size_t)count * sizeof *values);
  int64_t i;
  if (values == NULL) abort();
  for (i = 0; i < count; ++i) {
    lcg_state = lcg_state * 1664525u + 1013904223u;
    values[i] = (uint16_t)(((lcg_state >> 31) << 15) | ((13u + ((lcg_state >> 20) & 3u)) << 10) |
                           ((lcg_state >> 8) & 0x3ffu));
  }
  return values;
}

static void* copy_bytes(const void* from, size_t bytes) {
  void* to = malloc(bytes);
  if (to == NULL) abort();
  memcpy(to, from, bytes);
  return to;
}

/* One rope_store case: q [1, 6, 4, 16], k and v [1, 6, 2, 16] of `dtype`, k into an NHD cache and
 * v into an HND cache (3 blocks of 4 slots), token 1 skipped (-1), against rotary_apply and the
 * scatter above on caches poisoned with 0x5a bytes. */
static void rope_store_case(rotary_dtype dtype, rotary_dtype cache_dtype, int i32_slots) {
  const rope r = {16, 16, 10000.0, 0};
  const int64_t seq = 6, q_heads = 4, kv_heads = 2, d = 16, blocks = 3, block_size = 4;
  const int64_t q_count = seq * q_heads * d, kv_count = seq * kv_heads * d, cache_count = blocks * block_size * kv_heads * d;
  const int64_t slots[6] = {9, -1, 0, 4, 11, 5};
  const int32_t slots32[6] = {9, -1, 0, 4, 11, 5};
  const size_t element = dtype == ROTARY_F32 ? 4 : 2, cache_element = cache_dtype == ROTARY_FP8_E4M3 ? 1 : element;
  const float k_scale = 0.005f, v_scale = 4.0f;
  rotary_schedule* schedule = schedule_of(&r);
  void *q, *k, *v, *q_orig, *q_ref, *k_ref, *k_orig, *k_cache, *v_cache, *k_expect, *v_expect;
  rotary_apply_args ref;
  rotary_rope_store_args args;
  if (dtype == ROTARY_F32) {
    q = random_floats(q_count);
    k = random_floats(kv_count);
    v = random_floats(kv_count);
    ((float*)k)[3] = 60.0f; /* / 0.005 saturates e4m3 */
  } else {
    q = random_halves(q_count);
    k = random_halves(kv_count);
    v = random_halves(kv_count);
  }
  q_ref = copy_bytes(q, (size_t)q_count * element);
  q_orig = copy_bytes(q, (size_t)q_count * element);
  k_ref = copy_bytes(k, (size_t)kv_count * element);
  k_orig = copy_bytes(k, (size_t)kv_count * element);
  k_cache = malloc((size_t)cache_count * cache_element);
  v_cache = malloc((size_t)cache_count * cache_element);
  k_expect = malloc((size_t)cache_count * cache_element);
  v_expect = malloc((size_t)cache_count * cache_element);
  if (!k_cache || !v_cache || !k_expect || !v_expect) abort();
  memset(k_cache, 0x5a, (size_t)cache_count * cache_element);
  memset(v_cache, 0x5a, (size_t)cache_count * cache_element);
  memset(k_expect, 0x5a, (size_t)cache_count * cache_element);
  memset(v_expect, 0x5a, (size_t)cache_count * cache_element);

  /* The composition: rotary_apply in place on copies, then the scatter. */
  memset(&ref, 0, sizeof ref);
  CHECK(rotary_tensor_bshd(q_ref, dtype, 1, seq, q_heads, d, &ref.q) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(k_ref, dtype, 1, seq, kv_heads, d, &ref.k) == ROTARY_OK);
  ref.offset = 100;
  CHECK(rotary_apply(schedule, &ref) == ROTARY_OK);

  /* Zeroed args: the defaults (scale count 0 = 1, divide, block_size as the constructors set it). */
  memset(&args, 0, sizeof args);
  CHECK(rotary_tensor_bshd(q, dtype, 1, seq, q_heads, d, &args.rope.q) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(k, dtype, 1, seq, kv_heads, d, &args.rope.k) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(v, dtype, 1, seq, kv_heads, d, &args.cache.v) == ROTARY_OK);
  args.rope.offset = 100;
  args.cache.slots.kind = i32_slots ? ROTARY_SLOTS_I32 : ROTARY_SLOTS_I64;
  args.cache.slots.data = i32_slots ? (const void*)slots32 : (const void*)slots;
  args.cache.slots.count = seq;
  CHECK(rotary_cache_view_nhd(k_cache, cache_dtype, blocks, block_size, kv_heads, d, 0, 0, &args.cache.k_cache) ==
        ROTARY_OK);
  CHECK(rotary_cache_view_hnd(v_cache, cache_dtype, blocks, block_size, kv_heads, d, 0, 0, &args.cache.v_cache) ==
        ROTARY_OK);
  if (cache_dtype == ROTARY_FP8_E4M3) {
    args.cache.k_quant.scale = &k_scale;
    args.cache.v_quant.scale = &v_scale;
    args.cache.v_quant.mode = ROTARY_SCALE_MULTIPLY;
  }
  scatter(&args.cache.k_cache, k_expect, k_ref, element, slots, seq, k_scale, 0);
  scatter(&args.cache.v_cache, v_expect, v, element, slots, seq, v_scale, 1);

  /* Bad calls first: each fails naming its argument and leaves q, k and the caches as they were. */
  {
    const int64_t duplicate[6] = {9, -1, 0, 4, 0, 5};
    const int64_t beyond[6] = {9, -1, 12, 4, 11, 5};
    rotary_rope_store_args bad = args;
    EXPECT_ERROR(rotary_rope_store(schedule, NULL), "args is NULL");
    EXPECT_ERROR(rotary_rope_store(NULL, &args), "schedule is NULL");
    bad.cache.slots.kind = ROTARY_SLOTS_I64;
    bad.cache.slots.data = duplicate;
    EXPECT_ERROR(rotary_rope_store(schedule, &bad), "slots[4]=0 repeats slots[2]");
    bad.cache.slots.data = beyond;
    EXPECT_ERROR(rotary_rope_store(schedule, &bad), "slots[2]=12 is beyond k_cache's capacity 12");
    bad.cache.slots.data = NULL;
    EXPECT_ERROR(rotary_rope_store(schedule, &bad), "slots.data is NULL");
    bad = args;
    memset(&bad.cache.slots.kind, 0x7, 1);
    EXPECT_ERROR(rotary_rope_store(schedule, &bad), "slots.kind=7");
    bad = args;
    bad.cache.k_cache.data = NULL;
    EXPECT_ERROR(rotary_rope_store(schedule, &bad), "k_cache.data is null");
    CHECK(memcmp(q, q_orig, (size_t)q_count * element) == 0);
    CHECK(memcmp(k, k_orig, (size_t)kv_count * element) == 0);
    {
      unsigned char poison[1];
      int64_t i, untouched = 1;
      memset(poison, 0x5a, 1);
      for (i = 0; i < cache_count * (int64_t)cache_element; ++i) {
        untouched &= ((unsigned char*)k_cache)[i] == poison[0] && ((unsigned char*)v_cache)[i] == poison[0];
      }
      CHECK(untouched);
    }
  }

  CHECK(rotary_rope_store(schedule, &args) == ROTARY_OK);
  CHECK(memcmp(q, q_ref, (size_t)q_count * element) == 0);       /* q rotated in place, apply's bits */
  CHECK(memcmp(k, k_orig, (size_t)kv_count * element) == 0);     /* k read only */
  CHECK(memcmp(k_cache, k_expect, (size_t)cache_count * cache_element) == 0); /* skipped and free slots poisoned */
  CHECK(memcmp(v_cache, v_expect, (size_t)cache_count * cache_element) == 0);
  if (cache_dtype == ROTARY_FP8_E4M3) {
    /* k's 60 (token 0, channel 3) rotated and divided by 0.005 is beyond 448: some code saturates */
    int64_t i, saturated = 0;
    for (i = 0; i < cache_count; ++i) saturated += (((uint8_t*)k_cache)[i] & 0x7fu) == 0x7eu;
    CHECK(saturated > 0);
  }

  rotary_schedule_free(schedule);
  free(q); free(k); free(v); free(q_orig); free(q_ref); free(k_ref); free(k_orig);
  free(k_cache); free(v_cache); free(k_expect); free(v_expect);
}

/* qk_norm_rope (f32, llama rounding, weight per head) against the RMSNorm written out as fused.hpp
 * defines it, then rotary_apply. */
static void qk_norm_rope_case(void) {
  const rope r = {16, 16, 10000.0, 0};
  const int64_t seq = 3, q_heads = 2, kv_heads = 1, d = 16;
  const int64_t q_count = seq * q_heads * d, k_count = seq * kv_heads * d;
  const float eps = 1e-6f;
  rotary_schedule* schedule = schedule_of(&r);
  float* q = random_floats(q_count);
  float* k = random_floats(k_count);
  float* q_weight = random_floats(d);
  float* q_ref = copy_floats(q, q_count);
  float* k_ref = copy_floats(k, k_count);
  rotary_apply_args ref;
  rotary_qk_norm_rope_args args;
  int64_t head, i;
  /* q times its weight, k without one */
  for (head = 0; head < seq * (q_heads + kv_heads); ++head) {
    float* x = head < seq * q_heads ? q_ref + head * d : k_ref + (head - seq * q_heads) * d;
    double sum = 0.0;
    float mean, rr;
    for (i = 0; i < d; ++i) sum += (double)x[i] * (double)x[i];
    mean = (float)(sum / (double)d);
    rr = (float)(1.0 / sqrt((double)(float)(mean + eps)));
    for (i = 0; i < d; ++i) {
      const float y = x[i] * rr;
      x[i] = head < seq * q_heads ? y * q_weight[i] : y;
    }
  }
  memset(&ref, 0, sizeof ref);
  CHECK(rotary_tensor_bshd(q_ref, ROTARY_F32, 1, seq, q_heads, d, &ref.q) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(k_ref, ROTARY_F32, 1, seq, kv_heads, d, &ref.k) == ROTARY_OK);
  ref.offset = 7;
  CHECK(rotary_apply(schedule, &ref) == ROTARY_OK);

  memset(&args, 0, sizeof args); /* eps 0: 1e-6; norm then rope, llama rounding, per head */
  CHECK(rotary_tensor_bshd(q, ROTARY_F32, 1, seq, q_heads, d, &args.rope.q) == ROTARY_OK);
  CHECK(rotary_tensor_bshd(k, ROTARY_F32, 1, seq, kv_heads, d, &args.rope.k) == ROTARY_OK);
  args.rope.offset = 7;
  args.q_weight.data = q_weight;
  args.q_weight.dtype = ROTARY_F32;
  args.q_weight.count = d;
  EXPECT_ERROR(rotary_qk_norm_rope(schedule, NULL), "args is NULL");
  {
    rotary_qk_norm_rope_args bad = args;
    memset(&bad.order, 9, 1);
    EXPECT_ERROR(rotary_qk_norm_rope(schedule, &bad), "order=9");
  }
  CHECK(rotary_qk_norm_rope(schedule, &args) == ROTARY_OK);
  CHECK(memcmp(q, q_ref, (size_t)q_count * sizeof *q) == 0);
  CHECK(memcmp(k, k_ref, (size_t)k_count * sizeof *k) == 0);
  rotary_schedule_free(schedule);
  free(q); free(k); free(q_weight); free(q_ref); free(k_ref);
}

/* rerotate_cache by +delta then -delta (f32, exact angles) returns each key within a few ulps; the
 * skipped slot and an untouched one keep their bits. Page table -> slots. */
static void rerotate_and_page_table_case(void) {
  const rope r = {16, 16, 10000.0, 0};
  const int64_t slots[3] = {2, -1, 5}, delta[3] = {40, 7, 40}, back[3] = {-40, -7, -40};
  float* cache = random_floats(8 * 16);
  float* before = copy_floats(cache, 8 * 16);
  rotary_schedule* schedule = schedule_of(&r);
  rotary_rerotate_cache_args args;
  int64_t i, close = 1, out[3] = {0, 0, 0};
  const int32_t kv_indices[3] = {4, 1, 7}, kv_indptr[3] = {0, 2, 3}, batch[3] = {0, -1, 1}, pos[3] = {5, 0, 2};
  memset(&args, 0, sizeof args);
  CHECK(rotary_cache_view_nhd(cache, ROTARY_F32, 2, 4, 1, 16, 0, 0, &args.cache) == ROTARY_OK);
  args.slots.data = slots;
  args.slots.count = 3;
  args.delta = delta;
  CHECK(rotary_rerotate_cache(schedule, &args) == ROTARY_OK);
  CHECK(memcmp(cache + 2 * 16, before + 2 * 16, 16 * sizeof *cache) != 0);
  args.delta = back;
  CHECK(rotary_rerotate_cache(schedule, &args) == ROTARY_OK);
  for (i = 0; i < 8 * 16; ++i) close &= fabs((double)cache[i] - (double)before[i]) <= 1e-5;
  CHECK(close);
  for (i = 0; i < 8; ++i) {
    if (i != 2 && i != 5) CHECK(memcmp(cache + i * 16, before + i * 16, 16 * sizeof *cache) == 0);
  }
  EXPECT_ERROR(rotary_rerotate_cache(schedule, NULL), "args is NULL");
  {
    /* Raw keys in transformers' float32 numerics: computed on the fly, the bits of a
     * ROTARY_ANGLES_HF_FLOAT32 table's rows, unlike exact angles at a large position. */
    const int64_t raw_pos[3] = {100000, 0, 70001};
    rotary_positions positions;
    rotary_table* hf = NULL;
    float* a = copy_floats(before, 8 * 16);
    float* b = copy_floats(before, 8 * 16);
    float* c = copy_floats(before, 8 * 16);
    memset(&positions, 0, sizeof positions);
    positions.kind = ROTARY_POSITIONS_I64;
    positions.data = raw_pos;
    positions.count = 3;
    args.mode = ROTARY_REROTATE_RAW;
    args.delta = NULL;
    args.positions = &positions;
    args.numerics = ROTARY_ANGLES_HF_FLOAT32;
    CHECK(rotary_cache_view_nhd(a, ROTARY_F32, 2, 4, 1, 16, 0, 0, &args.cache) == ROTARY_OK);
    CHECK(rotary_rerotate_cache(schedule, &args) == ROTARY_OK);
    CHECK(rotary_table_range(schedule, 0, 100001, ROTARY_ANGLES_HF_FLOAT32, &hf) == ROTARY_OK);
    CHECK(rotary_cache_view_nhd(b, ROTARY_F32, 2, 4, 1, 16, 0, 0, &args.cache) == ROTARY_OK);
    args.numerics = ROTARY_ANGLES_EXACT;
    args.table = hf;
    CHECK(rotary_rerotate_cache(schedule, &args) == ROTARY_OK);
    CHECK(memcmp(a, b, 8 * 16 * sizeof *a) == 0);
    args.table = NULL;
    CHECK(rotary_cache_view_nhd(c, ROTARY_F32, 2, 4, 1, 16, 0, 0, &args.cache) == ROTARY_OK);
    CHECK(rotary_rerotate_cache(schedule, &args) == ROTARY_OK);
    CHECK(memcmp(a + 2 * 16, c + 2 * 16, 16 * sizeof *a) != 0);
    args.numerics = (rotary_angle_mode)7;
    EXPECT_ERROR(rotary_rerotate_cache(schedule, &args), "numerics=7 is not ROTARY_ANGLES_EXACT");
    args.mode = ROTARY_REROTATE_DELTA;
    args.delta = delta;
    args.positions = NULL;
    args.numerics = ROTARY_ANGLES_HF_FLOAT32;
    EXPECT_ERROR(rotary_rerotate_cache(schedule, &args), "numerics=hf_float32 is for raw mode");
    rotary_table_free(hf);
    free(a);
    free(b);
    free(c);
  }
  /* request 0 pages {4, 1}, request 1 page {7}; block 4 */
  CHECK(rotary_slots_from_page_table(kv_indices, 3, kv_indptr, 3, batch, pos, 3, 4, out) == ROTARY_OK);
  CHECK(out[0] == 1 * 4 + 1 && out[1] == -1 && out[2] == 7 * 4 + 2);
  EXPECT_ERROR(rotary_slots_from_page_table(kv_indices, 3, kv_indptr, 3, batch, pos, 3, 4, NULL), "slots_out is NULL");
  rotary_schedule_free(schedule);
  free(cache); free(before);
}

static void test_fused_operations(void) {
  rope_store_case(ROTARY_F32, ROTARY_F32, 0);
  rope_store_case(ROTARY_F16, ROTARY_F16, 1);
  rope_store_case(ROTARY_F32, ROTARY_FP8_E4M3, 0);
  qk_norm_rope_case();
  rerotate_and_page_table_case();
}

int main(void) {
  test_half_in_place_then_inverse();
  test_interleaved_out_of_place_int32_positions();
  test_bhsd_int64_positions_reference_backend();
  test_f64();
  test_table();
  test_spec_fields();
  test_longrope_factor_lists();
  test_hf_config_and_presets();
  test_model_rotating_backward();
  test_constructor_errors();
  test_apply_errors();
  test_absent_and_empty_views();
  test_null_objects();
  test_last_error_per_thread();
  test_version();
  test_mrope_streams_and_position_kinds();
  test_stream_errors();
  test_layer_type_and_vision();
  test_xpos();
  test_undo();
  test_rope_handle();
  test_fused_operations();
  if (failures != 0) {
    fprintf(stderr, "test_c_api: %d check(s) failed\n", failures);
    return 1;
  }
  printf("test_c_api: all checks passed\n");
  return 0;
}
