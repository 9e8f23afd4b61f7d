// The fused operations' bindings (rotary/fused.hpp) in the `rotary._rotary` extension: python/src/fused.cpp.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>

#include "rotary/schedule.hpp"
#include "rotary/table.hpp"

/// What the bindings need of a `rotary._rotary.Rope` (the class module.cpp defines).
struct FusedHooks {
  /// Its schedule, alive as long as the object.
  const rotary::Schedule& (*schedule_of)(pybind11::handle rope);
  /// Its cached table of `mode` covering positions [0, rows) (the one apply reads), or null beyond
  /// its cache. Called with the GIL held.
  std::shared_ptr<const rotary::Table> (*table_of)(pybind11::handle rope, int64_t rows, rotary::AngleMode mode);
};

/// Adds rope_store, qk_norm_rope, rerotate_cache and slots_from_page_table to `m`.
void bind_fused(pybind11::module_& m, FusedHooks hooks);
