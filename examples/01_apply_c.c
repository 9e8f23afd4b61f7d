/* rotary from C (rotary/rotary.h): a preset's schedule, q and k rotated in place at a decode
 * offset, then rotated back; prints the round-trip error. Exit status 0 when it is tiny. */
#include <rotary/rotary.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
  enum { batch = 1, seq = 4, q_heads = 32, k_heads = 8, head_dim = 128 };
  static float q[batch * seq * q_heads * head_dim], k[batch * seq * k_heads * head_dim];
  static float q_original[sizeof q / sizeof q[0]];
  rotary_schedule* schedule = NULL;
  rotary_apply_args args = {0};
  double worst = 0;
  size_t i;

  for (i = 0; i < sizeof q / sizeof q[0]; ++i) q[i] = q_original[i] = (float)(i % 7) - 3.0f;
  for (i = 0; i < sizeof k / sizeof k[0]; ++i) k[i] = 1.0f;

  if (rotary_schedule_from_preset("llama-3.1-8b", -1, &schedule) != ROTARY_OK ||
      rotary_tensor_bshd(q, ROTARY_F32, batch, seq, q_heads, head_dim, &args.q) != ROTARY_OK ||
      rotary_tensor_bshd(k, ROTARY_F32, batch, seq, k_heads, head_dim, &args.k) != ROTARY_OK) {
    fprintf(stderr, "rotary: %s\n", rotary_last_error());
    return 2;
  }
  args.offset = 4096; /* the tokens after a 4096-token prompt */
  if (rotary_apply(schedule, &args) != ROTARY_OK) {
    fprintf(stderr, "rotary: %s\n", rotary_last_error());
    return 2;
  }
  args.inverse = ROTARY_INVERSE;
  if (rotary_apply(schedule, &args) != ROTARY_OK) {
    fprintf(stderr, "rotary: %s\n", rotary_last_error());
    return 2;
  }
  for (i = 0; i < sizeof q / sizeof q[0]; ++i) {
    worst = fmax(worst, fabs((double)(q[i] - q_original[i])));
  }
  printf("rotary %s from C: head_dim=%lld, round-trip error %.3g\n", rotary_version(),
         (long long)rotary_schedule_head_dim(schedule), worst);
  rotary_schedule_free(schedule);
  return worst < 1e-5 ? EXIT_SUCCESS : EXIT_FAILURE;
}
