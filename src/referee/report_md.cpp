// The referee's results.json schema check, report.md and the summary table (every number from results.json).
#include <algorithm>

#include <fmt/format.h>

#include "referee/bands.h"
#include "referee/claims.h"
#include "referee/eviction.h"
#include "referee/pooled.h"
#include "referee/referee.h"
#include "referee/view.h"

namespace kvq {

using nlohmann::json;

namespace {

// A claim cell's verdict (referee/claims.h: claim_verdict_text): the rule's word on the claim's own model, or its
// reading on another model, which names it.
bool valid_verdict(const std::string& v) {
  if (v == "holds" || v == "does not hold" || v == "cannot tell") return true;
  for (const char* prefix : {"reproduced on ", "not reproduced on ", "cannot tell on "})
    if (v.rfind(prefix, 0) == 0 && v.size() > std::string_view(prefix).size()) return true;
  return false;
}

// Collects schema problems as "path: what is wrong".
class Schema {
 public:
  std::vector<std::string> errors;

  // j[key] exists and satisfies pred; returns whether it does (so callers can descend safely).
  template <typename Pred>
  bool need(const json& j, const std::string& where, const std::string& key, Pred pred, const char* type) {
    if (!j.is_object() || !j.contains(key)) {
      errors.push_back(fmt::format("{}.{}: missing", where, key));
      return false;
    }
    if (!pred(j[key])) {
      errors.push_back(fmt::format("{}.{}: expected {}, got {}", where, key, type, j[key].type_name()));
      return false;
    }
    return true;
  }
  bool object(const json& j, const std::string& w, const std::string& k) {
    return need(j, w, k, [](const json& v) { return v.is_object(); }, "object");
  }
  bool array(const json& j, const std::string& w, const std::string& k) {
    return need(j, w, k, [](const json& v) { return v.is_array(); }, "array");
  }
  bool string(const json& j, const std::string& w, const std::string& k) {
    return need(j, w, k, [](const json& v) { return v.is_string(); }, "string");
  }
  bool number(const json& j, const std::string& w, const std::string& k) {
    return need(j, w, k, [](const json& v) { return v.is_number(); }, "number");
  }
  bool integer(const json& j, const std::string& w, const std::string& k) {
    return need(j, w, k, [](const json& v) { return v.is_number_integer(); }, "integer");
  }
  bool boolean(const json& j, const std::string& w, const std::string& k) {
    return need(j, w, k, [](const json& v) { return v.is_boolean(); }, "boolean");
  }
  bool interval(const json& j, const std::string& w, const std::string& k) {
    return need(j, w, k, [](const json& v) { return v.is_array() && v.size() == 2 && v[0].is_number() &&
                                                    v[1].is_number(); }, "[lo, hi] numbers");
  }
};

void check_run(Schema& s, const json& r, const std::string& w, const std::vector<std::string>& ctxs,
               const std::vector<std::string>& domains) {
  s.string(r, w, "key");
  if (s.object(r, w, "method")) s.string(r["method"], w + ".method", "label");
  if (s.object(r, w, "windows")) {
    s.integer(r["windows"], w + ".windows", "sink");
    s.integer(r["windows"], w + ".windows", "recent");
    s.string(r["windows"], w + ".windows", "label");
  }
  s.boolean(r, w, "leakage");
  // Records from before the protocols have none: they are the common protocol's (referee/view.h: run_protocol).
  if (r.contains("protocol") && s.object(r, w, "protocol")) {
    const json& p = r["protocol"];
    const std::string pw = w + ".protocol";
    if (s.string(p, pw, "name") && p["name"] != "common" && p["name"] != "as-shipped")
      s.errors.push_back(pw + ".name: expected common or as-shipped, got " + p["name"].get<std::string>());
    s.string(p, pw, "prompt_policy");
    s.string(p, pw, "layer_skip");
    s.boolean(p, pw, "attn_rot");
  }
  if (s.object(r, w, "rotation")) {
    const json& rot = r["rotation"];
    s.string(rot, w + ".rotation", "name");
    s.boolean(rot, w + ".rotation", "reused");
    s.number(rot, w + ".rotation", "calibration_seconds");
    s.need(rot, w + ".rotation", "file", [](const json& v) { return v.is_string() || v.is_null(); },
           "string or null");
  }
  s.object(r, w, "settings");
  // An eviction row records its budget at every ctx: the paired row's bits, the prompt, the tokens kept and stored.
  if (r.contains("method") && r["method"].is_object() && !r["method"].value("equal_bytes", std::string()).empty() &&
      s.object(r, w, "equal_bytes") && s.object(r["equal_bytes"], w + ".equal_bytes", "by_ctx"))
    for (const std::string& c : ctxs)
      if (s.object(r["equal_bytes"]["by_ctx"], w + ".equal_bytes.by_ctx", c)) {
        const json& e = r["equal_bytes"]["by_ctx"][c];
        const std::string ew = w + ".equal_bytes.by_ctx." + c;
        s.number(e, ew, "target_bits");
        s.number(e, ew, "stored_bits");
        for (const char* k : {"prompt_tokens", "kept_prompt_tokens", "stored_tokens"}) s.integer(e, ew, k);
      }
  if (s.object(r, w, "model")) s.string(r["model"], w + ".model", "fingerprint");
  if (s.object(r, w, "cache") && s.object(r["cache"], w + ".cache", "footprint"))
    for (const std::string& c : ctxs)
      if (s.object(r["cache"]["footprint"], w + ".cache.footprint", c))
        s.number(r["cache"]["footprint"][c], w + ".cache.footprint." + c, "kv_bits_effective");
  if (!s.object(r, w, "results")) return;
  const json& res = r["results"];
  const std::string rw = w + ".results";
  for (const char* task : {"ppl", "kl", "passkey", "layers"}) s.object(res, rw, task);
  for (const std::string& c : ctxs) {
    if (res.contains("ppl") && s.object(res["ppl"], rw + ".ppl", c))
      for (const std::string& d : domains)
        if (s.object(res["ppl"][c], rw + ".ppl." + c, d)) {
          s.number(res["ppl"][c][d], rw + ".ppl." + c + "." + d, "ppl");
          s.interval(res["ppl"][c][d], rw + ".ppl." + c + "." + d, "ci95");
        }
    if (res.contains("kl") && s.object(res["kl"], rw + ".kl", c))
      for (const std::string& d : domains)
        if (s.object(res["kl"][c], rw + ".kl." + c, d)) {
          const json& k = res["kl"][c][d];
          const std::string kw = rw + ".kl." + c + "." + d;
          s.number(k, kw, "kl_mean");
          s.interval(k, kw, "kl_ci95");
          s.number(k, kw, "top1");
          s.interval(k, kw, "top1_ci95");
          if (k.contains("tail") && s.object(k, kw, "tail")) {  // optional: records before KL tails have none
            const json& t = k["tail"];
            const std::string tw = kw + ".tail";
            s.integer(t, tw, "prompt_tokens");
            s.integer(t, tw, "tokens");
            s.number(t, tw, "kl_mean");
            s.interval(t, tw, "kl_ci95");
            s.number(t, tw, "top1");
            s.interval(t, tw, "top1_ci95");
            for (const char* a : {"window_kl_sum", "window_top1_agree", "window_tokens"}) s.array(t, tw, a);
          }
        }
    if (res.contains("passkey") && s.object(res["passkey"], rw + ".passkey", c)) {
      const json& p = res["passkey"][c];
      const std::string pw = rw + ".passkey." + c;
      s.number(p, pw, "accuracy");
      s.interval(p, pw, "ci95");
      s.integer(p, pw, "trials");
      if (s.object(p, pw, "by_depth"))
        for (const auto& [depth, cell] : p["by_depth"].items()) {
          s.number(cell, pw + ".by_depth." + depth, "accuracy");
          s.integer(cell, pw + ".by_depth." + depth, "trials");
        }
    }
  }
  if (res.contains("layers") && !ctxs.empty() && s.object(res["layers"], rw + ".layers", ctxs.front()) &&
      s.array(res["layers"][ctxs.front()], rw + ".layers." + ctxs.front(), "per_layer")) {
    const json& rows = res["layers"][ctxs.front()]["per_layer"];
    if (rows.empty()) s.errors.push_back(rw + ".layers." + ctxs.front() + ".per_layer: empty");
    for (size_t l = 0; l < rows.size(); ++l) {
      const std::string lw = fmt::format("{}.layers.{}.per_layer[{}]", rw, ctxs.front(), l);
      s.number(rows[l], lw, "attn_out_rel_err");
      s.number(rows[l], lw, "hidden_rel_err");
    }
  }
}

// results.json "bands", "pareto" and "claims" (referee/bands.h, referee/claims.h): per protocol and ctx.
void check_equal_bits(Schema& s, const json& j, const std::vector<std::string>& ctxs) {
  const std::string w = "results";
  if (s.object(j, w, "bands"))
    for (const auto& [protocol, by_ctx] : j["bands"].items())
      for (const std::string& c : ctxs) {
        const std::string bw = w + ".bands." + protocol;
        if (!s.array(by_ctx, bw, c)) continue;
        for (size_t b = 0; b < by_ctx[c].size(); ++b) {
          const json& band = by_ctx[c][b];
          const std::string aw = fmt::format("{}.{}[{}]", bw, c, b);
          s.string(band, aw, "band");
          s.number(band, aw, "lo");
          s.number(band, aw, "hi");
          s.string(band, aw, "best_key");
          if (s.array(band, aw, "runs"))
            for (size_t i = 0; i < band["runs"].size(); ++i) {
              const json& r = band["runs"][i];
              const std::string rw = fmt::format("{}.runs[{}]", aw, i);
              s.string(r, rw, "key");
              s.number(r, rw, "bits");
              s.integer(r, rw, "scored_from");
              s.number(r, rw, "ppl");
              s.interval(r, rw, "ppl_ci95");
              s.number(r, rw, "kl");
              s.interval(r, rw, "kl_ci95");
              s.number(r, rw, "passkey");
              s.interval(r, rw, "passkey_ci95");
              if (!r.value("increase_pct", json()).is_null()) {
                s.interval(r, rw, "increase_pct_ci95");
                s.integer(r, rw, "increase_windows");
              }
              if (r.contains("vs_best") && !r["vs_best"].is_null()) {
                s.interval(r["vs_best"], rw + ".vs_best", "ci95");
                s.string(r["vs_best"], rw + ".vs_best", "verdict");
              }
            }
        }
      }
  if (s.object(j, w, "pareto"))
    for (const auto& [protocol, by_ctx] : j["pareto"].items())
      for (const std::string& c : ctxs)
        if (s.array(by_ctx, w + ".pareto." + protocol, c))
          for (size_t i = 0; i < by_ctx[c].size(); ++i) {
            const std::string pw = fmt::format("{}.pareto.{}.{}[{}]", w, protocol, c, i);
            s.string(by_ctx[c][i], pw, "key");
            s.number(by_ctx[c][i], pw, "bits");
            s.number(by_ctx[c][i], pw, "kl");
            s.interval(by_ctx[c][i], pw, "kl_ci95");
            s.boolean(by_ctx[c][i], pw, "front");
          }
  if (j.contains("eviction") && s.object(j, w, "eviction"))  // optional: results written before the eviction row
    for (const auto& [protocol, by_ctx] : j["eviction"].items())
      for (const auto& [c, rows] : by_ctx.items())
        for (size_t i = 0; i < rows.size(); ++i) {
          const std::string ew = fmt::format("{}.eviction.{}.{}[{}]", w, protocol, c, i);
          s.string(rows[i], ew, "key");
          s.string(rows[i], ew, "paired");
          s.number(rows[i], ew, "bits");
          s.integer(rows[i], ew, "scored_from");
          s.number(rows[i], ew, "ppl");
          s.interval(rows[i], ew, "ppl_ci95");
          for (const char* k : {"vs_paired", "vs_bf16", "paired_vs_bf16"})
            if (s.need(rows[i], ew, k, [](const json& v) { return v.is_object() || v.is_null(); }, "object or null") &&
                rows[i][k].is_object())
              s.interval(rows[i][k], ew + "." + k, "ci95");
          // KL and top-1 on the same rows: a number with its ci95, or both null (no KL record on those rows)
          for (const char* k : {"kl", "top1", "paired_kl", "paired_top1"}) {
            const std::string ci = std::string(k) + "_ci95";
            if (s.need(rows[i], ew, k, [](const json& v) { return v.is_number() || v.is_null(); }, "number or null") &&
                rows[i][k].is_number())
              s.interval(rows[i], ew, ci.c_str());
          }
          if (s.need(rows[i], ew, "fidelity_vs_paired", [](const json& v) { return v.is_object() || v.is_null(); },
                     "object or null") &&
              rows[i]["fidelity_vs_paired"].is_object())
            for (const char* k : {"kl", "top1"})
              if (s.object(rows[i]["fidelity_vs_paired"], ew + ".fidelity_vs_paired", k)) {
                s.number(rows[i]["fidelity_vs_paired"][k], ew + ".fidelity_vs_paired." + k, "estimate");
                s.interval(rows[i]["fidelity_vs_paired"][k], ew + ".fidelity_vs_paired." + k, "ci95");
              }
        }
  s.string(j, w, "claims_rule");
  if (s.array(j, w, "claims"))
    for (size_t i = 0; i < j["claims"].size(); ++i) {
      const json& c = j["claims"][i];
      const std::string cw = fmt::format("{}.claims[{}]", w, i);
      for (const char* k : {"camp", "claim", "source", "measured_on", "metric", "kind"}) s.string(c, cw, k);
      for (const char* k : {"value", "tolerance", "bits"}) s.number(c, cw, k);
      if (!s.object(c, cw, "kvq")) continue;
      for (const auto& [protocol, by_ctx] : c["kvq"].items())
        for (const auto& [ctx, cell] : by_ctx.items()) {
          if (cell.is_null()) continue;
          const std::string kw = cw + ".kvq." + protocol + "." + ctx;
          s.string(cell, kw, "key");
          s.number(cell, kw, "measured");
          s.interval(cell, kw, "ci95");
          if (c.value("metric", "") == "ppl_increase_pct") s.integer(cell, kw, "windows");
          if (s.string(cell, kw, "verdict") && !valid_verdict(cell["verdict"].get<std::string>()))
            s.errors.push_back(kw + ".verdict: expected holds, does not hold, cannot tell, or reproduced / not "
                                    "reproduced / cannot tell on a model");
        }
    }
}

std::string ci(const json& iv, const char* f) {
  return fmt::format(fmt::runtime(std::string("[") + f + ", " + f + "]"), iv[0].get<double>(), iv[1].get<double>());
}

}  // namespace

std::vector<std::string> referee_schema_errors(const json& j) {
  Schema s;
  const std::string w = "results";
  if (!j.is_object()) return {"results: not an object"};
  if (s.object(j, w, "kvq")) {
    s.string(j["kvq"], w + ".kvq", "version");
    s.string(j["kvq"], w + ".kvq", "git");
  }
  s.string(j, w, "date");
  if (s.object(j, w, "machine")) {
    s.string(j["machine"], w + ".machine", "cpu_model");
    s.string(j["machine"], w + ".machine", "sysname");
    s.string(j["machine"], w + ".machine", "machine");
    s.integer(j["machine"], w + ".machine", "threads");
  }
  if (s.object(j, w, "model")) s.string(j["model"], w + ".model", "fingerprint");
  if (s.object(j, w, "calibration_data")) s.string(j["calibration_data"], w + ".calibration_data", "sha256");
  std::vector<std::string> domains;
  if (s.array(j, w, "eval_data"))
    for (size_t i = 0; i < j["eval_data"].size(); ++i) {
      const json& d = j["eval_data"][i];
      const std::string dw = fmt::format("{}.eval_data[{}]", w, i);
      s.string(d, dw, "sha256");
      if (s.string(d, dw, "domain")) domains.push_back(d["domain"]);
    }
  std::vector<std::string> ctxs;
  if (s.object(j, w, "config")) {
    const json& c = j["config"];
    if (s.need(c, w + ".config", "ctx", [](const json& v) {
          return v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), [](const json& x) {
                   return x.is_number_integer();
                 });
        }, "non-empty array of integers"))
      for (const json& x : c["ctx"]) ctxs.push_back(std::to_string(x.get<int>()));
    s.array(c, w + ".config", "methods");
    s.array(c, w + ".config", "windows");
    s.string(c, w + ".config", "layer_skip");
    s.integer(c, w + ".config", "group");
  }
  if (s.object(j, w, "seeds")) s.integer(j["seeds"], w + ".seeds", "seed");
  s.need(j, w, "leakage", [](const json& v) { return v.is_object() || v.is_null(); }, "object or null");
  if (s.object(j, w, "counters"))
    for (const char* k : {"runs_total", "runs_executed", "runs_resumed", "calibrations_run", "calibrations_reused"})
      s.integer(j["counters"], w + ".counters", k);
  s.array(j, w, "notes");
  if (j.contains("unseen") && !j["unseen"].is_null() && s.object(j, w, "unseen")) {  // optional: older results lack it
    s.array(j["unseen"], w + ".unseen", "domains");
    s.object(j["unseen"], w + ".unseen", "ppl");
    s.object(j["unseen"], w + ".unseen", "paired");
  }
  check_equal_bits(s, j, ctxs);
  if (s.array(j, w, "runs")) {
    if (j["runs"].empty()) s.errors.push_back(w + ".runs: empty");
    for (size_t i = 0; i < j["runs"].size(); ++i)
      check_run(s, j["runs"][i], fmt::format("{}.runs[{}]", w, i), ctxs, domains);
  }
  return s.errors;
}

namespace {

// A run's "cost" (RefereeConfig::cost_probe), or an empty object.
const json& run_cost(const json& r) {
  static const json kNone = json::object();
  return r.contains("cost") ? r["cost"] : kNone;
}

// The cost column: one decode step's attention of each row's cache at the fixed shape on the runner's device, its
// bytes, the share of the read probe, the ratio to the bf16 row's, and the row's wall time. Empty when no run has a
// cost (--cost-shape off, or records made before the column).

std::string referee_cost_markdown(const json& j) {
  const json* first = nullptr;
  double bf16_us = 0;
  for (const json& r : j["runs"]) {
    const json& c = run_cost(r);
    if (!c.contains("attention_us")) continue;
    if (!first) first = &c;
    if (r["method"]["label"] == "bf16" && bf16_us == 0) bf16_us = c["attention_us"].get<double>();
  }
  if (!first) return "";
  std::string s = fmt::format(
      "\n## What each row costs\n\nOne decode step's attention of the row's cache (its codecs and windows, random "
      "rows, decode-faithful, one layer) at {} on {}, as `kvq bench attention` times it; the bytes that step reads "
      "and their share of the device's streaming-read probe; the speedup over the bf16 row's cache; the referee's "
      "wall time for the row; and the step at the evaluated model's own heads and longest context ({}). Rotation "
      "files are not in the step (a rotation's query rotation costs its own; see docs/results). decode tok/s: one "
      "sequence's greedy decode at the longest context through the row's own cache and rotation, the model's "
      "weights and the evaluation's runner (the median step).\n\n| method | windows | attention µs | MB read | % of read probe | vs bf16 "
      "| µs at the model's shape | decode tok/s | run s |\n|---|---|---|---|---|---|---|---|---|\n",
      (*first)["shape"].get<std::string>(), (*first)["device"].get<std::string>(),
      first->contains("model_shape") ? (*first)["model_shape"]["shape"].get<std::string>() : "not measured");
  for (const json& r : j["runs"]) {
    const json& c = run_cost(r);
    std::string cells;
    if (c.contains("attention_us")) {
      const double us = c["attention_us"].get<double>();
      const json& m = c.contains("model_shape") ? c["model_shape"] : json::object();
      cells = fmt::format("{:.0f} | {:.1f} | {:.0f}% | {} | {}", us, c["bytes_read"].get<double>() / 1e6,
                          100 * c["fraction_of_read_probe"].get<double>(),
                          bf16_us > 0 ? fmt::format("{:.2f}x", bf16_us / us) : "-",
                          m.contains("attention_us") ? fmt::format("{:.0f}", m["attention_us"].get<double>())
                          : m.contains("unsupported") ? "not run"
                                                      : "-");
    } else {
      const std::string why = c.contains("unsupported") ? "not run: " + c["unsupported"].get<std::string>()
                              : c.contains("skipped")   ? c["skipped"].get<std::string>()
                                                        : "not measured";
      cells = why + " | | | | ";
    }
    const json& d = r.contains("decode") ? r["decode"] : json::object();
    const std::string decode = d.contains("tokens_per_second")
                                   ? fmt::format("{:.1f}", d["tokens_per_second"].get<double>())
                               : d.contains("unsupported") ? "not run"
                                                           : "-";
    s += fmt::format("| {} | {} | {} | {} | {:.1f} |\n", run_label(r), r["windows"]["label"].get<std::string>(), cells,
                     decode, r.value("seconds", 0.0));
  }
  return s;
}

}  // namespace

std::string referee_summary_table(const json& j) {
  const std::vector<int> ctx = j["config"]["ctx"].get<std::vector<int>>();
  const std::string c0 = std::to_string(ctx.front());
  size_t w = 20;  // the label column fits the longest label ("turboquant_2bit (kvq ext.), as shipped")
  for (const json& r : j["runs"]) w = std::max(w, run_label(r).size());
  std::string s = fmt::format("{:<{}} {:<8}", "method", w, "windows");
  for (int c : ctx) s += fmt::format(" {:>9}", fmt::format("bits@{}", c));
  s += fmt::format(" {:>10} {:>21} {:>10} {:>7} {:>9} {:>8} {:>9}\n", "ppl", "95% CI", "KL", "top-1", "passkey",
                   "run s", "attn µs");
  for (const json& r : j["runs"]) {
    s += fmt::format("{:<{}} {:<8}", run_label(r), w, r["windows"]["label"].get<std::string>());
    for (int c : ctx) s += fmt::format(" {:>9.3f}", run_bits(r, std::to_string(c)));
    const std::string d = pooled_domain(r, c0);
    const json& p = r["results"]["ppl"][c0][d];
    const json& k = r["results"]["kl"][c0][d];
    const json& pk = r["results"]["passkey"][c0];
    s += fmt::format(" {:>10.4f} {:>21} {:>10.5f} {:>7.4f} {:>8.1f}% {:>8.1f}\n", p["ppl"].get<double>(),
                     ci(p["ci95"], "{:.3f}"), k["kl_mean"].get<double>(), k["top1"].get<double>(),
                     100 * pk["accuracy"].get<double>(), r.value("seconds", 0.0));
    const json& cost = run_cost(r);
    s.insert(s.size() - 1, cost.contains("attention_us") ? fmt::format(" {:>8.0f}", cost["attention_us"].get<double>())
                                                         : fmt::format(" {:>8}", "-"));
  }
  const std::string d = j["runs"].empty() ? "" : pooled_domain(j["runs"][0], c0);
  s += fmt::format("(ppl, KL vs BF16 and top-1 at ctx {} over {}; passkey at ctx {}; bits = effective bits per "
                   "cached element at each ctx, windows and scales included; run s = the referee's wall time of the "
                   "row's run, every ctx, on the runner that made it; attn µs = one decode step's attention of the "
                   "row's cache at the cost shape, report.md's \"What each row costs\")\n",
                   c0, d == "all" ? "all domains pooled" : "domain " + d, c0);
  return s;
}

std::string referee_markdown(const json& j) {
  const std::vector<int> ctx = j["config"]["ctx"].get<std::vector<int>>();
  const std::string c0 = std::to_string(ctx.front());
  std::vector<std::string> domains;
  for (const json& d : j["eval_data"]) domains.push_back(d["domain"]);
  std::string s = "# kvq referee report\n\n";
  s += fmt::format("- model: `{}`, fingerprint `{}`\n", j["model"]["dir"].get<std::string>(),
                   j["model"]["fingerprint"].get<std::string>());
  s += fmt::format("- kvq {} (git {}), {}\n", j["kvq"]["version"].get<std::string>(),
                   j["kvq"]["git"].get<std::string>(), j["date"].get<std::string>());
  const json& m = j["machine"];
  s += fmt::format("- machine (results.json written): {} {} {}, CPU {}, {} threads\n", m.value("sysname", ""),
                   m.value("release", ""), m.value("machine", ""), m.value("cpu_model", ""), m.value("threads", 0));
  if (j.contains("runners")) {
    // One runner: a line. Several (a report pooled from processes on different devices): each with its runs.
    const json& runners = j["runners"];
    for (const json& r : runners) {
      s += fmt::format("- evaluation passes ran on: {}", r.get<std::string>());
      if (runners.size() > 1) {
        std::vector<std::string> runs;
        for (const json& run : j["runs"])
          if (run.value("runner", json("unknown")) == r) runs.push_back(run_label(run));
        s += fmt::format(": {} run{}, {}", runs.size(), runs.size() == 1 ? "" : "s", fmt::join(runs, ", "));
      }
      s += "\n";
    }
  }
  s += fmt::format("- calibration data: `{}` sha256 `{}` ({} tokens)\n",
                   j["calibration_data"]["file"].get<std::string>(), j["calibration_data"]["sha256"].get<std::string>(),
                   j["calibration_data"]["tokens"].get<long long>());
  for (const json& d : j["eval_data"])
    s += fmt::format("- eval `{}`: `{}` sha256 `{}` ({} tokens)\n", d["domain"].get<std::string>(),
                     d["file"].get<std::string>(), d["sha256"].get<std::string>(), d["tokens"].get<long long>());
  const json& c = j["config"];
  s += fmt::format("- settings: ctx {}, {} eval windows per domain (0 = all), passkey {} trial(s) × {} depths, seed {}, "
                   "{} bootstrap resamples, group {}, layer skip {} (common protocol){}\n",
                   c["ctx"].dump(), c["eval_windows"].get<int>(), c["passkey_trials"].get<int>(), c["depths"].size(),
                   j["seeds"]["seed"].get<uint64_t>(), c["bootstrap"].get<int>(), c["group"].get<int>(),
                   c["layer_skip"].get<std::string>(), c.value("quick", false) ? " (quick subset)" : "");
  if (c.contains("protocols")) {
    std::string list;
    for (const json& p : c["protocols"]) list += (list.empty() ? "" : ", ") + p.get<std::string>();
    s += fmt::format("- protocols: {} (common: decode-faithful, the window settings {}, no layer skipped; as-shipped: "
                     "each camp's own windows, layer skip, attn_rot and prompt policy, every as-shipped row scoring "
                     "the second half of each window after a prompt of its first half; see Notes)\n",
                     list, c["windows"].dump());
  }
  const json& n = j["counters"];
  s += fmt::format("- runs: {} ({} run now, {} resumed from runs/); calibrations: {} run, {} reused\n\n",
                   n["runs_total"].get<int>(), n["runs_executed"].get<int>(), n["runs_resumed"].get<int>(),
                   n["calibrations_run"].get<int>(), n["calibrations_reused"].get<int>());
  if (j.contains("missing_runs") && !j["missing_runs"].empty()) {
    s += "- **not run** (no record in runs/: a report written with --report-only, or runs the device has no kernels "
         "for, left out with --skip-unsupported):";
    for (const json& r : j["missing_runs"])
      s += fmt::format(" {} {}{}{};", r["method"].get<std::string>(), r["windows"].get<std::string>(),
                       r.value("leakage", false) ? " (leakage row)" : "",
                       r.contains("reason") ? " (" + r["reason"].get<std::string>() + ")" : "");
    s += "\n";
  }
  s += "\n";

  s += "## Effective bits per cached element (bytes actually stored, windows included)\n\n| method | windows |";
  for (int x : ctx) s += fmt::format(" N={} |", x);
  s += "\n|---|---|";
  for (size_t i = 0; i < ctx.size(); ++i) s += "---|";
  s += "\n";
  for (const json& r : j["runs"]) {
    s += fmt::format("| {} | {} |", run_label(r), r["windows"]["label"].get<std::string>());
    for (int x : ctx) s += fmt::format(" {:.3f} |", run_bits(r, std::to_string(x)));
    s += "\n";
  }

  for (int x : ctx) {
    const std::string cs = std::to_string(x);
    s += fmt::format("\n## Perplexity at ctx {} (bootstrap 95% CI over windows)\n\n| method | windows |", x);
    std::vector<std::string> cols = domains;
    if (!j["runs"].empty() && j["runs"][0]["results"]["ppl"][cs].contains("all")) cols.push_back("all");
    for (const std::string& d : cols) s += " " + d + " |";
    s += "\n|---|---|";
    for (size_t i = 0; i < cols.size(); ++i) s += "---|";
    s += "\n";
    for (const json& r : j["runs"]) {
      s += fmt::format("| {} | {} |", run_label(r), r["windows"]["label"].get<std::string>());
      for (const std::string& d : cols) {
        const json& p = r["results"]["ppl"][cs][d];
        s += fmt::format(" {:.4f} {} |", p["ppl"].get<double>(), ci(p["ci95"], "{:.4f}"));
      }
      s += "\n";
    }
    const bool evicts = std::any_of(j["runs"].begin(), j["runs"].end(), [](const json& r) {
      return !r["method"].value("equal_bytes", std::string()).empty();
    });
    if (evicts)
      s += "\nThe eviction rows score only the last 1/16 of each window (after their prompt) and as-shipped rows the "
           "second half: compare them in the equal-bits and eviction sections, paired on the same targets.\n";
    s += fmt::format("\n## KL(p_bf16 ‖ p_method) per token and top-1 agreement at ctx {} (95% CI)\n\n", x);
    s += "| method | windows |";
    for (const std::string& d : cols) s += " KL " + d + " | top-1 " + d + " |";
    s += "\n|---|---|";
    for (size_t i = 0; i < cols.size(); ++i) s += "---|---|";
    s += "\n";
    for (const json& r : j["runs"]) {
      s += fmt::format("| {} | {} |", run_label(r), r["windows"]["label"].get<std::string>());
      for (const std::string& d : cols) {
        const json& k = r["results"]["kl"][cs][d];
        s += fmt::format(" {:.5f} {} | {:.4f} {} |", k["kl_mean"].get<double>(), ci(k["kl_ci95"], "{:.5f}"),
                         k["top1"].get<double>(), ci(k["top1_ci95"], "{:.4f}"));
      }
      s += "\n";
    }
    s += fmt::format("\n## Passkey retrieval at ctx {} (Wilson 95% CI)\n\n| method | windows | accuracy | 95% CI | "
                     "correct / trials |\n|---|---|---|---|---|\n", x);
    for (const json& r : j["runs"]) {
      const json& p = r["results"]["passkey"][cs];
      s += fmt::format("| {} | {} | {:.1f}% | [{:.1f}%, {:.1f}%] | {} / {} |\n", run_label(r),
                       r["windows"]["label"].get<std::string>(), 100 * p["accuracy"].get<double>(),
                       100 * p["ci95"][0].get<double>(), 100 * p["ci95"][1].get<double>(), p["correct"].get<int>(),
                       p["trials"].get<int>());
    }
  }

  s += referee_unseen_markdown(j);
  s += referee_bands_markdown(j);
  s += referee_eviction_markdown(j);
  s += referee_claims_markdown(j);

  s += "\n## Leakage: same-text calibration versus disjoint calibration\n\n";
  const json& lk = j["leakage"];
  if (lk.is_null()) {
    s += "No leakage row in this run.\n";
  } else {
    const std::string d = lk["domain"];
    s += fmt::format("{} at windows {}, ctx {}: calibrated on the eval file `{}` itself versus on the disjoint "
                     "calibration data.\n\n| calibration | ppl {} | KL {} | ppl pooled | KL pooled |\n"
                     "|---|---|---|---|---|\n",
                     lk["method"].get<std::string>(), lk["windows"].get<std::string>(), lk["ctx"].get<int>(),
                     lk["leak_calibration"].get<std::string>(), d, d);
    for (const char* which : {"disjoint", "leak"}) {
      const std::string p = which;
      if (!lk.contains(p + "_ppl_domain")) continue;
      s += fmt::format("| {} | {:.4f} {} | {:.5f} {} | {:.4f} | {:.5f} |\n",
                       p == "leak" ? "same eval file (leak)" : "disjoint calibration data",
                       lk[p + "_ppl_domain"].get<double>(), ci(lk[p + "_ppl_domain_ci95"], "{:.4f}"),
                       lk[p + "_kl_domain"].get<double>(), ci(lk[p + "_kl_domain_ci95"], "{:.5f}"),
                       lk[p + "_ppl_all"].get<double>(), lk[p + "_kl_all"].get<double>());
    }
  }

  const auto tuned = [](const json& r) {
    return r.contains("clips") && !r["clips"].value("tuned_on", std::string()).empty();
  };
  if (std::any_of(j["runs"].begin(), j["runs"].end(), tuned)) {
    s += "\n## Clips tuned on held-out text (the end of the calibration file)\n\n| method | windows | clip K | clip V | "
         "tuned on | held-out ppl | candidates |\n|---|---|---|---|---|---|---|\n";
    for (const json& r : j["runs"]) {
      if (!tuned(r)) continue;
      const json& c = r["clips"];
      double chosen = 0;
      for (const json& g : c["grid"])
        if (g[0].get<float>() == c["k"].get<float>() && g[1].get<float>() == c["v"].get<float>()) chosen = g[2];
      s += fmt::format("| {} | {} | {} | {} | {} | {:.4f} | {} |\n", run_label(r), r["windows"]["label"].get<std::string>(),
                       c["k"].get<float>(), c["v"].get<float>(), c["tuned_on"].get<std::string>(), chosen,
                       c["grid"].size());
    }
  }
  s += "\n## What was calibrated on what\n\n| method | windows | rotation | file | reused | calibration data | "
       "seconds | OptR heads kept (K / V) |\n|---|---|---|---|---|---|---|---|\n";
  for (const json& r : j["runs"]) {
    const json& rot = r["rotation"];
    const int heads = rot.value("heads_total", 0);
    s += fmt::format("| {} | {} | {} | {} | {} | {} | {:.1f} | {} |\n", run_label(r),
                     r["windows"]["label"].get<std::string>(), rot["name"].get<std::string>(),
                     rot["file"].is_null() ? "-" : "`" + rot["file"].get<std::string>() + "`",
                     rot["file"].is_null() ? "-" : (rot["reused"].get<bool>() ? "yes (cached)" : "no"),
                     rot["calib_data"].is_null() ? "-" : "`" + rot["calib_data"].get<std::string>() + "`",
                     rot["calibration_seconds"].get<double>(),
                     heads > 0 ? fmt::format("{} / {} of {}", rot.value("heads_key_kept", 0),
                                             rot.value("heads_value_kept", 0), heads)
                               : "-");
  }
  s += referee_cost_markdown(j);
  s += "\n## Notes\n\n";
  for (const json& note : j["notes"]) s += "- " + note.get<std::string>() + "\n";
  s += "\n## Summary\n\n```\n" + referee_summary_table(j) + "```\n";
  return s;
}

}  // namespace kvq
