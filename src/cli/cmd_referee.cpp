// kvq referee: every cache method × window setting on the same model, data, seeds and group, with calibration on data
// disjoint from the eval data (docs/guide/methods.md §6-8). Writes OUT/results.json, report.md, report.html and prints
// the summary table.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>

#include "cli/attention_cost.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "common/error.h"
#include "eval/evaluator.h"
#include "model/config.h"
#include "referee/referee.h"
#include "referee/rehearsal.h"
#include "referee/io.h"

namespace kvq::cli {

namespace {

struct RefereeOptions {
  RefereeConfig cfg;
  ModelOptions model;  // --device / --gpu-gemm of the evaluation passes
  std::string results;  // --results: a finished results.json to render (with --report-only)
  std::string simd;     // --simd
  std::string cost_shape;  // --cost-shape: BxN, or "off" (default: 8x32768 on cuda, 1x32768 on the CPU)
  std::string ctx = "2048", methods, windows = "64/256,16/64,0/0", domains, depths, clip_grid,
              protocols = "common,as-shipped";
  bool quick = false, no_leakage = false, plan = false;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) out.push_back(t);
  return out;
}

// --plan: every run of the referee with its status and its estimated time on the device, timed at the model's shape
// with random weights (referee/rehearsal.h); prints the table and writes OUT/plan.json. Reads no weights.
void run_plan(const RefereeOptions& o) {
  const RefereeConfig& c = o.cfg;
  ModelOptions mo = o.model;
  mo.dir = c.model_dir, mo.threads = c.threads, mo.simd = o.simd, mo.dummy_weights = true;
  Plan p;
  p.model = ModelConfig::load(c.model_dir + "/config.json");
  std::optional<ModelSource> src;  // the random weights, made when the first cache is timed (after the inputs' checks)
  PlanDevice dev;
  dev.device = mo.device;
  dev.runners = [&](const CacheConfig& cache, int max_ctx) {
    if (!src) src = load_model_source(mo, p);
    Plan q = p;
    q.cache = cache;
    return make_runner(*src, mo, q, max_ctx);
  };
  if (mo.device != "cpu") dev.check = check_gpu_cache;
  const nlohmann::json plan = plan_referee(c, dev, referee_stderr_log());
  std::fprintf(stderr, "\r%-110s\r", "");
  std::filesystem::create_directories(c.out_dir);
  const std::string file = (std::filesystem::path(c.out_dir) / "plan.json").string();
  referee_write_atomic(file, plan.dump(1));
  std::printf("%s(wrote %s)\n", referee_plan_table(plan).c_str(), file.c_str());
}

// The cost column's decode speed: timed steps of one sequence per distinct cache (RefereeConfig::decode_steps).
constexpr int kCostDecodeSteps = 32;

void run(RefereeOptions o, const CLI::App* cmd) {
  RefereeConfig& c = o.cfg;
  if (!o.results.empty()) {  // the reports of a finished results.json: nothing else is read
    KVQ_CHECK(c.report_only, "referee: --results FILE renders a results.json: it needs --report-only");
    for (const char* flag : {"--model", "--calib-data", "--eval-data", "--ctx", "--methods", "--device", "--quick"})
      KVQ_CHECK(cmd->count(flag) == 0, "referee --report-only --results: {} does not apply (the results say what ran)",
                flag);
    render_referee_reports(o.results, c.out_dir);
    std::printf("wrote %s/report.md, report.html from %s\n", c.out_dir.c_str(), o.results.c_str());
    return;
  }
  for (const auto& [flag, value] : {std::pair{"--model", &c.model_dir}, {"--calib-data", &c.calib_data},
                                    {"--eval-data", &c.eval_dir}})
    KVQ_CHECK(!value->empty(), "referee: {} is required", flag);
  c.simd = parse_simd_level(o.simd);
  if (!o.plan) require_checkpoint(o.model, "referee");  // --plan times random weights, whatever -m holds
  auto given = [&](const char* flag) { return cmd->count(flag) > 0; };
  if (o.quick) {  // the demo / CI subset; explicit flags still win
    if (!given("--methods")) o.methods = referee_quick_methods();
    if (!given("--cache-windows")) o.windows = "64/256,0/0";
    if (!given("--ctx")) o.ctx = "1024";
    if (!given("--windows")) c.eval_windows = 1;
    if (!given("--passkey-trials")) c.passkey_trials = 1;
    if (!given("--depths")) o.depths = "0,0.5,1";  // 3 needle depths: the quick runs of every camp fit the demo
    if (!given("--calib-tokens")) c.calib_tokens = 4096;
    if (!given("--calib-chunk")) c.calib_chunk = 1024;
    if (!given("--calib-steps")) c.calib_steps = 20;
    if (!given("--domains")) {
      std::vector<std::string> stems;
      for (const std::string& f : list_eval_files(c.eval_dir)) stems.push_back(std::filesystem::path(f).stem().string());
      const bool both = std::count(stems.begin(), stems.end(), "linux") && std::count(stems.begin(), stems.end(),
                                                                                      "python");
      if (both) o.domains = "linux,python";
      else for (size_t i = 0; i < stems.size() && i < 2; ++i) o.domains += (i ? "," : "") + stems[i];
    }
  }
  KVQ_CHECK(!(c.report_only && c.calibrate_only), "referee: --report-only and --calibrate-only exclude each other");
  KVQ_CHECK(!o.plan || !(c.report_only || c.calibrate_only),
            "referee: --plan runs nothing: it excludes --report-only and --calibrate-only");
  c.quick = o.quick;
  c.leakage = !o.no_leakage;
  c.ctx = parse_ctx_list(o.ctx);
  if (!o.methods.empty()) c.methods = parse_referee_methods(o.methods);
  c.windows = parse_referee_windows(o.windows);
  c.protocols = parse_referee_protocols(o.protocols);
  if (!o.domains.empty()) c.domains = split(o.domains);
  auto numbers = [](const std::string& list, const char* flag) {
    std::vector<double> out;
    for (const std::string& d : split(list)) {
      char* end = nullptr;
      const double v = std::strtod(d.c_str(), &end);
      KVQ_CHECK(!d.empty() && *end == '\0', "bad {} '{}': '{}' is not a number", flag, list, d);
      out.push_back(v);
    }
    KVQ_CHECK(list.empty() || list.back() != ',', "bad {} '{}': empty item", flag, list);
    return out;
  };
  c.depths = numbers(o.depths, "--depths");
  for (double v : numbers(o.clip_grid, "--clip-grid")) c.clip_grid.push_back(float(v));
  // --report-only pools every device's records unless --device names one (a referee's CPU-only rows and its GPU
  // rows can be run by two processes into one OUT); the report lists where each run was evaluated.
  c.any_device = c.report_only && !given("--device");
  if (c.any_device) {
    c.device = "any";
  } else if (o.model.device != "cpu") {
    c.device = o.model.device + "/" + o.model.gpu_gemm;
    if (!c.report_only) check_device_available(o.model);  // no device, or a bad --gpu-gemm: one line before any work
    c.runners = [device = o.model](Model& m) { return make_runner_factory(m, device); };
    c.device_check = check_gpu_cache;
  }
  if (o.plan) return run_plan(o);
  if (!c.report_only && !c.calibrate_only && o.cost_shape != "off") {
    const CostShape shape = parse_cost_shape(!o.cost_shape.empty()        ? o.cost_shape
                                             : o.model.device == "cuda" ? "8x32768"
                                                                        : "1x32768");
    // and at the evaluated model's heads, the same sequences, the longest --ctx
    const ModelConfig mc = ModelConfig::load(c.model_dir + "/config.json");
    CostShape at_model = shape;
    at_model.q_heads = mc.n_heads, at_model.kv_heads = mc.n_kv_heads, at_model.head_dim = mc.head_dim;
    at_model.ctx = *std::max_element(c.ctx.begin(), c.ctx.end());
    c.cost_probe = attention_cost_probe(o.model.device, shape, at_model, c.threads, c.simd);
    c.decode_steps = kCostDecodeSteps;
  }
  const RefereeResult r = run_referee(c);
  if (c.calibrate_only) return;
  std::printf("%s", referee_summary_table(r.results).c_str());
  std::printf("runs: %d run now, %d resumed; calibrations: %d run, %d reused\nwrote %s/results.json, report.md, "
              "report.html\n",
              r.runs_executed, r.runs_resumed, r.calibrations_run, r.calibrations_reused, c.out_dir.c_str());
}

}  // namespace

void add_referee(CLI::App& app) {
  auto o = std::make_shared<RefereeOptions>();
  CLI::App* cmd = app.add_subcommand("referee", "fair comparison of every KV-cache method × window setting "
                                                "(results.json, report.md, report.html)");
  RefereeConfig& c = o->cfg;
  cmd->add_option("-m,--model", c.model_dir, "Hugging Face checkpoint directory (required unless --results)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--model-name", c.model_name, "the model's name in the verdicts, e.g. Qwen/Qwen3-8B (default: "
                  "config.json's _name_or_path, else -m)");
  cmd->add_option("--calib-data", c.calib_data, "calibration text, disjoint from the eval data (required unless "
                  "--results)");
  cmd->add_option("--eval-data", c.eval_dir, "directory of eval texts; every DIR/*.txt is one domain (required "
                  "unless --results)");
  cmd->add_option("-o,--output", c.out_dir, "output directory (results, reports, runs/, rotations/)")->required();
  cmd->add_option("--ctx", o->ctx, "comma-separated context lengths (layers at the first)");
  const std::string quick = referee_quick_methods();
  cmd->add_flag("--quick", o->quick, fmt::format("demo / CI subset: {} methods, windows 64/256 and 0/0, ctx 1024, 1 "
                "window, 2 domains, 1 passkey trial at depths 0, 0.5, 1, small OptR budget",
                std::count(quick.begin(), quick.end(), ',') + 1));
  cmd->add_option("--windows", c.eval_windows, "eval windows per domain and ctx (0: all)")->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--passkey-trials", c.passkey_trials, "passkey prompts per (ctx, depth)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--methods", o->methods, "comma-separated methods (default: all)");
  cmd->add_option("--cache-windows", o->windows, "sink/recent BF16 window settings of the common protocol, e.g. "
                  "64/256,16/64,0/0");
  cmd->add_option("--protocols", o->protocols, "common (decode-faithful, the --cache-windows settings, no layer "
                  "skipped), as-shipped (each camp's own windows, layer skip, attn_rot and prompt policy, scoring each "
                  "window's second half after a prompt of its first half), or both (default)");
  cmd->add_option("--domains", o->domains, "eval domains to use (file stems; default: all)");
  cmd->add_option("--depths", o->depths, "passkey needle depths (default 0,0.1,...,1)");
  cmd->add_option("--clip-grid", o->clip_grid, "tune each INT2 method's key and value clips over these ratios on "
                  "held-out text from the end of --calib-data, e.g. 0.9,0.92,0.96,1 (default: METHODS' 0.96 / 0.92)");
  cmd->add_option("--tune-windows", c.tune_windows, "held-out windows (of the first --ctx) per clip candidate")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-t,--threads", c.threads, "worker threads (0: all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("--cost-shape", o->cost_shape,
                  "the cost column's shape: one decode step's attention of each row's cache at SEQSxCTX (q32/kv8/d128, "
                  "random rows, as kvq bench attention) on the evaluation's device, beside the median of 32 decode "
                  "steps of one sequence at the longest --ctx through the model; off: no cost column (default: "
                  "8x32768 on cuda, 1x32768 on the CPU)");
  add_simd_option(cmd, o->simd);
  add_device_options(cmd, o->model);
  add_dummy_weights_option(cmd, o->model);  // refused in run(): the referee needs a checkpoint's weights
  cmd->add_option("--seed", c.seed, "seed of the passkey prompts and the bootstrap");
  cmd->add_option("--bootstrap", c.bootstrap, "bootstrap resamples")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--calib-tokens", c.calib_tokens, "calibration token budget")->check(CLI::Range(2, 1 << 26));
  cmd->add_option("--calib-chunk", c.calib_chunk, "tokens per calibration chunk")->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--calib-steps", c.calib_steps, "OptR Adam steps per phase")->check(CLI::Range(1, 100000));
  cmd->add_flag("--no-leakage", o->no_leakage, "skip the same-text calibration (leakage) row");
  cmd->add_flag("--report-only", c.report_only, "run nothing: write results.json and the reports from the runs already "
                "in OUT/runs (e.g. made on another machine), listing the missing ones; the records of every device "
                "unless --device names one");
  cmd->add_option("--results", o->results, "with --report-only: write OUT/report.md and report.html from this "
                  "results.json (or .json.gz, e.g. docs/reports/*-results.json.gz), the claims re-checked; needs no "
                  "model or data")->check(CLI::ExistingFile);
  cmd->add_flag("--skip-unsupported", c.skip_unsupported, "leave out the runs whose cache --device has no kernels "
                "for (listed in results.json and report.md as not run, with the reason) instead of refusing them all "
                "before the first run");
  cmd->add_flag("--plan", o->plan, "run nothing: print every run with its status (to run, done earlier, refused by "
                "the device) and its estimated time on --device, each distinct cache timed once at the model's shape "
                "with random weights (no weights are read: a config.json suffices), and write OUT/plan.json");
  cmd->add_flag("--calibrate-only", c.calibrate_only, "only calibrate (or find cached) the rotations the runs need, "
                "into OUT/rotations/, and stop");
  cmd->callback([o, cmd] { run(*o, cmd); });
}

}  // namespace kvq::cli
