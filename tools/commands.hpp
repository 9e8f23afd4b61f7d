// `rotary apply` and `rotary convert-weights`: RoPE and pairing conversion on tensor files.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "rotary/schedule.hpp"
#include "rotary/table.hpp"

namespace rotary::cli {

struct ApplyFileOptions {
  std::string q, k, tensor, order = "bshd", positions, out, k_out;
  std::string order_option = "--order";         ///< the spelling given (--layout: its old name), for messages
  std::string numerics_option = "--numerics";   ///< likewise (--angles)
  std::string config;  ///< the --config the schedule came from: an input, never overwritten
  std::optional<int64_t> offset;
  bool inverse = false;
  bool undo = false;  ///< take back a rotation in the direction `inverse` says (ApplyArgs::undo)
  AngleMode numerics = AngleMode::exact;
  int64_t threads = 0;
};

struct ConvertOptions {
  std::string in, out, to, q_name, k_name;
  std::string config;  ///< a config.json giving the four counts below (then none may be given)
  std::optional<int64_t> num_heads, num_kv_heads, head_dim, rotary_dim;
  bool force = false;  ///< convert even if the file's metadata says it has the target pairing
};

/// Key of the .safetensors `__metadata__` entry where convert-weights records the pairing it wrote.
inline constexpr const char* kPairingMetadataKey = "rotary.pairing";

/// Validates everything before the first write, then writes every output all or nothing
/// (AtomicOutputs): each input is read and rotated a block at a time (a few MiB, whole heads), so
/// memory stays a few MiB whatever the tensors' size. Outputs may not name an input or each other
/// in any spelling (file identity). Returns 0; throws rotary::Error naming the option and value.
int run_apply_files(const Schedule& schedule, const ApplyFileOptions& options, std::ostream& out);
/// The same discipline for permuting the q/k projection rows of a checkpoint between pairings;
/// the pairing written is recorded in the output's __metadata__ (kPairingMetadataKey).
int run_convert_weights(const ConvertOptions& options, std::ostream& out);

/// Throws rotary::Error unless 0 <= threads <= rotary::max_threads, naming `option`.
void check_threads(int64_t threads, std::string_view option);

/// Shell-style wildcard: '*' matches any run of characters, '?' one character.
bool wildcard_match(std::string_view pattern, std::string_view text);

/// `rotary info --build`: version, the CPU kernels' Highway target, the CUDA kernels' architectures
/// and device (tools/build_info.cpp); `json`: one JSON object.
void print_build_info(bool json, std::ostream& out);

}  // namespace rotary::cli
