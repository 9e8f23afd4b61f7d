// rotary::cuda: host-side checks and the device table; the kernels are in apply.cu.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../apply_internal.hpp"
#include "../fused/fused_args.hpp"
#include "../kernel/args.hpp"
#include "launch.hpp"
#include "rotary/cuda.hpp"
#include "rotary/error.hpp"

namespace rotary::detail::cuda {

void check(int status, const char* what) {
  const auto error = static_cast<cudaError_t>(status);
  if (error != cudaSuccess) {
    throw rotary::cuda::RuntimeError(fmt::format("CUDA {} failed: {}: {}", what, cudaGetErrorName(error),
                                                 cudaGetErrorString(error)));
  }
}

std::string positions_message(uint32_t bits) {
  using namespace rotary::cuda;
  const uint32_t known = position_out_of_range | position_not_in_table | position_not_in_angles |
                         position_beyond_xpos_reach | slot_out_of_range | slot_duplicate | scale_invalid;
  if ((bits & ~known) != 0) {
    return fmt::format("positions: the error word holds {:#x}, bits no kernel sets (was it zeroed "
                       "before the calls?)", bits);
  }
  std::string rules;
  const auto add = [&](uint32_t bit, const char* rule) {
    if ((bits & bit) != 0) rules += std::string(rules.empty() ? "" : "; ") + rule;
  };
  add(position_out_of_range, "outside [0, 2^31)");
  add(position_not_in_table, "fractional or not a row of the table");
  add(position_not_in_angles, "fractional or not below the rows of the per_position cos/sin");
  add(position_beyond_xpos_reach, "further from xpos_center than xPos's reach (rotary::xpos_reach)");
  std::string message = rules.empty() ? "" : "positions: a per-token position was " + rules + " (those tokens were left unrotated)";
  if ((bits & slot_out_of_range) != 0) {  // the fused kernels' (slots on the device only)
    message += std::string(message.empty() ? "" : "; ") +
               "slots: a slot was beyond its cache's capacity (those tokens' cache writes were skipped)";
  }
  if ((bits & slot_duplicate) != 0) {  // with FusedOptions::check_duplicate_slots
    message += std::string(message.empty() ? "" : "; ") +
               "slots: a slot was listed twice (neither token's cache writes were made)";
  }
  if ((bits & scale_invalid) != 0) {  // the fused kernels' (scales in device memory)
    message += std::string(message.empty() ? "" : "; ") +
               "scales: a scale was not finite and > 0 (nothing was written)";
  }
  return message;
}

}  // namespace rotary::detail::cuda

namespace rotary::cuda {
namespace {

using detail::cuda::check;

void check_table(const Schedule& schedule, const ApplyArgs& args, const DeviceTable& table) {
  if (!(table.schedule() == schedule)) {
    throw Error("table was built from a different schedule than the one passed to apply");
  }
  if (args.undo && schedule.attention_factor != 1.0) {
    throw Error(fmt::format("undo with attention_factor={} needs exact angles (no table): a table holds "
                            "cos and sin times the factor", schedule.attention_factor));
  }
  const Positions& p = args.positions;
  const int64_t seq = args.q.seq();
  if (p.kind != Positions::Kind::sequential || seq == 0 || args.q.batch() == 0) return;
  if (p.offset < table.first() || p.offset + seq > table.first() + table.rows()) {
    throw Error(fmt::format("positions {}..{} (offset={}, seq={}) are not all in the table, whose "
                            "rows hold positions {}..{}", p.offset, p.offset + seq - 1, p.offset, seq,
                            table.first(), table.first() + table.rows() - 1));
  }
}

}  // namespace

DeviceTable::DeviceTable(const Table& table) : schedule_(table.schedule()) {
  const detail::TableRows range = detail::table_range(table);
  first_ = range.first;
  rows_ = range.rows;
  const size_t bytes = static_cast<size_t>(rows_ * pairs()) * sizeof(float);
  if (bytes == 0) return;
  try {
    check(cudaMalloc(reinterpret_cast<void**>(&cos_), bytes), "cudaMalloc (table cos)");
    check(cudaMalloc(reinterpret_cast<void**>(&sin_), bytes), "cudaMalloc (table sin)");
    check(cudaMemcpy(cos_, range.cos, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (table cos)");
    check(cudaMemcpy(sin_, range.sin, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (table sin)");
  } catch (...) {
    release();
    throw;
  }
}

DeviceTable::~DeviceTable() { release(); }

DeviceTable::DeviceTable(DeviceTable&& other) noexcept
    : schedule_(std::move(other.schedule_)), cos_(std::exchange(other.cos_, nullptr)),
      sin_(std::exchange(other.sin_, nullptr)), first_(other.first_), rows_(other.rows_) {}

DeviceTable& DeviceTable::operator=(DeviceTable&& other) noexcept {
  if (this != &other) {
    release();
    schedule_ = std::move(other.schedule_);
    cos_ = std::exchange(other.cos_, nullptr);
    sin_ = std::exchange(other.sin_, nullptr);
    first_ = other.first_;
    rows_ = other.rows_;
  }
  return *this;
}

void DeviceTable::release() noexcept {
  // Errors from cudaFree (a context already torn down at exit) have nowhere to go.
  if (cos_ != nullptr) static_cast<void>(cudaFree(cos_));
  if (sin_ != nullptr) static_cast<void>(cudaFree(sin_));
  cos_ = nullptr;
  sin_ = nullptr;
}

void apply(const Schedule& schedule, const ApplyArgs& args, Stream stream, const Options& options) {
  if (rotary::detail::uses_old_names(args)) {
    apply(schedule, rotary::detail::folded(args), stream, options);
    return;
  }
  if (args.table != nullptr) {
    throw Error("table is a host Table: give its cuda::DeviceTable in Options::table");
  }
  if (args.caller_angles != nullptr && options.table != nullptr) {
    throw Error("angles and Options::table are both set (give one source of angles)");
  }
  // Everything but the per-token entries, which live in device memory: the kernels check those
  // (Options::error). The Table rules are check_table's (a DeviceTable, not ApplyArgs::table).
  validate_shapes(schedule, args);
  detail::cuda::apply_validated(schedule, args, stream, options);
}

}  // namespace rotary::cuda

namespace rotary::detail::cuda {

void apply_validated(const Schedule& schedule, const ApplyArgs& args, CUstream_st* stream,
                     const rotary::cuda::Options& options) {
  using namespace rotary::cuda;
  if (args.table != nullptr) {
    throw Error("table is a host Table: give its cuda::DeviceTable in Options::table");
  }
  if (args.caller_angles != nullptr && options.table != nullptr) {
    throw Error("angles and Options::table are both set (give one source of angles)");
  }
  if (schedule.pairs() > max_pairs) {
    throw Error(fmt::format("rotary_dim={} has more than cuda::max_pairs={} pairs", schedule.rotary_dim,
                            max_pairs));
  }
  detail::TableRows range{};
  if (options.table != nullptr) {
    rotary::cuda::check_table(schedule, args, *options.table);
    range = {.cos = options.table->cos(), .sin = options.table->sin(),
             .first = options.table->first(), .rows = options.table->rows()};
  }
  detail::KernelArgs kernel =
      detail::make_kernel_args(schedule, args, options.table != nullptr ? &range : nullptr);
  kernel.error = options.error;
  launch(kernel, stream);
}

}  // namespace rotary::detail::cuda

namespace rotary::cuda {

BuildInfo build_info() {
  BuildInfo info;
  // CMake's CUDA_ARCHITECTURES: "80-real" machine code only, "121-virtual" PTX only, "90" both.
  const std::string built = ROTARY_CUDA_ARCHITECTURES;
  std::vector<std::string> ptx;
  for (size_t start = 0; start <= built.size();) {
    const size_t comma = std::min(built.find(',', start), built.size());
    const std::string entry = built.substr(start, comma - start);
    start = comma + 1;
    if (entry.empty()) continue;
    const size_t dash = entry.find('-');
    const std::string arch = entry.substr(0, dash);
    const std::string kind = dash == std::string::npos ? "" : entry.substr(dash + 1);
    if (kind != "virtual") info.architectures.push_back("sm_" + arch);
    if (kind != "real") ptx.push_back("compute_" + arch + " (PTX)");
  }
  info.architectures.insert(info.architectures.end(), ptx.begin(), ptx.end());
  static_cast<void>(cudaRuntimeGetVersion(&info.runtime_version));
  if (cudaDriverGetVersion(&info.driver_version) != cudaSuccess) info.driver_version = 0;
  const auto failed = [](const char* call, cudaError_t status) {
    static_cast<void>(cudaGetLastError());
    return fmt::format("{}: {}: {}", call, cudaGetErrorName(status), cudaGetErrorString(status));
  };
  int count = 0;
  if (const cudaError_t status = cudaGetDeviceCount(&count); status != cudaSuccess) {
    info.why_not = failed("cudaGetDeviceCount", status);
    return info;
  }
  info.devices = count;
  if (count == 0) {
    info.why_not = "no CUDA device";
    return info;
  }
  int device = 0;
  cudaDeviceProp properties{};
  if (const cudaError_t status = cudaGetDevice(&device); status != cudaSuccess) {
    info.why_not = failed("cudaGetDevice", status);
    return info;
  }
  if (const cudaError_t status = cudaGetDeviceProperties(&properties, device); status != cudaSuccess) {
    info.why_not = failed("cudaGetDeviceProperties", status);
    return info;
  }
  info.device = fmt::format("{} (sm_{}{}, {} SMs)", properties.name, properties.major, properties.minor,
                            properties.multiProcessorCount);
  if (const auto status = static_cast<cudaError_t>(detail::cuda::kernel_image_status()); status != cudaSuccess) {
    info.why_not = failed("loading the kernels", status) + " (built for " + built + ")";
    return info;
  }
  info.usable = true;
  return info;
}

void check_positions(uint32_t* error, Stream stream) {
  if (error == nullptr) throw Error("error is null (give the Options::error of the calls to check)");
  uint32_t bits = 0;
  check(cudaMemcpyAsync(&bits, error, sizeof bits, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (bits == 0) return;
  check(cudaMemsetAsync(error, 0, sizeof bits, stream), "cudaMemsetAsync");
  throw Error(detail::cuda::positions_message(bits));
}

// ---- Fused operations: host validation (fused_args.hpp with host = false: nothing in device
// memory is read), host_slots checked as the CPU checks slots, then the kernels of fused.cu ----

namespace {

// The angle sources of a fused call: no host Table, at most one of caller angles and a
// DeviceTable, pairs within max_pairs; the DeviceTable's rows as TableRows (null: none).
const detail::TableRows* fused_table(const Schedule& schedule, const ApplyArgs& rope, const FusedOptions& options,
                                     detail::TableRows& range) {
  if (rope.table != nullptr) throw Error("table is a host Table: give its cuda::DeviceTable in FusedOptions::table");
  if (rope.caller_angles != nullptr && options.table != nullptr) {
    throw Error("angles and FusedOptions::table are both set (give one source of angles)");
  }
  if (schedule.pairs() > max_pairs) {
    throw Error(fmt::format("rotary_dim={} has more than cuda::max_pairs={} pairs", schedule.rotary_dim, max_pairs));
  }
  if (options.table == nullptr) return nullptr;
  check_table(schedule, rope, *options.table);
  range = {.cos = options.table->cos(), .sin = options.table->sin(), .first = options.table->first(),
           .rows = options.table->rows()};
  return &range;
}

// The device's duplicate check: only for slots the host does not check, and only with an error word.
bool device_duplicate_check(const FusedOptions& options) {
  if (!options.check_duplicate_slots || options.host_slots != nullptr) return false;
  if (options.error == nullptr) {
    throw Error("FusedOptions::check_duplicate_slots needs FusedOptions::error (the kernels flag a shared slot there)");
  }
  return true;
}

void check_write_slots(const CacheWrite& w, int64_t tokens, const FusedOptions& options) {
  if (options.host_slots == nullptr) return;
  detail::check_host_slots(*options.host_slots, w.slots, tokens,
                           {{&w.k_cache, "k_cache"}, {&w.v_cache, "v_cache"}, {&w.k_pass_cache, "k_pass_cache"}});
}

}  // namespace

void rope_store(const Schedule& schedule, const RopeStoreArgs& args, Stream stream, const FusedOptions& options) {
  if (detail::uses_old_names(args.rope)) {
    rope_store(schedule, detail::folded_rope(args), stream, options);
    return;
  }
  detail::validate_rope_store(schedule, args, false);
  detail::TableRows range{};
  const detail::TableRows* table = fused_table(schedule, args.rope, options, range);
  check_write_slots(args.cache, args.rope.q.batch() * args.rope.q.seq(), options);
  const bool duplicates = device_duplicate_check(options);
  detail::FusedKernelArgs f = detail::make_rope_store_args(schedule, args, table);
  f.rope.error = options.error;
  f.check_duplicates = duplicates;
  detail::cuda::launch_fused(f, stream);
}

void qk_norm_rope(const Schedule& schedule, const QkNormRopeArgs& args, Stream stream, const FusedOptions& options) {
  if (detail::uses_old_names(args.rope)) {
    qk_norm_rope(schedule, detail::folded_rope(args), stream, options);
    return;
  }
  detail::validate_qk_norm_rope(schedule, args, false);
  detail::TableRows range{};
  const detail::TableRows* table = fused_table(schedule, args.rope, options, range);
  if (args.store != nullptr) check_write_slots(*args.store, args.rope.q.batch() * args.rope.q.seq(), options);
  const bool duplicates = device_duplicate_check(options) && args.store != nullptr;  // refused alike without a store
  detail::FusedKernelArgs f = detail::make_qk_norm_rope_args(schedule, args, table);
  f.rope.error = options.error;
  f.check_duplicates = duplicates;
  detail::cuda::launch_fused(f, stream);
}

void rerotate_cache(const Schedule& schedule, const RerotateCacheArgs& args, Stream stream,
                    const FusedOptions& options) {
  if (args.table != nullptr) {
    throw Error("table is a host Table: give its cuda::DeviceTable in FusedOptions::table (raw mode)");
  }
  if (schedule.pairs() > max_pairs) {
    throw Error(fmt::format("rotary_dim={} has more than cuda::max_pairs={} pairs", schedule.rotary_dim, max_pairs));
  }
  detail::validate_rerotate_cache(schedule, args, false);
  // Raw mode's angles from a DeviceTable (its rows indexed by the positions, checked by the kernel).
  detail::TableRows range{};
  const detail::TableRows* table = nullptr;
  if (options.table != nullptr) {
    if (args.mode != RerotateMode::raw) {
      throw Error("FusedOptions::table is for raw mode (delta mode turns keys by exact angles of their deltas)");
    }
    if (args.numerics.has_value()) throw Error("numerics and FusedOptions::table are both set (give one source of angles)");
    const TensorView keys{.data = args.cache.data, .dtype = DType::f32, .shape = {1, args.slots.count, 0, schedule.head_dim},
                          .strides = {0, 0, 0, 1}};
    check_table(schedule, ApplyArgs{.q = keys, .positions = args.positions}, *options.table);
    range = {.cos = options.table->cos(), .sin = options.table->sin(), .first = options.table->first(),
             .rows = options.table->rows()};
    table = &range;
  }
  if (options.host_slots != nullptr) {
    detail::check_host_slots(*options.host_slots, args.slots, args.slots.count,
                             {{&args.cache, "cache"}, {&args.out, "out"}});
  }
  const bool duplicates = device_duplicate_check(options);
  detail::RerotateKernelArgs r = detail::make_rerotate_args(schedule, args, table);
  r.rope.error = options.error;
  r.check_duplicates = duplicates;
  detail::cuda::launch_rerotate(r, stream);
}

}  // namespace rotary::cuda
