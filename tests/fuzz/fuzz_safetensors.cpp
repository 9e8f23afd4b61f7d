// libFuzzer target: the .safetensors reader, and a write/read round trip of whatever it accepts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "rotary/error.hpp"
#include "tensor_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto file = rotary::cli::parse_safetensors(std::string_view(reinterpret_cast<const char*>(data), size));
    const auto again = rotary::cli::parse_safetensors(rotary::cli::format_safetensors(file));
    if (again.tensors.size() != file.tensors.size()) std::abort();
  } catch (const rotary::Error&) {
  }
  return 0;
}
