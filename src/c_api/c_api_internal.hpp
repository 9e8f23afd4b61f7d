// Internal: what the C ABI's translation units share — src/c_api/c_api.cpp (rotary/rotary.h) and
// src/cuda/c_api.cpp (rotary/rotary_cuda.h): the opaque objects, the calling thread's last error,
// the guard that turns exceptions into status codes, and rotary_apply_args read as ApplyArgs.
#pragma once

#include <exception>
#include <new>

#include <fmt/format.h>

#include "rotary/apply.hpp"
#include "rotary/error.hpp"
#include "rotary/fused.hpp"
#include "rotary/rotary.h"
#include "rotary/rope.hpp"
#include "rotary/schedule.hpp"
#include "rotary/table.hpp"

struct rotary_schedule {
  rotary::Schedule schedule;
  bool rotates_backward = false;  // the model turns pairs by -angle (ModelRope::rotates_backward)
};

struct rotary_table {
  rotary::Table table;
};

struct rotary_rope {
  rotary::Rope rope;
  bool rotates_backward = false;  // as rotary_schedule's
};

namespace rotary::detail::c_abi {

/// Records `message` as the calling thread's rotary_last_error and returns `status` (a rotary_status,
/// or rotary_cuda.h's ROTARY_ERROR_CUDA, beyond the enum's range). Never throws.
int fail(int status, const char* message) noexcept;

/// Runs `body`, turning every exception into a status and the thread's last error: rotary::Error
/// is ROTARY_ERROR_INVALID_ARGUMENT, std::bad_alloc out of memory, anything else internal.
template <class Body>
int guarded(Body&& body) noexcept {
  try {
    body();
    return ROTARY_OK;
  } catch (const Error& e) {
    return fail(ROTARY_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const std::bad_alloc&) {
    return fail(ROTARY_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return fail(ROTARY_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(ROTARY_ERROR_INTERNAL, "unknown exception");
  }
}

/// *pointer, or throws rotary::Error "<name> is NULL".
template <class T>
const T& require(const T* pointer, const char* name) {
  if (pointer == nullptr) throw Error(fmt::format("{} is NULL", name));
  return *pointer;
}

/// The C++ call of rotary_apply_positions(schedule, &args, positions): args' views, direction,
/// table, tail copy, threads and backend, with args' own positions (positions NULL) or
/// `positions` (args' position fields must then be 0), the direction flipped for a model that turns
/// pairs by -angle (rotary_schedule::rotates_backward). Throws rotary::Error for what the C
/// encoding gets wrong (enum values, flags, NULL arrays); the call's rules are rotary::validate's.
ApplyArgs apply_args(bool rotates_backward, const rotary_apply_args& args, const rotary_positions* positions);

/// A rotary_slots as rotary::Slots (count, data and kind checked; messages name `name`).
Slots to_slots(const rotary_slots& slots, const char* name = "slots");

/// The fused calls' arguments from their C structs (rotary_rope_store and the CUDA C ABI's). `write`:
/// where qk_norm_rope_args puts its store's CacheWrite (the result points to it).
RopeStoreArgs rope_store_args(const rotary_schedule& schedule, const rotary_rope_store_args& args);
QkNormRopeArgs qk_norm_rope_args(const rotary_schedule& schedule, const rotary_qk_norm_rope_args& args,
                                 CacheWrite& write);
RerotateCacheArgs rerotate_cache_args(const rotary_schedule& schedule, const rotary_rerotate_cache_args& args);

}  // namespace rotary::detail::c_abi
