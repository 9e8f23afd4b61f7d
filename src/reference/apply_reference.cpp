// The scalar reference kernel: the oracle every fast kernel is tested against. No vectorisation,
// no threads: for each token, operand, head and pair, in that order, the pair's angle from the
// kernel layer's semantics (src/kernel/angles.hpp: a Table's value, the caller's, or exact
// detail::cos_sin_of_product times the attention factor rounded once to float; sin negated for
// the inverse; under xPos times σ, rounded once more), then detail::rotate_pair of the widened
// inputs (float32, one rounding, the larger product fused; f64: double arithmetic with double
// angles) and one rounding to the storage type (src/kernel/pairs.hpp). The accuracy of these
// semantics is held against MPFR by the tests (tests/test_apply.cpp, test_xpos.cpp, ...).
#include "reference.hpp"

#include "../kernel/angles.hpp"
#include "../kernel/pairs.hpp"
#include "../kernel/storage.hpp"

namespace rotary::detail {
namespace {

template <class T>
void run(const KernelArgs& args) {
  using Value = typename Storage<T>::Value;
  const PairArrays pairs = pair_arrays(args);
  for (int64_t token = 0; token < args.tokens; ++token) {
    const int64_t b = token / args.seq;
    const int64_t s = token % args.seq;
    for (int o = 0; o < args.operand_count; ++o) {
      const KernelOperand& op = args.operands[o];
      for (int64_t h = 0; h < op.heads; ++h) {
        rotate_head<T>(args, op, head_offsets(op, b, s, h), [&](int64_t j) {
          AngleCell<Value> angle = pair_angle<Value>(args, pairs, token, b, s, j);
          if (args.xpos_scale_base != 0) angle = xpos_angle(args, pairs, token, s, j, op.key, angle);
          return angle;
        });
      }
    }
  }
}

}  // namespace

void reference_apply(const KernelArgs& args) {
  with_storage(args.dtype, [&]<class T>() { run<T>(args); });
}

}  // namespace rotary::detail
