#include "referee/bands.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "eval/rng.h"
#include "referee/pooled.h"
#include "referee/view.h"

namespace kvq {

using nlohmann::json;

namespace {

constexpr double kEdgeSlack = 1e-9;

double pct(double ratio) { return 100 * (ratio - 1); }

json pair_json(double lo, double hi) { return json::array({lo, hi}); }

// The protocols of the runs, in order of first appearance.
std::vector<std::string> protocols_of(const json& runs) {
  std::vector<std::string> out;
  for (const json& r : runs)
    if (std::find(out.begin(), out.end(), run_protocol(r)) == out.end()) out.push_back(run_protocol(r));
  return out;
}

// One run's figures at one ctx, before it is placed in its band.
struct Figure {
  const json* run;
  PooledWindows windows;  // its own scored targets
  int scored_from = 0;    // its prompt at the ctx (run_scored_from)
  double bits = 0;
  json row;  // the band row, without vs_best
};

// The paired ratio of run a over run b at ctx on the targets both scored (paired_windows), and the number of windows
// its bootstrap resampled; nullopt when b (or a) recorded no tail from the later prompt.
struct PairedRatio {
  Interval ratio;
  int windows = 0;
};
std::optional<PairedRatio> paired_ratio(const json& a, const json& b, const std::string& cs,
                                        const std::vector<std::string>& domains, int resamples, uint64_t seed) {
  const auto both = paired_windows(a, b, cs, domains);
  if (!both) return std::nullopt;
  return PairedRatio{paired_ppl_ratio(both->first, both->second, resamples, seed), int(both->first.nll.size())};
}

}  // namespace

const std::vector<BitBand>& referee_bit_bands() {
  static const std::vector<BitBand> kBands = {{"below 2.0", 0.0, 2.0},
                                              {"2.0-2.4", 2.0, 2.4},
                                              {"2.4-3.3", 2.4, 3.3},
                                              {"3.3-4.5", 3.3, 4.5},
                                              {"above 4.5", 4.5, 1e30}};
  return kBands;
}

int bit_band(double bits) {
  const auto& bands = referee_bit_bands();
  if (bits < bands[1].lo - kEdgeSlack) return 0;  // below 2.0
  for (size_t i = 1; i < bands.size(); ++i)
    if (bits <= bands[i].hi + kEdgeSlack) return int(i);
  return int(bands.size()) - 1;
}

json referee_bands_json(const json& j) {
  std::vector<std::string> domains;
  for (const json& d : j["eval_data"]) domains.push_back(d["domain"].get<std::string>());
  const int resamples = j["config"]["bootstrap"].get<int>();
  const uint64_t seed = j["seeds"]["seed"].get<uint64_t>();
  json out = json::object();
  for (const std::string& protocol : protocols_of(j["runs"])) {
    std::vector<const json*> runs;
    for (const json& r : j["runs"])
      if (!run_is_leak(r) && run_protocol(r) == protocol) runs.push_back(&r);
    const json* bf16 = nullptr;
    for (const json* r : runs)
      if ((*r)["method"]["label"] == "bf16") bf16 = r;
    for (const json& x : j["config"]["ctx"]) {
      const std::string cs = std::to_string(x.get<int>());
      const auto tag = [&](const std::string& what) { return mix_seed(seed, tag_hash("bands/" + protocol + "/" + cs +
                                                                                      "/" + what)); };
      std::vector<Figure> figs;
      for (const json* r : runs) {
        Figure f{r, pooled_windows(*r, cs, domains), run_scored_from(*r, cs), run_bits(*r, cs), json()};
        const std::string key = (*r)["key"], d = pooled_domain(*r, cs);
        const Interval p = pooled_ppl(f.windows, resamples, tag("ppl/" + key));
        const json& kl = (*r)["results"]["kl"][cs][d];
        const json& pk = (*r)["results"]["passkey"][cs];
        f.row = {{"key", key}, {"method", run_label(*r)}, {"windows", run_windows(*r)}, {"bits", f.bits},
                 {"scored_from", f.scored_from}, {"ppl", p.estimate}, {"ppl_ci95", pair_json(p.lo, p.hi)},
                 {"increase_pct", nullptr}, {"increase_pct_ci95", nullptr}, {"increase_windows", nullptr},
                 {"kl", kl["kl_mean"]}, {"kl_ci95", kl["kl_ci95"]}, {"top1", kl["top1"]},
                 {"passkey", pk["accuracy"]}, {"passkey_ci95", pk["ci95"]}};
        // against bf16 on the targets this run scored (the eviction row: bf16's tail from its prompt)
        if (const std::optional<PairedRatio> q =
                bf16 ? paired_ratio(*r, *bf16, cs, domains, resamples, tag("bf16/" + key)) : std::nullopt) {
          f.row["increase_pct"] = pct(q->ratio.estimate);
          f.row["increase_pct_ci95"] = pair_json(pct(q->ratio.lo), pct(q->ratio.hi));
          f.row["increase_windows"] = q->windows;
        }
        figs.push_back(std::move(f));
      }
      json bands = json::array();
      for (size_t b = 0; b < referee_bit_bands().size(); ++b) {
        std::vector<Figure*> in;
        for (Figure& f : figs)
          if (bit_band(f.bits) == int(b)) in.push_back(&f);
        if (in.empty()) continue;
        std::stable_sort(in.begin(), in.end(), [](const Figure* a, const Figure* c) { return a->bits < c->bits; });
        // The best among the runs that score the band's widest targets (the earliest prompt: the protocol's own; the
        // eviction row scores only its tail, whose ppl is not comparable with a whole window's).
        const int widest = (*std::min_element(in.begin(), in.end(), [](const Figure* a, const Figure* c) {
                             return a->scored_from < c->scored_from;
                           }))->scored_from;
        const Figure* best = nullptr;
        for (const Figure* f : in)
          if (f->scored_from == widest && (!best || f->windows.total_nll() < best->windows.total_nll())) best = f;
        json rows = json::array();
        for (Figure* f : in) {
          json row = f->row;
          row["vs_best"] = nullptr;
          const std::string key = row["key"], best_key = best->row["key"];
          const std::optional<PairedRatio> q =
              f == best ? std::nullopt
                        : paired_ratio(*f->run, *best->run, cs, domains, resamples, tag("best/" + key + "/" + best_key));
          if (q)
            row["vs_best"] = {{"ratio", q->ratio.estimate},
                              {"ci95", pair_json(q->ratio.lo, q->ratio.hi)},
                              {"change_pct", pct(q->ratio.estimate)},
                              {"change_pct_ci95", pair_json(pct(q->ratio.lo), pct(q->ratio.hi))},
                              {"scored_from", std::max(f->scored_from, best->scored_from)},
                              {"verdict", q->ratio.lo <= 1.0 ? "tied" : "worse"}};
          rows.push_back(std::move(row));
        }
        const BitBand& band = referee_bit_bands()[b];
        bands.push_back({{"band", band.label}, {"lo", band.lo}, {"hi", band.hi}, {"best_key", best->row["key"]},
                         {"runs", rows}});
      }
      out[protocol][cs] = bands;
    }
  }
  return out;
}

json referee_pareto_json(const json& j) {
  json out = json::object();
  if (!j.contains("bands")) return out;
  for (const auto& [protocol, by_ctx] : j["bands"].items())
    for (const auto& [cs, bands] : by_ctx.items()) {
      std::vector<json> pts;
      for (const json& band : bands)
        for (const json& r : band["runs"])
          pts.push_back({{"key", r["key"]}, {"method", r["method"]}, {"windows", r["windows"]}, {"bits", r["bits"]},
                         {"scored_from", r.value("scored_from", 0)}, {"increase_pct", r["increase_pct"]},
                         {"increase_pct_ci95", r["increase_pct_ci95"]}, {"kl", r["kl"]}, {"kl_ci95", r["kl_ci95"]}});
      std::stable_sort(pts.begin(), pts.end(), [](const json& a, const json& b) {
        return a["bits"].get<double>() < b["bits"].get<double>();
      });
      // A point is dominated when another has no more bits and no higher increase, one of them strictly less.
      for (json& p : pts) {
        bool dominated = false;
        if (!p["increase_pct"].is_null())
          for (const json& q : pts) {
            if (&q == &p || q["increase_pct"].is_null()) continue;
            const double pb = p["bits"], qb = q["bits"], pi = p["increase_pct"], qi = q["increase_pct"];
            dominated = dominated || (qb <= pb && qi <= pi && (qb < pb || qi < pi));
          }
        p["front"] = !p["increase_pct"].is_null() && !dominated;
      }
      out[protocol][cs] = pts;
    }
  return out;
}

std::string referee_bands_markdown(const json& j) {
  if (!j.contains("bands") || j["bands"].empty()) return "";
  std::string s = "\n## Equal bits: runs grouped by effective-bit band\n\n"
                  "Bits: effective bits per cached element at the stated context (bytes stored, windows and scales "
                  "included, skipped layers at 16 bits). Pooled over every eval domain; increase = the paired ratio "
                  "against the same protocol's bf16 run, paired bootstrap 95% CI over windows; within a band each run "
                  "is paired against the band's best (lowest pooled ppl): *tied* when that CI holds 1, else *worse*. "
                  "A run marked *targets ≥ P* (the eviction row) scores only the targets after its prompt P: its ppl "
                  "is over them, and its increase and its pair with the band's best are on the same targets of the "
                  "other run; the band's best is chosen among the runs that score the whole protocol's targets.\n";
  for (const std::string& protocol : referee_protocol_order())
    for (const json& x : j["config"]["ctx"]) {
      const std::string cs = std::to_string(x.get<int>());
      if (!j["bands"].contains(protocol) || !j["bands"][protocol].contains(cs)) continue;
      const json& bands = j["bands"][protocol][cs];
      s += fmt::format("\n### Protocol {}, ctx {}\n\n| band | method | windows | bits | ppl | increase vs bf16 | "
                       "95% CI | KL | 95% CI | passkey | vs band best | 95% CI | verdict |\n"
                       "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n", protocol, cs);
      for (const json& band : bands) {
        int widest = -1;  // the band's earliest prompt: its rows are unmarked
        for (const json& r : band["runs"])
          if (widest < 0 || r.value("scored_from", 0) < widest) widest = r.value("scored_from", 0);
        for (const json& r : band["runs"]) {
          const json& v = r["vs_best"];
          const int from = r.value("scored_from", 0);
          const bool best = r["key"] == band["best_key"];
          s += fmt::format(
              "| {} | {}{} | {} | {:.3f} | {:.4f} | {} | {} | {:.5f} | [{:.5f}, {:.5f}] | {:.0f}% | {} | {} | {} |\n",
              band["band"].get<std::string>(), r["method"].get<std::string>(),
              from > widest ? fmt::format(" (targets ≥ {})", from) : "", r["windows"].get<std::string>(),
              r["bits"].get<double>(), r["ppl"].get<double>(),
              r["increase_pct"].is_null() ? "-" : fmt::format("{:+.3f}%", r["increase_pct"].get<double>()),
              r["increase_pct"].is_null() ? "-" : fmt::format("[{:+.3f}%, {:+.3f}%]",
                                                              r["increase_pct_ci95"][0].get<double>(),
                                                              r["increase_pct_ci95"][1].get<double>()),
              r["kl"].get<double>(), r["kl_ci95"][0].get<double>(), r["kl_ci95"][1].get<double>(),
              100 * r["passkey"].get<double>(),
              v.is_null() ? (best ? "best" : "not paired") : fmt::format("{:+.3f}%", v["change_pct"].get<double>()),
              v.is_null() ? "-" : fmt::format("[{:+.3f}%, {:+.3f}%]", v["change_pct_ci95"][0].get<double>(),
                                              v["change_pct_ci95"][1].get<double>()),
              v.is_null() ? "-" : v["verdict"].get<std::string>());
        }
      }
    }
  return s;
}

}  // namespace kvq
