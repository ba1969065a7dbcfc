// The referee's run records and results.json (referee/results.h).
#include "referee/results.h"

#include <sys/utsname.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include "codecs/pnmix/codec_pnmix.h"
#include "common/version.h"
#include "model/config.h"
#include "referee/bands.h"
#include "referee/claims.h"
#include "referee/eviction.h"
#include "referee/io.h"
#include "referee/pooled.h"
#include "referee/view.h"

namespace kvq {

using nlohmann::json;

namespace {

json machine_json(int threads) {
  json m;
  struct utsname u {};
  if (uname(&u) == 0)
    m = {{"sysname", u.sysname}, {"nodename", u.nodename}, {"release", u.release}, {"version", u.version},
         {"machine", u.machine}};
  std::string cpu = "unknown";
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      cpu = line.substr(line.find(':') + 1);
      cpu.erase(0, cpu.find_first_not_of(' '));
      break;
    }
  m["cpu_model"] = cpu;
  m["hardware_threads"] = std::thread::hardware_concurrency();
  m["threads"] = threads;
  return m;
}

json rotation_json(const RefereeConfig& cfg, const RefereeData& data, const PlannedRun& r, const Rotation& rot,
                   const json& settings) {
  const bool calibrated = r.method.needs_calibration();
  const std::string name = rot.transform ? rot.transform->name
                           : rot.pair_bits ? rot.pair_bits->name
                           : rot.kv_scales ? "fp8-scales"
                                           : "none";
  return {{"name", name},
          {"file", rot.file.empty() ? json(nullptr) : json(rot.file)},
          {"reused", rot.reused},
          {"calibration_seconds", rot.seconds},
          {"calib_data", calibrated ? json(run_calib_text(cfg, data, r).file) : json(nullptr)},
          {"calib_sha256", calibrated ? settings["calibration"]["sha256"] : json(nullptr)},
          {"heads_total", rot.meta.value("heads_total", 0)},
          {"heads_key_kept", rot.meta.value("heads_key_kept", 0)},
          {"heads_value_kept", rot.meta.value("heads_value_kept", 0)}};
}

// results.json "leakage": the leakage row against the same method and windows calibrated on disjoint data, on the
// leakage domain and pooled; null without a leakage row.
json leakage_json(const RefereeConfig& cfg, const RefereeData& data, const std::vector<RefereeRun>& runs) {
  const RefereeRun *leak = nullptr, *disjoint = nullptr;
  for (const RefereeRun& r : runs) {
    if (r.record.value("leakage", false)) leak = &r;
  }
  if (!leak) return nullptr;
  for (const RefereeRun& r : runs)
    if (!r.record.value("leakage", false) && run_protocol(r.record) == "common" &&
        r.record["method"]["label"] == leak->record["method"]["label"] &&
        r.record["windows"] == leak->record["windows"])
      disjoint = &r;
  const std::string domain = data.domains[size_t(data.leak_domain)].name;
  const std::string ctx = std::to_string(cfg.ctx.front());
  json j = {{"method", leak->record["method"]["label"]},
            {"windows", leak->record["windows"]["label"]},
            {"domain", domain},
            {"ctx", cfg.ctx.front()},
            {"leak_key", leak->key},
            {"leak_calibration", leak->record["rotation"]["calib_data"]},
            {"disjoint_key", disjoint ? json(disjoint->key) : json(nullptr)}};
  auto grab = [&](const RefereeRun* r, const char* prefix) {
    if (!r) return;
    const json& res = r->record["results"];
    j[std::string(prefix) + "_ppl_domain"] = res["ppl"][ctx][domain]["ppl"];
    j[std::string(prefix) + "_ppl_domain_ci95"] = res["ppl"][ctx][domain]["ci95"];
    j[std::string(prefix) + "_kl_domain"] = res["kl"][ctx][domain]["kl_mean"];
    j[std::string(prefix) + "_kl_domain_ci95"] = res["kl"][ctx][domain]["kl_ci95"];
    const std::string pooled = res["ppl"][ctx].contains("all") ? "all" : domain;
    j[std::string(prefix) + "_ppl_all"] = res["ppl"][ctx][pooled]["ppl"];
    j[std::string(prefix) + "_kl_all"] = res["kl"][ctx][pooled]["kl_mean"];
  };
  grab(leak, "leak");
  grab(disjoint, "disjoint");
  return j;
}

json config_json(const RefereeConfig& cfg) {
  json methods = json::array(), windows = json::array(), protocols = json::array();
  for (const RefereeMethod& m : cfg.methods) methods.push_back(m.label);
  for (const RefereeWindows& w : cfg.windows) windows.push_back(w.label());
  for (RefereeProtocol p : cfg.protocols) protocols.push_back(protocol_name(p));
  return {{"ctx", cfg.ctx},
          {"methods", methods},
          {"windows", windows},
          {"protocols", protocols},
          {"eval_windows", cfg.eval_windows},
          {"passkey_trials", cfg.passkey_trials},
          {"depths", cfg.depths.empty() ? EvalConfig::default_depths() : cfg.depths},
          {"bootstrap", cfg.bootstrap},
          {"group", cfg.group},
          {"layer_skip", "none"},
          {"layers_ctx", cfg.ctx.front()},
          {"calibration", {{"tokens", cfg.calib_tokens}, {"chunk", cfg.calib_chunk}, {"steps", cfg.calib_steps}}},
          {"quick", cfg.quick},
          {"leakage", cfg.leakage},
          {"device", cfg.device}};
}

// results.json "notes": the protocol, in words, then each method row's own note (every row of the table, whichever
// were run), then the CIs and the bits.
json notes_json(const RefereeConfig& cfg, const RefereeData& data) {
  json notes = {
      "Every run: same model, same eval windows and passkey prompts (same seeds), same group (" +
          std::to_string(cfg.group) + ", for the formats that take one).",
      "Protocol 'common' (METHODS §5, §7): decode-faithful (METHODS §2), the window settings above, no layer "
      "skipped, clips tuned where the format has one, llama.cpp's attn_rot off (its rows are its formats alone); "
      "the codecs' own transforms (TurboQuant's and OScaR's Hadamard) stay, they are part of the formats.",
      "Protocol 'as-shipped': each camp's own windows, layer skip (TurboQuant: 0, 1, L-2, L-1 in BF16), llama.cpp's "
      "attn_rot on, and its prompt policy (TurboQuant and OScaR: exact-prompt; NexusQuant: quantize-after-prompt; "
      "the others decode-faithful). Every as-shipped row, its bf16 reference included, scores the same tokens: the "
      "second half of each window, after a prompt of its first half. Rows read '<method>, as shipped'; their ppl "
      "and KL compare only with the as-shipped bf16 run, never with common-protocol rows.",
      "bf16 is run once: sink/recent windows do not change a BF16 cache (its windows column reads 'any').",
      "Every run also records its NLL over the last 1/16 of each window (results.ppl[ctx][domain].tail) and its KL and "
      "top-1 against bf16 over the rows predicting those targets (results.kl[ctx][domain].tail), from the same pass: "
      "the eviction row (prompt policy evict under both protocols) scores only those targets, after a prompt of the "
      "first 15/16, and is paired with every other run on them (bands, unseen domains; in the eviction section its NLL "
      "and its KL and top-1 against the paired row's). Its per-layer errors are its own, over every row.",
      "Calibrated methods (int2+oscar, optr*) were calibrated on " + cfg.calib_data + " (sha256 " +
          data.calib_sha256.substr(0, 16) + "…), checked disjoint from every file of " + cfg.eval_dir +
          " by path and sha256; a calibration file may come from the same domain as an eval file (another part of "
          "the text), which the check allows.",
      "OptR rotations are calibrated for the int2 grid (group " + std::to_string(cfg.group) + ", clips " +
          (cfg.clip_grid.empty() ? std::string("0.96/0.92")
                                 : std::string("tuned for their base rotation, see the clip table")) +
          ") and the windows of their row; OSCAR's are grid- and window-independent (one file).",
      cfg.clip_grid.empty()
          ? std::string("INT2 clips are METHODS' defaults (keys 0.96, values 0.92); --clip-grid tunes them.")
          : "INT2 clips: per method and windows, the (key, value) pair of the grid with the lowest ppl on " +
                std::to_string(cfg.tune_windows) + " held-out window(s) at ctx " + std::to_string(cfg.ctx.front()) +
                " from the end of " + cfg.calib_data + ", past the calibration budget (METHODS §7)."};
  for (const RefereeMethod& m : referee_methods()) {
    if (!m.note.empty()) notes.push_back(m.note);
    const std::string shipped = m.camp + ", as shipped: " + m.shipped.note + ".";  // one line per camp
    if (!m.shipped.note.empty() && std::find(notes.begin(), notes.end(), shipped) == notes.end())
      notes.push_back(shipped);
  }
  notes.push_back(
      "CIs: percentile bootstrap over eval windows (ppl, KL, top-1; with one window per domain a per-domain interval "
      "is degenerate, lo = hi) and Wilson intervals over passkey trials.");
  notes.push_back(
      "Effective bits: bytes actually stored per token per layer (scales, zeros and BF16 windows included) at the "
      "stated context (METHODS §6).");
  notes.push_back(
      "The leakage row calibrates optr(oscar) on an eval file itself (the evaluated domain with the most text) to "
      "show how much same-text calibration flatters a method.");
  return notes;
}

}  // namespace

json method_json(const RefereeMethod& m) {
  return {{"label", m.label}, {"type", m.type()}, {"window_type", m.window_type}, {"rotation", m.rotation},
          {"base", m.base}, {"objective", m.objective}, {"camp", m.camp}, {"kvq_extension", m.kvq_extension},
          {"equal_bytes", m.equal_bytes}};
}

void add_run_fields(json& rec, const RefereeConfig& cfg, const RefereeData& data, const PlannedRun& r,
                    const Rotation& rot, const json& settings, int threads) {
  rec["key"] = r.key;
  rec["method"] = method_json(r.method);
  rec["windows"] = {{"sink", r.windows.sink}, {"recent", r.windows.recent}, {"label", run_windows_label(r)}};
  rec["leakage"] = r.leakage;
  rec["protocol"] = {{"name", protocol_name(r.protocol)},
                     {"prompt_policy", settings["prompt_policy"]},
                     {"prompt", settings["prompt"]},
                     {"layer_skip", settings["layer_skip"]},
                     {"attn_rot", settings["attn_rot"]},
                     {"note", r.protocol == RefereeProtocol::AsShipped ? r.method.shipped.note : ""},
                     {"prompt_tokens", json::object()}};
  for (int ctx : cfg.ctx) rec["protocol"]["prompt_tokens"][std::to_string(ctx)] = run_prompt_tokens(r, ctx);
  rec["rotation"] = rotation_json(cfg, data, r, rot, settings);
  rec["settings"] = settings;
  rec["date"] = referee_utc_now();  // when this run was made (a resumed run keeps its own date)
  rec["threads"] = threads;
}

namespace {

// The evaluated model: its directory and fingerprint (what resume checks), and the name and size its verdicts carry
// (referee/claims.h: referee_model_label).
json model_json(const RefereeConfig& cfg, const RefereeData& data) {
  const ModelConfig mc = ModelConfig::load(cfg.model_dir + "/config.json");
  std::string dir = cfg.model_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string name = !cfg.model_name.empty() ? cfg.model_name : !mc.name_or_path.empty() ? mc.name_or_path : dir;
  return {{"dir", cfg.model_dir}, {"fingerprint", data.fingerprint}, {"name", name}, {"parameters", mc.n_params()},
          {"model_type", mc.model_type}};
}

}  // namespace

json referee_results_json(const RefereeConfig& cfg, const RefereeData& data, const RefereeOutcome& o) {
  json j;
  j["kvq"] = {{"version", KVQ_VERSION}, {"git", git_describe()}};
  j["date"] = referee_utc_now();
  j["machine"] = machine_json(o.threads);
  j["model"] = model_json(cfg, data);
  j["calibration_data"] = {{"file", cfg.calib_data}, {"sha256", data.calib_sha256}, {"bytes", data.calib_bytes},
                           {"tokens", data.calib_ids.size()}};
  json eval_data = json::array();
  for (const EvalDomain& d : data.domains)
    eval_data.push_back({{"domain", d.name}, {"file", d.path}, {"sha256", d.sha256}, {"bytes", d.bytes},
                         {"tokens", d.ids.size()}});
  j["eval_data"] = eval_data;
  j["config"] = config_json(cfg);
  j["seeds"] = {{"seed", cfg.seed}};
  json runs = json::array(), runners = json::array();
  for (const RefereeRun& r : o.res.runs) {
    runs.push_back(r.record);
    const json where = r.record.value("runner", json("unknown"));
    if (std::find(runners.begin(), runners.end(), where) == runners.end()) runners.push_back(where);
  }
  j["runs"] = runs;
  j["runners"] = runners;
  j["missing_runs"] = o.missing;
  j["leakage"] = leakage_json(cfg, data, o.res.runs);
  j["counters"] = {{"runs_total", o.runs_total}, {"runs_executed", o.res.runs_executed},
                   {"runs_resumed", o.res.runs_resumed}, {"runs_missing", int(o.missing.size())},
                   {"calibrations_run", o.res.calibrations_run}, {"calibrations_reused", o.res.calibrations_reused}};
  j["notes"] = notes_json(cfg, data);
  j["unseen"] = referee_unseen_json(j);  // pooled over the eval domains other than the calibration one
  j["bands"] = referee_bands_json(j);    // equal bits: per protocol and ctx (referee/bands.h)
  j["pareto"] = referee_pareto_json(j);  // the Pareto series of report.html, from the bands
  j["eviction"] = referee_eviction_json(j);  // eviction rows beside their rows of equal bytes (referee/eviction.h)
  j["claims"] = referee_claims_json(j);  // the camps' claims against the bands' figures (referee/claims.h)
  j["claims_rule"] = claim_rule_text();
  j["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - o.start).count();
  return j;
}

}  // namespace kvq
