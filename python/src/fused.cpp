// The fused operations of rotary/fused.hpp (rope_store, qk_norm_rope, rerotate_cache) for
// rotary.torch (python/rotary/torch/fused.py), on the CPU, or (a build with the CUDA kernels) on a
// CUDA device through rotary::cuda's fused calls when q (k_cache) is a CUDA tensor, queued on torch's
// current stream with the device's error word (rotary.torch.check_positions raises for it). That
// layer hands over torch tensors, all on one device: activations [batch, seq, heads, dim] or packed
// [tokens, heads, dim] (one batch row), caches [num_blocks, block_size, heads, dim] (an HND cache as
// its permuted view) or a token pool [slots, heads, dim] (blocks of one slot), slots, scales,
// weights and positions contiguous; a tensor of another shape, dtype or layout is a TypeError or
// ValueError here (rotary.torch's eager fast path then takes the general one, which converts or
// names it). Each tensor becomes the library's view (pointer, dtype, shape, strides, read from the
// tensor: torch's float8 dtypes have no DLPack code), and every rule is the library's own validate,
// run by the operation before it writes anything (rotary::Error: ValueError in Python).
#include "fused.hpp"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "rotary/fused.hpp"

namespace py = pybind11;
using namespace rotary;

namespace {

struct Borrowed {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::array<int64_t, 4> shape{};
  std::array<int64_t, 4> strides{};
  int64_t ndim = 0;
  int64_t numel = 0;
};

// Attribute names looked up on every tensor of a call, made once (interned): a decode step's cost is
// mostly this layer's attribute reads.
struct Names {
  py::handle shape = py::str("shape").release();
  py::handle stride = py::str("stride").release();
  py::handle data_ptr = py::str("data_ptr").release();
  py::handle dtype = py::str("dtype").release();
  py::handle is_neg = py::str("is_neg").release();
};
const Names& names() {
  static const Names n;
  return n;
}

// torch's dtype objects this layer takes, by identity (what `tensor.dtype` returns), with their names.
struct TorchDtype {
  py::handle object;
  std::optional<DType> dtype;  ///< none: an index dtype (slots, positions), no value dtype
  const char* name;
};
const std::array<TorchDtype, 9>& torch_dtypes() {
  static const std::array<TorchDtype, 9> dtypes = [] {
    const py::module_ torch = py::module_::import("torch");
    const auto get = [&](const char* attr) { return py::object(torch.attr(attr)).release(); };
    return std::array<TorchDtype, 9>{{{get("float32"), DType::f32, "torch.float32"},
                                      {get("float64"), DType::f64, "torch.float64"},
                                      {get("float16"), DType::f16, "torch.float16"},
                                      {get("bfloat16"), DType::bf16, "torch.bfloat16"},
                                      {get("float8_e4m3fn"), DType::fp8_e4m3, "torch.float8_e4m3fn"},
                                      {get("float8_e5m2"), DType::fp8_e5m2, "torch.float8_e5m2"},
                                      {get("int8"), DType::i8, "torch.int8"},
                                      {get("int64"), std::nullopt, "torch.int64"},
                                      {get("int32"), std::nullopt, "torch.int32"}}};
  }();
  return dtypes;
}

// The torch dtype's name ("torch.bfloat16"), or its repr when this layer does not take it.
std::string dtype_name(py::handle tensor) {
  const py::object dtype = tensor.attr(names().dtype);
  for (const TorchDtype& d : torch_dtypes()) {
    if (dtype.ptr() == d.object.ptr()) return d.name;
  }
  return py::str(dtype);
}

DType dtype_of(py::handle tensor, const char* name) {
  const py::object dtype = tensor.attr(names().dtype);
  for (const TorchDtype& d : torch_dtypes()) {
    if (dtype.ptr() == d.object.ptr() && d.dtype) return *d.dtype;
  }
  throw py::type_error(std::string(name) + " dtype must be float32, float64, float16, bfloat16, float8_e4m3fn, "
                       "float8_e5m2 or int8, got " + std::string(py::str(dtype)));
}

// A torch tensor of at most 4 dimensions as pointer, shape and strides (elements); with `typed`, its
// dtype too (a value dtype: data, caches, weights).
Borrowed borrow(py::handle tensor, const char* name, bool typed = true) {
  const Names& n = names();
  Borrowed b;
  const py::tuple shape = tensor.attr(n.shape);
  const py::tuple strides = tensor.attr(n.stride)();
  b.ndim = static_cast<int64_t>(shape.size());
  if (b.ndim > 4) throw py::value_error(std::string(name) + " has " + std::to_string(b.ndim) + " dimensions");
  b.numel = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    b.shape[d] = shape[d].cast<int64_t>();
    b.strides[d] = strides[d].cast<int64_t>();
    b.numel *= b.shape[d];
  }
  b.data = reinterpret_cast<void*>(tensor.attr(n.data_ptr)().cast<uintptr_t>());
  if (typed) b.dtype = dtype_of(tensor, name);
  if (tensor.attr(n.is_neg)().cast<bool>()) {  // its memory holds -values (x.conj().imag, torch._neg_view)
    throw py::value_error(std::string(name) + " has torch's negative bit set (a lazily negated view): its memory "
                          "holds the negated values (pass x.resolve_neg())");
  }
  return b;
}

// Whether b's elements are its numel consecutive ones in row-major order (size-1 dimensions' strides
// do not matter).
bool row_major(const Borrowed& b) {
  for (int64_t d = 0; d < b.ndim; ++d) {
    if (b.shape[d] == 0) return true;  // no element: any strides address none of them
  }
  int64_t expected = 1;
  for (int64_t d = b.ndim - 1; d >= 0; --d) {
    if (b.shape[d] != 1 && b.strides[d] != expected) return false;
    expected *= b.shape[d];
  }
  return true;
}

// b with a leading dimension of one inserted at `at` (stride: the element count after it, any value
// would do for a dimension of one).
Borrowed with_unit_dim(Borrowed b, int64_t at) {
  for (int64_t d = b.ndim; d > at; --d) {
    b.shape[d] = b.shape[d - 1];
    b.strides[d] = b.strides[d - 1];
  }
  b.shape[at] = 1;
  b.strides[at] = at + 1 < b.ndim + 1 ? b.shape[at + 1] * b.strides[at + 1] : 1;
  ++b.ndim;
  return b;
}

// [batch, seq, heads, dim], or packed [tokens, heads, dim] as one batch row.
TensorView view_of(const py::object& tensor, const char* name) {
  if (tensor.is_none()) return TensorView{};
  Borrowed b = borrow(tensor, name);
  if (b.ndim == 3) b = with_unit_dim(b, 0);
  if (b.ndim != 4) {
    throw py::value_error(std::string(name) + " must have 3 or 4 dimensions, got " + std::to_string(b.ndim));
  }
  return TensorView{.data = b.data, .dtype = b.dtype, .shape = b.shape, .strides = b.strides};
}

// [num_blocks, block_size, heads, dim] (any strides), or a token pool [slots, heads, dim] (blocks of
// one slot), as a CacheView.
CacheView cache_of(const py::object& tensor, const char* name) {
  if (tensor.is_none()) return CacheView{};
  Borrowed b = borrow(tensor, name);
  if (b.ndim == 3) b = with_unit_dim(b, 1);
  if (b.ndim != 4) {
    throw py::value_error(std::string(name) + " must have 3 or 4 dimensions, got " + std::to_string(b.ndim));
  }
  return CacheView{.data = b.data, .dtype = b.dtype, .block_size = b.shape[1], .num_blocks = b.shape[0],
                   .heads = b.shape[2], .head_dim = b.shape[3], .strides = b.strides};
}

// Contiguous int64 or int32 [tokens].
Slots slots_of(const py::object& tensor) {
  const Borrowed b = borrow(tensor, "slots", false);
  const std::string dtype = dtype_name(tensor);
  if (dtype != "torch.int64" && dtype != "torch.int32") {
    throw py::type_error("slots must be an int64 or int32 tensor, got dtype " + dtype);
  }
  if (b.ndim != 1 || !row_major(b)) throw py::value_error("slots must be a contiguous [tokens] tensor");
  return Slots{.data = b.data, .is_i64 = dtype == "torch.int64", .count = b.numel};
}

// A contiguous float32 scale of 1 or heads values; None: 1.0.
CacheQuant quant_of(const py::object& scale, ScaleMode mode, const char* name) {
  if (scale.is_none()) return CacheQuant{.mode = mode};
  const Borrowed b = borrow(scale, name);
  if (b.dtype != DType::f32 || b.ndim > 1 || !row_major(b)) {
    throw py::type_error(std::string(name) + " must be a contiguous float32 tensor of 0 or 1 dimension");
  }
  return CacheQuant{.scale = static_cast<const float*>(b.data), .count = b.numel, .mode = mode};
}

ScaleMode scale_mode_of(const std::string& mode) {
  if (mode == "divide") return ScaleMode::divide;
  if (mode == "multiply") return ScaleMode::multiply;
  throw py::value_error("scale_mode='" + mode + "' must be 'divide' or 'multiply'");
}

// Contiguous per-token positions ([tokens] or [streams, tokens]), or sequential from offset.
Positions positions_of(const py::object& positions, int streams, int64_t offset) {
  if (positions.is_none()) return Positions::sequential(offset);
  const std::string dtype = dtype_name(positions);
  const Borrowed b = borrow(positions, "positions", false);
  if (!row_major(b)) throw py::value_error("positions must be contiguous");
  const auto n = static_cast<size_t>(b.numel);
  if (dtype == "torch.int64") return Positions::per_token(std::span(static_cast<const int64_t*>(b.data), n), streams);
  if (dtype == "torch.int32") return Positions::per_token(std::span(static_cast<const int32_t*>(b.data), n), streams);
  if (dtype == "torch.float64") return Positions::per_token(std::span(static_cast<const double*>(b.data), n), streams);
  if (dtype == "torch.float32") return Positions::per_token(std::span(static_cast<const float*>(b.data), n), streams);
  throw py::type_error("positions must be int64, int32, float64 or float32, got " + dtype);
}

NormWeight weight_of(const py::object& weight, const char* name) {
  if (weight.is_none()) return NormWeight{};
  const Borrowed b = borrow(weight, name);
  if (!row_major(b)) throw py::value_error(std::string(name) + " must be contiguous");
  return NormWeight{.data = b.data, .dtype = b.dtype, .count = b.numel};
}

// vLLM's cos_sin_cache [rows, rotary_dim] (rotary.torch checked its width) as the caller's angles per
// position: row p holds pair j's cos in column j and its sin in column rotary_dim/2 + j.
std::optional<CallerAngles> caller_angles_of(const py::object& cache, const Schedule& schedule) {
  if (cache.is_none()) return std::nullopt;
  const Borrowed b = borrow(cache, "cos_sin_cache");
  const int64_t pairs = schedule.pairs();
  const auto* sin = b.data == nullptr ? nullptr
                                      : static_cast<const char*>(b.data) + pairs * b.strides[1] * size_of(b.dtype);
  const std::array<int64_t, 3> strides{0, b.strides[0], b.strides[1]};
  return CallerAngles{.index = CallerAngles::Index::per_position, .columns = CallerAngles::Columns::pairs,
                      .cos = b.data, .sin = sin, .dtype = b.dtype, .shape = {1, b.shape[0], pairs},
                      .cos_strides = strides, .sin_strides = strides};
}

// A contiguous int32 CPU tensor (rotary.torch.slots_from_page_table made it so) as a span.
std::span<const int32_t> int32s(const py::object& tensor, const char* name) {
  const Borrowed b = borrow(tensor, name, false);
  return {static_cast<const int32_t*>(b.data), static_cast<size_t>(b.numel)};
}

// The rows of the Rope's table a call reads: positions 0 .. the largest whole position (every stream),
// or 0 (no table: fractional positions, or a position apply's validate will refuse).
int64_t table_rows(const Positions& p, int64_t seq) {
  if (p.kind == Positions::Kind::sequential) return p.offset >= 0 ? p.offset + seq : 0;
  if (p.is_fractional()) return 0;
  int64_t largest = -1;
  for (int64_t i = 0; i < p.count * p.streams; ++i) {
    const int64_t v = p.kind == Positions::Kind::per_token_i64 ? static_cast<const int64_t*>(p.data)[i]
                                                               : static_cast<const int32_t*>(p.data)[i];
    if (v < 0 || v >= max_position_limit) return 0;
    largest = std::max(largest, v);
  }
  return largest + 1;
}

// The Rope's table of `mode` for this call's positions (apply's angles, read instead of computing each
// token's), or null: none needed, f64 data (which turns by double cos and sin, as Rope::apply turns
// it: a float32 table would round them), or beyond the Rope's cache (then computed on the fly: the
// same bits).
std::shared_ptr<const Table> table_for(const FusedHooks& hooks, const py::object& rope, const Positions& p,
                                       int64_t seq, AngleMode mode, DType dtype) {
  if (dtype == DType::f64) return nullptr;
  const int64_t rows = table_rows(p, seq);
  return rows > 0 ? hooks.table_of(rope, rows, mode) : nullptr;
}

// "exact" or "hf-float32" (rotary.torch checked the word).
AngleMode angle_mode_of(const std::string& angles) {
  if (angles == "exact") return AngleMode::exact;
  if (angles == "hf-float32") return AngleMode::hf_float32;
  throw py::value_error("angles='" + angles + "' must be 'exact' or 'hf-float32'");
}

// The CUDA device of a torch tensor, or none for a CPU tensor (rotary.torch checked that every tensor
// of the call is on q's device).
std::optional<int> cuda_device_of(const py::object& tensor) {
  static const py::handle is_cuda = py::str("is_cuda").release();
  if (!tensor.attr(is_cuda).cast<bool>()) return std::nullopt;
  return tensor.attr("device").attr("index").cast<int>();
}

#if ROTARY_PY_CUDA
// The rows of the Rope's device table a CUDA call reads: sequential positions only (rows the host
// knows without reading the device; per-token positions are computed on the device, the same bits,
// so nothing is read back and the call stays capturable in a CUDA graph); 0: none (and for f64
// data, which turns by double cos and sin: table_for).
int64_t device_table_rows(const ApplyArgs& rope) {
  const Positions& p = rope.positions;
  const int64_t seq = rope.q.seq();
  if (rope.caller_angles != nullptr || p.kind != Positions::Kind::sequential || rope.q.batch() <= 0 || seq <= 0 ||
      rope.q.dtype == DType::f64) {
    return 0;
  }
  if (p.offset < 0 || p.offset >= max_position_limit || p.offset > max_position_limit - seq) return 0;
  return p.offset + seq;
}
#endif

#if !ROTARY_PY_CUDA
// A CUDA call without CUDA kernels in this build (rotary.torch says so first; this is the guard).
[[noreturn]] void no_cuda_kernels(const char* name, int device) {
  throw py::value_error(std::string(name) + " is on cuda:" + std::to_string(device) +
                        ", but this build of rotary has no CUDA kernels");
}
#endif

}  // namespace

void bind_fused(py::module_& m, FusedHooks hooks) {
  m.def("slots_from_page_table", [](const py::object& kv_indices, const py::object& kv_indptr,
                                    const py::object& batch_indices, const py::object& positions, int64_t block_size) {
    std::vector<int64_t> slots = slots_from_page_table(int32s(kv_indices, "kv_indices"), int32s(kv_indptr, "kv_indptr"),
                                                       int32s(batch_indices, "batch_indices"),
                                                       int32s(positions, "positions"), block_size);
    py::array_t<int64_t> out(static_cast<py::ssize_t>(slots.size()));
    std::copy(slots.begin(), slots.end(), out.mutable_data());
    return out;
  });

  m.def("rope_store", [hooks](const py::object& rope, const py::object& q, const py::object& k, const py::object& v,
                              const py::object& k_cache, const py::object& v_cache, const py::object& slots,
                              const py::object& positions, int streams, int64_t offset, bool inverse,
                              const py::object& k_scale, const py::object& v_scale, const std::string& scale_mode,
                              const py::object& q_quantized, const py::object& q_scale, const py::object& k_pass,
                              const py::object& k_pass_cache, const py::object& k_pass_scale,
                              const py::object& cos_sin_cache, const std::string& angles, bool check_duplicates,
                              const py::object& k_out) {
    const Schedule& schedule = hooks.schedule_of(rope);
    static_cast<void>(check_duplicates);  // the CPU checks every call's slots on the host
    const ScaleMode mode = scale_mode_of(scale_mode);
    RopeStoreArgs args;
    args.rope = ApplyArgs{.q = view_of(q, "q"), .k = view_of(k, "k"),
                          .positions = positions_of(positions, streams, offset),
                          .direction = inverse ? Direction::inverse : Direction::forward};
    args.cache = CacheWrite{.slots = slots_of(slots), .k_cache = cache_of(k_cache, "k_cache"),
                            .v_cache = cache_of(v_cache, "v_cache"), .v = view_of(v, "v"),
                            .k_quant = quant_of(k_scale, mode, "k_scale"),
                            .v_quant = quant_of(v_scale, mode, "v_scale")};
    // q_out: a quantised copy of q (q_quantized), or q's rotation out of place (q's dtype).
    const TensorView q_out = view_of(q_quantized, "q_out");
    if (!q_quantized.is_none() && !is_quantised_dtype(q_out.dtype)) {
      args.rope.q_out = q_out;
    } else {
      args.q_quantized = q_out;
    }
    args.rope.k_out = view_of(k_out, "k_out");
    args.q_quant = quant_of(q_scale, mode, "q_scale");
    args.cache.k_pass = view_of(k_pass, "k_pass");
    args.cache.k_pass_cache = cache_of(k_pass_cache, "k_pass_cache");
    args.cache.k_pass_quant = quant_of(k_pass_scale, mode, "k_pass_scale");
    const std::optional<CallerAngles> caller = caller_angles_of(cos_sin_cache, schedule);
    const AngleMode numerics = angle_mode_of(angles);
    if (numerics != AngleMode::exact) args.rope.numerics = numerics;
    args.rope.caller_angles = caller ? &*caller : nullptr;
    if (const std::optional<int> device = cuda_device_of(q)) {
#if ROTARY_PY_CUDA
      hooks.on_device(rope, *device, device_table_rows(args.rope), numerics, [&](const DeviceCall& d) {
        py::gil_scoped_release release;
        cuda::rope_store(schedule, args, d.stream,
                         {.table = d.table, .error = d.error, .check_duplicate_slots = check_duplicates});
      });
      return;
#else
      no_cuda_kernels("q", *device);
#endif
    }
    const std::shared_ptr<const Table> table =
        caller ? nullptr : table_for(hooks, rope, args.rope.positions, args.rope.q.seq(), numerics, args.rope.q.dtype);
    args.rope.table = table.get();
    py::gil_scoped_release release;
    rope_store(schedule, args);
  });

  // With k_cache: k (and v) also written to the caches at the slots, as rope_store writes them; k is
  // still normed and rotated in place (k_out = k), v's normed values go to v_cache only.
  m.def("qk_norm_rope", [hooks](const py::object& rope, const py::object& q, const py::object& k,
                                const py::object& q_weight, const py::object& k_weight, float eps,
                                const py::object& positions, int streams, int64_t offset, bool inverse,
                                float weight_offset, const std::string& order, const std::string& scope,
                                const std::string& rounding, const py::object& v, bool v_norm,
                                const py::object& k_cache, const py::object& v_cache, const py::object& slots,
                                const py::object& k_scale, const py::object& v_scale, const std::string& scale_mode,
                                const py::object& cos_sin_cache, const std::string& angles, bool check_duplicates,
                                const py::object& q_out, const py::object& k_out) {
    const Schedule& schedule = hooks.schedule_of(rope);
    static_cast<void>(check_duplicates);  // the CPU checks every call's slots on the host
    QkNormRopeArgs args;
    args.rope = ApplyArgs{.q = view_of(q, "q"), .k = view_of(k, "k"),
                          .positions = positions_of(positions, streams, offset),
                          .direction = inverse ? Direction::inverse : Direction::forward};
    args.q_weight = weight_of(q_weight, "q_weight");
    args.k_weight = weight_of(k_weight, "k_weight");
    args.eps = eps;
    args.weight_offset = weight_offset;
    if (order == "norm_rope") args.order = NormOrder::norm_then_rope;
    else if (order == "rope_norm") args.order = NormOrder::rope_then_norm;
    else throw py::value_error("order='" + order + "' must be 'norm_rope' or 'rope_norm'");
    if (scope == "head") args.scope = NormScope::head;
    else if (scope == "all_heads") args.scope = NormScope::all_heads;
    else throw py::value_error("scope='" + scope + "' must be 'head' or 'all_heads'");
    if (rounding == "llama") args.rounding = NormRounding::llama;
    else if (rounding == "gemma") args.rounding = NormRounding::gemma;
    else throw py::value_error("rounding='" + rounding + "' must be 'llama' or 'gemma'");
    args.v = view_of(v, "v");
    args.v_norm = v_norm;
    CacheWrite store;
    if (!k_cache.is_none()) {
      const ScaleMode mode = scale_mode_of(scale_mode);
      store = CacheWrite{.slots = slots_of(slots), .k_cache = cache_of(k_cache, "k_cache"),
                         .v_cache = cache_of(v_cache, "v_cache"), .v = args.v,
                         .k_quant = quant_of(k_scale, mode, "k_scale"),
                         .v_quant = quant_of(v_scale, mode, "v_scale")};
      args.store = &store;
      args.rope.k_out = args.rope.k;
    }
    args.rope.q_out = view_of(q_out, "q_out");  // q's (k's) normed rotation out of place
    if (!k_out.is_none()) args.rope.k_out = view_of(k_out, "k_out");
    const std::optional<CallerAngles> caller = caller_angles_of(cos_sin_cache, schedule);
    const AngleMode numerics = angle_mode_of(angles);
    if (numerics != AngleMode::exact) args.rope.numerics = numerics;
    args.rope.caller_angles = caller ? &*caller : nullptr;
    if (const std::optional<int> device = cuda_device_of(q)) {
#if ROTARY_PY_CUDA
      hooks.on_device(rope, *device, device_table_rows(args.rope), numerics, [&](const DeviceCall& d) {
        py::gil_scoped_release release;
        cuda::qk_norm_rope(schedule, args, d.stream,
                           {.table = d.table, .error = d.error, .check_duplicate_slots = check_duplicates});
      });
      return;
#else
      no_cuda_kernels("q", *device);
#endif
    }
    const std::shared_ptr<const Table> table =
        caller ? nullptr : table_for(hooks, rope, args.rope.positions, args.rope.q.seq(), numerics, args.rope.q.dtype);
    args.rope.table = table.get();
    py::gil_scoped_release release;
    qk_norm_rope(schedule, args);
  });

  m.def("rerotate_cache", [hooks](const py::object& rope, const py::object& k_cache, const py::object& slots,
                                  const py::object& delta, int delta_streams, const py::object& positions, int streams,
                                  bool inverse, const py::object& k_scale, const std::string& scale_mode,
                                  bool check_duplicates, const std::string& angles) {
    const Schedule& schedule = hooks.schedule_of(rope);
    static_cast<void>(check_duplicates);  // the CPU checks every call's slots on the host
    RerotateCacheArgs args{.cache = cache_of(k_cache, "k_cache"), .slots = slots_of(slots)};
    args.rotated = inverse ? Direction::inverse : Direction::forward;
    if (!delta.is_none()) {
      args.mode = RerotateMode::delta;
      args.delta = static_cast<const int64_t*>(borrow(delta, "delta", false).data);
      args.delta_streams = delta_streams;
    } else {
      args.mode = RerotateMode::raw;
      args.positions = positions_of(positions, streams, 0);
    }
    const AngleMode numerics = angle_mode_of(angles);
    if (numerics != AngleMode::exact) args.numerics = numerics;
    args.quant = quant_of(k_scale, scale_mode_of(scale_mode), "k_scale");
    if (const std::optional<int> device = cuda_device_of(k_cache)) {
#if ROTARY_PY_CUDA
      // Angles computed on the device, exact or in `numerics` (raw positions are per slot: no table's rows).
      hooks.on_device(rope, *device, 0, numerics, [&](const DeviceCall& d) {
        py::gil_scoped_release release;
        cuda::rerotate_cache(schedule, args, d.stream, {.error = d.error, .check_duplicate_slots = check_duplicates});
      });
      return;
#else
      no_cuda_kernels("k_cache", *device);
#endif
    }
    const std::shared_ptr<const Table> table =
        args.mode == RerotateMode::raw
            ? table_for(hooks, rope, args.positions, args.slots.count, numerics, args.cache.dtype)
            : nullptr;
    args.table = table.get();
    py::gil_scoped_release release;
    rerotate_cache(schedule, args);
  });
}
