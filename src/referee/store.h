// The referee's stores, both resumable across invocations:
// - rotations: a calibrated rotation per (method, calibration data, budget, grid, windows) in
//   OUT/rotations/<method>-<hash>.safetensors, the hash over every setting it depends on (a learned rotation's row
//   grid and windows, none for OSCAR's grid-independent statistics); data-free rotations are built, never stored.
// - clips: with --clip-grid, per tuned method and window setting, the (key, value) clip pair of the grid with the
//   lowest ppl on held-out text (the end of --calib-data, past the calibration budget), in
//   OUT/clips/<method>-<hash>.json. A method whose row takes its clips from another row (OptR: its base) reads
//   that row's choice.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calib/calibrate.h"
#include "model/runner.h"
#include "referee/plan.h"

namespace kvq {

// The rotation of a run.
struct Rotation {
  std::shared_ptr<const KvTransform> transform;   // null: none
  std::shared_ptr<const PairBitTable> pair_bits;  // PN-Mix key widths (a key_widths kind's calibration); else null
  std::shared_ptr<const Fp8Scales> kv_scales;     // vLLM's FP8 per-tensor scales (a tensor_scales kind's); else null
  std::string file;                               // rotation file (empty: none / data-free)
  bool reused = false;                            // read from OUT/rotations/ instead of calibrated now
  double seconds = 0;                             // calibration seconds (of the original calibration when reused)
  nlohmann::json meta = nlohmann::json::object();  // the file's metadata
};

// The quantile clips of a run's keys and values: METHODS' defaults, or the best pair of the clip grid.
struct ClipChoice {
  float k = 1, v = 1;                       // clip ratios of keys and values
  std::string tuned_on;                     // the method whose cache was tuned (OptR: its base); empty: defaults
  nlohmann::json grid = nlohmann::json::array();  // [[clip_k, clip_v, held-out ppl], ...] in grid order
  nlohmann::json to_json() const { return {{"k", k}, {"v", v}, {"tuned_on", tuned_on}, {"grid", grid}}; }
};

// The calibration config of run r: its rotation kind and the cache grid it is calibrated for (a learned rotation:
// the row's windows and, when given, its tuned clips; otherwise windows 0/0 and default clips).
CalibrateConfig run_calibrate_config(const RefereeConfig& cfg, const PlannedRun& r, const ClipChoice* clips = nullptr);

// Every calibration and clip tuning the plan may need, checked before the first run: budget, chunk, windows and
// data length. kvq::Error naming the method and the data.
void check_calibration_budgets(const RefereeConfig& cfg, const RefereeData& data, const std::vector<PlannedRun>& plan);

// The file under OUT/rotations/ that holds run r's calibrated rotation (or PN-Mix widths), present or not: its name
// hashes every setting the calibration depends on, a learned rotation's clips (`clips`; null: its row's defaults)
// among them.
std::string referee_rotation_file(const RefereeConfig& cfg, const RefereeData& data, const PlannedRun& r,
                                  const ClipChoice* clips);
// The row whose tuned clips m takes (OptR: its base's); m itself when it tunes its own.
const RefereeMethod& referee_clips_source(const RefereeMethod& m);
// The file under OUT/clips/ that holds the clip pair tuned for `tuned` at windows w, present or not.
std::string referee_clip_file(const RefereeConfig& cfg, const RefereeData& data, const RefereeMethod& tuned,
                              const RefereeWindows& w);

class RefereeStore {
 public:
  // model(): the CPU model (loaded on first use; calibration runs on it); runners(): the evaluation runners.
  RefereeStore(const RefereeConfig& cfg, const RefereeData& data, std::function<Model&()> model,
               std::function<RunnerFactory()> runners, RefereeLog log)
      : cfg_(cfg), data_(data), model_(std::move(model)), runners_(std::move(runners)), log_(std::move(log)) {}

  // The rotation of run r: none, built data-free, read from OUT/rotations/ or calibrated now (and stored).
  Rotation rotation_for(const PlannedRun& r);
  // The clips of run r: its row's defaults, or the pair tuned for the row it takes its clips from.
  ClipChoice clips_for(const PlannedRun& r);

  int calibrations_run() const { return calibrations_run_; }
  int calibrations_reused() const { return calibrations_reused_; }
  size_t rotation_files() const { return rotations_.size(); }  // rotation files used by this invocation

 private:
  void say(const std::string& s, bool transient = false) const { log_(s, transient); }
  void take_cached(const char* what, const nlohmann::json& meta, const std::string& data_sha, double seconds,
                   Rotation& rot);
  bool read_rotation(const CalibrateConfig& cc, const std::string& data_sha, Rotation& rot);
  void calibrate_rotation(const PlannedRun& r, const CalibrateConfig& cc, const nlohmann::json& key, Rotation& rot);
  bool read_widths(const std::string& data_sha, Rotation& rot);
  void calibrate_widths(const PlannedRun& r, const CalibrateConfig& cc, const nlohmann::json& key, Rotation& rot);
  bool read_scales(const std::string& data_sha, Rotation& rot);
  void calibrate_scales(const PlannedRun& r, const CalibrateConfig& cc, const nlohmann::json& key, Rotation& rot);
  bool read_clips(const std::string& file, const nlohmann::json& spec, ClipChoice& out) const;
  double tune_clips(const RefereeMethod& tuned, const RefereeWindows& w, ClipChoice& out, std::string& where);

  const RefereeConfig& cfg_;
  const RefereeData& data_;
  std::function<Model&()> model_;
  std::function<RunnerFactory()> runners_;
  RefereeLog log_;
  std::map<std::string, Rotation> rotations_;  // by file path, this invocation
  std::map<std::string, ClipChoice> clips_;    // by "<tuned method>@<windows>", this invocation
  int calibrations_run_ = 0, calibrations_reused_ = 0;
};

}  // namespace kvq
