// libFuzzer target: config.json resolution, then the schedule it implies. Any input must either
// resolve or throw rotary::Error with a short one-line message; never crash, hang or read out of
// bounds. The seeds (corpus/config) cover real configs, wrappers (text_config), rope_parameters per
// layer type, NoPE layers (Llama 4, SmolLM3), refused multimodal fields and nesting near the limit.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const rotary::ModelRope m = rotary::read_hf_config(std::string_view(reinterpret_cast<const char*>(data), size));
    for (const std::string& note : m.notes) check_message(note);
    if (m.rope_layers.size() > (size_t{1} << 20)) std::abort();
    // Every resolution path's schedule: short and long sequences (dynamic, longrope switch at L).
    (void)rotary::make_schedule(m.spec);
    (void)rotary::make_schedule(m.spec, 100000);
    (void)rotary::make_schedule(m.spec, rotary::max_position_limit);
  } catch (const rotary::Error& e) {
    check_message(e.what());
  }
  return 0;
}
