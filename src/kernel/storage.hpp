// Internal: how every backend loads and stores an element of each dtype. Load widens to the
// compute type (float for f32/f16/bf16, double for f64), store narrows once (nearest even,
// math/half.hpp), `Bits` is the element as an integer for bit-exact copies (pass-through
// channels, NaN payloads kept). ROTARY_HD: the reference, the CPU's strided path, the CUDA
// kernels and their host emulation share it.
#pragma once

#include <cstdint>

#include "../math/half.hpp"
#include "../math/hd.hpp"
#include "rotary/tensor.hpp"

namespace rotary::detail {

/// Tags of the 16-bit storage types (binary16, bfloat16).
struct F16 {};
struct BF16 {};

template <class T>
struct Storage;
template <>
struct Storage<float> {
  using Value = float;
  using Bits = uint32_t;
  ROTARY_HD static float load(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
  ROTARY_HD static void store(void* p, int64_t i, float v) { static_cast<float*>(p)[i] = v; }
};
template <>
struct Storage<double> {
  using Value = double;
  using Bits = uint64_t;
  ROTARY_HD static double load(const void* p, int64_t i) { return static_cast<const double*>(p)[i]; }
  ROTARY_HD static void store(void* p, int64_t i, double v) { static_cast<double*>(p)[i] = v; }
};
template <>
struct Storage<F16> {
  using Value = float;
  using Bits = uint16_t;
  ROTARY_HD static float load(const void* p, int64_t i) {
    return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  ROTARY_HD static void store(void* p, int64_t i, float v) {
    static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
  }
};
template <>
struct Storage<BF16> {
  using Value = float;
  using Bits = uint16_t;
  ROTARY_HD static float load(const void* p, int64_t i) {
    return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  ROTARY_HD static void store(void* p, int64_t i, float v) {
    static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
  }
};

/// Calls f.template operator()<T>() with T the storage tag of `dtype` (float, double, F16, BF16).
template <class F>
decltype(auto) with_storage(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f64: return f.template operator()<double>();
    case DType::f16: return f.template operator()<F16>();
    case DType::bf16: return f.template operator()<BF16>();
    default: return f.template operator()<float>();
  }
}

}  // namespace rotary::detail
