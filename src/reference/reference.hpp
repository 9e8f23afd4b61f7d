// Internal: the scalar oracle every backend is tested against (src/reference/apply_reference.cpp).
#pragma once

#include "../kernel/args.hpp"

namespace rotary::detail {

/// The scalar oracle: loops written from the formulas over the kernel layer's angle semantics,
/// single-threaded. Requires a validated call (make_kernel_args of one that passed validate).
void reference_apply(const KernelArgs& args);

}  // namespace rotary::detail
