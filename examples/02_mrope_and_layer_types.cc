// The README's multi-axis examples: Qwen2-VL's M-RoPE (each pair driven by the temporal, height or
// width position of its token) and Gemma 3's two layer types (sliding and full attention).
#include <rotary/rotary.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

int main() {
  // M-RoPE: the preset's mrope_section [16, 24, 24] maps pairs 0-15 to stream 0 (time), 16-39 to
  // stream 1 (height), 40-63 to stream 2 (width).
  const rotary::ModelRope qwen = rotary::load_preset("qwen2-vl-7b-instruct");
  const rotary::Schedule mrope = rotary::make_schedule(qwen.spec);
  const int64_t seq = 6, heads = 28, head_dim = mrope.head_dim;
  std::vector<float> q(seq * heads * head_dim, 1.0f);
  // position_ids [3, batch = 1, seq]: 2 text tokens, a 2x2 image grid, 1 more text token
  // (what rotary.mrope.mrope_positions builds in Python).
  const std::vector<int32_t> positions = {0, 1, 2, 2, 2, 2,    // time
                                          0, 1, 2, 2, 3, 3,    // height
                                          0, 1, 2, 3, 2, 3};   // width
  rotary::apply(mrope, {.q = rotary::TensorView::bshd(q.data(), rotary::DType::f32, 1, seq, heads, head_dim),
                        .positions = rotary::Positions::per_token(positions, /*streams=*/3)});
  std::printf("qwen2-vl: %s pairing, %d streams, pair 16 reads stream %d\n",
              std::string(rotary::to_string(mrope.channel_layout())).c_str(), mrope.streams, mrope.stream_of(16));

  // Per layer type: Gemma 3 rotates its sliding-window layers with base 1e4 and its full-attention
  // layers with base 1e6 and linear x8; each resolves to its own schedule.
  for (const std::string& type : rotary::layer_types(rotary::preset_config("gemma-3-4b-it"))) {
    const rotary::ModelRope layer = rotary::load_preset("gemma-3-4b-it", {.layer_type = type});
    const rotary::Schedule schedule = rotary::make_schedule(layer.spec);
    std::printf("gemma-3 %s: base %g, %s, inv_freq[1] = %.6g\n", type.c_str(), layer.spec.base,
                std::string(rotary::to_string(schedule.type)).c_str(), schedule.inv_freq[1]);
  }
  return 0;
}
