// `rotary info --build`: the library's version, the CPU kernels' Highway target on this machine
// and, when built with them, the CUDA kernels' architectures and whether a device can run them.
#include <fmt/format.h>

#include <ostream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "rotary/build.hpp"
#if ROTARY_CLI_CUDA
#include "rotary/cuda.hpp"
#endif

namespace rotary::cli {
namespace {

std::string joined(const std::vector<std::string>& items, const char* separator) {
  std::string text;
  for (const std::string& item : items) {
    if (!text.empty()) text.append(separator);
    text.append(item);
  }
  return text;
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string json_list(const std::vector<std::string>& items) {
  std::vector<std::string> quoted;
  for (const std::string& item : items) quoted.push_back(json_string(item));
  return fmt::format("[{}]", joined(quoted, ", "));
}

// A CUDA version number (13000) as "13.0"; 0 (no driver) as "none".
std::string cuda_version(int version) {
  return version == 0 ? "none" : fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}
std::string json_version(int version) { return version == 0 ? "null" : json_string(cuda_version(version)); }
std::string json_optional(const std::string& text) { return text.empty() ? "null" : json_string(text); }

}  // namespace

void print_build_info(bool json, std::ostream& out) {
  const BuildInfo cpu = build_info();
#if ROTARY_CLI_CUDA
  const cuda::BuildInfo gpu = cuda::build_info();
  const bool compiled = true;
#else
  struct {
    std::vector<std::string> architectures;
    int runtime_version = 0, driver_version = 0, devices = 0;
    std::string device;
    bool usable = false;
    std::string why_not;
  } gpu;
  const bool compiled = false;
#endif
  if (json) {
    out << fmt::format("{{\"version\": {}, \"cpu_target\": {}, \"cpu_targets\": {}, \"backends\": {}, "
                       "\"cuda\": {{\"compiled\": {}",
                       json_string(cpu.version), json_string(cpu.cpu_target), json_list(cpu.cpu_targets),
                       json_list(cpu.backends), compiled);
    if (!compiled) out << ", \"why_not\": \"this rotary was built without CUDA kernels\"";
    if (compiled) {
      out << fmt::format(", \"architectures\": {}, \"runtime\": {}, \"driver\": {}, \"devices\": {}, \"device\": {}, "
                         "\"usable\": {}, \"why_not\": {}",
                         json_list(gpu.architectures), json_version(gpu.runtime_version),
                         json_version(gpu.driver_version), gpu.devices, json_optional(gpu.device), gpu.usable,
                         json_optional(gpu.why_not));
    }
    out << "}}\n";
    return;
  }
  out << fmt::format("rotary {}\n", cpu.version);
  out << fmt::format("CPU kernels: Highway target {} on this machine (built: {})\n", cpu.cpu_target,
                     joined(cpu.cpu_targets, ", "));
  out << fmt::format("backends: {} (rotary::Backend; CUDA below, through rotary::cuda::apply)\n",
                     joined(cpu.backends, ", "));
  if (!compiled) {
    out << "CUDA kernels: not built (nvcc was not found, or ROTARY_CUDA=OFF)\n";
    return;
  }
  out << fmt::format("CUDA kernels: built for {}; CUDA runtime {}, driver {}\n", joined(gpu.architectures, ", "),
                     cuda_version(gpu.runtime_version), cuda_version(gpu.driver_version));
  if (gpu.usable) {
    out << fmt::format("CUDA device: {}, usable\n", gpu.device);
  } else {
    out << fmt::format("CUDA device: {}not usable: {}\n", gpu.device.empty() ? "" : gpu.device + ", ", gpu.why_not);
  }
}

}  // namespace rotary::cli
