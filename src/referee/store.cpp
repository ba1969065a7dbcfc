// The referee's rotation and clip stores (referee/store.h).
#include "referee/store.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include "calib/pnmix.h"
#include "calib/fp8_scales.h"
#include "codecs/fp8/fp8_scales.h"
#include "codecs/pnmix/pnmix_file.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "common/sha256.h"
#include "common/version.h"
#include "eval/perplexity.h"
#include "referee/io.h"
#include "rotation/rotation_file.h"

namespace kvq {

namespace fs = std::filesystem;
using nlohmann::json;

CalibrateConfig run_calibrate_config(const RefereeConfig& cfg, const PlannedRun& r, const ClipChoice* clips) {
  const RefereeMethod& m = r.method;
  const bool learned = m.rotation_kind().learned;
  CalibrateConfig cc;
  cc.method = m.rotation;
  if (m.rotation_kind().key_widths) cc.pnmix_score = m.pnmix_score, cc.key_bits = m.pnmix_key_bits;
  cc.base = learned ? m.base : "oscar";  // the unused fields of a rotation that is not learned: as its file names
  cc.objective = learned ? m.objective : "post-wo";  // under OUT/rotations/ were hashed
  cc.tokens = cfg.calib_tokens;
  cc.chunk = cfg.calib_chunk;
  cc.steps = cfg.calib_steps;
  // A learned rotation (OptR) is calibrated for the row's int2 grid and windows; OSCAR's statistics do not depend
  // on them.
  cc.cache = method_cache(m, learned ? r.windows : RefereeWindows{0, 0}, cfg.group);
  if (clips && learned) cc.cache.k.clip = clips->k, cc.cache.v.clip = clips->v;
  return cc;
}

void check_calibration_budgets(const RefereeConfig& cfg, const RefereeData& data, const std::vector<PlannedRun>& plan) {
  const ModelConfig mc = ModelConfig::load(cfg.model_dir + "/config.json");
  for (const PlannedRun& r : plan) {
    if (!r.method.needs_calibration()) continue;
    const CalibrateConfig cc = run_calibrate_config(cfg, r);
    cc.validate(mc);
    const size_t chunks = r.method.rotation_kind().learned ? size_t(cc.calib_chunks + cc.heldout_chunks) : 1;
    const size_t need = size_t(cc.chunk) * chunks;
    const CalibText text = run_calib_text(cfg, data, r);
    KVQ_CHECK(text.ids.size() >= need, "referee: {} needs {} calibration tokens ({} chunk(s) of {}), '{}' has {}",
              r.method.label, need, need / size_t(cc.chunk), cc.chunk, text.file, text.ids.size());
  }
  // Clip tuning reads the end of the calibration file, which must lie past the calibration budget.
  if (std::any_of(plan.begin(), plan.end(), [&](const PlannedRun& r) { return referee_tunes_clips(cfg, r.method); })) {
    const size_t held_out = size_t(cfg.tune_windows) * size_t(cfg.ctx.front());
    KVQ_CHECK(data.calib_ids.size() >= size_t(cfg.calib_tokens) + held_out,
              "referee: clip tuning needs {} held-out tokens ({} x {}) past the {}-token calibration budget; '{}' has "
              "{} in all", held_out, cfg.tune_windows, cfg.ctx.front(), cfg.calib_tokens, cfg.calib_data,
              data.calib_ids.size());
  }
}

// ---- rotations ----

namespace {

// Every setting a calibrated rotation depends on: its file name under OUT/rotations/ hashes it.
json rotation_key(const CalibrateConfig& cc, const std::string& fingerprint, const std::string& data_sha) {
  json key = {{"model_fingerprint", fingerprint}, {"calib_sha256", data_sha}, {"method", cc.method},
          {"base", cc.base}, {"objective", cc.objective}, {"tokens", cc.tokens}, {"chunk", cc.chunk},
          {"n_queries", cc.n_queries}, {"calib_chunks", cc.calib_chunks}, {"heldout_chunks", cc.heldout_chunks},
          {"steps", cc.steps}, {"lr", cc.lr}, {"lambda_k", cc.lambda_k}, {"center_keys", cc.center_keys},
          {"type", cc.cache.k.type}, {"group", cc.cache.k.group}, {"clip_k", cc.cache.k.clip},
          {"clip_v", cc.cache.v.clip}, {"sink", cc.cache.sink}, {"recent", cc.cache.recent},
          {"kvq_version", KVQ_VERSION}};
  if (cc.method == "pnmix") key.update({{"pnmix_score", cc.pnmix_score}, {"key_bits", cc.key_bits}});
  return key;
}

// Every setting a clip choice depends on: its file name under OUT/clips/ hashes it.
json clip_spec(const RefereeConfig& cfg, const RefereeData& data, const RefereeMethod& tuned, const RefereeWindows& w) {
  return {{"model_fingerprint", data.fingerprint}, {"calib_sha256", data.calib_sha256}, {"method", tuned.label},
          {"sink", w.sink}, {"recent", w.recent}, {"group", cfg.group},
          {"grid", cfg.clip_grid}, {"ctx", cfg.ctx.front()}, {"windows", cfg.tune_windows},
          {"kvq_version", KVQ_VERSION}};  // not the device: tune on one machine, evaluate on another
}

}  // namespace

std::string referee_rotation_file(const RefereeConfig& cfg, const RefereeData& data, const PlannedRun& r,
                                  const ClipChoice* clips) {
  const CalibrateConfig cc = run_calibrate_config(cfg, r, r.method.rotation_kind().learned ? clips : nullptr);
  const json key = rotation_key(cc, data.fingerprint, run_calib_text(cfg, data, r).sha256);
  const std::string name = referee_slug(r.method.label) + "-" + sha256_hex(key.dump()).substr(0, 16) + ".safetensors";
  return (fs::path(cfg.out_dir) / "rotations" / name).string();
}

const RefereeMethod& referee_clips_source(const RefereeMethod& m) {
  return m.clips_from.empty() ? m : *find_referee_method(m.clips_from);
}

std::string referee_clip_file(const RefereeConfig& cfg, const RefereeData& data, const RefereeMethod& tuned,
                              const RefereeWindows& w) {
  const json spec = clip_spec(cfg, data, tuned, w);
  return (fs::path(cfg.out_dir) / "clips" / (referee_slug(tuned.label) + "-" + sha256_hex(spec.dump()).substr(0, 16) +
                                             ".json")).string();
}

// A cached calibration file read into rot (what: "rotation", "PN-Mix widths", "FP8 scales"): refused when it was
// calibrated on other data than data_sha, else counted as reused with its metadata and the seconds it took.
void RefereeStore::take_cached(const char* what, const json& meta, const std::string& data_sha, double seconds,
                               Rotation& rot) {
  KVQ_CHECK(meta.value("calib_sha256", "") == data_sha, "cached {} file '{}' was calibrated on other data", what,
            rot.file);
  rot.meta = meta;
  rot.reused = true;
  rot.seconds = seconds;
  ++calibrations_reused_;
  say(fmt::format("kvq: referee: reusing cached {} {}", what, rot.file));
}

// Reads rot.file when it exists (checked against the model, the grid and the data); false when it does not.
bool RefereeStore::read_rotation(const CalibrateConfig& cc, const std::string& data_sha, Rotation& rot) {
  if (!fs::exists(rot.file)) return false;
  const ModelConfig& mc = model_().config();
  RotationFile f = load_rotation_file(rot.file);
  check_rotation_fits(f, data_.fingerprint, mc.n_layers, mc.n_kv_heads, mc.head_dim, cc.cache);
  take_cached("rotation", f.meta, data_sha,
              f.meta.value("capture_seconds", 0.0) + f.meta.value("optimise_seconds", 0.0), rot);
  rot.transform = std::make_shared<KvTransform>(std::move(f.transform));
  return true;
}

void RefereeStore::calibrate_rotation(const PlannedRun& r, const CalibrateConfig& cc, const json& key,
                                      Rotation& rot) {
  const RefereeMethod& m = r.method;
  const CalibText text = run_calib_text(cfg_, data_, r);
  say(fmt::format("kvq: referee: calibrating {} on {} ({} tokens of budget {}, chunk {}{})", m.label, text.file,
                  text.ids.size(), cc.tokens, cc.chunk,
                  m.rotation_kind().learned ? fmt::format(", {} steps, windows {}", cc.steps, r.windows.label())
                                            : ""));
  Model& model = model_();
  CalibrateReport rep;
  KvTransform t = calibrate(model, text.ids, cc, &rep, [&](const char* stage, int done, int total) {
    say(fmt::format("kvq: calibrate {} {} {}/{}", m.label, stage, done, total), true);
  });
  say(fmt::format("kvq: calibrated {} in {:.1f} s", m.label, rep.capture_seconds + rep.optimise_seconds));
  json meta = calibration_metadata(cc, t, rep, data_.fingerprint, text.file, text.sha256);
  meta["referee_key"] = key;
  save_rotation_file(rot.file, t, meta);
  rot.meta = meta;
  rot.seconds = rep.capture_seconds + rep.optimise_seconds;
  rot.transform = std::make_shared<KvTransform>(std::move(t));
  ++calibrations_run_;
}

// PN-Mix widths (a key_widths kind): the same store, a PN-Mix file instead of a rotation file.
bool RefereeStore::read_widths(const std::string& data_sha, Rotation& rot) {
  if (!fs::exists(rot.file)) return false;
  const ModelConfig& mc = model_().config();
  PnmixFile f = load_pnmix_file(rot.file);
  check_pnmix_fits(f, data_.fingerprint, mc.n_layers, mc.n_kv_heads, mc.head_dim);
  take_cached("PN-Mix widths", f.meta, data_sha, f.meta.value("capture_seconds", 0.0), rot);
  rot.pair_bits = std::make_shared<PairBitTable>(std::move(f.table));
  return true;
}

void RefereeStore::calibrate_widths(const PlannedRun& r, const CalibrateConfig& cc, const json& key, Rotation& rot) {
  const CalibText text = run_calib_text(cfg_, data_, r);
  say(fmt::format("kvq: referee: calibrating {} widths on {} ({} tokens of budget {}, chunk {})", r.method.label,
                  text.file, text.ids.size(), cc.tokens, cc.chunk));
  const PnmixCalibration c = calibrate_pnmix(model_(), text.ids, cc, [&](const char* stage, int done, int total) {
    say(fmt::format("kvq: calibrate {} {} {}/{}", r.method.label, stage, done, total), true);
  });
  json meta = {{"score", cc.pnmix_score},       {"model_fingerprint", data_.fingerprint},
               {"calib_data", text.file},       {"calib_sha256", text.sha256},
               {"calib_tokens", c.tokens_used}, {"chunk", cc.chunk},
               {"capture_seconds", c.capture_seconds}, {"referee_key", key}};
  save_pnmix_file(rot.file, c.table, c.scores, meta);
  say(fmt::format("kvq: calibrated {} widths in {:.1f} s", r.method.label, c.capture_seconds));
  rot.meta = meta;
  rot.seconds = c.capture_seconds;
  rot.pair_bits = std::make_shared<PairBitTable>(c.table);
  ++calibrations_run_;
}

// vLLM's FP8 per-tensor scales (a tensor_scales kind): the same store, an FP8 scales file instead of a rotation file.
bool RefereeStore::read_scales(const std::string& data_sha, Rotation& rot) {
  if (!fs::exists(rot.file)) return false;
  auto s = std::make_shared<Fp8Scales>(load_fp8_scales(rot.file));
  check_fp8_scales_fit(*s, data_.fingerprint, model_().config().n_layers);
  take_cached("FP8 scales", s->meta, data_sha, s->meta.value("capture_seconds", 0.0), rot);
  rot.kv_scales = std::move(s);
  return true;
}

void RefereeStore::calibrate_scales(const PlannedRun& r, const CalibrateConfig& cc, const json& key, Rotation& rot) {
  const CalibText text = run_calib_text(cfg_, data_, r);
  say(fmt::format("kvq: referee: calibrating {} scales on {} ({} tokens of budget {}, chunk {})", r.method.label,
                  text.file, text.ids.size(), cc.tokens, cc.chunk));
  const fp8::Format format = fp8::format_of(codec_traits(r.method.key_type).id);
  Fp8Calibration c = calibrate_fp8_scales(model_(), text.ids, cc, format, [&](const char* stage, int done, int total) {
    say(fmt::format("kvq: calibrate {} {} {}/{}", r.method.label, stage, done, total), true);
  });
  json meta = {{"model_fingerprint", data_.fingerprint}, {"calib_data", text.file},
               {"calib_sha256", text.sha256},           {"calib_tokens", c.tokens_used},
               {"chunk", cc.chunk},                     {"capture_seconds", c.capture_seconds},
               {"referee_key", key}};
  save_fp8_scales(rot.file, c.scales, meta);
  say(fmt::format("kvq: calibrated {} scales in {:.1f} s", r.method.label, c.capture_seconds));
  rot.meta = meta;
  rot.seconds = c.capture_seconds;
  c.scales.path = rot.file;
  rot.kv_scales = std::make_shared<Fp8Scales>(std::move(c.scales));
  ++calibrations_run_;
}

Rotation RefereeStore::rotation_for(const PlannedRun& r) {
  const RefereeMethod& m = r.method;
  const RefereeRotation& kind = m.rotation_kind();
  Rotation rot;
  const ModelConfig& mc = model_().config();
  if (!kind.calibrated) {
    if (kind.data_free) rot.transform = std::make_shared<KvTransform>(kind.data_free(mc));
    return rot;
  }
  // A learned rotation (OptR) is calibrated for the clips its row is evaluated with (tuned through its base, never
  // through itself); OSCAR's statistics do not depend on the grid.
  const ClipChoice clips = kind.learned ? clips_for(r) : ClipChoice{};
  const CalibrateConfig cc = run_calibrate_config(cfg_, r, kind.learned ? &clips : nullptr);
  const std::string data_sha = run_calib_text(cfg_, data_, r).sha256;
  const json key = rotation_key(cc, data_.fingerprint, data_sha);
  rot.file = referee_rotation_file(cfg_, data_, r, &clips);
  if (auto it = rotations_.find(rot.file); it != rotations_.end()) {
    Rotation again = it->second;
    again.reused = true;
    ++calibrations_reused_;
    return again;
  }
  if (kind.key_widths) {
    if (!read_widths(data_sha, rot)) calibrate_widths(r, cc, key, rot);
  } else if (kind.tensor_scales) {
    if (!read_scales(data_sha, rot)) calibrate_scales(r, cc, key, rot);
  } else if (!read_rotation(cc, data_sha, rot)) {
    calibrate_rotation(r, cc, key, rot);
  }
  rotations_[rot.file] = rot;
  return rot;
}

// ---- clips ----

// Reads a stored choice made for `spec` into out; false when there is none (or not for this spec).
bool RefereeStore::read_clips(const std::string& file, const json& spec, ClipChoice& out) const {
  if (!fs::exists(file)) return false;
  try {
    const json j = json::parse(referee_read_text(file, "clip choice"));
    if (j.value("spec", json()) != spec) return false;
    out.k = j.at("k").get<float>();
    out.v = j.at("v").get<float>();
    out.grid = j.at("grid");
    return true;
  } catch (const json::exception&) {
    say(fmt::format("kvq: referee: {} is not a valid clip choice; tuning again", file));
  }
  return false;
}

// Every (key, value) pair of the grid on the held-out text: the last windows of the calibration file, past the
// calibration budget (check_calibration_budgets). out takes the best pair (the first of equal pairs in grid order)
// and the grid; returns its ppl.
double RefereeStore::tune_clips(const RefereeMethod& tuned, const RefereeWindows& w, ClipChoice& out,
                                std::string& where) {
  const int ctx = cfg_.ctx.front();
  const size_t n = size_t(cfg_.tune_windows) * size_t(ctx);
  const std::vector<int32_t> tail(data_.calib_ids.end() - std::ptrdiff_t(n), data_.calib_ids.end());
  const Rotation rot = rotation_for({tuned, w, false, ""});  // not learned: none, data-free or grid-independent
  const RunnerFactory make = runners_();
  double best = std::numeric_limits<double>::infinity();
  for (float ck : cfg_.clip_grid)
    for (float cv : cfg_.clip_grid) {
      CacheConfig c = method_cache(tuned, w, cfg_.group);
      c.k.clip = ck;
      c.v.clip = cv;
      c.transform = rot.transform;
      const std::unique_ptr<Runner> runner = make(c, ctx);
      where = runner->describe();
      const double ppl = perplexity(*runner, tail, ctx, cfg_.tune_windows).ppl();
      say(fmt::format("kvq: referee: clips of {} {}: keys {} values {}: held-out ppl {:.4f}", tuned.label, w.label(),
                      ck, cv, ppl), true);
      out.grid.push_back({ck, cv, ppl});
      if (ppl < best) best = ppl, out.k = ck, out.v = cv;
    }
  return best;
}

ClipChoice RefereeStore::clips_for(const PlannedRun& r) {
  const CacheConfig defaults = method_cache(r.method, r.windows, cfg_.group);
  ClipChoice out;
  out.k = defaults.k.clip;
  out.v = defaults.v.clip;
  if (!referee_tunes_clips(cfg_, r.method)) return out;
  const RefereeMethod& tuned = referee_clips_source(r.method);
  const std::string mem_key = tuned.label + "@" + r.windows.label();
  if (auto it = clips_.find(mem_key); it != clips_.end()) return it->second;
  const json spec = clip_spec(cfg_, data_, tuned, r.windows);
  const fs::path file = referee_clip_file(cfg_, data_, tuned, r.windows);
  out.tuned_on = tuned.label;
  if (!read_clips(file.string(), spec, out)) {
    std::string where;
    const double best = tune_clips(tuned, r.windows, out, where);
    fs::create_directories(file.parent_path());
    const json j = {{"spec", spec}, {"k", out.k}, {"v", out.v}, {"grid", out.grid}, {"runner", where}};
    referee_write_atomic(file.string(), j.dump(1));
    say(fmt::format("kvq: referee: clips of {} {}: keys {} values {} (held-out ppl {:.4f})", tuned.label,
                    r.windows.label(), out.k, out.v, best));
  }
  clips_[mem_key] = out;
  return out;
}

}  // namespace kvq
