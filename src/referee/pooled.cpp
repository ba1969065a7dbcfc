#include "referee/pooled.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include <fmt/format.h>

#include "common/error.h"
#include "eval/rng.h"
#include "referee/methods.h"
#include "referee/view.h"

namespace kvq {

using nlohmann::json;

namespace {

Interval exp_of(const Interval& v) { return Interval{std::exp(v.estimate), std::exp(v.lo), std::exp(v.hi)}; }

json pair_json(double lo, double hi) { return json::array({lo, hi}); }

// Percent change of a ratio: 1.01208 -> +1.208.
double pct(double ratio) { return 100 * (ratio - 1); }

std::string str(const json& j, const char* key) { return j.value(key, std::string()); }

// " (targets >= 1920)" for a row scored after a prompt (the eviction row: its figures are over those targets), else "".
std::string scored_from_note(const json& row) {
  const int from = row.value("scored_from", 0);
  return from > 0 ? fmt::format(" (targets ≥ {})", from) : "";
}

}  // namespace

double PooledWindows::total_nll() const { return std::accumulate(nll.begin(), nll.end(), 0.0); }
double PooledWindows::total_tokens() const { return std::accumulate(tokens.begin(), tokens.end(), 0.0); }

std::vector<std::string> unseen_domains(const std::vector<std::string>& domains, const std::string& calib_file) {
  const std::string seen = std::filesystem::path(calib_file).stem().string();
  std::vector<std::string> out;
  for (const std::string& d : domains)
    if (d != seen) out.push_back(d);
  return out;
}

std::optional<PooledWindows> pooled_windows_from(const json& run, const std::string& ctx,
                                                 const std::vector<std::string>& domains, int from) {
  const std::string who = run.is_object() ? run.value("key", std::string("(no key)")) : "(not an object)";
  KVQ_CHECK(run.is_object() && run.contains("results") && run["results"].contains("ppl") &&
                run["results"]["ppl"].contains(ctx),
            "run {}: no ppl results at ctx {}", who, ctx);
  const json& ppl = run["results"]["ppl"][ctx];
  const bool own = run_scored_from(run, ctx) == from;
  PooledWindows w;
  w.run = who;
  for (const std::string& d : domains) {
    KVQ_CHECK(ppl.contains(d) && ppl[d].is_object(), "run {}: no ppl record for domain {} at ctx {}", who, d, ctx);
    const json& domain = ppl[d];
    if (!own && !(domain.contains("tail") && domain["tail"].is_object() &&
                  domain["tail"].value("prompt_tokens", json()) == json(from)))
      return std::nullopt;
    const json& e = own ? domain : domain["tail"];  // the span's window NLLs and tokens
    const std::string span = own ? "" : fmt::format(" (tail from {})", from);
    KVQ_CHECK(e.contains("window_nll") && e["window_nll"].is_array() && !e["window_nll"].empty(),
              "run {}: the ppl record of domain {} at ctx {}{} has no per-window NLLs (window_nll); pooled figures "
              "need them (rerun it with this kvq)", who, d, ctx, span);
    const json& nll = e["window_nll"];
    const int n = int(nll.size());
    KVQ_CHECK(domain.contains("windows") && domain["windows"].is_number_integer() &&
                  domain["windows"].get<int>() == n,
              "run {}: domain {} at ctx {}{} records windows = {} but {} window NLLs", who, d, ctx, span,
              domain.value("windows", json()).dump(), n);
    KVQ_CHECK(e.contains("tokens") && e["tokens"].is_number_integer() && e["tokens"].get<int64_t>() > 0,
              "run {}: domain {} at ctx {}{} has no positive token count", who, d, ctx, span);
    // Every window scores the same targets, so each window's share is the span's tokens over its windows.
    const double per_window = double(e["tokens"].get<int64_t>()) / n;
    for (const json& x : nll) {
      KVQ_CHECK(x.is_number() && std::isfinite(x.get<double>()), "run {}: domain {} at ctx {}: window NLL {} is not "
                "a finite number", who, d, ctx, x.dump());
      w.nll.push_back(x.get<double>());
      w.tokens.push_back(per_window);
    }
    w.domains.push_back(d);
    w.windows.push_back(n);
  }
  KVQ_CHECK(!w.nll.empty(), "run {}: no domains to pool at ctx {}", who, ctx);
  return w;
}

PooledWindows pooled_windows(const json& run, const std::string& ctx, const std::vector<std::string>& domains) {
  return *pooled_windows_from(run, ctx, domains, run_scored_from(run, ctx));  // its own windows are always there
}

std::optional<std::pair<PooledWindows, PooledWindows>> paired_windows(const json& a, const json& b,
                                                                      const std::string& ctx,
                                                                      const std::vector<std::string>& domains) {
  const int from = std::max(run_scored_from(a, ctx), run_scored_from(b, ctx));
  std::optional<PooledWindows> wa = pooled_windows_from(a, ctx, domains, from);
  std::optional<PooledWindows> wb = pooled_windows_from(b, ctx, domains, from);
  if (!wa || !wb) return std::nullopt;
  return std::pair{std::move(*wa), std::move(*wb)};
}

Interval pooled_ppl(const PooledWindows& w, int resamples, uint64_t seed, double level) {
  return exp_of(bootstrap_ratio(w.nll, w.tokens, resamples, seed, level).ci);
}

Interval paired_ppl_ratio(const PooledWindows& m, const PooledWindows& b, int resamples, uint64_t seed,
                          double level) {
  KVQ_CHECK(m.domains == b.domains, "paired comparison {} vs {}: they pool different domains", m.run, b.run);
  for (size_t i = 0; i < m.domains.size(); ++i)
    KVQ_CHECK(m.windows[i] == b.windows[i],
              "paired comparison {} vs {}: domain {} has {} windows in {} but {} in {}; a paired bootstrap needs the "
              "same windows in both runs (run them with the same --windows and --ctx)",
              m.run, b.run, m.domains[i], m.windows[i], m.run, b.windows[i], b.run);
  KVQ_CHECK(m.tokens == b.tokens, "paired comparison {} vs {}: the windows score different token counts", m.run,
            b.run);
  std::vector<double> diff(m.nll.size());
  for (size_t i = 0; i < diff.size(); ++i) diff[i] = m.nll[i] - b.nll[i];
  return exp_of(bootstrap_ratio(diff, m.tokens, resamples, seed, level).ci);
}

std::string natural_base(const json& method) {
  if (const RefereeMethod* row = find_referee_method(str(method, "label"))) return row->baseline;
  // A record of a method the table no longer holds: the rule the rows follow.
  const std::string type = str(method, "type"), rotation = str(method, "rotation"), base = str(method, "base");
  if (!str(method, "equal_bytes").empty()) return str(method, "equal_bytes");  // eviction: the row of equal bytes
  if (rotation == "optr" && !base.empty()) return type + "+" + base;
  if (rotation == "oscar") return type + "+quarot";
  if (rotation == "quarot") return type;
  if (rotation == "pnmix") return type.substr(type.find('/') + 1);  // PN-Mix keys: the cache of its value type
  if (rotation == "fp8-scales")  // calibrated FP8 scales: the row of the same codecs at vLLM's default scale
    for (const RefereeMethod& m : referee_methods())
      if (m.type() == type && m.rotation == "none") return m.label;
  // Windows of another codec (KV4-RL's int8; records before the field have none): the same codecs with bf16 windows.
  const std::string window = str(method, "window_type");
  if (rotation == "none" && !window.empty() && window != "bf16") return type;
  return "";
}

json referee_unseen_json(const json& j) {
  std::vector<std::string> domains;
  for (const json& d : j["eval_data"]) domains.push_back(d["domain"].get<std::string>());
  const std::string calib = j["calibration_data"]["file"].get<std::string>();
  const std::vector<std::string> unseen = unseen_domains(domains, calib);
  if (unseen.empty()) return nullptr;
  const int resamples = j["config"]["bootstrap"].get<int>();
  const uint64_t seed = j["seeds"]["seed"].get<uint64_t>();
  json out = {{"calibration_domain", std::filesystem::path(calib).stem().string()},
              {"domains", unseen},
              {"redundant_with", unseen.size() == 1              ? json(unseen.front())
                                 : unseen.size() == domains.size() ? json("all")
                                                                   : json(nullptr)},
              {"bootstrap", resamples},
              {"seed", seed},
              {"ppl", json::object()},
              {"paired", json::object()}};

  // The leakage row was calibrated on an eval file: its seen domain differs. As-shipped runs score other tokens (the
  // second half of each window): the pools are the common protocol's. The eviction row scores the last 1/16 of each
  // window: its ppl, its increase over bf16 and its pairs are on those targets (the others' tails).
  std::vector<const json*> runs;
  for (const json& r : j["runs"])
    if (!run_is_leak(r) && run_protocol(r) == "common") runs.push_back(&r);
  // Index in runs of method `label` at window setting `windows` (a run whose windows read "any", bf16, at every
  // setting), or -1.
  const auto find = [&](const std::string& label, const std::string& windows) -> int {
    for (size_t i = 0; i < runs.size(); ++i) {
      const std::string w = run_windows(*runs[i]);
      if ((*runs[i])["method"]["label"] == label && (w == "any" || w == windows)) return int(i);
    }
    return -1;
  };
  std::vector<std::string> settings;  // window settings in order of first appearance ("any" is bf16's)
  for (const json* r : runs)
    if (run_windows(*r) != "any" &&
        std::find(settings.begin(), settings.end(), run_windows(*r)) == settings.end())
      settings.push_back(run_windows(*r));

  const int bf16 = find("bf16", "");
  for (const json& x : j["config"]["ctx"]) {
    const std::string cs = std::to_string(x.get<int>());
    std::vector<PooledWindows> pooled;  // aligned with runs
    for (const json* r : runs) pooled.push_back(pooled_windows(*r, cs, unseen));
    json rows = json::array();
    for (size_t i = 0; i < runs.size(); ++i) {
      const json& r = *runs[i];
      const std::string key = r["key"];
      const Interval p = pooled_ppl(pooled[i], resamples, mix_seed(seed, tag_hash("unseen/ppl/" + cs + "/" + key)));
      // bf16 on the targets this run scored (its own windows, or its tail from the eviction row's prompt)
      const std::optional<PooledWindows> base =
          bf16 >= 0 ? pooled_windows_from(*runs[size_t(bf16)], cs, unseen, run_scored_from(r, cs)) : std::nullopt;
      const double ppl_bf16 = base ? std::exp(base->total_nll() / base->total_tokens()) : 0;
      rows.push_back({{"key", key},
                      {"method", run_label(r)},
                      {"windows", run_windows(r)},
                      {"n_windows", pooled[i].nll.size()},
                      {"tokens", int64_t(std::llround(pooled[i].total_tokens()))},
                      {"ppl", p.estimate},
                      {"ci95", pair_json(p.lo, p.hi)},
                      {"scored_from", run_scored_from(r, cs)},
                      {"ppl_bf16", base ? json(ppl_bf16) : json(nullptr)},
                      {"increase_pct", base ? json(pct(p.estimate / ppl_bf16)) : json(nullptr)}});
    }
    out["ppl"][cs] = rows;

    json pairs = json::array();
    for (const std::string& w : settings)
      for (size_t i = 0; i < runs.size(); ++i) {
        const json& r = *runs[i];
        if (run_windows(r) != w) continue;
        for (const std::string& base : {natural_base(r["method"]), std::string("bf16")}) {
          const int b = base.empty() ? -1 : find(base, w);
          if (b < 0) continue;
          const std::string key = r["key"], base_key = (*runs[size_t(b)])["key"];
          // on the targets both scored (a run of the eviction row's prompt pairs with its base's tail)
          const auto both = paired_windows(r, *runs[size_t(b)], cs, unseen);
          if (!both) continue;  // a base recorded before tails
          const Interval q =
              paired_ppl_ratio(both->first, both->second, resamples,
                               mix_seed(seed, tag_hash("unseen/paired/" + cs + "/" + key + "/" + base_key)));
          pairs.push_back({{"key", key},
                           {"method", run_label(r)},
                           {"base_key", base_key},
                           {"base", base},
                           {"windows", w},
                           {"scored_from", std::max(run_scored_from(r, cs), run_scored_from(*runs[size_t(b)], cs))},
                           {"ratio", q.estimate},
                           {"ci95", pair_json(q.lo, q.hi)},
                           {"change_pct", pct(q.estimate)},
                           {"change_pct_ci95", pair_json(pct(q.lo), pct(q.hi))}});
        }
      }
    out["paired"][cs] = pairs;
  }
  return out;
}

std::string unseen_domain_list(const json& unseen) {
  std::string doms;
  for (const json& d : unseen["domains"]) doms += (doms.empty() ? "" : ", ") + d.get<std::string>();
  return doms;
}

std::string referee_unseen_markdown(const json& j) {
  if (!j.contains("unseen") || j["unseen"].is_null()) return "";
  const json& u = j["unseen"];
  const std::string doms = unseen_domain_list(u);
  const std::string calib = u["calibration_domain"];
  std::string s;
  for (const json& x : j["config"]["ctx"]) {
    const std::string cs = std::to_string(x.get<int>());
    if (!u["ppl"].contains(cs) || !u["paired"].contains(cs)) continue;
    const json& rows = u["ppl"][cs];
    s += fmt::format("\n## Unseen domains pooled at ctx {}: {} (calibration domain {} left out)\n\n", cs, doms, calib);
    if (u["redundant_with"].is_null()) {
      s += fmt::format("Pooled ppl = exp(Σ window NLL / Σ tokens) over the {} windows ({} tokens) of the eval domains "
                       "other than the calibration file's stem; bootstrap 95% CI over windows ({} resamples); "
                       "increase over bf16 pooled the same way. The leakage row is left out.\n\n"
                       "| method | windows | ppl unseen | 95% CI | vs bf16 |\n|---|---|---|---|---|\n",
                       rows.empty() ? 0 : rows[0]["n_windows"].get<int>(),
                       rows.empty() ? 0 : rows[0]["tokens"].get<int64_t>(), u["bootstrap"].get<int>());
      for (const json& r : rows)
        s += fmt::format("| {}{} | {} | {:.4f} | [{:.4f}, {:.4f}] | {} |\n", r["method"].get<std::string>(),
                         scored_from_note(r),
                         r["windows"].get<std::string>(), r["ppl"].get<double>(), r["ci95"][0].get<double>(),
                         r["ci95"][1].get<double>(),
                         r["increase_pct"].is_null() ? "-" : fmt::format("{:+.3f}%", r["increase_pct"].get<double>()));
    } else {
      s += fmt::format("The pooled ppl of these domains is the '{}' column of the perplexity table above.\n",
                       u["redundant_with"].get<std::string>());
    }
    const json& pairs = u["paired"][cs];
    if (pairs.empty()) continue;
    s += fmt::format("\n### ppl ratio vs base, unseen domains pooled, paired bootstrap 95% CI over windows (ctx {})\n\n"
                     "ratio = exp(Σ (NLL_method − NLL_base) / Σ tokens) over the same windows, paired by (domain, "
                     "window index); below 1 (a negative change) means the method beats its base. Bases: the "
                     "rotation it starts from (optr → int2+its base, int2+oscar → int2+quarot, int2+quarot → int2), "
                     "the row of equal bytes for an eviction row (evict(int2) → int2, on its targets) and bf16.\n\n| method | base | windows | ppl ratio | 95% CI | change | change 95% CI |\n"
                     "|---|---|---|---|---|---|---|\n", cs);
    for (const json& p : pairs)
      s += fmt::format("| {}{} | {} | {} | {:.5f} | [{:.5f}, {:.5f}] | {:+.3f}% | [{:+.3f}%, {:+.3f}%] |\n",
                       p["method"].get<std::string>(), scored_from_note(p), p["base"].get<std::string>(),
                       p["windows"].get<std::string>(),
                       p["ratio"].get<double>(), p["ci95"][0].get<double>(), p["ci95"][1].get<double>(),
                       p["change_pct"].get<double>(), p["change_pct_ci95"][0].get<double>(),
                       p["change_pct_ci95"][1].get<double>());
  }
  return s;
}

}  // namespace kvq
