#!/usr/bin/env bash
# Every one of the 2^32 floats encoded by math/quant.hpp as it is now and as it was before the
# encoder lost its data-dependent branches (532175c^): fp8 e4m3, fp8 e5m2 and int8 codes must agree
# (bench/record-issue25-2core.md). Needs the repository's history (not a shallow clone or a tarball).
# About two minutes on one core. Usage: bench/quant_exhaustive.sh
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git show 532175c^:src/math/quant.hpp |
  sed 's/namespace rotary::detail {/namespace old_q {\nusing namespace rotary::detail;/;
       s/Fp8Format kE4M3 =/Fp8Format kE4M3_ =/; s/Fp8Format kE5M2 =/Fp8Format kE5M2_ =/' > "$work/old_quant.hpp"
cat > "$work/exhaustive.cpp" <<'CPP'
#include <cstdint>
#include <cstdio>
#include "math/quant.hpp"
#include "old_quant.hpp"
int main() {
  using namespace rotary::detail;
  uint64_t differ = 0;
  for (uint64_t i = 0; i <= 0xffffffffull; ++i) {
    const float x = float_from_bits(static_cast<uint32_t>(i));
    differ += float_to_fp8(x, kE4M3) != old_q::float_to_fp8(x, old_q::kE4M3_);
    differ += float_to_fp8(x, kE5M2) != old_q::float_to_fp8(x, old_q::kE5M2_);
    differ += float_to_i8(x) != old_q::float_to_i8(x);
  }
  std::printf("codes that differ over all 2^32 floats (e4m3, e5m2, int8): %llu\n", static_cast<unsigned long long>(differ));
  return differ == 0 ? 0 : 1;
}
CPP
g++ -O2 -std=c++20 -Isrc -Isrc/math -Iinclude -I"$work" "$work/exhaustive.cpp" -o "$work/exhaustive"
"$work/exhaustive"
