// rotary — what this build is and what its CPU kernels run on this machine (`rotary info --build`,
// rotary.build_info()). The CUDA backend, when built, says its own part (rotary::cuda::build_info,
// rotary/cuda.hpp).
#pragma once

#include <string>
#include <vector>

namespace rotary {

/// The library's version and its CPU kernels' instruction sets.
struct BuildInfo {
  std::string version;                   ///< "0.1.0"
  std::string cpu_target;                ///< the Highway target the CPU kernels run on here ("AVX3", "AVX2", ...)
  std::vector<std::string> cpu_targets;  ///< every target compiled in, best first
  /// apply's backends (rotary::Backend) that run on this machine, as named there: "reference",
  /// "cpu". The CUDA backend, a call of its own with a stream, is rotary::cuda::build_info's.
  std::vector<std::string> backends;
};

/// This build and machine. Never throws; allocates the strings.
BuildInfo build_info();

}  // namespace rotary
