// The referee's plan: which (method, windows) runs it makes — every method × every window setting, once for a
// method whose row says windows do not change it, then the leakage row — what settings each run records, and
// resume: a run whose OUT/runs/<key>.json holds the same settings is read back instead of run again.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/evaluator.h"
#include "referee/referee.h"
#include "tokenizer/tokenizer.h"

namespace kvq {

// What the referee read before any run (model fingerprint, tokenized eval and calibration text).
struct RefereeData {
  std::string fingerprint;                  // the model's
  std::vector<std::string> all_eval_files;  // every DIR/*.txt of --eval-data, sorted
  std::vector<EvalDomain> domains;          // the evaluated domains, tokenized
  std::string calib_sha256;                 // of --calib-data
  size_t calib_bytes = 0;
  std::vector<int32_t> calib_ids;           // --calib-data tokenized
  int leak_domain = -1;                     // index into domains of the leakage row's calibration file (the
                                            // largest domain); -1: no domain
};

// Checks every input that needs no model (the output directory, disjoint calibration data first, methods, windows,
// contexts, trials, depths, clips, domains) and lists the eval files into data.all_eval_files. kvq::Error naming the
// first problem.
void check_referee_inputs(const RefereeConfig& cfg, RefereeData& data);
// Reads the rest of data: the model's fingerprint (none for a config without weights), the evaluated domains and the
// calibration text, each tokenized by tok (null: not tokenized, ids empty — kvq referee --plan on a config without a
// tokenizer), and the leakage domain.
void read_referee_data(const RefereeConfig& cfg, const Tokenizer* tok, RefereeData& data);

// One planned (method, windows) run under one protocol.
struct PlannedRun {
  RefereeMethod method;
  RefereeWindows windows;  // as shipped: the row's own (method.shipped.windows)
  bool leakage = false;    // calibrated on an eval file (same domain) on purpose
  std::string key;         // file stem under OUT/runs/: "int2_quarot__64-256", "bf16", "e8_2__shipped"
  RefereeProtocol protocol = RefereeProtocol::Common;
};

// The runs, in order: for the common protocol cfg.methods × cfg.windows (a method whose windows do not matter once,
// at the first setting), then the leakage row's method at the first window setting, calibrated on
// data.domains[data.leak_domain]; for the as-shipped protocol one run of every method of cfg.methods with a shipped
// path, at its own windows.
std::vector<PlannedRun> plan_referee_runs(const RefereeConfig& cfg, const RefereeData& data);

// The prompt of run r's windows as a fraction of each: kEvictPromptFraction for an eviction row (both protocols),
// else 0.5 as shipped (the first half, every row of that protocol) and 0 on the common protocol (every target scored).
double run_prompt_fraction(const PlannedRun& r);
// The prompt of a window of ctx tokens: floor(run_prompt_fraction(r) · ctx) (only the targets after it are scored).
int run_prompt_tokens(const PlannedRun& r, int ctx);

// The tail of every run's windows (EvalConfig::tail_fraction): kEvictPromptFraction, on which the eviction rows are
// paired with the others; 0 for a run whose prompt already reaches it (an eviction row scores only that tail).
double run_tail_fraction(const PlannedRun& r);

// The run record's windows label: "64/256", or "any" for a method whose windows do not matter.
std::string run_windows_label(const PlannedRun& r);

// True when --clip-grid tunes this method's clips (its row tunes clips and a grid is given).
bool referee_tunes_clips(const RefereeConfig& cfg, const RefereeMethod& m);

// The calibration text of a run: the leakage domain's eval file for the leakage row, else --calib-data.
struct CalibText {
  const std::string& file;
  const std::string& sha256;
  const std::vector<int32_t>& ids;
};
CalibText run_calib_text(const RefereeConfig& cfg, const RefereeData& data, const PlannedRun& r);

// Everything a run's numbers depend on (its record's "settings"): a run resumes only when they are equal.
nlohmann::json run_settings(const RefereeConfig& cfg, const RefereeData& data, const PlannedRun& r);

// OUT/runs/<key>.json.
std::string run_record_path(const RefereeConfig& cfg, const std::string& key);

// The cache of run r at ctx for a model of config mc: its row's codecs, windows and protocol, its prompt policy, the
// model's RoPE (for key codecs that store keys without it), an eviction row's budget at ctx, and `transform` or, when
// null, the transform its codecs imply (a row has one or the other), with PN-Mix's key widths `pair_bits` and vLLM's
// FP8 per-tensor scales `kv_scales`.
CacheConfig run_cache_config(const RefereeConfig& cfg, const ModelConfig& mc, const PlannedRun& r, int ctx,
                             std::shared_ptr<const KvTransform> transform = nullptr,
                             std::shared_ptr<const PairBitTable> pair_bits = nullptr,
                             std::shared_ptr<const Fp8Scales> kv_scales = nullptr);

// Run r's cache at ctx (run_cache_config) where only its shape and speed matter (the caches checked before any run,
// kvq referee --plan's timing and the cost column), its calibrated parts replaced by stand-ins: PN-Mix's key widths by
// mixed widths of the run's budget (calib/pnmix.h's timing_pair_bits), vLLM's FP8 scales by its default 1.0.
CacheConfig probe_cache_config(const RefereeConfig& cfg, const ModelConfig& mc, const PlannedRun& r, int ctx,
                               std::shared_ptr<const KvTransform> transform = nullptr);

// The record at `path` when it exists, parses and holds `settings`; else nullopt, logging why when a file was there.
// any_device: a record made on another device counts too (its "device" setting is not compared).
std::optional<nlohmann::json> resumable_record(const std::string& path, const nlohmann::json& settings,
                                               const RefereeLog& log, bool any_device = false);

}  // namespace kvq
