// Internal: the CUDA kernels' launcher (src/cuda/apply.cu), callable from host code that includes
// no CUDA header.
#pragma once

#include <cstdint>
#include <string>

#include "../kernel_args.hpp"

struct CUstream_st;

namespace rotary::detail::cuda {

/// Queues the kernel for `args` (pointers in device memory; a call that passed validation, with
/// rotary_dim / 2 <= rotary::cuda::max_pairs) on `stream`, with launch_shape(args). Throws
/// rotary::cuda::RuntimeError naming the CUDA error when the launch fails. Does nothing when
/// args.tokens is 0.
void launch(const KernelArgs& args, CUstream_st* stream);

struct LaunchShape;
/// The same with a launch shape of the caller's (rope_body.hpp: blocks >= 1, threads in
/// [1, kMaxThreads]): the device tests play every shape the emulation does (per-item angles, odd
/// block sizes, blocks looping over tokens), which launch_shape alone never picks on a GPU.
void launch(const KernelArgs& args, const LaunchShape& shape, CUstream_st* stream);

/// Throws rotary::cuda::RuntimeError "CUDA <what> failed: <name>: <description>" unless `status`
/// (a cudaError_t) is cudaSuccess.
void check(int status, const char* what);

/// The message of rotary::cuda::check_positions for a non-zero error word: the rules the skipped
/// tokens' positions broke, one per kPosition* bit set (or the bits no kernel sets).
std::string positions_message(uint32_t bits);

}  // namespace rotary::detail::cuda
