// kvq referee driver: checks the inputs, reads the data, and runs or resumes every planned (method, windows) run —
// rotations and clips from the stores, kvq::evaluate per run — then writes results.json, report.md and report.html.
#include "referee/referee.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <thread>

#include "common/error.h"
#include "common/sha256.h"
#include "eval/decode_speed.h"
#include "eval/evaluator.h"
#include "kv/evict.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "referee/bands.h"
#include "referee/claims.h"
#include "referee/eviction.h"
#include "referee/io.h"
#include "referee/plan.h"
#include "referee/pooled.h"
#include "referee/results.h"
#include "referee/store.h"

namespace kvq {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class Referee {
 public:
  Referee(const RefereeConfig& cfg, const RefereeLog& log)
      : cfg_(cfg), log_(log), store_(cfg, data_, [this]() -> Model& { return model(); }, [this] { return runners(); },
                                     log) {}
  RefereeResult run();

 private:
  void say(const std::string& s, bool transient = false) { log_(s, transient); }
  Model& model();
  RunnerFactory runners();
  RefereeResult calibrate_only(const std::vector<PlannedRun>& plan);
  EvalConfig eval_config(std::vector<int> ctx, bool layers, const PlannedRun& r) const;
  std::map<std::string, std::string> check_caches(const std::vector<PlannedRun>& plan) const;
  CacheConfig run_cache(const PlannedRun& r, const Rotation& rot, const ClipChoice& clips, int ctx);
  json evaluate_run(const PlannedRun& r, const Rotation& rot, int index, int total, double avg_run_s, int left);
  json equal_bytes_json(const PlannedRun& r, const ModelConfig& mc) const;
  json execute_run(const std::vector<PlannedRun>& plan, size_t i, const json& settings, double& executed_seconds);
  json row_cost(const PlannedRun& r);
  json row_decode(const PlannedRun& r, const Rotation& rot);
  int threads() const;
  void write_results(const std::vector<PlannedRun>& plan, const json& missing,
                     std::chrono::steady_clock::time_point t0);

  const RefereeConfig& cfg_;
  RefereeLog log_;
  RefereeData data_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<Model> model_;
  RefereeStore store_;
  RefereeResult res_;
  std::map<std::string, json> costs_;    // row_cost's measurements by the probed cache's describe()
  std::map<std::string, json> decodes_;  // row_decode's, by the run cache's describe()
};

Model& Referee::model() {
  if (!model_) {
    say(fmt::format("kvq: referee: loading {}", cfg_.model_dir));
    model_ = Model::load(cfg_.model_dir, cfg_.threads, cfg_.simd);
    KVQ_CHECK(model_->fingerprint() == data_.fingerprint, "model '{}' changed while the referee ran", cfg_.model_dir);
  }
  return *model_;
}

RunnerFactory Referee::runners() { return cfg_.runners ? cfg_.runners(model()) : cpu_runner_factory(model()); }

// The evaluation passes of run r at contexts `ctx`: every task, or (layers false) all but the per-layer errors; as
// shipped, each window's first half is the prompt, for an eviction row its first 15/16 (run_prompt_tokens). Every
// other run also records its NLL over that last 1/16 (the tail), on which the eviction row is paired with it.
EvalConfig Referee::eval_config(std::vector<int> ctx, bool layers, const PlannedRun& r) const {
  EvalConfig ec;
  ec.tasks = layers ? std::vector<std::string>{"ppl", "kl", "passkey", "layers"}
                    : std::vector<std::string>{"ppl", "kl", "passkey"};
  ec.ctx = std::move(ctx);
  ec.windows = cfg_.eval_windows;
  ec.passkey_trials = cfg_.passkey_trials;
  if (!cfg_.depths.empty()) ec.depths = cfg_.depths;
  ec.seed = cfg_.seed;
  ec.bootstrap = cfg_.bootstrap;
  ec.prompt_fraction = run_prompt_fraction(r);
  ec.tail_fraction = run_tail_fraction(r);
  for (int c : ec.ctx)
    KVQ_CHECK(ec.prompt_at(c) == run_prompt_tokens(r, c), "internal: prompt of {} at ctx {}", r.key, c);
  return ec;
}

// An eviction row's budget at every ctx (results.json runs[].equal_bytes): the paired row, the bits it stores at the
// ctx and the windows (the target), the prompt, the prompt tokens kept and the tokens stored at the ctx.
json Referee::equal_bytes_json(const PlannedRun& r, const ModelConfig& mc) const {
  json by_ctx = json::object();
  for (int ctx : cfg_.ctx) {
    const double bits =
        method_equal_bytes_bits(r.method, r.windows, cfg_.group, ctx, mc.n_layers, mc.n_kv_heads, mc.head_dim);
    const int P = run_prompt_tokens(r, ctx), kept = evict_budget(bits, 16, P, ctx);
    by_ctx[std::to_string(ctx)] = {{"target_bits", bits},
                                   {"prompt_tokens", P},
                                   {"kept_prompt_tokens", kept},
                                   {"stored_tokens", kept + ctx - P},
                                   {"stored_bits", 16.0 * (kept + ctx - P) / ctx}};
  }
  return {{"paired", r.method.equal_bytes},
          {"windows", r.windows.label()},
          {"rule", "the stored bytes at each ctx are those the paired row stores at the same windows (within one "
                   "token's rows): every token after the prompt is kept at 16 bits, so the prompt keeps "
                   "floor(target_bits ctx / 16) - (ctx - prompt_tokens) tokens"},
          {"by_ctx", by_ctx}};
}

// Every planned run's cache is built and its footprint taken at each ctx with its prompt, before any run starts: an
// unsupported combination (a codec and the model's head_dim, windows and a page size, a prompt policy the cache does
// not have) is one error naming the run, not a failure after hours of other runs. The runs whose cache the
// evaluation's device has no kernels for are refused all at once, or (skip_unsupported) returned by key with the
// reason, to be left out.
std::map<std::string, std::string> Referee::check_caches(const std::vector<PlannedRun>& plan) const {
  const ModelConfig mc = ModelConfig::load(cfg_.model_dir + "/config.json");
  std::map<std::string, std::string> refused;  // run key -> why the evaluation's device cannot run it
  for (const PlannedRun& r : plan) {
    try {
      for (int ctx : cfg_.ctx) {
        const CacheConfig c = probe_cache_config(cfg_, mc, r, ctx);
        KvCache(c, mc.n_layers, mc.n_kv_heads, mc.head_dim, 1).footprint(ctx, run_prompt_tokens(r, ctx));
        if (cfg_.device_check && ctx == cfg_.ctx.front()) try {
            cfg_.device_check(c, mc.head_dim);
          } catch (const Error& e) {
            refused[r.key] = e.what();
          }
      }
    } catch (const Error& e) {
      KVQ_FAIL("referee: run {} ({}, protocol {}) cannot run: {}", r.key, r.method.label, protocol_name(r.protocol),
               e.what());
    }
  }
  if (!cfg_.skip_unsupported && !refused.empty()) {
    std::vector<std::string> each;
    for (const auto& [key, why] : refused) each.push_back(fmt::format("{} ({})", key, why));
    KVQ_FAIL("referee: {} of {} runs cannot run on {}: {}; leave them out of --methods or with --skip-unsupported, "
             "or run them with --device cpu into the same -o and pool both with --report-only (kvq referee --plan "
             "lists where each runs)", refused.size(), plan.size(), cfg_.device, fmt::join(each, "; "));
  }
  return refused;
}

// The cache of run r at ctx: run_cache_config with the run's rotation (or the transform its codecs imply) and clips.
CacheConfig Referee::run_cache(const PlannedRun& r, const Rotation& rot, const ClipChoice& clips, int ctx) {
  CacheConfig c = run_cache_config(cfg_, model().config(), r, ctx, rot.transform, rot.pair_bits, rot.kv_scales);
  c.k.clip = clips.k;
  c.v.clip = clips.v;
  return c;
}

// One run's `kvq eval --json` record: layers at the first ctx only; ppl, kl and passkey at every ctx (one evaluate()
// per group, merged; an eviction row, whose budget depends on the ctx, one per ctx), plus the clips it used and, for
// an eviction row, its budget at each ctx ("equal_bytes").
json Referee::evaluate_run(const PlannedRun& r, const Rotation& rot, int index, int total, double avg_run_s,
                           int left) {
  const ClipChoice clips = store_.clips_for(r);
  Model& m = model();
  const RunnerFactory make = runners();
  auto progress = [&](const std::string& stage, double frac, double eta) {
    const double rest = avg_run_s > 0 && eta >= 0 ? eta + avg_run_s * left : -1;
    say(fmt::format("kvq: run {}/{} {} {}: {} {:5.1f}%  ETA run {}, all {}", index, total, r.method.label,
                    r.windows.label(), stage, 100 * frac, referee_fmt_seconds(eta), referee_fmt_seconds(rest)),
        true);
  };
  auto pass = [&](std::vector<int> ctx, bool layers) {
    const CacheConfig cache = run_cache(r, rot, clips, ctx.front());
    return report_json(evaluate(m, make, *tok_, cache, data_.domains, eval_config(std::move(ctx), layers, r),
                                progress));
  };
  json out = pass({cfg_.ctx.front()}, true);
  std::vector<std::vector<int>> rest;  // the other contexts: one pass, or one each for an eviction row
  for (size_t i = 1; i < cfg_.ctx.size(); ++i)
    if (r.method.evicts() || rest.empty()) rest.push_back({cfg_.ctx[i]});
    else rest.back().push_back(cfg_.ctx[i]);
  for (std::vector<int>& ctx : rest) {
    const json j = pass(std::move(ctx), false);
    out["cache"]["footprint"].update(j["cache"]["footprint"]);
    out["seeds"].update(j["seeds"]);
    for (const char* t : {"ppl", "kl", "passkey"}) out["results"][t].update(j["results"][t]);
    out["seconds"] = out["seconds"].get<double>() + j["seconds"].get<double>();
  }
  if (r.method.evicts()) out["equal_bytes"] = equal_bytes_json(r, m.config());
  out["config"]["ctx"] = cfg_.ctx;
  out["config"]["tasks"] = {"ppl", "kl", "passkey", "layers"};
  out["config"]["layers_ctx"] = cfg_.ctx.front();
  out["clips"] = clips.to_json();
  return out;
}

// Runs plan[i] now and writes its record to OUT/runs/<key>.json; returns the record.
json Referee::execute_run(const std::vector<PlannedRun>& plan, size_t i, const json& settings,
                          double& executed_seconds) {
  const PlannedRun& r = plan[i];
  const auto r0 = std::chrono::steady_clock::now();
  const Rotation rot = store_.rotation_for(r);
  const double avg = res_.runs_executed > 0 ? executed_seconds / res_.runs_executed : -1;
  size_t left = 0;
  for (size_t k = i + 1; k < plan.size(); ++k) left += !fs::exists(run_record_path(cfg_, plan[k].key));
  json rec = evaluate_run(r, rot, int(i + 1), int(plan.size()), avg, int(left));
  add_run_fields(rec, cfg_, data_, r, rot, settings, model().pool().size());
  if (cfg_.cost_probe) rec["cost"] = row_cost(r);
  if (cfg_.decode_steps > 0) rec["decode"] = row_decode(r, rot);
  referee_write_atomic(run_record_path(cfg_, r.key), rec.dump(1));
  ++res_.runs_executed;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
  executed_seconds += s;
  say(fmt::format("kvq: run {}/{} {} {}: finished in {:.1f} s", i + 1, plan.size(), r.method.label,
                  r.windows.label(), s));
  return rec;
}

// The cost of run r's cache format (RefereeConfig::cost_probe): its codecs and windows as the protocol sets them, the
// prompt decode-faithful, no layer skipped (the probe times one layer), measured once per distinct cache. An eviction
// row keeps a token budget of a bf16 cache, not a format: it has none.
json Referee::row_cost(const PlannedRun& r) {
  if (r.method.evicts())
    return {{"skipped", "an eviction row is a bf16 cache that keeps fewer tokens, not a format of its own"}};
  CacheConfig c = method_cache(r.method, r.windows, cfg_.group, r.protocol);
  c.skip_layers.clear();
  c.prompt_policy = PromptPolicy::kDecodeFaithful;
  const std::string key = c.describe();
  if (auto it = costs_.find(key); it != costs_.end()) return it->second;
  json j;
  try {
    j = cfg_.cost_probe(c);
  } catch (const Error& e) {
    j = {{"unsupported", e.what()}};
  }
  return costs_[key] = j;
}

// The decode speed of run r's cache at the evaluated model (RefereeConfig::decode_steps): its codecs, windows,
// rotation and skipped layers, decode-faithful, through the evaluation's runner, once per distinct cache. An eviction
// row keeps a token budget of a bf16 cache, not a format: it has none.
json Referee::row_decode(const PlannedRun& r, const Rotation& rot) {
  if (r.method.evicts())
    return {{"skipped", "an eviction row is a bf16 cache that keeps fewer tokens, not a format of its own"}};
  constexpr int kWarmup = 2;
  const int ctx = *std::max_element(cfg_.ctx.begin(), cfg_.ctx.end());
  CacheConfig c = run_cache(r, rot, store_.clips_for(r), ctx);
  c.prompt_policy = PromptPolicy::kDecodeFaithful;
  const std::string key = c.describe();
  if (auto it = decodes_.find(key); it != decodes_.end()) return it->second;
  json j;
  try {
    const int fill = std::max(1, ctx - kWarmup - cfg_.decode_steps);
    const std::unique_ptr<Runner> runner = runners()(c, fill + kWarmup + cfg_.decode_steps);
    const DecodeSpeed d = time_decode(*runner, fill, cfg_.decode_steps, kWarmup, cfg_.seed);
    j = {{"seqs", 1}, {"ctx", d.ctx}, {"steps", d.steps}, {"tokens_per_second", d.tokens_per_second()},
         {"ms_per_step", d.ms_per_step()}, {"runner", runner->describe()}};
  } catch (const Error& e) {
    j = {{"unsupported", e.what()}};
  }
  return decodes_[key] = j;
}

// --calibrate-only: every rotation the plan needs, calibrated or found in OUT/rotations/; no runs, no reports.
RefereeResult Referee::calibrate_only(const std::vector<PlannedRun>& plan) {
  for (const PlannedRun& r : plan)
    if (r.method.needs_calibration()) store_.rotation_for(r);
  res_.calibrations_run = store_.calibrations_run();
  res_.calibrations_reused = store_.calibrations_reused();
  say(fmt::format("kvq: referee: {} rotation file(s) in {}/rotations ({} calibrated now, {} cached)",
                  store_.rotation_files(), cfg_.out_dir, res_.calibrations_run, res_.calibrations_reused));
  return std::move(res_);
}

int Referee::threads() const {
  return model_ ? model_->pool().size() : cfg_.threads > 0 ? cfg_.threads : int(std::thread::hardware_concurrency());
}

void Referee::write_results(const std::vector<PlannedRun>& plan, const json& missing,
                            std::chrono::steady_clock::time_point t0) {
  res_.calibrations_run = store_.calibrations_run();
  res_.calibrations_reused = store_.calibrations_reused();
  const json& j = res_.results =
      referee_results_json(cfg_, data_, {res_, int(plan.size()), missing, threads(), t0});
  const std::vector<std::string> problems = referee_schema_errors(j);
  KVQ_CHECK(problems.empty(), "referee: results.json fails its schema: {}", problems.front());
  referee_write_atomic((fs::path(cfg_.out_dir) / "results.json").string(), j.dump(1));
  referee_write_atomic((fs::path(cfg_.out_dir) / "report.md").string(), referee_markdown(j));
  referee_write_atomic((fs::path(cfg_.out_dir) / "report.html").string(), referee_html(j));
}

RefereeResult Referee::run() {
  const auto t0 = std::chrono::steady_clock::now();
  check_referee_inputs(cfg_, data_);
  fs::create_directories(fs::path(cfg_.out_dir) / "runs");
  fs::create_directories(fs::path(cfg_.out_dir) / "rotations");
  tok_ = std::make_unique<Tokenizer>(Tokenizer::load(cfg_.model_dir + "/tokenizer.json"));
  read_referee_data(cfg_, tok_.get(), data_);
  const std::vector<PlannedRun> plan = plan_referee_runs(cfg_, data_);
  check_calibration_budgets(cfg_, data_, plan);
  const std::map<std::string, std::string> refused = cfg_.report_only ? decltype(refused){} : check_caches(plan);
  if (!refused.empty())
    say(fmt::format("kvq: referee: {} of {} runs left out (--skip-unsupported): {} has no kernels for their caches",
                    refused.size(), plan.size(), cfg_.device));
  if (cfg_.calibrate_only) return calibrate_only(plan);

  double executed_seconds = 0;
  json missing = json::array();
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedRun& r = plan[i];
    if (auto it = refused.find(r.key); it != refused.end()) {
      missing.push_back({{"key", r.key}, {"method", r.method.label}, {"windows", r.windows.label()},
                         {"leakage", r.leakage}, {"reason", fmt::format("not on {}: {}", cfg_.device, it->second)}});
      continue;
    }
    const std::string path = run_record_path(cfg_, r.key);
    const json settings = run_settings(cfg_, data_, r);
    RefereeRun run;
    run.key = r.key;
    if (std::optional<json> old = resumable_record(path, settings, log_, cfg_.report_only && cfg_.any_device)) {
      run.record = std::move(*old);
      run.resumed = true;
    }
    if (!run.resumed && cfg_.report_only) {
      missing.push_back({{"key", r.key}, {"method", r.method.label}, {"windows", r.windows.label()},
                         {"leakage", r.leakage}});
      continue;
    }
    // a record made before the cost column gets it now
    if (run.resumed && cfg_.cost_probe && !cfg_.report_only && !run.record.contains("cost")) {
      run.record["cost"] = row_cost(r);
      referee_write_atomic(path, run.record.dump(1));
    }
    if (run.resumed) {
      ++res_.runs_resumed;
      say(fmt::format("kvq: run {}/{} {} {}: done earlier ({})", i + 1, plan.size(), r.method.label,
                      r.windows.label(), path));
    } else {
      run.record = execute_run(plan, i, settings, executed_seconds);
    }
    res_.runs.push_back(std::move(run));
  }

  if (cfg_.report_only) {
    KVQ_CHECK(!res_.runs.empty(), "referee --report-only: no finished run of this plan in {}/runs (nothing to report)",
              cfg_.out_dir);
    if (!missing.empty())
      say(fmt::format("kvq: referee: {} of {} runs have no record in {}/runs: reported as not run", missing.size(),
                      plan.size(), cfg_.out_dir));
  }
  write_results(plan, missing, t0);
  return std::move(res_);
}

}  // namespace

void check_calibration_disjoint(const std::string& calib_file, const std::string& eval_dir) {
  KVQ_CHECK(fs::is_regular_file(calib_file), "calibration data '{}' is not a file", calib_file);
  const fs::path calib = fs::weakly_canonical(calib_file);
  const fs::path dir = fs::weakly_canonical(eval_dir);
  for (fs::path p = calib.parent_path(); !p.empty(); p = p.parent_path()) {
    KVQ_CHECK(p != dir, "calibration data '{}' lies inside the eval data directory '{}': calibration must be disjoint "
              "from evaluation data", calib_file, eval_dir);
    if (p == p.root_path()) break;
  }
  const std::string sha = sha256_hex(referee_read_text(calib_file, "calibration data"));
  for (const std::string& f : list_eval_files(eval_dir))
    KVQ_CHECK(sha256_hex(referee_read_text(f, "eval text")) != sha,
              "calibration data '{}' is identical (sha256 {}…) to eval file '{}': calibration must be disjoint from "
              "evaluation data", calib_file, sha.substr(0, 12), f);
}

json render_referee_reports(const std::string& results_file, const std::string& out_dir) {
  const std::string text = referee_read_maybe_gz(results_file, "referee results");
  json j = json::parse(text, nullptr, false);
  KVQ_CHECK(!j.is_discarded() && j.is_object(), "referee results '{}' is not a JSON object", results_file);
  for (const char* key : {"model", "config", "runs", "eval_data"})
    KVQ_CHECK(j.contains(key), "referee results '{}' have no \"{}\" (not a results.json of kvq referee)", results_file,
              key);
  json& model = j["model"];
  if (!model.contains("name") || !model.contains("parameters")) {  // a record from before they were written
    std::string dir = model["dir"].get<std::string>();
    if (!model.contains("name")) {
      while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
      model["name"] = dir;
    }
    std::error_code ec;
    if (!model.contains("parameters") && fs::is_regular_file(fs::path(dir) / "config.json", ec) &&
        Checkpoint::open(dir).fingerprint() == model["fingerprint"].get<std::string>())
      model["parameters"] = ModelConfig::load(dir + "/config.json").n_params();
  }
  // What is derived from the run records, derived again by this kvq (as --report-only over OUT/runs would): the
  // unseen-domain pool, the equal-bit bands and Pareto series, the eviction rows and the claims under the current rule.
  j["unseen"] = referee_unseen_json(j);
  j["bands"] = referee_bands_json(j);
  j["pareto"] = referee_pareto_json(j);
  j["eviction"] = referee_eviction_json(j);
  j["claims"] = referee_claims_json(j);
  j["claims_rule"] = claim_rule_text();
  const std::vector<std::string> problems = referee_schema_errors(j);
  KVQ_CHECK(problems.empty(), "referee results '{}' fail the schema: {}", results_file, problems.front());
  fs::create_directories(out_dir);
  referee_write_atomic((fs::path(out_dir) / "report.md").string(), referee_markdown(j));
  referee_write_atomic((fs::path(out_dir) / "report.html").string(), referee_html(j));
  return j;
}

RefereeLog referee_stderr_log() {
  return [](const std::string& line, bool transient) {
    std::fprintf(stderr, transient ? "\r%-110s" : "\r%-110s\n", line.c_str());
    std::fflush(stderr);
  };
}

RefereeResult run_referee(const RefereeConfig& cfg, const RefereeLog& log) {
  Referee r(cfg, log ? log : referee_stderr_log());
  return r.run();
}

}  // namespace kvq
