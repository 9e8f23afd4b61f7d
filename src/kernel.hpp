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
/// (and in the table, when there is one); at least one operand is non-empty, and every view spans
/// < max_view_bytes, so no element or byte offset a kernel forms overflows int64.
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

/// The team for one OpenMP loop over `blocks` independent blocks: `requested` threads (0:
/// omp_get_max_threads()), cut to at most omp_get_num_procs() (counted at the first call),
/// max_threads and `blocks`, and at least 1. Every OpenMP team the library starts is sized by
/// this, so no count a caller passes (or OMP_NUM_THREADS sets) asks for more threads than can run.
int useful_threads(int requested, int64_t blocks);

/// The scalar oracle: loops written from the formulas, double arithmetic, single-threaded.
void reference_apply(const Plan& plan);

}  // namespace rotary::detail
