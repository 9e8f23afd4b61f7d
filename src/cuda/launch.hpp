// Internal: the CUDA kernels' launcher (src/cuda/apply.cu), callable from host code that includes
// no CUDA header.
#pragma once

#include <cstdint>
#include <string>

#include "../kernel/args.hpp"

struct CUstream_st;

namespace rotary {
struct ApplyArgs;
struct Schedule;
namespace cuda {
struct Options;
}  // namespace cuda
}  // namespace rotary

namespace rotary::detail {
struct FusedKernelArgs;
struct RerotateKernelArgs;
}  // namespace rotary::detail

namespace rotary::detail::cuda {

/// Queues the fused kernel (src/cuda/fused.cu) for a validated call whose pointers are in device
/// memory: a block per token, its threads filling the angle row, then one item (head) per warp,
/// as tests/test_fused_emulation.cpp plays it; or, for a rope_store call fast_store_refusal takes,
/// rope_store's fast kernel with fast_store_launch_shape (src/cuda/fast_store_body.hpp). Throws
/// RuntimeError when the launch fails; nothing for 0 tokens.
void launch_fused(const FusedKernelArgs& args, CUstream_st* stream);
struct FastShape;
/// rope_store's fast kernel (src/cuda/fast_store_body.hpp) with a launch shape of the caller's, for
/// a call fast_store_refusal takes (launch_fused picks it, with fast_store_launch_shape, for every
/// such call): the device tests run it on shapes the default never picks.
void launch_fast_store(const FusedKernelArgs& args, const FastShape& shape, CUstream_st* stream);
/// The same for rerotate_cache: a block per slot, a thread per head.
void launch_rerotate(const RerotateKernelArgs& args, CUstream_st* stream);

/// rotary::cuda::apply without its rotary::validate_shapes, for a caller that has just run it on
/// the same arguments (the Python module, which rewords its errors): the DeviceTable, angles and
/// max_pairs checks, the kernel arguments, the launch.
void apply_validated(const Schedule& schedule, const ApplyArgs& args, CUstream_st* stream,
                     const rotary::cuda::Options& options);

/// Queues the kernel for `args` (pointers in device memory; a call that passed validation, with
/// rotary_dim / 2 <= rotary::cuda::max_pairs) on `stream`: a fast kernel with
/// fast_launch_shape(args, multiprocessors()) when choose_kernel (fast_body.hpp) allows, else the
/// general kernel with launch_shape(args). No allocation, synchronisation or device query but the
/// current device's SM count, read once per device. Throws rotary::cuda::RuntimeError naming the
/// CUDA error when the launch fails. Does nothing when args.tokens is 0.
void launch(const KernelArgs& args, CUstream_st* stream);

struct LaunchShape;
/// The general kernel with a launch shape of the caller's (rope_body.hpp: blocks >= 1, threads in
/// [1, kMaxThreads]), whatever choose_kernel says: the device tests play every shape the emulation
/// does (per-item angles, odd block sizes, blocks looping over tokens), which launch_shape alone
/// never picks on a GPU.
void launch(const KernelArgs& args, const LaunchShape& shape, CUstream_st* stream);

struct FastShape;
/// A fast kernel with a launch shape of the caller's (fast_body.hpp; a call choose_kernel gives to
/// the fast kernels): the device tests run both kernels on every call that may take either.
void launch_fast(const KernelArgs& args, const FastShape& shape, CUstream_st* stream);

/// The current device's multiprocessor count (cudaDeviceGetAttribute once per device, then kept).
int multiprocessors();

/// Whether the kernels have code the current device runs: the cudaError_t of asking the runtime for
/// a fast kernel's attributes (cudaErrorNoKernelImageForDevice when none of the architectures built
/// suits it; the error is cleared).
int kernel_image_status();

/// Throws rotary::cuda::RuntimeError "CUDA <what> failed: <name>: <description>" unless `status`
/// (a cudaError_t) is cudaSuccess.
void check(int status, const char* what);

/// The message of rotary::cuda::check_positions for a non-zero error word: the rules the skipped
/// tokens' positions broke, one per kPosition* bit set (or the bits no kernel sets).
std::string positions_message(uint32_t bits);

}  // namespace rotary::detail::cuda
