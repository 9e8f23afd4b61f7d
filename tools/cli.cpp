#include "cli.hpp"

#include "app.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "../src/text.hpp"
#include "commands.hpp"
#include "parse.hpp"
#include "rotary/doctor.hpp"
#include "rotary/hf_config.hpp"
#include "rotary/rotary.hpp"
#include "rotary/spec_fields.hpp"

namespace rotary::cli {
namespace {

using detail::excerpt;

// What the spec options, --config or --preset come to.
struct Resolved {
  std::optional<ModelRope> model;
  Spec spec;
  Schedule schedule;
};

// Spec options, kept as text until parsed so that every error names the option and the value.
// One option per Spec field (spec_fields(): its name with '-' for '_'; a boolean field gives
// --no-NAME), plus --seq-len, and --config/--preset with --layer-type and --vision.
struct SpecOptions {
  std::map<std::string, std::string> given;  // option name (without --) -> text
  std::string config_path;
  std::string preset_name;
  std::string layer_type;
  bool vision = false;

  void attach(CLI::App& app) {
    for (const SpecField& field : spec_fields()) {
      const std::string option = cli_option(field);
      const std::string key = option.substr(2);
      if (field.kind == FieldKind::boolean) {
        app.add_flag_callback(option, [this, key] { given[key] = "false"; },
                              fmt::format("{} false: {}", field.name, field.doc));
        continue;
      }
      std::string help(field.doc);
      if (field.kind == FieldKind::choice) help += fmt::format(" [{}]", fmt::join(field.choices, "|"));
      if (field.kind == FieldKind::numbers || field.kind == FieldKind::integers) help += " [a,b,...]";
      app.add_option_function<std::string>(option, [this, key](const std::string& v) { given[key] = v; }, help)
          ->type_name("VALUE");
    }
    app.add_option_function<std::string>(
           "--seq-len", [this](const std::string& v) { given["seq-len"] = v; },
           "n: current sequence length (dynamic, longrope)")
        ->type_name("VALUE");
    app.add_option("--config", config_path, "a Hugging Face config.json (instead of spec options)");
    app.add_option("--preset", preset_name, "a built-in model preset (see `rotary presets`)");
    app.add_option("--layer-type", layer_type,
                   "with --config/--preset: the RoPE of this layer type (`rotary info` lists them)");
    app.add_flag("--vision", vision, "with --config/--preset: the vision tower's RoPE (vision_config)");
  }

  // Reads the config or preset (once), builds the spec and the schedule.
  Resolved resolve() const {
    Resolved r;
    r.model = model();
    r.spec = r.model ? r.model->spec : spec_from_options();
    try {
      r.schedule = make_schedule(r.spec, integer("seq-len"));
    } catch (const Error& e) {
      throw Error(blame(e));
    }
    return r;
  }

 private:
  std::optional<ModelRope> model() const {
    if (!config_path.empty() && !preset_name.empty()) throw Error("--config and --preset cannot both be given");
    if (config_path.empty() && preset_name.empty()) {
      if (!layer_type.empty()) throw Error("--layer-type needs --config or --preset");
      if (vision) throw Error("--vision needs --config or --preset");
      return std::nullopt;
    }
    for (const auto& [key, value] : given) {
      if (key != "seq-len") {
        throw Error(fmt::format("--{} cannot be combined with --config/--preset (edit the config instead)", key));
      }
    }
    const ReadOptions options{.layer_type = layer_type, .vision = vision};
    try {
      return config_path.empty() ? load_preset(preset_name, options) : read_hf_config_file(config_path, options);
    } catch (const Error& e) {
      throw Error(blame(e));
    }
  }

  std::optional<std::string> text(const std::string& key) const {
    auto it = given.find(key);
    if (it == given.end()) return std::nullopt;
    return it->second;
  }
  std::optional<double> number(const std::string& key) const {
    auto t = text(key);
    if (!t) return std::nullopt;
    return parse_double(*t, "--" + key);
  }
  std::optional<int64_t> integer(const std::string& key) const {
    auto t = text(key);
    if (!t) return std::nullopt;
    return parse_int(*t, "--" + key);
  }

  Spec spec_from_options() const {
    if (!given.contains("head-dim")) throw Error("--head-dim is required");
    Spec s;
    for (const SpecField& field : spec_fields()) {
      const std::string option = cli_option(field);
      const auto t = text(option.substr(2));
      if (!t) continue;
      const std::string name(field.name);
      if (name == "rotary_dim" && parse_int(*t, option) == 0) throw Error("--rotary-dim=0 must be > 0");
      set_field(s, name, value_of(field, *t, option));
    }
    return s;
  }

  // The option's text as the field's kind (errors name the option and the text).
  static FieldValue value_of(const SpecField& field, const std::string& t, const std::string& option) {
    switch (field.kind) {
      case FieldKind::integer: return parse_int(t, option);
      case FieldKind::number: return parse_double(t, option);
      case FieldKind::boolean: return false;  // --no-NAME
      case FieldKind::numbers: return parse_double_list(t, option);
      case FieldKind::integers: return parse_int_list(t, option);
      case FieldKind::choice: break;
    }
    if (std::find(field.choices.begin(), field.choices.end(), t) == field.choices.end()) {
      const std::string last(field.choices.back());
      std::vector<std::string_view> others(field.choices.begin(), field.choices.end() - 1);
      throw Error(fmt::format("{}='{}' must be {}{} or {}", option, excerpt(t), field.choices.size() > 2 ? "one of " : "",
                              fmt::join(others, ", "), last));
    }
    return t;
  }

  // Library errors name what they check: a spec field ("factor=-2 must be > 0", Error::field
  // "factor") or the config ("config 'x': ..."). Name what the user gave instead: the option of
  // that field if given, else the --config or --preset the settings came from.
  std::string blame(const Error& e) const {
    const std::string message = e.what();
    std::string option = e.field();
    for (char& c : option) c = c == '_' ? '-' : c;
    if (option == "truncate") option = "no-truncate";  // the option that sets it
    if (!option.empty() && given.contains(option)) return "--" + option + ": " + message;
    if (!config_path.empty()) {
      if (message.starts_with("config '")) return "--" + message;
      return fmt::format("--config '{}': {}", excerpt(config_path), message);
    }
    if (!preset_name.empty()) {
      if (message.starts_with("preset '")) return "--" + message;
      return fmt::format("--preset '{}': {}", excerpt(preset_name), message);
    }
    return message;
  }
};

// --angles' help: hf-float32 is transformers' pipeline but for its pow (include/rotary/table.hpp).
constexpr const char* hf_float32_help =
    "exact (default) or hf-float32 (transformers' float32 pipeline, but for base^(2j/d) correctly rounded "
    "where torch's float32 pow is not: a few pairs, then up to 2^-21*p*inv_freq rad from transformers' "
    "angle; README, numerics=\"hf-float32\")";

// An option renamed so that each word has one meaning (--order: the tensors' dimension order;
// --numerics: how angles are computed). The old spelling still works for one release, with a note
// on stderr after a successful run (an error stays one line); both given and different is an
// error. Returns the spelling given, for messages.
std::string renamed(const CLI::App& cmd, const char* name, std::string& value, const char* old_name,
                    const std::string& old_value, std::vector<std::string>& notes) {
  if (cmd.count(old_name) == 0) return name;
  if (cmd.count(name) > 0 && value != old_value) {
    throw Error(fmt::format("{}='{}' and {}='{}' (its old name) disagree (give {})", name, excerpt(value), old_name,
                            excerpt(old_value), name));
  }
  notes.push_back(fmt::format("rotary: note: {} is the old name of {}; it still works for one release\n", old_name,
                              name));
  value = old_value;
  return old_name;
}

AngleMode parse_angles(const std::string& text, std::string_view option) {
  if (text == "exact") return AngleMode::exact;
  if (text == "hf-float32") return AngleMode::hf_float32;
  throw Error(fmt::format("{}='{}' must be exact or hf-float32", option, excerpt(text)));
}

std::string g17(double v) { return fmt::format("{:.17g}", v); }

void print_notes(const std::optional<ModelRope>& model, std::ostream& err) {
  if (!model) return;
  for (const auto& note : model->notes) err << "rotary: note: " << one_line(note) << "\n";
}

// The model's own context length (rotary::context_length: the rule `rotary doctor` and rotary.plot follow).
ContextLength model_context(const Resolved& r) {
  return context_length(r.spec, r.model ? r.model->max_position_embeddings : 0);
}

// transformers' float32 drift at the model's last position (rotary's last when the model's lies beyond),
// with the schedule the model uses once its sequence is that long (LongRoPE: the long factors).
void print_drift(const Resolved& r, std::ostream& out) {
  const ContextLength context = model_context(r);
  if (context.length <= 0) return;
  const int64_t last = context.length - 1;
  const int64_t p = std::min(last, max_position_limit - 1);
  const Float32Drift d = hf_float32_drift(make_schedule(r.spec, p + 1), p);
  const std::string where =
      fmt::format("{} last position {} (context {} = {}{})", p == last ? "the model's" : "rotary's", p,
                  context.length, context.source, p == last ? "" : ", beyond rotary's positions");
  out << fmt::format("float32 pipeline (transformers) at {}: angle off by up to {:.3g} rad (pair {}); "
                     "cos/sin off by up to {:.0f} ulp; rotary's exact tables: <= 1 ulp\n",
                     where, d.max_angle_error, d.worst_pair, d.max_ulps);
}

// Pair j's stream as runs "first-last:stream" ("0-15:0 16-39:1 40-63:2"; one pair "7:1").
std::string pair_stream_runs(const Schedule& schedule) {
  std::string out;
  for (int64_t j = 0; j < schedule.pairs();) {
    int64_t end = j;
    while (end + 1 < schedule.pairs() && schedule.stream_of(end + 1) == schedule.stream_of(j)) ++end;
    if (!out.empty()) out += ' ';
    out += end == j ? fmt::format("{}:{}", j, schedule.stream_of(j))
                    : fmt::format("{}-{}:{}", j, end, schedule.stream_of(j));
    j = end + 1;
  }
  return out;
}

// JSON output: nlohmann's ordered_json (keys in the order written), the writer of every JSON the
// library and the CLI print (doctor, info, table, info --build).
using ordered_json = nlohmann::ordered_json;

std::string json_dump(const ordered_json& j) {
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

void print_info_json(const Resolved& r, std::ostream& out) {
  const Schedule& schedule = r.schedule;
  require_finite_for_json(r.spec.base, "base");
  require_finite_for_json(schedule.attention_factor, "attention_factor");
  for (size_t i = 0; i < schedule.inv_freq.size(); ++i) {
    require_finite_for_json(schedule.inv_freq[i], fmt::format("inv_freq[{}]", i));
  }
  ordered_json j;
  j["head_dim"] = schedule.head_dim;
  j["rotary_dim"] = schedule.rotary_dim;
  j["pairing"] = to_string(schedule.pairing);
  j["schedule"] = to_string(schedule.type);
  j["base"] = r.spec.base;
  j["inv_freq"] = schedule.inv_freq;
  j["attention_factor"] = schedule.attention_factor;
  j["layout"] = to_string(schedule.channel_layout());
  j["rotary_offset"] = schedule.rotary_offset;
  j["blocks"] = schedule.blocks;
  j["streams"] = schedule.streams;
  std::vector<int> pair_stream;
  for (int64_t p = 0; p < schedule.pairs(); ++p) pair_stream.push_back(schedule.stream_of(p));
  j["pair_stream"] = pair_stream;
  // xPos's settings (0, 0 without xPos): with them the schedule can be rebuilt from this output.
  j["xpos_scale_base"] = schedule.xpos_scale_base;
  j["xpos_center"] = schedule.xpos_center;
  if (r.model) {
    j["layer_type"] = r.model->layer_type;
    j["layer_types"] = r.model->layer_types;
    j["vision"] = r.model->vision;
  }
  out << json_dump(j) << "\n";
}

void print_info(const Resolved& r, bool json, std::ostream& out) {
  const Schedule& schedule = r.schedule;
  if (json) return print_info_json(r, out);
  const std::vector<double> plain = default_inv_freq(r.spec.base, schedule.rotary_dim);
  out << fmt::format("schedule {}  pairing {}  head_dim {}  rotary_dim {}  base {}  attention_factor {}\n",
                     to_string(schedule.type), to_string(schedule.pairing), schedule.head_dim,
                     schedule.rotary_dim, g17(r.spec.base), g17(schedule.attention_factor));
  out << fmt::format("layout {}  rotary_offset {}  blocks {}  streams {}  pair_stream {}\n", to_string(schedule.channel_layout()),
                     schedule.rotary_offset, schedule.blocks, schedule.streams, pair_stream_runs(schedule));
  if (schedule.xpos()) {
    out << fmt::format("xpos scale_base {}  center {}  reach |position - center| <= {:.1f}\n",
                       g17(schedule.xpos_scale_base), g17(schedule.xpos_center), xpos_reach(schedule));
  }
  out << fmt::format("{:>5}  {:>24}  {:>24}  {:>12}\n", "pair", "inv_freq (rad/token)",
                     "wavelength (tokens)", "to default");
  for (size_t i = 0; i < schedule.inv_freq.size(); ++i) {
    const double f = schedule.inv_freq[i];
    out << fmt::format("{:>5}  {:>24.17g}  {:>24.6f}  {:>12.6g}\n", i, f, 2 * 3.141592653589793 / f,
                       f / plain[i]);
  }
  if (r.model) {
    out << fmt::format("model: {} query heads, {} key/value heads, max_position_embeddings {}\n",
                       r.model->num_attention_heads, r.model->num_key_value_heads, r.model->max_position_embeddings);
    out << fmt::format("layer types: {} (this: {}{})\n", fmt::join(r.model->layer_types, ", "),
                       r.model->vision ? "vision tower" : r.model->layer_type,
                       r.model->layer_types.size() > 1 ? "; others with --layer-type" : "");
  }
  print_drift(r, out);
}

void print_table_json(const Table& table, std::ostream& out) {
  ordered_json j;
  std::vector<int64_t> positions;
  for (int64_t r = 0; r < table.rows(); ++r) positions.push_back(table.position(r));
  j["positions"] = positions;
  for (int which = 0; which < 2; ++which) {
    ordered_json rows = ordered_json::array();
    for (int64_t r = 0; r < table.rows(); ++r) {
      const float* row = which == 0 ? table.cos_row(r) : table.sin_row(r);
      for (int64_t i = 0; i < table.pairs(); ++i) {
        require_finite_for_json(row[i], fmt::format("{} at position {} pair {}", which == 0 ? "cos" : "sin",
                                                    table.position(r), i));
      }
      rows.push_back(std::vector<float>(row, row + table.pairs()));
    }
    j[which == 0 ? "cos" : "sin"] = std::move(rows);
  }
  out << json_dump(j) << "\n";
}

void print_table(const Table& table, bool json, std::ostream& out) {
  if (json) return print_table_json(table, out);
  out << fmt::format("{:>12}  {:>5}  {:>16}  {:>16}\n", "position", "pair", "cos", "sin");
  for (int64_t r = 0; r < table.rows(); ++r) {
    for (int64_t i = 0; i < table.pairs(); ++i) {
      out << fmt::format("{:>12}  {:>5}  {:>16.9g}  {:>16.9g}\n", table.position(r), i,
                         table.cos_row(r)[i], table.sin_row(r)[i]);
    }
  }
}

// Every subcommand with the storage its options parse into.
struct Commands {
  CLI::App app{"rotary: Rotary Position Embeddings, exact at any context length"};

  SpecOptions info_spec;
  bool info_json = false, info_build = false;
  CLI::App* info = nullptr;

  SpecOptions table_spec;
  bool table_json = false;
  std::string positions_text, table_numerics = "exact", table_angles;
  CLI::App* table = nullptr;

  CLI::App* presets = nullptr;

  SpecOptions doctor_spec;
  std::string doctor_context;
  bool doctor_json = false;
  CLI::App* doctor_cmd = nullptr;

  SpecOptions apply_spec;
  ApplyFileOptions file_options;
  std::string apply_numerics = "exact", apply_angles, apply_layout, apply_offset, apply_threads;
  std::vector<std::string> renamed_notes;  // an old option name used: printed after the command ran
  CLI::App* apply_cmd = nullptr;

  ConvertOptions convert_options;
  std::map<std::string, std::string> convert_counts;  // --num-heads etc., as text
  CLI::App* convert = nullptr;

  Commands() {
    app.name("rotary");
    app.require_subcommand(1);
    add_info_and_table();
    presets = app.add_subcommand("presets", "list the built-in model presets");
    add_apply();
    add_convert();
    add_doctor();
  }

  void add_info_and_table() {
    info = app.add_subcommand("info", "print a schedule's frequencies");
    info_spec.attach(*info);
    info->add_flag("--json", info_json, "print JSON");
    info->add_flag("--build", info_build,
                   "print this build instead: version, CPU target, CUDA architectures and device");
    table = app.add_subcommand("table", "print cos/sin (times attention_factor) at positions");
    table_spec.attach(*table);
    table->add_option("--positions", positions_text, "positions p0,p1,... each in [0, 2^31)")->required();
    table->add_flag("--json", table_json, "print JSON");
    table->add_option("--numerics", table_numerics, hf_float32_help);
    table->add_option("--angles", table_angles, "the old name of --numerics (one release)");
  }

  void add_doctor() {
    doctor_cmd = app.add_subcommand("doctor", "where a model's RoPE loses precision over its context, and how to avoid it");
    doctor_spec.attach(*doctor_cmd);
    doctor_cmd->add_option("--context", doctor_context,
                           "positions 0 .. N-1, N in [1, 2^31] (default: the model's own context length)");
    doctor_cmd->add_flag("--json", doctor_json, "print JSON");
  }

  void add_apply() {
    apply_cmd = app.add_subcommand("apply", "rotate q (and k) tensors in .npy/.safetensors files");
    apply_spec.attach(*apply_cmd);
    apply_cmd->add_option("--q", file_options.q, "query tensor file (.npy or .safetensors)");
    apply_cmd->add_option("--k", file_options.k,
                          "key tensor file, rotated as keys (xPos scales keys by zeta^-(p-c)/gamma); "
                          "without --q: keys alone");
    apply_cmd->add_option("--tensor", file_options.tensor, "only this tensor of a .safetensors input");
    apply_cmd->add_option("--order", file_options.order, "the tensors' dimension order: bshd (default) or bhsd");
    apply_cmd->add_option("--layout", apply_layout, "the old name of --order (one release)");
    apply_cmd->add_option("--positions", file_options.positions,
                          ".npy of int32/int64/float32/float64 positions [batch, seq] or [seq], or [streams, batch, seq] or [streams, 1, seq] (M-RoPE)");
    apply_cmd->add_option("--offset", apply_offset, "first position (default 0)");
    apply_cmd->add_flag("--inverse", file_options.inverse,
                        "rotate by -angle with the same scale: the transpose (the backward pass); it undoes "
                        "the rotation only without an attention factor or xPos (see --undo)");
    apply_cmd->add_flag("--undo", file_options.undo,
                        "take back a forward rotation (un-rotate stored keys): turn by -angle and divide out "
                        "the attention factor and xPos's scale");
    apply_cmd->add_option("--numerics", apply_numerics, hf_float32_help);
    apply_cmd->add_option("--angles", apply_angles, "the old name of --numerics (one release)");
    apply_cmd->add_option("--threads", apply_threads, fmt::format("threads in [0, {}] (0 = all)", max_threads));
    apply_cmd->add_option("--out", file_options.out, "output for --q");
    apply_cmd->add_option("--k-out", file_options.k_out, "output for --k");
  }

  void add_convert() {
    convert = app.add_subcommand("convert-weights", "permute q/k projection rows between pairings");
    convert->add_option("--in", convert_options.in, "input .safetensors");
    convert->add_option("--out", convert_options.out, "output .safetensors");
    convert->add_option("--to", convert_options.to, "half or interleaved");
    convert->add_option("--config", convert_options.config,
                        "config.json giving the head counts, head_dim and rotary_dim (instead of the four options)");
    static const char* const counts[][2] = {{"num-heads", "query heads"},
                                            {"num-kv-heads", "key/value heads"},
                                            {"head-dim", "head_dim (default rows / heads)"},
                                            {"rotary-dim", "rotary_dim (default head_dim)"}};
    for (const auto& [name, help] : counts) {
      std::string key = name;
      convert->add_option_function<std::string>(
          "--" + key, [this, key](const std::string& v) { convert_counts[key] = v; }, help);
    }
    convert->add_option("--q-name", convert_options.q_name, "wildcard for q projection tensors");
    convert->add_option("--k-name", convert_options.k_name, "wildcard for k projection tensors");
    convert->add_flag("--force", convert_options.force,
                      fmt::format("convert even if the file's __metadata__ {} says it is done", kPairingMetadataKey));
  }

  int run_info(std::ostream& out, std::ostream& err) {
    if (info_build) {
      print_build_info(info_json, out);
      return 0;
    }
    const Resolved r = info_spec.resolve();
    print_info(r, info_json, out);
    print_notes(r.model, err);
    return 0;
  }

  int run_table(std::ostream& out, std::ostream& err) {
    const Resolved r = table_spec.resolve();
    const std::string numerics_option = renamed(*table, "--numerics", table_numerics, "--angles", table_angles, renamed_notes);
    const AngleMode mode = parse_angles(table_numerics, numerics_option);
    const std::vector<int64_t> positions = parse_int_list(positions_text, "--positions");
    std::optional<Table> t;
    try {
      t = Table::at(r.schedule, positions, mode);
    } catch (const Error& e) {
      throw Error(fmt::format("--positions: {}", e.what()));
    }
    print_table(*t, table_json, out);
    print_notes(r.model, err);
    return 0;
  }

  int run_doctor(std::ostream& out, std::ostream& err) {
    if (doctor_spec.given.contains("seq-len")) {
      throw Error("--seq-len: the doctor takes the schedule at the context's length (give --context)");
    }
    const Resolved r = doctor_spec.resolve();
    std::optional<int64_t> context;
    if (doctor_cmd->count("--context") > 0) context = parse_int(doctor_context, "--context");
    DoctorReport report;
    try {
      report = doctor(r.spec, {.context = context, .max_position_embeddings = r.model ? r.model->max_position_embeddings : 0});
    } catch (const Error& e) {
      const std::string message = e.what();
      if (message.starts_with("context")) throw Error("--" + message);  // "--context=0 must be ...", "--context is needed"
      throw;
    }
    out << (doctor_json ? to_json(report) + "\n" : to_text(report));
    print_notes(r.model, err);
    return 0;
  }

  int run_presets(std::ostream& out) {
    for (const auto& name : preset_names()) {
      const ModelRope m = load_preset(name);
      out << fmt::format("{:<26} {:<9} head_dim {:>3}  rotary_dim {:>3}  base {:<9} {}\n", name,
                         to_string(m.spec.schedule), m.spec.head_dim, m.spec.resolved_rotary_dim(),
                         fmt::format("{}", m.spec.base), to_string(m.spec.pairing));
    }
    return 0;
  }

  int run_apply(std::ostream& out, std::ostream& err) {
    const Resolved r = apply_spec.resolve();
    file_options.order_option = renamed(*apply_cmd, "--order", file_options.order, "--layout", apply_layout, renamed_notes);
    file_options.numerics_option = renamed(*apply_cmd, "--numerics", apply_numerics, "--angles", apply_angles, renamed_notes);
    file_options.numerics = parse_angles(apply_numerics, file_options.numerics_option);
    file_options.config = apply_spec.config_path;
    if (apply_cmd->count("--offset") > 0) file_options.offset = parse_int(apply_offset, "--offset");
    if (apply_cmd->count("--threads") > 0) file_options.threads = parse_int(apply_threads, "--threads");
    // A model whose code turns pairs by -angle (NanoChat): its forward is rotary's inverse.
    if (r.model && r.model->rotates_backward) file_options.inverse = !file_options.inverse;
    const int status = run_apply_files(r.schedule, file_options, out);
    print_notes(r.model, err);
    return status;
  }

  int run_convert(std::ostream& out) {
    const std::pair<const char*, std::optional<int64_t>*> fields[] = {
        {"num-heads", &convert_options.num_heads}, {"num-kv-heads", &convert_options.num_kv_heads},
        {"head-dim", &convert_options.head_dim}, {"rotary-dim", &convert_options.rotary_dim}};
    for (const auto& [name, field] : fields) {
      if (auto it = convert_counts.find(name); it != convert_counts.end()) {
        *field = parse_int(it->second, std::string("--") + name);
      }
    }
    return run_convert_weights(convert_options, out);
  }

  // Parses and runs; user errors throw rotary::Error.
  int run(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
    if (!parse_app(app, "rotary", argc, argv, out)) return 0;  // --help
    const int status = run_parsed(out, err);
    for (const std::string& note : renamed_notes) err << note;
    return status;
  }

  int run_parsed(std::ostream& out, std::ostream& err) {
    if (info->parsed()) return run_info(out, err);
    if (table->parsed()) return run_table(out, err);
    if (presets->parsed()) return run_presets(out);
    if (doctor_cmd->parsed()) return run_doctor(out, err);
    if (apply_cmd->parsed()) return run_apply(out, err);
    if (convert->parsed()) return run_convert(out);
    return 0;
  }
};

}  // namespace

int run(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  return run_guarded("rotary", err, [&] {
    Commands commands;
    return commands.run(argc, argv, out, err);
  });
}

}  // namespace rotary::cli
