// kvq referee driver: plans the (method, windows) matrix, calibrates or reuses rotation files, runs kvq::evaluate
// per run (resumable), and writes results.json, report.md and report.html.
#include "eval/referee.h"

#include <sys/utsname.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "calib/calibrate.h"
#include "common/error.h"
#include "common/sha256.h"
#include "common/version.h"
#include "eval/evaluator.h"
#include "eval/perplexity.h"
#include "eval/referee_pooled.h"
#include "model/safetensors.h"
#include "rotation/rotation_file.h"

namespace kvq {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string read_text(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  KVQ_CHECK(f, "cannot open {} '{}'", what, path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Writes through a temporary file and a rename, so an interrupted referee never leaves half a json behind.
void write_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    KVQ_CHECK(f, "cannot write '{}'", tmp);
    f << text;
    KVQ_CHECK(f.good(), "cannot write '{}'", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  KVQ_CHECK(!ec, "cannot rename '{}' to '{}': {}", tmp, path, ec.message());
}

// "optr(oscar)" -> "optr_oscar": file-name safe.
std::string slug(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

// The cache of a method at a window setting, exactly as the CLI's cache flags would build it (METHODS §1: clip
// 0.96 / 0.92 at int2, none at 4 and 8 bits; KIVI keys per channel, plain min/max).
CacheConfig method_cache(const RefereeMethod& m, const RefereeWindows& w, int group) {
  CacheConfig c;
  auto spec = [&](bool is_key) {
    CodecSpec s;
    s.type = m.type;
    s.group = group;
    s.clip = m.type == "int2" ? (is_key ? 0.96f : 0.92f) : 1.0f;
    if (m.type.rfind("kivi", 0) == 0) s.per_channel = is_key, s.clip = 1.0f;
    return s;
  };
  c.k = spec(true);
  c.v = spec(false);
  c.sink = w.sink;
  c.recent = w.recent;
  return c;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

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

std::string fmt_seconds(double s) {
  if (s < 0) return "?";
  const long t = long(s + 0.5);
  return t >= 3600 ? fmt::format("{}h{:02}m", t / 3600, t / 60 % 60) : fmt::format("{}m{:02}s", t / 60, t % 60);
}

struct Rotation {
  std::shared_ptr<const KvTransform> transform;  // null: none
  std::string file;                              // rotation file (empty: none / data-free)
  bool reused = false;                           // read from OUT/rotations/ instead of calibrated now
  double seconds = 0;                            // calibration seconds (of the original calibration when reused)
  json meta = json::object();                    // the file's metadata
};

struct PlannedRun {
  RefereeMethod method;
  RefereeWindows windows;
  bool leakage = false;  // calibrated on an eval file (same domain) on purpose
  std::string key;
};

// The quantile clips of a run's keys and values: METHODS' defaults, or the best pair of the clip grid.
struct ClipChoice {
  float k = 1, v = 1;          // clip ratios of keys and values
  std::string tuned_on;        // the method whose cache was tuned (OptR: its base); empty: defaults, no tuning
  json grid = json::array();   // [[clip_k, clip_v, held-out ppl], ...] in grid order
  json to_json() const { return {{"k", k}, {"v", v}, {"tuned_on", tuned_on}, {"grid", grid}}; }
};

class Referee {
 public:
  Referee(const RefereeConfig& cfg, const RefereeLog& log) : cfg_(cfg), log_(log) {}
  RefereeResult run();

 private:
  void say(const std::string& s, bool transient = false) {
    if (log_) log_(s, transient);
  }
  void validate_inputs();
  void load_data();
  Model& model();
  CalibrateConfig calib_config(const PlannedRun& r, const ClipChoice* clips = nullptr) const;
  // True when --clip-grid tunes this method's clips: INT2 methods only (the other codecs have no clip to tune).
  bool tunes_clips(const RefereeMethod& m) const { return !cfg_.clip_grid.empty() && m.type == "int2"; }
  ClipChoice clips_for(const PlannedRun& r);
  RunnerFactory runners();
  void check_calibrations(const std::vector<PlannedRun>& plan) const;
  Rotation rotation_for(const PlannedRun& r);
  json settings_for(const PlannedRun& r) const;
  json evaluate_run(const PlannedRun& r, const Rotation& rot, int index, int total, double avg_run_s, int left);
  json leakage_json(const std::vector<RefereeRun>& runs) const;

  const RefereeConfig& cfg_;
  RefereeLog log_;
  std::string fingerprint_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<Model> model_;
  std::vector<EvalDomain> domains_;         // evaluated domains, tokenized
  std::vector<std::string> all_eval_files_;
  std::string calib_text_sha_;
  size_t calib_bytes_ = 0;
  std::vector<int32_t> calib_ids_;
  int leak_domain_ = -1;                    // index into domains_ of the leakage row's calibration file
  std::map<std::string, Rotation> rotations_;  // by file path, this invocation
  std::map<std::string, ClipChoice> clips_;    // by "<tuned method>@<windows>", this invocation
  RefereeResult res_;
};

void Referee::validate_inputs() {
  const RefereeConfig& c = cfg_;
  KVQ_CHECK(!c.out_dir.empty(), "referee: no output directory (-o)");
  KVQ_CHECK(fs::is_regular_file(c.calib_data), "calibration data '{}' is not a file", c.calib_data);
  all_eval_files_ = list_eval_files(c.eval_dir);
  check_calibration_disjoint(c.calib_data, c.eval_dir);
  KVQ_CHECK(!c.methods.empty(), "referee: no methods");
  KVQ_CHECK(!c.windows.empty(), "referee: no window settings");
  KVQ_CHECK(!c.ctx.empty(), "referee: no context lengths");
  for (int ctx : c.ctx) KVQ_CHECK(ctx >= 2, "referee: context {} is too short", ctx);
  KVQ_CHECK(c.passkey_trials >= 1, "referee: --passkey-trials {} must be >= 1", c.passkey_trials);
  KVQ_CHECK(c.eval_windows >= 0, "referee: --windows {} must be >= 0", c.eval_windows);
  KVQ_CHECK(c.group == 128 || c.group == 64 || c.group == 32, "referee: group {} must be 128, 64 or 32", c.group);
  for (double d : c.depths) KVQ_CHECK(d >= 0 && d <= 1, "referee: passkey depth {} outside [0, 1]", d);
  for (size_t i = 0; i < c.clip_grid.size(); ++i) {
    KVQ_CHECK(c.clip_grid[i] >= 0.01f && c.clip_grid[i] <= 1.f, "referee: clip {} outside [0.01, 1]", c.clip_grid[i]);
    for (size_t j = 0; j < i; ++j)
      KVQ_CHECK(c.clip_grid[j] != c.clip_grid[i], "referee: clip {} is listed twice", c.clip_grid[i]);
  }
  KVQ_CHECK(c.tune_windows >= 1, "referee: --tune-windows {} must be >= 1", c.tune_windows);
  for (const std::string& d : c.domains) {
    const bool found = std::any_of(all_eval_files_.begin(), all_eval_files_.end(),
                                   [&](const std::string& f) { return fs::path(f).stem() == d; });
    KVQ_CHECK(found, "referee: eval domain '{}' has no file {}/{}.txt", d, c.eval_dir, d);
  }
}

void Referee::load_data() {
  fingerprint_ = Checkpoint::open(cfg_.model_dir).fingerprint();
  tok_ = std::make_unique<Tokenizer>(Tokenizer::load(cfg_.model_dir + "/tokenizer.json"));
  for (const std::string& f : all_eval_files_) {
    const std::string stem = fs::path(f).stem().string();
    if (!cfg_.domains.empty() && std::find(cfg_.domains.begin(), cfg_.domains.end(), stem) == cfg_.domains.end())
      continue;
    EvalDomain d;
    d.path = f;
    d.name = stem;
    const std::string text = read_text(f, "eval text");
    KVQ_CHECK(!text.empty(), "eval text '{}' is empty", f);
    d.bytes = text.size();
    d.sha256 = sha256_hex(text);
    d.ids = tok_->encode(text);
    domains_.push_back(std::move(d));
  }
  const std::string calib = read_text(cfg_.calib_data, "calibration data");
  calib_bytes_ = calib.size();
  calib_text_sha_ = sha256_hex(calib);
  calib_ids_ = tok_->encode(calib);
  for (size_t i = 0; i < domains_.size(); ++i)
    if (leak_domain_ < 0 || domains_[i].bytes > domains_[size_t(leak_domain_)].bytes) leak_domain_ = int(i);
}

Model& Referee::model() {
  if (!model_) {
    say(fmt::format("kvq: referee: loading {}", cfg_.model_dir));
    model_ = Model::load(cfg_.model_dir, cfg_.threads);
    KVQ_CHECK(model_->fingerprint() == fingerprint_, "model '{}' changed while the referee ran", cfg_.model_dir);
  }
  return *model_;
}

json Referee::settings_for(const PlannedRun& r) const {
  json data = json::array();
  for (const EvalDomain& d : domains_) data.push_back({{"domain", d.name}, {"sha256", d.sha256}});
  json s = {{"model_fingerprint", fingerprint_},
            {"eval_data", data},
            {"ctx", cfg_.ctx},
            {"eval_windows", cfg_.eval_windows},
            {"passkey_trials", cfg_.passkey_trials},
            {"depths", cfg_.depths.empty() ? EvalConfig::default_depths() : cfg_.depths},
            {"bootstrap", cfg_.bootstrap},
            {"seed", cfg_.seed},
            {"group", cfg_.group},
            {"layer_skip", "none"},
            {"method", r.method.label},
            {"sink", r.windows.sink},
            {"recent", r.windows.recent},
            {"device", cfg_.device},
            {"kvq_version", KVQ_VERSION}};
  // Only tuned runs record the grid: the other runs stay valid, and resume, whatever the grid.
  if (tunes_clips(r.method))
    s["clip_tuning"] = {{"grid", cfg_.clip_grid}, {"windows", cfg_.tune_windows}};
  if (r.method.needs_calibration()) {
    const bool leak = r.leakage && leak_domain_ >= 0;
    s["calibration"] = {{"sha256", leak ? domains_[size_t(leak_domain_)].sha256 : calib_text_sha_},
                        {"tokens", cfg_.calib_tokens},
                        {"chunk", cfg_.calib_chunk},
                        {"steps", cfg_.calib_steps}};
  }
  return s;
}

CalibrateConfig Referee::calib_config(const PlannedRun& r, const ClipChoice* clips) const {
  const RefereeMethod& m = r.method;
  CalibrateConfig cc;
  cc.method = m.rotation;
  cc.base = m.rotation == "optr" ? m.base : "oscar";
  cc.objective = m.rotation == "optr" ? m.objective : "post-wo";
  cc.tokens = cfg_.calib_tokens;
  cc.chunk = cfg_.calib_chunk;
  cc.steps = cfg_.calib_steps;
  // OptR is calibrated for the row's int2 grid and windows; OSCAR's statistics do not depend on them.
  cc.cache = method_cache(m, m.rotation == "optr" ? r.windows : RefereeWindows{0, 0}, cfg_.group);
  if (clips && m.rotation == "optr") cc.cache.k.clip = clips->k, cc.cache.v.clip = clips->v;
  return cc;
}

RunnerFactory Referee::runners() { return cfg_.runners ? cfg_.runners(model()) : cpu_runner_factory(model()); }

ClipChoice Referee::clips_for(const PlannedRun& r) {
  const CacheConfig defaults = method_cache(r.method, r.windows, cfg_.group);
  ClipChoice out;
  out.k = defaults.k.clip;
  out.v = defaults.v.clip;
  if (!tunes_clips(r.method)) return out;
  // OptR's rotation is learned for one grid: it takes the clips tuned for its base rotation.
  const RefereeMethod tuned =
      r.method.rotation == "optr" ? parse_referee_methods("int2+" + r.method.base).front() : r.method;
  const std::string mem_key = tuned.label + "@" + r.windows.label();
  if (auto it = clips_.find(mem_key); it != clips_.end()) return it->second;
  const int ctx = cfg_.ctx.front();
  const json spec = {{"model_fingerprint", fingerprint_}, {"calib_sha256", calib_text_sha_}, {"method", tuned.label},
                     {"sink", r.windows.sink}, {"recent", r.windows.recent}, {"group", cfg_.group},
                     {"grid", cfg_.clip_grid}, {"ctx", ctx}, {"windows", cfg_.tune_windows},
                     {"kvq_version", KVQ_VERSION}};  // not the device: tune on one machine, evaluate on another
  const fs::path file = fs::path(cfg_.out_dir) / "clips" /
                        (slug(tuned.label) + "-" + sha256_hex(spec.dump()).substr(0, 16) + ".json");
  out.tuned_on = tuned.label;
  bool cached = false;
  if (fs::exists(file)) {
    try {
      const json j = json::parse(read_text(file.string(), "clip choice"));
      if (j.value("spec", json()) == spec) {
        out.k = j.at("k").get<float>();
        out.v = j.at("v").get<float>();
        out.grid = j.at("grid");
        cached = true;
      }
    } catch (const json::exception&) {
      say(fmt::format("kvq: referee: {} is not a valid clip choice; tuning again", file.string()));
    }
  }
  if (!cached) {
    // Held-out text: the last windows of the calibration file, past the calibration budget (check_calibrations).
    const size_t n = size_t(cfg_.tune_windows) * size_t(ctx);
    const std::vector<int32_t> tail(calib_ids_.end() - std::ptrdiff_t(n), calib_ids_.end());
    const Rotation rot = rotation_for({tuned, r.windows, false, ""});  // none, quarot or OSCAR (grid-independent)
    const RunnerFactory make = runners();
    std::string where;
    double best = std::numeric_limits<double>::infinity();
    for (float ck : cfg_.clip_grid)
      for (float cv : cfg_.clip_grid) {
        CacheConfig c = method_cache(tuned, r.windows, cfg_.group);
        c.k.clip = ck;
        c.v.clip = cv;
        c.transform = rot.transform;
        const std::unique_ptr<Runner> runner = make(c, ctx);
        where = runner->describe();
        const double ppl = perplexity(*runner, tail, ctx, cfg_.tune_windows).ppl();
        say(fmt::format("kvq: referee: clips of {} {}: keys {} values {}: held-out ppl {:.4f}", tuned.label,
                        r.windows.label(), ck, cv, ppl), true);
        out.grid.push_back({ck, cv, ppl});
        if (ppl < best) best = ppl, out.k = ck, out.v = cv;  // the first of equal pairs in grid order
      }
    fs::create_directories(file.parent_path());
    const json j = {{"spec", spec}, {"k", out.k}, {"v", out.v}, {"grid", out.grid}, {"runner", where}};
    write_atomic(file.string(), j.dump(1));
    say(fmt::format("kvq: referee: clips of {} {}: keys {} values {} (held-out ppl {:.4f})", tuned.label,
                    r.windows.label(), out.k, out.v, best));
  }
  clips_[mem_key] = out;
  return out;
}

// Every calibration the plan may need is checked before the first run: budget, chunk, windows and data length.
void Referee::check_calibrations(const std::vector<PlannedRun>& plan) const {
  const ModelConfig mc = ModelConfig::load(cfg_.model_dir + "/config.json");
  for (const PlannedRun& r : plan) {
    if (!r.method.needs_calibration()) continue;
    const CalibrateConfig cc = calib_config(r);
    cc.validate(mc);
    const size_t need = size_t(cc.chunk) * size_t(cc.method == "optr" ? cc.calib_chunks + cc.heldout_chunks : 1);
    const bool leak = r.leakage;
    const size_t have = leak ? domains_[size_t(leak_domain_)].ids.size() : calib_ids_.size();
    KVQ_CHECK(have >= need, "referee: {} needs {} calibration tokens ({} chunk(s) of {}), '{}' has {}", r.method.label,
              need, need / size_t(cc.chunk), cc.chunk, leak ? domains_[size_t(leak_domain_)].path : cfg_.calib_data,
              have);
  }
  // Clip tuning reads the end of the calibration file, which must lie past the calibration budget.
  if (std::any_of(plan.begin(), plan.end(), [&](const PlannedRun& r) { return tunes_clips(r.method); })) {
    const size_t held_out = size_t(cfg_.tune_windows) * size_t(cfg_.ctx.front());
    KVQ_CHECK(calib_ids_.size() >= size_t(cfg_.calib_tokens) + held_out,
              "referee: clip tuning needs {} held-out tokens ({} x {}) past the {}-token calibration budget; '{}' has "
              "{} in all", held_out, cfg_.tune_windows, cfg_.ctx.front(), cfg_.calib_tokens, cfg_.calib_data,
              calib_ids_.size());
  }
}

Rotation Referee::rotation_for(const PlannedRun& r) {
  const RefereeMethod& m = r.method;
  Rotation rot;
  const ModelConfig& mc = model().config();
  if (m.rotation == "none") return rot;
  if (m.rotation == "quarot") {
    auto t = std::make_shared<KvTransform>(hadamard_transform(mc.n_layers, mc.n_kv_heads, mc.head_dim));
    t->name = "quarot";
    rot.transform = std::move(t);
    return rot;
  }
  // OptR is calibrated for the clips its row is evaluated with (tuned through its base, never through OptR itself);
  // OSCAR's statistics do not depend on the grid.
  const bool optr = m.rotation == "optr";
  const ClipChoice clips = optr ? clips_for(r) : ClipChoice{};
  const CalibrateConfig cc = calib_config(r, optr ? &clips : nullptr);
  const bool leak = r.leakage;
  const std::string data_file = leak ? domains_[size_t(leak_domain_)].path : cfg_.calib_data;
  const std::string data_sha = leak ? domains_[size_t(leak_domain_)].sha256 : calib_text_sha_;
  json key = {{"model_fingerprint", fingerprint_}, {"calib_sha256", data_sha}, {"method", cc.method},
              {"base", cc.base}, {"objective", cc.objective}, {"tokens", cc.tokens}, {"chunk", cc.chunk},
              {"n_queries", cc.n_queries}, {"calib_chunks", cc.calib_chunks}, {"heldout_chunks", cc.heldout_chunks},
              {"steps", cc.steps}, {"lr", cc.lr}, {"lambda_k", cc.lambda_k}, {"center_keys", cc.center_keys},
              {"type", cc.cache.k.type}, {"group", cc.cache.k.group}, {"clip_k", cc.cache.k.clip},
              {"clip_v", cc.cache.v.clip}, {"sink", cc.cache.sink}, {"recent", cc.cache.recent},
              {"kvq_version", KVQ_VERSION}};
  const std::string name = slug(m.label) + "-" + sha256_hex(key.dump()).substr(0, 16) + ".safetensors";
  rot.file = (fs::path(cfg_.out_dir) / "rotations" / name).string();
  if (auto it = rotations_.find(rot.file); it != rotations_.end()) {
    Rotation again = it->second;
    again.reused = true;
    ++res_.calibrations_reused;
    return again;
  }
  if (fs::exists(rot.file)) {
    RotationFile f = load_rotation_file(rot.file);
    check_rotation_fits(f, fingerprint_, mc.n_layers, mc.n_kv_heads, mc.head_dim, cc.cache);
    KVQ_CHECK(f.meta.value("calib_sha256", "") == data_sha, "cached rotation file '{}' was calibrated on other data",
              rot.file);
    rot.transform = std::make_shared<KvTransform>(std::move(f.transform));
    rot.meta = f.meta;
    rot.reused = true;
    rot.seconds = f.meta.value("capture_seconds", 0.0) + f.meta.value("optimise_seconds", 0.0);
    ++res_.calibrations_reused;
    say(fmt::format("kvq: referee: reusing cached rotation {}", rot.file));
  } else {
    const std::vector<int32_t>& ids = leak ? domains_[size_t(leak_domain_)].ids : calib_ids_;
    say(fmt::format("kvq: referee: calibrating {} on {} ({} tokens of budget {}, chunk {}{})", m.label, data_file,
                    ids.size(), cc.tokens, cc.chunk,
                    m.rotation == "optr" ? fmt::format(", {} steps, windows {}", cc.steps, r.windows.label()) : ""));
    CalibrateReport rep;
    KvTransform t = calibrate(model(), ids, cc, &rep, [&](const char* stage, int done, int total) {
      say(fmt::format("kvq: calibrate {} {} {}/{}", m.label, stage, done, total), true);
    });
    say(fmt::format("kvq: calibrated {} in {:.1f} s", m.label, rep.capture_seconds + rep.optimise_seconds));
    json meta = calibration_metadata(cc, t, rep, fingerprint_, data_file, data_sha);
    meta["referee_key"] = key;
    save_rotation_file(rot.file, t, meta);
    rot.meta = meta;
    rot.seconds = rep.capture_seconds + rep.optimise_seconds;
    rot.transform = std::make_shared<KvTransform>(std::move(t));
    ++res_.calibrations_run;
  }
  rotations_[rot.file] = rot;
  return rot;
}

json Referee::evaluate_run(const PlannedRun& r, const Rotation& rot, int index, int total, double avg_run_s,
                           int left) {
  const ClipChoice clips = clips_for(r);
  const CacheConfig cache = [&] {
    CacheConfig c = method_cache(r.method, r.windows, cfg_.group);
    c.k.clip = clips.k;
    c.v.clip = clips.v;
    c.transform = rot.transform;
    return c;
  }();
  Model& m = model();
  const RunnerFactory make = runners();
  auto progress = [&](const std::string& stage, double frac, double eta) {
    const double rest = avg_run_s > 0 && eta >= 0 ? eta + avg_run_s * left : -1;
    say(fmt::format("kvq: run {}/{} {} {}: {} {:5.1f}%  ETA run {}, all {}", index, total, r.method.label,
                    r.windows.label(), stage, 100 * frac, fmt_seconds(eta), fmt_seconds(rest)),
        true);
  };
  // layers at the first ctx only; ppl, kl and passkey at every ctx (one evaluate() per group, merged)
  json out;
  for (int part = 0; part < 2; ++part) {
    EvalConfig ec;
    ec.tasks = part == 0 ? std::vector<std::string>{"ppl", "kl", "passkey", "layers"}
                         : std::vector<std::string>{"ppl", "kl", "passkey"};
    ec.ctx = part == 0 ? std::vector<int>{cfg_.ctx.front()} : std::vector<int>(cfg_.ctx.begin() + 1, cfg_.ctx.end());
    if (ec.ctx.empty()) break;
    ec.windows = cfg_.eval_windows;
    ec.passkey_trials = cfg_.passkey_trials;
    if (!cfg_.depths.empty()) ec.depths = cfg_.depths;
    ec.seed = cfg_.seed;
    ec.bootstrap = cfg_.bootstrap;
    std::vector<EvalDomain> ds;
    for (const EvalDomain& d : domains_) ds.push_back(d);
    const json j = report_json(evaluate(m, make, *tok_, cache, std::move(ds), ec, progress));
    if (part == 0) {
      out = j;
    } else {
      out["cache"]["footprint"].update(j["cache"]["footprint"]);
      out["seeds"].update(j["seeds"]);
      for (const char* t : {"ppl", "kl", "passkey"}) out["results"][t].update(j["results"][t]);
      out["seconds"] = out["seconds"].get<double>() + j["seconds"].get<double>();
    }
  }
  out["config"]["ctx"] = cfg_.ctx;
  out["config"]["tasks"] = {"ppl", "kl", "passkey", "layers"};
  out["config"]["layers_ctx"] = cfg_.ctx.front();
  out["clips"] = clips.to_json();
  return out;
}

json Referee::leakage_json(const std::vector<RefereeRun>& runs) const {
  const RefereeRun *leak = nullptr, *disjoint = nullptr;
  for (const RefereeRun& r : runs) {
    if (r.record.value("leakage", false)) leak = &r;
  }
  if (!leak) return nullptr;
  for (const RefereeRun& r : runs)
    if (!r.record.value("leakage", false) && r.record["method"]["label"] == leak->record["method"]["label"] &&
        r.record["windows"] == leak->record["windows"])
      disjoint = &r;
  const std::string domain = domains_[size_t(leak_domain_)].name;
  const std::string ctx = std::to_string(cfg_.ctx.front());
  json j = {{"method", leak->record["method"]["label"]},
            {"windows", leak->record["windows"]["label"]},
            {"domain", domain},
            {"ctx", cfg_.ctx.front()},
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

RefereeResult Referee::run() {
  const auto t0 = std::chrono::steady_clock::now();
  validate_inputs();
  fs::create_directories(fs::path(cfg_.out_dir) / "runs");
  fs::create_directories(fs::path(cfg_.out_dir) / "rotations");
  load_data();

  // The plan: every method × windows (bf16 once), then the leakage row.
  std::vector<PlannedRun> plan;
  for (const RefereeMethod& m : cfg_.methods)
    for (const RefereeWindows& w : cfg_.windows) {
      PlannedRun r{m, w, false, slug(m.label) + "__" + std::to_string(w.sink) + "-" + std::to_string(w.recent)};
      if (m.type == "bf16") r.key = "bf16";
      plan.push_back(r);
      if (m.type == "bf16") break;  // windows do not change a BF16 cache
    }
  if (cfg_.leakage && leak_domain_ >= 0) {
    const RefereeMethod m = parse_referee_methods("optr(oscar)").front();
    const RefereeWindows w = cfg_.windows.front();
    plan.push_back({m, w, true,
                    slug(m.label) + "__" + std::to_string(w.sink) + "-" + std::to_string(w.recent) + "__leak-" +
                        slug(domains_[size_t(leak_domain_)].name)});
  }

  check_calibrations(plan);
  if (cfg_.calibrate_only) {
    for (const PlannedRun& r : plan)
      if (r.method.needs_calibration()) rotation_for(r);
    say(fmt::format("kvq: referee: {} rotation file(s) in {}/rotations ({} calibrated now, {} cached)",
                    rotations_.size(), cfg_.out_dir, res_.calibrations_run, res_.calibrations_reused));
    return std::move(res_);
  }

  double executed_seconds = 0;
  json missing = json::array();
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedRun& r = plan[i];
    const std::string path = (fs::path(cfg_.out_dir) / "runs" / (r.key + ".json")).string();
    const json settings = settings_for(r);
    RefereeRun run;
    run.key = r.key;
    if (fs::exists(path)) {
      try {
        json old = json::parse(read_text(path, "run record"));
        if (old.value("settings", json()) == settings) {
          run.record = std::move(old);
          run.resumed = true;
        } else {
          say(fmt::format("kvq: referee: {} was run with other settings; running it again", path));
        }
      } catch (const json::exception&) {
        say(fmt::format("kvq: referee: {} is not valid json; running it again", path));
      }
    }
    if (!run.resumed && cfg_.report_only) {
      missing.push_back({{"key", r.key}, {"method", r.method.label}, {"windows", r.windows.label()},
                         {"leakage", r.leakage}});
      continue;
    }
    if (run.resumed) {
      ++res_.runs_resumed;
      say(fmt::format("kvq: run {}/{} {} {}: done earlier ({})", i + 1, plan.size(), r.method.label,
                      r.windows.label(), path));
    } else {
      const auto r0 = std::chrono::steady_clock::now();
      const Rotation rot = rotation_for(r);
      const double avg = res_.runs_executed > 0 ? executed_seconds / res_.runs_executed : -1;
      size_t left = 0;
      for (size_t k = i + 1; k < plan.size(); ++k)
        left += !fs::exists(fs::path(cfg_.out_dir) / "runs" / (plan[k].key + ".json"));
      json rec = evaluate_run(r, rot, int(i + 1), int(plan.size()), avg, int(left));
      rec["key"] = r.key;
      rec["method"] = {{"label", r.method.label}, {"type", r.method.type}, {"rotation", r.method.rotation},
                       {"base", r.method.base}, {"objective", r.method.objective}};
      rec["windows"] = {{"sink", r.windows.sink}, {"recent", r.windows.recent},
                        {"label", r.method.type == "bf16" ? "any" : r.windows.label()}};
      rec["leakage"] = r.leakage;
      const bool calibrated = r.method.needs_calibration();
      rec["rotation"] = {{"name", rot.transform ? rot.transform->name : "none"},
                         {"file", rot.file.empty() ? json(nullptr) : json(rot.file)},
                         {"reused", rot.reused},
                         {"calibration_seconds", rot.seconds},
                         {"calib_data", calibrated ? json(r.leakage ? domains_[size_t(leak_domain_)].path
                                                                    : cfg_.calib_data)
                                                   : json(nullptr)},
                         {"calib_sha256", calibrated ? settings["calibration"]["sha256"] : json(nullptr)},
                         {"heads_total", rot.meta.value("heads_total", 0)},
                         {"heads_key_kept", rot.meta.value("heads_key_kept", 0)},
                         {"heads_value_kept", rot.meta.value("heads_value_kept", 0)}};
      rec["settings"] = settings;
      rec["date"] = utc_now();  // when this run was made (a resumed run keeps its own date)
      rec["threads"] = model().pool().size();
      write_atomic(path, rec.dump(1));
      run.record = std::move(rec);
      ++res_.runs_executed;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
      executed_seconds += s;
      say(fmt::format("kvq: run {}/{} {} {}: finished in {:.1f} s", i + 1, plan.size(), r.method.label,
                      r.windows.label(), s));
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

  // results.json
  json& j = res_.results;
  j["kvq"] = {{"version", KVQ_VERSION}, {"git", git_describe()}};
  j["date"] = utc_now();
  const int threads = model_ ? model_->pool().size()
                             : cfg_.threads > 0 ? cfg_.threads : int(std::thread::hardware_concurrency());
  j["machine"] = machine_json(threads);
  j["model"] = {{"dir", cfg_.model_dir}, {"fingerprint", fingerprint_}};
  j["calibration_data"] = {{"file", cfg_.calib_data}, {"sha256", calib_text_sha_}, {"bytes", calib_bytes_},
                           {"tokens", calib_ids_.size()}};
  json data = json::array();
  for (const EvalDomain& d : domains_)
    data.push_back({{"domain", d.name}, {"file", d.path}, {"sha256", d.sha256}, {"bytes", d.bytes},
                    {"tokens", d.ids.size()}});
  j["eval_data"] = data;
  json methods = json::array(), windows = json::array();
  for (const RefereeMethod& m : cfg_.methods) methods.push_back(m.label);
  for (const RefereeWindows& w : cfg_.windows) windows.push_back(w.label());
  j["config"] = {{"ctx", cfg_.ctx},
                 {"methods", methods},
                 {"windows", windows},
                 {"eval_windows", cfg_.eval_windows},
                 {"passkey_trials", cfg_.passkey_trials},
                 {"depths", cfg_.depths.empty() ? EvalConfig::default_depths() : cfg_.depths},
                 {"bootstrap", cfg_.bootstrap},
                 {"group", cfg_.group},
                 {"layer_skip", "none"},
                 {"layers_ctx", cfg_.ctx.front()},
                 {"calibration", {{"tokens", cfg_.calib_tokens}, {"chunk", cfg_.calib_chunk},
                                  {"steps", cfg_.calib_steps}}},
                 {"quick", cfg_.quick},
                 {"leakage", cfg_.leakage},
                 {"device", cfg_.device}};
  j["seeds"] = {{"seed", cfg_.seed}};
  json runs = json::array(), runners = json::array();
  for (const RefereeRun& r : res_.runs) {
    runs.push_back(r.record);
    const json where = r.record.value("runner", json("unknown"));
    if (std::find(runners.begin(), runners.end(), where) == runners.end()) runners.push_back(where);
  }
  j["runs"] = runs;
  j["runners"] = runners;
  j["missing_runs"] = missing;
  j["leakage"] = leakage_json(res_.runs);
  j["counters"] = {{"runs_total", int(plan.size())}, {"runs_executed", res_.runs_executed},
                   {"runs_resumed", res_.runs_resumed}, {"runs_missing", int(missing.size())},
                   {"calibrations_run", res_.calibrations_run},
                   {"calibrations_reused", res_.calibrations_reused}};
  j["notes"] = {
      "Every run: same model, same eval windows and passkey prompts (same seeds), same group (" +
          std::to_string(cfg_.group) + "), layer-skip policy none; all metrics decode-faithful (METHODS §2).",
      "bf16 is run once: sink/recent windows do not change a BF16 cache (its windows column reads 'any').",
      "Calibrated methods (int2+oscar, optr*) were calibrated on " + cfg_.calib_data + " (sha256 " +
          calib_text_sha_.substr(0, 16) + "…), checked disjoint from every file of " + cfg_.eval_dir +
          " by path and sha256; a calibration file may come from the same domain as an eval file (another part of "
          "the text), which the check allows.",
      "OptR rotations are calibrated for the int2 grid (group " + std::to_string(cfg_.group) + ", clips " +
          (cfg_.clip_grid.empty() ? std::string("0.96/0.92")
                                  : std::string("tuned for their base rotation, see the clip table")) +
          ") and the windows of their row; OSCAR's are grid- and window-independent (one file).",
      cfg_.clip_grid.empty()
          ? std::string("INT2 clips are METHODS' defaults (keys 0.96, values 0.92); --clip-grid tunes them.")
          : "INT2 clips: per method and windows, the (key, value) pair of the grid with the lowest ppl on " +
                std::to_string(cfg_.tune_windows) + " held-out window(s) at ctx " + std::to_string(cfg_.ctx.front()) +
                " from the end of " + cfg_.calib_data + ", past the calibration budget (METHODS §7).",
      "int2+quarot uses the data-free Hadamard rotation (no calibration).",
      "CIs: percentile bootstrap over eval windows (ppl, KL, top-1; with one window per domain a per-domain interval "
      "is degenerate, lo = hi) and Wilson intervals over passkey trials.",
      "Effective bits: bytes actually stored per token per layer (scales, zeros and BF16 windows included) at the "
      "stated context (METHODS §6).",
      "The leakage row calibrates optr(oscar) on an eval file itself (the evaluated domain with the most text) to "
      "show how much same-text calibration flatters a method."};
  j["unseen"] = referee_unseen_json(j);  // pooled over the eval domains other than the calibration one
  j["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const std::vector<std::string> problems = referee_schema_errors(j);
  KVQ_CHECK(problems.empty(), "referee: results.json fails its schema: {}", problems.front());
  write_atomic((fs::path(cfg_.out_dir) / "results.json").string(), j.dump(1));
  write_atomic((fs::path(cfg_.out_dir) / "report.md").string(), referee_markdown(j));
  write_atomic((fs::path(cfg_.out_dir) / "report.html").string(), referee_html(j));
  return std::move(res_);
}

}  // namespace

const std::vector<RefereeMethod>& referee_methods() {
  static const std::vector<RefereeMethod> kMethods = {
      {"bf16", "bf16", "none", "", ""},
      {"int8", "int8", "none", "", ""},
      {"int4", "int4", "none", "", ""},
      {"int2", "int2", "none", "", ""},
      {"kivi2", "kivi2", "none", "", ""},
      {"int2+quarot", "int2", "quarot", "", ""},
      {"int2+oscar", "int2", "oscar", "", ""},
      {"optr(quarot)", "int2", "optr", "quarot", "post-wo"},
      {"optr(oscar)", "int2", "optr", "oscar", "post-wo"},
      {"optr-joint(oscar)", "int2", "optr", "oscar", "joint"},
      {"optr-pre-wo(oscar)", "int2", "optr", "oscar", "pre-wo"},
      {"optr-recon(oscar)", "int2", "optr", "oscar", "recon"},
  };
  return kMethods;
}

std::vector<RefereeMethod> parse_referee_methods(const std::string& list) {
  std::vector<RefereeMethod> out;
  std::stringstream ss(list);
  std::string known;
  for (const RefereeMethod& m : referee_methods()) known += (known.empty() ? "" : ", ") + m.label;
  for (std::string t; std::getline(ss, t, ',');) {
    auto it = std::find_if(referee_methods().begin(), referee_methods().end(),
                           [&](const RefereeMethod& m) { return m.label == t; });
    KVQ_CHECK(it != referee_methods().end(), "unknown referee method '{}' (known: {})", t, known);
    KVQ_CHECK(std::none_of(out.begin(), out.end(), [&](const RefereeMethod& m) { return m.label == t; }),
              "referee method '{}' is listed twice", t);
    out.push_back(*it);
  }
  KVQ_CHECK(!out.empty() && list.back() != ',', "bad method list '{}' (known: {})", list, known);
  return out;
}

std::string RefereeWindows::label() const { return std::to_string(sink) + "/" + std::to_string(recent); }

std::vector<RefereeWindows> parse_referee_windows(const std::string& list) {
  std::vector<RefereeWindows> out;
  std::stringstream ss(list);
  auto number = [&](const std::string& s) {
    KVQ_CHECK(!s.empty() && s.size() <= 7 && std::all_of(s.begin(), s.end(), ::isdigit),
              "bad window setting list '{}': '{}' is not a non-negative integer (e.g. 64/256,0/0)", list, s);
    return std::stoi(s);
  };
  for (std::string t; std::getline(ss, t, ',');) {
    const size_t slash = t.find('/');
    KVQ_CHECK(slash != std::string::npos, "bad window setting '{}' in '{}' (sink/recent, e.g. 64/256)", t, list);
    RefereeWindows w{number(t.substr(0, slash)), number(t.substr(slash + 1))};
    KVQ_CHECK(std::none_of(out.begin(), out.end(), [&](const RefereeWindows& o) { return o.label() == w.label(); }),
              "window setting '{}' is listed twice", w.label());
    out.push_back(w);
  }
  KVQ_CHECK(!out.empty() && list.back() != ',', "bad window setting list '{}' (e.g. 64/256,16/64,0/0)", list);
  return out;
}

void check_calibration_disjoint(const std::string& calib_file, const std::string& eval_dir) {
  KVQ_CHECK(fs::is_regular_file(calib_file), "calibration data '{}' is not a file", calib_file);
  const fs::path calib = fs::weakly_canonical(calib_file);
  const fs::path dir = fs::weakly_canonical(eval_dir);
  for (fs::path p = calib.parent_path(); !p.empty(); p = p.parent_path()) {
    KVQ_CHECK(p != dir, "calibration data '{}' lies inside the eval data directory '{}': calibration must be disjoint "
              "from evaluation data", calib_file, eval_dir);
    if (p == p.root_path()) break;
  }
  const std::string sha = sha256_hex(read_text(calib_file, "calibration data"));
  for (const std::string& f : list_eval_files(eval_dir))
    KVQ_CHECK(sha256_hex(read_text(f, "eval text")) != sha,
              "calibration data '{}' is identical (sha256 {}…) to eval file '{}': calibration must be disjoint from "
              "evaluation data", calib_file, sha.substr(0, 12), f);
}

RefereeResult run_referee(const RefereeConfig& cfg, const RefereeLog& log) {
  RefereeLog sink = log ? log : [](const std::string& line, bool transient) {
    std::fprintf(stderr, transient ? "\r%-110s" : "\r%-110s\n", line.c_str());
    std::fflush(stderr);
  };
  Referee r(cfg, sink);
  return r.run();
}

}  // namespace kvq
