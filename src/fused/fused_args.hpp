// Internal: the fused operations' host side shared by the CPU entry points (src/fused/fused.cpp)
// and the CUDA ones (src/cuda/fused_api.cpp): validation (host: slots, scales and positions read
// on the host; device: shapes only, as validate_shapes) and the kernel arguments.
#pragma once

#include <initializer_list>
#include <utility>

#include "body.hpp"
#include "rotary/fused.hpp"

namespace rotary::detail {

void validate_rope_store(const Schedule& schedule, const RopeStoreArgs& args, bool host);
FusedKernelArgs make_rope_store_args(const Schedule& schedule, const RopeStoreArgs& args, const TableRows* table);

void validate_qk_norm_rope(const Schedule& schedule, const QkNormRopeArgs& args, bool host);
FusedKernelArgs make_qk_norm_rope_args(const Schedule& schedule, const QkNormRopeArgs& args, const TableRows* table);

void validate_rerotate_cache(const Schedule& schedule, const RerotateCacheArgs& args, bool host);
RerotateKernelArgs make_rerotate_args(const Schedule& schedule, const RerotateCacheArgs& args, const TableRows* table);

/// The CUDA entry points' check of FusedOptions::host_slots: the same count and integer type as
/// `slots` (the device copy), then range against each set cache and no duplicate, as the CPU checks.
void check_host_slots(const Slots& host_slots, const Slots& slots, int64_t tokens,
                      std::initializer_list<std::pair<const CacheView*, const char*>> caches);

/// The CPU loop: tokens over OpenMP threads (threads as ApplyArgs::threads: 0 all), per token the
/// vectorised rows (cpu_fused_rows) or, for f64 and Backend::reference (one thread), the body.
/// Bit-identical for any thread count and either path.
void cpu_fused(const FusedKernelArgs& f, int threads, Backend backend);
/// The vectorised CPU path (src/fused/cpu_rows.cpp) with a team of `team` threads: false (nothing
/// done) for the dtypes it does not serve (f64).
bool cpu_fused_rows(const FusedKernelArgs& f, int team);
/// Tests: how many cpu_fused_rows calls so far normalised inside apply's rows (norm_then_rope with
/// contiguous rows of one slice: the norm and the rotation one pass over each head).
int64_t one_pass_norm_call_count();
/// rerotate_cache's CPU loop: slots over OpenMP threads, per slot the vectorised rows
/// (cpu_rerotate_rows: f32, f16 and bf16 caches with contiguous channels) or, for quantised caches,
/// other strides and Backend::reference (one thread), the body. Bit-identical either way.
void cpu_rerotate_cache(const RerotateKernelArgs& r, int threads, Backend backend);
/// The vectorised path (src/fused/cpu_rows.cpp) with a team of `team` threads: false (nothing done)
/// for the caches it does not serve.
bool cpu_rerotate_rows(const RerotateKernelArgs& r, int team);

}  // namespace rotary::detail
