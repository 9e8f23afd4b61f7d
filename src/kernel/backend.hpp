// Internal: the backends apply can run a call on, as one table (name, available, run) that apply,
// the tests and `rotary info --build` (through rotary::build_info) read. Each runs the same
// KernelArgs and gives the same bits. The CUDA backend takes a stream and device memory, so it is
// its own entry point (rotary::cuda::apply) and describes itself in rotary::cuda::build_info.
#pragma once

#include <span>
#include <string_view>

#include "args.hpp"
#include "rotary/apply.hpp"

namespace rotary::detail {

struct BackendEntry {
  Backend backend;
  std::string_view name;  ///< as Backend's enumerator: "reference", "cpu"
  std::string_view doc;   ///< one line
  bool (*available)();    ///< whether it runs on this machine
  void (*run)(const KernelArgs& args);  ///< a validated call with at least one non-empty operand
};

/// Every backend, in Backend's order after `automatic`.
std::span<const BackendEntry> backends();

/// The entry that runs `backend` (automatic: the fastest available, the CPU's). Throws rotary::Error
/// for a value that is not a Backend.
const BackendEntry& backend_entry(Backend backend);

}  // namespace rotary::detail
