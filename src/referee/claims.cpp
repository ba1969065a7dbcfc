#include "referee/claims.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "referee/bands.h"
#include "referee/view.h"

namespace kvq {

using nlohmann::json;

namespace {

// The tolerance of a ppl increase a camp measured: half of it, at least half a percentage point.
constexpr double half_or_half_point(double pct) { return pct / 2 > 0.5 ? pct / 2 : 0.5; }

constexpr const char* kPpl = "ppl_increase_pct";
constexpr const char* kPasskey = "passkey";
constexpr double kRetrievalTol = 0.1;  // passkey accuracy, absolute
constexpr double kNearLossless = 1.0;  // kvq's reading of "near-lossless" / "close to BF16": ppl increase <= 1%

const std::string kVllmDoc = "vLLM turboquant/config.py docstring (docs/research/methods-2026-12.md §1.7)";
const std::string kVllmStack = "vLLM's merged TurboQuant backend; model, data and context not stated in the code; "
                               "layers 0, 1, L-2, L-1 always BF16";
const std::string kNexusPr = "vLLM PR #47742 (docs/research/methods-2026-12.md §2.9)";
const std::string kLlamaFig = "llama.cpp itself on models/ref (docs/research/llamacpp-kv.md §4)";
const std::string kLlamaStack = "llama.cpp CPU, flash attention, attn_rot on, no windows; models/ref as GGUF F16, "
                                "python.txt, 4 windows of 2048, every token scored";

}  // namespace

std::string claim_kind_name(ClaimKind k) {
  return k == ClaimKind::Value ? "value" : k == ClaimKind::AtMost ? "at_most" : "at_least";
}

const std::vector<CampClaim>& camp_claims() {
  static const std::vector<CampClaim> kClaims = {
      {.camp = "TurboQuant (vLLM)", .claim = "turboquant_k8v4: 2.6x compression, +1.17% PPL", .source = kVllmDoc,
       .measured_on = kVllmStack, .metric = kPpl, .kind = ClaimKind::Value, .value = 1.17,
       .tolerance = half_or_half_point(1.17), .bits = 6.125, .methods = {"turboquant_k8v4"}},
      {.camp = "TurboQuant (vLLM)", .claim = "turboquant_4bit_nc: 3.8x compression, +2.71% PPL", .source = kVllmDoc,
       .measured_on = kVllmStack, .metric = kPpl, .kind = ClaimKind::Value, .value = 2.71,
       .tolerance = half_or_half_point(2.71), .bits = 4.1875, .methods = {"turboquant_4bit_nc"}},
      {.camp = "TurboQuant (vLLM)", .claim = "turboquant_k3v4_nc: ~3.5x compression, +10.63% PPL", .source = kVllmDoc,
       .measured_on = kVllmStack, .metric = kPpl, .kind = ClaimKind::Value, .value = 10.63,
       .tolerance = half_or_half_point(10.63), .bits = 3.6875, .methods = {"turboquant_k3v4_nc"}},
      {.camp = "TurboQuant (vLLM)", .claim = "turboquant_3bit_nc: 4.9x compression, +20.59% PPL", .source = kVllmDoc,
       .measured_on = kVllmStack, .metric = kPpl, .kind = ClaimKind::Value, .value = 20.59,
       .tolerance = half_or_half_point(20.59), .bits = 3.1875, .methods = {"turboquant_3bit_nc"}},
      {.camp = "NexusQuant", .claim = "NIAH 30/30 at 2.125 bpe (E8, K2V2)", .source = kNexusPr,
       .measured_on = "the author's vLLM draft backend, 2x T4, Llama-3.1-8B-Instruct, 4K context, 30 NIAH trials "
                      "(their bpe omits the scale; kvq's 2.125-bit format is e8_2)",
       .metric = kPasskey, .kind = ClaimKind::AtLeast, .value = 1.0, .tolerance = kRetrievalTol, .bits = 2.125,
       .methods = {"e8_2", "nexusquant"}, .models = {"Llama-3.1-8B-Instruct"}},
      {.camp = "NexusQuant", .claim = "TurboQuant 2-bit at 2.125 bpe: NIAH 0/30", .source = kNexusPr,
       .measured_on = "NexusQuant's own TurboQuant implementation, 2x T4, Llama-3.1-8B-Instruct, 4K context, 30 NIAH "
                      "trials",
       .metric = kPasskey, .kind = ClaimKind::AtMost, .value = 0.0, .tolerance = kRetrievalTol, .bits = 2.125,
       .methods = {"turboquant_2bit"}, .models = {"Llama-3.1-8B-Instruct"}},
      {.camp = "OScaR", .claim = "near-lossless INT2 (LongBench-E 41.75 vs BF16 41.70 on Llama-3.1-8B)",
       .source = "OScaR-KV-Quant README (docs/research/methods-2026-12.md §3.6)",
       .measured_on = "OScaR's kernels (BitDecoding/HadaCore, sm80), Llama-3.1-8B and Qwen3-8B, LongBench-E",
       .metric = kPpl, .kind = ClaimKind::AtMost, .value = kNearLossless, .tolerance = 0.0, .bits = 3.02,
       .methods = {"oscar_int2"}, .models = {"Llama-3.1-8B", "Qwen3-8B"}},
      {.camp = "Kitty", .claim = "~2.5 bits per element with accuracy close to full precision (Kitty-Pro)",
       .source = "Kitty, arXiv 2511.18643 / MLSys 2026 (docs/research/methods-2026-12.md §4)",
       .measured_on = "Kitty's accuracy simulation (20% boosted channels, sink 32, buffer 128), Qwen3 and LLaMA3 "
                      "(sizes not in kvq's notes), reasoning tasks",
       .metric = kPpl, .kind = ClaimKind::AtMost, .value = kNearLossless, .tolerance = 0.0, .bits = 2.5,
       .methods = {"kitty_int2_20", "kitty_int2"}},
      {.camp = "OptR", .claim = "close to BF16 at 2.32 bits",
       .source = "as quoted in issue #20 (the OptR paper; no primary text in docs/research)",
       .measured_on = "not stated in kvq's notes", .metric = kPpl, .kind = ClaimKind::AtMost, .value = kNearLossless,
       .tolerance = 0.0, .bits = 2.32, .methods = {"optr(oscar)", "optr(quarot)"}},
      {.camp = "llama.cpp", .claim = "q8_0 as users run it (-ctk q8_0 -ctv q8_0): +0.008% ppl", .source = kLlamaFig,
       .measured_on = kLlamaStack, .metric = kPpl, .kind = ClaimKind::Value, .value = 0.008,
       .tolerance = half_or_half_point(0.008), .bits = 8.5, .methods = {"q8_0"}, .models = {"models/ref"}},
      {.camp = "llama.cpp", .claim = "q4_0 as users run it (-ctk q4_0 -ctv q4_0): +0.699% ppl", .source = kLlamaFig,
       .measured_on = kLlamaStack, .metric = kPpl, .kind = ClaimKind::Value, .value = 0.699,
       .tolerance = half_or_half_point(0.699), .bits = 4.5, .methods = {"q4_0"}, .models = {"models/ref"}},
  };
  return kClaims;
}

std::string claim_verdict(ClaimKind kind, double value, double tol, double lo, double hi) {
  KVQ_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "claim verdict: bad interval [{}, {}]", lo, hi);
  switch (kind) {
    case ClaimKind::Value:
      if (lo >= value - tol && hi <= value + tol) return "holds";
      if (hi < value - tol || lo > value + tol) return "does not hold";
      return "cannot tell";
    case ClaimKind::AtMost:
      if (hi <= value + tol) return "holds";
      if (lo > value + tol) return "does not hold";
      return "cannot tell";
    case ClaimKind::AtLeast:
      if (lo >= value - tol) return "holds";
      if (hi < value - tol) return "does not hold";
      return "cannot tell";
  }
  KVQ_FAIL("claim verdict: unknown kind");
}

namespace {

// Letters and digits, lower case: "Qwen/Qwen3-8B" -> "qwenqwen38b".
std::string name_key(const std::string& name) {
  std::string out;
  for (const char ch : name)
    if (std::isalnum(static_cast<unsigned char>(ch))) out += char(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// 19'700'000 -> "19.7M", 8'190'000'000 -> "8.19B".
std::string params_text(double n) {
  if (n >= 1e9) return fmt::format("{:.3g}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.3g}M", n / 1e6);
  return fmt::format("{:.3g}K", n / 1e3);
}

}  // namespace

bool claim_same_model(const CampClaim& c, const std::string& model_name) {
  const std::string evaluated = name_key(model_name);
  for (const std::string& m : c.models) {
    const std::string k = name_key(m);
    if (k.empty() || evaluated.size() < k.size()) continue;
    // the whole evaluated name, or its last path component: "/data/Qwen3-8B" is Qwen3-8B, "my-Qwen3-8B" is not
    if (evaluated == k) return true;
    const size_t slash = model_name.find_last_of('/');
    if (slash != std::string::npos && name_key(model_name.substr(slash + 1)) == k) return true;
  }
  return false;
}

std::string claim_verdict_text(const std::string& outcome, bool same_model, const std::string& model_label) {
  if (same_model) return outcome;
  if (outcome == "holds") return "reproduced on " + model_label;
  if (outcome == "does not hold") return "not reproduced on " + model_label;
  return "cannot tell on " + model_label;
}

std::string referee_model_label(const json& j) {
  const json none = json::object();
  const json& m = j.contains("model") && j["model"].is_object() ? j["model"] : none;
  const std::string name = m.contains("name") ? m["name"].get<std::string>() : m.value("dir", std::string("?"));
  if (!m.contains("parameters") || !m["parameters"].is_number()) return name;
  return fmt::format("{} ({})", name, params_text(m["parameters"].get<double>()));
}

std::string claim_rule_text() {
  return "Verdicts on kvq's 95% CI (paired bootstrap of the ppl increase over the same protocol's bf16 run, every eval "
         "domain pooled; Wilson interval for passkey), from the run of the claim's formats whose effective bits are "
         "nearest the claim's at that ctx. A measured number (value ± tol, tol = max(0.5 points, half the number)) "
         "holds when the whole CI lies inside value ± tol and does not hold when the whole CI lies outside it, on "
         "either side. A promise of at most a value (near-lossless or close to BF16 = ppl increase at most 1%; a "
         "retrieval failure = passkey at most 0.1) holds when the CI's upper end is at most value + tol and does not "
         "hold when its lower end is above. A promise of at least a value (retrieval 30/30: passkey at least 1 - 0.1) "
         "holds when the CI's lower end is at least value - tol and does not hold when its upper end is below. "
         "Anything else: cannot tell at this sample size. A run outside the claim's effective-bit band (the only "
         "run of the format at that ctx has other bits, e.g. windows or BF16 layers of its path at a short context) "
         "is shown, marked 'other band', and cannot tell: it is not the claim's setting. A ppl increase resampled "
         "from fewer than " + std::to_string(kClaimMinWindows) + " eval windows is marked with its window count and "
         "cannot tell: a bootstrap over so few windows has almost no distinct resamples. Every verdict names the model "
         "it was reached on. On a model the claim was measured on, it reads holds, does not hold or cannot tell; on "
         "any other model, reproduced, not reproduced or cannot tell on that model: a compressed cache's error "
         "follows the model's key and value outliers (which channels carry them, how large they are, how many heads "
         "share them), and that structure does not carry across model scales and families, so a claim measured on "
         "another model is checked for whether it carries over to this one, not judged.";
}

json referee_claims_json(const json& j) {
  json out = json::array();
  const std::string label = referee_model_label(j);
  const json none = json::object();
  const json& bands = j.contains("bands") ? j["bands"] : none;
  const json& model = j.contains("model") && j["model"].is_object() ? j["model"] : none;
  const std::string model_name = model.value("name", model.value("dir", std::string()));
  for (const CampClaim& c : camp_claims()) {
    const bool same_model = claim_same_model(c, model_name);
    json kvq = json::object();
    for (const std::string& protocol : referee_protocol_order()) {
      if (!bands.contains(protocol)) continue;
      for (const json& x : j["config"]["ctx"]) {
        const std::string cs = std::to_string(x.get<int>());
        const json* best = nullptr;  // into results["bands"], which outlives it
        if (!bands[protocol].contains(cs)) continue;
        for (const json& band : bands[protocol][cs])
          for (const json& r : band["runs"]) {
            bool ours = false;
            for (const json& run : j["runs"])
              if (run["key"] == r["key"])
                ours = std::find(c.methods.begin(), c.methods.end(), run["method"]["label"].get<std::string>()) !=
                       c.methods.end();
            if (!ours) continue;
            // the claim's band first, then the nearest bits
            const auto rank = [&](const json& x) {
              return std::make_pair(bit_band(x["bits"].get<double>()) != bit_band(c.bits),
                                    std::abs(x["bits"].get<double>() - c.bits));
            };
            if (!best || rank(r) < rank(*best)) best = &r;
          }
        json cell = nullptr;
        const bool ppl = c.metric == kPpl;
        if (best && !(ppl && (*best)["increase_pct"].is_null())) {
          const json& r = *best;
          const double v = ppl ? r["increase_pct"].get<double>() : r["passkey"].get<double>();
          const json ci = ppl ? r["increase_pct_ci95"] : r["passkey_ci95"];
          const bool same_band = bit_band(r["bits"].get<double>()) == bit_band(c.bits);
          const int windows = ppl ? r["increase_windows"].get<int>() : kClaimMinWindows;
          const std::string outcome =
              same_band && windows >= kClaimMinWindows
                  ? claim_verdict(c.kind, c.value, c.tolerance, ci[0].get<double>(), ci[1].get<double>())
                  : "cannot tell";
          cell = {{"key", r["key"]}, {"method", r["method"]}, {"bits", r["bits"]}, {"same_band", same_band},
                  {"measured", v}, {"ci95", ci}, {"verdict", claim_verdict_text(outcome, same_model, label)}};
          if (ppl) cell["windows"] = windows;
        }
        kvq[protocol][cs] = cell;
      }
    }
    out.push_back({{"camp", c.camp}, {"claim", c.claim}, {"source", c.source}, {"measured_on", c.measured_on},
                   {"metric", c.metric}, {"kind", claim_kind_name(c.kind)}, {"value", c.value},
                   {"tolerance", c.tolerance}, {"bits", c.bits}, {"methods", c.methods}, {"models", c.models},
                   {"same_model", same_model}, {"kvq", kvq}});
  }
  return out;
}

std::string claim_run_text(const json& cell) {
  std::string out = fmt::format("{} at {:.3f} bits", cell["method"].get<std::string>(), cell["bits"].get<double>());
  if (!cell.value("same_band", true)) out += " (other band)";
  if (const int w = cell.value("windows", kClaimMinWindows); w < kClaimMinWindows)
    out += fmt::format(" ({} window{})", w, w == 1 ? "" : "s");
  return out;
}

std::string referee_claims_markdown(const json& j) {
  if (!j.contains("claims")) return "";
  std::string s = "\n## The camps' claims, checked on " + referee_model_label(j) + "\n\n" + claim_rule_text() + "\n";
  const auto measured = [](const json& claim, const json& cell) -> std::string {
    if (cell.is_null()) return "no run | - | -";
    const bool ppl = claim["metric"] == kPpl;
    const double v = cell["measured"], lo = cell["ci95"][0], hi = cell["ci95"][1];
    const std::string fig = ppl ? fmt::format("{:+.3f}% [{:+.3f}%, {:+.3f}%]", v, lo, hi)
                                : fmt::format("{:.0f}% [{:.0f}%, {:.0f}%]", 100 * v, 100 * lo, 100 * hi);
    return fmt::format("{} | {} | **{}**", claim_run_text(cell), fig, cell["verdict"].get<std::string>());
  };
  for (const json& x : j["config"]["ctx"]) {
    const std::string cs = std::to_string(x.get<int>());
    s += fmt::format("\n### ctx {}\n\n| camp | claim | published in | measured on | claimed | claimed bits | "
                     "kvq common: run | measured [95% CI] | verdict | kvq as shipped: run | measured [95% CI] | "
                     "verdict |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n", cs);
    for (const json& c : j["claims"]) {
      const bool ppl = c["metric"] == kPpl;
      const double v = c["value"];
      const std::string kind = c["kind"];
      const std::string claimed =
          (kind == "at_most" ? "≤ " : kind == "at_least" ? "≥ " : "") +
          (ppl ? fmt::format("{:+.3g}% ppl", v) : fmt::format("passkey {:.0f}%", 100 * v));
      auto cell = [&](const std::string& protocol) {
        return c["kvq"].contains(protocol) && c["kvq"][protocol].contains(cs) ? c["kvq"][protocol][cs] : json();
      };
      s += fmt::format("| {} | {} | {} | {} | {} | {:.3g} | {} | {} |\n", c["camp"].get<std::string>(),
                       c["claim"].get<std::string>(), c["source"].get<std::string>(),
                       c["measured_on"].get<std::string>(), claimed, c["bits"].get<double>(),
                       measured(c, cell("common")), measured(c, cell("as-shipped")));
    }
  }
  return s;
}

}  // namespace kvq
