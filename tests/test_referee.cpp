// kvq referee end to end on models/ref, tiny (bf16, int2, int2+quarot, e8_2, evict(int2) at windows 0/0, and bf16,
// e8_2 and evict(int2) as shipped; ctx 256, one window of one small domain, one passkey trial at two depths):
// results.json passes the schema check and holds the expected numbers (protocol per run, bands, Pareto series, claims,
// the eviction row at int2's bytes), report.html draws one point
// per common run in each scatter chart, the Pareto charts per protocol, the heat-map cells and the layer curves, a
// second invocation resumes every run without touching its json, and non-disjoint calibration data is refused.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>

#include "codecs/pnmix/pnmix_file.h"
#include "attention/attention_bench.h"
#include "common/error.h"
#include "referee/referee.h"
#include "test_helpers.h"
#include "referee/view.h"

using namespace kvq;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kSource = KVQ_SOURCE_DIR;

using test::head_of;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = hay.find(needle); pos != std::string::npos; pos = hay.find(needle, pos + 1)) ++n;
  return n;
}

struct Dirs {
  fs::path root = fs::temp_directory_path() / ("kvq_test_referee_" + std::to_string(getpid()));
  fs::path eval = root / "eval", out = root / "out", calib = root / "calib.txt";
  Dirs() {
    fs::remove_all(root);
    fs::create_directories(eval);
    std::ofstream(eval / "python.txt", std::ios::binary) << head_of(kSource + "/data/eval/python.txt", 6000);
    std::ofstream(calib, std::ios::binary) << head_of(kSource + "/data/calib/python.txt", 3000);
  }
  ~Dirs() { fs::remove_all(root); }
};

RefereeConfig tiny(const Dirs& d) {
  RefereeConfig c;
  c.model_dir = kSource + "/models/ref";
  c.calib_data = d.calib.string();
  c.eval_dir = d.eval.string();
  c.out_dir = d.out.string();
  c.ctx = {256};
  c.methods = parse_referee_methods("bf16,int2,int2+quarot,e8_2,evict(int2)");
  c.windows = parse_referee_windows("0/0");
  c.eval_windows = 1;
  c.passkey_trials = 1;
  c.depths = {0.0, 1.0};
  c.bootstrap = 50;
  c.seed = 5;
  c.threads = 2;
  c.leakage = false;
  return c;
}

const RefereeLog quiet = [](const std::string&, bool) {};

}  // namespace

TEST(Referee, TinyRunWritesValidResultsHtmlAndResumesWithoutWork) {
  Dirs d;
  const RefereeConfig cfg = tiny(d);
  const RefereeResult first = run_referee(cfg, quiet);
  EXPECT_EQ(first.runs_executed, 8);
  EXPECT_EQ(first.runs_resumed, 0);

  // results.json on disk passes the schema and carries the provenance fields
  const json j = json::parse(slurp(d.out / "results.json"));
  const std::vector<std::string> problems = referee_schema_errors(j);
  EXPECT_TRUE(problems.empty()) << (problems.empty() ? "" : problems.front());
  EXPECT_EQ(j["counters"]["runs_executed"], 8);
  EXPECT_EQ(j["model"]["fingerprint"].get<std::string>().size(), 64u);
  EXPECT_EQ(j["calibration_data"]["sha256"].get<std::string>().size(), 64u);
  EXPECT_FALSE(j["machine"]["cpu_model"].get<std::string>().empty());
  ASSERT_EQ(j["runs"].size(), 8u);
  EXPECT_EQ(j["runs"][0]["key"], "bf16");
  EXPECT_EQ(j["runs"][0]["windows"]["label"], "any");
  EXPECT_EQ(j["runs"][1]["key"], "int2__0-0");
  EXPECT_EQ(j["runs"][2]["key"], "int2_quarot__0-0");
  EXPECT_EQ(j["runs"][3]["key"], "e8_2__0-0");
  EXPECT_EQ(j["runs"][4]["key"], "evict_int2__0-0");
  EXPECT_EQ(j["runs"][5]["key"], "bf16__shipped");
  EXPECT_EQ(j["runs"][6]["key"], "e8_2__shipped");
  EXPECT_EQ(j["runs"][7]["key"], "evict_int2__shipped");
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(j["runs"][i]["protocol"]["name"], i < 5 ? "common" : "as-shipped") << i;
  EXPECT_EQ(j["runs"][6]["protocol"]["prompt_policy"], "decode-faithful");  // e8_2: llama.cpp's path
  EXPECT_EQ(j["runs"][6]["protocol"]["prompt_tokens"]["256"], 128);
  EXPECT_EQ(j["runs"][3]["protocol"]["prompt_tokens"]["256"], 0);
  EXPECT_EQ(j["runs"][2]["rotation"]["name"], "quarot");
  EXPECT_TRUE(j["runs"][2]["rotation"]["file"].is_null());  // data-free: nothing calibrated

  // the numbers: BF16 KL is exactly 0 with top-1 1; int2 without windows degrades sharply (METHODS §2 sanity);
  // effective bits: 16 for BF16, 2.25 for INT2 g128 with fp16 scale/zero and no windows (METHODS §6)
  const json& bf16 = j["runs"][0]["results"];
  const json& int2 = j["runs"][1]["results"];
  EXPECT_EQ(bf16["kl"]["256"]["python"]["kl_mean"].get<double>(), 0.0);
  EXPECT_EQ(bf16["kl"]["256"]["python"]["top1"].get<double>(), 1.0);
  EXPECT_GT(int2["ppl"]["256"]["python"]["ppl"].get<double>(), 1.2 * bf16["ppl"]["256"]["python"]["ppl"].get<double>());
  EXPECT_GT(int2["kl"]["256"]["python"]["kl_mean"].get<double>(), 0.05);
  EXPECT_NEAR(j["runs"][0]["cache"]["footprint"]["256"]["kv_bits_effective"].get<double>(), 16.0, 1e-9);
  EXPECT_NEAR(j["runs"][1]["cache"]["footprint"]["256"]["kv_bits_effective"].get<double>(), 2.25, 1e-9);
  EXPECT_EQ(int2["passkey"]["256"]["trials"], 2);
  EXPECT_EQ(int2["passkey"]["256"]["by_depth"].size(), 2u);

  // as shipped: every row scores the window's second half only (256 - 128 targets), its bf16 reference included, and
  // the bf16 reference of that protocol has KL 0; e8_2 stores 34 B per 128 values at both protocols (2.125 bits)
  const json& bf16_shipped = j["runs"][5]["results"];
  EXPECT_EQ(bf16_shipped["ppl"]["256"]["python"]["tokens"], 128);
  EXPECT_EQ(bf16["ppl"]["256"]["python"]["tokens"], 255);
  EXPECT_EQ(bf16_shipped["kl"]["256"]["python"]["kl_mean"].get<double>(), 0.0);
  EXPECT_NEAR(j["runs"][3]["cache"]["footprint"]["256"]["kv_bits_effective"].get<double>(), 2.125, 1e-9);
  EXPECT_NEAR(j["runs"][6]["cache"]["footprint"]["256"]["kv_bits_effective"].get<double>(), 2.125, 1e-9);
  // every run records its NLL over the last 1/16 of each window (the eviction row's targets), from the same pass
  EXPECT_EQ(int2["ppl"]["256"]["python"]["tail"]["prompt_tokens"], 240);
  EXPECT_EQ(int2["ppl"]["256"]["python"]["tail"]["tokens"], 16);
  EXPECT_EQ(bf16_shipped["ppl"]["256"]["python"]["tail"]["prompt_tokens"], 240);

  // eviction at equal bytes: under both protocols the prompt is the first 15/16 (240) and only the last 16 targets
  // are scored; the budget is int2's bytes at the same windows: at 0/0 2.25 bits = 36 BF16 tokens' rows at 256, the 16
  // after the prompt and 20 of its 240; as shipped (kvq's 64/256, int2 stores all 256 tokens in its windows at this
  // ctx) it keeps everything, so it scores as bf16 on the same targets
  const json& ev = j["runs"][4];
  const json& ev_shipped = j["runs"][7];
  EXPECT_EQ(ev["protocol"]["prompt_policy"], "evict");
  EXPECT_EQ(ev_shipped["protocol"]["prompt_policy"], "evict");
  EXPECT_EQ(ev["protocol"]["prompt_tokens"]["256"], 240);
  EXPECT_EQ(ev_shipped["windows"]["label"], "64/256");
  EXPECT_EQ(ev["results"]["ppl"]["256"]["python"]["tokens"], 16);
  EXPECT_FALSE(ev["results"]["ppl"]["256"]["python"].contains("tail"));  // its own windows are those targets
  EXPECT_NEAR(ev["cache"]["footprint"]["256"]["kv_bits_effective"].get<double>(), 2.25, 1e-12);
  const json& budget = ev["equal_bytes"]["by_ctx"]["256"];
  EXPECT_EQ(ev["equal_bytes"]["paired"], "int2");
  EXPECT_DOUBLE_EQ(budget["target_bits"].get<double>(), 2.25);
  EXPECT_EQ(budget["prompt_tokens"], 240);
  EXPECT_EQ(budget["kept_prompt_tokens"], 20);
  EXPECT_EQ(budget["stored_tokens"], 36);
  EXPECT_DOUBLE_EQ(budget["stored_bits"].get<double>(), 2.25);
  EXPECT_EQ(ev_shipped["equal_bytes"]["by_ctx"]["256"]["kept_prompt_tokens"], 240);
  EXPECT_NEAR(ev_shipped["cache"]["footprint"]["256"]["kv_bits_effective"].get<double>(), 16.0, 1e-12);
  EXPECT_EQ(ev["settings"]["equal_bytes"], "int2");
  EXPECT_FALSE(j["runs"][1]["settings"].contains("equal_bytes"));  // the other rows' settings (and resume) unchanged
  EXPECT_EQ(ev["results"]["passkey"]["256"]["trials"], 2);
  const json& evc = j["eviction"]["common"]["256"];
  ASSERT_EQ(evc.size(), 1u);
  EXPECT_EQ(evc[0]["paired_key"], "int2__0-0");
  EXPECT_DOUBLE_EQ(evc[0]["paired_bits"].get<double>(), evc[0]["bits"].get<double>());
  EXPECT_FALSE(evc[0]["vs_paired"].is_null());
  EXPECT_FALSE(evc[0]["paired_vs_bf16"].is_null());
  EXPECT_GT(evc[0]["vs_bf16"]["ratio"].get<double>(), 1.0);  // 220 of the 240 prompt tokens gone
  // KL and top-1 against bf16 on the same 17 rows (those predicting targets >= 240): the eviction run's own record,
  // int2's KL tail from 240, and their paired difference
  const json& int2_tail = int2["kl"]["256"]["python"]["tail"];
  const json& ev_kl = ev["results"]["kl"]["256"]["python"];
  EXPECT_EQ(int2_tail["prompt_tokens"], 240);
  EXPECT_EQ(int2_tail["tokens"], 17);
  EXPECT_EQ(ev_kl["tokens"], 17);
  EXPECT_EQ(bf16["kl"]["256"]["python"]["tail"]["kl_mean"].get<double>(), 0.0);
  EXPECT_NE(int2_tail["kl_mean"].get<double>(), int2["kl"]["256"]["python"]["kl_mean"].get<double>());  // a sub-span
  EXPECT_DOUBLE_EQ(evc[0]["kl"].get<double>(), ev_kl["window_kl_sum"][0].get<double>() / 17);
  EXPECT_DOUBLE_EQ(evc[0]["top1"].get<double>(), ev_kl["window_top1_agree"][0].get<double>() / 17);
  EXPECT_DOUBLE_EQ(evc[0]["paired_kl"].get<double>(), int2_tail["window_kl_sum"][0].get<double>() / 17);
  EXPECT_DOUBLE_EQ(evc[0]["paired_top1"].get<double>(), int2_tail["window_top1_agree"][0].get<double>() / 17);
  EXPECT_GT(evc[0]["paired_kl"].get<double>(), 0.0);
  EXPECT_NEAR(evc[0]["fidelity_vs_paired"]["kl"]["estimate"].get<double>(),
              evc[0]["kl"].get<double>() - evc[0]["paired_kl"].get<double>(), 1e-12);
  EXPECT_EQ(evc[0]["kl_ci95"].size(), 2u);
  const json& evs = j["eviction"]["as-shipped"]["256"];
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_TRUE(evs[0]["paired_kl"].is_null());  // no paired run: no KL to pair
  EXPECT_FALSE(evs[0]["kl"].is_null());
  EXPECT_EQ(evs[0]["paired_key"], nullptr);  // no int2 run at 64/256 in this plan
  EXPECT_NEAR(evs[0]["vs_bf16"]["change_pct"].get<double>(), 0.0, 0.05);

  // equal bits: int2, int2+quarot and e8_2 share the 2.0-2.4 band of the common protocol, bf16 is above 4.5; the
  // Pareto series hold every run of each protocol; the NexusQuant claims read e8_2's runs of both protocols
  const json& common_bands = j["bands"]["common"]["256"];
  ASSERT_EQ(common_bands.size(), 2u);
  EXPECT_EQ(common_bands[0]["band"], "2.0-2.4");
  ASSERT_EQ(common_bands[0]["runs"].size(), 4u);  // the eviction row lands in int2's band, paired on its targets
  EXPECT_EQ(common_bands[1]["band"], "above 4.5");
  bool evict_in_band = false;
  for (const json& r : common_bands[0]["runs"])
    if (r["key"] == "evict_int2__0-0") {
      evict_in_band = true;
      EXPECT_EQ(r["scored_from"], 240);
      EXPECT_FALSE(r["increase_pct"].is_null());
      EXPECT_FALSE(r["vs_best"].is_null());
      EXPECT_EQ(r["vs_best"]["scored_from"], 240);
      EXPECT_NE(common_bands[0]["best_key"], "evict_int2__0-0");  // the best scores every target
    }
  EXPECT_TRUE(evict_in_band);
  EXPECT_EQ(j["pareto"]["common"]["256"].size(), 5u);
  EXPECT_EQ(j["pareto"]["as-shipped"]["256"].size(), 3u);
  bool nq_checked = false;
  for (const json& c : j["claims"])
    if (c["claim"].get<std::string>().find("NIAH 30/30") != std::string::npos) {
      EXPECT_EQ(c["kvq"]["common"]["256"]["key"], "e8_2__0-0");
      EXPECT_EQ(c["kvq"]["as-shipped"]["256"]["key"], "e8_2__shipped");
      nq_checked = true;
    } else if (c["camp"] == "TurboQuant (vLLM)") {
      EXPECT_TRUE(c["kvq"]["common"]["256"].is_null());  // no TurboQuant row in this run
    }
  EXPECT_TRUE(nq_checked);

  // the unseen-domain pool: calibrated on calib.txt, so the one eval domain (python) is unseen and the pool is its
  // own column; the paired table still holds int2+quarot against int2 and each INT2 run against bf16
  const json& u = j["unseen"];
  EXPECT_EQ(u["domains"], json({"python"}));
  EXPECT_EQ(u["redundant_with"], "python");
  EXPECT_NEAR(u["ppl"]["256"][1]["ppl"].get<double>(), int2["ppl"]["256"]["python"]["ppl"].get<double>(), 1e-9);
  ASSERT_EQ(u["paired"]["256"].size(), 6u);  // the common protocol's: int2, int2+quarot (x2), e8_2, evict(int2) (x2)
  EXPECT_EQ(u["paired"]["256"][1]["method"], "int2+quarot");
  EXPECT_EQ(u["paired"]["256"][1]["base"], "int2");
  EXPECT_NE(slurp(d.out / "report.md").find("| int2+quarot | int2 | 0/0 |"), std::string::npos);
  EXPECT_NE(slurp(d.out / "report.html").find("<table id=\"unseen-paired-256\">"), std::string::npos);

  // report.html: self-contained, one labelled point per run in each of the two scatter charts, 3 runs × 1 ctx ×
  // 2 depths heat-map cells, one curve per quantized run and layer metric (BF16 has zero error: not drawn)
  const std::string html = slurp(d.out / "report.html");
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(count(html, "src=\""), 0u);
  EXPECT_EQ(count(html, "href=\""), 0u);
  EXPECT_EQ(count(html, "<svg id=\"ppl-vs-bits\""), 1u);
  EXPECT_EQ(count(html, "<svg id=\"kl-vs-bits\""), 1u);
  EXPECT_EQ(count(html, "<circle class=\"point\""), 8u);  // the common protocol's 4 runs of every target, 2 charts
  for (const char* m : {"bf16", "int2", "int2+quarot"})
    EXPECT_EQ(count(html, std::string("<circle class=\"point\" data-key=\"") + (std::string(m) == "bf16" ? "bf16" :
                                      std::string(m) == "int2" ? "int2__0-0" : "int2_quarot__0-0") +
                              "\" data-method=\"" + m + "\""), 2u) << m;
  const size_t ppl_chart = html.find("<svg id=\"ppl-vs-bits\"");
  const std::string ppl_svg = html.substr(ppl_chart, html.find("</svg>", ppl_chart) - ppl_chart);
  EXPECT_NE(ppl_svg.find(">int2 0/0</text>"), std::string::npos);
  EXPECT_NE(ppl_svg.find(">bf16 any</text>"), std::string::npos);
  EXPECT_EQ(count(html, "<svg class=\"heatmap\""), 8u);
  EXPECT_EQ(count(html, "<rect class=\"cell\""), 16u);
  EXPECT_EQ(count(html, "data-ctx=\"256\" data-depth=\"0.0\""), 8u);
  EXPECT_EQ(count(html, "data-ctx=\"256\" data-depth=\"1.0\""), 8u);
  // 4 common + 2 as-shipped runs with a layer error (the as-shipped eviction run keeps every token at this ctx, but
  // reads them as one exact run, not the reference's windows: rounding), 2 metrics
  EXPECT_EQ(count(html, "<polyline class=\"curve\""), 12u);
  // the Pareto charts: ppl increase and KL per protocol, one point and one error bar per run
  for (const char* id : {"pareto-ppl-common-256", "pareto-kl-common-256", "pareto-ppl-as-shipped-256",
                         "pareto-kl-as-shipped-256"})
    EXPECT_EQ(count(html, std::string("<svg id=\"") + id + "\""), 1u) << id;
  EXPECT_EQ(count(html, "<circle class=\"pareto-point\""), 16u);
  EXPECT_EQ(count(html, "<line class=\"errbar\""), 16u);
  EXPECT_EQ(count(html, "<table id=\"eviction-common-256\">"), 1u);
  EXPECT_EQ(count(html, "<table id=\"eviction-as-shipped-256\">"), 1u);
  EXPECT_EQ(count(html, "<table id=\"eviction-kl-common-256\">"), 1u);
  EXPECT_NE(slurp(d.out / "report.md").find("| windows | KL | paired row's KL there | KL − paired row's |"), std::string::npos);
  EXPECT_NE(html.find("evict(int2) (targets &ge; 240)"), std::string::npos);
  EXPECT_EQ(count(html, "<table id=\"claims-256\">"), 1u);
  EXPECT_NE(html.find("e8_2, as shipped"), std::string::npos);
  EXPECT_EQ(count(html, "<polyline class=\"curve\" data-key=\"bf16\""), 0u);
  // the scatter's y of the int2 point is its ppl from results.json
  std::smatch m;
  const std::regex int2_point("data-key=\"int2__0-0\" data-method=\"int2\" data-windows=\"0/0\" data-x=\"([0-9.e+-]+)\" "
                              "data-y=\"([0-9.e+-]+)\"");
  ASSERT_TRUE(std::regex_search(ppl_svg, m, int2_point));
  EXPECT_NEAR(std::stod(m[1]), 2.25, 1e-4);
  EXPECT_NEAR(std::stod(m[2]) / int2["ppl"]["256"]["python"]["ppl"].get<double>(), 1.0, 1e-5);

  const std::string md = slurp(d.out / "report.md");
  EXPECT_NE(md.find("## Effective bits"), std::string::npos);
  EXPECT_NE(md.find("| int2+quarot | 0/0 |"), std::string::npos);
  EXPECT_NE(md.find("| e8_2, as shipped | 0/0 |"), std::string::npos);
  EXPECT_NE(md.find("## Equal bits"), std::string::npos);
  EXPECT_NE(md.find("### Protocol as-shipped, ctx 256"), std::string::npos);
  EXPECT_NE(md.find("## The camps' claims"), std::string::npos);
  EXPECT_NE(md.find("## Eviction at equal bytes"), std::string::npos);
  EXPECT_NE(md.find("| 2.0-2.4 | evict(int2) (targets ≥ 240) | 0/0 | 2.250 |"), std::string::npos);
  EXPECT_NE(md.find("cannot tell at this sample size"), std::string::npos);

  // resume: the same settings again do no work and leave every run json untouched
  std::map<std::string, std::pair<std::string, fs::file_time_type>> before;
  for (const auto& e : fs::directory_iterator(d.out / "runs"))
    before[e.path().filename().string()] = {slurp(e.path()), fs::last_write_time(e.path())};
  ASSERT_EQ(before.size(), 8u);
  const RefereeResult second = run_referee(cfg, quiet);
  EXPECT_EQ(second.runs_executed, 0);
  EXPECT_EQ(second.runs_resumed, 8);
  EXPECT_EQ(second.calibrations_run, 0);
  for (const auto& [name, old] : before) {
    EXPECT_EQ(slurp(d.out / "runs" / name), old.first) << name;
    EXPECT_EQ(fs::last_write_time(d.out / "runs" / name), old.second) << name;
  }
  const json j2 = json::parse(slurp(d.out / "results.json"));
  EXPECT_EQ(j2["counters"]["runs_resumed"], 8);
  EXPECT_EQ(j2["runs"][1]["results"], j["runs"][1]["results"]);

  // --report-only: a run without a record is listed as missing, nothing is executed or written to runs/
  fs::remove(d.out / "runs" / "int2__0-0.json");
  RefereeConfig report = cfg;
  report.report_only = true;
  const RefereeResult partial = run_referee(report, quiet);
  EXPECT_EQ(partial.runs_executed, 0);
  EXPECT_EQ(partial.runs_resumed, 7);
  EXPECT_FALSE(fs::exists(d.out / "runs" / "int2__0-0.json"));
  const json j3 = json::parse(slurp(d.out / "results.json"));
  EXPECT_TRUE(referee_schema_errors(j3).empty());
  ASSERT_EQ(j3["missing_runs"].size(), 1u);
  EXPECT_EQ(j3["missing_runs"][0]["key"], "int2__0-0");
  EXPECT_EQ(j3["counters"]["runs_missing"], 1);
  ASSERT_EQ(j3["runs"].size(), 7u);
  EXPECT_EQ(j3["runners"].size(), 1u);
  EXPECT_NE(slurp(d.out / "report.md").find("**not run**"), std::string::npos);

  // a record made on another device (a second process on the GPU): not resumed by this device's report, pooled by
  // a report of every device, which names that runner with its run
  std::vector<fs::path> records;
  for (const auto& e : fs::directory_iterator(d.out / "runs")) records.push_back(e.path());
  std::sort(records.begin(), records.end());
  json moved = json::parse(slurp(records.front()));
  moved["settings"]["device"] = "cuda/fp32";
  moved["runner"] = "cuda, test device";
  std::ofstream(records.front(), std::ios::binary) << moved.dump();
  const RefereeResult same_device = run_referee(report, quiet);
  EXPECT_EQ(same_device.runs_resumed, 6);
  RefereeConfig pooled = report;
  pooled.any_device = true;
  pooled.device = "any";
  const RefereeResult every_device = run_referee(pooled, quiet);
  EXPECT_EQ(every_device.runs_executed, 0);
  EXPECT_EQ(every_device.runs_resumed, 7);
  const json j4 = json::parse(slurp(d.out / "results.json"));
  EXPECT_TRUE(referee_schema_errors(j4).empty());
  ASSERT_EQ(j4["runners"].size(), 2u);
  const std::string md4 = slurp(d.out / "report.md");
  EXPECT_NE(md4.find("- evaluation passes ran on: cuda, test device: 1 run, " + run_label(moved) + "\n"),
            std::string::npos)
      << md4.substr(0, 2000);
  EXPECT_NE(md4.find(": 6 runs, "), std::string::npos);

  // a changed setting (another seed) reruns instead of reusing stale numbers
  RefereeConfig other = cfg;
  other.methods = parse_referee_methods("int2");
  other.seed = 6;
  const RefereeResult third = run_referee(other, quiet);
  EXPECT_EQ(third.runs_executed, 1);
  EXPECT_EQ(third.runs_resumed, 0);
}

TEST(Referee, SchemaCheckNamesMissingAndMistypedFields) {
  json j = {{"kvq", {{"version", "0"}, {"git", "x"}}}, {"runs", json::array({json::object()})}};
  std::vector<std::string> e = referee_schema_errors(j);
  auto mentions = [&](const std::string& what) {
    return std::any_of(e.begin(), e.end(), [&](const std::string& s) { return s.find(what) != std::string::npos; });
  };
  EXPECT_TRUE(mentions("results.date: missing"));
  EXPECT_TRUE(mentions("results.runs[0].key: missing"));
  EXPECT_TRUE(mentions("results.runs[0].results: missing"));
  j["date"] = 5;
  e = referee_schema_errors(j);
  EXPECT_TRUE(mentions("results.date: expected string, got number"));
  EXPECT_FALSE(referee_schema_errors(json::array()).empty());
}

TEST(Referee, RefusesCalibrationDataInsideOrIdenticalToEvalData) {
  Dirs d;
  // inside the eval directory (any name)
  const fs::path inside = d.eval / "sub" / "calib.txt";
  fs::create_directories(inside.parent_path());
  std::ofstream(inside) << "unrelated text";
  EXPECT_THROW(check_calibration_disjoint(inside.string(), d.eval.string()), Error);
  try {
    check_calibration_disjoint(inside.string(), d.eval.string());
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("inside the eval data directory"), std::string::npos) << e.message();
  }
  // a byte-identical copy elsewhere
  const fs::path copy = d.root / "copy.txt";
  fs::copy_file(d.eval / "python.txt", copy);
  try {
    check_calibration_disjoint(copy.string(), d.eval.string());
    ADD_FAILURE() << "identical calibration data accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("identical"), std::string::npos) << e.message();
  }
  // the referee refuses before any work: nothing written
  RefereeConfig c = tiny(d);
  c.calib_data = copy.string();
  EXPECT_THROW(run_referee(c, quiet), Error);
  EXPECT_FALSE(fs::exists(d.out));
  // disjoint data (another part of the same domain) is accepted
  EXPECT_NO_THROW(check_calibration_disjoint(d.calib.string(), d.eval.string()));
}

TEST(Referee, ParsesMethodAndWindowListsAndRejectsBadOnes) {
  const auto ms = parse_referee_methods("int2+oscar,optr-joint(oscar)");
  ASSERT_EQ(ms.size(), 2u);
  EXPECT_EQ(ms[0].rotation, "oscar");
  EXPECT_EQ(ms[1].objective, "joint");
  EXPECT_TRUE(ms[1].needs_calibration());
  EXPECT_EQ(referee_methods().size(), 37u);  // 13 of kvq, KIVI, KV4-RL and the rotations; 3 of PN-Mix; 20 of the camps
                                             // (vLLM's FP8 four); 1 eviction row
  EXPECT_THROW(parse_referee_methods("int3"), Error);
  EXPECT_THROW(parse_referee_methods("int2,int2"), Error);
  EXPECT_THROW(parse_referee_methods(""), Error);
  const auto ws = parse_referee_windows("64/256,0/0");
  ASSERT_EQ(ws.size(), 2u);
  EXPECT_EQ(ws[0].sink, 64);
  EXPECT_EQ(ws[0].recent, 256);
  EXPECT_EQ(ws[1].label(), "0/0");
  EXPECT_THROW(parse_referee_windows("64"), Error);
  EXPECT_THROW(parse_referee_windows("64/-1"), Error);
  EXPECT_THROW(parse_referee_windows("0/0,0/0"), Error);
}

TEST(Referee, CachesCalibratedRotationFilesAndReusesThemOnARerun) {
  Dirs d;
  RefereeConfig c = tiny(d);
  c.methods = parse_referee_methods("int2+oscar");
  c.calib_tokens = 512;
  c.calib_chunk = 256;
  // --calibrate-only fills rotations/ and stops: no run, no results
  RefereeConfig only = c;
  only.calibrate_only = true;
  const RefereeResult calibrated = run_referee(only, quiet);
  EXPECT_EQ(calibrated.calibrations_run, 1);
  EXPECT_EQ(calibrated.runs_executed, 0);
  EXPECT_FALSE(fs::exists(d.out / "results.json"));
  EXPECT_TRUE(fs::is_empty(d.out / "runs"));
  EXPECT_EQ(std::distance(fs::directory_iterator(d.out / "rotations"), fs::directory_iterator{}), 1);
  const RefereeResult first = run_referee(c, quiet);
  EXPECT_EQ(first.calibrations_run, 0);  // the file --calibrate-only wrote
  EXPECT_EQ(first.calibrations_reused, 1);
  const json& rot = first.results["runs"][0]["rotation"];
  ASSERT_TRUE(rot["file"].is_string());
  EXPECT_TRUE(fs::exists(rot["file"].get<std::string>()));
  EXPECT_EQ(fs::path(rot["file"].get<std::string>()).parent_path(), d.out / "rotations");
  EXPECT_EQ(rot["calib_sha256"], first.results["calibration_data"]["sha256"]);
  EXPECT_TRUE(rot["reused"].get<bool>());
  // another seed reruns the evaluation but not the calibration (same model, data and calibration settings)
  c.seed = 9;
  const RefereeResult second = run_referee(c, quiet);
  EXPECT_EQ(second.runs_executed, 1);
  EXPECT_EQ(second.calibrations_run, 0);
  EXPECT_EQ(second.calibrations_reused, 1);
  EXPECT_TRUE(second.results["runs"][0]["rotation"]["reused"].get<bool>());
  EXPECT_EQ(second.results["runs"][0]["rotation"]["file"], rot["file"]);
  // another calibration budget is another file name
  c.calib_tokens = 768;
  const RefereeResult third = run_referee(c, quiet);
  EXPECT_EQ(third.calibrations_run, 1);
  EXPECT_NE(third.results["runs"][0]["rotation"]["file"], rot["file"]);
}

// PN-Mix (METHODS §5.7): the referee calibrates the key widths on --calib-data into OUT/rotations/ (a PN-Mix file,
// checked against the model and the data when reused), the run's keys take them, and its bits are the stored ones:
// 48-byte key rows (four width slots at the 2-bit budget, as models/ref's widths span 1..4 bits) and int2 values
// (36 bytes) per 128 values, with no windows, plus the stored map of 64 pair widths per (layer, kv head) spread over
// the 256 tokens: (48 + 36) · 8 / 256 + 64 · 8 / (256 · 256) = 2.6328125.
TEST(Referee, PnmixRowsCalibrateTheirKeyWidthsAndCountTheBitsStored) {
  Dirs d;
  RefereeConfig c = tiny(d);
  c.methods = parse_referee_methods("pnmix");
  c.protocols = {RefereeProtocol::Common};
  c.calib_tokens = 512;
  c.calib_chunk = 256;
  const RefereeResult first = run_referee(c, quiet);
  EXPECT_EQ(first.calibrations_run, 1);
  const json& run = first.results["runs"][0];
  const json& rot = run["rotation"];
  ASSERT_TRUE(rot["file"].is_string());
  EXPECT_EQ(rot["name"], "pnmix(product)");
  const PnmixFile f = load_pnmix_file(rot["file"].get<std::string>());
  EXPECT_EQ(f.meta["calib_sha256"], first.results["calibration_data"]["sha256"]);
  EXPECT_EQ(f.table.slots(), 4);
  EXPECT_NEAR(run["cache"]["footprint"]["256"]["kv_bits_effective"].get<double>(),
              (48 + 36) * 8 / 256.0 + 64 * 8 / (256.0 * 256.0), 1e-9);
  const double ppl = run["results"]["ppl"]["256"]["python"]["ppl"].get<double>();
  EXPECT_TRUE(std::isfinite(ppl) && ppl > 1.0) << ppl;
  // a rerun with another seed reuses the widths file
  c.seed = 9;
  const RefereeResult second = run_referee(c, quiet);
  EXPECT_EQ(second.calibrations_run, 0);
  EXPECT_EQ(second.calibrations_reused, 1);
  EXPECT_EQ(second.results["runs"][0]["rotation"]["file"], rot["file"]);
}

// --clip-grid: each INT2 method's (key, value) clips are the grid pair with the lowest held-out ppl (the end of the
// calibration file); OptR takes its base rotation's pair and is calibrated for it; the choice is cached in OUT/clips.
TEST(Referee, TunesClipsOnHeldOutTextAndOptrInheritsItsBasePair) {
  Dirs d;
  std::ofstream(d.calib, std::ios::binary) << head_of(kSource + "/data/calib/python.txt", 12000);
  RefereeConfig c = tiny(d);
  c.calib_tokens = 1024;
  c.calib_chunk = 256;
  c.calib_steps = 2;
  c.methods = parse_referee_methods("int4");  // a method without clip tuning, run before the grid is given
  ASSERT_EQ(run_referee(c, quiet).runs_executed, 1);
  c.methods = parse_referee_methods("int4,int2,int2+quarot,optr(quarot),int2+oscar");
  c.clip_grid = {0.9f, 1.0f};
  const RefereeResult r = run_referee(c, quiet);
  ASSERT_EQ(r.runs_executed, 4);
  EXPECT_EQ(r.runs_resumed, 1);  // the grid cannot change an int4 run: it resumes
  std::map<std::string, json> by_label;
  for (const json& run : r.results["runs"]) by_label[run["method"]["label"]] = run;
  for (const char* label : {"int2", "int2+quarot", "int2+oscar"}) {
    const json& run = by_label.at(label);
    const json& clips = run["clips"];
    EXPECT_EQ(clips["tuned_on"], label);
    ASSERT_EQ(clips["grid"].size(), 4u);
    double best = 1e300;
    float bk = 0, bv = 0;
    for (const json& g : clips["grid"])
      if (g[2].get<double>() < best) best = g[2], bk = g[0], bv = g[1];
    EXPECT_EQ(clips["k"].get<float>(), bk) << label;
    EXPECT_EQ(clips["v"].get<float>(), bv) << label;
    EXPECT_EQ(run["cache"]["k"]["clip"].get<float>(), bk) << label;  // the evaluated cache uses the choice
    EXPECT_EQ(run["cache"]["v"]["clip"].get<float>(), bv) << label;
    EXPECT_TRUE(run["settings"].contains("clip_tuning"));
  }
  EXPECT_FALSE(by_label.at("int4")["settings"].contains("clip_tuning"));
  const json& optr = by_label.at("optr(quarot)");
  EXPECT_EQ(optr["clips"]["tuned_on"], "int2+quarot");
  EXPECT_EQ(optr["clips"]["k"], by_label.at("int2+quarot")["clips"]["k"]);
  EXPECT_EQ(optr["clips"]["v"], by_label.at("int2+quarot")["clips"]["v"]);
  EXPECT_EQ(optr["cache"]["k"]["clip"], optr["clips"]["k"]);
  EXPECT_EQ(std::distance(fs::directory_iterator(d.out / "clips"), fs::directory_iterator{}), 3);
  EXPECT_NE(slurp(d.out / "report.md").find("## Clips tuned on held-out text"), std::string::npos);

  // a rerun resumes every run and reads the cached choices
  const RefereeResult again = run_referee(c, quiet);
  EXPECT_EQ(again.runs_executed, 0);
  EXPECT_EQ(again.runs_resumed, 5);
  // a calibration file too short for the held-out windows past the budget is refused before any run
  c.calib_tokens = 1 << 20;
  c.methods = parse_referee_methods("int2");
  EXPECT_THROW(run_referee(c, quiet), Error);
}

TEST(Referee, RefusesATooSmallCalibrationBudgetBeforeAnyRun) {
  Dirs d;
  RefereeConfig c = tiny(d);
  c.methods = parse_referee_methods("int2,optr(oscar)");
  c.calib_tokens = 4096;
  c.calib_chunk = 1024;  // optr needs 4 chunks of 1024 tokens; the calibration file has far fewer
  try {
    run_referee(c, quiet);
    ADD_FAILURE() << "too little calibration data accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("calibration tokens"), std::string::npos) << e.message();
  }
  EXPECT_TRUE(fs::is_empty(d.out / "runs"));  // not even the int2 run was started
}

// The cost column: the probe (here kvq bench attention's CPU measurement at a small shape) runs once per distinct
// cache (bf16 and its as-shipped row share one, as fp8's common 0/0 and as-shipped rows do), every run records it,
// the bytes a step reads are the rows' stored bytes (512 tokens x 2 kv heads: bf16 2 x 256 B, int2 2 x 36 B, fp8 2 x
// 128 B a row), an eviction row has none, a probe's kvq::Error is the row's "unsupported" cost (this probe refuses
// kv4rl's int8 windows), and report.md carries the table.
TEST(Referee, CostColumnTimesEachRowsCacheOnceAndReportsIt) {
  Dirs d;
  RefereeConfig cfg = tiny(d);
  cfg.methods = parse_referee_methods("bf16,int2,fp8,kv4rl,evict(int2)");
  ThreadPool pool(1);
  std::vector<uint8_t> evict;
  std::map<std::string, int> calls;
  cfg.cost_probe = [&](const CacheConfig& row) {
    ++calls[row.describe()];
    KVQ_CHECK(row.window == "bf16", "window type '{}': not on this probe", row.window);
    CacheConfig c = row;
    c.k.head_dim = c.v.head_dim = 128;
    const AttentionBenchShape shape{.ctx = 512, .batch = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 128, .iters = 2,
                                    .hot = true};
    const AttentionFigures f = bench_attention_cpu(shape, c, pool, evict);
    return json{{"shape", "1 x 512, q4/kv2/d128"}, {"device", "cpu"}, {"attention_us", 1e3 * f.ms},
                {"bytes_read", f.bytes_read}, {"read_probe_gbps", 10.0},
                {"fraction_of_read_probe", f.bytes_read / (f.ms * 1e-3) / 10e9}};
  };
  cfg.decode_steps = 4;
  const RefereeResult r = run_referee(cfg, quiet);
  EXPECT_EQ(calls.size(), 4u);  // bf16, int2, fp8, kv4rl (refused); evict none
  for (const auto& [cache, n] : calls) EXPECT_EQ(n, 1) << cache;
  const json j = json::parse(slurp(d.out / "results.json"));
  EXPECT_TRUE(referee_schema_errors(j).empty());
  std::map<std::string, double> bytes;
  for (const json& run : j["runs"]) {
    ASSERT_TRUE(run.contains("cost")) << run["key"];
    const json& c = run["cost"];
    const std::string label = run["method"]["label"];
    // the decode speed at the model: one sequence filled to 256 - 2 warm-up - 4 timed steps, every row but eviction
    ASSERT_TRUE(run.contains("decode")) << run["key"];
    const json& dec = run["decode"];
    if (label == "evict(int2)") {
      EXPECT_TRUE(dec.contains("skipped")) << dec.dump();
    } else {
      EXPECT_EQ(dec["ctx"], 250) << label;
      EXPECT_EQ(dec["steps"], 4) << label;
      EXPECT_GT(dec["tokens_per_second"].get<double>(), 0.0) << label;
      EXPECT_NEAR(dec["ms_per_step"].get<double>() * dec["tokens_per_second"].get<double>(), 1e3, 1e-6) << label;
    }
    if (label == "evict(int2)") {
      EXPECT_TRUE(c.contains("skipped")) << c.dump();
    } else if (label == "kv4rl") {
      EXPECT_NE(c.value("unsupported", "").find("int8"), std::string::npos) << c.dump();
    } else {
      EXPECT_GT(c["attention_us"].get<double>(), 0.0) << label;
      bytes[label] = c["bytes_read"].get<double>();
    }
  }
  EXPECT_EQ(bytes["bf16"], 512.0 * 2 * 2 * 256);
  EXPECT_EQ(bytes["int2"], 512.0 * 2 * 2 * 36);
  EXPECT_EQ(bytes["fp8"], 512.0 * 2 * 2 * 128);
  const std::string md = slurp(d.out / "report.md");
  EXPECT_NE(md.find("## What each row costs"), std::string::npos);
  EXPECT_NE(md.find("1 x 512, q4/kv2/d128 on cpu"), std::string::npos);
  EXPECT_NE(md.find("| fp8 | 0/0 | "), std::string::npos);
  EXPECT_NE(md.find("attn µs"), std::string::npos);
  EXPECT_NE(md.find("| decode tok/s | run s |"), std::string::npos);
}

TEST(Referee, RefusesOrSkipsTheRunsTheDeviceCannotRunBeforeAnyRun) {
  Dirs d;
  RefereeConfig cfg = tiny(d);
  cfg.methods = parse_referee_methods("bf16,e8_2");
  // the device of this test has no kernels for E8 keys (as the GPU today)
  cfg.device_check = [](const CacheConfig& c, int) { KVQ_CHECK(c.k.type != "e8_2", "no kernels for e8_2 here"); };
  try {
    run_referee(cfg, quiet);
    FAIL() << "a referee with runs its device cannot run started";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("2 of 4 runs cannot run"), std::string::npos) << what;
    EXPECT_NE(what.find("e8_2__0-0 (no kernels for e8_2 here)"), std::string::npos) << what;
    EXPECT_NE(what.find("e8_2__shipped"), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists(d.out / "runs" / "bf16.json"));  // nothing ran

  cfg.skip_unsupported = true;
  const RefereeResult r = run_referee(cfg, quiet);
  EXPECT_EQ(r.runs_executed, 2);  // bf16, bf16 as shipped
  const json j = json::parse(slurp(d.out / "results.json"));
  EXPECT_TRUE(referee_schema_errors(j).empty());
  ASSERT_EQ(j["missing_runs"].size(), 2u);
  EXPECT_EQ(j["missing_runs"][0]["key"], "e8_2__0-0");
  EXPECT_EQ(j["missing_runs"][0]["reason"], "not on cpu: no kernels for e8_2 here");
  EXPECT_EQ(j["counters"]["runs_missing"], 2);
  const std::string md = slurp(d.out / "report.md");
  EXPECT_NE(md.find("e8_2 0/0 (not on cpu: no kernels for e8_2 here)"), std::string::npos);
}
