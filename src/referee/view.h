// Small read-only accessors over the referee's run records (results.json "runs"), shared by report.md and the HTML.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvq {

// True for the leakage row (calibrated on an eval file itself).
inline bool run_is_leak(const nlohmann::json& run) { return run.value("leakage", false); }

// The run's protocol: "common" or "as-shipped" (records from before the protocols read "common": that was the only
// one).
inline std::string run_protocol(const nlohmann::json& run) {
  return run.contains("protocol") ? run["protocol"]["name"].get<std::string>() : "common";
}

// The protocols in report order (results.json keys them by name; json objects iterate alphabetically).
inline const std::vector<std::string>& referee_protocol_order() {
  static const std::vector<std::string> kOrder = {"common", "as-shipped"};
  return kOrder;
}

// "optr(oscar)", "optr(oscar) [leak]" for the same-text calibration row, "e8_2, as shipped" for an as-shipped run,
// "turboquant_2bit (kvq ext.)" for a camp's format at a setting it does not ship.
inline std::string run_label(const nlohmann::json& run) {
  std::string s = run["method"]["label"].get<std::string>();
  if (run["method"].value("kvq_extension", false)) s += " (kvq ext.)";
  if (run_protocol(run) == "as-shipped") s += ", as shipped";
  return run_is_leak(run) ? s + " [leak]" : s;
}

// The run's sink/recent window setting: "64/256", "0/0", or "any" for bf16.
inline std::string run_windows(const nlohmann::json& run) { return run["windows"]["label"].get<std::string>(); }

// Effective bits per cached element at context ctx (a decimal string key of cache.footprint).
inline double run_bits(const nlohmann::json& run, const std::string& ctx) {
  return run["cache"]["footprint"][ctx]["kv_bits_effective"].get<double>();
}

// The prompt of the run's windows at context ctx: its targets before it are not scored (0 common, ctx / 2 as shipped,
// the eviction row's own; records without the field: 0).
inline int run_scored_from(const nlohmann::json& run, const std::string& ctx) {
  if (!run.contains("protocol") || !run["protocol"].contains("prompt_tokens")) return 0;
  return run["protocol"]["prompt_tokens"].value(ctx, 0);
}

// The pooled "all" domain when several domains were evaluated, else the only one.
inline std::string pooled_domain(const nlohmann::json& run, const std::string& ctx) {
  const nlohmann::json& p = run["results"]["ppl"][ctx];
  if (p.contains("all")) return "all";
  return p.begin().key();
}

}  // namespace kvq
