#include "referee/eviction.h"

#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "common/error.h"
#include "eval/bootstrap.h"
#include "eval/rng.h"
#include "referee/pooled.h"
#include "referee/view.h"

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

// One run's KL and top-1 against bf16 per window over a list of domains, concatenated in list order, on the rows that
// predict positions >= from.
struct PooledKl {
  std::vector<double> kl;      // (n_windows) Σ KL (nats) over the window's rows
  std::vector<double> agree;   // (n_windows) rows whose argmax agrees with bf16's
  std::vector<double> tokens;  // (n_windows) rows compared
};

// The run's own kl records when its prompt at ctx is `from`, else the tail it recorded from there
// (results.kl[ctx][domain].tail, eval/evaluator.h); nullopt when it has neither (a record from before KL tails) or no
// kl results at ctx. kvq::Error naming the run, ctx and domain on a malformed record.
std::optional<PooledKl> pooled_kl_from(const json& run, const std::string& ctx, const std::vector<std::string>& domains,
                                       int from) {
  const std::string who = run.value("key", std::string("(no key)"));
  if (!run.contains("results") || !run["results"].contains("kl") || !run["results"]["kl"].contains(ctx))
    return std::nullopt;
  const json& kl = run["results"]["kl"][ctx];
  const bool own = run_scored_from(run, ctx) == from;
  PooledKl out;
  for (const std::string& d : domains) {
    if (!kl.contains(d) || !kl[d].is_object()) return std::nullopt;
    const json& domain = kl[d];
    if (!own && !(domain.contains("tail") && domain["tail"].is_object() &&
                  domain["tail"].value("prompt_tokens", json()) == json(from)))
      return std::nullopt;
    const json& e = own ? domain : domain["tail"];
    const std::string span = own ? "" : fmt::format(" (tail from {})", from);
    const auto arr = [&](const char* k) -> const json& {
      KVQ_CHECK(e.contains(k) && e[k].is_array() && !e[k].empty(),
                "run {}: the kl record of domain {} at ctx {}{} has no per-window {} (rerun it with this kvq)", who, d,
                ctx, span, k);
      return e[k];
    };
    const json &sums = arr("window_kl_sum"), &agree = arr("window_top1_agree"), &tokens = arr("window_tokens");
    KVQ_CHECK(sums.size() == agree.size() && sums.size() == tokens.size(),
              "run {}: the kl record of domain {} at ctx {}{} has {} / {} / {} window KL sums / top-1 counts / tokens",
              who, d, ctx, span, sums.size(), agree.size(), tokens.size());
    for (size_t i = 0; i < sums.size(); ++i) {
      KVQ_CHECK(sums[i].is_number() && std::isfinite(sums[i].get<double>()) && agree[i].is_number() &&
                    tokens[i].is_number() && tokens[i].get<double>() > 0,
                "run {}: domain {} at ctx {}{}: window {} has KL sum {}, top-1 {}, tokens {} (need finite numbers and "
                "tokens > 0)", who, d, ctx, span, i, sums[i].dump(), agree[i].dump(), tokens[i].dump());
      out.kl.push_back(sums[i].get<double>());
      out.agree.push_back(agree[i].get<double>());
      out.tokens.push_back(tokens[i].get<double>());
    }
  }
  if (out.kl.empty()) return std::nullopt;
  return out;
}

json interval_json(const Interval& i) { return {{"estimate", i.estimate}, {"ci95", pair_json(i.lo, i.hi)}}; }

// {kl, kl_ci95, top1, top1_ci95} of one run's pooled rows (percentile bootstrap over windows), or null.
json fidelity_json(const std::optional<PooledKl>& w, int resamples, uint64_t seed_kl, uint64_t seed_top1) {
  if (!w) return nullptr;
  const Interval kl = bootstrap_ratio(w->kl, w->tokens, resamples, seed_kl).ci;
  const Interval top1 = bootstrap_ratio(w->agree, w->tokens, resamples, seed_top1).ci;
  return {{"kl", kl.estimate}, {"kl_ci95", pair_json(kl.lo, kl.hi)}, {"top1", top1.estimate},
          {"top1_ci95", pair_json(top1.lo, top1.hi)}};
}

// a − b per row on the same windows, Σ (x_a − x_b) / Σ rows with a paired bootstrap over windows: {kl: {estimate,
// ci95}, top1: {estimate, ci95}}, or null when either is missing. kvq::Error when they compared different rows.
json fidelity_diff_json(const std::optional<PooledKl>& a, const std::optional<PooledKl>& b, const std::string& who,
                        int resamples, uint64_t seed_kl, uint64_t seed_top1) {
  if (!a || !b) return nullptr;
  KVQ_CHECK(a->tokens == b->tokens, "eviction {}: the paired row compared other rows per window ({} windows vs {})",
            who, a->tokens.size(), b->tokens.size());
  std::vector<double> dkl(a->kl.size()), dtop(a->kl.size());
  for (size_t i = 0; i < dkl.size(); ++i) dkl[i] = a->kl[i] - b->kl[i], dtop[i] = a->agree[i] - b->agree[i];
  return {{"kl", interval_json(bootstrap_ratio(dkl, a->tokens, resamples, seed_kl).ci)},
          {"top1", interval_json(bootstrap_ratio(dtop, a->tokens, resamples, seed_top1).ci)}};
}

std::string change(const json& v) {
  return v.is_null() ? "-" : fmt::format("{:+.3f}% [{:+.3f}%, {:+.3f}%]", v["change_pct"].get<double>(),
                                         v["change_pct_ci95"][0].get<double>(), v["change_pct_ci95"][1].get<double>());
}

std::string number(const json& v, const char* f) {
  return v.is_null() ? "-" : fmt::format(fmt::runtime(f), v.get<double>());
}

// "0.01234 [0.01100, 0.01400]" of a value and its ci95 pair (f: the format of one number), or "-".
std::string with_ci(const json& v, const json& ci, const char* f) {
  if (v.is_null() || !ci.is_array()) return "-";
  const std::string g = fmt::format("{0} [{0}, {0}]", f);
  return fmt::format(fmt::runtime(g), v.get<double>(), ci[0].get<double>(), ci[1].get<double>());
}

}  // namespace

std::string eviction_cell(const json& e, const char* value, const char* ci, const char* f) {
  return with_ci(e.value(value, json()), e.value(ci, json()), f);
}

std::string eviction_difference(const json& e, const char* what, const char* f) {
  const json& d = e.value("fidelity_vs_paired", json());
  if (!d.is_object()) return "-";
  return with_ci(d[what]["estimate"], d[what]["ci95"], f);
}

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
      // KL and top-1 against bf16 on the same rows: the eviction row's own, the paired row's tail from its prompt
      const std::optional<PooledKl> own_kl = pooled_kl_from(r, cs, domains, from);
      const std::optional<PooledKl> paired_kl = paired ? pooled_kl_from(*paired, cs, domains, from) : std::nullopt;
      const json fid = fidelity_json(own_kl, resamples, tag("kl"), tag("top1"));
      const json paired_fid = fidelity_json(paired_kl, resamples, tag("paired/kl"), tag("paired/top1"));
      const auto of = [](const json& f, const char* k) { return f.is_null() ? json() : f[k]; };
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
           {"kl", of(fid, "kl")},
           {"kl_ci95", of(fid, "kl_ci95")},
           {"top1", of(fid, "top1")},
           {"top1_ci95", of(fid, "top1_ci95")},
           {"paired_kl", of(paired_fid, "kl")},
           {"paired_kl_ci95", of(paired_fid, "kl_ci95")},
           {"paired_top1", of(paired_fid, "top1")},
           {"paired_top1_ci95", of(paired_fid, "top1_ci95")},
           {"fidelity_vs_paired",
            fidelity_diff_json(own_kl, paired_kl, key, resamples, tag("kl/paired"), tag("top1/paired"))},
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
      "paired row and bf16 are read on the same targets (their NLLs, and the paired row's KL and top-1 against "
      "bf16, over that tail, recorded by every run) and compared with a paired bootstrap over windows. The paired row is the common protocol's run (int2 has one "
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
      s += "\nKL(p_bf16 ‖ p) per token and top-1 agreement with bf16 on the same rows (those predicting the targets ≥ "
           "prompt), percentile bootstrap 95% CIs over windows; the differences are paired (eviction row − paired "
           "row, per window).\n\n| method | windows | KL | paired row's KL there | KL − paired row's | top-1 | paired "
           "row's top-1 there | top-1 − paired row's |\n|---|---|---|---|---|---|---|---|\n";
      for (const json& e : j["eviction"][protocol][cs])
        s += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} |\n", e["method"].get<std::string>(),
                         e["windows"].get<std::string>(), eviction_cell(e, "kl", "kl_ci95", "{:.5f}"),
                         eviction_cell(e, "paired_kl", "paired_kl_ci95", "{:.5f}"),
                         eviction_difference(e, "kl", "{:+.5f}"), eviction_cell(e, "top1", "top1_ci95", "{:.4f}"),
                         eviction_cell(e, "paired_top1", "paired_top1_ci95", "{:.4f}"),
                         eviction_difference(e, "top1", "{:+.4f}"));
    }
  return s;
}

}  // namespace kvq
