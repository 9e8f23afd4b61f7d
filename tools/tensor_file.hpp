// Small, strict readers and writers for .npy and .safetensors (no such library ships in Debian), and
// the file handling of the commands that rewrite them: inputs read by offset, outputs written all
// or nothing. Every size, offset and shape is checked before use; malformed input throws
// rotary::Error. Readers take O(n log n) time in the number of tensors and never hold a file's data
// unless asked to (read_tensor_file, parse_*).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "rotary/error.hpp"

namespace rotary::cli {

/// One tensor: safetensors dtype names (F32, F64, F16, BF16, I32, I64, U8, ...), row-major bytes.
struct HostTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<unsigned char> data;  ///< the bytes when loaded; empty in an index (read_tensor_index)
  uint64_t offset = 0;              ///< where the bytes start in the file the tensor was read from
  int64_t elements() const;         ///< throws past 2^40 elements
  uint64_t bytes() const;           ///< elements() * dtype_size(dtype)
};

struct TensorFile {
  std::vector<HostTensor> tensors;             ///< in file order
  std::map<std::string, std::string> metadata;  ///< safetensors __metadata__
};

/// Bytes per element of a safetensors dtype name; throws for unknown names.
int64_t dtype_size(std::string_view dtype);

/// Longest .safetensors header accepted (the reference implementation's limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
/// Longest .npy header accepted (numpy writes ~128 bytes; its own reader stops at 10000).
inline constexpr uint64_t kMaxNpyHeaderBytes = uint64_t{1} << 20;
/// Largest input that is not a regular file (a pipe, /dev/zero): such a file is read into memory.
inline constexpr uint64_t kMaxUnseekableBytes = uint64_t{64} << 20;

TensorFile parse_npy(std::string_view bytes);          ///< one tensor named "array", data loaded
TensorFile parse_safetensors(std::string_view bytes);  ///< data loaded
/// Headers alone, for the tensors' dtype, shape and bytes(); data need not be loaded.
std::string npy_header(const HostTensor& tensor);      ///< F32, F64, F16, I32, I64
std::string safetensors_header(const TensorFile& file);
/// Header and data; each tensor's data must hold bytes() bytes.
std::string format_npy(const HostTensor& tensor);
std::string format_safetensors(const TensorFile& file);

bool is_safetensors_path(const std::string& path);
bool is_npy_path(const std::string& path);

/// An input file read by offset. A regular file is read where it lies (pread: only what is asked
/// for enters memory); anything else (a pipe, /dev/zero) is read into memory first, at most
/// `memory_cap` bytes. Errors name the path (excerpted).
class InputFile {
 public:
  explicit InputFile(const std::string& path, uint64_t memory_cap = kMaxUnseekableBytes);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  /// Copies bytes [offset, offset + n) to dst; throws if they are not all there.
  void read(uint64_t offset, void* dst, uint64_t n) const;
  std::string read(uint64_t offset, uint64_t n) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string memory_;  // the whole file, when it is not a regular file
};

/// The tensors of a .npy or .safetensors file (by extension) with their offsets, data not loaded.
TensorFile read_tensor_index(const InputFile& file);
/// The same with every tensor's data loaded. Errors name the path.
TensorFile read_tensor_file(const std::string& path);

/// What a path names, so that two spellings of one file compare equal: device and inode when the
/// path exists (symbolic links followed, hard links alike), else the canonical folder plus the name
/// of what it would create (a dangling symbolic link followed to the file it would create).
struct FileIdentity {
  bool exists = false;
  dev_t device = 0;
  ino_t inode = 0;
  std::string path;  ///< when it does not exist
  bool operator==(const FileIdentity& other) const;
};
FileIdentity file_identity(const std::string& path);

/// An output could not be created, written or replaced. Its message names the output already, so
/// context about an input (a file, a tensor) is not put in front of it.
class OutputError : public Error {
 public:
  using Error::Error;
};

/// Outputs written all or nothing. add() creates a temporary file beside each target (refusing a
/// target that is a folder or another non-regular file); commit() flushes them all to disk, then
/// renames each over its target. A target that is a symbolic link (or a chain of them, dangling or
/// not) is written through: the temporary goes beside the file it leads to and replaces that file,
/// and the link stays a link. When add, a write or the flush throws, no target has been touched
/// and the destructor removes the temporaries; a rename, within one folder, fails only if that
/// folder changed meanwhile (then the targets renamed before it stay replaced). A replaced file
/// keeps its permission bits, setuid, setgid and sticky included; a new one gets 0666 less the
/// umask. Errors are OutputError, naming the output by its label (default: the path, excerpted).
class AtomicOutputs {
 public:
  class File {
   public:
    void write(const void* data, uint64_t n);
    void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
    const std::string& path() const { return path_; }

   private:
    friend class AtomicOutputs;
    std::string path_;    // as given
    std::string label_;   // how errors name it, e.g. "--out='x.npy'"
    std::string target_;  // the file replaced: path_ with its symbolic links followed
    std::string temp_;
    int fd_ = -1;
  };

  AtomicOutputs() = default;
  ~AtomicOutputs();
  AtomicOutputs(const AtomicOutputs&) = delete;
  AtomicOutputs& operator=(const AtomicOutputs&) = delete;

  /// `label` names the output in errors (e.g. "--k-out='x.npy'"); empty: "'path'".
  File& add(const std::string& path, const std::string& label = "");
  void commit();

 private:
  void discard() noexcept;
  std::vector<std::unique_ptr<File>> files_;
};

/// One output written through AtomicOutputs.
void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace rotary::cli
