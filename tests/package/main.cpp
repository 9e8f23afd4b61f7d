// Uses the installed library: rotate, rotate back, check the round trip.
#include <rotary/rotary.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const rotary::Schedule schedule = rotary::make_schedule(rotary::Spec{.head_dim = 64});
  std::vector<float> q(2 * 64);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(i % 7) - 3.0f;
  const std::vector<float> original = q;
  const auto view = rotary::TensorView::bshd(q.data(), rotary::DType::f32, 1, 2, 1, 64);
  rotary::apply(schedule, {.q = view, .positions = rotary::Positions::sequential(1000)});
  const bool moved = q != original;
  rotary::apply(schedule, {.q = view, .positions = rotary::Positions::sequential(1000),
                           .direction = rotary::Direction::inverse});
  double worst = 0;
  for (size_t i = 0; i < q.size(); ++i) worst = std::fmax(worst, std::fabs(q[i] - original[i]));
  std::printf("consumer: rotated=%d round-trip error %.3g\n", moved ? 1 : 0, worst);
  return moved && worst < 1e-5 ? 0 : 1;
}
