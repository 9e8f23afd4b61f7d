// Internal: what a validated apply call hands to a kernel — raw pointers and element strides.
#pragma once

#include <array>
#include <cstdint>

#include "rotary/apply.hpp"

namespace rotary::detail {

/// One tensor to rotate (q or k).
struct Operand {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t heads = 0;
  std::array<int64_t, 4> in_strides{};
  std::array<int64_t, 4> out_strides{};
  bool in_place = true;
};

/// A validated call. Every pointer is non-null for non-empty operands; every position is in range
/// (and in the table, when there is one).
struct Plan {
  DType dtype = DType::f32;
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;
  Pairing pairing = Pairing::half;
  bool inverse = false;
  bool copy_tail = true;
  std::array<Operand, 2> operands{};
  int operand_count = 0;
  Positions positions{};
  const Table* table = nullptr;
  const Schedule* schedule = nullptr;
  int threads = 0;
};

/// The scalar oracle: loops written from the formulas, double arithmetic, single-threaded.
void reference_apply(const Plan& plan);

}  // namespace rotary::detail
