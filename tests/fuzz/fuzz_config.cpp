// libFuzzer target: config.json resolution, then the schedule it implies. Any input must either
// resolve or throw rotary::Error; never crash, hang or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "rotary/error.hpp"
#include "rotary/hf_config.hpp"
#include "rotary/schedule.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const rotary::ModelRope m = rotary::read_hf_config(std::string_view(reinterpret_cast<const char*>(data), size));
    (void)rotary::make_schedule(m.spec, 100000);
  } catch (const rotary::Error&) {
  }
  return 0;
}
