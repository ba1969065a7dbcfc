// The referee's "unseen domains" figures (issue #5): methods judged on the eval domains NOT used for calibration,
// pooled. Computed at the report stage from the per-window NLLs every run record already stores
// (results.ppl[ctx][domain].window_nll / .tokens / .windows), so `kvq referee --report-only` on old runs gives them.
//
// - Unseen domains: every eval domain whose name differs from the calibration file's stem (data/calib/linux.txt:
//   linux is seen; data/eval/linux.txt is the same domain, other text).
// - Pooled ppl = exp(Σ window NLL / Σ tokens) over the unseen domains' windows, percentile bootstrap 95% CI over
//   those windows, and its increase over the bf16 run pooled the same way.
// - Paired comparison of a method against a base run at the same windows setting and ctx: ratio of pooled ppls
//   exp(Σ (NLL_method - NLL_base) / Σ tokens), bootstrap over windows paired by (domain, window index) — both runs
//   scored the same windows, so resampling their differences removes the between-window variance both share.
// The leakage row is left out (calibrated on an eval file, its seen domain differs), and so are the as-shipped runs
// (they score the second half of each window only): these pools are the common protocol's. The eviction row scores
// only the last 1/16 of each window (after its prompt): its figures and pairs are on those targets, the other runs'
// tails (paired_windows); its rows carry scored_from.
// Redundant pools: when every eval domain is unseen (the pool is the "all" column) or only one is (the pool is that
// domain's column), report.md / report.html print no pooled-ppl table, only a line naming the column it equals, and
// keep the paired table (new information either way); results.json always carries both. No unseen domain (only the
// calibration domain evaluated): results.json "unseen" is null and the reports have no such section.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/bootstrap.h"

namespace kvq {

// One run's windows over a list of domains, concatenated in list order.
struct PooledWindows {
  std::string run;                   // the run's key, for messages
  std::vector<std::string> domains;  // (n_domains) the pooled domains, in order
  std::vector<int> windows;          // (n_domains) windows per domain
  std::vector<double> nll;           // (n_windows) summed NLL (nats) of each window
  std::vector<double> tokens;        // (n_windows) tokens scored by each window (the domain's tokens / windows)
  double total_nll() const;          // Σ nll
  double total_tokens() const;       // Σ tokens
};

// Eval domains (results.json eval_data order) whose name differs from the stem of calib_file.
std::vector<std::string> unseen_domains(const std::vector<std::string>& domains, const std::string& calib_file);

// The windows of run record `run` at context ctx ("8192") over `domains`; kvq::Error naming the run, ctx and domain
// when a ppl record is missing, lacks window_nll, or its window count disagrees with window_nll.
PooledWindows pooled_windows(const nlohmann::json& run, const std::string& ctx,
                             const std::vector<std::string>& domains);

// The same windows scored from the prompt `from` (targets at positions >= from): the run's own windows when its prompt
// at ctx is `from`, else the tail it recorded from there (results.ppl[ctx][domain].tail, eval/evaluator.h); nullopt
// when it has neither (a record from before tails, or another tail). kvq::Error as pooled_windows on a bad record.
std::optional<PooledWindows> pooled_windows_from(const nlohmann::json& run, const std::string& ctx,
                                                 const std::vector<std::string>& domains, int from);

// Two runs' windows on the targets both scored: each from the later of their prompts at ctx (run_scored_from; the
// run of the earlier prompt contributes its tail), so that a run scored after a longer prompt (the eviction row) pairs
// with every other run of its protocol. nullopt when the earlier-prompt run recorded no such tail.
std::optional<std::pair<PooledWindows, PooledWindows>> paired_windows(const nlohmann::json& a, const nlohmann::json& b,
                                                                      const std::string& ctx,
                                                                      const std::vector<std::string>& domains);

// Pooled ppl exp(Σ nll / Σ tokens) with its percentile bootstrap CI over windows (estimate = the pooled ppl).
Interval pooled_ppl(const PooledWindows& w, int resamples, uint64_t seed, double level = 0.95);

// Ratio of pooled ppls method / base, exp(Σ (nll_m - nll_b) / Σ tokens), with a paired percentile bootstrap CI over
// windows. kvq::Error when the two runs did not score the same windows (domains, window counts, tokens per window).
Interval paired_ppl_ratio(const PooledWindows& method, const PooledWindows& base, int resamples, uint64_t seed,
                          double level = 0.95);

// The base a method is judged against besides bf16 (its "natural baseline"), from its results.json method object:
// the baseline of its row in referee_methods(); for a label the table does not hold, the rule the rows follow:
// an eviction row -> its equal_bytes row (int2: the quantized cache of the same bytes);
// optr / optr-* of rotation R -> "<type>+R" (the rotation it starts from); <type>+oscar -> "<type>+quarot" (calibrated
// versus data-free rotation); <type>+quarot -> "<type>" (rotation versus none); no rotation with windows of another
// codec than bf16 (KV4-RL) -> "<type>" (the same codecs with bf16 windows); anything else: "" (bf16 only).
std::string natural_base(const nlohmann::json& method);

// results.json "unseen" from the other keys of results (calibration_data.file, eval_data, config.ctx,
// config.bootstrap, seeds.seed, runs): null when no eval domain is unseen, else
//   {calibration_domain, domains, redundant_with (the existing ppl column the pool equals: "all" when every domain is
//    unseen, the domain when only one is; else null), bootstrap, seed,
//    ppl: {ctx: [{key, method, windows, n_windows, tokens, ppl, ci95, scored_from, ppl_bf16, increase_pct} per
//          non-leakage run]} (ppl_bf16: bf16 on the run's targets),
//    paired: {ctx: [{key, method, base_key, base, windows, scored_from, ratio, ci95, change_pct, change_pct_ci95}]}}.
// Paired rows: every non-bf16, non-leakage run against its natural_base at the same windows, then against bf16, where
// that run exists. kvq::Error when runs scored different windows.
nlohmann::json referee_unseen_json(const nlohmann::json& results);

// The unseen domains of results["unseen"] as one line, "a, b, c" (both reports' section titles).
std::string unseen_domain_list(const nlohmann::json& unseen);

// report.md's section from results["unseen"] ("" when absent or null). The HTML twin is in report_html.cpp.
std::string referee_unseen_markdown(const nlohmann::json& results);

}  // namespace kvq
