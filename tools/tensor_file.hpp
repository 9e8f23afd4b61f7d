// Small, strict readers and writers for .npy and .safetensors (no such library ships in Debian).
// Every size, offset and shape is checked before use; malformed input throws rotary::Error.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace rotary::cli {

/// One tensor: safetensors dtype names (F32, F64, F16, BF16, I32, I64, U8, ...), row-major bytes.
struct HostTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<unsigned char> data;
  int64_t elements() const;
};

struct TensorFile {
  std::vector<HostTensor> tensors;             ///< in file order
  std::map<std::string, std::string> metadata;  ///< safetensors __metadata__
};

/// Bytes per element of a safetensors dtype name; throws for unknown names.
int64_t dtype_size(std::string_view dtype);

TensorFile parse_npy(std::string_view bytes);          ///< one tensor named "array"
TensorFile parse_safetensors(std::string_view bytes);
std::string format_npy(const HostTensor& tensor);      ///< F32, F64, F16, I32, I64
std::string format_safetensors(const TensorFile& file);

/// By extension: .npy or .safetensors. Errors name the path.
TensorFile read_tensor_file(const std::string& path);
/// Writes to a temporary file in the same folder, then renames over `path`: on error nothing is
/// left behind and an existing file is untouched.
void write_file_atomically(const std::string& path, std::string_view bytes);
bool is_safetensors_path(const std::string& path);

}  // namespace rotary::cli
