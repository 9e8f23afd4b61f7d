// The CUDA backend's C ABI (include/rotary/rotary_cuda.h) over rotary::cuda: rotary.h's
// conversions and error channel (src/c_api/c_api_internal.hpp), the CUDA runtime's failures as
// ROTARY_ERROR_CUDA. No rule is checked here that rotary::cuda checks: only what the C encoding
// adds (NULL pointers, a host table where a device table belongs, an int flag's values).
#include "rotary/rotary_cuda.h"

#include <string>

#include "../c_api/c_api_internal.hpp"
#include "rotary/cuda.hpp"
#include "rotary/error.hpp"

struct rotary_cuda_table {
  rotary::cuda::DeviceTable table;
};

namespace {

using rotary::Error;
using rotary::detail::c_abi::require;

static_assert(ROTARY_ERROR_CUDA == ROTARY_ERROR_INTERNAL + 1, "a status of its own");
static_assert(ROTARY_CUDA_POSITION_OUT_OF_RANGE == rotary::cuda::position_out_of_range &&
              ROTARY_CUDA_POSITION_NOT_IN_TABLE == rotary::cuda::position_not_in_table &&
              ROTARY_CUDA_POSITION_BEYOND_XPOS_REACH == rotary::cuda::position_beyond_xpos_reach &&
              ROTARY_CUDA_SLOT_OUT_OF_RANGE == rotary::cuda::slot_out_of_range &&
              ROTARY_CUDA_SLOT_DUPLICATE == rotary::cuda::slot_duplicate &&
              ROTARY_CUDA_SCALE_INVALID == rotary::cuda::scale_invalid);

// rotary.h's guard, with the CUDA runtime's failures (rotary::cuda::RuntimeError) as
// ROTARY_ERROR_CUDA.
template <class Body>
int guarded(Body&& body) noexcept {
  int cuda_status = ROTARY_OK;
  const int status = rotary::detail::c_abi::guarded([&] {
    try {
      body();
    } catch (const rotary::cuda::RuntimeError& e) {
      cuda_status = rotary::detail::c_abi::fail(ROTARY_ERROR_CUDA, e.what());
    }
  });
  return cuda_status != ROTARY_OK ? cuda_status : status;
}

// The fused calls' options: a device table, the error word, and the host copy of the slots (kept in
// `slots`, which the result points to).
rotary::cuda::FusedOptions fused_options(const rotary_cuda_fused_options* options, rotary::Slots& slots) {
  const rotary_cuda_fused_options o = options != nullptr ? *options : rotary_cuda_fused_options{};
  if (o.check_duplicate_slots != 0 && o.check_duplicate_slots != 1) {
    throw Error("options.check_duplicate_slots=" + std::to_string(o.check_duplicate_slots) +
                " must be 0 or 1 (1: the kernels flag a slot two tokens share)");
  }
  if (o.check_duplicate_slots == 1 && o.error == nullptr && o.host_slots == nullptr) {
    throw Error("options.check_duplicate_slots needs options.error (the kernels flag a shared slot there)");
  }
  rotary::cuda::FusedOptions out{.table = o.table != nullptr ? &o.table->table : nullptr, .error = o.error,
                                 .check_duplicate_slots = o.check_duplicate_slots != 0};
  if (o.host_slots != nullptr) {
    slots = rotary::detail::c_abi::to_slots(*o.host_slots, "options.host_slots");
    out.host_slots = &slots;
  }
  return out;
}

// A host table belongs in options.table (as rotary_cuda_apply says).
void refuse_host_table(const rotary_table* table) {
  if (table != nullptr) {
    throw Error("args.rope.table is a host table: give its rotary_cuda_table_create copy in options.table");
  }
}

}  // namespace

extern "C" {

int rotary_cuda_table_create(const rotary_table* table, rotary_cuda_table** out) {
  return guarded([&] {
    if (out == nullptr) throw Error("out is NULL");
    *out = nullptr;
    *out = new rotary_cuda_table{rotary::cuda::DeviceTable(require(table, "table").table)};
  });
}

void rotary_cuda_table_free(rotary_cuda_table* table) { delete table; }

int rotary_cuda_apply(const rotary_schedule* schedule, const rotary_apply_args* args,
                      const rotary_positions* positions, CUstream_st* stream,
                      const rotary_cuda_options* options) {
  return guarded([&] {
    const rotary_schedule& s = require(schedule, "schedule");
    const rotary_apply_args& a = require(args, "args");
    if (a.table != nullptr) {
      throw Error("args.table is a host table: give its rotary_cuda_table_create copy in options.table");
    }
    const rotary_cuda_options o = options != nullptr ? *options : rotary_cuda_options{};
    rotary::cuda::apply(s.schedule, rotary::detail::c_abi::apply_args(s.rotates_backward, a, positions), stream,
                        {.table = o.table != nullptr ? &o.table->table : nullptr, .error = o.error});
  });
}

int rotary_cuda_rope_store(const rotary_schedule* schedule, const rotary_rope_store_args* args, CUstream_st* stream,
                           const rotary_cuda_fused_options* options) {
  return guarded([&] {
    const rotary_schedule& s = require(schedule, "schedule");
    const rotary_rope_store_args& a = require(args, "args");
    refuse_host_table(a.rope.table);
    rotary::Slots slots;
    const rotary::cuda::FusedOptions o = fused_options(options, slots);
    rotary::cuda::rope_store(s.schedule, rotary::detail::c_abi::rope_store_args(s, a), stream, o);
  });
}

int rotary_cuda_qk_norm_rope(const rotary_schedule* schedule, const rotary_qk_norm_rope_args* args,
                             CUstream_st* stream, const rotary_cuda_fused_options* options) {
  return guarded([&] {
    const rotary_schedule& s = require(schedule, "schedule");
    const rotary_qk_norm_rope_args& a = require(args, "args");
    refuse_host_table(a.rope.table);
    rotary::Slots slots;
    const rotary::cuda::FusedOptions o = fused_options(options, slots);
    rotary::CacheWrite write;
    rotary::cuda::qk_norm_rope(s.schedule, rotary::detail::c_abi::qk_norm_rope_args(s, a, write), stream, o);
  });
}

int rotary_cuda_rerotate_cache(const rotary_schedule* schedule, const rotary_rerotate_cache_args* args,
                               CUstream_st* stream, const rotary_cuda_fused_options* options) {
  return guarded([&] {
    const rotary_schedule& s = require(schedule, "schedule");
    const rotary_rerotate_cache_args& a = require(args, "args");
    if (a.table != nullptr) {
      throw Error("args.table is a host table: give its rotary_cuda_table_create copy in options.table (raw mode)");
    }
    rotary::Slots slots;
    const rotary::cuda::FusedOptions o = fused_options(options, slots);
    rotary::cuda::rerotate_cache(s.schedule, rotary::detail::c_abi::rerotate_cache_args(s, a), stream, o);
  });
}

int rotary_cuda_check_positions(uint32_t* error, CUstream_st* stream) {
  return guarded([&] {
    if (error == nullptr) throw Error("error is NULL (give the rotary_cuda_options.error of the calls to check)");
    rotary::cuda::check_positions(error, stream);
  });
}

}  // extern "C"
