// kvq calibrate: build a rotation file (QuaRot, OSCAR, OptR), a PN-Mix file of key widths or a file of vLLM's FP8
// per-tensor scales for a model from calibration text.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "calib/calibrate.h"
#include "calib/fp8_scales.h"
#include "calib/pnmix.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "codecs/pnmix/pnmix_file.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "common/sha256.h"
#include "rotation/rotation_file.h"

namespace kvq::cli {

namespace {

struct CalibrateOptions {
  ModelOptions model;
  CacheOptions cache;
  CalibrateConfig calib;
  std::string data, out, center = "auto";
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVQ_CHECK(f, "cannot open calibration data '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Progress bar on stderr with an ETA from the current stage's own pace.
struct ProgressBar {
  std::string stage_name;
  std::chrono::steady_clock::time_point stage_start = std::chrono::steady_clock::now();
  void operator()(const char* stage, int done, int total) {
    const auto now = std::chrono::steady_clock::now();
    if (stage_name != stage) stage_name = stage, stage_start = now;
    const double el = std::chrono::duration<double>(now - stage_start).count();
    const int width = 30, filled = width * done / total;
    std::fprintf(stderr, "\rkvq: %-8s [%s%s] %d/%d  %.0f s, ETA %.0f s ", stage,
                 std::string(size_t(filled), '#').c_str(), std::string(size_t(width - filled), '.').c_str(), done,
                 total, el, el / done * (total - done));
    if (done == total) std::fputc('\n', stderr);
  }
};

// --data: its bytes (hashed into the output's metadata) and its tokens, at least one calibration chunk of them.
struct CalibrationText {
  std::string text;
  std::vector<int32_t> ids;
};
CalibrationText read_calibration_text(const CalibrateOptions& o) {
  CalibrationText c{read_file(o.data), {}};
  c.ids = load_tokenizer(o.model).encode(c.text);
  KVQ_CHECK(int(c.ids.size()) >= o.calib.chunk, "'{}' has {} tokens, fewer than one calibration chunk of {}", o.data,
            c.ids.size(), o.calib.chunk);
  return c;
}

// --method pnmix: key widths per RoPE pair (calib/pnmix.h), written as a PN-Mix file (codecs/pnmix/pnmix_file.h).
void run_pnmix(const CalibrateOptions& o, const Plan& p) {
  o.calib.validate(p.model);
  const CalibrationText cal = read_calibration_text(o);
  auto model = load_model(o.model, p);
  const PnmixCalibration c = calibrate_pnmix(*model, cal.ids, o.calib, ProgressBar{});
  const nlohmann::json meta = {{"score", o.calib.pnmix_score},     {"model_fingerprint", model->fingerprint()},
                               {"calib_data", o.data},             {"calib_sha256", sha256_hex(cal.text)},
                               {"calib_tokens", c.tokens_used},    {"chunk", o.calib.chunk},
                               {"capture_seconds", c.capture_seconds}};
  save_pnmix_file(o.out, c.table, c.scores, meta);
  int count[kPnmixMaxBits + 1] = {};
  for (uint8_t b : c.table.bits) ++count[b];
  const auto codec = make_pnmix_key_codec(CodecSpec{.type = "pnmix", .head_dim = c.table.head_dim, .clip = 0.96f,
                                                    .pair_bits = std::make_shared<PairBitTable>(c.table)});
  std::printf("wrote %s: %s key widths for %d layers x %d kv heads from %d calibration tokens (%.1f s): pairs at "
              "1/2/3/4 bits %d/%d/%d/%d, %d code bits per row (%g bits per element) + %d width groups x 4 B: %zu B "
              "per key row, %.4g bits per element stored\n",
              o.out.c_str(), c.table.name.c_str(), c.table.n_layers, c.table.n_kv_heads, c.tokens_used,
              c.capture_seconds, count[1], count[2], count[3], count[4], c.table.code_bits(), c.table.key_bits(),
              c.table.slots(), codec->bytes_per_block(), codec->bits_per_element());
}

// --method fp8-scales: vLLM's per-tensor FP8 scales (calib/fp8_scales.h) for the format of -ctk when it is an FP8 type
// (fp8_e5m2: e5m2), else e4m3 (vLLM's fp8), written as an FP8 scales file (codecs/fp8/fp8_scales.h).
void run_fp8_scales(const CalibrateOptions& o, const Plan& p) {
  const fp8::Format format = fp8::format_of(codec_traits(p.cache.k.type).id);
  const CalibrationText cal = read_calibration_text(o);
  auto model = load_model(o.model, p);
  const Fp8Calibration c = calibrate_fp8_scales(*model, cal.ids, o.calib, format, ProgressBar{});
  const nlohmann::json meta = {{"model_fingerprint", model->fingerprint()}, {"calib_data", o.data},
                               {"calib_sha256", sha256_hex(cal.text)},      {"calib_tokens", c.tokens_used},
                               {"chunk", o.calib.chunk},                    {"capture_seconds", c.capture_seconds}};
  save_fp8_scales(o.out, c.scales, meta);
  const auto [kmin, kmax] = std::minmax_element(c.scales.k_amax.begin(), c.scales.k_amax.end());
  const auto [vmin, vmax] = std::minmax_element(c.scales.v_amax.begin(), c.scales.v_amax.end());
  std::printf("wrote %s: %s scales for %d layers from %d calibration tokens (%.1f s): key maxima %.4g..%.4g, value "
              "maxima %.4g..%.4g, scale = max / %g\n",
              o.out.c_str(), fp8_format_name(format), c.scales.n_layers(), c.tokens_used, c.capture_seconds, *kmin,
              *kmax, *vmin, *vmax, fp8_max(format));
}

void run(CalibrateOptions o) {
  require_checkpoint(o.model, "calibrate");
  if (o.calib.method == "fp8-scales") {
    KVQ_CHECK(o.center == "auto", "--center-keys: fp8-scales takes the model's own keys (no centring)");
    KVQ_CHECK(o.cache.rotation == "none", "calibrate --method fp8-scales: --rotation must not be given (vLLM's FP8 "
              "caches take no rotation)");
    const Plan p = plan(o.model, o.cache, 0);
    o.calib.validate(p.model);
    run_fp8_scales(o, p);
    return;
  }
  if (o.calib.method == "pnmix") {
    KVQ_CHECK(o.center == "auto", "--center-keys: pnmix allocates widths on the model's own post-RoPE keys (no "
              "centring)");
    KVQ_CHECK(o.cache.rotation == "none", "calibrate --method pnmix: --rotation must not be given (pnmix keys take "
              "no key rotation)");
    run_pnmix(o, plan(o.model, o.cache, 0));
    return;
  }
  KVQ_CHECK(o.center == "auto" || o.center == "on" || o.center == "off", "--center-keys must be auto, on or off");
  o.calib.center_keys = o.center == "auto" ? -1 : o.center == "on";
  KVQ_CHECK(o.cache.rotation == "none", "calibrate builds a rotation: --rotation must not be given");
  KVQ_CHECK(o.cache.skip_layers.empty(), "calibrate makes rotations for every layer: --kv-skip-layers is a cache "
            "policy of run, ppl, eval and bench");
  const Plan p = plan(o.model, o.cache, 0);
  KVQ_CHECK(!window_quantized(p.cache),
            "calibrate: {} windows: OptR's loss keeps the windows exact and does not model quantized window rows "
            "(calibrate with bf16 windows; the rotation then runs with --kv-window-type {} too)", p.cache.window,
            p.cache.window);
  o.calib.cache = p.cache;
  o.calib.validate(p.model);
  const CalibrationText cal = read_calibration_text(o);
  auto model = load_model(o.model, p);

  CalibrateReport rep;
  KvTransform t = calibrate(*model, cal.ids, o.calib, &rep, ProgressBar{});

  const nlohmann::json meta = calibration_metadata(o.calib, t, rep, model->fingerprint(), o.data, sha256_hex(cal.text));
  if (o.calib.method == "optr") {
    double kb = 0, ka = 0, vb = 0, va = 0;
    for (const auto& h : rep.heads) kb += h.key_before, ka += h.key_after, vb += h.value_before, va += h.value_after;
    const double n = double(std::max<size_t>(1, rep.heads.size()));
    std::fprintf(stderr,
                 "kvq: optr kept the learned key rotation on %d/%zu heads (mean held-out loss %.5g -> %.5g) and the "
                 "value rotation on %d/%zu (%.5g -> %.5g)\n",
                 meta["heads_key_kept"].get<int>(), rep.heads.size(), kb / n, ka / n,
                 meta["heads_value_kept"].get<int>(), rep.heads.size(), vb / n, va / n);
  }
  save_rotation_file(o.out, t, meta);
  std::printf("wrote %s: %s rotations for %d layers x %d kv heads from %d calibration tokens (capture %.1f s, "
              "optimise %.1f s)\n",
              o.out.c_str(), t.name.c_str(), t.n_layers, t.n_kv_heads, rep.tokens_used, rep.capture_seconds,
              rep.optimise_seconds);
}

}  // namespace

void add_calibrate(CLI::App& app) {
  auto o = std::make_shared<CalibrateOptions>();
  o->cache.type_k = o->cache.type_v = "int2";
  CLI::App* cmd = app.add_subcommand("calibrate", "build key/value rotations (quarot, oscar, optr), PN-Mix key widths "
                                     "(pnmix) or FP8 scales (fp8-scales) for a model");
  add_model_options(cmd, o->model);
  add_cache_options(cmd, o->cache);
  cmd->add_option("--data", o->data, "calibration text file (keep it disjoint from evaluation data)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", o->out, "rotation file, PN-Mix file (--method pnmix) or FP8 scales file (--method "
                  "fp8-scales) to write (safetensors)")
      ->required();
  cmd->add_option("--method", o->calib.method, "quarot | oscar | optr | pnmix (key widths per RoPE pair, not a rotation) "
                  "| fp8-scales (vLLM's per-tensor FP8 k_scale / v_scale per layer, for -ctk fp8 (default) or "
                  "fp8_e5m2)");
  cmd->add_option("--base", o->calib.base, "optr base rotation: quarot | oscar");
  cmd->add_option("--objective", o->calib.objective, "optr objective: post-wo | joint | pre-wo | recon");
  cmd->add_option("--tokens", o->calib.tokens, "calibration token budget")->check(CLI::Range(2, 1 << 26));
  cmd->add_option("--chunk", o->calib.chunk, "tokens per calibration chunk")->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--queries", o->calib.n_queries, "optr: last query positions per chunk")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--calib-chunks", o->calib.calib_chunks, "optr: chunks per layer the rotations are fitted on "
                  "(default 2, as the reference implementation)")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--heldout-chunks", o->calib.heldout_chunks, "optr: held-out chunks per layer that pick each head's "
                  "best step (default 2)")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--steps", o->calib.steps, "optr: Adam steps per phase")->check(CLI::Range(0, 100000));
  cmd->add_option("--lr", o->calib.lr, "optr: Adam learning rate");
  cmd->add_option("--lambda-k", o->calib.lambda_k, "optr: weight of the key-induced post-W_O error");
  cmd->add_option("--pnmix-score", o->calib.pnmix_score, "pnmix: pair importance, product (E|q| E|k|, default) or "
                  "energy ((E|q|^2 + E|k|^2) / 2, the ablation)");
  cmd->add_option("--key-bits", o->calib.key_bits, "pnmix: average key bits per element in [1, 4], 1 + 2k/head_dim "
                  "(default 2)");
  cmd->add_option("--center-keys", o->center, "subtract per-head key means: auto (optr only) | on | off");
  cmd->callback([o] { run(*o); });
}

}  // namespace kvq::cli
