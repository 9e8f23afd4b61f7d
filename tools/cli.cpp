#include "cli.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench.hpp"
#include "commands.hpp"
#include "demo.hpp"
#include "parse.hpp"
#include "rotary/hf_config.hpp"
#include "rotary/rotary.hpp"

namespace rotary::cli {
namespace {

// Spec options, kept as text until parsed so that every error names the option and the value.
struct SpecOptions {
  std::map<std::string, std::string> given;  // option name (without --) -> text
  bool no_truncate = false;

  void attach(CLI::App& app) {
    static const char* const names[][2] = {
        {"head-dim", "head_dim D: width of one attention head (required)"},
        {"rotary-dim", "rotary_dim R: rotated leading channels (default: head_dim)"},
        {"base", "base (rope_theta), default 10000"},
        {"pairing", "interleaved|half (default half)"},
        {"schedule", "default|linear|ntk|dynamic|yarn|llama3|longrope|monotone"},
        {"factor", "scaling factor s"},
        {"original-max-position", "L: original_max_position_embeddings"},
        {"max-position", "M: max_position_embeddings"},
        {"seq-len", "n: current sequence length (dynamic, longrope)"},
        {"beta-fast", "yarn beta_fast (default 32)"},
        {"beta-slow", "yarn beta_slow (default 1)"},
        {"mscale", "yarn mscale"},
        {"mscale-all-dim", "yarn mscale_all_dim"},
        {"attention-factor", "explicit attention factor"},
        {"low-freq-factor", "llama3 low_freq_factor"},
        {"high-freq-factor", "llama3 high_freq_factor"},
        {"short-factor", "longrope short factors a,b,... (rotary_dim/2 values)"},
        {"long-factor", "longrope long factors a,b,... (rotary_dim/2 values)"},
        {"max-length", "monotone: max length N"},
        {"monotone-scale", "monotone: the constant c (default: largest allowed)"},
    };
    for (const auto& [name, help] : names) {
      std::string key = name;
      app.add_option_function<std::string>(
             "--" + key, [this, key](const std::string& v) { given[key] = v; }, help)
          ->type_name("VALUE");
    }
    app.add_flag("--no-truncate", no_truncate, "yarn: do not round the ramp ends");
    app.add_option("--config", config_path, "a Hugging Face config.json (instead of spec options)");
    app.add_option("--preset", preset_name, "a built-in model preset (see `rotary presets`)");
  }

  std::string config_path;
  std::string preset_name;

  // The model, when --config or --preset is given.
  std::optional<ModelRope> model() const {
    if (!config_path.empty() && !preset_name.empty()) throw Error("--config and --preset cannot both be given");
    if (config_path.empty() && preset_name.empty()) return std::nullopt;
    for (const auto& [key, value] : given) {
      if (key != "seq-len") {
        throw Error(fmt::format("--{} cannot be combined with --config/--preset (edit the config instead)", key));
      }
    }
    if (no_truncate) throw Error("--no-truncate cannot be combined with --config/--preset");
    return config_path.empty() ? load_preset(preset_name) : read_hf_config_file(config_path);
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

  Spec spec() const {
    if (auto m = model()) return m->spec;
    Spec s;
    auto head_dim = integer("head-dim");
    if (!head_dim) throw Error("--head-dim is required");
    s.head_dim = *head_dim;
    s.rotary_dim = integer("rotary-dim").value_or(0);
    if (text("rotary-dim") && s.rotary_dim == 0) throw Error("--rotary-dim=0 must be > 0");
    s.base = number("base").value_or(10000.0);
    if (auto t = text("pairing")) s.pairing = parse_pairing(*t, "--pairing");
    if (auto t = text("schedule")) s.schedule = parse_schedule(*t, "--schedule");
    s.factor = number("factor");
    s.original_max_position = integer("original-max-position");
    s.max_position = integer("max-position");
    s.beta_fast = number("beta-fast");
    s.beta_slow = number("beta-slow");
    s.mscale = number("mscale");
    s.mscale_all_dim = number("mscale-all-dim");
    if (no_truncate) s.truncate = false;
    s.attention_factor = number("attention-factor");
    s.low_freq_factor = number("low-freq-factor");
    s.high_freq_factor = number("high-freq-factor");
    if (auto t = text("short-factor")) s.short_factor = parse_double_list(*t, "--short-factor");
    if (auto t = text("long-factor")) s.long_factor = parse_double_list(*t, "--long-factor");
    s.max_length = integer("max-length");
    s.monotone_scale = number("monotone-scale");
    return s;
  }

  Schedule schedule() const { return make_schedule(spec(), integer("seq-len")); }
};

// Errors from the library name spec fields (factor=...); on the command line they are options.
std::string name_option(const std::string& message) {
  static const std::map<std::string, std::string> option_of = {
      {"head_dim", "--head-dim"}, {"rotary_dim", "--rotary-dim"}, {"base", "--base"},
      {"factor", "--factor"}, {"original_max_position", "--original-max-position"},
      {"max_position", "--max-position"}, {"seq_len", "--seq-len"}, {"beta_fast", "--beta-fast"},
      {"beta_slow", "--beta-slow"}, {"mscale", "--mscale"}, {"mscale_all_dim", "--mscale-all-dim"},
      {"truncate", "--no-truncate"}, {"attention_factor", "--attention-factor"},
      {"low_freq_factor", "--low-freq-factor"}, {"high_freq_factor", "--high-freq-factor"},
      {"short_factor", "--short-factor"}, {"long_factor", "--long-factor"},
      {"max_length", "--max-length"}, {"monotone_scale", "--monotone-scale"},
      {"inv_freq", "--factor"}, {"position", "--positions"}, {"partial_rotary_factor", "--config"}};
  size_t end = 0;
  while (end < message.size() && (std::isalnum(static_cast<unsigned char>(message[end])) ||
                                  message[end] == '_')) {
    ++end;
  }
  auto it = option_of.find(message.substr(0, end));
  if (it == option_of.end()) return message;
  return it->second + ": " + message;
}

AngleMode parse_angles(const std::string& text) {
  if (text == "exact") return AngleMode::exact;
  if (text == "hf-float32") return AngleMode::hf_float32;
  throw Error(fmt::format("--angles='{}' must be exact or hf-float32", text));
}

std::string g17(double v) { return fmt::format("{:.17g}", v); }
std::string g9(float v) { return fmt::format("{:.9g}", v); }

void print_notes(const std::optional<ModelRope>& model, std::ostream& err) {
  if (!model) return;
  for (const auto& note : model->notes) err << "rotary: note: " << note << "\n";
}

void print_drift(const Schedule& schedule, int64_t max_position, std::ostream& out) {
  if (max_position <= 0) return;
  const int64_t p = std::min<int64_t>(max_position - 1, max_position_limit - 1);
  const Float32Drift d = hf_float32_drift(schedule, p);
  out << fmt::format("float32 pipeline (transformers) at position {}: angle off by up to {:.3g} rad (pair {}); "
                     "cos/sin off by up to {:.0f} ulp; rotary's exact tables: <= 1 ulp\n",
                     p, d.max_angle_error, d.worst_pair, d.max_ulps);
}

void print_info(const Schedule& schedule, double base, bool json, std::ostream& out) {
  if (json) {
    std::string s = fmt::format(
        "{{\"head_dim\":{},\"rotary_dim\":{},\"pairing\":\"{}\",\"schedule\":\"{}\",\"base\":{},"
        "\"inv_freq\":[",
        schedule.head_dim, schedule.rotary_dim, to_string(schedule.pairing),
        to_string(schedule.type), g17(base));
    for (size_t i = 0; i < schedule.inv_freq.size(); ++i) {
      if (i) s += ',';
      s += g17(schedule.inv_freq[i]);
    }
    s += fmt::format("],\"attention_factor\":{}}}\n", g17(schedule.attention_factor));
    out << s;
    return;
  }
  const std::vector<double> plain = default_inv_freq(base, schedule.rotary_dim);
  out << fmt::format("schedule {}  pairing {}  head_dim {}  rotary_dim {}  base {}  attention_factor {}\n",
                     to_string(schedule.type), to_string(schedule.pairing), schedule.head_dim,
                     schedule.rotary_dim, g17(base), g17(schedule.attention_factor));
  out << fmt::format("{:>5}  {:>24}  {:>24}  {:>12}\n", "pair", "inv_freq (rad/token)",
                     "wavelength (tokens)", "to default");
  for (size_t i = 0; i < schedule.inv_freq.size(); ++i) {
    const double f = schedule.inv_freq[i];
    out << fmt::format("{:>5}  {:>24.17g}  {:>24.6f}  {:>12.6g}\n", i, f, 2 * 3.141592653589793 / f,
                       f / plain[i]);
  }
}

void print_table(const Table& table, bool json, std::ostream& out) {
  const int64_t pairs = table.pairs();
  if (json) {
    std::string s = "{\"positions\":[";
    for (int64_t r = 0; r < table.rows(); ++r) {
      if (r) s += ',';
      s += std::to_string(table.position(r));
    }
    for (int which = 0; which < 2; ++which) {
      s += which == 0 ? "],\"cos\":[" : "],\"sin\":[";
      for (int64_t r = 0; r < table.rows(); ++r) {
        if (r) s += ',';
        s += '[';
        const float* row = which == 0 ? table.cos_row(r) : table.sin_row(r);
        for (int64_t i = 0; i < pairs; ++i) {
          if (i) s += ',';
          s += g9(row[i]);
        }
        s += ']';
      }
    }
    s += "]}\n";
    out << s;
    return;
  }
  out << fmt::format("{:>12}  {:>5}  {:>16}  {:>16}\n", "position", "pair", "cos", "sin");
  for (int64_t r = 0; r < table.rows(); ++r) {
    for (int64_t i = 0; i < pairs; ++i) {
      out << fmt::format("{:>12}  {:>5}  {:>16.9g}  {:>16.9g}\n", table.position(r), i,
                         table.cos_row(r)[i], table.sin_row(r)[i]);
    }
  }
}

}  // namespace

int run(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"rotary: Rotary Position Embeddings, exact at any context length"};
  app.name("rotary");
  app.require_subcommand(1);

  SpecOptions info_spec;
  bool info_json = false;
  CLI::App* info = app.add_subcommand("info", "print a schedule's frequencies");
  info_spec.attach(*info);
  info->add_flag("--json", info_json, "print JSON");

  SpecOptions table_spec;
  bool table_json = false;
  std::string positions_text;
  CLI::App* table = app.add_subcommand("table", "print cos/sin (times attention_factor) at positions");
  table_spec.attach(*table);
  table->add_option("--positions", positions_text, "positions p0,p1,... each in [0, 2^31)")->required();
  table->add_flag("--json", table_json, "print JSON");

  std::string table_angles = "exact";
  table->add_option("--angles", table_angles, "exact (default) or hf-float32");

  CLI::App* presets = app.add_subcommand("presets", "list the built-in model presets");

  SpecOptions apply_spec;
  ApplyFileOptions file_options;
  std::string apply_angles = "exact", apply_offset;
  CLI::App* apply_cmd = app.add_subcommand("apply", "rotate q (and k) tensors in .npy/.safetensors files");
  apply_spec.attach(*apply_cmd);
  apply_cmd->add_option("--q", file_options.q, "input tensor file (.npy or .safetensors)");
  apply_cmd->add_option("--k", file_options.k, "second input tensor file");
  apply_cmd->add_option("--tensor", file_options.tensor, "only this tensor of a .safetensors input");
  apply_cmd->add_option("--layout", file_options.layout, "bshd (default) or bhsd");
  apply_cmd->add_option("--positions", file_options.positions, ".npy of int32/int64 positions [batch, seq] or [seq]");
  apply_cmd->add_option("--offset", apply_offset, "first position (default 0)");
  apply_cmd->add_flag("--inverse", file_options.inverse, "rotate by -angle (the backward pass)");
  apply_cmd->add_option("--angles", apply_angles, "exact (default) or hf-float32");
  apply_cmd->add_option("--threads", file_options.threads, "threads (0 = all)");
  apply_cmd->add_option("--out", file_options.out, "output for q");
  apply_cmd->add_option("--k-out", file_options.k_out, "output for k");

  ConvertOptions convert_options;
  CLI::App* convert = app.add_subcommand("convert-weights", "permute q/k projection rows between pairings");
  convert->add_option("--in", convert_options.in, "input .safetensors");
  convert->add_option("--out", convert_options.out, "output .safetensors");
  convert->add_option("--to", convert_options.to, "half or interleaved");
  convert->add_option("--num-heads", convert_options.num_heads, "query heads");
  convert->add_option("--num-kv-heads", convert_options.num_kv_heads, "key/value heads");
  convert->add_option("--q-name", convert_options.q_name, "wildcard for q projection tensors");
  convert->add_option("--k-name", convert_options.k_name, "wildcard for k projection tensors");
  convert->add_option("--head-dim", convert_options.head_dim, "head_dim (default rows / heads)");
  convert->add_option("--rotary-dim", convert_options.rotary_dim, "rotary_dim (default head_dim)");

  DemoOptions demo_options;
  CLI::App* demo = app.add_subcommand("demo", "the main job: Llama-3.1-8B RoPE, checked and timed");
  demo->add_option("--seed", demo_options.seed, "random seed");

  BenchOptions bench_options;
  std::string bench_cases, bench_dtypes, bench_pairings, bench_angles, bench_placement, bench_threads;
  CLI::App* bench = app.add_subcommand("bench", "time RoPE against memcpy of the same bytes");
  bench->add_option("--cases", bench_cases, "prefill_q,prefill_k,decode,batched_decode (default all)");
  bench->add_option("--dtypes", bench_dtypes, "f32,bf16,f16 (default f32,bf16)");
  bench->add_option("--pairings", bench_pairings, "half,interleaved (default both)");
  bench->add_option("--angles", bench_angles, "table,on_the_fly (default both)");
  bench->add_option("--placement", bench_placement, "inplace,outofplace (default both)");
  bench->add_option("--threads", bench_threads, "thread counts, e.g. 1,2 (0 = all; default 1 and all)");
  bench->add_option("--reps", bench_options.reps, "timed repetitions per side (default 15)");
  bench->add_flag("--json", bench_options.json, "print JSON rows");

  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) {  // --help
        out << app.help(app.get_subcommands().empty() ? "" : app.get_subcommands()[0]->get_name());
        return 0;
      }
      std::string message = e.what();
      if (auto nl = message.find('\n'); nl != std::string::npos) message.resize(nl);
      err << "rotary: error: " << message << "\n";
      return 2;
    }
    if (info->parsed()) {
      const auto model = info_spec.model();
      const Schedule schedule = info_spec.schedule();
      print_notes(model, err);
      print_info(schedule, info_spec.spec().base, info_json, out);
      if (!info_json) {
        if (model) {
          out << fmt::format("model: {} query heads, {} key/value heads, max_position_embeddings {}\n",
                             model->num_attention_heads, model->num_key_value_heads, model->max_position_embeddings);
        }
        const int64_t max_pos = model ? model->max_position_embeddings : info_spec.spec().max_position.value_or(0);
        print_drift(schedule, max_pos, out);
      }
    } else if (table->parsed()) {
      print_notes(table_spec.model(), err);
      const Schedule schedule = table_spec.schedule();
      const std::vector<int64_t> positions = parse_int_list(positions_text, "--positions");
      print_table(Table::at(schedule, positions, parse_angles(table_angles)), table_json, out);
    } else if (presets->parsed()) {
      for (const auto& name : preset_names()) {
        const ModelRope m = load_preset(name);
        out << fmt::format("{:<26} {:<9} head_dim {:>3}  rotary_dim {:>3}  base {:<9} {}\n", name,
                           to_string(m.spec.schedule), m.spec.head_dim, m.spec.resolved_rotary_dim(),
                           fmt::format("{}", m.spec.base), to_string(m.spec.pairing));
      }
    } else if (apply_cmd->parsed()) {
      print_notes(apply_spec.model(), err);
      file_options.angles = parse_angles(apply_angles);
      if (!apply_offset.empty()) file_options.offset = parse_int(apply_offset, "--offset");
      return run_apply_files(apply_spec.schedule(), file_options, out);
    } else if (convert->parsed()) {
      return run_convert_weights(convert_options, out);
    } else if (demo->parsed()) {
      return run_demo(demo_options, out);
    } else if (bench->parsed()) {
      auto split = [](const std::string& text, std::vector<std::string>& into) {
        if (text.empty()) return;
        into.clear();
        size_t start = 0;
        while (true) {
          const size_t comma = text.find(',', start);
          into.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
          if (comma == std::string::npos) break;
          start = comma + 1;
        }
      };
      split(bench_cases, bench_options.cases);
      split(bench_dtypes, bench_options.dtypes);
      split(bench_pairings, bench_options.pairings);
      split(bench_angles, bench_options.angles);
      split(bench_placement, bench_options.placement);
      if (!bench_threads.empty()) {
        for (int64_t t : parse_int_list(bench_threads, "--threads")) {
          if (t < 0 || t > 1024) throw Error(fmt::format("--threads={} must be in [0, 1024]", t));
          bench_options.threads.push_back(static_cast<int>(t));
        }
      }
      return run_bench(bench_options, out);
    }
  } catch (const Error& e) {
    err << "rotary: error: " << name_option(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "rotary: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace rotary::cli
