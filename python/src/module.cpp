// The `rotary._rotary` extension: a thin shell over the C++ API. Tensors arrive through DLPack and
// are borrowed, never copied; every check is the library's own validate().
#include <dlpack/dlpack.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "rotary/rotary.hpp"

namespace py = pybind11;
using namespace rotary;

namespace {

// A tensor borrowed through DLPack; the producer's deleter runs when this goes away (GIL held).
class Borrowed {
 public:
  Borrowed() = default;
  Borrowed(const py::object& obj, const char* name) : name_(name) {
    if (obj.is_none()) return;
    if (!py::hasattr(obj, "__dlpack__")) {
      throw py::type_error(std::string(name) + " must be a numpy.ndarray or torch.Tensor, got " +
                           std::string(py::str(py::type::of(obj))));
    }
    py::object capsule = obj.attr("__dlpack__")();
    managed_ = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    if (managed_ == nullptr) throw py::error_already_set();
    PyCapsule_SetName(capsule.ptr(), "used_dltensor");  // consumed: we call the deleter
  }
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;
  ~Borrowed() {
    if (managed_ != nullptr && managed_->deleter != nullptr) managed_->deleter(managed_);
  }
  bool set() const { return managed_ != nullptr; }

  TensorView view(const std::string& layout) const {
    const DLTensor& t = managed_->dl_tensor;
    if (t.device.device_type != kDLCPU) {
      throw py::value_error(name_ + " is not on the CPU (rotary's Python module runs the CPU kernels)");
    }
    DType dtype;
    if (t.dtype.lanes != 1) throw py::type_error(name_ + " has vector lanes");
    if (t.dtype.code == kDLFloat && t.dtype.bits == 32) dtype = DType::f32;
    else if (t.dtype.code == kDLFloat && t.dtype.bits == 64) dtype = DType::f64;
    else if (t.dtype.code == kDLFloat && t.dtype.bits == 16) dtype = DType::f16;
    else if (t.dtype.code == kDLBfloat && t.dtype.bits == 16) dtype = DType::bf16;
    else throw py::type_error(name_ + " dtype must be float32, float64, float16 or bfloat16");
    if (t.ndim != 4) {
      throw py::value_error(name_ + " must have 4 dimensions ([batch, seq, heads, head_dim] or [batch, heads, seq, "
                            "head_dim]), got " + std::to_string(t.ndim));
    }
    std::array<int64_t, 4> shape{}, strides{};
    int64_t contiguous = 1;
    for (int d = 3; d >= 0; --d) {
      shape[static_cast<size_t>(d)] = t.shape[d];
      strides[static_cast<size_t>(d)] = t.strides ? t.strides[d] : contiguous;
      contiguous *= t.shape[d];
    }
    void* data = static_cast<char*>(t.data) + t.byte_offset;
    if (layout == "bshd") return TensorView{.data = data, .dtype = dtype, .shape = shape, .strides = strides};
    if (layout == "bhsd") {
      return TensorView{.data = data, .dtype = dtype, .shape = {shape[0], shape[2], shape[1], shape[3]},
                        .strides = {strides[0], strides[2], strides[1], strides[3]}};
    }
    throw py::value_error("layout='" + layout + "' must be 'bshd' or 'bhsd'");
  }

 private:
  DLManagedTensor* managed_ = nullptr;
  std::string name_;
};

// The user's Rope: spec, schedule, and cos/sin caches grown on demand ([0, n), doubling).
class PyRope {
 public:
  explicit PyRope(const Spec& spec, std::optional<int64_t> seq_len = std::nullopt)
      : spec_(spec), seq_len_(seq_len), schedule_(make_schedule(spec, seq_len)) {}

  const Schedule& schedule() const { return schedule_; }
  const Spec& spec() const { return spec_; }

  // The cached table for positions [0, needed), grown by doubling, or null when it would exceed
  // kCacheBytes (then the caller builds a table of just the positions it needs: a row depends only
  // on its position, so the values are the same).
  static constexpr int64_t kCacheBytes = int64_t{64} << 20;
  const Table* cache(int64_t needed, AngleMode mode) {
    const int64_t row_bytes = std::max<int64_t>(1, 2 * schedule_.pairs() * static_cast<int64_t>(sizeof(float)));
    const int64_t max_rows = kCacheBytes / row_bytes;
    if (needed > max_rows) return nullptr;
    std::optional<Table>& slot = mode == AngleMode::exact ? exact_ : float32_;
    if (!slot || slot->rows() < needed) {
      int64_t rows = std::max<int64_t>(4096, slot ? slot->rows() : 0);
      while (rows < needed) rows *= 2;
      rows = std::min(rows, max_rows);
      slot = Table::range(schedule_, 0, rows, mode);
    }
    return &*slot;
  }

 private:
  Spec spec_;
  std::optional<int64_t> seq_len_;
  Schedule schedule_;
  std::optional<Table> exact_, float32_;
};

Spec spec_from(int64_t head_dim, std::optional<int64_t> rotary_dim, double base, const std::string& pairing,
               const std::string& schedule, const py::dict& args) {
  Spec s;
  s.head_dim = head_dim;
  s.rotary_dim = rotary_dim.value_or(0);
  if (rotary_dim && *rotary_dim == 0) throw Error("rotary_dim=0 must be > 0");
  s.base = base;
  s.pairing = parse_pairing(pairing);
  s.schedule = parse_schedule(schedule);
  for (auto item : args) {
    const std::string key = py::str(item.first);
    const py::handle v = item.second;
    if (v.is_none()) continue;
    auto as_double = [&] {
      if (!py::isinstance<py::float_>(v) && !py::isinstance<py::int_>(v)) throw py::type_error(key + " must be a number");
      return v.cast<double>();
    };
    auto as_int = [&] {
      if (!py::isinstance<py::int_>(v)) throw py::type_error(key + " must be an int");
      return v.cast<int64_t>();
    };
    if (key == "factor") s.factor = as_double();
    else if (key == "original_max_position") s.original_max_position = as_int();
    else if (key == "max_position") s.max_position = as_int();
    else if (key == "beta_fast") s.beta_fast = as_double();
    else if (key == "beta_slow") s.beta_slow = as_double();
    else if (key == "mscale") s.mscale = as_double();
    else if (key == "mscale_all_dim") s.mscale_all_dim = as_double();
    else if (key == "truncate") s.truncate = v.cast<bool>();
    else if (key == "attention_factor") s.attention_factor = as_double();
    else if (key == "low_freq_factor") s.low_freq_factor = as_double();
    else if (key == "high_freq_factor") s.high_freq_factor = as_double();
    else if (key == "short_factor") s.short_factor = v.cast<std::vector<double>>();
    else if (key == "long_factor") s.long_factor = v.cast<std::vector<double>>();
    else if (key == "max_length") s.max_length = as_int();
    else if (key == "monotone_scale") s.monotone_scale = as_double();
    else throw py::type_error("unknown schedule argument '" + key + "'");
  }
  return s;
}

AngleMode mode_of(const std::string& angles) {
  if (angles == "hf-float32") return AngleMode::hf_float32;
  return AngleMode::exact;
}

void apply_py(PyRope& rope, const py::object& q, const py::object& k, const py::object& q_out,
              const py::object& k_out, const py::object& positions, int64_t offset, const std::string& layout,
              bool inverse, const std::string& angles, int threads) {
  if (angles != "table" && angles != "on_the_fly" && angles != "hf-float32") {
    throw py::value_error("angles='" + angles + "' must be 'table', 'on_the_fly' or 'hf-float32'");
  }
  Borrowed bq(q, "q"), bk(k, "k"), bq_out(q_out, "q_out"), bk_out(k_out, "k_out");
  ApplyArgs args;
  args.q = bq.view(layout);
  if (bk.set()) args.k = bk.view(layout);
  if (bq_out.set()) args.q_out = bq_out.view(layout);
  if (bk_out.set()) args.k_out = bk_out.view(layout);
  args.direction = inverse ? Direction::inverse : Direction::forward;
  args.threads = threads;
  py::array_t<int64_t, py::array::c_style | py::array::forcecast> pos;
  std::optional<Table> call_table;
  int64_t max_position = offset + args.q.seq() - 1;
  if (!positions.is_none()) {
    pos = positions.cast<py::array_t<int64_t, py::array::c_style | py::array::forcecast>>();
    args.positions = Positions::per_token(std::span<const int64_t>(pos.data(), static_cast<size_t>(pos.size())));
    max_position = -1;
    for (py::ssize_t i = 0; i < pos.size(); ++i) max_position = std::max<int64_t>(max_position, pos.data()[i]);
  } else {
    args.positions = Positions::sequential(offset);
  }
  if (angles != "on_the_fly" && args.q.batch() * args.q.seq() > 0 && max_position >= 0 &&
      max_position < max_position_limit) {
    validate(rope.schedule(), args);  // positions in range before any table is built
    args.table = rope.cache(max_position + 1, mode_of(angles));
    if (args.table == nullptr) {  // beyond the cache: a table of this call's distinct positions
      std::vector<int64_t> wanted;
      if (positions.is_none()) {
        for (int64_t s = 0; s < args.q.seq(); ++s) wanted.push_back(offset + s);
      } else {
        wanted.assign(pos.data(), pos.data() + pos.size());
        std::sort(wanted.begin(), wanted.end());
        wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
      }
      call_table.emplace(Table::at(rope.schedule(), wanted, mode_of(angles)));
      args.table = &*call_table;
    }
  }
  validate(rope.schedule(), args);  // raises before any write
  {
    py::gil_scoped_release release;
    apply(rope.schedule(), args);
  }
}

}  // namespace

PYBIND11_MODULE(_rotary, m) {
  m.doc() = "rotary: Rotary Position Embeddings, exact at any context length (C++ core)";
  py::register_exception<Error>(m, "RotaryError", PyExc_ValueError);

  py::class_<PyRope>(m, "Rope")
      .def(py::init([](int64_t head_dim, std::optional<int64_t> rotary_dim, double base, const std::string& pairing,
                       const std::string& schedule, std::optional<int64_t> seq_len, const py::dict& args) {
             return PyRope(spec_from(head_dim, rotary_dim, base, pairing, schedule, args), seq_len);
           }),
           py::arg("head_dim"), py::arg("rotary_dim") = py::none(), py::arg("base") = 10000.0,
           py::arg("pairing") = "half", py::arg("schedule") = "default", py::arg("seq_len") = py::none(),
           py::arg("args") = py::dict())
      .def_static("from_config_text", [](const std::string& text, std::optional<int64_t> seq_len) {
        const ModelRope model = read_hf_config(text);
        return std::make_pair(PyRope(model.spec, seq_len), model.notes);
      })
      .def_static("from_preset", [](const std::string& name, std::optional<int64_t> seq_len) {
        const ModelRope model = load_preset(name);
        return std::make_pair(PyRope(model.spec, seq_len), model.notes);
      })
      .def_property_readonly("inv_freq", [](const PyRope& r) {
        return py::array_t<double>(static_cast<py::ssize_t>(r.schedule().inv_freq.size()), r.schedule().inv_freq.data());
      })
      .def_property_readonly("attention_factor", [](const PyRope& r) { return r.schedule().attention_factor; })
      .def_property_readonly("head_dim", [](const PyRope& r) { return r.schedule().head_dim; })
      .def_property_readonly("rotary_dim", [](const PyRope& r) { return r.schedule().rotary_dim; })
      .def_property_readonly("pairing", [](const PyRope& r) { return std::string(to_string(r.schedule().pairing)); })
      .def_property_readonly("schedule", [](const PyRope& r) { return std::string(to_string(r.schedule().type)); })
      .def_property_readonly("base", [](const PyRope& r) { return r.spec().base; })
      .def("table", [](const PyRope& r, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& positions,
                       const std::string& angles) {
        if (angles != "exact" && angles != "hf-float32") throw py::value_error("angles must be 'exact' or 'hf-float32'");
        const Table t = Table::at(r.schedule(), std::span<const int64_t>(positions.data(), static_cast<size_t>(positions.size())),
                                  mode_of(angles));
        const auto rows = static_cast<py::ssize_t>(t.rows()), pairs = static_cast<py::ssize_t>(t.pairs());
        py::array_t<float> c({rows, pairs}), s({rows, pairs});
        std::copy(t.cos().begin(), t.cos().end(), c.mutable_data());
        std::copy(t.sin().begin(), t.sin().end(), s.mutable_data());
        return std::make_pair(c, s);
      }, py::arg("positions"), py::arg("angles") = "exact")
      .def("apply", &apply_py, py::arg("q"), py::arg("k"), py::arg("q_out"), py::arg("k_out"), py::arg("positions"),
           py::arg("offset"), py::arg("layout"), py::arg("inverse"), py::arg("angles"), py::arg("threads"));

  m.def("pairing_permutation", [](int64_t head_dim, int64_t rotary_dim, const std::string& from, const std::string& to) {
    return pairing_permutation(head_dim, rotary_dim, parse_pairing(from, "from"), parse_pairing(to, "to"));
  });
  m.def("preset_names", &preset_names);
  m.def("preset_text", [](const std::string& name) { return preset_text(name); });
  m.def("float32_drift", [](const PyRope& r, int64_t position) {
    const Float32Drift d = hf_float32_drift(r.schedule(), position);
    return py::make_tuple(d.max_angle_error, d.worst_pair, d.max_ulps);
  });
}
