// libFuzzer target: config.json resolution, then the schedule it implies. Any input must either
// resolve or throw rotary::Error with a short one-line message; never crash, hang or read out of
// bounds. The seeds (corpus/config) cover real configs, wrappers (text_config), rope_parameters per
// layer type, NoPE layers (Llama 4, SmolLM3), M-RoPE sections, vision towers and nesting near the
// limit. Each layer type the config names, and its vision tower, resolve too.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "rotary/error.hpp"
#include "rotary/hf_config.hpp"
#include "rotary/schedule.hpp"

namespace {

// Messages (errors and notes) echo at most ~100 characters of any one value: a few of them, plus
// the fixed text, stay far below this.
constexpr size_t kMaxMessage = 2000;

void check_message(std::string_view message) {
  if (message.empty() || message.size() > kMaxMessage || message.find('\n') != std::string_view::npos ||
      message.find('\0') != std::string_view::npos) {
    std::abort();
  }
}

// One resolution and the schedules it implies; errors must be short single lines.
void resolve(std::string_view text, const rotary::ReadOptions& options) {
  try {
    const rotary::ModelRope m = rotary::read_hf_config(text, options);
    for (const std::string& note : m.notes) check_message(note);
    if (m.rope_layers.size() > (size_t{1} << 20)) std::abort();
    // Every resolution path's schedule: short and long sequences (dynamic, longrope switch at L).
    (void)rotary::make_schedule(m.spec);
    (void)rotary::make_schedule(m.spec, 100000);
    (void)rotary::make_schedule(m.spec, rotary::max_position_limit);
  } catch (const rotary::Error& e) {
    check_message(e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  resolve(text, {});
  resolve(text, {.vision = true});
  try {
    const std::vector<std::string> types = rotary::layer_types(text);
    if (types.empty()) std::abort();
    // The first few: a config naming thousands of types would otherwise make one input quadratic.
    for (size_t i = 0; i < types.size() && i < 4; ++i) resolve(text, {.layer_type = types[i]});
  } catch (const rotary::Error& e) {
    check_message(e.what());
  }
  return 0;
}
