// `rotary info --build`: the library's version, the CPU kernels' Highway target on this machine
// and, when built with them, the CUDA kernels' architectures and whether a device can run them.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

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

// A CUDA version number (13000) as "13.0"; 0 (no driver) as "none".
std::string cuda_version(int version) {
  return version == 0 ? "none" : fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}
nlohmann::ordered_json json_version(int version) {
  return version == 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(cuda_version(version));
}
nlohmann::ordered_json json_optional(const std::string& text) {
  return text.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(text);
}

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
    nlohmann::ordered_json j;
    j["version"] = cpu.version;
    j["cpu_target"] = cpu.cpu_target;
    j["cpu_targets"] = cpu.cpu_targets;
    j["backends"] = cpu.backends;
    nlohmann::ordered_json& c = j["cuda"];
    c["compiled"] = compiled;
    if (!compiled) c["why_not"] = "this rotary was built without CUDA kernels";
    if (compiled) {
      c["architectures"] = gpu.architectures;
      c["runtime"] = json_version(gpu.runtime_version);
      c["driver"] = json_version(gpu.driver_version);
      c["devices"] = gpu.devices;
      c["device"] = json_optional(gpu.device);
      c["usable"] = gpu.usable;
      c["why_not"] = json_optional(gpu.why_not);
    }
    out << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
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
