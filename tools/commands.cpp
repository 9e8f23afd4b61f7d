#include "commands.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "../src/text.hpp"
#include "rotary/apply.hpp"
#include "rotary/error.hpp"
#include "rotary/hf_config.hpp"
#include "rotary/pairing.hpp"
#include "rotary/rope.hpp"
#include "tensor_file.hpp"

namespace rotary::cli {
namespace {

using detail::excerpt;

// Bytes read, rotated or permuted, and written at a time: whole heads, so more when one head is larger.
constexpr int64_t kBlockBytes = int64_t{4} << 20;

// Runs f(); a rotary::Error from it gets `prefix` in front (an option, a file, a tensor), except
// an OutputError, which names its output already: a failed write is not the input's fault.
template <class F>
auto with_context(std::string_view prefix, F&& f) {
  try {
    return f();
  } catch (const OutputError&) {
    throw;
  } catch (const Error& e) {
    throw Error(fmt::format("{}{}", prefix, e.what()));
  }
}

std::string tensor_label(const HostTensor& t) { return fmt::format("tensor '{}'", excerpt(t.name)); }

struct NamedPath {
  std::string_view option;
  const std::string& path;
};

std::string shown(const NamedPath& p) { return fmt::format("{}='{}'", p.option, excerpt(p.path)); }

// An output may name neither an input nor another output, however spelled (file_identity: the
// same inode through a symbolic or hard link, or the same canonical folder and name).
void refuse_clobbering(std::initializer_list<NamedPath> outputs, std::initializer_list<NamedPath> inputs) {
  std::vector<std::pair<const NamedPath*, FileIdentity>> written;
  for (const NamedPath& o : outputs) {
    if (o.path.empty()) continue;
    const FileIdentity id = file_identity(o.path);
    for (const NamedPath& in : inputs) {
      if (!in.path.empty() && file_identity(in.path) == id) {
        throw Error(fmt::format("{} is also an input ({}); write to a new file", shown(o), shown(in)));
      }
    }
    for (const auto& [other, other_id] : written) {
      if (other_id == id) throw Error(fmt::format("{} and {} name the same file", shown(*other), shown(o)));
    }
    written.emplace_back(&o, id);
  }
}

// Copies bytes [offset, offset + bytes) of input to output through buffer.
void copy_bytes(const InputFile& input, uint64_t offset, uint64_t bytes, AtomicOutputs::File& output,
                std::vector<unsigned char>& buffer) {
  if (buffer.size() < static_cast<size_t>(kBlockBytes)) buffer.resize(static_cast<size_t>(kBlockBytes));
  while (bytes > 0) {
    const uint64_t n = std::min<uint64_t>(bytes, buffer.size());
    input.read(offset, buffer.data(), n);
    output.write(buffer.data(), n);
    offset += n;
    bytes -= n;
  }
}

DType dtype_of(const HostTensor& t) {
  if (t.dtype == "F32") return DType::f32;
  if (t.dtype == "F64") return DType::f64;
  if (t.dtype == "F16") return DType::f16;
  if (t.dtype == "BF16") return DType::bf16;
  throw Error(fmt::format("dtype {} is not F32, F64, F16 or BF16, which RoPE needs", t.dtype));
}

// A tensor to rotate: [batch, seq, heads, head_dim] stored bshd or bhsd; 3-D means batch 1.
struct Geometry {
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  DType dtype = DType::f32;
  bool bhsd = false;

  int64_t tokens() const { return batch * seq; }
  int64_t head_bytes() const { return head_dim * size_of(dtype); }
};

Geometry geometry_of(const HostTensor& t, const std::string& layout) {
  std::vector<int64_t> s = t.shape;
  if (s.size() == 3) s.insert(s.begin(), 1);
  if (s.size() != 4) {
    throw Error(fmt::format("has {} dimensions; expected [batch, seq, heads, head_dim] ({})", t.shape.size(), layout));
  }
  Geometry g{.batch = s[0], .head_dim = s[3], .dtype = dtype_of(t), .bhsd = layout == "bhsd"};
  g.seq = g.bhsd ? s[2] : s[1];
  g.heads = g.bhsd ? s[1] : s[2];
  return g;  // every product of extents stays below 2^40 (HostTensor::elements)
}

// apply's own checks of a tensor against the schedule (dtype, head_dim, threads), run on an empty
// view of its shape: nothing is read or written.
void check_against_schedule(const Schedule& schedule, const Geometry& g, int64_t threads) {
  validate(schedule, ApplyArgs{.q = TensorView::bshd(nullptr, g.dtype, 1, 0, g.heads, g.head_dim),
                               .threads = static_cast<int>(threads)});
}

// A contiguous run of a tensor rotated by one apply call: `tokens` consecutive tokens (flattened
// index b * seq + s, from first_token) times `heads` heads, seen as [1, tokens, heads, head_dim]
// (bshd) or [1, heads, tokens, head_dim] (bhsd, then within one batch row).
struct Block {
  uint64_t first_byte = 0;
  int64_t first_token = 0, tokens = 0, heads = 0;
};

// Calls f(block) over the whole tensor in memory order. A block holds at most max_tokens tokens
// and kBlockBytes bytes, or a single head of a single token when that is larger.
template <class F>
void for_each_block(const Geometry& g, int64_t max_tokens, F f) {
  if (g.batch == 0 || g.seq == 0 || g.heads == 0 || g.head_dim == 0) return;
  const int64_t rows = std::max<int64_t>(1, kBlockBytes / g.head_bytes());  // heads per block
  const auto at = [&](int64_t head_index) { return static_cast<uint64_t>(head_index * g.head_bytes()); };
  if (!g.bhsd && g.heads <= rows) {  // whole tokens
    const int64_t step = std::min(max_tokens, rows / g.heads);
    for (int64_t t = 0; t < g.tokens(); t += step) f(Block{at(t * g.heads), t, std::min(step, g.tokens() - t), g.heads});
  } else if (!g.bhsd) {  // some heads of one token
    for (int64_t t = 0; t < g.tokens(); ++t) {
      for (int64_t h = 0; h < g.heads; h += rows) f(Block{at(t * g.heads + h), t, 1, std::min(rows, g.heads - h)});
    }
  } else if (g.seq <= std::min(rows, max_tokens)) {  // whole [seq, head_dim] planes of one batch row
    const int64_t step = rows / g.seq;
    for (int64_t b = 0; b < g.batch; ++b) {
      for (int64_t h = 0; h < g.heads; h += step) {
        f(Block{at((b * g.heads + h) * g.seq), b * g.seq, g.seq, std::min(step, g.heads - h)});
      }
    }
  } else {  // part of one plane
    const int64_t step = std::min(rows, max_tokens);
    for (int64_t b = 0; b < g.batch; ++b) {
      for (int64_t h = 0; h < g.heads; ++h) {
        for (int64_t s = 0; s < g.seq; s += step) {
          f(Block{at((b * g.heads + h) * g.seq + s), b * g.seq + s, std::min(step, g.seq - s), 1});
        }
      }
    }
  }
}

void require_tensor_extension(const std::string& path) {
  if (!is_npy_path(path) && !is_safetensors_path(path)) {
    throw Error(fmt::format("'{}' must end in .npy or .safetensors", excerpt(path)));
  }
}

// An input tensor file and its index (no data read); errors start with `option`.
struct OpenedTensors {
  std::unique_ptr<InputFile> file;
  TensorFile index;
};
OpenedTensors open_tensors(std::string_view option, const std::string& path) {
  return with_context(fmt::format("{} ", option), [&] {
    require_tensor_extension(path);  // before reading anything: /dev/zero is read into memory
    OpenedTensors opened{std::make_unique<InputFile>(path), {}};
    opened.index = read_tensor_index(*opened.file);
    return opened;
  });
}

// The header an output gets (its extension decides the format); throws if it cannot hold the file.
std::string header_for(const std::string& path, const TensorFile& file) {
  require_tensor_extension(path);
  return with_context(fmt::format("'{}': ", excerpt(path)), [&] {
    if (is_safetensors_path(path)) return safetensors_header(file);
    if (file.tensors.size() != 1) throw Error(fmt::format("a .npy file holds one tensor, not {}", file.tensors.size()));
    return npy_header(file.tensors[0]);
  });
}

// Each token's position: --offset + s for token s of every batch row, or a --positions file of
// int32/int64/float32/float64 entries: one per token (batch * seq) or one per s, shared by every
// batch row, in one stream ([batch, seq], [seq]) or in S ([S, batch, seq], [S, 1, seq]: M-RoPE's
// position_ids; one stream serves every stream of the schedule). The file is read a block at a
// time, never whole.
class TokenPositions {
 public:
  explicit TokenPositions(int64_t offset) : offset_(offset) {}

  explicit TokenPositions(const std::string& path) : shown_(fmt::format("--positions '{}'", excerpt(path))) {
    OpenedTensors opened = open_tensors("--positions", path);
    file_ = std::move(opened.file);
    const TensorFile& index = opened.index;
    if (index.tensors.size() != 1) {
      throw Error(fmt::format("{} must hold one tensor, not {}", shown_, index.tensors.size()));
    }
    entry_ = index.tensors[0];
    if (entry_.dtype != "I32" && entry_.dtype != "I64" && entry_.dtype != "F32" && entry_.dtype != "F64") {
      throw Error(fmt::format("{} must be int32, int64, float32 or float64, not {}", shown_, entry_.dtype));
    }
    if (entry_.shape.size() > 3) {
      throw Error(fmt::format("{} has {} dimensions; positions are [streams, batch, seq], [batch, seq] or [seq]",
                              shown_, entry_.shape.size()));
    }
    const int64_t total = entry_.elements();
    if (total == 0) throw Error(fmt::format("{} has no entries (leave it out for positions from --offset)", shown_));
    if (entry_.shape.size() == 3) {
      if (entry_.shape[0] > max_streams) {
        throw Error(fmt::format("{} has {} streams (its first dimension); at most {}", shown_, entry_.shape[0],
                                max_streams));
      }
      streams_ = static_cast<int>(entry_.shape[0]);
    }
    count_ = total / streams_;
    // Each stream's [rows, seq]: [seq] is one row.
    rows_ = entry_.shape.size() == 1 ? 1 : entry_.shape[entry_.shape.size() - 2];
    scan(total);
  }

  // Throws unless the positions suit a tensor of this geometry and the schedule's streams.
  void check(const Geometry& g, const Schedule& schedule) const {
    if (!file_) {
      if (offset_ < 0 || offset_ > max_position_limit - g.seq) {
        throw Error(fmt::format("--offset={} with seq={} must keep positions in [0, 2^31)", offset_, g.seq));
      }
      return;
    }
    if (count_ != g.tokens() && count_ != g.seq) {
      throw Error(fmt::format("{} has {} entries{}; the tensor needs batch*seq={} or seq={}", shown_, count_,
                              streams_ > 1 ? " per stream" : "", g.tokens(), g.seq));
    }
    // By shape, not by count alone: a transposed [seq, batch] file holds batch*seq entries too.
    const int64_t cols = entry_.shape.back();
    if (cols != g.seq || (rows_ != g.batch && rows_ != 1)) {
      const std::string lead = streams_ > 1 ? fmt::format("{}, ", streams_) : "";
      throw Error(fmt::format("{} has shape [{}]; the tensor needs [{}batch={}, seq={}] or [{}1, seq={}] (or [seq={}]){}",
                              shown_, fmt::join(entry_.shape, ", "), lead, g.batch, g.seq, lead, g.seq, g.seq,
                              rows_ == g.seq && cols == g.batch && g.seq != g.batch ? ": it looks transposed" : ""));
    }
    if (streams_ != 1 && streams_ != schedule.streams) {
      throw Error(schedule.streams == 1
                      ? fmt::format("{} has {} streams but the schedule reads 1 (give [batch, seq] or [seq])", shown_,
                                    streams_)
                      : fmt::format("{} has {} streams but the schedule reads {} (give {} or 1, one stream serving "
                                    "all)", shown_, streams_, schedule.streams, schedule.streams));
    }
  }

  int streams() const { return streams_; }
  bool fractional() const { return fractional_; }

  // out = the positions of tokens first .. first + n - 1 (index b * seq + s) of a checked tensor,
  // stream after stream (n entries each). T: int64_t, or double for fractional positions.
  template <class T>
  void fill(const Geometry& g, int64_t first, int64_t n, std::vector<T>& out) const {
    out.resize(static_cast<size_t>(n * streams_));
    for (int stream = 0; stream < streams_; ++stream) {
      T* row = out.data() + stream * n;
      const int64_t base = stream * count_;
      for (int64_t k = 0; k < n;) {
        const int64_t s = (first + k) % g.seq;
        if (file_ && count_ == g.tokens()) {
          read_entries(base + first + k, static_cast<size_t>(n - k), row + k);
          break;
        }
        const int64_t run = std::min(n - k, g.seq - s);  // up to the end of this batch row
        if (file_) {
          read_entries(base + s, static_cast<size_t>(run), row + k);
        } else {
          for (int64_t i = 0; i < run; ++i) row[k + i] = static_cast<T>(offset_ + s + i);
        }
        k += run;
      }
    }
  }

 private:
  bool is_float() const { return entry_.dtype == "F32" || entry_.dtype == "F64"; }

  // Every entry in [0, 2^31); notes whether any is fractional.
  void scan(int64_t total) {
    std::vector<double> chunk;
    for (int64_t first = 0; first < total; first += kBlockBytes / 8) {
      chunk.resize(static_cast<size_t>(std::min(kBlockBytes / 8, total - first)));
      if (!is_float()) {
        std::vector<int64_t> whole(chunk.size());
        read_entries(first, whole.size(), whole.data());
        for (size_t i = 0; i < whole.size(); ++i) {
          if (whole[i] < 0 || whole[i] >= max_position_limit) throw out_of_range(first + static_cast<int64_t>(i), fmt::format("{}", whole[i]));
        }
        continue;
      }
      read_entries(first, chunk.size(), chunk.data());
      for (size_t i = 0; i < chunk.size(); ++i) {
        if (!(chunk[i] >= 0 && chunk[i] < static_cast<double>(max_position_limit))) {
          throw out_of_range(first + static_cast<int64_t>(i), fmt::format("{}", chunk[i]));
        }
        if (chunk[i] != static_cast<double>(static_cast<int64_t>(chunk[i]))) fractional_ = true;
      }
    }
  }

  // The error for entry `flat` (stream-major), named as [stream][index] when there are streams.
  Error out_of_range(int64_t flat, const std::string& value) const {
    const std::string where = streams_ > 1 ? fmt::format("positions[{}][{}]", flat / count_, flat % count_)
                                           : fmt::format("positions[{}]", flat);
    return Error(fmt::format("{}: {}={} must be in [0, 2^31)", shown_, where, value));
  }

  // Entries first .. first + n - 1 of the file, converted to T (int64_t or double; a fractional
  // entry read as int64_t is never asked for: fractional files are read as double).
  template <class T>
  void read_entries(int64_t first, size_t n, T* out) const {
    const uint64_t size = entry_.dtype == "I32" || entry_.dtype == "F32" ? 4 : 8;
    std::vector<unsigned char> bytes(n * size);
    file_->read(entry_.offset + static_cast<uint64_t>(first) * size, bytes.data(), bytes.size());
    for (size_t i = 0; i < n; ++i) {
      const unsigned char* at = bytes.data() + i * size;
      if (entry_.dtype == "I32") out[i] = static_cast<T>(load<int32_t>(at));
      else if (entry_.dtype == "I64") out[i] = static_cast<T>(load<int64_t>(at));
      else if (entry_.dtype == "F32") out[i] = static_cast<T>(load<float>(at));
      else out[i] = static_cast<T>(load<double>(at));
    }
  }

  template <class V>
  static V load(const unsigned char* at) {
    V v{};
    std::memcpy(&v, at, sizeof v);
    return v;
  }

  int64_t offset_ = 0;
  std::string shown_;
  std::unique_ptr<InputFile> file_;
  HostTensor entry_;
  int64_t count_ = 0;   // entries per stream
  int64_t rows_ = 1;    // each stream's rows: batch, or 1 for one row serving every batch row
  int streams_ = 1;
  bool fractional_ = false;
};

// Rotates one tensor of `input` into `output` a block at a time, its angles (exact or transformers'
// float32) from the Rope's tables, or computed on the fly beyond them.
void rotate_tensor(const Rope& rope, const ApplyFileOptions& o, const TokenPositions& positions,
                   const Geometry& g, const InputFile& input, const HostTensor& t, bool keys,
                   AtomicOutputs::File& output, std::vector<unsigned char>& buffer) {
  const int64_t streams = positions.streams();
  const int64_t max_tokens = std::max<int64_t>(1, kBlockBytes / (streams * 8));  // 8 bytes per position
  std::vector<int64_t> token_positions;
  std::vector<double> fractional;
  for_each_block(g, max_tokens, [&](const Block& b) {
    const int64_t bytes = b.tokens * b.heads * g.head_bytes();
    if (buffer.size() < static_cast<size_t>(bytes)) buffer.resize(static_cast<size_t>(bytes));
    input.read(t.offset + b.first_byte, buffer.data(), static_cast<uint64_t>(bytes));
    Positions block_positions;
    if (positions.fractional()) {
      positions.fill(g, b.first_token, b.tokens, fractional);
      block_positions = Positions::per_token(std::span<const double>(fractional), static_cast<int>(streams));
    } else {
      positions.fill(g, b.first_token, b.tokens, token_positions);
      block_positions = Positions::per_token(std::span<const int64_t>(token_positions), static_cast<int>(streams));
    }
    const TensorView view = g.bhsd ? TensorView::bhsd(buffer.data(), g.dtype, 1, b.heads, b.tokens, g.head_dim)
                                   : TensorView::bshd(buffer.data(), g.dtype, 1, b.tokens, b.heads, g.head_dim);
    // --k holds keys: xPos scales them by ζ^-(p-c)/γ, the queries of --q by ζ^+(p-c)/γ.
    rope.apply(ApplyArgs{.q = view, .positions = block_positions,
                              .direction = o.inverse ? Direction::inverse : Direction::forward,
                              .numerics = o.numerics, .q_is_key = keys, .undo = o.undo,
                              .threads = static_cast<int>(o.threads)});
    output.write(buffer.data(), static_cast<uint64_t>(bytes));
  });
}

// One input and its output: the tensors, and how each is rotated (or copied when unset).
struct ApplyJob {
  std::string out_option, out_path;
  bool keys = false;  // --k: rotated as keys
  std::unique_ptr<InputFile> input;
  TensorFile index;
  std::vector<std::optional<Geometry>> rotate;
  std::string header;
};

ApplyJob plan_job(const Schedule& schedule, const ApplyFileOptions& o, const TokenPositions& positions,
                  const NamedPath& in, const NamedPath& out) {
  ApplyJob job{.out_option = std::string(out.option), .out_path = out.path, .keys = in.option == "--k"};
  OpenedTensors opened = open_tensors(in.option, in.path);
  job.input = std::move(opened.file);
  job.index = std::move(opened.index);
  if (!o.tensor.empty() && !is_safetensors_path(in.path)) {
    throw Error(fmt::format("--tensor='{}' names a tensor of a .safetensors input, but {}='{}' is a .npy file "
                            "(one unnamed tensor)", excerpt(o.tensor), in.option, excerpt(in.path)));
  }
  bool any = false;
  for (const HostTensor& t : job.index.tensors) {
    job.rotate.emplace_back();
    if (!o.tensor.empty() && t.name != o.tensor) continue;
    any = true;
    with_context(fmt::format("{} '{}' {}: ", in.option, excerpt(in.path), tensor_label(t)), [&] {
      const Geometry g = geometry_of(t, o.order);
      check_against_schedule(schedule, g, o.threads);
      positions.check(g, schedule);
      job.rotate.back() = g;
    });
  }
  if (!any) throw Error(fmt::format("--tensor='{}' is not in {}='{}'", excerpt(o.tensor), in.option, excerpt(in.path)));
  job.header = with_context(fmt::format("{} ", out.option), [&] { return header_for(out.path, job.index); });
  return job;
}

void check_apply_options(const ApplyFileOptions& o) {
  if (o.q.empty() && o.k.empty()) throw Error("--q is required (or --k with --k-out: keys alone)");
  if (!o.q.empty() && o.out.empty()) throw Error("--out is required with --q");
  if (o.q.empty() && !o.out.empty()) throw Error("--out is set but --q is not (keys alone write --k-out)");
  if (o.inverse && o.undo) {
    throw Error("--inverse and --undo cannot both be given (--undo takes back a forward rotation, "
                "--inverse is its transpose)");
  }
  if (o.order != "bshd" && o.order != "bhsd") {
    throw Error(fmt::format("{}='{}' must be bshd or bhsd", o.order_option, excerpt(o.order)));
  }
  if (!o.k.empty() && o.k_out.empty()) throw Error("--k-out is required with --k");
  if (o.k.empty() && !o.k_out.empty()) throw Error("--k-out is set but --k is not");
  if (!o.positions.empty() && o.offset) throw Error("--positions and --offset cannot both be given");
  check_threads(o.threads, "--threads");
}

}  // namespace

void check_threads(int64_t threads, std::string_view option) {
  if (threads < 0 || threads > max_threads) {
    throw Error(fmt::format("{}={} must be in [0, {}] (0: all processors)", option, threads, max_threads));
  }
}

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
  check_apply_options(o);
  refuse_clobbering({{"--out", o.out}, {"--k-out", o.k_out}},
                    {{"--q", o.q}, {"--k", o.k}, {"--positions", o.positions}, {"--config", o.config}});
  const TokenPositions positions =
      o.positions.empty() ? TokenPositions(o.offset.value_or(0)) : TokenPositions(o.positions);
  if (positions.fractional() && o.numerics == AngleMode::hf_float32) {
    throw Error(fmt::format("--positions '{}' holds fractional positions; {}=hf-float32 needs whole ones "
                            "(transformers' float32 table)", excerpt(o.positions), o.numerics_option));
  }
  if (o.undo && o.numerics == AngleMode::hf_float32 && schedule.attention_factor != 1.0) {
    throw Error(fmt::format("--undo with {0}=hf-float32 needs attention_factor 1, not {1} (its float32 table "
                            "holds cos and sin times the factor; {0}=exact divides it out)",
                            o.numerics_option, schedule.attention_factor));
  }
  std::vector<ApplyJob> jobs;
  if (!o.q.empty()) jobs.push_back(plan_job(schedule, o, positions, {"--q", o.q}, {"--out", o.out}));
  if (!o.k.empty()) jobs.push_back(plan_job(schedule, o, positions, {"--k", o.k}, {"--k-out", o.k_out}));

  // Every check passed. Each output is written to its temporary, then all are renamed together.
  AtomicOutputs outputs;
  std::vector<AtomicOutputs::File*> files;
  for (const ApplyJob& job : jobs) {
    files.push_back(&outputs.add(job.out_path, shown({job.out_option, job.out_path})));
  }
  const Rope rope(schedule);
  std::vector<unsigned char> buffer;
  int rotated = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const ApplyJob& job = jobs[j];
    files[j]->write(job.header);
    for (size_t i = 0; i < job.index.tensors.size(); ++i) {
      const HostTensor& t = job.index.tensors[i];
      if (!job.rotate[i]) {
        copy_bytes(*job.input, t.offset, t.bytes(), *files[j], buffer);
        continue;
      }
      with_context(fmt::format("'{}' {}: ", excerpt(job.input->path()), tensor_label(t)), [&] {
        rotate_tensor(rope, o, positions, *job.rotate[i], *job.input, t, job.keys, *files[j], buffer);
      });
      ++rotated;
    }
  }
  outputs.commit();
  std::vector<std::string> written;
  for (const ApplyJob& job : jobs) written.push_back(job.out_path);
  out << fmt::format("rotated {} tensor(s); wrote {}\n", rotated, fmt::join(written, " and "));
  return 0;
}

namespace {

// How q and k projection rows split into heads: from --config, or from the options.
struct HeadCounts {
  int64_t q_heads = 0, k_heads = 0;
  int64_t head_dim = 0;    // 0: rows of the first q/k tensor / its heads
  int64_t rotary_dim = 0;  // 0: head_dim
  std::string config;      // "--config 'path'" when the counts come from there

  // "--num-heads=32", or "num_attention_heads=32 (--config 'x')".
  std::string heads_label(bool q) const {
    const int64_t n = q ? q_heads : k_heads;
    if (config.empty()) return fmt::format("{}={}", q ? "--num-heads" : "--num-kv-heads", n);
    return fmt::format("{}={} ({})", q ? "num_attention_heads" : "num_key_value_heads", n, config);
  }
};

HeadCounts counts_from_config(const ConvertOptions& o) {
  const std::pair<const char*, const std::optional<int64_t>*> given[] = {
      {"--num-heads", &o.num_heads}, {"--num-kv-heads", &o.num_kv_heads}, {"--head-dim", &o.head_dim},
      {"--rotary-dim", &o.rotary_dim}};
  for (const auto& [option, value] : given) {
    if (*value) throw Error(fmt::format("{} cannot be combined with --config (the config gives it)", option));
  }
  const ModelRope model = with_context("--", [&] { return read_hf_config_file(o.config); });
  HeadCounts c{.q_heads = model.num_attention_heads, .k_heads = model.num_key_value_heads,
               .head_dim = model.spec.head_dim, .rotary_dim = model.spec.resolved_rotary_dim(),
               .config = fmt::format("--config '{}'", excerpt(o.config))};
  if (c.q_heads <= 0 || c.k_heads <= 0 || c.head_dim <= 0) {
    throw Error(fmt::format("{} gives num_attention_heads={}, num_key_value_heads={}, head_dim={}; each must be > 0",
                            c.config, c.q_heads, c.k_heads, c.head_dim));
  }
  return c;
}

HeadCounts head_counts(const ConvertOptions& o) {
  HeadCounts c;
  if (!o.config.empty()) {
    c = counts_from_config(o);
  } else {
    if (!o.num_heads || !o.num_kv_heads) throw Error("--num-heads and --num-kv-heads are required (or --config)");
    const std::pair<const char*, const std::optional<int64_t>*> given[] = {
        {"--num-heads", &o.num_heads}, {"--num-kv-heads", &o.num_kv_heads}, {"--head-dim", &o.head_dim},
        {"--rotary-dim", &o.rotary_dim}};
    for (const auto& [option, value] : given) {
      if (*value && **value <= 0) throw Error(fmt::format("{}={} must be > 0", option, **value));
    }
    c = HeadCounts{.q_heads = *o.num_heads, .k_heads = *o.num_kv_heads, .head_dim = o.head_dim.value_or(0),
                   .rotary_dim = o.rotary_dim.value_or(0)};
  }
  if (c.q_heads % c.k_heads != 0) {
    throw Error(fmt::format("{} is not a multiple of {} (each key/value head serves a whole group of query heads)",
                            c.heads_label(true), c.heads_label(false)));
  }
  return c;
}

// Which tensors are q and k projections (weights [rows, cols] or biases [rows]), every one with
// rows = heads * head_dim for one head_dim shared by q and k. Fills c.head_dim when it was 0.
std::vector<char> classify(const ConvertOptions& o, const TensorFile& file, HeadCounts& c) {
  std::vector<char> role;  // 'q', 'k' or 0 (copied)
  // Where head_dim comes from: the config, --head-dim, or (neither) the first projection's rows.
  std::string head_dim_from = !c.config.empty() ? c.config : c.head_dim != 0 ? "--head-dim" : "";
  for (const HostTensor& t : file.tensors) {
    const bool is_q = wildcard_match(o.q_name, t.name);
    const bool is_k = wildcard_match(o.k_name, t.name);
    role.push_back(is_q ? 'q' : is_k ? 'k' : 0);
    if (is_q && is_k) throw Error(fmt::format("{} matches both --q-name and --k-name", tensor_label(t)));
    if (!is_q && !is_k) continue;
    if (t.shape.empty() || t.shape.size() > 2) {
      throw Error(fmt::format("{} has {} dimensions; expected a weight [rows, cols] or a bias [rows]", tensor_label(t),
                              t.shape.size()));
    }
    const int64_t rows = t.shape[0];
    const int64_t heads = is_q ? c.q_heads : c.k_heads;
    if (c.head_dim == 0 && rows % heads == 0 && rows > 0) {
      c.head_dim = rows / heads;
      head_dim_from = tensor_label(t);
    }
    if (c.head_dim == 0) {
      throw Error(fmt::format("{} has {} rows, not a multiple of {}: head_dim (rows / heads) cannot be derived from "
                              "it (give --head-dim)", tensor_label(t), rows, c.heads_label(is_q)));
    }
    if (c.head_dim == 0 || rows != heads * c.head_dim) {
      throw Error(fmt::format("{} has {} rows, not {} heads x head_dim {} = {} (head_dim from {}; q and k share it)",
                              tensor_label(t), rows, c.heads_label(is_q), c.head_dim, heads * c.head_dim,
                              head_dim_from));
    }
  }
  return role;
}

// Permutes the rows of projection tensor t, `heads` heads at a time, into output.
void permute_tensor(const InputFile& input, const HostTensor& t, int64_t heads, const PermuteRowsArgs& args,
                    AtomicOutputs::File& output, std::vector<unsigned char>& src, std::vector<unsigned char>& dst) {
  const int64_t row_bytes = (t.shape.size() == 2 ? t.shape[1] : 1) * dtype_size(t.dtype);
  const int64_t head_bytes = args.head_dim * row_bytes;
  if (head_bytes == 0) return;
  if (head_bytes > kBlockBytes) {  // one head at a time, row by row
    const std::vector<int64_t> source = pairing_permutation(args.head_dim, args.rotary_dim, args.from, args.to);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t j = 0; j < args.head_dim; ++j) {
        const int64_t row = h * args.head_dim + source[static_cast<size_t>(j)];
        copy_bytes(input, t.offset + static_cast<uint64_t>(row * row_bytes), static_cast<uint64_t>(row_bytes), output,
                   src);
      }
    }
    return;
  }
  const int64_t group = kBlockBytes / head_bytes;
  src.resize(static_cast<size_t>(kBlockBytes));
  dst.resize(static_cast<size_t>(kBlockBytes));
  for (int64_t h = 0; h < heads; h += group) {
    const int64_t n = std::min(group, heads - h);
    input.read(t.offset + static_cast<uint64_t>(h * head_bytes), src.data(), static_cast<uint64_t>(n * head_bytes));
    PermuteRowsArgs part = args;
    part.num_heads = n;
    part.row_bytes = row_bytes;
    permute_rows(src.data(), dst.data(), part);
    output.write(dst.data(), static_cast<uint64_t>(n * head_bytes));
  }
}

}  // namespace

int run_convert_weights(const ConvertOptions& o, std::ostream& out) {
  if (o.in.empty() || o.out.empty()) throw Error("--in and --out are required");
  if (!is_safetensors_path(o.in)) throw Error(fmt::format("--in='{}' must be a .safetensors file", excerpt(o.in)));
  if (!is_safetensors_path(o.out)) throw Error(fmt::format("--out='{}' must be a .safetensors file", excerpt(o.out)));
  if (o.q_name.empty() || o.k_name.empty()) throw Error("--q-name and --k-name are required");
  refuse_clobbering({{"--out", o.out}}, {{"--in", o.in}, {"--config", o.config}});
  const Pairing to = parse_pairing(o.to, "--to");
  const Pairing from = to == Pairing::half ? Pairing::interleaved : Pairing::half;
  HeadCounts counts = head_counts(o);
  OpenedTensors opened = open_tensors("--in", o.in);
  const InputFile& input = *opened.file;
  TensorFile& file = opened.index;
  const std::string target(to_string(to));
  if (auto said = file.metadata.find(kPairingMetadataKey);
      said != file.metadata.end() && said->second == target && !o.force) {
    throw Error(fmt::format("--in='{}' is already converted (__metadata__ {}={}); converting again would scramble "
                            "q and k (--force converts anyway)", excerpt(o.in), kPairingMetadataKey, target));
  }
  const std::vector<char> role = classify(o, file, counts);
  const int64_t q_count = std::count(role.begin(), role.end(), 'q');
  const int64_t k_count = std::count(role.begin(), role.end(), 'k');
  if (q_count == 0) throw Error(fmt::format("--q-name='{}' matches no tensor", excerpt(o.q_name)));
  if (k_count == 0) throw Error(fmt::format("--k-name='{}' matches no tensor", excerpt(o.k_name)));
  const PermuteRowsArgs args{.head_dim = counts.head_dim, .rotary_dim = counts.rotary_dim, .from = from, .to = to};
  const std::string rotary_dim_from = !counts.config.empty() ? counts.config + ": " : o.rotary_dim ? "--rotary-dim: " : "";
  with_context(rotary_dim_from, [&] { pairing_permutation(args.head_dim, args.rotary_dim, from, to); });
  file.metadata[kPairingMetadataKey] = target;

  AtomicOutputs outputs;
  AtomicOutputs::File& output = outputs.add(o.out, shown({"--out", o.out}));
  output.write(safetensors_header(file));
  std::vector<unsigned char> src, dst;
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    const HostTensor& t = file.tensors[i];
    if (role[i] == 0) {
      copy_bytes(input, t.offset, t.bytes(), output, src);
    } else {
      permute_tensor(input, t, role[i] == 'q' ? counts.q_heads : counts.k_heads, args, output, src, dst);
    }
  }
  outputs.commit();
  out << fmt::format("permuted {} query and {} key tensor(s) from {} to {} pairing; wrote {}\n", q_count, k_count,
                     to_string(from), to_string(to), o.out);
  return 0;
}

}  // namespace rotary::cli
