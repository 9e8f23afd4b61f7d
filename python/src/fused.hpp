// The fused operations' bindings (rotary/fused.hpp) in the `rotary._rotary` extension: python/src/fused.cpp.
#pragma once

#include <pybind11/pybind11.h>

#include "rotary/schedule.hpp"

/// Adds rope_store, qk_norm_rope and rerotate_cache to `m`. `schedule_of` gives the schedule of a
/// `rotary._rotary.Rope` (the class module.cpp defines), alive as long as that object.
void bind_fused(pybind11::module_& m, const rotary::Schedule& (*schedule_of)(pybind11::handle rope));
