// The referee's unseen-domain figures (referee/pooled.h) on a synthetic results.json — no model runs: three
// domains (linux = the calibration file's stem, python, perl), four fake runs with known window NLLs; the pooled ppl
// is exp(Σ nll / Σ tokens) over python and perl only, the paired CI holds its estimate and collapses to it when every
// window has the same ratio, the pairs follow each method's natural base, and mismatched windows are refused.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "referee/pooled.h"
#include "referee/referee.h"

using namespace kvq;
using nlohmann::json;

namespace {

constexpr int kTokensPerWindow = 63;  // ctx 64: each window scores ctx - 1 tokens

using DomainNll = std::map<std::string, std::vector<double>>;  // domain -> summed NLL per window

json ppl_record(const std::vector<double>& nll) {
  double sum = 0;
  for (double x : nll) sum += x;
  const int64_t tokens = int64_t(nll.size()) * kTokensPerWindow;
  return {{"ppl", std::exp(sum / double(tokens))}, {"ci95", {1.0, 2.0}}, {"windows", nll.size()},
          {"tokens", tokens}, {"window_nll", nll}};
}

json fake_run(const std::string& key, const std::string& label, const std::string& type, const std::string& rotation,
              const std::string& base, const std::string& windows, const DomainNll& nll, bool leakage = false) {
  json ppl = json::object();
  for (const auto& [d, v] : nll) ppl[d] = ppl_record(v);
  return {{"key", key},
          {"method", {{"label", label}, {"type", type}, {"rotation", rotation}, {"base", base}, {"objective", ""}}},
          {"windows", {{"label", windows}}},
          {"leakage", leakage},
          {"results", {{"ppl", {{"64", ppl}}}}}};
}

// NLLs chosen so every number is checkable by hand; linux is far off so including it would show.
const DomainNll kBf16 = {{"linux", {500, 510}}, {"python", {120, 130, 125}}, {"perl", {140, 150}}};
const DomainNll kOscar = {{"linux", {600, 610}}, {"python", {123, 131, 129}}, {"perl", {141, 156}}};
const DomainNll kOptr = {{"linux", {590, 600}}, {"python", {122, 130, 127}}, {"perl", {141, 152}}};

json fake_results() {
  json runs = json::array({fake_run("bf16", "bf16", "bf16", "none", "", "any", kBf16),
                           fake_run("int2_oscar__0-0", "int2+oscar", "int2", "oscar", "", "0/0", kOscar),
                           fake_run("optr_oscar__0-0", "optr(oscar)", "int2", "optr", "oscar", "0/0", kOptr),
                           fake_run("optr_oscar__0-0__leak", "optr(oscar)", "int2", "optr", "oscar", "0/0", kOptr,
                                    true)});
  return {{"calibration_data", {{"file", "data/calib/linux.txt"}}},
          {"eval_data", json::array({{{"domain", "linux"}}, {{"domain", "perl"}}, {{"domain", "python"}}})},
          {"config", {{"ctx", {64}}, {"bootstrap", 400}}},
          {"seeds", {{"seed", 7}}},
          {"runs", runs}};
}

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// exp(Σ nll / Σ tokens) over python and perl, by hand.
double unseen_ppl_by_hand(const DomainNll& n) {
  return std::exp((sum(n.at("python")) + sum(n.at("perl"))) / double(5 * kTokensPerWindow));
}

const json& row_of(const json& rows, const std::string& key) {
  for (const json& r : rows)
    if (r["key"] == key) return r;
  static const json none;
  ADD_FAILURE() << "no row for " << key;
  return none;
}

}  // namespace

TEST(RefereePooled, UnseenDomainsLeaveOutTheCalibrationFileStem) {
  EXPECT_EQ(unseen_domains({"gcide", "linux", "perl"}, "/data/calib/linux.txt"),
            (std::vector<std::string>{"gcide", "perl"}));
  EXPECT_EQ(unseen_domains({"gcide", "perl"}, "calib/linux.txt"), (std::vector<std::string>{"gcide", "perl"}));
  EXPECT_TRUE(unseen_domains({"linux"}, "linux.txt").empty());
}

TEST(RefereePooled, PooledPplIsExpOfSummedNllOverTokensWithoutTheCalibrationDomain) {
  const json u = referee_unseen_json(fake_results());
  EXPECT_EQ(u["calibration_domain"], "linux");
  EXPECT_EQ(u["domains"], json({"perl", "python"}));
  EXPECT_TRUE(u["redundant_with"].is_null());
  const json& rows = u["ppl"]["64"];
  ASSERT_EQ(rows.size(), 3u);  // the leakage row is left out
  const double bf16 = unseen_ppl_by_hand(kBf16), optr = unseen_ppl_by_hand(kOptr);
  const json& r = row_of(rows, "optr_oscar__0-0");
  EXPECT_NEAR(r["ppl"].get<double>(), optr, 1e-12 * optr);
  EXPECT_EQ(r["n_windows"], 5);
  EXPECT_EQ(r["tokens"], 5 * kTokensPerWindow);
  // Including linux would give a far larger ppl.
  const double with_linux = std::exp((sum(kOptr.at("python")) + sum(kOptr.at("perl")) + sum(kOptr.at("linux"))) /
                                     double(7 * kTokensPerWindow));
  EXPECT_GT(with_linux, 1.5 * optr);
  EXPECT_NEAR(r["ppl_bf16"].get<double>(), bf16, 1e-12 * bf16);
  EXPECT_NEAR(r["increase_pct"].get<double>(), 100 * (optr / bf16 - 1), 1e-9);
  EXPECT_LE(r["ci95"][0].get<double>(), optr);
  EXPECT_GE(r["ci95"][1].get<double>(), optr);
  EXPECT_LT(r["ci95"][0].get<double>(), r["ci95"][1].get<double>());
  EXPECT_NEAR(row_of(rows, "bf16")["increase_pct"].get<double>(), 0.0, 1e-12);
}

TEST(RefereePooled, PairsEachMethodWithItsNaturalBaseAndBf16AndTheCiHoldsTheEstimate) {
  const json pairs = referee_unseen_json(fake_results())["paired"]["64"];
  std::vector<std::string> got;
  for (const json& p : pairs) got.push_back(p["method"].get<std::string>() + " vs " + p["base"].get<std::string>());
  // int2+oscar's natural base int2+quarot was not run: only its bf16 row; the leakage row is left out.
  EXPECT_EQ(got, (std::vector<std::string>{"int2+oscar vs bf16", "optr(oscar) vs int2+oscar", "optr(oscar) vs bf16"}));
  const json& p = pairs[1];
  const double ratio = unseen_ppl_by_hand(kOptr) / unseen_ppl_by_hand(kOscar);
  EXPECT_NEAR(p["ratio"].get<double>(), ratio, 1e-12);
  EXPECT_NEAR(p["change_pct"].get<double>(), 100 * (ratio - 1), 1e-9);
  EXPECT_LE(p["ci95"][0].get<double>(), ratio);
  EXPECT_GE(p["ci95"][1].get<double>(), ratio);
  EXPECT_LT(p["ci95"][0].get<double>(), p["ci95"][1].get<double>());
  EXPECT_NEAR(p["change_pct_ci95"][0].get<double>(), 100 * (p["ci95"][0].get<double>() - 1), 1e-9);
  EXPECT_EQ(natural_base({{"type", "int2"}, {"rotation", "optr"}, {"base", "quarot"}}), "int2+quarot");
  EXPECT_EQ(natural_base({{"type", "int2"}, {"rotation", "oscar"}, {"base", ""}}), "int2+quarot");
  EXPECT_EQ(natural_base({{"type", "int2"}, {"rotation", "quarot"}, {"base", ""}}), "int2");
  EXPECT_EQ(natural_base({{"type", "int2"}, {"rotation", "none"}, {"base", ""}}), "");
}

TEST(RefereePooled, PairedCiShrinksToThePointWhenEveryWindowHasTheSameRatio) {
  const json results = fake_results();
  const std::vector<std::string> doms = {"perl", "python"};
  const PooledWindows base = pooled_windows(results["runs"][0], "64", doms);
  PooledWindows method = base;
  const double log_ratio = 0.0125;  // every window: nll_m = nll_b + log_ratio × tokens
  for (size_t i = 0; i < method.nll.size(); ++i) method.nll[i] += log_ratio * method.tokens[i];
  const Interval same = paired_ppl_ratio(method, base, 300, 11);
  EXPECT_NEAR(same.estimate, std::exp(log_ratio), 1e-12);
  EXPECT_NEAR(same.lo, same.estimate, 1e-12);
  EXPECT_NEAR(same.hi, same.estimate, 1e-12);
  // Against itself: ratio 1 exactly.
  const Interval self = paired_ppl_ratio(base, base, 300, 11);
  EXPECT_DOUBLE_EQ(self.estimate, 1.0);
  EXPECT_DOUBLE_EQ(self.lo, 1.0);
  EXPECT_DOUBLE_EQ(self.hi, 1.0);
  // The pooled ppl interval: estimate exp(Σ nll / Σ tokens), bounds around it.
  const Interval p = pooled_ppl(base, 300, 11);
  EXPECT_NEAR(p.estimate, unseen_ppl_by_hand(kBf16), 1e-12);
  EXPECT_LE(p.lo, p.estimate);
  EXPECT_GE(p.hi, p.estimate);
}

TEST(RefereePooled, MismatchedWindowCountsAreRefusedWithAClearError) {
  json results = fake_results();
  results["runs"][2]["results"]["ppl"]["64"]["perl"] = ppl_record({141});  // optr(oscar): 1 perl window, not 2
  try {
    referee_unseen_json(results);
    FAIL() << "mismatched window counts were accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("perl has 1 windows in optr_oscar__0-0 but 2 in int2_oscar__0-0"), std::string::npos) << m;
  }
  // A record whose window count disagrees with its window NLLs is refused too.
  results = fake_results();
  results["runs"][1]["results"]["ppl"]["64"]["python"]["windows"] = 4;
  EXPECT_THROW(referee_unseen_json(results), Error);
  // So is one without per-window NLLs.
  results = fake_results();
  results["runs"][1]["results"]["ppl"]["64"]["python"].erase("window_nll");
  EXPECT_THROW(referee_unseen_json(results), Error);
}

TEST(RefereePooled, RedundantPoolsAreNamedAndAnEmptyPoolIsNull) {
  json results = fake_results();
  results["calibration_data"]["file"] = "data/calib/gcide.txt";  // every eval domain unseen: the pool is "all"
  json u = referee_unseen_json(results);
  EXPECT_EQ(u["redundant_with"], "all");
  EXPECT_EQ(u["domains"].size(), 3u);
  results["eval_data"] = json::array({{{"domain", "linux"}}, {{"domain", "perl"}}});
  results["calibration_data"]["file"] = "linux.txt";  // one unseen domain: its own column
  u = referee_unseen_json(results);
  EXPECT_EQ(u["redundant_with"], "perl");
  EXPECT_NEAR(row_of(u["ppl"]["64"], "bf16")["ppl"].get<double>(), std::exp(290.0 / (2 * kTokensPerWindow)), 1e-12);
  results["eval_data"] = json::array({{{"domain", "linux"}}});
  EXPECT_TRUE(referee_unseen_json(results).is_null());
}

TEST(RefereePooled, MarkdownSectionListsPooledPplAndPairedRatios) {
  json results = fake_results();
  EXPECT_EQ(referee_unseen_markdown(results), "");  // no "unseen" key: no section (older results.json)
  results["unseen"] = referee_unseen_json(results);
  const std::string md = referee_unseen_markdown(results);
  EXPECT_NE(md.find("## Unseen domains pooled at ctx 64: perl, python (calibration domain linux left out)"),
            std::string::npos) << md;
  const double optr = unseen_ppl_by_hand(kOptr), bf16 = unseen_ppl_by_hand(kBf16);
  EXPECT_NE(md.find(fmt::format("| optr(oscar) | 0/0 | {:.4f} |", optr)), std::string::npos) << md;
  EXPECT_NE(md.find(fmt::format("| {:+.3f}% |", 100 * (optr / bf16 - 1))), std::string::npos) << md;
  EXPECT_NE(md.find("| optr(oscar) | int2+oscar | 0/0 |"), std::string::npos) << md;
  EXPECT_EQ(md.find("[leak]"), std::string::npos);
}

// A run scored after a longer prompt (the eviction row, prompt 60 of 64) pairs with the others on its targets: their
// recorded tails from 60 (results.ppl[ctx][domain].tail); a record without that tail cannot be paired (nullopt), and a
// run's own windows are its whole span.
TEST(RefereePooled, ARunOfALongerPromptPairsWithTheOthersTailsOnTheSameTargets) {
  json results = fake_results();
  json& bf16 = results["runs"][0];
  json& oscar = results["runs"][1];
  const std::vector<std::string> doms = {"perl", "python"};
  // bf16's tails from 60: 4 targets per window, known NLLs; the eviction row's own windows at prompt 60
  bf16["results"]["ppl"]["64"]["perl"]["tail"] = {{"prompt_tokens", 60}, {"tokens", 8}, {"window_nll", {9.0, 10.0}}};
  bf16["results"]["ppl"]["64"]["python"]["tail"] = {{"prompt_tokens", 60}, {"tokens", 12},
                                                    {"window_nll", {8.0, 9.0, 7.0}}};
  json ev = fake_run("evict_int2__0-0", "evict(int2)", "bf16", "none", "", "0/0",
                     {{"perl", {11.0, 12.0}}, {"python", {10.0, 9.5, 8.5}}});
  for (const char* d : {"perl", "python"}) {
    json& e = ev["results"]["ppl"]["64"][d];
    e["tokens"] = 4 * e["windows"].get<int>();
  }
  ev["protocol"] = {{"prompt_tokens", {{"64", 60}}}};
  const auto both = paired_windows(ev, bf16, "64", doms);
  ASSERT_TRUE(both.has_value());
  EXPECT_EQ(both->first.nll, (std::vector<double>{11.0, 12.0, 10.0, 9.5, 8.5}));
  EXPECT_EQ(both->second.nll, (std::vector<double>{9.0, 10.0, 8.0, 9.0, 7.0}));
  EXPECT_EQ(both->second.tokens, std::vector<double>(5, 4.0));
  const Interval q = paired_ppl_ratio(both->first, both->second, 200, 3);
  EXPECT_NEAR(q.estimate, std::exp((51.0 - 43.0) / 20.0), 1e-12);
  // the other order pairs the same windows; a run with no tail from 60 cannot be paired
  EXPECT_EQ(paired_windows(bf16, ev, "64", doms)->first.nll, both->second.nll);
  EXPECT_FALSE(paired_windows(ev, oscar, "64", doms).has_value());
  EXPECT_FALSE(pooled_windows_from(oscar, "64", doms, 60).has_value());
  // two runs of the same prompt pair on their own windows
  const auto whole = paired_windows(oscar, bf16, "64", doms);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->second.nll, pooled_windows(bf16, "64", doms).nll);
  EXPECT_EQ(whole->second.tokens, std::vector<double>(5, double(kTokensPerWindow)));
  // a tail whose windows disagree with the record's is refused
  bf16["results"]["ppl"]["64"]["perl"]["tail"]["window_nll"] = {9.0};
  EXPECT_THROW(pooled_windows_from(bf16, "64", doms, 60), Error);
  // the eviction row's natural base is its row of equal bytes
  EXPECT_EQ(natural_base({{"label", "retired-evict"}, {"type", "bf16"}, {"rotation", "none"}, {"equal_bytes", "int2"}}),
            "int2");
}
