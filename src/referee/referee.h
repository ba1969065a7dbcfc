// kvq referee: the fair comparison of docs/guide/methods.md §5, §7 — every camp's cache method under two protocols on
// the same model, eval data, seeds and group (128), with the fidelity metrics of §8 (kvq::evaluate) and the honest
// effective bits of §6 at each stated context, grouped by equal bits and held against the camps' published claims.
//
// Methods (labels; --methods takes them comma-separated; one row each in referee/methods.cpp):
//   bf16, int8, int4, kv4rl, int2, kivi2               plain caches (kv4rl: INT8 windows), no rotation
//   int2+quarot                                      data-free Hadamard rotation
//   int2+oscar                                       OSCAR spectral rotations (calibrated, grid-independent)
//   optr(quarot), optr(oscar)                        OptR, two-phase post-W_O objective
//   optr-joint(oscar), optr-pre-wo(oscar), optr-recon(oscar)   kvq's joint objective and the two ablations
//   pnmix, pnmix(energy)                             PN-Mix key widths per RoPE pair (calibrated), int2 values
//   turboquant_k8v4, _4bit_nc, _k3v4_nc, _3bit_nc    vLLM's TurboQuant presets; turboquant_2bit: kvq's extension
//   fp8, fp8(scales), fp8_e5m2, fp8_per_token_head   vLLM's FP8 caches: scale 1.0, per-tensor scales calibrated on
//                                                    --calib-data (a checkpoint's), e5m2, per (token, head) scales
//   nexusquant, e8_2                                 NexusQuant's shipped int8 E8 codec and its 2-bit llama.cpp block
//   oscar_int2, kitty_int2, kitty_int2_20            OScaR; Kitty (25% / 20% of key channels at 4 bits)
//   q8_0, q8_0/q4_0, q5_0, q4_1, q4_0, iq4_nl        llama.cpp's KV cache types (-ctk/-ctv)
//   evict(int2)                                      eviction at int2's bytes at each ctx (AnDPro-style score; LORE-KV
//                                                    has no public code), METHODS §5.8
// Protocols (--protocols): "common" — decode-faithful, the window settings (sink/recent in BF16, default 64/256, 16/64,
// 0/0; bf16 runs once: windows do not change it), no layer skipped, clips tuned where the format has one, llama.cpp's
// attn_rot off; "as-shipped" — one run per camp row at its own windows, layer skip, attn_rot and prompt policy
// (referee/methods.h ShippedPath), every as-shipped run (its bf16 reference included) scoring the second half of each
// window after a prompt of its first half. The eviction row runs under both (as shipped at kvq's 64/256: no eviction
// code is public) after a prompt of the first 15/16 of each window, scoring the last 1/16; every run records its NLL
// over that last 1/16 too, on which the eviction row is paired with it (referee/eviction.h). Equal bits and claims
// (referee/bands.h, referee/claims.h): results.json "bands", "pareto", "claims"; the eviction rows beside their rows of
// equal bytes (referee/eviction.h): "eviction". Clips (with clip_grid): per INT2 method and window setting, the (key,
// value) clip pair of the grid with the lowest ppl on held-out text, cached in OUT/clips/; OptR takes the pair tuned
// for its base rotation and is calibrated for it (its learned rotation belongs to one grid). Calibration: on
// --calib-data only, refused when that file lies in --eval-data or has the sha256 of an eval file. OptR is calibrated
// for the int2 grid and the windows of its row. Rotation files are cached in OUT/rotations/ under a name that hashes
// every setting (model fingerprint, calibration sha256, method, budget, grid, windows). A leakage row: optr(oscar) at
// the first window setting calibrated on the largest evaluated domain's eval file. Resume: OUT/runs/<key>.json per
// (method, windows, protocol) as soon as it finishes; a rerun skips runs whose json exists and records the same
// settings. Files (src/referee/): methods (the method table), plan (runs, settings, resume), store (rotation and clip
// stores), results (run records, results.json), bands / claims (equal bits, claims), eviction (the eviction rows),
// pooled (the unseen-domain pool), report_md / report_html (the reports), io and view (helpers), referee.cpp (the
// driver: inputs, evaluation passes, the run loop).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/runner.h"
#include "referee/methods.h"

namespace kvq {

struct RefereeConfig {
  std::string model_dir;               // -m
  std::string model_name;              // --model-name: how verdicts name the model (default: config.json's
                                       // _name_or_path, else model_dir)
  std::string calib_data;              // --calib-data: calibration text (disjoint from the eval data)
  std::string eval_dir;                // --eval-data: DIR/*.txt, one domain each
  std::string out_dir;                 // -o: results, reports, runs/, rotations/
  std::vector<int> ctx = {2048};       // context lengths (effective bits, ppl/kl/passkey at each; layers at ctx[0])
  std::vector<std::string> domains;    // eval domains to use (file stems); empty: all
  std::vector<RefereeMethod> methods = referee_methods();
  std::vector<RefereeWindows> windows = {{64, 256}, {16, 64}, {0, 0}};  // the common protocol's window settings
  std::vector<RefereeProtocol> protocols = {RefereeProtocol::Common, RefereeProtocol::AsShipped};  // --protocols
  int eval_windows = 0;                // windows per domain and ctx for ppl / kl / layers (0: all)
  int passkey_trials = 10;             // prompts per (ctx, depth)
  std::vector<double> depths;          // passkey depths (empty: 0, 0.1, ..., 1)
  int bootstrap = 1000;                // bootstrap resamples
  uint64_t seed = 0;                   // base seed of passkey prompts and bootstrap (every run the same)
  int threads = 0;                     // worker threads (0: all cores)
  SimdLevel simd = best_simd_level();  // --simd: the CPU kernels' level (recorded in each run's runner line)
  int group = 128;                     // group size of every quantized cache
  int calib_tokens = 32768, calib_chunk = 2048, calib_steps = 80;  // calibration budget (OSCAR uses tokens/chunk)
  std::vector<float> clip_grid;        // quantile clips tried for keys and for values of every INT2 method (METHODS
                                       // §7: each method's clip tuned on the same held-out data); empty: no tuning,
                                       // METHODS §1 defaults (0.96 / 0.92)
  int tune_windows = 1;                // held-out windows of ctx[0] tokens per clip candidate: the END of
                                       // --calib-data, past the calibration budget (so disjoint from both)
  bool leakage = true;                 // add the same-domain calibration row
  bool quick = false;                  // recorded in the results (the CLI sets the quick subset)
  bool calibrate_only = false;         // calibrate (or find cached) every rotation the plan needs, then stop
  bool report_only = false;            // run nothing: results.json and the reports from the runs in OUT/runs; the
                                       // plan's runs without a record are listed in results.json "missing_runs"
  std::string device = "cpu";          // where the evaluation passes run ("cpu", "cuda/bf16", ...): part of every
                                       // run's settings, so runs made on another device are not resumed
  bool any_device = false;             // --report-only: pool the records of every device (the report lists where
                                       // each run was evaluated)
  std::function<RunnerFactory(Model&)> runners;  // the evaluation runners over the loaded model (null: CPU);
                                                 // calibration always runs on the CPU model
  // Throws a kvq::Error when the evaluation's device cannot run a cache at the model's head_dim (cuda: a cache
  // without GPU kernels); every planned run is checked before the first starts. Null: the CPU runs every cache.
  std::function<void(const CacheConfig&, int head_dim)> device_check;
  bool skip_unsupported = false;       // --skip-unsupported: the runs device_check refuses are left out and listed in
                                       // results.json "missing_runs" with the reason, instead of refusing the referee
  // The cost column: one decode step's attention of a row's cache (its codecs and windows, decode-faithful, no layer
  // skipped) at one fixed shape on the evaluation's device, as `kvq bench attention` measures it (the CLI's probe:
  // {"shape", "device", "attention_us", "bytes_read", "fraction_of_read_probe", ...}); a kvq::Error is recorded as the
  // row's "unsupported" cost. Null: no cost column.
  std::function<nlohmann::json(const CacheConfig&)> cost_probe;
  // The cost column's decode speed at the evaluated model: timed greedy steps of one sequence filled to the longest
  // --ctx (less the steps), through the run's own cache, rotation and evaluation runner, once per distinct cache
  // (eval/decode_speed.h; run record "decode"). 0: not measured.
  int decode_steps = 0;
};

// One finished (method, windows) run: the `kvq eval --json` object plus the referee's fields.
struct RefereeRun {
  std::string key;            // file stem under OUT/runs/
  nlohmann::json record;      // report_json + method, label, windows, rotation, calibration, settings
  bool resumed = false;       // read back from an earlier invocation
};

struct RefereeResult {
  nlohmann::json results;     // what OUT/results.json holds
  std::vector<RefereeRun> runs;
  int runs_executed = 0, runs_resumed = 0;
  int calibrations_run = 0, calibrations_reused = 0;
};

// Progress lines (with ETA) go here; default: stderr.
using RefereeLog = std::function<void(const std::string& line, bool transient)>;
// Progress lines on stderr, a transient one overwritten by the next (run_referee's default; kvq referee --plan's).
RefereeLog referee_stderr_log();

// Checks every input (disjoint calibration data first, before the model loads), runs or resumes every
// (method, windows) and writes OUT/results.json, OUT/report.md and OUT/report.html. With calibrate_only it stops
// once OUT/rotations/ holds every rotation the plan needs (no runs, no reports): calibrate on one machine, carry
// OUT/ to another and evaluate there.
RefereeResult run_referee(const RefereeConfig& cfg, const RefereeLog& log = {});

// `kvq referee --report-only --results FILE -o OUT`: report.md and report.html of a results.json written earlier
// (plain or gzip-compressed: docs/reports/*-results.json.gz) into out_dir, rendered by this kvq, its claims checked
// again under the current rule. A record from before results.json named its model (model.name, model.parameters)
// takes them from model.dir when that checkpoint is here with the recorded fingerprint, else its dir alone.
// Returns the results as rendered.
nlohmann::json render_referee_reports(const std::string& results_file, const std::string& out_dir);

// Refuses (kvq::Error) calibration data inside eval_dir or byte-identical (sha256) to one of its .txt files.
void check_calibration_disjoint(const std::string& calib_file, const std::string& eval_dir);

// referee/report_md.cpp
// Schema check of results.json: required keys and types per run; returns the problems found (empty: valid).
std::vector<std::string> referee_schema_errors(const nlohmann::json& results);
std::string referee_markdown(const nlohmann::json& results);      // report.md
std::string referee_summary_table(const nlohmann::json& results); // the table printed at the end

// referee/report_html.cpp: one self-contained HTML file (inline SVG charts, no external assets).
std::string referee_html(const nlohmann::json& results);

}  // namespace kvq
