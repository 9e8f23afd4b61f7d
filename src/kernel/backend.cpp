#include "backend.hpp"

#include <array>

#include <fmt/format.h>

#include "../cpu/cpu.hpp"
#include "../reference/reference.hpp"
#include "rotary/error.hpp"

namespace rotary::detail {
namespace {

bool always() { return true; }

constexpr std::array<BackendEntry, 2> kBackends = {{
    {Backend::reference, "reference", "the scalar oracle, written from the formulas, single-threaded", always,
     reference_apply},
    {Backend::cpu, "cpu", "Highway SIMD kernels (the best target of this CPU), threaded with OpenMP", always,
     cpu_apply},
}};

}  // namespace

std::span<const BackendEntry> backends() { return kBackends; }

const BackendEntry& backend_entry(Backend backend) {
  if (backend == Backend::automatic) backend = Backend::cpu;
  for (const BackendEntry& entry : kBackends) {
    if (entry.backend == backend) return entry;
  }
  throw Error(fmt::format("backend={} is not automatic, reference or cpu", static_cast<int>(backend)));
}

}  // namespace rotary::detail
