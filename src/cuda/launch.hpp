// Internal: the CUDA kernels' launcher (src/cuda/apply.cu), callable from host code that includes
// no CUDA header.
#pragma once

#include "../kernel_args.hpp"

struct CUstream_st;

namespace rotary::detail::cuda {

/// Queues the kernel for `args` (pointers in device memory; a call that passed validation, with
/// rotary_dim / 2 <= rotary::cuda::max_pairs) on `stream`, with launch_shape(args). Throws
/// rotary::Error naming the CUDA error when the launch fails. Does nothing when args.tokens is 0.
void launch(const KernelArgs& args, CUstream_st* stream);

}  // namespace rotary::detail::cuda
