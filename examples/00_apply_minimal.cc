// The smallest use of rotary, the program the README shows: Llama-3.1-8B's RoPE applied in place
// to q and k of a batch of two sequences in bfloat16, each token at its own position.
#include <rotary/rotary.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

// bfloat16 is the upper half of a float32 (1.0 is exact in both).
static uint16_t to_bf16(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

static float from_bf16(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float x = 0;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

int main() {
  const int64_t batch = 2, seq = 16;
  std::vector<uint16_t> q_memory(batch * seq * 32 * 128, to_bf16(1.0f));
  std::vector<uint16_t> k_memory(batch * seq * 8 * 128, to_bf16(1.0f));
  void* q = q_memory.data();
  void* k = k_memory.data();
  // Row 0 is a prefill at 0..15; row 1 continues a sequence that already holds 4000 tokens.
  std::vector<int64_t> positions(batch * seq);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) positions[b * seq + s] = b * 4000 + s;
  }

  const rotary::Schedule schedule = rotary::make_schedule(rotary::Spec{
      .head_dim = 128, .base = 500000.0, .pairing = rotary::Pairing::half,
      .schedule = rotary::ScheduleType::llama3, .factor = 8.0, .original_max_position = 8192,
      .low_freq_factor = 1.0, .high_freq_factor = 4.0});
  const rotary::Table table = rotary::Table::range(schedule, 0, 131072);   // optional
  rotary::apply(schedule, {
      .q = rotary::TensorView::bshd(q, rotary::DType::bf16, batch, seq, 32, 128),
      .k = rotary::TensorView::bshd(k, rotary::DType::bf16, batch, seq, 8, 128),
      .positions = rotary::Positions::per_token(positions),  // or Positions::sequential(offset)
      .table = &table});                                      // or nullptr: exact angles on the fly

  // Channel 0 of a head at position p is now cos(p) - sin(p) (pair 0 turns 1 rad per token).
  const int64_t token = 1 * seq + 15;  // row 1, token 15: position 4015
  std::printf("q[row 1, token 15, head 0, channel 0] = %.4f\n",
              from_bf16(q_memory[token * 32 * 128]));
  return 0;
}
