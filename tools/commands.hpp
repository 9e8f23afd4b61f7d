// `rotary apply` and `rotary convert-weights`: RoPE and pairing conversion on tensor files.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "rotary/schedule.hpp"
#include "rotary/table.hpp"

namespace rotary::cli {

struct ApplyFileOptions {
  std::string q, k, tensor, layout = "bshd", positions, out, k_out;
  std::optional<int64_t> offset;
  bool inverse = false;
  AngleMode angles = AngleMode::exact;
  int threads = 0;
};

struct ConvertOptions {
  std::string in, out, to, q_name, k_name;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, rotary_dim = 0;
};

/// Validates everything, computes every output in memory, then writes each output atomically.
int run_apply_files(const Schedule& schedule, const ApplyFileOptions& options, std::ostream& out);
int run_convert_weights(const ConvertOptions& options, std::ostream& out);

/// Shell-style wildcard: '*' matches any run of characters, '?' one character.
bool wildcard_match(std::string_view pattern, std::string_view text);

}  // namespace rotary::cli
