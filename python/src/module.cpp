// The `rotary._rotary` extension: a thin shell over the C++ API. Tensors are borrowed, never
// copied: numpy arrays through the buffer protocol (so read-only, memory-mapped and broadcast
// arrays serve as inputs), torch tensors through DLPack. Every user value is converted here by one
// checked helper that names the argument (TypeError for a wrong kind, ValueError for a value out of
// range); every rule about the values themselves is the library's own validate().
#include <dlpack/dlpack.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "fused.hpp"
#include "text.hpp"
#include "rotary/build.hpp"
#include "rotary/doctor.hpp"
#include "rotary/rerotate.hpp"
#include "rotary/rotary.hpp"
#include "rotary/spec_fields.hpp"

// ROTARY_PY_CUDA: built with the CUDA kernels (CMake's rotary_cuda): torch CUDA tensors then run on
// their device (section "CUDA" below); without them a CUDA tensor is refused, naming the build.
#if ROTARY_PY_CUDA
#include <cuda_runtime_api.h>

#include <map>

#include "cuda/launch.hpp"
#include "rotary/cuda.hpp"
#endif

namespace py = pybind11;
using namespace rotary;

namespace {

// ---- Arguments: one checked conversion per kind of value -----------------------------------------

std::string type_name(py::handle v) { return Py_TYPE(v.ptr())->tp_name; }

// repr(v) fit for an error message (at most ~100 characters); repr itself may fail (an int of
// more than 4300 digits, a broken __repr__): then the type stands for the value.
std::string shown(py::handle v) {
  try {
    return detail::excerpt(py::repr(v).cast<std::string>());
  } catch (const py::error_already_set&) {
    return "<" + type_name(v) + ">";
  } catch (const py::cast_error&) {
    return "<" + type_name(v) + ">";
  }
}

bool is_numpy(py::handle v, const char* abstract_type) {
  return py::isinstance(v, py::module_::import("numpy").attr(abstract_type));
}

// Python int or numpy integer; bool (and numpy.bool_) is not a number here.
bool is_integer(py::handle v) {
  if (PyBool_Check(v.ptr())) return false;
  return PyLong_Check(v.ptr()) || is_numpy(v, "integer");
}

bool is_real(py::handle v) { return PyFloat_Check(v.ptr()) || is_integer(v) || is_numpy(v, "floating"); }

// `rule` completes the message for an int beyond int64 ("threads=10**30 must be in [0, 1024]").
int64_t int_arg(py::handle v, const std::string& name, const std::string& rule = "is out of range (beyond 64 bits)") {
  if (!is_integer(v)) throw py::type_error(name + " must be an int, got " + type_name(v));
  const py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0) throw py::value_error(name + "=" + shown(v) + " " + rule);
  return value;
}

std::optional<int64_t> optional_int_arg(py::handle v, const std::string& name) {
  if (v.is_none()) return std::nullopt;
  return int_arg(v, name);
}

double number_arg(py::handle v, const std::string& name) {
  if (!is_real(v)) throw py::type_error(name + " must be a number, got " + type_name(v));
  const double value = PyFloat_AsDouble(v.ptr());
  if (value == -1.0 && PyErr_Occurred()) {  // an int beyond float64 range
    PyErr_Clear();
    throw py::value_error(name + "=" + shown(v) + " is out of range for a float64");
  }
  return value;
}

bool bool_arg(py::handle v, const std::string& name) {
  if (!PyBool_Check(v.ptr()) && !is_numpy(v, "bool_")) {
    throw py::type_error(name + " must be a bool, got " + type_name(v));
  }
  return PyObject_IsTrue(v.ptr()) == 1;
}

std::string str_arg(py::handle v, const std::string& name) {
  if (!PyUnicode_Check(v.ptr())) throw py::type_error(name + " must be a str, got " + type_name(v));
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(v.ptr(), &size);
  if (text == nullptr) {  // lone surrogates
    PyErr_Clear();
    throw py::value_error(name + "=" + shown(v) + " is not encodable as UTF-8");
  }
  return std::string(text, static_cast<size_t>(size));
}

// A list, tuple or 1-D array of numbers (not a str: that is a sequence of characters).
std::vector<double> numbers_arg(py::handle v, const std::string& name) {
  if (PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()) || PyByteArray_Check(v.ptr()) ||
      !PySequence_Check(v.ptr())) {
    throw py::type_error(name + " must be a list of numbers, got " + type_name(v));
  }
  const auto items = py::reinterpret_borrow<py::sequence>(v);
  std::vector<double> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) out.push_back(number_arg(items[i], name + "[" + std::to_string(i) + "]"));
  return out;
}

// A list, tuple or 1-D array of ints.
std::vector<int64_t> ints_arg(py::handle v, const std::string& name) {
  if (PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()) || PyByteArray_Check(v.ptr()) ||
      !PySequence_Check(v.ptr())) {
    throw py::type_error(name + " must be a list of ints, got " + type_name(v));
  }
  const auto items = py::reinterpret_borrow<py::sequence>(v);
  std::vector<int64_t> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) out.push_back(int_arg(items[i], name + "[" + std::to_string(i) + "]"));
  return out;
}

// v when it is a plain Python int within int (the common case of threads and offset, read without
// building the messages of the general path); nullopt otherwise (then that path decides).
std::optional<int> small_int(py::handle v) {
  if (!PyLong_CheckExact(v.ptr())) return std::nullopt;
  int overflow = 0;
  const long value = PyLong_AsLongAndOverflow(v.ptr(), &overflow);
  if (overflow != 0 || value < INT_MIN || value > INT_MAX) return std::nullopt;
  return static_cast<int>(value);
}

// `threads` as ApplyArgs takes it: a value beyond int cannot be narrowed, so it is refused here with
// the library's rule; within int the library's validate decides.
int threads_arg(py::handle v) {
  const std::string rule = "must be in [0, " + std::to_string(max_threads) + "]";
  const int64_t threads = int_arg(v, "threads", rule);
  if (threads < INT_MIN || threads > INT_MAX) throw Error("threads=" + std::to_string(threads) + " " + rule);
  return static_cast<int>(threads);
}

enum class ChannelLayout { bshd, bhsd };

// True when v is the str `text` (ASCII): the common case of the enumerated arguments below, checked
// without building a std::string (they are read on every apply call).
bool is_str(py::handle v, const char* text) {
  return PyUnicode_Check(v.ptr()) && PyUnicode_CompareWithASCIIString(v.ptr(), text) == 0;
}

ChannelLayout layout_arg(py::handle v) {
  if (is_str(v, "bshd")) return ChannelLayout::bshd;
  if (is_str(v, "bhsd")) return ChannelLayout::bhsd;
  const std::string text = str_arg(v, "layout");
  if (text == "bshd") return ChannelLayout::bshd;
  if (text == "bhsd") return ChannelLayout::bhsd;
  throw py::value_error("layout='" + detail::excerpt(text) + "' must be 'bshd', 'bhsd' or 'thd'");
}

// apply's angles, in the words every front end uses: exact (from the Rope's cached table), exact
// computed on the fly, or transformers' float32 numerics. "table" is exact's former name, still taken.
enum class Angles { table, on_the_fly, hf_float32 };

Angles angles_arg(py::handle v) {
  if (is_str(v, "exact")) return Angles::table;
  const std::string text = str_arg(v, "angles");
  if (text == "table") return Angles::table;
  if (text == "on_the_fly") return Angles::on_the_fly;
  if (text == "hf-float32") return Angles::hf_float32;
  throw py::value_error("angles='" + detail::excerpt(text) + "' must be 'exact', 'on_the_fly' or 'hf-float32'");
}

// table()'s angles.
AngleMode angle_mode_arg(py::handle v) {
  const std::string text = str_arg(v, "angles");
  if (text == "exact") return AngleMode::exact;
  if (text == "hf-float32") return AngleMode::hf_float32;
  if (text == "on_the_fly") {
    throw py::value_error("angles='on_the_fly' computes apply's angles without a table; a table's are 'exact' or "
                          "'hf-float32'");
  }
  throw py::value_error("angles='" + detail::excerpt(text) + "' must be 'exact' or 'hf-float32'");
}

// ---- Spec <-> keyword arguments: the library's table of Spec fields (spec_fields.hpp) -------------

// The constructor's own parameters; every other Spec field is a keyword argument.
bool is_parameter(std::string_view name) {
  return name == "head_dim" || name == "rotary_dim" || name == "base" || name == "pairing" || name == "schedule";
}

// `v` converted as the field's kind says (TypeError naming the field), then stored.
void set_keyword(Spec& s, const SpecField& field, py::handle v) {
  const std::string name(field.name);
  switch (field.kind) {
    case FieldKind::integer: return set_field(s, field.name, int_arg(v, name));
    case FieldKind::number: return set_field(s, field.name, number_arg(v, name));
    case FieldKind::boolean: return set_field(s, field.name, bool_arg(v, name));
    case FieldKind::numbers: return set_field(s, field.name, numbers_arg(v, name));
    case FieldKind::integers: return set_field(s, field.name, ints_arg(v, name));
    case FieldKind::choice: return set_field(s, field.name, str_arg(v, name));
  }
}

// The set keyword fields (what set_keyword reads back).
py::dict schedule_args_of(const Spec& s) {
  py::dict out;
  for (const SpecField& field : spec_fields()) {
    if (is_parameter(field.name)) continue;
    if (const std::optional<FieldValue> value = field.get(s)) {
      std::visit([&](const auto& v) { out[py::str(std::string(field.name))] = py::cast(v); }, *value);
    }
  }
  return out;
}

Spec spec_from(py::handle head_dim, py::handle rotary_dim, py::handle base, py::handle pairing,
               py::handle schedule, const py::dict& args) {
  Spec s;
  s.head_dim = int_arg(head_dim, "head_dim");
  const std::optional<int64_t> rotary = optional_int_arg(rotary_dim, "rotary_dim");
  if (rotary && *rotary == 0) throw Error("rotary_dim=0 must be > 0");
  s.rotary_dim = rotary.value_or(0);
  s.base = number_arg(base, "base");
  s.pairing = parse_pairing(str_arg(pairing, "pairing"));
  s.schedule = parse_schedule(str_arg(schedule, "schedule"));
  for (auto item : args) {
    if (item.second.is_none()) continue;
    const std::string key = str_arg(item.first, "schedule argument name");
    const SpecField* field = find_spec_field(key);
    if (field == nullptr || is_parameter(key)) {
      throw py::type_error("unknown schedule argument '" + detail::excerpt(key) + "'");
    }
    set_keyword(s, *field, item.second);
  }
  return s;
}

// ---- CUDA: devices, streams, the error word ---------------------------------------------------------

#if ROTARY_PY_CUDA
using detail::cuda::check;  // throws cuda::RuntimeError naming the CUDA call and its error

// Makes `device` current on this thread for the guard's life (the kernels, tables and error words
// use the current device), then puts the caller's device back.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device_) check(cudaSetDevice(device_), "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (previous_ != device_) static_cast<void>(cudaSetDevice(previous_));
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = 0;
};

// torch's current stream on `device` (what torch's own operators run on), or the legacy default
// stream when torch is not loaded (DLPack's stream for a producer given none).
cuda::Stream current_stream(int device) {
  static py::handle raw_stream;  // torch._C._cuda_getCurrentRawStream, kept for the process
  if (!raw_stream) {
    const py::dict modules = py::module_::import("sys").attr("modules");
    if (!modules.contains("torch") || modules["torch"].is_none()) return nullptr;
    const py::object c = py::module_::import("torch").attr("_C");
    if (py::hasattr(c, "_cuda_getCurrentRawStream")) {
      raw_stream = py::object(c.attr("_cuda_getCurrentRawStream")).release();
    } else {
      const py::object stream = py::module_::import("torch.cuda").attr("current_stream")(device);
      return reinterpret_cast<cuda::Stream>(stream.attr("cuda_stream").cast<uintptr_t>());
    }
  }
  return reinterpret_cast<cuda::Stream>(raw_stream(device).cast<uintptr_t>());
}

bool is_capturing(cuda::Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

// Every device's error word (rotary::cuda::Options::error): the kernels or in the position_* bits
// of the tokens they skip; check_positions reads and clears it. One word per device for the
// process, allocated on the device's first call (which must not be inside a CUDA graph capture:
// cudaMalloc is not capturable) and never freed (CUDA may be torn down before static destructors).
// A call finds its device's word without a lock (devices 0..63, published once).
std::mutex error_words_mutex;
std::map<int, uint32_t*> error_words;
constexpr int kKnownWords = 64;
std::array<std::atomic<uint32_t*>, kKnownWords> known_error_words{};

uint32_t* existing_error_word(int device) {
  if (device >= 0 && device < kKnownWords) {
    if (uint32_t* word = known_error_words[static_cast<size_t>(device)].load(std::memory_order_acquire)) return word;
  }
  const std::lock_guard lock(error_words_mutex);
  const auto at = error_words.find(device);
  return at == error_words.end() ? nullptr : at->second;
}

uint32_t* error_word(int device, cuda::Stream stream) {
  if (device >= 0 && device < kKnownWords) {
    if (uint32_t* word = known_error_words[static_cast<size_t>(device)].load(std::memory_order_acquire)) return word;
  }
  const std::lock_guard lock(error_words_mutex);
  uint32_t*& word = error_words[device];
  if (word != nullptr) return word;
  if (is_capturing(stream)) {
    throw py::value_error("rotary's first call on cuda:" + std::to_string(device) + " is inside a CUDA graph "
                          "capture, where it cannot allocate the device's error word: run a call on the device "
                          "before capturing (a warm-up, as torch.cuda.graph advises)");
  }
  uint32_t* fresh = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&fresh), sizeof(uint32_t)), "cudaMalloc (error word)");
  const cudaError_t cleared = cudaMemset(fresh, 0, sizeof(uint32_t));
  if (cleared != cudaSuccess) static_cast<void>(cudaFree(fresh));
  check(cleared, "cudaMemset (error word)");
  word = fresh;
  if (device >= 0 && device < kKnownWords) {
    known_error_words[static_cast<size_t>(device)].store(fresh, std::memory_order_release);
  }
  return word;
}
#endif

// ---- Rope ------------------------------------------------------------------------------------------

// The user's Rope: spec, schedule, and cos/sin tables for positions [0, n) grown on demand. Safe to
// share between threads: a table, once published, is immutable; growing publishes a new one under
// the mutex, and every call holds the snapshot it uses (shared_ptr) until it returns, so a table a
// call is reading (with the GIL released) is never freed under it.
class PyRope {
 public:
  explicit PyRope(const Spec& spec, std::optional<int64_t> seq_len = std::nullopt)
      : spec_(spec), seq_len_(seq_len), rope_(std::make_shared<const Rope>(spec, seq_len)) {}

  const Schedule& schedule() const { return rope_->schedule(); }
  const Rope& rope() const { return *rope_; }
  const Spec& spec() const { return spec_; }
  std::optional<int64_t> seq_len() const { return seq_len_; }

  // The Rope's table covering positions [0, needed), or null beyond its cache. Call with the GIL
  // held: a table already large enough is taken without giving it up (a decode step's cost);
  // waiting for a thread that grows it, or growing it, happens with the GIL released.
  int64_t max_cached_rows() const { return rope_->max_cached_rows(); }
  std::shared_ptr<const Table> cache(int64_t needed, AngleMode mode) const {
    if (needed > max_cached_rows()) return nullptr;
    if (std::shared_ptr<const Table> t = rope_->cached(needed, mode)) return t;
    py::gil_scoped_release release;
    return rope_->table(needed, mode);
  }

#if ROTARY_PY_CUDA
  // cache(needed, mode) copied to the current device (`device`, made current by the caller), or
  // null when cache() gives none or when the copy would have to be made while `stream` is being
  // captured into a CUDA graph (allocating and copying are not capturable). Kernels queued on any
  // stream, and graphs captured from them, read a device table after the call returns, so none is
  // freed before the Rope: a grown table joins the older ones (at most twice the largest in all),
  // and the Rope's destructor waits for each device before freeing its tables. Call with the GIL
  // held (released while copying).
  const cuda::DeviceTable* device_cache(int device, int64_t needed, AngleMode mode, cuda::Stream stream) const {
    DeviceCaches& caches = *device_caches_;
    {
      std::unique_lock lock(caches.mutex, std::try_to_lock);  // as cache(): no wait with the GIL held
      if (lock.owns_lock()) {
        if (const cuda::DeviceTable* t = caches.largest(device, mode); t != nullptr && t->rows() >= needed) return t;
      }
    }
    const std::shared_ptr<const Table> host = cache(needed, mode);
    if (!host || is_capturing(stream)) return nullptr;
    py::gil_scoped_release release;
    const std::lock_guard lock(caches.mutex);
    const cuda::DeviceTable* largest = caches.largest(device, mode);
    if (largest != nullptr && largest->rows() >= needed) return largest;
    auto& tables = caches.tables[{device, mode == AngleMode::exact}];
    tables.push_back(std::make_unique<const cuda::DeviceTable>(*host));
    return tables.back().get();
  }
#endif

 private:
#if ROTARY_PY_CUDA
  struct DeviceCaches {
    std::mutex mutex;  // guards the map and the lists; a DeviceTable, once made, lives as long as this
    std::map<std::pair<int, bool>, std::vector<std::unique_ptr<const cuda::DeviceTable>>> tables;  // (device, exact)

    const cuda::DeviceTable* largest(int device, AngleMode mode) const {
      const auto at = tables.find({device, mode == AngleMode::exact});
      return at == tables.end() || at->second.empty() ? nullptr : at->second.back().get();
    }
    DeviceCaches() = default;
    DeviceCaches(const DeviceCaches&) = delete;
    DeviceCaches& operator=(const DeviceCaches&) = delete;
    // Kernels still queued may read the tables: each device finishes its work before they are freed
    // (errors ignored: at exit CUDA may already be gone, and then so is the memory).
    ~DeviceCaches() {
      int previous = 0;
      const bool restore = cudaGetDevice(&previous) == cudaSuccess;
      for (auto& [key, list] : tables) {
        if (list.empty() || cudaSetDevice(key.first) != cudaSuccess) continue;
        static_cast<void>(cudaDeviceSynchronize());
        list.clear();
      }
      if (restore) static_cast<void>(cudaSetDevice(previous));
    }
  };
#endif

  Spec spec_;
  std::optional<int64_t> seq_len_;
  std::shared_ptr<const Rope> rope_;  // shared: PyRope stays copyable (pickling, with_notes)
#if ROTARY_PY_CUDA
  std::unique_ptr<DeviceCaches> device_caches_ = std::make_unique<DeviceCaches>();
#endif
};

// Pickle state: what the constructor takes (the Spec as keyword arguments, and seq_len).
py::tuple rope_state(const PyRope& r) {
  const Spec& s = r.spec();
  return py::make_tuple(s.head_dim, s.resolved_rotary_dim(), s.base, std::string(to_string(s.pairing)),
                        std::string(to_string(s.schedule)), r.seq_len(), schedule_args_of(s));
}

PyRope rope_from_state(const py::tuple& state) {
  if (state.size() != 7 || !py::isinstance<py::dict>(state[6])) {
    throw py::value_error("Rope state must be the 7-tuple Rope.__getstate__ gives, got " + shown(state));
  }
  return PyRope(spec_from(state[0], state[1], state[2], state[3], state[4], state[6].cast<py::dict>()),
                optional_int_arg(state[5], "seq_len"));
}

// ---- Tensors ---------------------------------------------------------------------------------------

enum class Access { read, write };

// A DLPack device as torch names it ("cpu", "cuda:0").
std::string device_name(const DLDevice& device) {
  switch (device.device_type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda:" + std::to_string(device.device_id);
    default: return "DLPack device type " + std::to_string(static_cast<int>(device.device_type));
  }
}

bool same_device(const DLDevice& a, const DLDevice& b) {
  return a.device_type == b.device_type && (a.device_type == kDLCPU || a.device_id == b.device_id);
}

// What a CUDA tensor meets in a build without the CUDA kernels (rotary.torch says the same).
constexpr const char* kNoCudaKernels =
    "this rotary was built without CUDA kernels (pip install . --config-settings=cmake.define.ROTARY_CUDA=ON)";

// The memory the call's kernels can read: the CPU's, and a CUDA device's when built with its kernels.
void check_device(const DLDevice& device, const std::string& name) {
  if (device.device_type == kDLCPU) return;
  if (device.device_type == kDLCUDA) {
#if ROTARY_PY_CUDA
    return;
#else
    throw py::value_error(name + " is on " + device_name(device) + ", but " + kNoCudaKernels);
#endif
  }
  throw py::value_error(name + " is on " + device_name(device) + ", but rotary runs on the CPU and CUDA devices only");
}

// torch.utils.dlpack.to_dlpack when obj's type is exactly torch.Tensor, else null. It makes the
// capsule obj.__dlpack__() makes, without the Python checks that method runs first (about 3 us a
// tensor, most of a decode step's cost); the ones that matter here (requires grad, device, dtype,
// strides) are Borrowed's own. Subclasses (Parameter, __torch_function__ tensor-likes) take
// __dlpack__. Looked up once torch is loaded, then kept for the life of the process.
py::handle torch_to_dlpack(py::handle obj) {
  static PyTypeObject* tensor_type = nullptr;
  static py::handle to_dlpack;
  if (tensor_type == nullptr) {
    const py::dict modules = py::module_::import("sys").attr("modules");
    // Not loaded (or blocked: sys.modules["torch"] = None): then obj cannot be a torch.Tensor.
    if (!modules.contains("torch") || modules["torch"].is_none()) return {};
    to_dlpack = py::object(py::module_::import("torch.utils.dlpack").attr("to_dlpack")).release();
    tensor_type = reinterpret_cast<PyTypeObject*>(py::object(modules["torch"].attr("Tensor")).release().ptr());
  }
  return Py_TYPE(obj.ptr()) == tensor_type ? to_dlpack : py::handle();
}

// A numpy array or torch tensor (CPU, or CUDA when built with its kernels) seen as a TensorView, alive
// until this goes away (GIL held). Inputs are only read: a read-only, memory-mapped or broadcast numpy
// array and a torch tensor that requires grad (borrowed through its detach()) are fine. An output
// must be writable and must not be a tensor that autograd tracks.
class Borrowed {
 public:
  Borrowed() = default;
  /// A cos/sin tensor of caller angles (2-D or 3-D, only read).
  struct AnglesTag {};
  Borrowed(const py::object& obj, const char* name, AnglesTag) : Borrowed(obj, name, Access::read, true) {}
  Borrowed(const py::object& obj, const char* name, Access access, bool angles = false)
      : angles_(angles), name_(name) {
    if (obj.is_none()) return;
    if (py::isinstance<py::array>(obj)) {
      from_numpy(py::reinterpret_borrow<py::array>(obj), access);
    } else if (torch_to_dlpack(obj) || py::hasattr(obj, "__dlpack__")) {
      from_dlpack(obj, access);
    } else {
      throw py::type_error(name_ + " must be a numpy.ndarray or torch.Tensor, got " + type_name(obj));
    }
  }
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;
  ~Borrowed() {
    if (managed_ != nullptr && managed_->deleter != nullptr) managed_->deleter(managed_);
  }

  bool given() const { return given_; }
  const std::string& name() const { return name_; }
  const DLDevice& device() const { return device_; }
  int ndim() const { return ndim_; }
  DType dtype() const { return view_.dtype; }
  const void* data() const { return view_.data; }
  // A cos/sin tensor's shape and strides as CallerAngles takes them: [d0, d1, d2], a 2-D tensor
  // [rows, width] as [1, rows, width].
  std::pair<std::array<int64_t, 3>, std::array<int64_t, 3>> angles_shape() const {
    if (ndim_ == 3) {
      return {{view_.shape[0], view_.shape[1], view_.shape[2]}, {view_.strides[0], view_.strides[1], view_.strides[2]}};
    }
    return {{1, view_.shape[0], view_.shape[1]}, {0, view_.strides[0], view_.strides[1]}};
  }

  // The view in [batch, seq, heads, head_dim] order; unset (TensorView{}) when no object was given.
  TensorView view(ChannelLayout layout) const {
    if (!given_ || layout == ChannelLayout::bshd) return view_;
    TensorView v = view_;
    std::swap(v.shape[1], v.shape[2]);
    std::swap(v.strides[1], v.strides[2]);
    return v;
  }

 private:
  bool is_output() const { return name_.ends_with("_out"); }

  void from_numpy(const py::array& array, Access access) {
    if (access == Access::write && !array.writeable()) {
      // An output given by out= is written by definition; q and k only with inplace=True.
      throw py::value_error(is_output() ? name_ + " is read-only (out= names arrays to write the results into)"
                                        : name_ + " is read-only and would be written (inplace=True writes q and k)");
    }
    const py::dtype dtype = array.dtype();
    if (!dtype.attr("isnative").cast<bool>()) {
      throw py::type_error(name_ + " dtype " + shown(dtype) + " is not in the machine's byte order");
    }
    // Read through Python attributes: pybind11 < 2.12's dtype::kind()/itemsize() read numpy 1's
    // descriptor struct and are wrong under numpy 2.
    const auto letter = dtype.attr("kind").cast<std::string>();
    const auto itemsize = dtype.attr("itemsize").cast<int64_t>();
    std::optional<DType> kind;
    if (letter == "f" && itemsize == 4) kind = DType::f32;
    else if (letter == "f" && itemsize == 8) kind = DType::f64;
    else if (letter == "f" && itemsize == 2) kind = DType::f16;
    if (!kind) throw_bad_dtype(shown(dtype));
    check_ndim(array.ndim());
    std::array<int64_t, 4> shape{}, strides{};
    for (size_t d = 0; d < static_cast<size_t>(array.ndim()); ++d) {
      const auto stride_bytes = static_cast<int64_t>(array.strides(static_cast<py::ssize_t>(d)));
      if (stride_bytes % itemsize != 0) {
        throw py::value_error(name_ + " stride " + std::to_string(stride_bytes) + " bytes is not a multiple of its " +
                              std::to_string(itemsize) + "-byte elements");
      }
      shape[d] = static_cast<int64_t>(array.shape(static_cast<py::ssize_t>(d)));
      strides[d] = stride_bytes / itemsize;
    }
    owner_ = array;
    // Only written when access is write, which required a writable array above.
    take(const_cast<void*>(array.data()), *kind, shape, strides);
  }

  void from_dlpack(py::object obj, Access access) {
    static const py::handle requires_grad = py::str("requires_grad").release();  // interned once
    const bool tracked = (torch_to_dlpack(obj) || py::hasattr(obj, requires_grad)) &&
                         obj.attr(requires_grad).cast<bool>();
    if (tracked && access == Access::write) {
      throw py::value_error(is_output()
                                ? name_ + " requires grad and would be written, which autograd forbids (give out= "
                                          "tensors that do not require grad, or use rotary.torch.apply_rope to "
                                          "differentiate)"
                                : name_ + " requires grad and would be written in place, which autograd forbids "
                                          "(use inplace=False, or rotary.torch.apply_rope to differentiate)");
    }
    if (tracked) obj = obj.attr("detach")();  // same memory, read only
    // An inference tensor is written in place only in inference mode, as torch's own ops refuse.
    static const py::handle is_inference = py::str("is_inference").release();
    if (access == Access::write && torch_to_dlpack(obj) && obj.attr(is_inference)().cast<bool>() &&
        !py::module_::import("torch").attr("is_inference_mode_enabled")().cast<bool>()) {
      throw py::value_error(name_ + " is an inference tensor (made under torch.inference_mode()) and would be "
                                    "written outside inference mode, which torch forbids (write it inside "
                                    "torch.inference_mode(), or pass a clone)");
    }
    // torch's lazily negated views (x.conj().imag, torch._neg_view) hold -values in memory, and
    // DLPack hands over the memory: read, their values (a copy); written, refused.
    static const py::handle is_neg = py::str("is_neg").release();
    if ((torch_to_dlpack(obj) || py::hasattr(obj, is_neg)) && obj.attr(is_neg)().cast<bool>()) {
      if (access == Access::write) {
        throw py::value_error(name_ + " has torch's negative bit set (a lazily negated view, such as x.conj().imag): "
                                      "its memory holds the negated values, so it cannot be written (pass "
                                      "x.resolve_neg())");
      }
      obj = obj.attr("resolve_neg")();
    }
    py::object capsule;
    try {
      const py::handle to_dlpack = torch_to_dlpack(obj);
      capsule = to_dlpack ? to_dlpack(obj) : obj.attr("__dlpack__")();
    } catch (const py::error_already_set& e) {
      throw py::value_error(name_ + " cannot be borrowed through DLPack: " + detail::excerpt(e.what()));
    }
    managed_ = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    if (managed_ == nullptr) throw py::error_already_set();
    PyCapsule_SetName(capsule.ptr(), "used_dltensor");  // consumed: we call the deleter
    const DLTensor& t = managed_->dl_tensor;
    check_device(t.device, name_);
    device_ = t.device;
    std::optional<DType> kind;
    if (t.dtype.lanes == 1 && t.dtype.code == kDLFloat && t.dtype.bits == 32) kind = DType::f32;
    else if (t.dtype.lanes == 1 && t.dtype.code == kDLFloat && t.dtype.bits == 64) kind = DType::f64;
    else if (t.dtype.lanes == 1 && t.dtype.code == kDLFloat && t.dtype.bits == 16) kind = DType::f16;
    else if (t.dtype.lanes == 1 && t.dtype.code == kDLBfloat && t.dtype.bits == 16) kind = DType::bf16;
    if (!kind) throw_bad_dtype(shown(obj.attr("dtype")));
    check_ndim(t.ndim);
    std::array<int64_t, 4> shape{}, strides{};
    int64_t contiguous = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      shape[static_cast<size_t>(d)] = t.shape[d];
      strides[static_cast<size_t>(d)] = t.strides ? t.strides[d] : contiguous;
      contiguous *= t.shape[d];
    }
    // An empty tensor may have a null data pointer: the library takes it as an empty view.
    void* data = t.data == nullptr ? nullptr : static_cast<char*>(t.data) + t.byte_offset;
    take(data, *kind, shape, strides);
  }

  [[noreturn]] void throw_bad_dtype(const std::string& dtype) const {
    throw py::type_error(name_ + " dtype must be float32, float64, float16 or bfloat16, got " + dtype);
  }

  void check_ndim(int64_t ndim) {
    if (angles_) {
      if (ndim != 2 && ndim != 3) {
        throw py::value_error(name_ + " must have 3 dimensions ([batch or 1, seq, width]) or 2 ([rows, width]), got " +
                              std::to_string(ndim));
      }
    } else if (ndim != 4) {
      throw py::value_error(name_ + " must have 4 dimensions ([batch, seq, heads, head_dim] or [batch, heads, seq, "
                            "head_dim]) or 3 ([tokens, heads, head_dim]), got " + std::to_string(ndim));
    }
    ndim_ = static_cast<int>(ndim);
  }

  void take(void* data, DType dtype, const std::array<int64_t, 4>& shape, const std::array<int64_t, 4>& strides) {
    view_ = TensorView{.data = data, .dtype = dtype, .shape = shape, .strides = strides};
    given_ = true;
  }

  bool angles_ = false;  // a cos/sin tensor: 2-D or 3-D
  int ndim_ = 0;

  std::string name_;
  bool given_ = false;
  DLDevice device_{kDLCPU, 0};
  TensorView view_{};
  py::object owner_;                     // the numpy array
  DLManagedTensor* managed_ = nullptr;  // the DLPack export
};

// ---- apply -----------------------------------------------------------------------------------------

// Positions as the Python layer passes them (rotary._positions_and_streams checked the user's
// value): a flat int64 or float64 array of `streams` equal parts, or a torch tensor (CPU ones
// copied; CUDA ones read in place by the kernels), alive while this lives.
struct PositionsArg {
  py::array array;
  std::vector<int64_t> copied;     // a torch CPU tensor's positions, copied in C order
  std::shared_ptr<DLManagedTensor> device_tensor;  // positions in device memory (their DLPack export)
  DLDevice device{kDLCPU, 0};
  Positions positions;
  std::span<const int64_t> whole;  // the int64 entries in host memory (empty for float64 and on a device)
};

// torch's DLPack export of a tensor, released (its deleter called) with the last reference.
std::shared_ptr<DLManagedTensor> export_dlpack(py::handle tensor, py::handle to_dlpack) {
  const py::object capsule = to_dlpack(tensor);
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) throw py::error_already_set();
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");  // consumed: the deleter runs below
  return {managed, [](DLManagedTensor* m) { if (m->deleter != nullptr) m->deleter(m); }};
}

void check_positions_ndim(int64_t ndim) {
  if (ndim > 3) {
    throw py::value_error("positions must have at most 3 dimensions ([streams, batch, seq]), got " +
                          std::to_string(ndim));
  }
}

// A torch CPU tensor of int64 or int32 positions (at most 3 dimensions, any strides: transformers'
// position_ids are often an expanded view), copied in C order: the copy is what the library checks,
// so another thread changing the tensor cannot change a position after its check. Read through
// DLPack, without the round trip through numpy (several microseconds of a decode step).
std::vector<int64_t> copy_positions(const DLTensor& t) {
  const bool i64 = t.dtype.code == kDLInt && t.dtype.bits == 64 && t.dtype.lanes == 1;
  const bool i32 = t.dtype.code == kDLInt && t.dtype.bits == 32 && t.dtype.lanes == 1;
  if (!i64 && !i32) throw py::type_error("positions must be an int64 or int32 tensor here");
  check_positions_ndim(t.ndim);
  std::array<int64_t, 3> shape{1, 1, 1}, strides{0, 0, 0};
  for (int d = 0; d < t.ndim; ++d) {  // right-aligned in [d0, d1, d2]
    const auto slot = static_cast<size_t>(3 - t.ndim + d);
    shape[slot] = t.shape[d];
    strides[slot] = t.strides != nullptr ? t.strides[d] : 0;
  }
  if (t.strides == nullptr) strides = {shape[1] * shape[2], shape[2], 1};
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(shape[0] * shape[1] * shape[2]));
  if (out.capacity() == 0) return out;
  const char* base = static_cast<const char*>(t.data) + t.byte_offset;
  const int64_t item = i64 ? 8 : 4;
  for (int64_t a = 0; a < shape[0]; ++a) {
    for (int64_t b = 0; b < shape[1]; ++b) {
      for (int64_t c = 0; c < shape[2]; ++c) {
        const char* at = base + (a * strides[0] + b * strides[1] + c * strides[2]) * item;
        out.push_back(i64 ? *reinterpret_cast<const int64_t*>(at) : *reinterpret_cast<const int32_t*>(at));
      }
    }
  }
  return out;
}

// Positions in device memory, read by the kernels only (never by the host): a C-contiguous tensor
// (rotary._positions_and_streams makes a strided one so) of int64, int32, float32 or float64.
Positions device_positions(const DLTensor& t, int streams) {
  check_positions_ndim(t.ndim);
  int64_t size = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.strides != nullptr && t.shape[d] > 1 && t.strides[d] != size) {
      throw py::value_error("positions on " + device_name(t.device) + " must be contiguous (row-major), as "
                            "rotary.Rope.apply makes them");
    }
    size *= t.shape[d];
  }
  const void* data = t.data == nullptr ? nullptr : static_cast<const char*>(t.data) + t.byte_offset;
  const auto n = static_cast<size_t>(size);
  if (t.dtype.lanes == 1 && t.dtype.code == kDLInt && t.dtype.bits == 64) {
    return Positions::per_token(std::span(static_cast<const int64_t*>(data), n), streams);
  }
  if (t.dtype.lanes == 1 && t.dtype.code == kDLInt && t.dtype.bits == 32) {
    return Positions::per_token(std::span(static_cast<const int32_t*>(data), n), streams);
  }
  if (t.dtype.lanes == 1 && t.dtype.code == kDLFloat && t.dtype.bits == 64) {
    return Positions::per_token(std::span(static_cast<const double*>(data), n), streams);
  }
  if (t.dtype.lanes == 1 && t.dtype.code == kDLFloat && t.dtype.bits == 32) {
    return Positions::per_token(std::span(static_cast<const float*>(data), n), streams);
  }
  throw py::type_error("positions on " + device_name(t.device) + " must be int64, int32, float32 or float64");
}

// The caller's array shape, carried into the library (Positions::with_shape), which then refuses
// every shape but [batch, seq] and [1, seq] per stream (a transposed [seq, batch] holds as many
// entries): a 2-D array is [rows, seq], a 3-D one [streams, rows, seq]; a 1-D array stays flat
// ([seq], or the documented flat [batch * seq]).
Positions with_array_shape(const Positions& p, int64_t ndim, const int64_t* shape) {
  if (ndim == 2) return p.with_shape(shape[0], shape[1]);
  if (ndim == 3) return p.with_shape(shape[1], shape[2]);
  return p;
}

PositionsArg positions_arg(py::handle v, py::handle streams_value) {
  const int64_t streams = int_arg(streams_value, "positions streams");
  if (streams < 1 || streams > max_streams) {
    throw Error("positions streams=" + std::to_string(streams) + " must be in [1, " + std::to_string(max_streams) + "]");
  }
  const int s = static_cast<int>(streams);
  PositionsArg out;
  if (const py::handle to_dlpack = torch_to_dlpack(v)) {
    static const py::handle is_neg = py::str("is_neg").release();
    py::object values = py::reinterpret_borrow<py::object>(v);
    if (values.attr(is_neg)().cast<bool>()) values = values.attr("resolve_neg")();  // memory holds -values
    std::shared_ptr<DLManagedTensor> exported = export_dlpack(values, to_dlpack);
    const DLTensor& t = exported->dl_tensor;
    if (t.device.device_type == kDLCPU) {
      out.copied = copy_positions(t);
      out.whole = std::span<const int64_t>(out.copied);
      out.positions = with_array_shape(Positions::per_token(out.whole, s), t.ndim, t.shape);
    } else {
      check_device(t.device, "positions");
      out.positions = with_array_shape(device_positions(t, s), t.ndim, t.shape);
      out.device = t.device;
      out.device_tensor = std::move(exported);
    }
  } else if (py::isinstance<py::array_t<int64_t>>(v)) {
    auto array = py::array_t<int64_t, py::array::c_style>::ensure(v);
    check_positions_ndim(array.ndim());
    out.whole = std::span<const int64_t>(array.data(), static_cast<size_t>(array.size()));
    out.positions = with_array_shape(Positions::per_token(out.whole, s), array.ndim(), array.shape());
    out.array = array;
  } else if (py::isinstance<py::array_t<double>>(v)) {
    auto array = py::array_t<double, py::array::c_style>::ensure(v);
    check_positions_ndim(array.ndim());
    out.positions = with_array_shape(
        Positions::per_token(std::span<const double>(array.data(), static_cast<size_t>(array.size())), s),
        array.ndim(), array.shape());
    out.array = array;
  } else {
    throw py::type_error("positions must be an int64 or float64 numpy array here, got " + type_name(v));
  }
  return out;
}

CallerAngles::Columns columns_arg(py::handle v) {
  const std::string text = str_arg(v, "cos_sin_columns");
  if (text == "pairs") return CallerAngles::Columns::pairs;
  if (text == "halves") return CallerAngles::Columns::halves;
  if (text == "repeated") return CallerAngles::Columns::repeated;
  throw py::value_error("cos_sin_columns='" + detail::excerpt(text) + "' must be 'pairs', 'halves' or 'repeated'");
}

// The caller's cos and sin as CallerAngles: `cos`/`sin` 3-D [batch or 1, seq, width] per token or
// 2-D [rows, width] per position; or `cache` 2-D [rows, rotary_dim], cos in the first rotary_dim/2
// columns, sin in the others (vLLM's cos_sin_cache). `columns` None: pairs for width rotary_dim/2,
// else halves.
struct CallerAnglesArg {
  std::optional<Borrowed> cos, sin;
  CallerAngles angles;
};

void caller_angles_arg(const Schedule& schedule, const py::object& cos, const py::object& sin,
                       const py::object& cache, const py::object& columns, CallerAnglesArg& out) {
  if (!cache.is_none()) {
    if (!cos.is_none() || !sin.is_none()) throw py::value_error("cos_sin_cache cannot be combined with cos and sin");
    out.cos.emplace(cache, "cos_sin_cache", Borrowed::AnglesTag{});
    if (out.cos->ndim() != 2) {
      throw py::value_error("cos_sin_cache must have 2 dimensions ([rows, rotary_dim]), got " +
                            std::to_string(out.cos->ndim()));
    }
    auto [shape, strides] = out.cos->angles_shape();
    if (shape[2] != schedule.rotary_dim) {
      throw py::value_error("cos_sin_cache width=" + std::to_string(shape[2]) + " must be rotary_dim=" +
                            std::to_string(schedule.rotary_dim) + " (cos then sin, rotary_dim/2 columns each)");
    }
    if (!columns.is_none()) throw py::value_error("cos_sin_columns is set but cos_sin_cache is always pairs");
    const int64_t half = schedule.pairs() * strides[2] * size_of(out.cos->dtype());
    shape[2] = schedule.pairs();
    out.angles = CallerAngles{.index = CallerAngles::Index::per_position, .columns = CallerAngles::Columns::pairs,
                              .cos = out.cos->data(),
                              .sin = out.cos->data() == nullptr ? nullptr : static_cast<const char*>(out.cos->data()) + half,
                              .dtype = out.cos->dtype(), .shape = shape, .cos_strides = strides, .sin_strides = strides};
    return;
  }
  if (cos.is_none() != sin.is_none()) throw py::value_error(std::string(cos.is_none() ? "sin" : "cos") +
                                                            " is given without " + (cos.is_none() ? "cos" : "sin"));
  out.cos.emplace(cos, "cos", Borrowed::AnglesTag{});
  out.sin.emplace(sin, "sin", Borrowed::AnglesTag{});
  if (out.cos->ndim() != out.sin->ndim()) {
    throw py::value_error("cos has " + std::to_string(out.cos->ndim()) + " dimensions but sin has " +
                          std::to_string(out.sin->ndim()));
  }
  if (out.cos->dtype() != out.sin->dtype()) throw py::type_error("cos and sin must have the same dtype");
  const auto [shape, cos_strides] = out.cos->angles_shape();
  const auto [sin_shape, sin_strides] = out.sin->angles_shape();
  if (shape != sin_shape) throw py::value_error("cos and sin must have the same shape");
  CallerAngles::Columns c = shape[2] == schedule.pairs() ? CallerAngles::Columns::pairs : CallerAngles::Columns::halves;
  if (!columns.is_none()) c = columns_arg(columns);
  out.angles = CallerAngles{.index = out.cos->ndim() == 3 ? CallerAngles::Index::per_token : CallerAngles::Index::per_position,
                            .columns = c, .cos = out.cos->data(), .sin = out.sin->data(), .dtype = out.cos->dtype(),
                            .shape = shape, .cos_strides = cos_strides, .sin_strides = sin_strides};
}

// The library's message about ApplyArgs::angles in the words of this call: the caller passed
// `cos`/`sin` (or `cos_sin_cache`), not a field named angles. The rules stay the library's.
std::string caller_words(std::string text, const std::string& given) {
  const auto replace_all = [&text](const std::string& from, const std::string& to) {
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
      text.replace(at, from.size(), to);
    }
  };
  const bool cache = given == "cos_sin_cache";
  replace_all("angles.cos", cache ? given : "cos");
  replace_all("angles.sin", cache ? given : "sin");
  replace_all("per_token angles", "per-token " + given);
  replace_all("per_position angles", "per-position " + given);
  if (text.rfind("angles ", 0) == 0) text = given + text.substr(6);
  return text;
}

// The device of a call: q's, which every other tensor given must share (ValueError naming both).
DLDevice call_device(std::initializer_list<const Borrowed*> tensors) {
  const Borrowed* first = nullptr;
  for (const Borrowed* t : tensors) {
    if (t == nullptr || !t->given()) continue;
    if (first == nullptr) {
      first = t;
    } else if (!same_device(t->device(), first->device())) {
      throw py::value_error(t->name() + " is on " + device_name(t->device()) + " but " + first->name() + " is on " +
                            device_name(first->device()) + " (every tensor of a call must be on one device)");
    }
  }
  return first == nullptr ? DLDevice{kDLCPU, 0} : first->device();
}

void check_positions_device(const PositionsArg& pos, const DLDevice& device, const std::string& q_name) {
  if (same_device(pos.device, device)) return;
  const std::string hint = device.device_type == kDLCUDA ? ": give them as a tensor on " + device_name(device) : "";
  throw py::value_error("positions is on " + device_name(pos.device) + " but " + q_name + " is on " +
                        device_name(device) + " (every tensor of a call must be on one device" + hint + ")");
}

// validate (or, `shapes_only`, validate_shapes: positions in device memory), its message about
// ApplyArgs::angles put in the words of this call: `given` is "cos/sin" or "cos_sin_cache" when the
// caller gave angles, else null.
void validate_call(const Schedule& schedule, const ApplyArgs& args, const char* given, bool shapes_only) {
  try {
    if (shapes_only) {
      validate_shapes(schedule, args);
    } else {
      validate(schedule, args);
    }
  } catch (const Error& e) {
    if (given == nullptr) throw;
    throw Error(caller_words(e.what(), given));
  }
}

#if ROTARY_PY_CUDA
// The angles of a CUDA call that passed validate_shapes. Angles computed on the device are the
// table's bits (exact: the same double-double reduction, rounded once; hf-float32: transformers'
// float32 arithmetic replayed), so a call takes the Rope's device table only for sequential
// positions, whose rows the host knows, and computes per-token ones on the device: nothing is read
// back, and a call is always capturable in a CUDA graph. f64 data turns by double cos and sin, as on
// the CPU (Rope::apply): no float32 table.
const cuda::DeviceTable* device_angles(const PyRope& rope, const ApplyArgs& args, Angles angles, int device,
                                       cuda::Stream stream) {
  if (angles == Angles::on_the_fly || args.caller_angles != nullptr || args.q.batch() == 0 || args.q.seq() == 0 ||
      args.q.dtype == DType::f64) {
    return nullptr;
  }
  const Positions& p = args.positions;
  if (p.kind != Positions::Kind::sequential) return nullptr;
  return rope.device_cache(device, p.offset + args.q.seq(), numerics_of(args), stream);
}

// apply on a CUDA device, queued on torch's current stream there. Per-token positions are checked by
// the kernels (rotary::cuda::Options::error): a token whose position is unusable is skipped and the
// device's error word records it; `check_now` waits for the call and raises for it (and for any
// earlier call on the device not yet checked). Per call: one validation, the current device and
// torch's stream, cached words and tables, one launch (no allocation, device query or wait unless
// the Rope's device table must grow, or check_now).
void apply_cuda(const PyRope& rope, ApplyArgs args, Angles angles, const char* given, int device, bool check_now) {
  const Schedule& schedule = rope.schedule();
  if (angles == Angles::hf_float32) args.numerics = AngleMode::hf_float32;
  validate_call(schedule, args, given, true);
  const DeviceGuard guard(device);
  const cuda::Stream stream = current_stream(device);
  uint32_t* error = error_word(device, stream);
  const cuda::DeviceTable* table = device_angles(rope, args, angles, device, stream);
  detail::cuda::apply_validated(schedule, args, stream, {.table = table, .error = error});
  if (!check_now) return;
  py::gil_scoped_release release;
  cuda::check_positions(error, stream);  // waits for the stream
}

// rotary.torch.check_positions: raises for tokens skipped on `device` since its last check.
void check_positions_py(const py::object& device_value) {
  const int64_t device = int_arg(device_value, "device");
  if (device < 0 || device > INT_MAX) {
    throw py::value_error("device=" + shown(device_value) + " is not a CUDA device index");
  }
  uint32_t* word = existing_error_word(static_cast<int>(device));
  if (word == nullptr) return;  // no call ran there
  const DeviceGuard guard(static_cast<int>(device));
  const cuda::Stream stream = current_stream(static_cast<int>(device));
  py::gil_scoped_release release;
  cuda::check_positions(word, stream);
}
#endif

// offset is the first of sequential positions; with per-token positions it would be dropped, so the
// pair is refused (the C ABI's rule: offset must be 0 when positions are given; the CLI's
// "--positions and --offset cannot both be given").
void refuse_offset_with_positions(int64_t offset, const py::object& positions) {
  if (offset == 0 || positions.is_none()) return;
  throw py::value_error("offset=" + std::to_string(offset) + " is for sequential positions only, but positions "
                        "are given (add the offset to the positions, or leave positions out)");
}

// rotary.build_info(): rotary::build_info and, when built with them, rotary::cuda::build_info.
py::dict build_info_py() {
  const BuildInfo cpu = build_info();
  py::dict gpu;
#if ROTARY_PY_CUDA
  const cuda::BuildInfo info = cuda::build_info();
  // CUDA versions as "13.0" (None: no driver).
  const auto version = [](int v) {
    return v == 0 ? py::object(py::none())
                  : py::object(py::str(std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10)));
  };
  gpu["compiled"] = true;
  gpu["architectures"] = info.architectures;
  gpu["runtime"] = version(info.runtime_version);
  gpu["driver"] = version(info.driver_version);
  gpu["devices"] = info.devices;
  gpu["device"] = info.device.empty() ? py::object(py::none()) : py::object(py::str(info.device));
  gpu["usable"] = info.usable;
  gpu["why_not"] = info.usable ? py::object(py::none()) : py::object(py::str(info.why_not));
#else
  gpu["compiled"] = false;
  gpu["why_not"] = kNoCudaKernels;
#endif
  py::dict out;
  out["version"] = cpu.version;
  out["cpu_target"] = cpu.cpu_target;
  out["cpu_targets"] = cpu.cpu_targets;
  out["backends"] = cpu.backends;
  out["cuda"] = gpu;
  return out;
}

// q_out unset means in place: q (and k) are then written. `check`: see apply_cuda.
void apply_py(const PyRope& rope, const py::object& q, const py::object& k, const py::object& q_out,
              const py::object& k_out, const py::object& positions, const py::object& streams,
              const py::object& offset, const py::object& layout, const py::object& inverse,
              const py::object& angles, const py::object& threads, const py::object& cos,
              const py::object& sin, const py::object& cos_sin_cache, const py::object& cos_sin_columns,
              const py::object& check_arg, const py::object& undo_arg) {
  const ChannelLayout lay = layout_arg(layout);
  Angles angle_source = angles_arg(angles);
  const bool undo = undo_arg.ptr() != Py_False && bool_arg(undo_arg, "undo");
  const Access in_access = q_out.is_none() ? Access::write : Access::read;
  Borrowed bq(q, "q", in_access), bk(k, "k", in_access);
  Borrowed bq_out(q_out, "q_out", Access::write), bk_out(k_out, "k_out", Access::write);
  ApplyArgs args{.q = bq.view(lay), .k = bk.view(lay), .q_out = bq_out.view(lay), .k_out = bk_out.view(lay)};
  args.direction = bool_arg(inverse, "inverse") ? Direction::inverse : Direction::forward;
  args.undo = undo;
  const std::optional<int> small_threads = small_int(threads);
  args.threads = small_threads ? *small_threads : threads_arg(threads);
  const std::optional<int> small_offset = small_int(offset);
  const int64_t first = small_offset ? *small_offset : int_arg(offset, "offset", "must keep positions in [0, 2^31)");
  [[maybe_unused]] const bool check_now = check_arg.ptr() != Py_False && bool_arg(check_arg, "check");
  refuse_offset_with_positions(first, positions);
  PositionsArg pos;
  if (positions.is_none()) {
    pos.positions = Positions::sequential(first);
  } else {
    pos = positions_arg(positions, streams);
  }
  args.positions = pos.positions;
  CallerAnglesArg caller;
  const bool given = !cos.is_none() || !sin.is_none() || !cos_sin_cache.is_none();
  if (given) {
    if (angle_source != Angles::table) {
      throw py::value_error("angles='" + str_arg(angles, "angles") + "' cannot be combined with the caller's cos/sin "
                            "(leave angles='exact', the default)");
    }
    caller_angles_arg(rope.schedule(), cos, sin, cos_sin_cache, cos_sin_columns, caller);
    args.caller_angles = &caller.angles;
    if (caller.angles.index == CallerAngles::Index::per_token && (!positions.is_none() || first != 0)) {
      // Row (b, s) serves token (b, s) whatever its position: positions and offset would be dropped.
      throw py::value_error(std::string(positions.is_none() ? "offset=" + std::to_string(first) : "positions") +
                            " is not read with per-token cos/sin [batch or 1, seq, width] (row (b, s) rotates token "
                            "(b, s)): leave it out, or give cos/sin per position [rows, width] for positions to index");
    }
  } else if (!cos_sin_columns.is_none()) {
    throw py::value_error("cos_sin_columns is set but neither cos/sin nor cos_sin_cache is");
  }
  if (undo && !given && rope.schedule().attention_factor != 1.0) {
    // Tables hold cos and sin times the factor: undo divides it out from exact angles on the fly
    // (the same exact values the Rope's table holds), and refuses transformers' float32 table.
    if (angle_source == Angles::hf_float32) {
      throw py::value_error("undo=True with angles='hf-float32' needs attention_factor 1, not " +
                            py::repr(py::float_(rope.schedule().attention_factor)).cast<std::string>() +
                            " (its float32 table holds cos and sin times the factor; angles='exact' divides it out)");
    }
    angle_source = Angles::on_the_fly;
  }
  const DLDevice device = call_device({&bq, &bk, &bq_out, &bk_out, caller.cos ? &*caller.cos : nullptr,
                                       caller.sin ? &*caller.sin : nullptr});
  if (!positions.is_none()) check_positions_device(pos, device, bq.name());
  if (pos.positions.is_fractional() && angle_source == Angles::hf_float32) {
    if (pos.device_tensor) {
      throw py::value_error("angles='hf-float32' needs whole positions (transformers' float32 table): on " +
                            device_name(pos.device) + " give them as int64 or int32");
    }
    throw py::value_error("angles='hf-float32' needs whole positions (transformers' float32 table), got fractional ones");
  }
  const char* given_name = !given ? nullptr : cos_sin_cache.is_none() ? "cos/sin" : "cos_sin_cache";
#if ROTARY_PY_CUDA
  if (device.device_type == kDLCUDA) {
    return apply_cuda(rope, args, angle_source, given_name, device.device_id, check_now);
  }
#endif
  // The Rope validates (raising before any write), then takes the angles from its table when the
  // positions allow, else computes them on the fly: one read of the positions to check them.
  if (angle_source == Angles::hf_float32) args.numerics = AngleMode::hf_float32;
  const auto run = [&] {
    if (angle_source == Angles::on_the_fly) {
      apply(rope.schedule(), args);
    } else {
      rope.rope().apply(args);
    }
  };
  // A small call (a decode step) keeps the GIL: releasing and taking it back costs about as much as
  // its rotation. Larger ones let other Python threads run meanwhile.
  constexpr int64_t kReleaseGilElements = int64_t{1} << 16;
  try {
    if (args.q.elements() + args.k.elements() <= kReleaseGilElements) {
      run();
      return;
    }
    py::gil_scoped_release release;
    run();
  } catch (const Error& e) {
    if (given_name == nullptr) throw;
    throw Error(caller_words(e.what(), given_name));
  }
}

// ---- rerotate, switch ------------------------------------------------------------------------------

// The cached keys of Rope.rerotate / Rope.switch as RotatedKeys (k_out None: in place), handed to
// `move` with the GIL released for large calls. `inverse`: the Rope turns pairs by -angle.
template <typename Move>
void move_keys(const py::object& k, const py::object& k_out, const py::object& positions, const py::object& streams,
               const py::object& offset, const py::object& layout, const py::object& inverse, Move move) {
  const ChannelLayout lay = layout_arg(layout);
  Borrowed bk(k, "k", k_out.is_none() ? Access::write : Access::read), bk_out(k_out, "k_out", Access::write);
  RotatedKeys keys{.k = bk.view(lay), .k_out = bk_out.view(lay)};
  keys.rotated = bool_arg(inverse, "inverse") ? Direction::inverse : Direction::forward;
  const int64_t first = int_arg(offset, "offset", "must keep positions in [0, 2^31)");
  refuse_offset_with_positions(first, positions);
  PositionsArg pos;
  if (positions.is_none()) {
    pos.positions = Positions::sequential(first);
  } else {
    pos = positions_arg(positions, streams);
  }
  const DLDevice device = call_device({&bk, &bk_out});
  if (!positions.is_none()) check_positions_device(pos, device, bk.name());
  if (device.device_type != kDLCPU) {
    throw py::value_error("k is on " + device_name(device) + ", but Rope.rerotate and Rope.switch run on the CPU only");
  }
  keys.positions = pos.positions;
  constexpr int64_t kReleaseGilElements = int64_t{1} << 16;  // as apply_py
  if (!keys.k.is_set() || keys.k.is_empty() || keys.k.elements() <= kReleaseGilElements) {
    move(keys);
    return;
  }
  py::gil_scoped_release release;
  move(keys);
}

void rerotate_py(const PyRope& rope, const py::object& k, const py::object& k_out, const py::object& delta,
                 const py::object& positions, const py::object& streams, const py::object& offset,
                 const py::object& layout, const py::object& inverse) {
  std::vector<int64_t> deltas;
  for (const py::handle d : py::reinterpret_borrow<py::sequence>(delta)) {
    deltas.push_back(int_arg(d, "delta", "must be in (-2^31, 2^31)"));
  }
  move_keys(k, k_out, positions, streams, offset, layout, inverse,
            [&](const RotatedKeys& keys) { rerotate(rope.schedule(), keys, deltas); });
}

void switch_py(const PyRope& rope, const py::object& k, const py::object& k_out, const PyRope& to,
               const py::object& positions, const py::object& streams, const py::object& offset,
               const py::object& layout, const py::object& inverse) {
  move_keys(k, k_out, positions, streams, offset, layout, inverse,
            [&](const RotatedKeys& keys) { switch_schedule(rope.schedule(), to.schedule(), keys); });
}

py::tuple table_py(const PyRope& r, const py::object& positions, const py::object& angles) {
  const AngleMode mode = angle_mode_arg(angles);
  const PositionsArg pos = positions_arg(positions, py::int_(1));
  if (pos.positions.is_fractional()) throw py::type_error("positions must hold integers (a table row is a whole position)");
  std::optional<Table> t;
  {
    py::gil_scoped_release release;
    t.emplace(Table::at(r.schedule(), pos.whole, mode));
  }
  const auto rows = static_cast<py::ssize_t>(t->rows()), pairs = static_cast<py::ssize_t>(t->pairs());
  py::array_t<float> c({rows, pairs}), s({rows, pairs});
  std::copy(t->cos().begin(), t->cos().end(), c.mutable_data());
  std::copy(t->sin().begin(), t->sin().end(), s.mutable_data());
  return py::make_tuple(c, s);
}

// (rope, notes, rope_layers or None, rotates_backward, layer_type, layer_types, vision): what
// resolving a config found besides the spec.
py::tuple with_notes(PyRope rope, const ModelRope& model) {
  py::object layers = py::none();
  if (!model.rope_layers.empty()) {
    py::list list;
    for (const bool uses_rope : model.rope_layers) list.append(py::bool_(uses_rope));
    layers = list;
  }
  return py::make_tuple(py::cast(std::move(rope)), model.notes, layers, model.rotates_backward, model.layer_type,
                        model.layer_types, model.vision);
}

ReadOptions read_options(py::handle layer_type, py::handle vision) {
  return ReadOptions{.layer_type = str_arg(layer_type, "layer_type"), .vision = bool_arg(vision, "vision")};
}

}  // namespace

PYBIND11_MODULE(_rotary, m) {
  m.doc() = "rotary: Rotary Position Embeddings, exact at any context length (C++ core)";
  py::register_exception<Error>(m, "RotaryError", PyExc_ValueError);
#if ROTARY_PY_CUDA
  // A failure of the CUDA runtime (no device, memory exhausted, a failed launch) is no bad value.
  py::register_exception<cuda::RuntimeError>(m, "CudaError", PyExc_RuntimeError);
  m.attr("cuda") = true;
  m.def("cuda_check_positions", &check_positions_py, py::arg("device"));
#else
  m.attr("cuda") = false;
#endif
  m.attr("no_cuda_kernels") = kNoCudaKernels;
  m.def("build_info", &build_info_py);
  m.attr("max_threads") = max_threads;
  m.attr("max_position_limit") = max_position_limit;
  // numpy 2 changed its C structures; pybind11 reads them correctly from 2.12 on (__init__ checks).
  m.attr("pybind11_version") = py::make_tuple(PYBIND11_VERSION_MAJOR, PYBIND11_VERSION_MINOR);

  py::class_<PyRope>(m, "Rope")
      .def(py::init([](const py::object& head_dim, const py::object& rotary_dim, const py::object& base,
                       const py::object& pairing, const py::object& schedule, const py::object& seq_len,
                       const py::dict& args) {
             return PyRope(spec_from(head_dim, rotary_dim, base, pairing, schedule, args),
                           optional_int_arg(seq_len, "seq_len"));
           }),
           py::arg("head_dim"), py::arg("rotary_dim") = py::none(), py::arg("base") = 10000.0,
           py::arg("pairing") = "half", py::arg("schedule") = "default", py::arg("seq_len") = py::none(),
           py::arg("args") = py::dict())
      .def_static("from_config_text", [](const py::object& text, const py::object& seq_len,
                                         const py::object& layer_type, const py::object& vision) {
        const std::optional<int64_t> n = optional_int_arg(seq_len, "seq_len");
        const ModelRope model = read_hf_config(str_arg(text, "config text"), read_options(layer_type, vision));
        return with_notes(PyRope(model.spec, n), model);
      })
      .def_static("from_config_file", [](const py::object& path, const py::object& seq_len,
                                         const py::object& layer_type, const py::object& vision) {
        const std::optional<int64_t> n = optional_int_arg(seq_len, "seq_len");
        const ModelRope model = read_hf_config_file(str_arg(path, "path"), read_options(layer_type, vision));
        return with_notes(PyRope(model.spec, n), model);
      })
      .def_static("from_preset", [](const py::object& name, const py::object& seq_len,
                                    const py::object& layer_type, const py::object& vision) {
        const std::optional<int64_t> n = optional_int_arg(seq_len, "seq_len");
        const ModelRope model = load_preset(str_arg(name, "name"), read_options(layer_type, vision));
        return with_notes(PyRope(model.spec, n), model);
      })
      .def(py::pickle(&rope_state, &rope_from_state))
      .def_property_readonly("inv_freq", [](const PyRope& r) {
        return py::array_t<double>(static_cast<py::ssize_t>(r.schedule().inv_freq.size()), r.schedule().inv_freq.data());
      })
      .def_property_readonly("inv_freq_hf32", [](const PyRope& r) {
        const std::vector<float>& f = r.schedule().inv_freq_hf32;
        return py::array_t<float>(static_cast<py::ssize_t>(f.size()), f.data());
      }, "transformers' own float32 inv_freq (angles='hf-float32'), float32 [rotary_dim/2], a copy")
      .def_property_readonly("attention_factor", [](const PyRope& r) { return r.schedule().attention_factor; })
      .def_property_readonly("head_dim", [](const PyRope& r) { return r.schedule().head_dim; })
      .def_property_readonly("rotary_dim", [](const PyRope& r) { return r.schedule().rotary_dim; })
      .def_property_readonly("pairing", [](const PyRope& r) { return std::string(to_string(r.schedule().pairing)); })
      .def_property_readonly("schedule", [](const PyRope& r) { return std::string(to_string(r.schedule().type)); })
      .def_property_readonly("base", [](const PyRope& r) { return r.spec().base; })
      .def_property_readonly("layout", [](const PyRope& r) { return std::string(to_string(r.schedule().channel_layout())); })
      .def_property_readonly("rotary_offset", [](const PyRope& r) { return r.schedule().rotary_offset; })
      .def_property_readonly("blocks", [](const PyRope& r) { return r.schedule().blocks; })
      .def_property_readonly("xpos_scale_base", [](const PyRope& r) -> py::object {
        return r.schedule().xpos() ? py::object(py::float_(r.schedule().xpos_scale_base)) : py::none();
      })
      .def_property_readonly("xpos_center", [](const PyRope& r) { return r.schedule().xpos_center; })
      .def_property_readonly("streams", [](const PyRope& r) { return r.schedule().streams; })
      .def_property_readonly("stream_layout", [](const PyRope& r) { return std::string(to_string(r.spec().stream_layout)); })
      .def_property_readonly("sections", [](const PyRope& r) { return r.spec().sections; })
      .def_property_readonly("pair_stream", [](const PyRope& r) {
        const Schedule& s = r.schedule();
        py::array_t<int32_t> out(static_cast<py::ssize_t>(s.pairs()));
        for (int64_t j = 0; j < s.pairs(); ++j) out.mutable_data()[j] = s.stream_of(j);
        return out;
      })
      .def("table", &table_py, py::arg("positions"), py::arg("angles") = "exact")
      .def("apply", &apply_py, py::arg("q"), py::arg("k"), py::arg("q_out"), py::arg("k_out"), py::arg("positions"),
           py::arg("streams"), py::arg("offset"), py::arg("layout"), py::arg("inverse"), py::arg("angles"),
           py::arg("threads"), py::arg("cos"), py::arg("sin"), py::arg("cos_sin_cache"), py::arg("cos_sin_columns"),
           py::arg("check") = false, py::arg("undo") = false)
      .def("rerotate", &rerotate_py, py::arg("k"), py::arg("k_out"), py::arg("delta"), py::arg("positions"),
           py::arg("streams"), py::arg("offset"), py::arg("layout"), py::arg("inverse"))
      .def("switch", &switch_py, py::arg("k"), py::arg("k_out"), py::arg("to"), py::arg("positions"),
           py::arg("streams"), py::arg("offset"), py::arg("layout"), py::arg("inverse"));

  bind_fused(m, {[](py::handle r) -> const Schedule& { return r.cast<const PyRope&>().schedule(); },
                 [](py::handle r, int64_t rows, AngleMode mode) {
                   return r.cast<const PyRope&>().cache(rows, mode);
                 }
#if ROTARY_PY_CUDA
                 , [](py::handle r, int device, int64_t rows, AngleMode mode,
                      const std::function<void(const DeviceCall&)>& call) {
                   // As apply_cuda: the device current, torch's stream, the device's error word, the
                   // Rope's device table (sequential positions: rows the host knows), one launch.
                   const DeviceGuard guard(device);
                   DeviceCall d{.stream = current_stream(device)};
                   d.error = error_word(device, d.stream);
                   if (rows > 0) d.table = r.cast<const PyRope&>().device_cache(device, rows, mode, d.stream);
                   call(d);
                 }
#endif
                 });
  m.def("pairing_permutation", [](const py::object& head_dim, const py::object& rotary_dim, const py::object& from,
                                  const py::object& to) {
    return pairing_permutation(int_arg(head_dim, "head_dim"), int_arg(rotary_dim, "rotary_dim"),
                               parse_pairing(str_arg(from, "from"), "from"), parse_pairing(str_arg(to, "to"), "to"));
  });
  m.def("preset_names", &preset_names);
  // The library's schedules (spec_fields.hpp), for tests and docs: [(name, doc, required, optional)], required
  // a list of alternatives ([["original_max_position", "max_position"], ...]).
  m.def("schedules", [] {
    py::list out;
    for (const ScheduleInfo& info : schedules()) {
      py::list required;
      for (const auto& any_of : info.required) required.append(py::cast(std::vector<std::string>(any_of.begin(), any_of.end())));
      out.append(py::make_tuple(std::string(info.name), std::string(info.doc), required,
                                std::vector<std::string>(info.optional.begin(), info.optional.end())));
    }
    return out;
  });
  m.def("layer_types_text", [](const py::object& text) { return layer_types(str_arg(text, "config text")); });
  m.def("layer_types_file", [](const py::object& path) { return read_hf_config_file(str_arg(path, "path")).layer_types; });
  m.def("preset_text", [](const py::object& name) { return preset_text(str_arg(name, "name")); });
  m.def("float32_drift", [](const PyRope& r, const py::object& position) {
    const Float32Drift d = hf_float32_drift(r.schedule(), int_arg(position, "position"));
    return py::make_tuple(d.max_angle_error, d.worst_pair, d.max_ulps);
  });
  // rotary.doctor (rotary/doctor.hpp): the report as JSON text, from config text, a file or a Rope's settings;
  // the model's own context length, the rule rotary.plot draws each model over.
  m.def("doctor_text", [](const py::object& text, const py::object& context, const py::object& layer_type) {
    const std::optional<int64_t> n = optional_int_arg(context, "context");
    return to_json(doctor(read_hf_config(str_arg(text, "config text"), read_options(layer_type, py::bool_(false))), n));
  });
  m.def("doctor_file", [](const py::object& path, const py::object& context, const py::object& layer_type) {
    const std::optional<int64_t> n = optional_int_arg(context, "context");
    return to_json(doctor(read_hf_config_file(str_arg(path, "path"), read_options(layer_type, py::bool_(false))), n));
  });
  m.def("doctor_rope", [](const PyRope& r, const py::object& context) {
    return to_json(doctor(r.spec(), {.context = optional_int_arg(context, "context")}));
  });
  m.def("context_length", [](const PyRope& r, const py::object& max_position_embeddings) {
    const ContextLength c = context_length(r.spec(), int_arg(max_position_embeddings, "max_position_embeddings"));
    return py::make_tuple(c.length, c.source);
  });
  m.def("shown", [](const py::object& value) { return shown(value); },
        "repr(value) cut to at most ~100 characters for an error message, control bytes escaped.");
}
