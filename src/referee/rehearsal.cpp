// kvq referee --plan (referee/rehearsal.h).
#include "referee/rehearsal.h"

#include <chrono>
#include <filesystem>
#include <map>
#include <span>

#include "common/error.h"
#include "eval/fidelity.h"
#include "eval/passkey.h"
#include "eval/perplexity.h"
#include "eval/rng.h"
#include "kv/cache.h"
#include "model/config.h"
#include "referee/io.h"
#include "referee/plan.h"
#include "referee/store.h"
#include "rotation/rotation_file.h"

namespace kvq {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// What one cache costs at one ctx (rehearsal.h: build, window, prompt).
struct CacheTiming {
  double build_s = 0, window_s = 0, prompt_s = 0;
  std::string runner;  // Runner::describe() of the method's runner
};

// What one clip candidate of a tuned row costs: its runner and one held-out window.
struct TuneTiming {
  double build_s = 0, window_s = 0;
};

class Rehearsal {
 public:
  Rehearsal(const RefereeConfig& cfg, const PlanDevice& dev, const RefereeLog& log)
      : cfg_(cfg), dev_(dev), log_(log), pool_(cfg.threads) {}
  json run();

 private:
  CacheConfig timing_cache(const PlannedRun& r, int ctx) const;
  const CacheTiming& time_run(const PlannedRun& r, int ctx, bool layers);
  const TuneTiming& time_tuning(const RefereeMethod& tuned, const RefereeWindows& w);
  json plan_run(const PlannedRun& r, std::map<std::string, bool>& tunings);
  json calibration(const PlannedRun& r) const;
  int windows_at(int ctx) const;
  const std::vector<int32_t>& random_ids(int ctx);

  const RefereeConfig& cfg_;
  const PlanDevice& dev_;
  RefereeLog log_;
  ThreadPool pool_;
  ModelConfig mc_;
  RefereeData data_;
  bool tokenized_ = false;
  std::vector<double> depths_;  // the passkey needle depths
  int prompts_ = 0;             // passkey prompts a run makes at each ctx: trials x depths
  std::map<std::string, CacheTiming> timed_;  // by cache description, ctx, prompt, tail and layers
  std::map<std::string, TuneTiming> tuned_;   // by tuned row and windows
  std::map<int, std::vector<int32_t>> ids_;   // random tokens by ctx
  std::string runner_;                        // the first timed runner's description
};

// The cache of run r at ctx as timed: its run cache, a calibrated rotation replaced by a random one of the same shape
// and PN-Mix's widths by mixed ones of its budget, FP8 scales by 1.0 (the costs are the shapes', not the values').
CacheConfig Rehearsal::timing_cache(const PlannedRun& r, int ctx) const {
  const RefereeRotation& kind = r.method.rotation_kind();
  std::shared_ptr<const KvTransform> t;
  if (kind.data_free)
    t = std::make_shared<KvTransform>(kind.data_free(mc_));
  else if (kind.calibrated && !kind.key_widths && !kind.tensor_scales)
    t = std::make_shared<KvTransform>(random_rotation_transform(mc_.n_layers, mc_.n_kv_heads, mc_.head_dim, 0));
  return probe_cache_config(cfg_, mc_, r, ctx, std::move(t));
}

const std::vector<int32_t>& Rehearsal::random_ids(int ctx) {
  std::vector<int32_t>& ids = ids_[ctx];
  if (ids.empty()) {
    EvalRng rng(mix_seed(cfg_.seed, uint64_t(ctx)));
    ids.resize(size_t(ctx));
    for (int32_t& t : ids) t = int32_t(rng.below(uint64_t(mc_.vocab_size)));
  }
  return ids;
}

const CacheTiming& Rehearsal::time_run(const PlannedRun& r, int ctx, bool layers) {
  const CacheConfig c = timing_cache(r, ctx);
  EvalConfig ec;  // the run's prompt and tail at ctx, as its evaluation takes them
  ec.prompt_fraction = run_prompt_fraction(r);
  ec.tail_fraction = run_tail_fraction(r);
  const int P = ec.prompt_at(ctx), T = ec.tail_at(ctx);
  const std::string key = fmt::format("{}|ctx {}|P {}|T {}|{}", c.describe(), ctx, P, T, layers ? "layers" : "");
  if (auto it = timed_.find(key); it != timed_.end()) return it->second;
  log_(fmt::format("kvq: referee --plan: timing {} at ctx {} ({} cache(s) timed)", r.key, ctx, timed_.size()), true);
  const std::vector<int32_t>& ids = random_ids(ctx);
  CacheTiming t;
  auto t0 = Clock::now();
  const std::unique_ptr<Runner> ref = dev_.runners(bf16_reference_cache(c), ctx);
  const std::unique_ptr<Runner> method = dev_.runners(c, ctx);
  const std::unique_ptr<Runner> forced = layers ? dev_.runners(c, ctx) : nullptr;
  t.build_s = since(t0);
  t.runner = method->describe();
  t0 = Clock::now();
  lockstep_fidelity({ref.get(), method.get(), forced.get()}, ids, ctx, 1, &pool_, {}, P, T);
  t.window_s = since(t0);
  const int answer = std::min(kPlanAnswerTokens, ctx - 1);
  t0 = Clock::now();
  greedy_decode(*method, std::span(ids.data(), size_t(ctx - answer)), answer);
  method->synchronize();
  t.prompt_s = since(t0);
  if (runner_.empty()) runner_ = t.runner;
  return timed_[key] = t;
}

const TuneTiming& Rehearsal::time_tuning(const RefereeMethod& tuned, const RefereeWindows& w) {
  const std::string key = tuned.label + "@" + w.label();
  if (auto it = tuned_.find(key); it != tuned_.end()) return it->second;
  const int ctx = cfg_.ctx.front();
  const CacheConfig c = timing_cache({tuned, w, false, ""}, ctx);
  TuneTiming t;
  auto t0 = Clock::now();
  const std::unique_ptr<Runner> runner = dev_.runners(c, ctx);
  t.build_s = since(t0);
  t0 = Clock::now();
  perplexity(*runner, random_ids(ctx), ctx, 1);
  runner->synchronize();
  t.window_s = since(t0);
  return tuned_[key] = t;
}

// The ppl / kl / layers windows of every evaluated domain at ctx: counted in its tokens, or (no tokenizer) --windows
// for each domain.
int Rehearsal::windows_at(int ctx) const {
  int n = 0;
  for (const EvalDomain& d : data_.domains)
    n += tokenized_ ? eval_windows_of(d.ids.size(), ctx, cfg_.eval_windows) : cfg_.eval_windows;
  return n;
}

json Rehearsal::calibration(const PlannedRun& r) const {
  if (!r.method.needs_calibration()) return nullptr;
  const bool learned = r.method.rotation_kind().learned;
  json j = {{"method", r.method.rotation}, {"on", run_calib_text(cfg_, data_, r).file}, {"tokens", cfg_.calib_tokens},
            {"steps", learned ? cfg_.calib_steps : 0}};
  if (learned && referee_tunes_clips(cfg_, r.method)) {
    j["file"] = nullptr;  // named by the clips its base tunes first
    j["cached"] = false;
  } else {
    const std::string file = referee_rotation_file(cfg_, data_, r, nullptr);
    j["file"] = file;
    j["cached"] = fs::exists(file);
  }
  return j;
}

json Rehearsal::plan_run(const PlannedRun& r, std::map<std::string, bool>& tunings) {
  json row = {{"key", r.key},           {"method", r.method.label},   {"windows", run_windows_label(r)},
              {"protocol", protocol_name(r.protocol)},             {"leakage", r.leakage},
              {"status", "runs"},       {"reason", ""},              {"calibration", calibration(r)},
              {"per_ctx", json::array()}, {"tune", nullptr},         {"estimate_s", 0.0}};
  const RefereeLog quiet = [](const std::string&, bool) {};
  if (resumable_record(run_record_path(cfg_, r.key), run_settings(cfg_, data_, r), quiet)) row["status"] = "done";
  double tokens = 0;
  for (size_t i = 0; i < cfg_.ctx.size(); ++i) {
    const int ctx = cfg_.ctx[i], windows = windows_at(ctx);
    // evaluate()'s work as the referee asks for it (Referee::eval_config): every task, the per-layer errors at the
    // first ctx only
    EvalConfig work;
    work.tasks = {"ppl", "kl", "passkey"};
    if (i == 0) work.tasks.push_back("layers");
    work.passkey_trials = cfg_.passkey_trials;
    work.depths = depths_;
    tokens += eval_work_tokens(work, ctx, windows);
    row["per_ctx"].push_back({{"ctx", ctx}, {"windows", windows}, {"prompts", prompts_}});
  }
  row["tokens"] = tokens;
  if (row["status"] == "done") return row;
  try {
    for (int ctx : cfg_.ctx) {
      const CacheConfig c = timing_cache(r, ctx);
      KvCache(c, mc_.n_layers, mc_.n_kv_heads, mc_.head_dim, 1).footprint(ctx, run_prompt_tokens(r, ctx));
    }
  } catch (const Error& e) {
    row["status"] = "cannot run";
    row["reason"] = e.what();
    return row;
  }
  if (dev_.check) try {
      dev_.check(timing_cache(r, cfg_.ctx.front()), mc_.head_dim);
    } catch (const Error& e) {
      row["status"] = "refused";
      row["reason"] = e.what();
      return row;
    }
  double estimate = 0;
  for (size_t i = 0; i < cfg_.ctx.size(); ++i) {
    json& at = row["per_ctx"][i];
    const CacheTiming& t = time_run(r, cfg_.ctx[i], i == 0);
    at.update({{"build_s", t.build_s}, {"window_s", t.window_s}, {"prompt_s", t.prompt_s}});
    estimate += t.build_s + at["windows"].get<int>() * t.window_s + at["prompts"].get<int>() * t.prompt_s;
  }
  // the clips this run takes, tuned by the first run that needs them (unless OUT/clips/ holds them)
  if (referee_tunes_clips(cfg_, r.method)) {
    const RefereeMethod& tuned = referee_clips_source(r.method);
    const std::string file = referee_clip_file(cfg_, data_, tuned, r.windows);
    if (!fs::exists(file) && !tunings[file]) {
      tunings[file] = true;
      const TuneTiming& t = time_tuning(tuned, r.windows);
      const int candidates = int(cfg_.clip_grid.size() * cfg_.clip_grid.size());
      const double s = candidates * (t.build_s + cfg_.tune_windows * t.window_s);
      row["tune"] = {{"method", tuned.label}, {"candidates", candidates}, {"windows", cfg_.tune_windows},
                     {"build_s", t.build_s}, {"window_s", t.window_s}, {"seconds", s}};
      estimate += s;
    }
  }
  row["estimate_s"] = estimate;
  return row;
}

json Rehearsal::run() {
  const auto t0 = Clock::now();
  check_referee_inputs(cfg_, data_);
  mc_ = ModelConfig::load(cfg_.model_dir + "/config.json");
  const std::string tok_file = cfg_.model_dir + "/tokenizer.json";
  std::unique_ptr<Tokenizer> tok;
  if (fs::exists(tok_file)) tok = std::make_unique<Tokenizer>(Tokenizer::load(tok_file));
  KVQ_CHECK(tok || cfg_.eval_windows > 0, "referee --plan: {} has no tokenizer.json to count the eval texts' windows: "
            "give --windows N (each domain is then taken to hold N windows of every ctx)", cfg_.model_dir);
  for (int ctx : cfg_.ctx)
    KVQ_CHECK(ctx <= mc_.max_ctx, "referee --plan: context {} exceeds the model's maximum of {} tokens", ctx,
              mc_.max_ctx);
  tokenized_ = tok != nullptr;
  read_referee_data(cfg_, tok.get(), data_);
  const std::vector<PlannedRun> plan = plan_referee_runs(cfg_, data_);
  if (tokenized_) check_calibration_budgets(cfg_, data_, plan);
  depths_ = cfg_.depths.empty() ? EvalConfig::default_depths() : cfg_.depths;
  prompts_ = cfg_.passkey_trials * int(depths_.size());

  json runs = json::array(), calibrations = json::object();
  std::map<std::string, bool> tunings;
  double estimate = 0, tokens = 0;
  std::map<std::string, int> by_status;
  for (const PlannedRun& r : plan) {
    json row = plan_run(r, tunings);
    estimate += row["estimate_s"].get<double>();
    if (row["status"] == "runs") tokens += row["tokens"].get<double>();
    ++by_status[row["status"].get<std::string>()];
    const json& cal = row["calibration"];
    if (!cal.is_null() && row["status"] == "runs")  // what this plan would calibrate
      calibrations[cal["file"].is_null() ? r.key : cal["file"].get<std::string>()] = cal;
    runs.push_back(std::move(row));
  }
  int cached = 0;
  for (const auto& [file, cal] : calibrations.items()) cached += cal["cached"].get<bool>();
  json status = json::object();
  for (const auto& [s, n] : by_status) status[s] = n;
  return {{"model", {{"dir", cfg_.model_dir},
                     {"name", cfg_.model_name.empty() ? mc_.name_or_path.empty() ? cfg_.model_dir : mc_.name_or_path
                                                      : cfg_.model_name},
                     {"architecture", mc_.model_type},
                     {"parameters", mc_.n_params()},
                     {"layers", mc_.n_layers},
                     {"q_heads", mc_.n_heads},
                     {"kv_heads", mc_.n_kv_heads},
                     {"head_dim", mc_.head_dim},
                     {"weights", "random (dummy): timing only"}}},
          {"device", dev_.device},
          {"runner", runner_},
          {"config", {{"ctx", cfg_.ctx},
                      {"domains", [&] {
                         json d = json::array();
                         for (const EvalDomain& e : data_.domains) d.push_back(e.name);
                         return d;
                       }()},
                      {"windows", cfg_.eval_windows},
                      {"windows_counted", tokenized_ ? "in the eval texts' tokens" : "assumed (no tokenizer.json)"},
                      {"passkey_trials", cfg_.passkey_trials},
                      {"depths", depths_},
                      {"out", cfg_.out_dir}}},
          {"runs", std::move(runs)},
          {"calibrations", {{"files", calibrations}, {"count", calibrations.size()}, {"cached", cached}}},
          {"totals", {{"runs", plan.size()}, {"by_status", status}, {"tokens", tokens}, {"estimate_s", estimate},
                      {"caches_timed", timed_.size()}}},
          {"timing_s", since(t0)}};
}

std::string si(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}G", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

}  // namespace

json plan_referee(const RefereeConfig& cfg, const PlanDevice& dev, const RefereeLog& log) {
  const RefereeLog sink = log ? log : [](const std::string&, bool) {};
  return Rehearsal(cfg, dev, sink).run();
}

std::string referee_plan_table(const json& p) {
  const json& m = p["model"];
  const json& c = p["config"];
  std::string s = fmt::format(
      "kvq referee --plan: {} ({}, {:.2f}B parameters, {} layers, q{}/kv{}/d{}) on {}\n"
      "timed with random weights (timing only); sample: {} domain(s) x {} window(s) at ctx {} ({}), {} passkey "
      "trial(s) x {} depth(s)\n\n",
      m["name"].get<std::string>(), m["architecture"].get<std::string>(), m["parameters"].get<double>() / 1e9,
      m["layers"].get<int>(), m["q_heads"].get<int>(), m["kv_heads"].get<int>(), m["head_dim"].get<int>(),
      p["runner"].get<std::string>().empty() ? p["device"].get<std::string>() : p["runner"].get<std::string>(),
      c["domains"].size(), c["windows"].get<int>(), fmt::join(c["ctx"].get<std::vector<int>>(), ","),
      c["windows_counted"].get<std::string>(), c["passkey_trials"].get<int>(), c["depths"].size());
  s += "| # | run | protocol | status | calibration | tokens | s / window | s / prompt | estimate |\n"
       "|--:|-----|----------|--------|-------------|-------:|-----------:|-----------:|---------:|\n";
  int i = 0;
  for (const json& r : p["runs"]) {
    std::string cal = "-";
    if (!r["calibration"].is_null())
      cal = r["calibration"]["method"].get<std::string>() + (r["calibration"]["cached"].get<bool>() ? " (cached)" : "");
    std::vector<std::string> win, prompt;
    for (const json& at : r["per_ctx"])
      if (at.contains("window_s"))
        win.push_back(fmt::format("{:.2f}", at["window_s"].get<double>())),
            prompt.push_back(fmt::format("{:.2f}", at["prompt_s"].get<double>()));
    const std::string status = r["status"].get<std::string>();
    s += fmt::format("| {} | {} {} | {} | {} | {} | {} | {} | {} | {} |\n", ++i, r["method"].get<std::string>(),
                     r["windows"].get<std::string>(), r["protocol"].get<std::string>(), status, cal,
                     si(r["tokens"].get<double>()), win.empty() ? "-" : fmt::format("{}", fmt::join(win, " / ")),
                     prompt.empty() ? "-" : fmt::format("{}", fmt::join(prompt, " / ")),
                     status == "runs" ? referee_fmt_seconds(r["estimate_s"].get<double>()) : "-");
  }
  const json& t = p["totals"];
  const json& by = t["by_status"];
  auto count = [&](const char* k) { return by.value(k, 0); };
  s += fmt::format("\n{} runs: {} to run on {} (estimated {}, {} tokens forwarded), {} done earlier (OUT/runs), {} "
                   "refused by the device, {} cannot run on this model\n",
                   t["runs"].get<int>(), count("runs"), p["device"].get<std::string>(),
                   referee_fmt_seconds(t["estimate_s"].get<double>()), si(t["tokens"].get<double>()), count("done"),
                   count("refused"), count("cannot run"));
  for (const json& r : p["runs"])
    if (r["status"] == "refused" || r["status"] == "cannot run")
      s += fmt::format("  {} {}: {}\n", r["key"].get<std::string>(), r["status"].get<std::string>(),
                       r["reason"].get<std::string>());
  const json& cal = p["calibrations"];
  if (cal["count"].get<int>() > 0)
    s += fmt::format(
        "calibrations before their runs (on the CPU, not in the estimate): {}, {} cached in OUT/rotations\n",
        cal["count"].get<int>(), cal["cached"].get<int>());
  s += fmt::format("timed {} distinct cache(s) in {}\n", t["caches_timed"].get<int>(),
                   referee_fmt_seconds(p["timing_s"].get<double>()));
  return s;
}

}  // namespace kvq
