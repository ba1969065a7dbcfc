// report.html of the referee: one self-contained file (inline CSS and SVG, no scripts, no external assets).
// Charts: ppl vs effective bits and KL vs effective bits (one labelled <circle class="point"> per run), passkey
// heat maps per run (ctx × depth, one <rect class="cell"> per cell), per-layer error curves (one
// <polyline class="curve"> per run and metric, grouped by window setting).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include <fmt/format.h>

#include "referee/claims.h"
#include "referee/eviction.h"
#include "referee/pooled.h"
#include "referee/referee.h"
#include "referee/view.h"

namespace kvq {

using nlohmann::json;

namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a"};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

// The unseen-domain section (results.json "unseen", see referee/pooled.h): pooled ppl per run and the paired
// ratios against each run's bases, one table each per ctx.
std::string unseen_html(const json& j) {
  if (!j.contains("unseen") || j["unseen"].is_null()) return "";
  const json& u = j["unseen"];
  const std::string doms = unseen_domain_list(u);
  std::string h;
  for (const json& x : j["config"]["ctx"]) {
    const std::string cs = std::to_string(x.get<int>());
    if (!u["ppl"].contains(cs) || !u["paired"].contains(cs)) continue;
    h += fmt::format("<h2>Unseen domains pooled at ctx {}: {} (calibration domain {} left out)</h2>\n", cs, esc(doms),
                     esc(u["calibration_domain"].get<std::string>()));
    if (u["redundant_with"].is_null()) {
      h += fmt::format("<table id=\"unseen-ppl-{}\">\n<tr><th>method</th><th>windows</th><th>ppl unseen</th>"
                       "<th>95% CI</th><th>vs bf16</th></tr>\n", cs);
      for (const json& r : u["ppl"][cs])
        h += fmt::format("<tr data-key=\"{}\"><td>{}</td><td>{}</td><td>{:.4f}</td><td>[{:.4f}, {:.4f}]</td><td>{}</td>"
                         "</tr>\n", esc(r["key"].get<std::string>()), esc(r["method"].get<std::string>()),
                         esc(r["windows"].get<std::string>()), r["ppl"].get<double>(), r["ci95"][0].get<double>(),
                         r["ci95"][1].get<double>(),
                         r["increase_pct"].is_null() ? "-" : fmt::format("{:+.3f}%", r["increase_pct"].get<double>()));
      h += "</table>\n";
    } else {
      h += fmt::format("<p>The pooled ppl of these domains is the '{}' column of the perplexity tables.</p>\n",
                       esc(u["redundant_with"].get<std::string>()));
    }
    if (u["paired"][cs].empty()) continue;
    h += fmt::format("<p>ppl ratio vs base, unseen domains pooled, paired bootstrap 95% CI over windows (paired by "
                     "domain and window index); below 1 means the method beats its base.</p>\n"
                     "<table id=\"unseen-paired-{}\">\n<tr><th>method</th><th>base</th><th>windows</th>"
                     "<th>ppl ratio</th><th>95% CI</th><th>change</th><th>change 95% CI</th></tr>\n", cs);
    for (const json& p : u["paired"][cs])
      h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.5f}</td><td>[{:.5f}, {:.5f}]</td><td>{:+.3f}%</td>"
                       "<td>[{:+.3f}%, {:+.3f}%]</td></tr>\n", esc(p["method"].get<std::string>()),
                       esc(p["base"].get<std::string>()), esc(p["windows"].get<std::string>()),
                       p["ratio"].get<double>(), p["ci95"][0].get<double>(), p["ci95"][1].get<double>(),
                       p["change_pct"].get<double>(), p["change_pct_ci95"][0].get<double>(),
                       p["change_pct_ci95"][1].get<double>());
    h += "</table>\n";
  }
  return h;
}

struct Point {
  double x = 0, y = 0;
  std::string label, key, method, windows, color;
};

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double map(double v, double p0, double p1) const {  // value -> pixel between p0 (lo) and p1 (hi)
    const double a = log ? std::log10(lo) : lo, b = log ? std::log10(hi) : hi;
    const double t = ((log ? std::log10(v) : v) - a) / (b - a);
    return p0 + t * (p1 - p0);
  }
  std::vector<double> ticks() const {
    std::vector<double> t;
    if (log) {
      for (double e = std::floor(std::log10(lo)); e <= std::ceil(std::log10(hi)); ++e)
        for (double m : {1.0, 2.0, 5.0}) {
          const double v = m * std::pow(10.0, e);
          if (v >= lo * 0.999 && v <= hi * 1.001) t.push_back(v);
        }
      if (t.size() < 3) {  // less than a decade: five geometric steps instead
        t.clear();
        for (int i = 0; i <= 4; ++i) t.push_back(lo * std::pow(hi / lo, i / 4.0));
      }
    } else {
      for (int i = 0; i <= 5; ++i) t.push_back(lo + (hi - lo) * i / 5);
    }
    return t;
  }
};

Axis make_axis(std::vector<double> v, bool log) {
  Axis a;
  a.log = log;
  if (v.empty()) v = {1.0};
  a.lo = *std::min_element(v.begin(), v.end());
  a.hi = *std::max_element(v.begin(), v.end());
  if (log) {
    a.lo /= 1.25, a.hi *= 1.25;
  } else {
    const double pad = a.hi > a.lo ? 0.06 * (a.hi - a.lo) : std::max(1.0, std::abs(a.lo) * 0.1);
    a.lo -= pad, a.hi += pad;
  }
  return a;
}

constexpr int kW = 760, kH = 440, kL = 80, kR = 20, kT = 40, kB = 56;

std::string frame(const std::string& title, const std::string& xlabel, const std::string& ylabel, const Axis& x,
                  const Axis& y) {
  std::string s;
  s += fmt::format("<text class=\"title\" x=\"{}\" y=\"22\" text-anchor=\"middle\">{}</text>\n", kW / 2, esc(title));
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", kL, kT,
                   kW - kL - kR, kH - kT - kB);
  for (double v : x.ticks()) {
    const double px = x.map(v, kL, kW - kR);
    s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#eee\"/>"
                     "<text class=\"tick\" x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4:.3g}</text>\n",
                     px, kT, kH - kB, kH - kB + 16, v);
  }
  for (double v : y.ticks()) {
    const double py = y.map(v, kH - kB, kT);
    s += fmt::format("<line x1=\"{1}\" x2=\"{2}\" y1=\"{0:.1f}\" y2=\"{0:.1f}\" stroke=\"#eee\"/>"
                     "<text class=\"tick\" x=\"{3}\" y=\"{0:.1f}\" text-anchor=\"end\" dy=\"4\">{4:.3g}</text>\n",
                     py, kL, kW - kR, kL - 6, v);
  }
  s += fmt::format("<text class=\"axis\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", (kL + kW - kR) / 2,
                   kH - 14, esc(xlabel));
  s += fmt::format("<text class=\"axis\" transform=\"translate(18,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
                   (kT + kH - kB) / 2, esc(ylabel + (y.log ? " (log scale)" : "")));
  return s;
}

std::string scatter_svg(const std::string& id, const std::string& title, const std::string& xlabel,
                        const std::string& ylabel, const std::vector<Point>& pts) {
  std::vector<double> xs, ys;
  for (const Point& p : pts) xs.push_back(p.x), ys.push_back(p.y);
  const Axis x = make_axis(xs, false), y = make_axis(ys, true);
  std::string s = fmt::format("<svg id=\"{}\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" "
                              "height=\"{}\" viewBox=\"0 0 {} {}\">\n", id, kW, kH, kW, kH);
  s += frame(title, xlabel, ylabel, x, y);
  for (const Point& p : pts) {
    const double px = x.map(p.x, kL, kW - kR), py = y.map(p.y, kH - kB, kT);
    s += fmt::format("<circle class=\"point\" data-key=\"{}\" data-method=\"{}\" data-windows=\"{}\" data-x=\"{:.6g}\" "
                     "data-y=\"{:.6g}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"5\" fill=\"{}\"><title>{} ({}): x {:.4g}, "
                     "y {:.4g}</title></circle>\n",
                     esc(p.key), esc(p.method), esc(p.windows), p.x, p.y, px, py, p.color, esc(p.method),
                     esc(p.windows), p.x, p.y);
    const bool left = px > kW - kR - 130;  // keep labels of points near the right edge inside the chart
    s += fmt::format("<text class=\"point-label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"{}\">{}</text>\n",
                     left ? px - 7 : px + 7, py - 5, left ? "end" : "start", esc(p.label));
  }
  return s + "</svg>\n";
}

struct Series {
  std::string key, label, color;
  std::vector<double> y;  // per layer
};

std::string lines_svg(const std::string& id, const std::string& title, const std::string& ylabel,
                      const std::vector<Series>& series) {
  std::vector<double> ys;
  size_t n = 1;
  for (const Series& s : series) {
    n = std::max(n, s.y.size());
    for (double v : s.y) ys.push_back(v);
  }
  const Axis x = make_axis({0.0, double(n - 1)}, false), y = make_axis(ys, true);
  std::string s = fmt::format("<svg id=\"{}\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" "
                              "height=\"{}\" viewBox=\"0 0 {} {}\">\n", id, kW, kH + 20 * int(series.size() / 3 + 1),
                              kW, kH + 20 * int(series.size() / 3 + 1));
  s += frame(title, "layer", ylabel, x, y);
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& se = series[i];
    std::string pts;
    for (size_t l = 0; l < se.y.size(); ++l)
      pts += fmt::format("{:.1f},{:.1f} ", x.map(double(l), kL, kW - kR), y.map(se.y[l], kH - kB, kT));
    s += fmt::format("<polyline class=\"curve\" data-key=\"{}\" data-method=\"{}\" fill=\"none\" stroke=\"{}\" "
                     "stroke-width=\"2\" points=\"{}\"><title>{}</title></polyline>\n",
                     esc(se.key), esc(se.label), se.color, pts, esc(se.label));
    const int lx = kL + int(i % 3) * 230, ly = kH + 4 + 20 * int(i / 3);
    s += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"3\"/>"
                     "<text class=\"legend\" x=\"{}\" y=\"{}\">{}</text>\n",
                     lx, lx + 18, ly, ly, se.color, lx + 24, ly + 4, esc(se.label));
  }
  return s + "</svg>\n";
}

// A Pareto chart (results.json "pareto"): one <circle class="pareto-point"> per run with its 95% CI as a vertical
// <line class="errbar">, the front joined by a <polyline class="front">. x: effective bits (log scale: 2 to 16).
struct ParetoPoint {
  double x = 0, y = 0, lo = 0, hi = 0;
  std::string key, label, color;
  bool front = false;
};

std::string pareto_svg(const std::string& id, const std::string& title, const std::string& xlabel,
                       const std::string& ylabel, const std::vector<ParetoPoint>& pts, bool log_y) {
  std::vector<double> xs, ys;
  for (const ParetoPoint& p : pts) xs.push_back(p.x), ys.push_back(p.lo), ys.push_back(p.hi), ys.push_back(p.y);
  const Axis x = make_axis(xs, true), y = make_axis(ys, log_y);
  std::string s = fmt::format("<svg id=\"{}\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" "
                              "height=\"{}\" viewBox=\"0 0 {} {}\">\n", id, kW, kH, kW, kH);
  s += frame(title, xlabel, ylabel, x, y);
  std::string front;
  for (const ParetoPoint& p : pts) {
    const double px = x.map(p.x, kL, kW - kR), py = y.map(p.y, kH - kB, kT);
    s += fmt::format("<line class=\"errbar\" data-key=\"{}\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" "
                     "stroke=\"{}\" stroke-width=\"1.5\"/>\n",
                     esc(p.key), px, px, y.map(p.lo, kH - kB, kT), y.map(p.hi, kH - kB, kT), p.color);
    s += fmt::format("<circle class=\"pareto-point\" data-key=\"{}\" data-x=\"{:.6g}\" data-y=\"{:.6g}\" "
                     "data-lo=\"{:.6g}\" data-hi=\"{:.6g}\" data-front=\"{}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" "
                     "fill=\"{}\"><title>{}: {:.3f} bits, {:.4g} [{:.4g}, {:.4g}]</title></circle>\n",
                     esc(p.key), p.x, p.y, p.lo, p.hi, p.front ? "true" : "false", px, py, p.front ? 6 : 4, p.color,
                     esc(p.label), p.x, p.y, p.lo, p.hi);
    const bool left = px > kW - kR - 130;
    s += fmt::format("<text class=\"point-label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"{}\">{}</text>\n",
                     left ? px - 7 : px + 7, py - 5, left ? "end" : "start", esc(p.label));
    if (p.front) front += fmt::format("{:.1f},{:.1f} ", px, py);
  }
  if (!front.empty())
    s += fmt::format("<polyline class=\"front\" fill=\"none\" stroke=\"#444\" stroke-dasharray=\"4 3\" "
                     "points=\"{}\"/>\n", front);
  return s + "</svg>\n";
}

// The equal-bits section: per protocol and ctx, the band table and the two Pareto charts (ppl increase and KL
// against bits), from results.json "bands" and "pareto".
std::string equal_bits_html(const json& j, const std::function<std::string(const std::string&)>& color_of) {
  if (!j.contains("bands") || !j.contains("pareto")) return "";
  std::string h = "<h2>Equal bits: bands and Pareto charts per protocol</h2>\n<p>Bits: effective bits per cached element "
                  "at the stated context (windows, scales, skipped layers at 16 bits). Pooled over every eval domain; "
                  "the increase is the paired ratio against the same protocol's bf16 run (paired bootstrap 95% CI "
                  "over windows), each run paired against its band's best: tied when that CI holds 1. A run marked "
                  "targets &ge; P (the eviction row) scores only the targets after its prompt P and is paired on "
                  "them.</p>\n";
  for (const std::string& protocol : referee_protocol_order())
    for (const json& x : j["config"]["ctx"]) {
      const std::string cs = std::to_string(x.get<int>());
      if (!j["bands"].contains(protocol) || !j["bands"][protocol].contains(cs)) continue;
      std::string id = protocol + "-" + cs;
      h += fmt::format("<h3>Protocol {}, ctx {}</h3>\n<table id=\"bands-{}\">\n<tr><th>band</th><th>method</th>"
                       "<th>windows</th><th>bits</th><th>ppl</th><th>increase vs bf16</th><th>95% CI</th><th>KL</th>"
                       "<th>95% CI</th><th>passkey</th><th>vs band best</th><th>95% CI</th><th>verdict</th></tr>\n",
                       esc(protocol), cs, id);
      for (const json& band : j["bands"][protocol][cs]) {
        int widest = -1;  // the band's earliest prompt: its rows are unmarked
        for (const json& r : band["runs"])
          if (widest < 0 || r.value("scored_from", 0) < widest) widest = r.value("scored_from", 0);
        for (const json& r : band["runs"]) {
          const json& v = r["vs_best"];
          const bool inc = !r["increase_pct"].is_null();
          const int from = r.value("scored_from", 0);
          const std::string targets = from > widest ? fmt::format(" (targets &ge; {})", from) : "";
          h += fmt::format(
              "<tr data-key=\"{}\" data-band=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{:.3f}</td><td>{:.4f}</td>"
              "<td>{}</td><td>{}</td><td>{:.5f}</td><td>[{:.5f}, {:.5f}]</td><td>{:.0f}%</td><td>{}</td><td>{}</td>"
              "<td>{}</td></tr>\n",
              esc(r["key"].get<std::string>()), esc(band["band"].get<std::string>()),
              esc(band["band"].get<std::string>()), esc(r["method"].get<std::string>()) + targets,
              esc(r["windows"].get<std::string>()), r["bits"].get<double>(), r["ppl"].get<double>(),
              inc ? fmt::format("{:+.3f}%", r["increase_pct"].get<double>()) : "-",
              inc ? fmt::format("[{:+.3f}%, {:+.3f}%]", r["increase_pct_ci95"][0].get<double>(),
                                r["increase_pct_ci95"][1].get<double>())
                  : "-",
              r["kl"].get<double>(), r["kl_ci95"][0].get<double>(), r["kl_ci95"][1].get<double>(),
              100 * r["passkey"].get<double>(),
              v.is_null() ? (r["key"] == band["best_key"] ? "best" : "not paired")
                          : fmt::format("{:+.3f}%", v["change_pct"].get<double>()),
              v.is_null() ? "-" : fmt::format("[{:+.3f}%, {:+.3f}%]", v["change_pct_ci95"][0].get<double>(),
                                              v["change_pct_ci95"][1].get<double>()),
              v.is_null() ? "-" : esc(v["verdict"].get<std::string>()));
        }
      }
      h += "</table>\n";
      if (!j["pareto"].contains(protocol) || !j["pareto"][protocol].contains(cs)) continue;
      std::vector<ParetoPoint> inc, kl;
      double kl_min = 0;
      for (const json& p : j["pareto"][protocol][cs])
        if (p["kl"].get<double>() > 0 && (kl_min == 0 || p["kl"].get<double>() < kl_min)) kl_min = p["kl"];
      const double floor = kl_min > 0 ? kl_min / 10 : 1e-6;
      for (const json& p : j["pareto"][protocol][cs]) {
        ParetoPoint q;
        q.x = p["bits"];
        q.key = p["key"];
        q.label = p["method"].get<std::string>() + " " + p["windows"].get<std::string>();
        q.color = color_of(q.key);
        q.front = p["front"];
        if (!p["increase_pct"].is_null()) {
          q.y = p["increase_pct"], q.lo = p["increase_pct_ci95"][0], q.hi = p["increase_pct_ci95"][1];
          inc.push_back(q);
        }
        q.front = false;  // the front is the ppl increase's
        q.y = std::max(floor, p["kl"].get<double>());
        q.lo = std::max(floor, p["kl_ci95"][0].get<double>());
        q.hi = std::max(floor, p["kl_ci95"][1].get<double>());
        kl.push_back(q);
      }
      const std::string xl = fmt::format("effective bits per cached element at N = {} (log scale)", cs);
      if (!inc.empty())
        h += pareto_svg("pareto-ppl-" + id, fmt::format("ppl increase vs bf16 against bits ({}, ctx {})", protocol, cs),
                        xl, "ppl increase over bf16 (%)", inc, false);
      h += pareto_svg("pareto-kl-" + id, fmt::format("KL(p_bf16 || p_method) against bits ({}, ctx {})", protocol, cs),
                      xl, "KL per token (nats)", kl, true);
      h += fmt::format("<p>Error bars: 95% CIs. Large points joined by the dashed line: the Pareto front (no run has "
                       "fewer bits and a lower ppl increase). A KL of 0 is drawn at the floor {:.3g}.</p>\n", floor);
      // Bits against speed: each run's cost (RefereeConfig::cost_probe), where its record has one.
      std::vector<ParetoPoint> speed;
      std::string shape;
      for (const json& p : j["pareto"][protocol][cs]) {
        const auto run =
            std::find_if(j["runs"].begin(), j["runs"].end(), [&](const json& r) { return r["key"] == p["key"]; });
        if (run == j["runs"].end() || !run->contains("cost") || !(*run)["cost"].contains("attention_us")) continue;
        const json& cost = (*run)["cost"];
        ParetoPoint q;
        q.x = p["bits"];
        q.y = q.lo = q.hi = cost["attention_us"].get<double>();
        q.key = p["key"];
        q.label = p["method"].get<std::string>() + " " + p["windows"].get<std::string>();
        q.color = color_of(q.key);
        shape = cost["shape"].get<std::string>() + " on " + cost["device"].get<std::string>();
        speed.push_back(q);
      }
      if (!speed.empty())
        h += pareto_svg("pareto-speed-" + id, fmt::format("attention time per decode step against bits ({}, ctx {})",
                                                          protocol, cs),
                        xl, "µs per step at " + shape + " (log scale)", speed, true);
    }
  return h;
}

// The eviction rows beside their rows of equal bytes (results.json "eviction", referee/eviction.h), one table per
// protocol and ctx.
std::string eviction_html(const json& j) {
  if (!j.contains("eviction") || j["eviction"].empty()) return "";
  const auto change = [](const json& v) {
    return v.is_null() ? std::string("-")
                       : fmt::format("{:+.3f}% [{:+.3f}%, {:+.3f}%]", v["change_pct"].get<double>(),
                                     v["change_pct_ci95"][0].get<double>(), v["change_pct_ci95"][1].get<double>());
  };
  const auto num = [](const json& v) { return v.is_null() ? std::string("-") : fmt::format("{:.4f}", v.get<double>()); };
  std::string h = "<h2>Eviction at equal bytes (METHODS §5.8)</h2>\n<p>A bf16 cache keeping the sinks, the recent "
                  "window and the prompt tokens of highest AnDPro-style score (LORE-KV has no public code), decided "
                  "once after a prompt of the first 15/16 of each window; the tokens after it are kept bf16 and "
                  "counted at 16 bits, so it stores the paired row's bytes (int2 at the same windows) at the ctx. "
                  "Only the last 1/16 is scored; the paired row (common protocol) and bf16 are read on the same "
                  "targets, paired bootstrap 95% CIs over windows.</p>\n";
  for (const std::string& protocol : referee_protocol_order())
    for (const json& x : j["config"]["ctx"]) {
      const std::string cs = std::to_string(x.get<int>());
      if (!j["eviction"].contains(protocol) || !j["eviction"][protocol].contains(cs)) continue;
      h += fmt::format("<h3>Protocol {}, ctx {}</h3>\n<table id=\"eviction-{}-{}\">\n<tr><th>method</th>"
                       "<th>windows</th><th>bits</th><th>paired row's bits</th><th>prompt</th><th>kept of prompt</th>"
                       "<th>stored tokens</th><th>ppl (targets &ge; prompt)</th><th>paired row there</th>"
                       "<th>bf16 there</th><th>vs paired row</th><th>vs bf16</th><th>paired row vs bf16</th>"
                       "<th>passkey</th></tr>\n", esc(protocol), cs, esc(protocol), cs);
      for (const json& e : j["eviction"][protocol][cs])
        h += fmt::format("<tr data-key=\"{}\"><td>{}</td><td>{}</td><td>{:.4f}</td><td>{}</td><td>{}</td><td>{}</td>"
                         "<td>{}</td><td>{:.4f}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                         "<td>{:.0f}%</td></tr>\n",
                         esc(e["key"].get<std::string>()), esc(e["method"].get<std::string>()),
                         esc(e["windows"].get<std::string>()), e["bits"].get<double>(), num(e["paired_bits"]),
                         e["prompt_tokens"].dump(), e["kept_prompt_tokens"].dump(), e["stored_tokens"].dump(),
                         e["ppl"].get<double>(), num(e["paired_ppl"]), num(e["bf16_ppl"]), change(e["vs_paired"]),
                         change(e["vs_bf16"]), change(e["paired_vs_bf16"]), 100 * e["passkey"].get<double>());
      h += "</table>\n";
      // KL and top-1 against bf16 on the same rows, with the paired differences (referee/eviction.h)
      h += fmt::format("<p>KL(p_bf16 &#8214; p) per token and top-1 agreement with bf16 on the same rows (those "
                       "predicting the targets &ge; prompt), 95% CIs over windows; differences paired per window "
                       "(eviction row &minus; paired row).</p>\n<table id=\"eviction-kl-{}-{}\">\n<tr><th>method</th>"
                       "<th>windows</th><th>KL</th><th>paired row's KL there</th><th>KL &minus; paired row's</th>"
                       "<th>top-1</th><th>paired row's top-1 there</th><th>top-1 &minus; paired row's</th></tr>\n",
                       esc(protocol), cs);
      for (const json& e : j["eviction"][protocol][cs])
        h += fmt::format("<tr data-key=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                         "<td>{}</td><td>{}</td></tr>\n",
                         esc(e["key"].get<std::string>()), esc(e["method"].get<std::string>()),
                         esc(e["windows"].get<std::string>()), eviction_cell(e, "kl", "kl_ci95", "{:.5f}"),
                         eviction_cell(e, "paired_kl", "paired_kl_ci95", "{:.5f}"),
                         eviction_difference(e, "kl", "{:+.5f}"), eviction_cell(e, "top1", "top1_ci95", "{:.4f}"),
                         eviction_cell(e, "paired_top1", "paired_top1_ci95", "{:.4f}"),
                         eviction_difference(e, "top1", "{:+.4f}"));
      h += "</table>\n";
    }
  return h;
}

// The claims table (results.json "claims", referee/claims.h), one per ctx.
std::string claims_html(const json& j) {
  if (!j.contains("claims")) return "";
  std::string h = "<h2>The camps' claims, checked on " + esc(referee_model_label(j)) + "</h2>\n<p>" +
                  esc(j.value("claims_rule", "")) + "</p>\n";
  for (const json& x : j["config"]["ctx"]) {
    const std::string cs = std::to_string(x.get<int>());
    h += fmt::format("<h3>ctx {}</h3>\n<table id=\"claims-{}\">\n<tr><th>camp</th><th>claim</th><th>published in</th>"
                     "<th>measured on</th><th>claimed bits</th><th>common: run</th><th>measured [95% CI]</th>"
                     "<th>verdict</th><th>as shipped: run</th><th>measured [95% CI]</th><th>verdict</th></tr>\n", cs, cs);
    for (const json& c : j["claims"]) {
      const bool ppl = c["metric"] == "ppl_increase_pct";
      h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.3g}</td>", esc(c["camp"].get<std::string>()),
                       esc(c["claim"].get<std::string>()), esc(c["source"].get<std::string>()),
                       esc(c["measured_on"].get<std::string>()), c["bits"].get<double>());
      for (const char* protocol : {"common", "as-shipped"}) {
        const json cell = c["kvq"].contains(protocol) && c["kvq"][protocol].contains(cs) ? c["kvq"][protocol][cs]
                                                                                         : json();
        if (cell.is_null()) {
          h += "<td>no run</td><td>-</td><td>-</td>";
          continue;
        }
        const double v = cell["measured"], lo = cell["ci95"][0], hi = cell["ci95"][1];
        h += fmt::format("<td>{}</td><td>{}</td><td class=\"verdict\">{}</td>", esc(claim_run_text(cell)),
                         ppl ? fmt::format("{:+.3f}% [{:+.3f}%, {:+.3f}%]", v, lo, hi)
                             : fmt::format("{:.0f}% [{:.0f}%, {:.0f}%]", 100 * v, 100 * lo, 100 * hi),
                         esc(cell["verdict"].get<std::string>()));
      }
      h += "</tr>\n";
    }
    h += "</table>\n";
  }
  return h;
}

// Red (0) to green (1) through yellow.
std::string heat_color(double a) {
  a = std::clamp(a, 0.0, 1.0);
  const int r = a < 0.5 ? 220 : int(220 - (a - 0.5) * 2 * 170);
  const int g = a < 0.5 ? int(60 + a * 2 * 160) : 220 - int((a - 0.5) * 2 * 40);
  return fmt::format("#{:02x}{:02x}{:02x}", r, g, 60);
}

std::string heatmap_svg(const json& run, const std::vector<int>& ctx) {
  const json& pk = run["results"]["passkey"];
  std::vector<std::string> depths;
  for (const auto& [d, cell] : pk[std::to_string(ctx.front())]["by_depth"].items()) depths.push_back(d);
  std::sort(depths.begin(), depths.end(), [](const std::string& a, const std::string& b) {
    return std::stod(a) < std::stod(b);
  });
  const int cw = 44, ch = 26, left = 64, top = 34;
  const int w = left + cw * int(depths.size()) + 10, h = top + ch * int(ctx.size()) + 34;
  const std::string label = run_label(run) + " " + run["windows"]["label"].get<std::string>();
  std::string s = fmt::format("<svg class=\"heatmap\" data-key=\"{}\" data-method=\"{}\" xmlns=\"http://www.w3.org/2000/"
                              "svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\">\n",
                              esc(run["key"].get<std::string>()), esc(run_label(run)), w, h, w, h);
  s += fmt::format("<text class=\"title\" x=\"4\" y=\"18\">{}</text>\n", esc(label));
  for (size_t r = 0; r < ctx.size(); ++r) {
    const std::string c = std::to_string(ctx[r]);
    s += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", left - 6,
                     top + ch * int(r) + 17, c);
    for (size_t k = 0; k < depths.size(); ++k) {
      const json& cell = pk[c]["by_depth"][depths[k]];
      const double acc = cell["accuracy"].get<double>();
      const int x = left + cw * int(k), y = top + ch * int(r);
      s += fmt::format("<rect class=\"cell\" data-ctx=\"{}\" data-depth=\"{}\" data-accuracy=\"{:.6g}\" x=\"{}\" "
                       "y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"#fff\"><title>ctx {} depth {}: "
                       "{}/{}</title></rect><text class=\"cell-text\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}/{}"
                       "</text>\n",
                       c, depths[k], acc, x, y, cw, ch, heat_color(acc), c, depths[k], cell["correct"].get<int>(),
                       cell["trials"].get<int>(), x + cw / 2, y + 17, cell["correct"].get<int>(),
                       cell["trials"].get<int>());
    }
  }
  for (size_t k = 0; k < depths.size(); ++k)
    s += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     left + cw * int(k) + cw / 2, top + ch * int(ctx.size()) + 14, depths[k]);
  s += fmt::format("<text class=\"axis\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">needle depth (rows: ctx)</text>\n",
                   left + cw * int(depths.size()) / 2, h - 4);
  return s + "</svg>\n";
}

}  // namespace

std::string referee_html(const json& j) {
  const std::vector<int> ctx = j["config"]["ctx"].get<std::vector<int>>();
  const std::string c0 = std::to_string(ctx.front());
  std::map<std::string, std::string> colors;
  for (const json& m : j["config"]["methods"])
    colors[m.get<std::string>()] = kPalette[colors.size() % (sizeof kPalette / sizeof kPalette[0])];
  auto color = [&](const json& run) {
    const std::string m = run["method"]["label"];
    return run.value("leakage", false) ? std::string("#000000") : (colors.count(m) ? colors[m] : "#444444");
  };

  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>kvq referee report</title>\n"
                  "<style>\nbody{font-family:sans-serif;margin:24px;color:#222;max-width:1200px}\n"
                  "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;"
                  "text-align:right}th{background:#f4f4f4}td:first-child,td:nth-child(2){text-align:left}\n"
                  "svg .title{font-size:15px;font-weight:bold}svg .tick{font-size:11px;fill:#555}"
                  "svg .axis{font-size:12px}svg .point-label{font-size:10px}svg .legend{font-size:11px}"
                  "svg .cell-text{font-size:10px}\n.maps{display:flex;flex-wrap:wrap;gap:8px}\n"
                  "code{font-size:12px}\n</style>\n</head>\n<body>\n<h1>kvq referee report</h1>\n<ul>\n";
  h += fmt::format("<li>model <code>{}</code>, fingerprint <code>{}</code></li>\n",
                   esc(j["model"]["dir"].get<std::string>()), esc(j["model"]["fingerprint"].get<std::string>()));
  h += fmt::format("<li>kvq {} (git <code>{}</code>), {}; machine {} {}, CPU {}, {} threads</li>\n",
                   esc(j["kvq"]["version"].get<std::string>()), esc(j["kvq"]["git"].get<std::string>()),
                   esc(j["date"].get<std::string>()), esc(j["machine"].value("sysname", "")),
                   esc(j["machine"].value("machine", "")), esc(j["machine"].value("cpu_model", "")),
                   j["machine"].value("threads", 0));
  h += fmt::format("<li>calibration data <code>{}</code> sha256 <code>{}</code></li>\n",
                   esc(j["calibration_data"]["file"].get<std::string>()),
                   esc(j["calibration_data"]["sha256"].get<std::string>()));
  for (const json& d : j["eval_data"])
    h += fmt::format("<li>eval {} <code>{}</code> sha256 <code>{}</code></li>\n", esc(d["domain"].get<std::string>()),
                     esc(d["file"].get<std::string>()), esc(d["sha256"].get<std::string>()));
  h += "</ul>\n";

  // Summary table
  h += fmt::format("<h2>Summary at ctx {}</h2>\n<table id=\"summary\">\n<tr><th>method</th><th>windows</th>", c0);
  for (int c : ctx) h += fmt::format("<th>bits @{}</th>", c);
  h += "<th>ppl</th><th>95% CI</th><th>KL</th><th>95% CI</th><th>top-1</th><th>passkey</th></tr>\n";
  for (const json& r : j["runs"]) {
    const std::string d = pooled_domain(r, c0);
    const json& p = r["results"]["ppl"][c0][d];
    const json& k = r["results"]["kl"][c0][d];
    h += fmt::format("<tr data-key=\"{}\"><td>{}</td><td>{}</td>", esc(r["key"].get<std::string>()), esc(run_label(r)),
                     esc(r["windows"]["label"].get<std::string>()));
    for (int c : ctx) h += fmt::format("<td>{:.3f}</td>", run_bits(r, std::to_string(c)));
    h += fmt::format("<td>{:.4f}</td><td>[{:.4f}, {:.4f}]</td><td>{:.5f}</td><td>[{:.5f}, {:.5f}]</td><td>{:.4f}</td>"
                     "<td>{:.1f}%</td></tr>\n",
                     p["ppl"].get<double>(), p["ci95"][0].get<double>(), p["ci95"][1].get<double>(),
                     k["kl_mean"].get<double>(), k["kl_ci95"][0].get<double>(), k["kl_ci95"][1].get<double>(),
                     k["top1"].get<double>(), 100 * r["results"]["passkey"][c0]["accuracy"].get<double>());
  }
  h += "</table>\n";

  // Scatter charts at the first ctx over the pooled domain
  std::vector<Point> ppl, kl;
  double kl_min = 0;
  for (const json& r : j["runs"]) {
    const double v = r["results"]["kl"][c0][pooled_domain(r, c0)]["kl_mean"].get<double>();
    if (v > 0 && (kl_min == 0 || v < kl_min)) kl_min = v;
  }
  const double kl_floor = kl_min > 0 ? kl_min / 10 : 1e-6;
  for (const json& r : j["runs"]) {
    // As-shipped rows score other tokens (their own charts below), and so does the eviction row (its tail: the
    // eviction section and the Pareto charts pair it on its targets).
    if (run_protocol(r) != "common" || run_scored_from(r, c0) != 0) continue;
    const std::string d = pooled_domain(r, c0);
    Point p;
    p.x = run_bits(r, c0);
    p.key = r["key"];
    p.method = run_label(r);
    p.windows = r["windows"]["label"];
    p.label = p.method + " " + p.windows;
    p.color = color(r);
    p.y = r["results"]["ppl"][c0][d]["ppl"].get<double>();
    ppl.push_back(p);
    p.y = std::max(kl_floor, r["results"]["kl"][c0][d]["kl_mean"].get<double>());
    kl.push_back(p);
  }
  const std::string over = ppl.empty() || pooled_domain(j["runs"][0], c0) == "all"
                               ? "all domains pooled"
                               : "domain " + pooled_domain(j["runs"][0], c0);
  h += "<h2>Fidelity versus effective bits (common protocol)</h2>\n";
  h += scatter_svg("ppl-vs-bits", fmt::format("perplexity vs effective bits (ctx {}, {})", c0, over),
                   fmt::format("effective bits per cached element at N = {}", c0), "perplexity", ppl);
  h += scatter_svg("kl-vs-bits", fmt::format("KL(p_bf16 || p_method) vs effective bits (ctx {}, {})", c0, over),
                   fmt::format("effective bits per cached element at N = {}", c0), "KL per token (nats)", kl);
  h += fmt::format("<p>One point per run, labelled method and sink/recent windows; the leakage row is black. "
                   "A KL of 0 (the BF16 cache) is drawn at the axis floor {:.3g}.</p>\n", kl_floor);

  // Passkey heat maps
  h += "<h2>Passkey retrieval: context × needle depth, per run</h2>\n<div class=\"maps\">\n";
  for (const json& r : j["runs"]) h += heatmap_svg(r, ctx);
  h += "</div>\n";

  // Per-layer error curves, one chart per metric and window setting
  const std::string lc = std::to_string(j["config"].value("layers_ctx", ctx.front()));
  h += fmt::format("<h2>Per-layer errors against BF16 at ctx {}</h2>\n", lc);
  std::vector<std::string> wins;
  // One chart per window setting of the common protocol, one for the as-shipped runs (each at its own windows).
  const auto setting = [](const json& r) { return run_protocol(r) == "common" ? run_windows(r) : "as shipped"; };
  for (const json& r : j["runs"]) {
    const std::string w = setting(r);
    if (w != "any" && std::find(wins.begin(), wins.end(), w) == wins.end()) wins.push_back(w);
  }
  const std::pair<const char*, const char*> metrics[] = {
      {"attn_out_rel_err", "relative post-W_O attention-output error ||dy||/||y|| (BF16 layer inputs)"},
      {"hidden_rel_err", "relative hidden-state error after the layer"}};
  for (const auto& [metric, what] : metrics)
    for (const std::string& w : wins) {
      std::vector<Series> series;
      for (const json& r : j["runs"]) {
        if (setting(r) != w) continue;
        Series s{r["key"], run_label(r), color(r), {}};
        bool positive = true;
        for (const json& row : r["results"]["layers"][lc]["per_layer"]) {
          s.y.push_back(row[metric].get<double>());
          positive = positive && s.y.back() > 0;
        }
        if (positive && !s.y.empty()) series.push_back(std::move(s));
      }
      if (series.empty()) continue;
      std::string id = std::string("layers-") + metric + "-" + w;
      std::replace(id.begin(), id.end(), '/', '-');
      std::replace(id.begin(), id.end(), ' ', '-');
      h += lines_svg(id, fmt::format("{} (windows {})", what, w), "relative error", series);
    }
  h += "<p>BF16 has zero error against itself and is not drawn.</p>\n";

  h += unseen_html(j);
  h += equal_bits_html(j, [&](const std::string& key) {
    for (const json& r : j["runs"])
      if (r["key"] == key) return color(r);
    return std::string("#444444");
  });
  h += eviction_html(j);
  h += claims_html(j);

  // Leakage and notes
  const json& lk = j["leakage"];
  h += "<h2>Leakage: calibration on the eval text itself</h2>\n";
  if (lk.is_null()) {
    h += "<p>No leakage row in this run.</p>\n";
  } else {
    h += fmt::format("<p>{} at windows {}, ctx {}, domain {}: calibrated on <code>{}</code> (the eval file) versus the "
                     "disjoint calibration data.</p>\n<table id=\"leakage\"><tr><th>calibration</th><th>ppl</th>"
                     "<th>KL</th></tr>\n",
                     esc(lk["method"].get<std::string>()), esc(lk["windows"].get<std::string>()), lk["ctx"].get<int>(),
                     esc(lk["domain"].get<std::string>()), esc(lk["leak_calibration"].get<std::string>()));
    for (const char* which : {"disjoint", "leak"}) {
      const std::string p = which;
      if (lk.contains(p + "_ppl_domain"))
        h += fmt::format("<tr><td>{}</td><td>{:.4f}</td><td>{:.5f}</td></tr>\n",
                         p == "leak" ? "same eval file (leak)" : "disjoint", lk[p + "_ppl_domain"].get<double>(),
                         lk[p + "_kl_domain"].get<double>());
    }
    h += "</table>\n";
  }
  h += "<h2>Notes</h2>\n<ul>\n";
  for (const json& n : j["notes"]) h += "<li>" + esc(n.get<std::string>()) + "</li>\n";
  h += "</ul>\n</body>\n</html>\n";
  return h;
}

}  // namespace kvq
