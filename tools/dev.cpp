// `rotary-dev`: the developer's tool — `demo` (the main job of `make run`: Llama-3.1-8B RoPE,
// checked against binary128 and timed) and `bench` (every kernel against a copy of the same bytes).
// Kept out of the user's `rotary` (and its libquadmath).
#include "dev.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <string>

#include "app.hpp"
#include "bench.hpp"
#include "commands.hpp"
#include "demo.hpp"
#include "parse.hpp"
#include "rotary/apply.hpp"
#include "rotary/error.hpp"

namespace rotary::cli {
namespace {

struct DevCommands {
  CLI::App app{"rotary-dev: the developer's demo and benchmarks of rotary"};

  DemoOptions demo_options;
  std::string demo_seed;
  CLI::App* demo = nullptr;

  BenchOptions bench_options;
  std::string bench_cases, bench_dtypes, bench_pairings, bench_angles, bench_placement, bench_threads;
  CLI::App* bench = nullptr;

  DevCommands() {
    app.name("rotary-dev");
    app.require_subcommand(1);
    demo = app.add_subcommand("demo", "the main job: Llama-3.1-8B RoPE, checked and timed");
    demo->add_option_function<std::string>(
            "--seed", [this](const std::string& v) { demo_seed = v; }, "random seed, in [0, 2^63)")
        ->type_name("VALUE");
    add_bench();
  }

  void add_bench() {
    bench = app.add_subcommand("bench", "time RoPE against memcpy of the same bytes");
    bench->add_option("--device", bench_options.device,
                      "cpu (default) or cuda (against a device-to-device copy; CUDA events, graph replay for decode)");
    bench->add_option("--cases", bench_cases,
                      "cpu: prefill_q,prefill_k,decode,batched_decode,mrope (default), rerotate, switch, rope_store, qk_norm_rope, rerotate_cache; "
                      "cuda: prefill,decode,batched_decode (default), mrope, partial_deepseek_v3, partial_phi, "
                      "rope_store, qk_norm_rope");
    bench->add_option("--dtypes", bench_dtypes, "f32,f16,bf16 (default all)");
    bench->add_option("--pairings", bench_pairings, "half,interleaved (default both)");
    bench->add_option("--angles", bench_angles, "table,on_the_fly (default both); cuda: also caller (cos/sin cache)");
    bench->add_option("--placement", bench_placement, "inplace,outofplace (default both)");
    bench->add_option("--threads", bench_threads, "cpu: thread counts, e.g. 1,2 (0 = all; default 1 and all)");
    bench->add_option("--reps", bench_options.reps, "timed repetitions per side (default 15)");
    bench->add_flag("--json", bench_options.json, "print JSON rows");
  }

  int run_bench_command(std::ostream& out) {
    split_list(bench_cases, bench_options.cases);
    split_list(bench_dtypes, bench_options.dtypes);
    split_list(bench_pairings, bench_options.pairings);
    split_list(bench_angles, bench_options.angles);
    split_list(bench_placement, bench_options.placement);
    if (!bench_threads.empty()) {
      for (int64_t t : parse_int_list(bench_threads, "--threads")) {
        check_threads(t, "--threads");
        bench_options.threads.push_back(static_cast<int>(t));
      }
    }
    return run_bench(bench_options, out);
  }

  int run(int argc, const char* const* argv, std::ostream& out) {
    if (!parse_app(app, "rotary-dev", argc, argv, out)) return 0;  // --help
    if (demo->parsed()) {
      if (demo->count("--seed") > 0) {
        const int64_t seed = parse_int(demo_seed, "--seed");
        if (seed < 0) throw Error(fmt::format("--seed={} must be in [0, 2^63)", seed));
        demo_options.seed = static_cast<uint64_t>(seed);
      }
      return run_demo(demo_options, out);
    }
    if (bench->parsed()) return run_bench_command(out);
    return 0;
  }
};

}  // namespace

int run_dev(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  return run_guarded("rotary-dev", err, [&] {
    DevCommands commands;
    return commands.run(argc, argv, out);
  });
}

}  // namespace rotary::cli
