// libFuzzer target: the .safetensors reader, and a write/read round trip of whatever it accepts
// (same tensors, same order, same bytes, same metadata).
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
    if (again.tensors.size() != file.tensors.size() || again.metadata != file.metadata) std::abort();
    for (size_t i = 0; i < file.tensors.size(); ++i) {
      const auto& a = file.tensors[i];
      const auto& b = again.tensors[i];
      if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.data != b.data) std::abort();
    }
  } catch (const rotary::Error&) {
  }
  return 0;
}
