// The referee's plan, run settings and resume (referee/plan.h).
#include "referee/plan.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "calib/pnmix.h"
#include "codecs/fp8/fp8_scales.h"
#include "codecs/pnmix/codec_pnmix.h"
#include "common/error.h"
#include "common/sha256.h"
#include "common/version.h"
#include "model/safetensors.h"
#include "referee/io.h"

namespace kvq {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string run_key(const RefereeMethod& m, const RefereeWindows& w) {
  if (!m.windows_matter) return referee_slug(m.label);
  return referee_slug(m.label) + "__" + std::to_string(w.sink) + "-" + std::to_string(w.recent);
}

const RefereeMethod& leakage_method() {
  const auto& all = referee_methods();
  auto it = std::find_if(all.begin(), all.end(), [](const RefereeMethod& m) { return m.leakage; });
  KVQ_CHECK(it != all.end(), "referee: no method row is marked for the leakage row");
  return *it;
}

}  // namespace

void check_referee_inputs(const RefereeConfig& c, RefereeData& data) {
  KVQ_CHECK(!c.out_dir.empty(), "referee: no output directory (-o)");
  KVQ_CHECK(fs::is_regular_file(c.calib_data), "calibration data '{}' is not a file", c.calib_data);
  data.all_eval_files = list_eval_files(c.eval_dir);
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
    const bool found = std::any_of(data.all_eval_files.begin(), data.all_eval_files.end(),
                                   [&](const std::string& f) { return fs::path(f).stem() == d; });
    KVQ_CHECK(found, "referee: eval domain '{}' has no file {}/{}.txt", d, c.eval_dir, d);
  }
}

void read_referee_data(const RefereeConfig& cfg, const Tokenizer* tok, RefereeData& data) {
  data.fingerprint = Checkpoint::has_weights(cfg.model_dir) ? Checkpoint::open(cfg.model_dir).fingerprint() : "";
  for (const std::string& f : data.all_eval_files) {
    const std::string stem = fs::path(f).stem().string();
    if (!cfg.domains.empty() && std::find(cfg.domains.begin(), cfg.domains.end(), stem) == cfg.domains.end())
      continue;
    EvalDomain d;
    d.path = f;
    d.name = stem;
    const std::string text = referee_read_text(f, "eval text");
    KVQ_CHECK(!text.empty(), "eval text '{}' is empty", f);
    d.bytes = text.size();
    d.sha256 = sha256_hex(text);
    if (tok) d.ids = tok->encode(text);
    data.domains.push_back(std::move(d));
  }
  const std::string calib = referee_read_text(cfg.calib_data, "calibration data");
  data.calib_bytes = calib.size();
  data.calib_sha256 = sha256_hex(calib);
  if (tok) data.calib_ids = tok->encode(calib);
  for (size_t i = 0; i < data.domains.size(); ++i)
    if (data.leak_domain < 0 || data.domains[i].bytes > data.domains[size_t(data.leak_domain)].bytes)
      data.leak_domain = int(i);
}

std::vector<PlannedRun> plan_referee_runs(const RefereeConfig& cfg, const RefereeData& data) {
  std::vector<PlannedRun> plan;
  const auto& protocols = cfg.protocols;
  if (std::find(protocols.begin(), protocols.end(), RefereeProtocol::Common) != protocols.end()) {
    for (const RefereeMethod& m : cfg.methods)
      for (const RefereeWindows& w : cfg.windows) {
        plan.push_back({m, w, false, run_key(m, w)});
        if (!m.windows_matter) break;
      }
    if (cfg.leakage && data.leak_domain >= 0) {
      const RefereeMethod& m = leakage_method();
      const RefereeWindows w = cfg.windows.front();
      plan.push_back(
          {m, w, true, run_key(m, w) + "__leak-" + referee_slug(data.domains[size_t(data.leak_domain)].name)});
    }
  }
  if (std::find(protocols.begin(), protocols.end(), RefereeProtocol::AsShipped) != protocols.end())
    for (const RefereeMethod& m : cfg.methods)
      if (m.shipped.defined)
        plan.push_back({m, m.shipped.windows, false, referee_slug(m.label) + "__shipped", RefereeProtocol::AsShipped});
  return plan;
}

double run_prompt_fraction(const PlannedRun& r) {
  if (r.method.evicts()) return kEvictPromptFraction;
  return r.protocol == RefereeProtocol::AsShipped ? 0.5 : 0.0;
}

int run_prompt_tokens(const PlannedRun& r, int ctx) { return int(std::floor(run_prompt_fraction(r) * ctx)); }

double run_tail_fraction(const PlannedRun& r) {
  return run_prompt_fraction(r) < kEvictPromptFraction ? kEvictPromptFraction : 0.0;
}

std::string run_windows_label(const PlannedRun& r) {
  return r.method.windows_matter || r.protocol == RefereeProtocol::AsShipped ? r.windows.label() : "any";
}

bool referee_tunes_clips(const RefereeConfig& cfg, const RefereeMethod& m) {
  return !cfg.clip_grid.empty() && m.tunes_clips;
}

CalibText run_calib_text(const RefereeConfig& cfg, const RefereeData& data, const PlannedRun& r) {
  if (r.leakage && data.leak_domain >= 0) {
    const EvalDomain& d = data.domains[size_t(data.leak_domain)];
    return {d.path, d.sha256, d.ids};
  }
  return {cfg.calib_data, data.calib_sha256, data.calib_ids};
}

json run_settings(const RefereeConfig& cfg, const RefereeData& data, const PlannedRun& r) {
  json domains = json::array();
  for (const EvalDomain& d : data.domains) domains.push_back({{"domain", d.name}, {"sha256", d.sha256}});
  json s = {{"model_fingerprint", data.fingerprint},
            {"eval_data", domains},
            {"ctx", cfg.ctx},
            {"eval_windows", cfg.eval_windows},
            {"passkey_trials", cfg.passkey_trials},
            {"depths", cfg.depths.empty() ? EvalConfig::default_depths() : cfg.depths},
            {"bootstrap", cfg.bootstrap},
            {"seed", cfg.seed},
            {"group", cfg.group},
            {"protocol", protocol_name(r.protocol)},
            {"layer_skip", r.protocol == RefereeProtocol::AsShipped && !r.method.shipped.skip_layers.empty()
                               ? r.method.shipped.skip_layers : "none"},
            {"attn_rot", method_attn_rot(r.method, r.protocol)},
            {"prompt_policy", method_prompt_policy(r.method, r.protocol)},
            {"prompt", r.method.evicts()                        ? "first 15/16 of each window"
                       : r.protocol == RefereeProtocol::AsShipped ? "first half of each window"
                                                                  : "none"},
            {"method", r.method.label},
            {"sink", r.windows.sink},
            {"recent", r.windows.recent},
            {"device", cfg.device},
            {"kvq_version", KVQ_VERSION}};
  // A demotion block of its own (OScaR as shipped: 256) changes what is stored; only those runs record it (the others
  // resume).
  if (r.protocol == RefereeProtocol::AsShipped && r.method.shipped.demote_block > 0)
    s["demote_block"] = r.method.shipped.demote_block;
  // An eviction row's budget is its paired row's bytes at each ctx (only its settings say so: the others resume).
  if (r.method.evicts()) s["equal_bytes"] = r.method.equal_bytes;
  // Only tuned runs record the grid: the other runs stay valid, and resume, whatever the grid.
  if (referee_tunes_clips(cfg, r.method))
    s["clip_tuning"] = {{"grid", cfg.clip_grid}, {"windows", cfg.tune_windows}};
  if (r.method.needs_calibration())
    s["calibration"] = {{"sha256", run_calib_text(cfg, data, r).sha256},
                        {"tokens", cfg.calib_tokens},
                        {"chunk", cfg.calib_chunk},
                        {"steps", cfg.calib_steps}};
  return s;
}

CacheConfig run_cache_config(const RefereeConfig& cfg, const ModelConfig& mc, const PlannedRun& r, int ctx,
                             std::shared_ptr<const KvTransform> transform,
                             std::shared_ptr<const PairBitTable> pair_bits,
                             std::shared_ptr<const Fp8Scales> kv_scales) {
  CacheConfig c = method_cache(r.method, r.windows, cfg.group, r.protocol);
  c.prompt_policy = parse_prompt_policy(method_prompt_policy(r.method, r.protocol));
  c.transform = transform ? std::move(transform)
                          : method_transform(r.method, r.protocol, c, mc.n_layers, mc.n_kv_heads, mc.head_dim);
  c.k.pair_bits = std::move(pair_bits);
  c.kv_scales = std::move(kv_scales);
  c.key_rope = mc.rope_inv_freq();
  set_equal_bytes_budget(c, r.method, r.windows, cfg.group, ctx, mc.n_layers, mc.n_kv_heads, mc.head_dim);
  return c;
}

CacheConfig probe_cache_config(const RefereeConfig& cfg, const ModelConfig& mc, const PlannedRun& r, int ctx,
                               std::shared_ptr<const KvTransform> transform) {
  const RefereeRotation& kind = r.method.rotation_kind();
  std::shared_ptr<const PairBitTable> widths;
  if (kind.key_widths)
    widths = std::make_shared<const PairBitTable>(
        timing_pair_bits(mc.n_layers, mc.n_kv_heads, mc.head_dim, r.method.pnmix_key_bits));
  std::shared_ptr<const Fp8Scales> scales;
  if (kind.tensor_scales) {
    const std::vector<float> top(size_t(mc.n_layers), fp8_max(fp8::Format::kE4m3));  // amax 448: s = 1
    scales = std::make_shared<const Fp8Scales>(Fp8Scales::from_amax(fp8::Format::kE4m3, top, top));
  }
  return run_cache_config(cfg, mc, r, ctx, std::move(transform), std::move(widths), std::move(scales));
}

std::string run_record_path(const RefereeConfig& cfg, const std::string& key) {
  return (fs::path(cfg.out_dir) / "runs" / (key + ".json")).string();
}

std::optional<json> resumable_record(const std::string& path, const json& settings, const RefereeLog& log,
                                     bool any_device) {
  if (!fs::exists(path)) return std::nullopt;
  try {
    json old = json::parse(referee_read_text(path, "run record"));
    json had = old.value("settings", json());
    json want = settings;
    if (any_device && had.is_object()) had.erase("device"), want.erase("device");
    if (had == want) return old;
    log(fmt::format("kvq: referee: {} was run with other settings; running it again", path), false);
  } catch (const json::exception&) {
    log(fmt::format("kvq: referee: {} is not valid json; running it again", path), false);
  }
  return std::nullopt;
}

}  // namespace kvq
