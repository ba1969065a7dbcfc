// The referee's records: the fields a finished run's OUT/runs/<key>.json adds to `kvq eval --json`, and
// OUT/results.json (inputs, config, every run record, the leakage comparison, counters, notes and the pooled
// unseen-domain figures), which report.md, report.html and the summary table are written from.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "referee/plan.h"
#include "referee/store.h"

namespace kvq {

// Adds to rec (an evaluate_run record) the referee's fields of run r: key, method, windows, leakage, rotation,
// settings, date and threads.
void add_run_fields(nlohmann::json& rec, const RefereeConfig& cfg, const RefereeData& data, const PlannedRun& r,
                    const Rotation& rot, const nlohmann::json& settings, int threads);

// results.json "method" of a run record: label, type, rotation, base, objective.
nlohmann::json method_json(const RefereeMethod& m);

// Everything results.json holds, before the schema check.
struct RefereeOutcome {
  const RefereeResult& res;              // the runs (in plan order) and counters
  int runs_total = 0;                    // the plan's runs
  const nlohmann::json& missing;         // the plan's runs without a record (--report-only)
  int threads = 0;                       // worker threads of the evaluation
  std::chrono::steady_clock::time_point start;  // when the referee started
};
nlohmann::json referee_results_json(const RefereeConfig& cfg, const RefereeData& data, const RefereeOutcome& o);

}  // namespace kvq
