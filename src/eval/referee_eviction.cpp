#include "eval/referee_eviction.h"

#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "eval/referee_pooled.h"
#include "eval/referee_view.h"
#include "eval/rng.h"

namespace kvq {

using nlohmann::json;

namespace {

json pair_json(double lo, double hi) { return json::array({lo, hi}); }

double pct(double ratio) { return 100 * (ratio - 1); }

double ppl_of(const PooledWindows& w) { return std::exp(w.total_nll() / w.total_tokens()); }

// The run of `label` under `protocol` at window setting `windows` ("": any; a run whose windows read "any", bf16, at
// every setting), leaving out the leakage row; null when there is none.
const json* find_run(const json& runs, const std::string& label, const std::string& protocol,
                     const std::string& windows) {
  for (const json& r : runs)
    if (!run_is_leak(r) && r["method"]["label"] == label && run_protocol(r) == protocol &&
        (windows.empty() || run_windows(r) == "any" || run_windows(r) == windows))
      return &r;
  return nullptr;
}

// {ratio, ci95, change_pct, change_pct_ci95} of a over b on the same windows, or null when either is missing.
json ratio_json(const std::optional<PooledWindows>& a, const std::optional<PooledWindows>& b, int resamples,
                uint64_t seed) {
  if (!a || !b) return nullptr;
  const Interval q = paired_ppl_ratio(*a, *b, resamples, seed);
  return {{"ratio", q.estimate}, {"ci95", pair_json(q.lo, q.hi)}, {"change_pct", pct(q.estimate)},
          {"change_pct_ci95", pair_json(pct(q.lo), pct(q.hi))}};
}

std::string change(const json& v) {
  return v.is_null() ? "-" : fmt::format("{:+.3f}% [{:+.3f}%, {:+.3f}%]", v["change_pct"].get<double>(),
                                         v["change_pct_ci95"][0].get<double>(), v["change_pct_ci95"][1].get<double>());
}

std::string number(const json& v, const char* f) {
  return v.is_null() ? "-" : fmt::format(fmt::runtime(f), v.get<double>());
}

}  // namespace

json referee_eviction_json(const json& j) {
  std::vector<std::string> domains;
  for (const json& d : j["eval_data"]) domains.push_back(d["domain"].get<std::string>());
  const int resamples = j["config"]["bootstrap"].get<int>();
  const uint64_t seed = j["seeds"]["seed"].get<uint64_t>();
  json out = json::object();
  for (const json& r : j["runs"]) {
    if (run_is_leak(r) || r["method"].value("equal_bytes", std::string()).empty()) continue;
    const std::string protocol = run_protocol(r), key = r["key"], paired_label = r["method"]["equal_bytes"];
    const json* paired = find_run(j["runs"], paired_label, "common", run_windows(r));  // int2 has one path
    const json* bf16 = find_run(j["runs"], "bf16", protocol, "");  // as shipped it reads its own windows (0/0)
    for (const json& x : j["config"]["ctx"]) {
      const std::string cs = std::to_string(x.get<int>());
      const int from = run_scored_from(r, cs);
      const auto tag = [&](const std::string& what) {
        return mix_seed(seed, tag_hash("eviction/" + protocol + "/" + cs + "/" + key + "/" + what));
      };
      const std::optional<PooledWindows> own = pooled_windows(r, cs, domains);
      // the paired row and bf16 on the eviction row's targets: their tails from its prompt
      const auto on_targets = [&](const json* run) {
        return run ? pooled_windows_from(*run, cs, domains, from) : std::nullopt;
      };
      const std::optional<PooledWindows> pw = on_targets(paired), bw = on_targets(bf16);
      const Interval p = pooled_ppl(*own, resamples, tag("ppl"));
      const json budget = r.contains("equal_bytes") ? r["equal_bytes"]["by_ctx"].value(cs, json()) : json();
      const auto field = [&](const char* k) { return budget.is_object() ? budget.value(k, json()) : json(); };
      const std::string d = pooled_domain(r, cs);
      out[protocol][cs].push_back(
          {{"key", key},
           {"method", run_label(r)},
           {"windows", run_windows(r)},
           {"paired", paired_label},
           {"paired_key", paired ? (*paired)["key"] : json()},
           {"bits", run_bits(r, cs)},
           {"paired_bits", paired ? json(run_bits(*paired, cs)) : json()},
           {"target_bits", field("target_bits")},
           {"prompt_tokens", field("prompt_tokens")},
           {"kept_prompt_tokens", field("kept_prompt_tokens")},
           {"stored_tokens", field("stored_tokens")},
           {"scored_from", from},
           {"ppl", p.estimate},
           {"ppl_ci95", pair_json(p.lo, p.hi)},
           {"paired_ppl", pw ? json(ppl_of(*pw)) : json()},
           {"bf16_ppl", bw ? json(ppl_of(*bw)) : json()},
           {"vs_paired", ratio_json(own, pw, resamples, tag("paired"))},
           {"vs_bf16", ratio_json(own, bw, resamples, tag("bf16"))},
           {"paired_vs_bf16", ratio_json(pw, bw, resamples, tag("paired/bf16"))},
           {"kl", r["results"]["kl"][cs][d]["kl_mean"]},
           {"passkey", r["results"]["passkey"][cs]["accuracy"]},
           {"paired_passkey", paired ? (*paired)["results"]["passkey"][cs]["accuracy"] : json()}});
    }
  }
  return out;
}

std::string referee_eviction_markdown(const json& j) {
  if (!j.contains("eviction") || j["eviction"].empty()) return "";
  std::string s =
      "\n## Eviction at equal bytes (METHODS §5.8)\n\n"
      "The eviction row keeps bf16 rows (the kept tokens are exact) of the sinks, the recent window and the prompt "
      "tokens of highest AnDPro-style score (LORE-KV has no public code), decided once after a prompt of the first "
      "15/16 of each window. Every token after the prompt is stored bf16 and counted at 16 bits inside the budget, so "
      "the bytes stored at the ctx equal those of the paired row (int2 at the same windows) there, within one token's "
      "rows: prompt tokens kept = floor(target bits × ctx / 16) − (ctx − prompt). Only the last 1/16 is scored; the "
      "paired row and bf16 are read on the same targets (their NLLs over that tail, recorded by every run) and "
      "compared with a paired bootstrap over windows. The paired row is the common protocol's run (int2 has one "
      "path); bf16 is the eviction run's own protocol's.\n";
  for (const std::string& protocol : referee_protocol_order())
    for (const json& x : j["config"]["ctx"]) {
      const std::string cs = std::to_string(x.get<int>());
      if (!j["eviction"].contains(protocol) || !j["eviction"][protocol].contains(cs)) continue;
      s += fmt::format("\n### Protocol {}, ctx {}\n\n| method | windows | bits | paired row's bits | prompt | kept of "
                       "prompt | stored tokens | ppl (targets ≥ prompt) | paired row there | bf16 there | vs paired "
                       "row, 95% CI | vs bf16, 95% CI | paired row vs bf16 | passkey | paired row's passkey |\n"
                       "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n", protocol, cs);
      for (const json& e : j["eviction"][protocol][cs])
        s += fmt::format("| {} | {} | {:.4f} | {} | {} | {} | {} | {:.4f} | {} | {} | {} | {} | {} | {:.0f}% | {} |\n",
                         e["method"].get<std::string>(), e["windows"].get<std::string>(), e["bits"].get<double>(),
                         number(e["paired_bits"], "{:.4f}"), e["prompt_tokens"].dump(),
                         e["kept_prompt_tokens"].dump(), e["stored_tokens"].dump(), e["ppl"].get<double>(),
                         number(e["paired_ppl"], "{:.4f}"), number(e["bf16_ppl"], "{:.4f}"), change(e["vs_paired"]),
                         change(e["vs_bf16"]), change(e["paired_vs_bf16"]), 100 * e["passkey"].get<double>(),
                         e["paired_passkey"].is_null() ? "-" : fmt::format("{:.0f}%",
                                                                           100 * e["paired_passkey"].get<double>()));
    }
  return s;
}

}  // namespace kvq
