// The fused operations' bindings (rotary/fused.hpp) in the `rotary._rotary` extension: python/src/fused.cpp.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>

#include "rotary/schedule.hpp"
#include "rotary/table.hpp"
#if ROTARY_PY_CUDA
#include <functional>

#include "rotary/cuda.hpp"
#endif

#if ROTARY_PY_CUDA
/// Where a fused call on a CUDA device runs: torch's current stream on the device (made current
/// for the call), the device's error word, and the Rope's device table when one serves the call.
struct DeviceCall {
  rotary::cuda::Stream stream = nullptr;
  uint32_t* error = nullptr;
  const rotary::cuda::DeviceTable* table = nullptr;  ///< null: angles computed on the device (same bits)
};
#endif

/// What the bindings need of a `rotary._rotary.Rope` (the class module.cpp defines).
struct FusedHooks {
  /// Its schedule, alive as long as the object.
  const rotary::Schedule& (*schedule_of)(pybind11::handle rope);
  /// Its cached table of `mode` covering positions [0, rows) (the one apply reads), or null beyond
  /// its cache. Called with the GIL held.
  std::shared_ptr<const rotary::Table> (*table_of)(pybind11::handle rope, int64_t rows, rotary::AngleMode mode);
#if ROTARY_PY_CUDA
  /// Runs `call` on CUDA device `device` (current for the call, then the caller's again), with the
  /// Rope's device table of `mode` covering positions [0, rows) when rows > 0 (null without one, and
  /// while the stream is captured into a CUDA graph and the table would have to grow). Called with
  /// the GIL held; `call` may release it.
  void (*on_device)(pybind11::handle rope, int device, int64_t rows, rotary::AngleMode mode,
                    const std::function<void(const DeviceCall&)>& call);
#endif
};

/// Adds rope_store, qk_norm_rope, rerotate_cache and slots_from_page_table to `m`.
void bind_fused(pybind11::module_& m, FusedHooks hooks);
