// kvq referee --plan: what a referee would run on a model and how long it would take, before any of it runs. The
// same inputs as the run (model directory, data, methods, windows, protocols, contexts, sample sizes, OUT for
// resume), but no weights are read: every distinct cache of the plan is timed once on the evaluation's device at the
// model's shape with random ("dummy") weights — timing only — through the evaluation's own code:
//   window   one lockstep window (kvq::lockstep_fidelity: the BF16 reference, the method and, at the first ctx, the
//            forced per-layer pass) of ctx random tokens with the run's prompt and tail;
//   prompt   one passkey prompt (kvq::greedy_decode: ctx - kPlanAnswerTokens prompt tokens, then that many answer
//            tokens);
//   build    making the runners (on cuda: the model on the device and its cache);
//   tune     with --clip-grid, one held-out window of a tuned row (kvq::perplexity) and its runner.
// A run's estimate: at each ctx, build + windows × window + prompts × prompt, plus its clip tuning (grid² runners
// and tune-windows windows each) where that run would tune. Calibrated rotations are timed with a random rotation
// of the same shape (a rotation's cost is its shape's, not its values'), PN-Mix keys with 2-bit widths; the
// calibrations themselves (on the CPU) and the cost column's probes (attention, decode speed) are not in the estimate
// (the calibrations are listed). A run whose record in OUT/runs/ holds the same
// settings is "done" (resume: nothing to run); a run whose cache the device cannot run is "refused" with the reason;
// one whose cache cannot be built for the model at all is "cannot run".
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "model/runner.h"
#include "referee/referee.h"

namespace kvq {

// Answer tokens of a timed passkey prompt (greedy_decode after the prompt); the real prompts' answers are a key's
// digits in the model's tokenizer, a handful of tokens.
inline constexpr int kPlanAnswerTokens = 8;

// The device a plan is timed on.
struct PlanDevice {
  std::string device;          // --device: "cpu" | "cuda"
  RunnerFactory runners;       // runners over random weights of the model's shape (timing only)
  // Throws a kvq::Error when the device cannot run a cache at the model's head_dim (RefereeConfig::device_check);
  // null: every cache runs.
  std::function<void(const CacheConfig&, int head_dim)> check;
};

// The plan of cfg on dev (the model directory needs config.json; tokenizer.json, when present, counts the eval texts'
// windows; without it each domain is taken to hold --windows windows of every ctx, and --windows 0 is refused):
// {"model", "device", "runner", "config", "runs": [{key, method, windows, protocol, status, reason, calibration,
// tokens, per_ctx: [{ctx, windows, prompts, build_s, window_s, prompt_s}], tune, estimate_s}], "calibrations",
// "totals", "timing_s"}. Progress lines go to log.
nlohmann::json plan_referee(const RefereeConfig& cfg, const PlanDevice& dev, const RefereeLog& log = {});

// The plan as the terminal shows it: one table row per run, then the totals.
std::string referee_plan_table(const nlohmann::json& plan);

}  // namespace kvq
