#include "demo.hpp"

#include <fmt/format.h>
#include <quadmath.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "rotary/rotary.hpp"

namespace rotary::cli {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Independent oracle: the angle p * inv_freq is exact in binary128 (31 + 53 bits < 113), and
// libquadmath reduces and evaluates it to ~2^-112.
struct QuadCosSin {
  double cos;
  double sin;
};
QuadCosSin quad_cos_sin(int64_t position, double inv_freq, double factor) {
  const __float128 angle = static_cast<__float128>(position) * static_cast<__float128>(inv_freq);
  __float128 s = 0;
  __float128 c = 0;
  sincosq(angle, &s, &c);
  return {static_cast<double>(c * factor), static_cast<double>(s * factor)};
}

double float_ulp(double exact) {
  const double magnitude = std::fabs(exact);
  if (magnitude < 0x1p-126) return 0x1p-149;
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude in [2^(e-1), 2^e)
  return std::ldexp(1.0, exponent - 24);
}

struct Check {
  double worst_contract = 0;  // worst |error| / (2^-23 g (|a| + |b|))
  int64_t pairs = 0;
};

// Compares out (rotated) against the exact rotation of in, token by token.
void check_rotation(const Schedule& schedule, const std::vector<float>& in,
                    const std::vector<float>& out, int64_t seq, int64_t heads, int64_t first_position,
                    const std::vector<QuadCosSin>& exact_angles, Check& check) {
  const int64_t d = schedule.head_dim;
  const int64_t pairs = schedule.pairs();
  for (int64_t s = 0; s < seq; ++s) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = (s * heads + h) * d;
      for (int64_t i = 0; i < pairs; ++i) {
        const QuadCosSin cs = exact_angles[static_cast<size_t>((first_position + s) * pairs + i)];
        const double a = in[static_cast<size_t>(base + i)];
        const double b = in[static_cast<size_t>(base + i + pairs)];
        const double ea = a * cs.cos - b * cs.sin;
        const double eb = a * cs.sin + b * cs.cos;
        const double bound = 0x1p-23 * schedule.attention_factor * (std::fabs(a) + std::fabs(b));
        const double err = std::max(std::fabs(out[static_cast<size_t>(base + i)] - ea),
                                    std::fabs(out[static_cast<size_t>(base + i + pairs)] - eb));
        if (bound > 0) check.worst_contract = std::max(check.worst_contract, err / bound);
        ++check.pairs;
      }
    }
  }
}

}  // namespace

int run_demo(const DemoOptions& options, std::ostream& out) {
  // Llama-3.1-8B (config.json: rope_theta 500000, rope_scaling llama3 factor 8, low 1, high 4,
  // original_max_position_embeddings 8192; 32 query heads, 8 key/value heads, head_dim 128).
  const Spec spec{.head_dim = 128,
                  .base = 500000.0,
                  .pairing = Pairing::half,
                  .schedule = ScheduleType::llama3,
                  .factor = 8.0,
                  .original_max_position = 8192,
                  .low_freq_factor = 1.0,
                  .high_freq_factor = 4.0};
  constexpr int64_t kTablePositions = 131072;
  constexpr int64_t kPrefill = 4096;
  constexpr int64_t kQueryHeads = 32;
  constexpr int64_t kKeyHeads = 8;
  constexpr int64_t kDecodePosition = kTablePositions - 1;

  const Schedule schedule = make_schedule(spec);
  const std::vector<double> plain = default_inv_freq(spec.base, schedule.rotary_dim);
  int kept = 0, interpolated = 0, blended = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const double ratio = schedule.inv_freq[i] / plain[i];
    if (ratio == 1.0) ++kept;
    else if (ratio == 1.0 / *spec.factor) ++interpolated;
    else ++blended;
  }
  out << "rotary demo — Llama-3.1-8B RoPE (head_dim 128, base 500000, llama3 factor 8, low 1, "
         "high 4, original 8192, half pairing)\n";
  out << fmt::format("schedule: {} pairs kept, {} blended, {} interpolated by 1/8; inv_freq {:.6g} .. "
                     "{:.6g} rad/token; attention_factor {}\n",
                     kept, blended, interpolated, schedule.inv_freq.back(), schedule.inv_freq.front(),
                     schedule.attention_factor);

  auto start = Clock::now();
  const Table table = Table::range(schedule, 0, kTablePositions);
  const double table_ms = ms_since(start);

  // Exact angles, independently: every prefill position, the decode position, 2000 random rows.
  const int64_t pairs = schedule.pairs();
  std::mt19937_64 rng(options.seed);
  std::vector<int64_t> check_rows;
  for (int64_t p = 0; p < kPrefill; ++p) check_rows.push_back(p);
  check_rows.push_back(kDecodePosition);
  std::uniform_int_distribution<int64_t> any_row(0, kTablePositions - 1);
  for (int i = 0; i < 2000; ++i) check_rows.push_back(any_row(rng));
  std::vector<QuadCosSin> exact(static_cast<size_t>(kTablePositions * pairs));
  start = Clock::now();
  double worst_table_ulp = 0;
  for (int64_t p : check_rows) {
    for (int64_t i = 0; i < pairs; ++i) {
      const QuadCosSin cs =
          quad_cos_sin(p, schedule.inv_freq[static_cast<size_t>(i)], schedule.attention_factor);
      exact[static_cast<size_t>(p * pairs + i)] = cs;
      const double c = table.cos_row(p)[i];
      const double s = table.sin_row(p)[i];
      worst_table_ulp = std::max({worst_table_ulp, std::fabs(c - cs.cos) / float_ulp(cs.cos),
                                  std::fabs(s - cs.sin) / float_ulp(cs.sin)});
    }
  }
  const double oracle_ms = ms_since(start);

  // The float32 pipeline most implementations use, at the decode position.
  double worst_f32_angle = 0;
  for (int64_t i = 0; i < pairs; ++i) {
    const float angle32 = static_cast<float>(schedule.inv_freq[static_cast<size_t>(i)]) *
                          static_cast<float>(kDecodePosition);
    const __float128 exact_angle = static_cast<__float128>(kDecodePosition) *
                                   static_cast<__float128>(schedule.inv_freq[static_cast<size_t>(i)]);
    worst_f32_angle = std::max(worst_f32_angle,
                               static_cast<double>(fabsq(static_cast<__float128>(angle32) - exact_angle)));
  }

  // Prefill q [1,4096,32,128] and k [1,4096,8,128], random normal, out of place.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random_tensor = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = normal(rng);
    return v;
  };
  const int64_t d = schedule.head_dim;
  std::vector<float> q = random_tensor(kPrefill * kQueryHeads * d);
  std::vector<float> k = random_tensor(kPrefill * kKeyHeads * d);
  std::vector<float> q_out(q.size());
  std::vector<float> k_out(k.size());
  ApplyArgs args{.q = TensorView::bshd(q.data(), DType::f32, 1, kPrefill, kQueryHeads, d),
                 .k = TensorView::bshd(k.data(), DType::f32, 1, kPrefill, kKeyHeads, d),
                 .q_out = TensorView::bshd(q_out.data(), DType::f32, 1, kPrefill, kQueryHeads, d),
                 .k_out = TensorView::bshd(k_out.data(), DType::f32, 1, kPrefill, kKeyHeads, d),
                 .table = &table};
  start = Clock::now();
  apply(schedule, args);
  const double prefill_ms = ms_since(start);
  Check prefill_table;
  check_rotation(schedule, q, q_out, kPrefill, kQueryHeads, 0, exact, prefill_table);
  check_rotation(schedule, k, k_out, kPrefill, kKeyHeads, 0, exact, prefill_table);

  args.table = nullptr;  // angles computed exactly on the fly
  start = Clock::now();
  apply(schedule, args);
  const double prefill_fly_ms = ms_since(start);
  Check prefill_fly;
  check_rotation(schedule, q, q_out, kPrefill, kQueryHeads, 0, exact, prefill_fly);
  check_rotation(schedule, k, k_out, kPrefill, kKeyHeads, 0, exact, prefill_fly);

  // Decode: one token at position 131071, in place.
  std::vector<float> dq = random_tensor(kQueryHeads * d);
  std::vector<float> dk = random_tensor(kKeyHeads * d);
  const std::vector<float> dq_in = dq;
  const std::vector<float> dk_in = dk;
  start = Clock::now();
  apply(schedule, ApplyArgs{.q = TensorView::bshd(dq.data(), DType::f32, 1, 1, kQueryHeads, d),
                            .k = TensorView::bshd(dk.data(), DType::f32, 1, 1, kKeyHeads, d),
                            .positions = Positions::sequential(kDecodePosition),
                            .table = &table});
  const double decode_ms = ms_since(start);
  Check decode;
  check_rotation(schedule, dq_in, dq, 1, kQueryHeads, kDecodePosition, exact, decode);
  check_rotation(schedule, dk_in, dk, 1, kKeyHeads, kDecodePosition, exact, decode);

  const bool table_ok = worst_table_ulp <= 1.0;
  const bool apply_ok = prefill_table.worst_contract <= 1.0 && prefill_fly.worst_contract <= 1.0 &&
                        decode.worst_contract <= 1.0;
  out << fmt::format("table: {} positions x {} pairs in {:.1f} ms\n", kTablePositions, pairs, table_ms);
  out << fmt::format("  checked {} rows against binary128 (libquadmath, {:.0f} ms): worst {:.3f} ulp "
                     "(contract <= 1)\n",
                     check_rows.size(), oracle_ms, worst_table_ulp);
  out << fmt::format("  for scale: a float32 angle p*inv_freq at p={} is off by up to {:.3g} rad\n",
                     kDecodePosition, worst_f32_angle);
  out << fmt::format("prefill q [1,{},{},{}] + k [1,{},{},{}] f32, CPU kernels (all threads):\n", kPrefill,
                     kQueryHeads, d, kPrefill, kKeyHeads, d);
  out << fmt::format("  table angles:      {:8.1f} ms, worst error {:.3f} x 2^-23 g (|a|+|b|) "
                     "(contract <= 1) over {} pairs\n",
                     prefill_ms, prefill_table.worst_contract, prefill_table.pairs);
  out << fmt::format("  on-the-fly angles: {:8.1f} ms, worst error {:.3f} x 2^-23 g (|a|+|b|)\n",
                     prefill_fly_ms, prefill_fly.worst_contract);
  out << fmt::format("decode q [1,1,{},{}] + k [1,1,{},{}] at position {}: {:.3f} ms, worst error "
                     "{:.3f} x 2^-23 g (|a|+|b|)\n",
                     kQueryHeads, d, kKeyHeads, d, kDecodePosition, decode_ms, decode.worst_contract);
  out << (table_ok && apply_ok ? "all checks passed\n" : "CHECK FAILED\n");
  return table_ok && apply_ok ? 0 : 1;
}

}  // namespace rotary::cli
