// The referee at equal bits (METHODS §6-7: "compare methods only at equal b_eff, and say N"): every run of a protocol
// placed in an effective-bit band at each stated context, compared inside its band with the paired bootstrap over
// windows, and the Pareto series (ppl increase and KL against effective bits) that report.html draws per protocol.
// Computed at the report stage from the run records (results.json "runs"), so `--report-only` on old runs gives them.
//
// - Bits: the run's kv_bits_effective at the context (bytes actually stored, windows and scales included; skipped
//   layers at 16 bits, METHODS §6).
// - Bands: [2.0, 2.4], (2.4, 3.3], (3.3, 4.5], above 4.5, and below 2.0 for anything smaller. The upper edge belongs to
//   its band (llama.cpp's q4_0 and iq4_nl store exactly 4.5 bits and sit with int4 and TurboQuant's 4-bit keys).
// - Pooled over every eval domain (the "all" column): ppl = exp(Σ window NLL / Σ tokens); its increase over the same
//   protocol's bf16 run is the paired ratio exp(Σ (NLL_run − NLL_bf16) / Σ tokens), bootstrap CI paired by (domain,
//   window index) (referee/pooled.h). KL and top-1 are the runs' own pooled figures and CIs.
// - Inside a band: the run with the lowest pooled ppl is the band's best; every other run gets the paired ratio
//   against it, "tied" when its CI holds 1, else "worse".
// - Targets: a run scored after a longer prompt than its protocol's (the eviction row, METHODS §5.8: the last 1/16 of
//   each window) has its ppl over those targets; its increase and its pair with the band's best are on the same
//   targets of the other run (its recorded tail, paired_windows); the best is chosen among the runs of the band's
//   earliest prompt, whose ppl covers the protocol's targets. Each row carries scored_from (its prompt).
// - Pareto front: the runs no other run of the protocol beats on both bits (fewer or equal) and ppl increase (lower
//   or equal, one of them strictly), on the point estimates.
// The leakage row is left out (calibrated on an eval file).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvq {

struct BitBand {
  std::string label;  // "2.0-2.4"
  double lo, hi;      // lo < bits <= hi; the 2.0-2.4 band also holds bits == 2.0, "below 2.0" holds bits < 2.0
};

// Every band in order: below 2.0, 2.0-2.4, 2.4-3.3, 3.3-4.5, above 4.5.
const std::vector<BitBand>& referee_bit_bands();
// The index into referee_bit_bands() of a run at `bits` effective bits (a 1e-9 slack at each edge, so 4.5 computed as
// 4.500000001 stays in 3.3-4.5).
int bit_band(double bits);

// results.json "bands": {protocol: {ctx: [{band, lo, hi, best_key, runs: [{key, method, windows, bits, scored_from,
// ppl, ppl_ci95, increase_pct, increase_pct_ci95, increase_windows, kl, kl_ci95, top1, passkey, passkey_ci95,
// vs_best}]}]}} with vs_best = null for the band's best (or a pair the records cannot make: a record from before
// tails), else {ratio, ci95, change_pct, change_pct_ci95, scored_from, verdict}; only bands that hold a run; increase
// (and increase_windows, the eval windows its paired bootstrap resampled) null without a bf16 run of that protocol (or
// its tail).
// results.json "pareto": {protocol: {ctx: [{key, method, windows, bits, scored_from, increase_pct, increase_pct_ci95,
// kl, kl_ci95, front}]}} ordered by bits.
// Both from the other keys of results (config.ctx, config.bootstrap, seeds.seed, eval_data, runs).
nlohmann::json referee_bands_json(const nlohmann::json& results);
nlohmann::json referee_pareto_json(const nlohmann::json& results);

// report.md's equal-bits section from results["bands"] ("" when absent). The HTML twin is in report_html.cpp.
std::string referee_bands_markdown(const nlohmann::json& results);

}  // namespace kvq
