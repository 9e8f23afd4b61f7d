// Internal: the fused operations' host side shared by the CPU entry points (src/fused/fused.cpp)
// and the CUDA ones (src/cuda/fused_api.cpp): validation (host: slots, scales and positions read
// on the host; device: shapes only, as validate_shapes) and the kernel arguments.
#pragma once

#include "body.hpp"
#include "rotary/fused.hpp"

namespace rotary::detail {

void validate_rope_store(const Schedule& schedule, const RopeStoreArgs& args, bool host);
FusedKernelArgs make_rope_store_args(const Schedule& schedule, const RopeStoreArgs& args, const TableRows* table);

void validate_qk_norm_rope(const Schedule& schedule, const QkNormRopeArgs& args, bool host);
FusedKernelArgs make_qk_norm_rope_args(const Schedule& schedule, const QkNormRopeArgs& args, const TableRows* table);

void validate_rerotate_cache(const Schedule& schedule, const RerotateCacheArgs& args, bool host);
RerotateKernelArgs make_rerotate_args(const Schedule& schedule, const RerotateCacheArgs& args, const TableRows* table);

/// The CPU loop: tokens over OpenMP threads (threads as ApplyArgs::threads: 0 all), the body per
/// token. Bit-identical for any thread count.
void cpu_fused(const FusedKernelArgs& f, int threads);
void cpu_rerotate_cache(const RerotateKernelArgs& r, int threads);

}  // namespace rotary::detail
