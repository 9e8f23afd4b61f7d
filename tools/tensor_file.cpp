#include "tensor_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <tuple>
#include <utility>

#include "../src/config/json_parse.hpp"
#include "../src/text.hpp"
#include "rotary/error.hpp"

namespace rotary::cli {
namespace {

namespace fs = std::filesystem;
using detail::excerpt;

constexpr int64_t kMaxElements = int64_t{1} << 40;

// Product of dims, each >= 0, refusing overflow past 2^40 elements.
int64_t checked_elements(const std::vector<int64_t>& shape, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error(fmt::format("{}: dimension {} is negative", excerpt(what), d));
    if (d != 0 && n > kMaxElements / d) {
      throw Error(fmt::format("{}: shape has more than 2^40 elements", excerpt(what)));
    }
    n *= d;
  }
  return n;
}

std::string npy_descr(std::string_view dtype) {
  if (dtype == "F32") return "<f4";
  if (dtype == "F64") return "<f8";
  if (dtype == "F16") return "<f2";
  if (dtype == "I32") return "<i4";
  if (dtype == "I64") return "<i8";
  throw Error(fmt::format("dtype {} cannot be written to .npy (F32, F64, F16, I32, I64)", excerpt(dtype)));
}

// The .npy header is a Python dict literal; this reads exactly the three keys numpy writes.
struct NpyHeader {
  std::string descr;
  bool fortran = false;
  std::vector<int64_t> shape;
};

NpyHeader parse_npy_header(std::string_view h) {
  NpyHeader out;
  size_t i = 0;
  auto fail = [&](const char* why) {
    throw Error(fmt::format(".npy header is malformed ({} at byte {})", why, i));
  };
  auto skip = [&] { while (i < h.size() && (h[i] == ' ' || h[i] == '\n')) ++i; };
  auto expect = [&](char c) {
    skip();
    if (i >= h.size() || h[i] != c) fail("unexpected character");
    ++i;
  };
  auto quoted = [&] {
    skip();
    if (i >= h.size() || (h[i] != '\'' && h[i] != '"')) fail("expected a string");
    const char q = h[i++];
    const size_t start = i;
    while (i < h.size() && h[i] != q) ++i;
    if (i >= h.size()) fail("unterminated string");
    return std::string(h.substr(start, i++ - start));
  };
  bool have_descr = false, have_fortran = false, have_shape = false;
  expect('{');
  while (true) {
    skip();
    if (i < h.size() && h[i] == '}') { ++i; break; }
    const std::string key = quoted();
    expect(':');
    skip();
    if (key == "descr") {
      out.descr = quoted();
      have_descr = true;
    } else if (key == "fortran_order") {
      if (h.substr(i, 4) == "True") { out.fortran = true; i += 4; }
      else if (h.substr(i, 5) == "False") { i += 5; }
      else fail("fortran_order must be True or False");
      have_fortran = true;
    } else if (key == "shape") {
      expect('(');
      out.shape.clear();
      while (true) {
        skip();
        if (i < h.size() && h[i] == ')') { ++i; break; }
        int64_t v = 0;
        const size_t start = i;
        while (i < h.size() && h[i] >= '0' && h[i] <= '9') {
          if (v > (int64_t{1} << 50)) fail("dimension too large");
          v = v * 10 + (h[i++] - '0');
        }
        if (i == start) fail("expected a dimension");
        if (i < h.size() && h[i] == 'L') ++i;  // Python 2 longs
        out.shape.push_back(v);
        if (out.shape.size() > 32) fail("more than 32 dimensions");
        skip();
        // Dimensions are separated by commas: (2, 3) or (2,); "(2 3)" is not a tuple.
        if (i < h.size() && h[i] == ',') ++i;
        else if (i >= h.size() || h[i] != ')') fail("expected ',' or ')'");
      }
      have_shape = true;
    } else {
      fail("unknown key");
    }
    skip();
    if (i < h.size() && h[i] == ',') ++i;
    else if (i >= h.size() || h[i] != '}') fail("expected ',' or '}'");
  }
  if (!have_descr || !have_fortran || !have_shape) fail("missing descr, fortran_order or shape");
  return out;
}

uint64_t read_le(std::string_view bytes) {
  uint64_t v = 0;
  for (size_t k = bytes.size(); k-- > 0;) v = (v << 8) | static_cast<unsigned char>(bytes[k]);
  return v;
}

// The readers see a file through read(offset, n), which returns exactly n bytes at offset (the
// caller keeps offset + n within size), so one parser serves bytes in memory and files on disk.
template <class Read>
TensorFile index_npy(uint64_t size, const Read& read) {
  if (size < 10) throw Error(".npy magic is missing");
  const std::string lead = read(0, std::min<uint64_t>(size, 12));
  if (lead.compare(0, 6, "\x93NUMPY") != 0) throw Error(".npy magic is missing");
  const int major = static_cast<unsigned char>(lead[6]);
  uint64_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = read_le(std::string_view(lead).substr(8, 2));
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) throw Error(".npy header is truncated");
    header_len = read_le(std::string_view(lead).substr(8, 4));
    offset = 12;
  } else {
    throw Error(fmt::format(".npy version {} is unsupported", major));
  }
  if (header_len > size - offset) throw Error(".npy header is truncated");
  if (header_len > kMaxNpyHeaderBytes) {
    throw Error(fmt::format(".npy header of {} bytes exceeds {}", header_len, kMaxNpyHeaderBytes));
  }
  const NpyHeader header = parse_npy_header(read(offset, header_len));
  if (header.fortran) throw Error(".npy fortran_order=True is unsupported (save C-contiguous)");
  HostTensor t;
  t.name = "array";
  t.shape = header.shape;
  const std::string& d = header.descr;
  if (d == "<f4" || d == "=f4") t.dtype = "F32";
  else if (d == "<f8" || d == "=f8") t.dtype = "F64";
  else if (d == "<f2" || d == "=f2") t.dtype = "F16";
  else if (d == "<i4" || d == "=i4") t.dtype = "I32";
  else if (d == "<i8" || d == "=i8") t.dtype = "I64";
  else throw Error(fmt::format(".npy dtype '{}' is unsupported (little-endian f4, f8, f2, i4, i8)", excerpt(d)));
  checked_elements(t.shape, ".npy");
  t.offset = offset + header_len;
  if (size - t.offset != t.bytes()) {
    throw Error(fmt::format(".npy data has {} bytes but shape and dtype need {}", size - t.offset, t.bytes()));
  }
  TensorFile file;
  file.tensors.push_back(std::move(t));
  return file;
}

std::string tensor_label(const std::string& name) { return fmt::format("tensor '{}'", excerpt(name)); }

HostTensor safetensors_entry(const std::string& name, const nlohmann::json& entry, uint64_t buffer_size,
                             uint64_t& begin, uint64_t& end) {
  const std::string label = ".safetensors " + tensor_label(name);
  if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
    throw Error(label + " needs dtype, shape and data_offsets");
  }
  HostTensor t;
  t.name = name;
  const auto& dtype = entry.at("dtype");
  if (!dtype.is_string()) throw Error(label + " dtype must be a string");
  t.dtype = dtype.get<std::string>();
  try {
    dtype_size(t.dtype);
  } catch (const Error& e) {
    throw Error(label + ": " + e.what());
  }
  const auto& shape = entry.at("shape");
  if (!shape.is_array() || shape.size() > 32) throw Error(label + " shape must be a list of at most 32 integers");
  for (const auto& dim : shape) {
    if (!dim.is_number_unsigned()) throw Error(label + " shape has a non-integer");
    const uint64_t v = dim.get<uint64_t>();
    if (v > (uint64_t{1} << 40)) throw Error(fmt::format("{} dimension {} is too large", label, v));
    t.shape.push_back(static_cast<int64_t>(v));
  }
  const auto& off = entry.at("data_offsets");
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
    throw Error(label + " data_offsets must be [begin, end]");
  }
  begin = off[0].get<uint64_t>();
  end = off[1].get<uint64_t>();
  if (begin > end || end > buffer_size) {
    throw Error(fmt::format("{} data_offsets [{}, {}] lie outside the {}-byte buffer", label, begin, end, buffer_size));
  }
  checked_elements(t.shape, label);
  if (end - begin != t.bytes()) {
    throw Error(fmt::format("{} has {} bytes but shape and dtype need {}", label, end - begin, t.bytes()));
  }
  return t;
}

template <class Read>
TensorFile index_safetensors(uint64_t size, const Read& read) {
  if (size < 8) throw Error(".safetensors is shorter than its 8-byte header size");
  const uint64_t header_size = read_le(read(0, 8));
  if (header_size > size - 8) {
    throw Error(fmt::format(".safetensors header size {} exceeds the file ({} bytes)", header_size, size));
  }
  if (header_size > kMaxSafetensorsHeaderBytes) {
    throw Error(fmt::format(".safetensors header size {} exceeds {}", header_size, kMaxSafetensorsHeaderBytes));
  }
  const nlohmann::json header = detail::parse_json(read(8, header_size), ".safetensors header");
  if (!header.is_object()) throw Error(".safetensors header is not a JSON object");
  const uint64_t buffer_at = 8 + header_size;
  const uint64_t buffer_size = size - buffer_at;
  TensorFile file;
  struct Span {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;
  std::vector<HostTensor> tensors;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) throw Error(".safetensors __metadata__ must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) throw Error(fmt::format(".safetensors __metadata__.{} must be a string", excerpt(m.key())));
        file.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    Span span{0, 0, tensors.size()};
    tensors.push_back(safetensors_entry(name, *it, buffer_size, span.begin, span.end));
    tensors.back().offset = buffer_at + span.begin;
    spans.push_back(span);
  }
  // The tensors tile the buffer in offset order. Sorting by (begin, end) puts a zero-size tensor
  // before the tensor that starts where it does, as the reference writer lays them out.
  std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) {
    return std::tie(x.begin, x.end, x.index) < std::tie(y.begin, y.end, y.index);
  });
  uint64_t covered = 0;
  for (const Span& s : spans) {
    const std::string& name = tensors[s.index].name;
    if (s.begin < covered) throw Error(fmt::format(".safetensors {} overlaps another tensor", tensor_label(name)));
    if (s.begin > covered) throw Error(fmt::format(".safetensors buffer has a hole before {}", tensor_label(name)));
    covered = s.end;
  }
  if (covered != buffer_size) throw Error(".safetensors buffer has bytes no tensor covers");
  file.tensors.reserve(spans.size());
  for (const Span& s : spans) file.tensors.push_back(std::move(tensors[s.index]));  // file order
  return file;
}

// Fills every tensor's data from the whole file's bytes.
TensorFile with_data(TensorFile file, std::string_view bytes) {
  for (HostTensor& t : file.tensors) {
    const auto* first = reinterpret_cast<const unsigned char*>(bytes.data()) + t.offset;
    t.data.assign(first, first + t.bytes());
  }
  return file;
}

auto memory_reader(std::string_view bytes) {
  return [bytes](uint64_t offset, uint64_t n) { return std::string(bytes.substr(offset, n)); };
}

std::string system_error() { return std::strerror(errno); }

bool ends_with(const std::string& text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Reads all of fd, failing past `cap` bytes.
std::string read_all(int fd, const std::string& path, uint64_t cap) {
  std::string out;
  char chunk[1 << 16];
  while (true) {
    const ssize_t got = ::read(fd, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Error(fmt::format("'{}' cannot be read: {}", excerpt(path), system_error()));
    if (got == 0) return out;
    if (out.size() + static_cast<uint64_t>(got) > cap) {
      throw Error(fmt::format("'{}' is not a regular file and holds more than {} MiB, the most read into memory "
                              "(save the data to a regular file)", excerpt(path), cap >> 20));
    }
    out.append(chunk, static_cast<size_t>(got));
  }
}

int open_for_reading(const std::string& path, struct stat& st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("'{}' cannot be read: {}", excerpt(path), system_error()));
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("'{}' cannot be read: {}", excerpt(path), S_ISDIR(st.st_mode) ? "it is a folder" : system_error()));
  }
  return fd;
}

}  // namespace

int64_t HostTensor::elements() const { return checked_elements(shape, name); }

uint64_t HostTensor::bytes() const {
  return static_cast<uint64_t>(elements()) * static_cast<uint64_t>(dtype_size(dtype));
}

int64_t dtype_size(std::string_view dtype) {
  static const std::map<std::string_view, int64_t> sizes = {
      {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2},
      {"F16", 2}, {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4}, {"F64", 8}, {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(dtype);
  if (it == sizes.end()) throw Error(fmt::format("dtype '{}' is unknown", excerpt(dtype)));
  return it->second;
}

TensorFile parse_npy(std::string_view bytes) { return with_data(index_npy(bytes.size(), memory_reader(bytes)), bytes); }

TensorFile parse_safetensors(std::string_view bytes) {
  return with_data(index_safetensors(bytes.size(), memory_reader(bytes)), bytes);
}

std::string npy_header(const HostTensor& t) {
  // Python tuple syntax: () for a scalar, (5,) for one dimension, (2, 3) otherwise.
  std::string dims;
  for (size_t i = 0; i < t.shape.size(); ++i) dims += fmt::format("{}{}", i ? ", " : "", t.shape[i]);
  if (t.shape.size() == 1) dims += ",";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                                   npy_descr(t.dtype), dims);
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  if (header.size() > 65535) throw Error(".npy header too long");
  std::string out = "\x93NUMPY";
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  return out + header;
}

std::string safetensors_header(const TensorFile& file) {
  // Written by hand, in file order: nlohmann's ordered_json finds keys by linear search.
  const auto quote = [](const std::string& s) {
    return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  std::string text = "{";
  if (!file.metadata.empty()) {
    text += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : file.metadata) {
      text += (first ? "" : ",") + quote(key) + ":" + quote(value);
      first = false;
    }
    text += "}";
  }
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const HostTensor& t : file.tensors) {
    if (!names.insert(t.name).second || t.name == "__metadata__") {
      throw Error(fmt::format("{} cannot be written twice to one .safetensors file", tensor_label(t.name)));
    }
    const uint64_t bytes = t.bytes();
    text += fmt::format("{}{}:{{\"dtype\":{},\"shape\":{},\"data_offsets\":[{},{}]}}", text.size() > 1 ? "," : "",
                        quote(t.name), quote(t.dtype), nlohmann::json(t.shape).dump(), offset, offset + bytes);
    offset += bytes;
  }
  text += "}";
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = text.size();
  for (int k = 0; k < 8; ++k) out[static_cast<size_t>(k)] = static_cast<char>((n >> (8 * k)) & 0xff);
  return out + text;
}

namespace {
void append_data(std::string& out, const HostTensor& t) {
  if (t.data.size() != t.bytes()) {
    throw Error(fmt::format("{} holds {} bytes but its shape and dtype need {}", tensor_label(t.name), t.data.size(),
                            t.bytes()));
  }
  out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
}
}  // namespace

std::string format_npy(const HostTensor& t) {
  std::string out = npy_header(t);
  append_data(out, t);
  return out;
}

std::string format_safetensors(const TensorFile& file) {
  std::string out = safetensors_header(file);
  for (const HostTensor& t : file.tensors) append_data(out, t);
  return out;
}

bool is_safetensors_path(const std::string& path) { return ends_with(path, ".safetensors"); }
bool is_npy_path(const std::string& path) { return ends_with(path, ".npy"); }

InputFile::InputFile(const std::string& path, uint64_t memory_cap) : path_(path) {
  struct stat st {};
  const int fd = open_for_reading(path, st);
  if (S_ISREG(st.st_mode)) {
    fd_ = fd;
    size_ = static_cast<uint64_t>(st.st_size);
    return;
  }
  try {
    memory_ = read_all(fd, path, memory_cap);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  size_ = memory_.size();
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read(uint64_t offset, void* dst, uint64_t n) const {
  if (offset > size_ || n > size_ - offset) {
    throw Error(fmt::format("'{}' ends at byte {}, before byte {}", excerpt(path_), size_, offset + n));
  }
  if (fd_ < 0) {
    std::memcpy(dst, memory_.data() + offset, n);
    return;
  }
  auto* out = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd_, out, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Error(fmt::format("'{}' cannot be read: {}", excerpt(path_), system_error()));
    if (got == 0) throw Error(fmt::format("'{}' became shorter while being read", excerpt(path_)));
    out += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
}

std::string InputFile::read(uint64_t offset, uint64_t n) const {
  std::string out(n, '\0');
  read(offset, out.data(), n);
  return out;
}

TensorFile read_tensor_index(const InputFile& file) {
  const auto reader = [&file](uint64_t offset, uint64_t n) { return file.read(offset, n); };
  try {
    if (is_safetensors_path(file.path())) return index_safetensors(file.size(), reader);
    if (is_npy_path(file.path())) return index_npy(file.size(), reader);
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with("'")) throw;  // already names the file
    throw Error(fmt::format("'{}': {}", excerpt(file.path()), e.what()));
  }
  throw Error(fmt::format("'{}' must end in .npy or .safetensors", excerpt(file.path())));
}

TensorFile read_tensor_file(const std::string& path) {
  const InputFile file(path);
  TensorFile out = read_tensor_index(file);
  for (HostTensor& t : out.tensors) {
    t.data.resize(t.bytes());
    file.read(t.offset, t.data.data(), t.data.size());
  }
  return out;
}

bool FileIdentity::operator==(const FileIdentity& other) const {
  if (exists != other.exists) return false;
  return exists ? device == other.device && inode == other.inode : path == other.path;
}

namespace {

constexpr int kMaxLinksFollowed = 40;  // as Linux's path lookup

// The file that writing `path` creates or replaces: `path` itself, or where its chain of symbolic
// links ends, existing or not (a relative link read from the link's folder). Empty for a loop, a
// chain longer than kMaxLinksFollowed, or a link that cannot be read.
fs::path follow_links(const std::string& path) {
  fs::path p(path);
  for (int followed = 0; followed <= kMaxLinksFollowed; ++followed) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    std::error_code ec;
    const fs::path link = fs::read_symlink(p, ec);
    if (ec) return {};
    p = link.is_absolute() ? link : p.parent_path() / link;
  }
  return {};
}

}  // namespace

FileIdentity file_identity(const std::string& path) {
  FileIdentity id;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    id.exists = true;
    id.device = st.st_dev;
    id.inode = st.st_ino;
    return id;
  }
  const fs::path followed = follow_links(path);
  const fs::path p = followed.empty() ? fs::path(path) : followed;
  std::error_code ec;
  const fs::path folder = fs::weakly_canonical(p.has_parent_path() ? p.parent_path() : fs::path("."), ec);
  id.path = ((ec ? p.parent_path() : folder) / p.filename()).string();
  return id;
}

void AtomicOutputs::File::write(const void* data, uint64_t n) {
  const auto* in = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::write(fd_, in, std::min<uint64_t>(n, uint64_t{1} << 30));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) throw OutputError(fmt::format("{} could not be written: {}", label_, system_error()));
    in += put;
    n -= static_cast<uint64_t>(put);
  }
}

AtomicOutputs::File& AtomicOutputs::add(const std::string& path, const std::string& label) {
  const std::string shown = label.empty() ? fmt::format("'{}'", excerpt(path)) : label;
  const auto refuse_folder = [&shown](const fs::path& p) {
    const std::string name = p.filename().string();
    if (name.empty() || name == "." || name == "..") {
      throw OutputError(fmt::format("{} names a folder, not a file to write", shown));
    }
  };
  refuse_folder(path);
  const fs::path target = follow_links(path);
  if (target.empty()) {
    throw OutputError(fmt::format("{} is a symbolic link that cannot be followed (a loop, or more than {} links)",
                                  shown, kMaxLinksFollowed));
  }
  refuse_folder(target);
  struct stat st {};
  const bool exists = ::stat(target.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) {
    throw OutputError(fmt::format("{} exists and is not a regular file; it is not replaced", shown));
  }
  auto file = std::make_unique<File>();
  file->path_ = path;
  file->label_ = shown;
  file->target_ = target.string();
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string target_name = target.filename().string();
  std::mt19937_64 rng(std::random_device{}());
  for (int attempt = 0; attempt < 100 && file->fd_ < 0; ++attempt) {
    file->temp_ = (folder / fmt::format(".{}.tmp-{:016x}", target_name.substr(0, 100), rng())).string();
    file->fd_ = ::open(file->temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (file->fd_ < 0 && errno != EEXIST) {
      throw OutputError(fmt::format("{} cannot be written (folder missing or not writable): {}", shown, system_error()));
    }
  }
  if (file->fd_ < 0) throw OutputError(fmt::format("{} cannot be written: no free temporary name", shown));
  files_.push_back(std::move(file));
  if (exists && ::fchmod(files_.back()->fd_, st.st_mode & 07777) != 0) {
    throw OutputError(fmt::format("{} cannot keep its permissions: {}", shown, system_error()));
  }
  return *files_.back();
}

void AtomicOutputs::commit() {
  for (auto& f : files_) {
    if (::fsync(f->fd_) != 0 || ::close(std::exchange(f->fd_, -1)) != 0) {
      throw OutputError(fmt::format("{} could not be written: {}", f->label_, system_error()));
    }
  }
  // Every output is complete on disk before the first is renamed.
  for (auto& f : files_) {
    if (::rename(f->temp_.c_str(), f->target_.c_str()) != 0) {
      throw OutputError(fmt::format("{} could not be replaced: {}", f->label_, system_error()));
    }
    f->temp_.clear();
  }
  files_.clear();
}

void AtomicOutputs::discard() noexcept {
  for (auto& f : files_) {
    if (f->fd_ >= 0) ::close(f->fd_);
    if (!f->temp_.empty()) ::unlink(f->temp_.c_str());
  }
  files_.clear();
}

AtomicOutputs::~AtomicOutputs() { discard(); }

void write_file_atomically(const std::string& path, std::string_view bytes) {
  AtomicOutputs outputs;
  outputs.add(path).write(bytes);
  outputs.commit();
}

}  // namespace rotary::cli
