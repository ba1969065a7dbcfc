// The camps' published claims, checked (issue #20 part 4): each claim as data — its words, where it was published and
// measured, the metric, the number and the bits it states — against what the referee measures on its own model at the
// nearest bits, under each protocol, with a one-word verdict by one written rule.
//
// Verdict rule (conservative: "does not hold" only when the whole 95% CI says so):
//   value    a number the camp measured (a ppl increase): kvq's CI must lie inside [value - tol, value + tol] to hold;
//            a CI wholly outside that band does not hold (either side: a camp's number kvq cannot reproduce, better or
//            worse); a CI that straddles an edge cannot tell at this sample size. tol = max(0.5 points, value / 2).
//   at_most  a promise of at most `value` (near-lossless = a ppl increase at most 1%; a retrieval failure = passkey at
//            most 0.1): holds when the CI's upper end is at most value + tol, does not hold when its lower end exceeds
//            it, else cannot tell.
//   at_least a promise of at least `value` (retrieval 30/30): holds when the CI's lower end is at least value - tol, does
//            not hold when its upper end is below it, else cannot tell.
// A verdict names the model it was reached on. Where the evaluated checkpoint is one the claim was measured on
// (CampClaim::models, matched by name), the words are the rule's: holds / does not hold / cannot tell. Elsewhere they
// are "reproduced on M" / "not reproduced on M" / "cannot tell on M", M the evaluated model and its size
// (referee_model_label: "models/ref (19.7M)"): a compressed cache's error follows the model's key and value outliers
// (their channels, their scale, how many heads share them), which differ between a 20M and an 8B model and between
// families, so a claim measured on another model is checked for whether it carries over, not judged. The kvq figure is
// the run of the claim's methods, in that protocol and at that ctx, in the claim's effective-bit band (referee/bands.h)
// with the nearest bits; without one, the nearest run outside it, shown but "cannot tell" (it is not the claim's
// setting: e.g. Kitty's own windows at a short context); ppl increases are the paired bootstrap against the protocol's
// bf16 run over every eval domain pooled (results.json "bands"), passkey accuracy with its Wilson CI. A ppl increase
// resampled from fewer than kClaimMinWindows eval windows cannot tell either: a percentile bootstrap over so few
// windows has almost no distinct resamples (over one it collapses to the point), so its interval says nothing about the
// sample size.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvq {

enum class ClaimKind { Value, AtMost, AtLeast };
std::string claim_kind_name(ClaimKind k);  // "value" | "at_most" | "at_least"

struct CampClaim {
  std::string camp;                  // "TurboQuant (vLLM)"
  std::string claim;                 // the claim as published
  std::string source;                // where it is published (and where kvq's notes quote it)
  std::string measured_on;           // the stack, model, data and context it was measured on
  std::string metric;                // "ppl_increase_pct" (percent) | "passkey" (accuracy, 0..1)
  ClaimKind kind = ClaimKind::Value;
  double value = 0;                  // the claimed number, in the metric's unit
  double tolerance = 0;              // the rule's tol, in the metric's unit
  double bits = 0;                   // bits per element the claim states
  std::vector<std::string> methods;  // kvq rows that carry the format (the nearest-bits run is compared)
  std::vector<std::string> models;   // the checkpoints it was measured on, where the source names them
                                     // ("Llama-3.1-8B-Instruct"); empty when it does not
};

// Every claim, in report order.
const std::vector<CampClaim>& camp_claims();

// The fewest eval windows a ppl verdict rests on (the paired bootstrap's resampled units); below it: cannot tell.
inline constexpr int kClaimMinWindows = 5;

// The rule's outcome for a claim on kvq's 95% CI [lo, hi]: "holds" | "does not hold" | "cannot tell".
std::string claim_verdict(ClaimKind kind, double value, double tolerance, double lo, double hi);

// Whether the evaluated model (its name: results.json model.name, e.g. "Qwen/Qwen3-8B" or "models/ref") is one of the
// claim's models: equal, or ending in one, letters and digits compared without case ("/models/Qwen3-8B" is
// "Qwen3-8B"; "Qwen3-8B-Base" is not).
bool claim_same_model(const CampClaim& c, const std::string& model_name);

// The verdict as published: the outcome itself on the claim's own model, else its reading on `model_label`
// ("reproduced on L", "not reproduced on L", "cannot tell on L").
std::string claim_verdict_text(const std::string& outcome, bool same_model, const std::string& model_label);

// The evaluated model as verdicts name it: results["model"]'s name (else its dir) and parameter count, "models/ref
// (19.7M)", "Qwen/Qwen3-8B (8.19B)"; without a count, the name alone.
std::string referee_model_label(const nlohmann::json& results);

// The rule above, in one paragraph (report.md, report.html, results.json "claims_rule").
std::string claim_rule_text();

// results.json "claims": [{camp, claim, source, measured_on, models, metric, kind, value, tolerance, bits, methods,
// same_model, kvq: {protocol: {ctx: {key, method, bits, same_band, measured, ci95, windows (ppl claims: the paired
// increase's windows), verdict (claim_verdict_text)} or null (no run of its methods)}}}], from results["bands"]
// (referee_bands_json), config.ctx and results["model"].
nlohmann::json referee_claims_json(const nlohmann::json& results);

// A claim cell's run as the tables name it: "e8_2 at 2.125 bits", marked " (other band)" outside the claim's band and
// " (N windows)" below kClaimMinWindows (the two reasons a cell cannot tell whatever its interval).
std::string claim_run_text(const nlohmann::json& cell);

// report.md's claims section ("" without results["claims"]). The HTML twin is in report_html.cpp.
std::string referee_claims_markdown(const nlohmann::json& results);

}  // namespace kvq
