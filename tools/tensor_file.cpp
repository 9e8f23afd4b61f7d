#include "tensor_file.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "rotary/error.hpp"

namespace rotary::cli {
namespace {

constexpr int64_t kMaxElements = int64_t{1} << 40;

// Product of dims, each >= 0, refusing overflow past 2^40 elements.
int64_t checked_elements(const std::vector<int64_t>& shape, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error(fmt::format("{}: dimension {} is negative", what, d));
    if (d != 0 && n > kMaxElements / d) throw Error(fmt::format("{}: shape has more than 2^40 elements", what));
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
  throw Error(fmt::format("dtype {} cannot be written to .npy (F32, F64, F16, I32, I64)", dtype));
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
        skip();
        if (i < h.size() && h[i] == ',') ++i;
        if (out.shape.size() > 32) fail("more than 32 dimensions");
      }
      have_shape = true;
    } else {
      fail("unknown key");
    }
    skip();
    if (i < h.size() && h[i] == ',') ++i;
  }
  if (!have_descr || !have_fortran || !have_shape) fail("missing descr, fortran_order or shape");
  return out;
}

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int k = 7; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

}  // namespace

int64_t HostTensor::elements() const { return checked_elements(shape, name); }

int64_t dtype_size(std::string_view dtype) {
  static const std::map<std::string_view, int64_t> sizes = {
      {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2},
      {"F16", 2}, {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4}, {"F64", 8}, {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(dtype);
  if (it == sizes.end()) throw Error(fmt::format("dtype '{}' is unknown", dtype));
  return it->second;
}

TensorFile parse_npy(std::string_view bytes) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < 10 || std::memcmp(b, "\x93NUMPY", 6) != 0) throw Error(".npy magic is missing");
  const int major = b[6];
  size_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = b[8] | (static_cast<size_t>(b[9]) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw Error(".npy header is truncated");
    header_len = b[8] | (static_cast<size_t>(b[9]) << 8) | (static_cast<size_t>(b[10]) << 16) |
                 (static_cast<size_t>(b[11]) << 24);
    offset = 12;
  } else {
    throw Error(fmt::format(".npy version {} is unsupported", major));
  }
  if (header_len > bytes.size() - offset) throw Error(".npy header is truncated");
  const NpyHeader header = parse_npy_header(bytes.substr(offset, header_len));
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
  else throw Error(fmt::format(".npy dtype '{}' is unsupported (little-endian f4, f8, f2, i4, i8)", d));
  const int64_t n = checked_elements(t.shape, ".npy");
  const size_t data_at = offset + header_len;
  const auto need = static_cast<uint64_t>(n) * static_cast<uint64_t>(dtype_size(t.dtype));
  if (bytes.size() - data_at != need) {
    throw Error(fmt::format(".npy data has {} bytes but shape and dtype need {}", bytes.size() - data_at, need));
  }
  t.data.assign(b + data_at, b + bytes.size());
  TensorFile file;
  file.tensors.push_back(std::move(t));
  return file;
}

std::string format_npy(const HostTensor& t) {
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
  out += header;
  out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  return out;
}

TensorFile parse_safetensors(std::string_view bytes) {
  if (bytes.size() < 8) throw Error(".safetensors is shorter than its 8-byte header size");
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const uint64_t header_size = read_le64(b);
  if (header_size > bytes.size() - 8) {
    throw Error(fmt::format(".safetensors header size {} exceeds the file ({} bytes)", header_size, bytes.size()));
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, header_size));
  } catch (const nlohmann::json::exception&) {
    throw Error(".safetensors header is not valid JSON");
  }
  if (!header.is_object()) throw Error(".safetensors header is not a JSON object");
  const uint64_t buffer_size = bytes.size() - 8 - header_size;
  const unsigned char* buffer = b + 8 + header_size;
  TensorFile file;
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) throw Error(".safetensors __metadata__ must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) throw Error(fmt::format(".safetensors __metadata__.{} must be a string", m.key()));
        file.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const auto& entry = *it;
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      throw Error(fmt::format(".safetensors tensor '{}' needs dtype, shape and data_offsets", name));
    }
    HostTensor t;
    t.name = name;
    if (!entry["dtype"].is_string()) throw Error(fmt::format(".safetensors tensor '{}' dtype must be a string", name));
    t.dtype = entry["dtype"].get<std::string>();
    const int64_t es = dtype_size(t.dtype);
    if (!entry["shape"].is_array() || entry["shape"].size() > 32) {
      throw Error(fmt::format(".safetensors tensor '{}' shape must be a list of at most 32 integers", name));
    }
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) throw Error(fmt::format(".safetensors tensor '{}' shape has a non-integer", name));
      const uint64_t v = d.get<uint64_t>();
      if (v > (uint64_t{1} << 40)) throw Error(fmt::format(".safetensors tensor '{}' dimension {} is too large", name, v));
      t.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      throw Error(fmt::format(".safetensors tensor '{}' data_offsets must be [begin, end]", name));
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > buffer_size) {
      throw Error(fmt::format(".safetensors tensor '{}' data_offsets [{}, {}] lie outside the {}-byte buffer", name,
                              begin, end, buffer_size));
    }
    const auto need = static_cast<uint64_t>(checked_elements(t.shape, name)) * static_cast<uint64_t>(es);
    if (end - begin != need) {
      throw Error(fmt::format(".safetensors tensor '{}' has {} bytes but shape and dtype need {}", name, end - begin, need));
    }
    t.data.assign(buffer + begin, buffer + end);
    spans.push_back({begin, end, name});
    file.tensors.push_back(std::move(t));
  }
  std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) { return x.begin < y.begin; });
  uint64_t covered = 0;
  for (const Span& s : spans) {
    if (s.begin < covered) throw Error(fmt::format(".safetensors tensor '{}' overlaps another tensor", s.name));
    if (s.begin > covered) throw Error(fmt::format(".safetensors buffer has a hole before tensor '{}'", s.name));
    covered = s.end;
  }
  if (covered != buffer_size) throw Error(".safetensors buffer has bytes no tensor covers");
  // File order = offset order.
  std::sort(file.tensors.begin(), file.tensors.end(), [&](const HostTensor& x, const HostTensor& y) {
    auto pos = [&](const std::string& n) {
      for (const Span& s : spans) if (s.name == n) return s.begin;
      return uint64_t{0};
    };
    return pos(x.name) < pos(y.name);
  });
  return file;
}

std::string format_safetensors(const TensorFile& file) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!file.metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : file.metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const HostTensor& t : file.tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int k = 0; k < 8; ++k) out[static_cast<size_t>(k)] = static_cast<char>((n >> (8 * k)) & 0xff);
  out += text;
  for (const HostTensor& t : file.tensors) out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  return out;
}

bool is_safetensors_path(const std::string& path) {
  return path.size() >= 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0;
}

TensorFile read_tensor_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("'{}' cannot be read", path));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  try {
    if (is_safetensors_path(path)) return parse_safetensors(bytes);
    if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".npy") == 0) return parse_npy(bytes);
  } catch (const Error& e) {
    throw Error(fmt::format("'{}': {}", path, e.what()));
  }
  throw Error(fmt::format("'{}' must end in .npy or .safetensors", path));
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::random_device rd;
  const fs::path temp = folder / fmt::format(".{}.tmp-{:08x}", target.filename().string(), rd());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(fmt::format("'{}' cannot be written (folder missing or not writable)", path));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      out.close();
      std::error_code ignored;
      fs::remove(temp, ignored);
      throw Error(fmt::format("'{}' could not be written completely", path));
    }
  }
  std::error_code ec;
  fs::rename(temp, target, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(temp, ignored);
    throw Error(fmt::format("'{}' could not be replaced: {}", path, ec.message()));
  }
}

}  // namespace rotary::cli
