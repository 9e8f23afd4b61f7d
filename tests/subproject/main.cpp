// The parent's program: rotary through add_subdirectory, and a warning of the parent's own.
#include <rotary/rotary.hpp>

#include <cstdio>
#include <vector>

int main() {
  int unused_on_purpose = 0;  // -Wunused-variable: a warning, never an error rotary imposed
  const rotary::Schedule schedule = rotary::make_schedule(rotary::Spec{.head_dim = 8});
  std::vector<float> q(8, 1.0f);
  rotary::apply(schedule, {.q = rotary::TensorView::bshd(q.data(), rotary::DType::f32, 1, 1, 1, 8),
                           .positions = rotary::Positions::sequential(3)});
  std::printf("parent: q[0] = %.6f\n", q[0]);
  return q[0] != 1.0f ? 0 : 1;
}
