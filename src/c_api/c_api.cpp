// The C ABI (include/rotary/rotary.h): converts C structs to the C++ API and C++ exceptions to
// status codes. No rule is checked here that the C++ API checks: only what the C encoding adds
// (NULL pointers, enum values that C can hold but C++ must not see, 0 meaning unset).
#include "rotary/rotary.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <cstring>
#include <exception>
#include <iterator>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "c_api_internal.hpp"
#include "rotary/apply.hpp"
#include "rotary/error.hpp"
#include "rotary/fused.hpp"
#include "rotary/hf_config.hpp"
#include "rotary/schedule.hpp"
#include "rotary/spec.hpp"
#include "rotary/table.hpp"
#include "rotary/tensor.hpp"
#include "schedules/registry.hpp"

namespace {

// ---- errors: one thread-local message, every exception caught (c_api_internal.hpp) ----

thread_local std::string t_message;
thread_local const char* t_error = "";

}  // namespace

int rotary::detail::c_abi::fail(int status, const char* message) noexcept {
  try {
    t_message = message;
    t_error = t_message.c_str();
  } catch (...) {  // no memory left even for the message
    t_error = "rotary: out of memory while recording an error";
  }
  return status;
}

namespace {

using rotary::Error;
using rotary::detail::c_abi::fail;
using rotary::detail::c_abi::guarded;
using rotary::detail::c_abi::require;

// For the accessors, which return a value: records the error and gives `fallback`.
template <class T>
T null_argument(const char* name, T fallback) noexcept {
  fail(ROTARY_ERROR_INVALID_ARGUMENT, name);
  return fallback;
}

std::string_view require_text(const char* text, const char* name) {
  if (text == nullptr) throw Error(fmt::format("{} is NULL", name));
  return text;
}

// Starts a constructor: `out` must be non-NULL and is NULL until success.
template <class T>
void start(T** out) {
  if (out == nullptr) throw Error("out is NULL");
  *out = nullptr;
}

// ---- enums: C may store any integer in them; C++ must not load an out-of-range enum value ----

// The integer a C enum object holds, read as the signed type of its size (no enum load, so no UB):
// C stores an int there, and a C enum without negative constants has an unsigned underlying type
// in C++, which would show -1 as 4294967295.
template <class E>
int64_t raw(const E& value) {
  std::make_signed_t<std::underlying_type_t<E>> integer;
  static_assert(sizeof integer == sizeof value);
  std::memcpy(&integer, &value, sizeof integer);
  return static_cast<int64_t>(integer);
}

rotary::DType to_dtype(const rotary_dtype& dtype, const char* name) {
  switch (raw(dtype)) {
    case ROTARY_F32: return rotary::DType::f32;
    case ROTARY_F64: return rotary::DType::f64;
    case ROTARY_F16: return rotary::DType::f16;
    case ROTARY_BF16: return rotary::DType::bf16;
    case ROTARY_FP8_E4M3: return rotary::DType::fp8_e4m3;
    case ROTARY_FP8_E5M2: return rotary::DType::fp8_e5m2;
    case ROTARY_I8: return rotary::DType::i8;
  }
  throw Error(fmt::format("{}.dtype={} is not ROTARY_F32, ROTARY_F64, ROTARY_F16 or ROTARY_BF16 (nor a cache dtype: "
                          "ROTARY_FP8_E4M3, ROTARY_FP8_E5M2, ROTARY_I8)", name, raw(dtype)));
}

rotary::Pairing to_pairing(const rotary_pairing& pairing) {
  switch (raw(pairing)) {
    case ROTARY_PAIRING_HALF: return rotary::Pairing::half;
    case ROTARY_PAIRING_INTERLEAVED: return rotary::Pairing::interleaved;
  }
  throw Error(fmt::format(
      "spec.pairing={} is not ROTARY_PAIRING_HALF or ROTARY_PAIRING_INTERLEAVED", raw(pairing)));
}

// The C values are rotary::ScheduleType's, one per entry of the schedule registry.
static_assert(ROTARY_SCHEDULE_LAST == static_cast<int>(rotary::ScheduleType::last) &&
                  ROTARY_SCHEDULE_LAST + 1 == rotary::detail::kScheduleEntries.size(),
              "rotary_schedule_type (rotary.h) needs one value per schedule of src/schedules/registry.hpp");

// "ROTARY_SCHEDULE_YARN" for yarn.
std::string c_name(rotary::ScheduleType type) {
  std::string name = "ROTARY_SCHEDULE_";
  for (const char c : rotary::to_string(type)) name.push_back(static_cast<char>(std::toupper(c)));
  return name;
}

rotary::ScheduleType to_schedule_type(const rotary_schedule_type& type) {
  const int64_t value = raw(type);
  if (value < 0 || value > ROTARY_SCHEDULE_LAST) {
    throw Error(fmt::format("spec.schedule={} is not a rotary_schedule_type ({}=0 .. {}={})", value,
                            c_name(rotary::ScheduleType{}), c_name(rotary::ScheduleType::last),
                            static_cast<int>(ROTARY_SCHEDULE_LAST)));
  }
  return static_cast<rotary::ScheduleType>(value);
}

std::optional<bool> to_toggle(const rotary_toggle& toggle, const char* name) {
  switch (raw(toggle)) {
    case ROTARY_TOGGLE_UNSET: return std::nullopt;
    case ROTARY_TOGGLE_ON: return true;
    case ROTARY_TOGGLE_OFF: return false;
  }
  throw Error(fmt::format(
      "spec.{}={} is not ROTARY_TOGGLE_UNSET, ROTARY_TOGGLE_ON or ROTARY_TOGGLE_OFF", name,
      raw(toggle)));
}

rotary::AngleMode to_angle_mode(const rotary_angle_mode& mode) {
  switch (raw(mode)) {
    case ROTARY_ANGLES_EXACT: return rotary::AngleMode::exact;
    case ROTARY_ANGLES_HF_FLOAT32: return rotary::AngleMode::hf_float32;
  }
  throw Error(fmt::format("mode={} is not ROTARY_ANGLES_EXACT or ROTARY_ANGLES_HF_FLOAT32",
                          raw(mode)));
}

rotary::Backend to_backend(const rotary_backend& backend) {
  switch (raw(backend)) {
    case ROTARY_BACKEND_AUTO: return rotary::Backend::automatic;
    case ROTARY_BACKEND_REFERENCE: return rotary::Backend::reference;
    case ROTARY_BACKEND_CPU: return rotary::Backend::cpu;
  }
  throw Error(fmt::format(
      "backend={} is not ROTARY_BACKEND_AUTO, ROTARY_BACKEND_REFERENCE or ROTARY_BACKEND_CPU",
      raw(backend)));
}

// A C int used as a flag: 0 or 1, anything else is most likely garbage.
bool to_flag(int value, const char* name, const char* meaning) {
  if (value != 0 && value != 1) {
    throw Error(fmt::format("{}={} must be 0 or 1 ({})", name, value, meaning));
  }
  return value == 1;
}

// ---- spec: 0 means unset ----

template <class T>
std::optional<T> unless_zero(T value) {
  if (value == T{0}) return std::nullopt;
  return value;
}

std::vector<double> factor_list(const double* values, int64_t count, const char* name) {
  if (count < 0) throw Error(fmt::format("spec.{}_count={} must be >= 0", name, count));
  if (count > 0 && values == nullptr) {
    throw Error(fmt::format("spec.{} is NULL but spec.{}_count={}", name, name, count));
  }
  return count == 0 ? std::vector<double>{} : std::vector<double>(values, values + count);
}

rotary::Spec to_spec(const rotary_spec& c) {
  rotary::Spec spec;
  spec.head_dim = c.head_dim;
  spec.rotary_dim = c.rotary_dim;
  spec.base = c.base == 0 ? rotary::Spec{}.base : c.base;
  spec.pairing = to_pairing(c.pairing);
  spec.schedule = to_schedule_type(c.schedule);
  spec.factor = unless_zero(c.factor);
  spec.original_max_position = unless_zero(c.original_max_position);
  spec.max_position = unless_zero(c.max_position);
  spec.beta_fast = unless_zero(c.beta_fast);
  spec.beta_slow = unless_zero(c.beta_slow);
  spec.mscale = unless_zero(c.mscale);
  spec.mscale_all_dim = unless_zero(c.mscale_all_dim);
  spec.truncate = to_toggle(c.truncate, "truncate");
  spec.attention_factor = unless_zero(c.attention_factor);
  spec.low_freq_factor = unless_zero(c.low_freq_factor);
  spec.high_freq_factor = unless_zero(c.high_freq_factor);
  spec.short_factor = factor_list(c.short_factor, c.short_factor_count, "short_factor");
  spec.long_factor = factor_list(c.long_factor, c.long_factor_count, "long_factor");
  spec.max_length = unless_zero(c.max_length);
  spec.monotone_scale = unless_zero(c.monotone_scale);
  return spec;
}

constexpr rotary::StreamLayout kStreamLayouts[] = {
    rotary::StreamLayout::single, rotary::StreamLayout::sections, rotary::StreamLayout::interleaved_sections,
    rotary::StreamLayout::alternating_sections, rotary::StreamLayout::axial, rotary::StreamLayout::axial_even_odd};
static_assert(ROTARY_STREAMS_AXIAL_EVEN_ODD + 1 == std::size(kStreamLayouts));

// spec with the extension's fields.
rotary::Spec to_spec(const rotary_spec& c, const rotary_spec_ext* ext) {
  rotary::Spec spec = to_spec(c);
  if (ext == nullptr) return spec;
  spec.rotary_offset = ext->rotary_offset;
  spec.blocks = ext->blocks == 0 ? 1 : ext->blocks;
  const int64_t layout = raw(ext->stream_layout);
  if (layout < 0 || layout >= static_cast<int64_t>(std::size(kStreamLayouts))) {
    throw Error(fmt::format("ext.stream_layout={} is not a rotary_stream_layout (ROTARY_STREAMS_SINGLE=0 .. "
                            "ROTARY_STREAMS_AXIAL_EVEN_ODD=5)", layout));
  }
  spec.stream_layout = kStreamLayouts[layout];
  if (ext->sections_count < 0) throw Error(fmt::format("ext.sections_count={} must be >= 0", ext->sections_count));
  if (ext->sections == nullptr && ext->sections_count != 0) {
    throw Error(fmt::format("ext.sections is NULL but ext.sections_count={}", ext->sections_count));
  }
  if (ext->sections_count > rotary::max_streams) {
    throw Error(fmt::format("ext.sections_count={} exceeds max_streams={}", ext->sections_count, rotary::max_streams));
  }
  if (ext->sections_count != 0) spec.sections.assign(ext->sections, ext->sections + ext->sections_count);
  spec.partial_rotary_factor = unless_zero(ext->partial_rotary_factor);
  return spec;
}

rotary::ReadOptions to_read_options(const char* layer_type, int vision) {
  return rotary::ReadOptions{.layer_type = layer_type == nullptr ? std::string() : std::string(layer_type),
                             .vision = to_flag(vision, "vision", "1 reads the vision tower")};
}

std::optional<int64_t> to_seq_len(int64_t seq_len) {
  if (seq_len < 0) return std::nullopt;
  return seq_len;
}

int new_schedule(rotary_schedule** out, const auto& build) {
  return guarded([&] {
    start(out);
    *out = new rotary_schedule(build());
  });
}

// ---- apply ----

// Field for field; all zero gives the C++ default TensorView{} (absent).
rotary::TensorView to_view(const rotary_tensor& t, const char* name) {
  rotary::TensorView view;
  view.data = t.data;
  view.dtype = to_dtype(t.dtype, name);
  for (size_t d = 0; d < 4; ++d) {
    view.shape[d] = t.shape[d];
    view.strides[d] = t.strides[d];
  }
  return view;
}

rotary::Positions to_positions(const rotary_apply_args& a) {
  if (a.positions != nullptr && a.positions_i32 != nullptr) {
    throw Error("positions and positions_i32 are both set (give at most one)");
  }
  if (a.positions == nullptr && a.positions_i32 == nullptr) {
    if (a.positions_count != 0) {
      throw Error(fmt::format(
          "positions_count={} but positions and positions_i32 are NULL (sequential positions "
          "take offset only)",
          a.positions_count));
    }
    return rotary::Positions::sequential(a.offset);
  }
  if (a.offset != 0) {
    throw Error(fmt::format("offset={} is for sequential positions only, but per-token positions "
                            "are given",
                            a.offset));
  }
  if (a.positions_count < 0) {
    throw Error(fmt::format("positions_count={} must be >= 0", a.positions_count));
  }
  const auto count = static_cast<size_t>(a.positions_count);
  if (a.positions != nullptr) {
    return rotary::Positions::per_token(std::span<const int64_t>(a.positions, count));
  }
  return rotary::Positions::per_token(std::span<const int32_t>(a.positions_i32, count));
}

rotary::Positions to_positions(const rotary_positions& p) {
  const int streams = p.streams == 0 ? 1 : p.streams;
  if (p.count < 0) throw Error(fmt::format("positions.count={} must be >= 0", p.count));
  if (p.data == nullptr && p.count != 0) throw Error(fmt::format("positions.data is NULL but positions.count={}", p.count));
  const auto n = static_cast<size_t>(p.count);
  switch (raw(p.kind)) {
    case ROTARY_POSITIONS_I64: return rotary::Positions::per_token(std::span(static_cast<const int64_t*>(p.data), n), streams);
    case ROTARY_POSITIONS_I32: return rotary::Positions::per_token(std::span(static_cast<const int32_t*>(p.data), n), streams);
    case ROTARY_POSITIONS_F32: return rotary::Positions::per_token(std::span(static_cast<const float*>(p.data), n), streams);
    case ROTARY_POSITIONS_F64: return rotary::Positions::per_token(std::span(static_cast<const double*>(p.data), n), streams);
  }
  throw Error(fmt::format("positions.kind={} is not a rotary_position_kind (ROTARY_POSITIONS_I64=0 .. "
                          "ROTARY_POSITIONS_F64=3)", raw(p.kind)));
}

rotary_direction to_direction(int value) {
  if (value < ROTARY_FORWARD || value > ROTARY_UNDO_INVERSE) {
    throw Error(fmt::format("inverse={} is not a rotary_direction (ROTARY_FORWARD=0, ROTARY_INVERSE=1, "
                            "ROTARY_UNDO=2, ROTARY_UNDO_INVERSE=3)", value));
  }
  return static_cast<rotary_direction>(value);
}

rotary::ApplyArgs to_apply_args(const rotary_apply_args& a) {
  return rotary::ApplyArgs{
      .q = to_view(a.q, "q"),
      .k = to_view(a.k, "k"),
      .q_out = to_view(a.q_out, "q_out"),
      .k_out = to_view(a.k_out, "k_out"),
      .positions = to_positions(a),
      .direction = to_direction(a.inverse) == ROTARY_INVERSE || to_direction(a.inverse) == ROTARY_UNDO_INVERSE
                       ? rotary::Direction::inverse
                       : rotary::Direction::forward,
      .table = a.table == nullptr ? nullptr : &a.table->table,
      .copy_tail = !to_flag(a.skip_tail_copy, "skip_tail_copy", "1 leaves the tail unwritten"),
      .undo = to_direction(a.inverse) == ROTARY_UNDO || to_direction(a.inverse) == ROTARY_UNDO_INVERSE,
      .threads = a.threads,
      .backend = to_backend(a.backend),
  };
}

// *out = the view `build` makes, with the caller's dtype copied as bytes: C may pass any integer
// there, which rotary_apply rejects.
int make_tensor(rotary_tensor* out, const rotary_dtype& dtype, const auto& build) {
  return guarded([&] {
    if (out == nullptr) throw Error("out is NULL");
    *out = rotary_tensor{};
    const rotary::TensorView view = build();
    out->data = view.data;
    std::memcpy(&out->dtype, &dtype, sizeof dtype);
    for (size_t d = 0; d < 4; ++d) {
      out->shape[d] = view.shape[d];
      out->strides[d] = view.strides[d];
    }
  });
}


// ---- fused operations: the C images of fused.hpp's structs; 0 means the C++ default ----

rotary::CacheView to_cache(const rotary_cache_view& c, const char* name) {
  rotary::CacheView view;
  view.data = c.data;
  view.dtype = to_dtype(c.dtype, name);
  view.block_size = c.block_size == 0 ? 1 : c.block_size;
  view.num_blocks = c.num_blocks;
  view.heads = c.heads;
  view.head_dim = c.head_dim;
  for (size_t d = 0; d < 4; ++d) view.strides[d] = c.strides[d];
  view.offset = c.offset;
  return view;
}

}  // namespace

rotary::Slots rotary::detail::c_abi::to_slots(const rotary_slots& c, const char* name) {
  if (c.count < 0) throw Error(fmt::format("{}.count={} must be >= 0", name, c.count));
  if (c.data == nullptr && c.count != 0) throw Error(fmt::format("{}.data is NULL but {}.count={}", name, name, c.count));
  switch (raw(c.kind)) {
    case ROTARY_SLOTS_I64: return rotary::Slots{c.data, true, c.count};
    case ROTARY_SLOTS_I32: return rotary::Slots{c.data, false, c.count};
  }
  throw Error(fmt::format("{}.kind={} is not ROTARY_SLOTS_I64 or ROTARY_SLOTS_I32", name, raw(c.kind)));
}

namespace {

using rotary::detail::c_abi::to_slots;

rotary::CacheQuant to_quant(const rotary_cache_quant& c, const char* name) {
  rotary::CacheQuant quant;
  quant.scale = c.scale;
  quant.count = c.count == 0 ? 1 : c.count;
  switch (raw(c.mode)) {
    case ROTARY_SCALE_DIVIDE: quant.mode = rotary::ScaleMode::divide; break;
    case ROTARY_SCALE_MULTIPLY: quant.mode = rotary::ScaleMode::multiply; break;
    default:
      throw Error(fmt::format("{}.mode={} is not ROTARY_SCALE_DIVIDE or ROTARY_SCALE_MULTIPLY", name, raw(c.mode)));
  }
  return quant;
}

// with_v: the write's own v is read (rope_store); qk_norm_rope ignores it (its v is the call's).
rotary::CacheWrite to_cache_write(const rotary_cache_write& c, bool with_v) {
  rotary::CacheWrite w;
  w.slots = to_slots(c.slots);
  w.k_cache = to_cache(c.k_cache, "k_cache");
  w.v_cache = to_cache(c.v_cache, "v_cache");
  if (with_v) w.v = to_view(c.v, "v");
  w.k_quant = to_quant(c.k_quant, "k_quant");
  w.v_quant = to_quant(c.v_quant, "v_quant");
  w.k_pass = to_view(c.k_pass, "k_pass");
  w.k_pass_cache = to_cache(c.k_pass_cache, "k_pass_cache");
  w.k_pass_quant = to_quant(c.k_pass_quant, "k_pass_quant");
  return w;
}

rotary::NormWeight to_weight(const rotary_norm_weight& c, const char* name) {
  return rotary::NormWeight{c.data, to_dtype(c.dtype, name), c.count};
}

template <class E>
E to_choice(const auto& value, std::initializer_list<E> choices, const char* name, const char* names) {
  const int64_t v = raw(value);
  if (v < 0 || v >= static_cast<int64_t>(choices.size())) throw Error(fmt::format("{}={} is not {}", name, v, names));
  return choices.begin()[v];
}

int make_cache_view(rotary_cache_view* out, const rotary_dtype& dtype, const auto& build) {
  return guarded([&] {
    if (out == nullptr) throw Error("out is NULL");
    *out = rotary_cache_view{};
    const rotary::CacheView view = build();
    out->data = view.data;
    std::memcpy(&out->dtype, &dtype, sizeof dtype);
    out->block_size = view.block_size;
    out->num_blocks = view.num_blocks;
    out->heads = view.heads;
    out->head_dim = view.head_dim;
    for (size_t d = 0; d < 4; ++d) out->strides[d] = view.strides[d];
    out->offset = view.offset;
  });
}

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = rotary::preset_names();
  return names;
}

}  // namespace

rotary::ApplyArgs rotary::detail::c_abi::apply_args(bool rotates_backward, const rotary_apply_args& a,
                                                    const rotary_positions* positions) {
  if (positions != nullptr &&
      (a.positions != nullptr || a.positions_i32 != nullptr || a.positions_count != 0 || a.offset != 0)) {
    throw Error("args.positions, positions_i32, positions_count and offset must be 0 when positions are given "
                "separately");
  }
  ApplyArgs args = to_apply_args(a);
  if (positions != nullptr) args.positions = to_positions(*positions);
  // A model whose code turns pairs by -angle (rotates_backward) has rotary's inverse as its forward.
  if (rotates_backward) {
    args.direction = args.direction == Direction::forward ? Direction::inverse : Direction::forward;
  }
  return args;
}

// The fused calls' arguments (shared with the CUDA C ABI, src/cuda/c_api.cpp).
rotary::RopeStoreArgs rotary::detail::c_abi::rope_store_args(const rotary_schedule& s, const rotary_rope_store_args& a) {
  RopeStoreArgs store;
  store.rope = apply_args(s.rotates_backward, a.rope, a.positions);
  store.cache = to_cache_write(a.cache, /*with_v=*/true);
  store.q_quantized = to_view(a.q_quantized, "q_quantized");
  store.q_quant = to_quant(a.q_quant, "q_quant");
  return store;
}

rotary::QkNormRopeArgs rotary::detail::c_abi::qk_norm_rope_args(const rotary_schedule& s,
                                                                const rotary_qk_norm_rope_args& a, CacheWrite& write) {
  QkNormRopeArgs norm;
  norm.rope = apply_args(s.rotates_backward, a.rope, a.positions);
  norm.q_weight = to_weight(a.q_weight, "q_weight");
  norm.k_weight = to_weight(a.k_weight, "k_weight");
  norm.eps = a.eps == 0.0f ? QkNormRopeArgs{}.eps : a.eps;
  norm.weight_offset = a.weight_offset;
  norm.order = to_choice(a.order, {NormOrder::norm_then_rope, NormOrder::rope_then_norm}, "order",
                         "ROTARY_NORM_THEN_ROPE or ROTARY_ROPE_THEN_NORM");
  norm.rounding = to_choice(a.rounding, {NormRounding::llama, NormRounding::gemma}, "rounding",
                            "ROTARY_NORM_ROUNDING_LLAMA or ROTARY_NORM_ROUNDING_GEMMA");
  norm.scope = to_choice(a.scope, {NormScope::head, NormScope::all_heads}, "scope",
                         "ROTARY_NORM_SCOPE_HEAD or ROTARY_NORM_SCOPE_ALL_HEADS");
  norm.v_norm = to_flag(a.v_norm, "v_norm", "1 norms v");
  norm.v = to_view(a.v, "v");
  norm.v_out = to_view(a.v_out, "v_out");
  if (a.store != nullptr) {
    write = to_cache_write(*a.store, /*with_v=*/false);
    norm.store = &write;
  }
  return norm;
}

rotary::RerotateCacheArgs rotary::detail::c_abi::rerotate_cache_args(const rotary_schedule& s,
                                                                     const rotary_rerotate_cache_args& a) {
  RerotateCacheArgs re;
  re.cache = to_cache(a.cache, "cache");
  re.out = to_cache(a.out, "out");
  re.slots = to_slots(a.slots);
  re.mode = to_choice(a.mode, {RerotateMode::delta, RerotateMode::raw}, "mode",
                      "ROTARY_REROTATE_DELTA or ROTARY_REROTATE_RAW");
  re.delta = a.delta;
  re.delta_streams = a.delta_streams == 0 ? 1 : a.delta_streams;
  if (a.positions != nullptr) re.positions = to_positions(*a.positions);
  re.table = a.table == nullptr ? nullptr : &a.table->table;
  // A model whose code turns pairs by -angle has rotary's inverse as its forward (as rotary_apply).
  const bool inverse = to_flag(a.inverse, "inverse", "1: keys rotated inverse") != s.rotates_backward;
  re.rotated = inverse ? Direction::inverse : Direction::forward;
  re.quant = to_quant(a.quant, "quant");
  if (raw(a.numerics) == ROTARY_ANGLES_HF_FLOAT32) {
    re.numerics = rotary::AngleMode::hf_float32;
  } else if (raw(a.numerics) != ROTARY_ANGLES_EXACT) {
    throw Error(fmt::format("numerics={} is not ROTARY_ANGLES_EXACT or ROTARY_ANGLES_HF_FLOAT32", raw(a.numerics)));
  }
  re.threads = a.threads;
  re.backend = to_backend(a.backend);
  return re;
}

extern "C" {

const char* rotary_last_error(void) { return t_error; }

const char* rotary_version(void) { return ROTARY_VERSION_STRING; }

int rotary_schedule_from_spec(const rotary_spec* spec, int64_t seq_len, rotary_schedule** out) {
  return new_schedule(out, [&] {
    return rotary_schedule{rotary::make_schedule(to_spec(require(spec, "spec")), to_seq_len(seq_len))};
  });
}

int rotary_schedule_from_hf_config(const char* config_json, int64_t seq_len,
                                   rotary_schedule** out) {
  return new_schedule(out, [&] {
    const rotary::ModelRope model =
        rotary::read_hf_config(require_text(config_json, "config_json"));
    return rotary_schedule{rotary::make_schedule(model.spec, to_seq_len(seq_len)), model.rotates_backward};
  });
}

int rotary_schedule_from_preset(const char* name, int64_t seq_len, rotary_schedule** out) {
  return new_schedule(out, [&] {
    const rotary::ModelRope model = rotary::load_preset(require_text(name, "name"));
    return rotary_schedule{rotary::make_schedule(model.spec, to_seq_len(seq_len)), model.rotates_backward};
  });
}

int rotary_schedule_from_spec_ext(const rotary_spec* spec, const rotary_spec_ext* ext, int64_t seq_len,
                                  rotary_schedule** out) {
  return new_schedule(out, [&] {
    return rotary_schedule{rotary::make_schedule(to_spec(require(spec, "spec"), ext), to_seq_len(seq_len))};
  });
}

int rotary_schedule_from_hf_config_ex(const char* config_json, const char* layer_type, int vision,
                                      int64_t seq_len, rotary_schedule** out) {
  return new_schedule(out, [&] {
    const rotary::ModelRope model =
        rotary::read_hf_config(require_text(config_json, "config_json"), to_read_options(layer_type, vision));
    return rotary_schedule{rotary::make_schedule(model.spec, to_seq_len(seq_len)), model.rotates_backward};
  });
}

int rotary_schedule_from_preset_ex(const char* name, const char* layer_type, int vision, int64_t seq_len,
                                   rotary_schedule** out) {
  return new_schedule(out, [&] {
    const rotary::ModelRope model = rotary::load_preset(require_text(name, "name"), to_read_options(layer_type, vision));
    return rotary_schedule{rotary::make_schedule(model.spec, to_seq_len(seq_len)), model.rotates_backward};
  });
}

int rotary_schedule_with_xpos(const rotary_schedule* schedule, double scale_base, double center,
                              rotary_schedule** out) {
  return new_schedule(out, [&] {
    const rotary_schedule& s = require(schedule, "schedule");
    return rotary_schedule{rotary::with_xpos(s.schedule, scale_base, center), s.rotates_backward};
  });
}

void rotary_schedule_free(rotary_schedule* schedule) { delete schedule; }

int rotary_schedule_layout(const rotary_schedule* s) {
  if (s == nullptr) return null_argument("schedule is NULL", -1);
  switch (s->schedule.channel_layout()) {
    case rotary::ChannelLayout::half: return ROTARY_LAYOUT_HALF;
    case rotary::ChannelLayout::interleaved: return ROTARY_LAYOUT_INTERLEAVED;
    case rotary::ChannelLayout::block_half: return ROTARY_LAYOUT_BLOCK_HALF;
  }
  return -1;
}

int64_t rotary_schedule_rotary_offset(const rotary_schedule* s) {
  return s ? s->schedule.rotary_offset : null_argument<int64_t>("schedule is NULL", 0);
}

int64_t rotary_schedule_blocks(const rotary_schedule* s) {
  return s ? s->schedule.blocks : null_argument<int64_t>("schedule is NULL", 0);
}

int rotary_schedule_streams(const rotary_schedule* s) {
  return s ? s->schedule.streams : null_argument("schedule is NULL", 0);
}

int rotary_schedule_pair_stream(const rotary_schedule* s, int64_t pair) {
  if (s == nullptr) return null_argument("schedule is NULL", -1);
  if (pair < 0 || pair >= s->schedule.pairs()) {
    fail(ROTARY_ERROR_INVALID_ARGUMENT,
         fmt::format("pair={} must be in [0, {}) (rotary_dim/2)", pair, s->schedule.pairs()).c_str());
    return -1;
  }
  return s->schedule.stream_of(pair);
}

int64_t rotary_schedule_head_dim(const rotary_schedule* s) {
  return s ? s->schedule.head_dim : null_argument<int64_t>("schedule is NULL", 0);
}

int64_t rotary_schedule_rotary_dim(const rotary_schedule* s) {
  return s ? s->schedule.rotary_dim : null_argument<int64_t>("schedule is NULL", 0);
}

const double* rotary_schedule_inv_freq(const rotary_schedule* s) {
  if (s == nullptr) return null_argument<const double*>("schedule is NULL", nullptr);
  return s->schedule.inv_freq.data();
}

double rotary_schedule_attention_factor(const rotary_schedule* s) {
  return s ? s->schedule.attention_factor : null_argument("schedule is NULL", 0.0);
}

int rotary_schedule_pairing(const rotary_schedule* s) {
  if (s == nullptr) return null_argument("schedule is NULL", -1);
  return s->schedule.pairing == rotary::Pairing::half ? ROTARY_PAIRING_HALF
                                                      : ROTARY_PAIRING_INTERLEAVED;
}

int rotary_schedule_type_of(const rotary_schedule* s) {
  if (s == nullptr) return null_argument("schedule is NULL", -1);
  const auto type = static_cast<int>(s->schedule.type);
  return type >= 0 && type <= ROTARY_SCHEDULE_LAST ? type : -1;
}

const char* rotary_preset_name(int64_t index) {
  const char* name = nullptr;
  guarded([&] {
    const auto& names = preset_names();
    if (index >= 0 && index < static_cast<int64_t>(names.size())) {
      name = names[static_cast<size_t>(index)].c_str();
    }
  });
  return name;
}

int rotary_table_range(const rotary_schedule* schedule, int64_t first, int64_t count,
                       rotary_angle_mode mode, rotary_table** out) {
  return guarded([&] {
    start(out);
    const rotary::Schedule& s = require(schedule, "schedule").schedule;
    *out = new rotary_table{rotary::Table::range(s, first, count, to_angle_mode(mode))};
  });
}

int rotary_table_at(const rotary_schedule* schedule, const int64_t* positions, int64_t count,
                    rotary_angle_mode mode, rotary_table** out) {
  return guarded([&] {
    start(out);
    const rotary::Schedule& s = require(schedule, "schedule").schedule;
    if (count < 0) throw Error(fmt::format("count={} must be >= 0", count));
    if (count > 0 && positions == nullptr) {
      throw Error(fmt::format("positions is NULL but count={}", count));
    }
    const std::span<const int64_t> list(positions, static_cast<size_t>(count));
    *out = new rotary_table{rotary::Table::at(s, list, to_angle_mode(mode))};
  });
}

void rotary_table_free(rotary_table* table) { delete table; }

int64_t rotary_table_rows(const rotary_table* t) {
  return t ? t->table.rows() : null_argument<int64_t>("table is NULL", 0);
}

int64_t rotary_table_pairs(const rotary_table* t) {
  return t ? t->table.pairs() : null_argument<int64_t>("table is NULL", 0);
}

const float* rotary_table_cos(const rotary_table* t) {
  return t ? t->table.cos().data() : null_argument<const float*>("table is NULL", nullptr);
}

const float* rotary_table_sin(const rotary_table* t) {
  return t ? t->table.sin().data() : null_argument<const float*>("table is NULL", nullptr);
}

int rotary_tensor_bshd(void* data, rotary_dtype dtype, int64_t batch, int64_t seq, int64_t heads,
                       int64_t head_dim, rotary_tensor* out) {
  return make_tensor(out, dtype, [&] {
    return rotary::TensorView::bshd(data, rotary::DType::f32, batch, seq, heads, head_dim);
  });
}

int rotary_tensor_bhsd(void* data, rotary_dtype dtype, int64_t batch, int64_t heads, int64_t seq,
                       int64_t head_dim, rotary_tensor* out) {
  return make_tensor(out, dtype, [&] {
    return rotary::TensorView::bhsd(data, rotary::DType::f32, batch, heads, seq, head_dim);
  });
}

int rotary_apply(const rotary_schedule* schedule, const rotary_apply_args* args) {
  return rotary_apply_positions(schedule, args, nullptr);
}

int rotary_apply_positions(const rotary_schedule* schedule, const rotary_apply_args* args,
                           const rotary_positions* positions) {
  return guarded([&] {
    const rotary_schedule& s = require(schedule, "schedule");
    rotary::apply(s.schedule,
                  rotary::detail::c_abi::apply_args(s.rotates_backward, require(args, "args"), positions));
  });
}

int rotary_rope_create(const rotary_schedule* schedule, rotary_rope** out) {
  return guarded([&] {
    start(out);
    const rotary_schedule& s = require(schedule, "schedule");
    *out = new rotary_rope{.rope = rotary::Rope(s.schedule), .rotates_backward = s.rotates_backward};
  });
}

void rotary_rope_free(rotary_rope* rope) { delete rope; }

int rotary_rope_apply(const rotary_rope* rope, const rotary_apply_args* args, const rotary_positions* positions,
                      int mode) {
  return guarded([&] {
    const rotary_rope& r = require(rope, "rope");
    rotary::ApplyArgs a = rotary::detail::c_abi::apply_args(r.rotates_backward, require(args, "args"), positions);
    if (a.table != nullptr) throw Error("args.table is set, but rotary_rope_apply takes its angles from the Rope "
                                        "(leave it NULL)");
    a.numerics = to_angle_mode(static_cast<rotary_angle_mode>(mode));
    r.rope.apply(a);
  });
}

int rotary_cache_view_nhd(void* data, rotary_dtype dtype, int64_t num_blocks, int64_t block_size, int64_t heads,
                          int64_t head_dim, int64_t offset, int64_t row_width, rotary_cache_view* out) {
  return make_cache_view(out, dtype, [&] {
    return rotary::CacheView::nhd(data, rotary::DType::f32, num_blocks, block_size, heads, head_dim, offset, row_width);
  });
}

int rotary_cache_view_hnd(void* data, rotary_dtype dtype, int64_t num_blocks, int64_t block_size, int64_t heads,
                          int64_t head_dim, int64_t offset, int64_t row_width, rotary_cache_view* out) {
  return make_cache_view(out, dtype, [&] {
    return rotary::CacheView::hnd(data, rotary::DType::f32, num_blocks, block_size, heads, head_dim, offset, row_width);
  });
}

int rotary_rope_store(const rotary_schedule* schedule, const rotary_rope_store_args* args) {
  return guarded([&] {
    const rotary_schedule& s = require(schedule, "schedule");
    rotary::rope_store(s.schedule, rotary::detail::c_abi::rope_store_args(s, require(args, "args")));
  });
}

int rotary_qk_norm_rope(const rotary_schedule* schedule, const rotary_qk_norm_rope_args* args) {
  return guarded([&] {
    const rotary_schedule& s = require(schedule, "schedule");
    rotary::CacheWrite write;
    rotary::qk_norm_rope(s.schedule, rotary::detail::c_abi::qk_norm_rope_args(s, require(args, "args"), write));
  });
}

int rotary_rerotate_cache(const rotary_schedule* schedule, const rotary_rerotate_cache_args* args) {
  return guarded([&] {
    const rotary_schedule& s = require(schedule, "schedule");
    rotary::rerotate_cache(s.schedule, rotary::detail::c_abi::rerotate_cache_args(s, require(args, "args")));
  });
}

int rotary_slots_from_page_table(const int32_t* kv_indices, int64_t kv_indices_count, const int32_t* kv_indptr,
                                 int64_t kv_indptr_count, const int32_t* batch_indices,
                                 const int32_t* position_in_request, int64_t tokens, int64_t block_size,
                                 int64_t* slots_out) {
  return guarded([&] {
    const auto array = [](const int32_t* data, int64_t count, const char* name) {
      if (count < 0) throw Error(fmt::format("{}_count={} must be >= 0", name, count));
      if (data == nullptr && count != 0) throw Error(fmt::format("{} is NULL but {}_count={}", name, name, count));
      return std::span<const int32_t>(data, static_cast<size_t>(count));
    };
    if (tokens < 0) throw Error(fmt::format("tokens={} must be >= 0", tokens));
    if (tokens != 0 && slots_out == nullptr) throw Error(fmt::format("slots_out is NULL but tokens={}", tokens));
    if (tokens != 0 && batch_indices == nullptr) throw Error(fmt::format("batch_indices is NULL but tokens={}", tokens));
    if (tokens != 0 && position_in_request == nullptr) {
      throw Error(fmt::format("position_in_request is NULL but tokens={}", tokens));
    }
    const std::vector<int64_t> slots = rotary::slots_from_page_table(
        array(kv_indices, kv_indices_count, "kv_indices"), array(kv_indptr, kv_indptr_count, "kv_indptr"),
        std::span<const int32_t>(batch_indices, static_cast<size_t>(tokens)),
        std::span<const int32_t>(position_in_request, static_cast<size_t>(tokens)), block_size);
    std::copy(slots.begin(), slots.end(), slots_out);
  });
}

}  // extern "C"
