// The smallest use of rotary: Llama-3.1-8B's RoPE applied to q and k of a prefill, in place.
#include <rotary/rotary.hpp>

#include <cstdio>
#include <vector>

int main() {
  const rotary::Spec spec{.head_dim = 128,
                          .base = 500000.0,
                          .pairing = rotary::Pairing::half,
                          .schedule = rotary::ScheduleType::llama3,
                          .factor = 8.0,
                          .original_max_position = 8192,
                          .low_freq_factor = 1.0,
                          .high_freq_factor = 4.0};
  const rotary::Schedule schedule = rotary::make_schedule(spec);
  const rotary::Table table = rotary::Table::range(schedule, 0, 4096);  // optional: cache angles

  const int64_t seq = 16, q_heads = 32, kv_heads = 8, head_dim = 128;
  std::vector<float> q(seq * q_heads * head_dim, 1.0f), k(seq * kv_heads * head_dim, 1.0f);
  rotary::apply(schedule,
                {.q = rotary::TensorView::bshd(q.data(), rotary::DType::f32, 1, seq, q_heads, head_dim),
                 .k = rotary::TensorView::bshd(k.data(), rotary::DType::f32, 1, seq, kv_heads, head_dim),
                 .positions = rotary::Positions::sequential(/*offset=*/0),
                 .table = &table});
  std::printf("q[token 15, head 0, channel 0] = %.7f\n", q[15 * q_heads * head_dim]);
  return 0;
}
