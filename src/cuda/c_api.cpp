// The CUDA backend's C ABI (include/rotary/rotary_cuda.h) over rotary::cuda: rotary.h's
// conversions and error channel (src/c_api/c_api_internal.hpp), the CUDA runtime's failures as
// ROTARY_ERROR_CUDA. No rule is checked here that rotary::cuda checks: only what the C encoding
// adds (NULL pointers, a host table where a device table belongs).
#include "rotary/rotary_cuda.h"

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
              ROTARY_CUDA_POSITION_BEYOND_XPOS_REACH == rotary::cuda::position_beyond_xpos_reach);

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

int rotary_cuda_check_positions(uint32_t* error, CUstream_st* stream) {
  return guarded([&] {
    if (error == nullptr) throw Error("error is NULL (give the rotary_cuda_options.error of the calls to check)");
    rotary::cuda::check_positions(error, stream);
  });
}

}  // extern "C"
