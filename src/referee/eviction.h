// The referee's eviction rows at equal bytes (METHODS §5.8; the row: referee/methods.cpp "evict(int2)"), side by
// side with the quantized row whose bytes they store. Computed at the report stage from the run records, like the
// bands (referee/bands.h), so `--report-only` gives it.
//
// - An eviction row stores at each ctx what its paired row (results.json runs[].method.equal_bytes, int2) stores at the
//   same windows (runs[].equal_bytes.by_ctx: the target bits, the prompt, the prompt tokens kept, the tokens stored).
// - It scores only the last 1/16 of each window (after its prompt, kEvictPromptFraction); the paired row and bf16 are
//   taken on the same targets: their recorded tails (referee/pooled.h pooled_windows_from; for KL and top-1 the
//   paired row's KL tail, results.kl[ctx][domain].tail).
// - The paired row is the common protocol's run at the same windows (int2 has one path: decode-faithful); bf16 is the
//   eviction run's own protocol's. Ratios are paired bootstraps over windows (every domain pooled).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace kvq {

// results.json "eviction": {protocol: {ctx: [{key, method, windows, paired, paired_key, bits, paired_bits,
// target_bits, prompt_tokens, kept_prompt_tokens, stored_tokens, scored_from, ppl, ppl_ci95, paired_ppl, bf16_ppl,
// vs_paired, vs_bf16, paired_vs_bf16, kl, kl_ci95, top1, top1_ci95, paired_kl, paired_kl_ci95, paired_top1,
// paired_top1_ci95, fidelity_vs_paired, passkey, paired_passkey}]}} with each vs_* = {ratio, ci95, change_pct,
// change_pct_ci95} or null (no such run, or a record from before tails); the ppls of the paired row and bf16 are on the
// eviction row's targets. kl / top1: KL(p_bf16 ‖ p) per row and top-1 agreement with bf16 over the rows predicting
// those targets, pooled over the domains' windows (Σ / Σ rows), percentile bootstrap CIs over windows; the paired
// row's from the KL tail it recorded (results.kl[ctx][domain].tail); fidelity_vs_paired = {kl: {estimate, ci95},
// top1: {estimate, ci95}}, the eviction row's minus the paired row's per row, paired bootstrap over windows. Each of
// these is null where a record lacks it (a paired record from before KL tails). From the other keys of results
// (config.ctx, config.bootstrap, seeds.seed, eval_data, runs).
nlohmann::json referee_eviction_json(const nlohmann::json& results);

// One eviction row's cells for report.md and report.html: field `value` of row e with its ci95 field `ci` as
// "0.01234 [0.01100, 0.01400]" (f: the format of one number), and the paired difference `what` ("kl" | "top1") of
// its fidelity_vs_paired with its CI; "-" where the row has none.
std::string eviction_cell(const nlohmann::json& e, const char* value, const char* ci, const char* f);
std::string eviction_difference(const nlohmann::json& e, const char* what, const char* f);

// report.md's eviction section from results["eviction"] ("" when absent or empty). The HTML twin is in report_html.cpp.
std::string referee_eviction_markdown(const nlohmann::json& results);

}  // namespace kvq
