#include "commands.hpp"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "rotary/apply.hpp"
#include "rotary/error.hpp"
#include "rotary/layout.hpp"
#include "tensor_file.hpp"

namespace rotary::cli {
namespace {

void refuse_same_file(const std::string& out, const std::string& in, const char* out_option) {
  namespace fs = std::filesystem;
  if (out.empty() || in.empty()) return;
  std::error_code ec;
  const bool same = fs::exists(out, ec) ? fs::equivalent(out, in, ec)
                                        : fs::weakly_canonical(out, ec) == fs::weakly_canonical(in, ec);
  if (same) throw Error(fmt::format("{}='{}' is also an input; write to a new file", out_option, out));
}

DType dtype_of(const HostTensor& t) {
  if (t.dtype == "F32") return DType::f32;
  if (t.dtype == "F64") return DType::f64;
  if (t.dtype == "F16") return DType::f16;
  if (t.dtype == "BF16") return DType::bf16;
  throw Error(fmt::format("tensor '{}' has dtype {}; RoPE needs F32, F64, F16 or BF16", t.name, t.dtype));
}

// [b,s,h,d] / [b,h,s,d], or 3-D [s,h,d] / [h,s,d] with batch 1.
TensorView view_of(HostTensor& t, const std::string& layout) {
  std::vector<int64_t> s = t.shape;
  if (s.size() == 3) s.insert(s.begin(), 1);
  if (s.size() != 4) {
    throw Error(fmt::format("tensor '{}' has {} dimensions; expected [batch, seq, heads, head_dim] ({})", t.name,
                            t.shape.size(), layout));
  }
  const DType dtype = dtype_of(t);
  if (layout == "bshd") return TensorView::bshd(t.data.data(), dtype, s[0], s[1], s[2], s[3]);
  return TensorView::bhsd(t.data.data(), dtype, s[0], s[1], s[2], s[3]);
}

std::string format_for(const std::string& path, const TensorFile& file) {
  if (is_safetensors_path(path)) return format_safetensors(file);
  if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".npy") == 0) {
    if (file.tensors.size() != 1) throw Error(fmt::format("'{}': a .npy file holds one tensor, not {}", path, file.tensors.size()));
    return format_npy(file.tensors[0]);
  }
  throw Error(fmt::format("'{}' must end in .npy or .safetensors", path));
}

}  // namespace

bool wildcard_match(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

int run_apply_files(const Schedule& schedule, const ApplyFileOptions& o, std::ostream& out) {
  if (o.q.empty()) throw Error("--q is required");
  if (o.out.empty()) throw Error("--out is required");
  if (o.layout != "bshd" && o.layout != "bhsd") throw Error(fmt::format("--layout='{}' must be bshd or bhsd", o.layout));
  if (!o.k.empty() && o.k_out.empty()) throw Error("--k-out is required with --k");
  if (o.k.empty() && !o.k_out.empty()) throw Error("--k-out is set but --k is not");
  if (!o.positions.empty() && o.offset) throw Error("--positions and --offset cannot both be given");
  for (const std::string* in : {&o.q, &o.k, &o.positions}) {
    refuse_same_file(o.out, *in, "--out");
    refuse_same_file(o.k_out, *in, "--k-out");
  }
  if (!o.k_out.empty() && o.k_out == o.out) throw Error("--k-out must differ from --out");

  struct Job {
    TensorFile file;
    std::string out;
  };
  std::vector<Job> jobs;
  jobs.push_back({read_tensor_file(o.q), o.out});
  if (!o.k.empty()) jobs.push_back({read_tensor_file(o.k), o.k_out});

  std::vector<int64_t> positions;
  if (!o.positions.empty()) {
    const TensorFile p = read_tensor_file(o.positions);
    const HostTensor& t = p.tensors.at(0);
    if (p.tensors.size() != 1) throw Error(fmt::format("--positions '{}' must hold one tensor", o.positions));
    if (t.dtype != "I32" && t.dtype != "I64") throw Error(fmt::format("--positions '{}' must be int32 or int64, not {}", o.positions, t.dtype));
    const int64_t n = t.elements();
    for (int64_t i = 0; i < n; ++i) {
      if (t.dtype == "I32") {
        int32_t v;
        std::memcpy(&v, t.data.data() + i * 4, 4);
        positions.push_back(v);
      } else {
        int64_t v;
        std::memcpy(&v, t.data.data() + i * 8, 8);
        positions.push_back(v);
      }
    }
  }
  // Every tensor to rotate, checked and rotated in memory before anything is written.
  int rotated = 0;
  for (Job& job : jobs) {
    bool any = false;
    for (HostTensor& t : job.file.tensors) {
      if (!o.tensor.empty() && t.name != o.tensor && job.file.tensors.size() > 1) continue;
      any = true;
      TensorView view = view_of(t, o.layout);
      const int64_t tokens = view.batch() * view.seq();
      Positions pos = Positions::sequential(o.offset.value_or(0));
      std::vector<int64_t> expanded;
      if (!positions.empty()) {
        if (static_cast<int64_t>(positions.size()) == tokens) {
          expanded = positions;
        } else if (static_cast<int64_t>(positions.size()) == view.seq()) {  // one row for every batch
          for (int64_t b = 0; b < view.batch(); ++b) expanded.insert(expanded.end(), positions.begin(), positions.end());
        } else {
          throw Error(fmt::format("--positions has {} entries; tensor '{}' needs batch*seq={} or seq={}",
                                  positions.size(), t.name, tokens, view.seq()));
        }
        pos = Positions::per_token(expanded);
      }
      std::optional<Table> table;
      if (o.angles == AngleMode::hf_float32) {
        std::vector<int64_t> needed;
        for (int64_t i = 0; i < tokens; ++i) needed.push_back(pos.at(i, i % std::max<int64_t>(view.seq(), 1)));
        std::set<int64_t> unique(needed.begin(), needed.end());
        std::vector<int64_t> rows(unique.begin(), unique.end());
        for (int64_t r : rows) {
          if (r < 0 || r >= max_position_limit) throw Error(fmt::format("position {} must be in [0, 2^31)", r));
        }
        table = Table::at(schedule, rows, AngleMode::hf_float32);
      }
      apply(schedule, ApplyArgs{.q = view, .positions = pos,
                                .direction = o.inverse ? Direction::inverse : Direction::forward,
                                .table = table ? &*table : nullptr, .threads = o.threads});
      ++rotated;
    }
    if (!any) throw Error(fmt::format("--tensor='{}' is not in the input", o.tensor));
  }
  std::vector<std::string> encoded;
  for (const Job& job : jobs) encoded.push_back(format_for(job.out, job.file));
  for (size_t j = 0; j < jobs.size(); ++j) write_file_atomically(jobs[j].out, encoded[j]);
  out << fmt::format("rotated {} tensor(s); wrote {}{}\n", rotated, o.out, o.k_out.empty() ? "" : " and " + o.k_out);
  return 0;
}

int run_convert_weights(const ConvertOptions& o, std::ostream& out) {
  if (o.in.empty() || o.out.empty()) throw Error("--in and --out are required");
  if (!is_safetensors_path(o.in)) throw Error(fmt::format("--in='{}' must be a .safetensors file", o.in));
  if (!is_safetensors_path(o.out)) throw Error(fmt::format("--out='{}' must be a .safetensors file", o.out));
  refuse_same_file(o.out, o.in, "--out");
  const Pairing to = parse_pairing(o.to, "--to");
  const Pairing from = to == Pairing::half ? Pairing::interleaved : Pairing::half;
  if (o.num_heads <= 0) throw Error(fmt::format("--num-heads={} must be > 0", o.num_heads));
  if (o.num_kv_heads <= 0) throw Error(fmt::format("--num-kv-heads={} must be > 0", o.num_kv_heads));
  if (o.q_name.empty() || o.k_name.empty()) throw Error("--q-name and --k-name are required");
  TensorFile file = read_tensor_file(o.in);
  int q_count = 0, k_count = 0;
  std::vector<HostTensor> converted;
  for (const HostTensor& t : file.tensors) {
    const bool is_q = wildcard_match(o.q_name, t.name);
    const bool is_k = wildcard_match(o.k_name, t.name);
    if (is_q && is_k) throw Error(fmt::format("tensor '{}' matches both --q-name and --k-name", t.name));
    if (!is_q && !is_k) {
      converted.push_back(t);
      continue;
    }
    const int64_t heads = is_q ? o.num_heads : o.num_kv_heads;
    if (t.shape.empty() || t.shape.size() > 2) {
      throw Error(fmt::format("tensor '{}' has shape of {} dimensions; expected a weight [rows, cols] or bias [rows]",
                              t.name, t.shape.size()));
    }
    const int64_t rows = t.shape[0];
    const int64_t head_dim = o.head_dim > 0 ? o.head_dim : (rows % heads == 0 ? rows / heads : 0);
    if (head_dim <= 0 || rows != heads * head_dim) {
      throw Error(fmt::format("tensor '{}' has {} rows, not {} heads x head_dim", t.name, rows, heads));
    }
    const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
    HostTensor p = t;
    permute_rows(t.data.data(), p.data.data(),
                 PermuteRowsArgs{.num_heads = heads, .head_dim = head_dim, .rotary_dim = o.rotary_dim,
                                 .row_bytes = cols * dtype_size(t.dtype), .from = from, .to = to});
    converted.push_back(std::move(p));
    (is_q ? q_count : k_count)++;
  }
  if (q_count == 0) throw Error(fmt::format("--q-name='{}' matches no tensor", o.q_name));
  if (k_count == 0) throw Error(fmt::format("--k-name='{}' matches no tensor", o.k_name));
  file.tensors = std::move(converted);
  write_file_atomically(o.out, format_safetensors(file));
  out << fmt::format("permuted {} query and {} key tensor(s) from {} to {} pairing; wrote {}\n", q_count, k_count,
                     to_string(from), to_string(to), o.out);
  return 0;
}

}  // namespace rotary::cli
