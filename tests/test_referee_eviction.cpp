// The referee's eviction section (referee/eviction.h) on a synthetic results.json — no model runs: an eviction
// row scored after a prompt of 60 of 64 tokens, its paired int2 row (prompt 0, with the NLL and KL tails it recorded
// from 60) and bf16, two domains. The KL and top-1 of both rows on the eviction row's rows are the pooled sums over
// windows by hand, their CIs hold them, the paired difference is Σ (a − b) / Σ rows and collapses to it when every
// window differs by the same amount per row, report.md shows them, and a paired record without a KL tail gives nulls
// and dashes, never another span's KL.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "referee/eviction.h"

using namespace kvq;
using nlohmann::json;

namespace {

constexpr int kFrom = 60;        // the eviction row's prompt at ctx 64
constexpr int kTailRows = 5;     // rows 59 .. 63 predict the targets >= 60
constexpr int kTailTargets = 4;  // targets 60 .. 63

struct Span {  // one domain's windows
  std::vector<double> nll, kl, agree;
  int rows;  // rows compared per window
};

json ppl_json(const Span& s, int targets) {
  return {{"ppl", 1.0}, {"ci95", {1.0, 1.0}}, {"windows", s.nll.size()},
          {"tokens", int64_t(s.nll.size()) * targets}, {"window_nll", s.nll}};
}

json kl_json(const Span& s) {
  double kl = 0, agree = 0;
  for (size_t i = 0; i < s.kl.size(); ++i) kl += s.kl[i], agree += s.agree[i];
  const double rows = double(s.kl.size()) * s.rows;
  return {{"kl_mean", kl / rows}, {"kl_ci95", {0.0, 1.0}}, {"top1", agree / rows}, {"top1_ci95", {0.0, 1.0}},
          {"windows", s.kl.size()}, {"tokens", int64_t(rows)}, {"window_kl_sum", s.kl},
          {"window_top1_agree", s.agree}, {"window_tokens", std::vector<int>(s.kl.size(), s.rows)}};
}

json run(const std::string& key, const std::string& label, const std::string& windows, int prompt) {
  return {{"key", key},
          {"method", {{"label", label}, {"type", label}, {"rotation", "none"}}},
          {"windows", {{"label", windows}}},
          {"leakage", false},
          {"protocol", {{"name", "common"}, {"prompt_tokens", {{"64", prompt}}}}},
          {"cache", {{"footprint", {{"64", {{"kv_bits_effective", 2.25}}}}}}},
          {"results", {{"ppl", {{"64", json::object()}}}, {"kl", {{"64", json::object()}}},
                       {"passkey", {{"64", {{"accuracy", 1.0}}}}}}}};
}

// Eviction KL sums = int2's tail sums + 0.5 per window (0.1 per row): the paired KL difference is 0.1 on every window.
const Span kEvPerl{{11.0, 12.0}, {1.5, 2.5}, {4, 3}, kTailRows};
const Span kEvPython{{10.0, 9.5, 8.5}, {1.0, 0.9, 3.5}, {5, 4, 2}, kTailRows};
const Span kInt2TailPerl{{10.0, 11.0}, {1.0, 2.0}, {5, 4}, kTailRows};
const Span kInt2TailPython{{9.5, 9.0, 8.0}, {0.5, 0.4, 3.0}, {5, 5, 4}, kTailRows};

json fake_results() {
  json ev = run("evict_int2__0-0", "evict(int2)", "0/0", kFrom);
  ev["method"]["equal_bytes"] = "int2";
  json int2 = run("int2__0-0", "int2", "0/0", 0), bf16 = run("bf16", "bf16", "any", 0);
  using Domain = std::tuple<const char*, const Span*, const Span*>;  // name, eviction row's, int2's tail
  for (const auto& [d, e, t] :
       {Domain{"perl", &kEvPerl, &kInt2TailPerl}, Domain{"python", &kEvPython, &kInt2TailPython}}) {
    ev["results"]["ppl"]["64"][d] = ppl_json(*e, kTailTargets);
    ev["results"]["kl"]["64"][d] = kl_json(*e);
    // int2 and bf16 score every target (63) and record their tails from 60
    const Span whole{std::vector<double>(t->nll.size(), 100.0), std::vector<double>(t->kl.size(), 9.0),
                     std::vector<double>(t->kl.size(), 30.0), 64};
    for (json* r : {&int2, &bf16}) {
      (*r)["results"]["ppl"]["64"][d] = ppl_json(whole, 63);
      (*r)["results"]["ppl"]["64"][d]["tail"] = {{"prompt_tokens", kFrom}, {"tokens", int64_t(t->nll.size()) * 4},
                                                 {"window_nll", t->nll}};
      (*r)["results"]["kl"]["64"][d] = kl_json(whole);
    }
    json tail = kl_json(*t);
    tail["prompt_tokens"] = kFrom;
    int2["results"]["kl"]["64"][d]["tail"] = tail;
  }
  return {{"eval_data", json::array({{{"domain", "perl"}}, {{"domain", "python"}}})},
          {"config", {{"ctx", {64}}, {"bootstrap", 400}}},
          {"seeds", {{"seed", 7}}},
          {"runs", json::array({bf16, int2, ev})}};
}

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

void expect_ci_holds(const json& v, const json& ci, const std::string& what) {
  EXPECT_LE(ci[0].get<double>(), v.get<double>()) << what;
  EXPECT_GE(ci[1].get<double>(), v.get<double>()) << what;
}

}  // namespace

TEST(RefereeEviction, KlAndTop1OfTheEvictionAndPairedRowsOnTheSameRowsAreTheirPooledSums) {
  json j = fake_results();
  const json e = referee_eviction_json(j)["common"]["64"][0];
  const double rows = 5.0 * kTailRows;  // 5 windows over both domains
  const double kl = (sum(kEvPerl.kl) + sum(kEvPython.kl)) / rows;
  const double top1 = (sum(kEvPerl.agree) + sum(kEvPython.agree)) / rows;
  const double paired_kl = (sum(kInt2TailPerl.kl) + sum(kInt2TailPython.kl)) / rows;
  const double paired_top1 = (sum(kInt2TailPerl.agree) + sum(kInt2TailPython.agree)) / rows;
  EXPECT_EQ(e["scored_from"], kFrom);
  EXPECT_EQ(e["paired_key"], "int2__0-0");
  EXPECT_DOUBLE_EQ(e["kl"].get<double>(), kl);  // (1.5 + 2.5 + 1.0 + 0.9 + 3.5) / 25 = 0.376
  EXPECT_DOUBLE_EQ(e["kl"].get<double>(), 0.376);
  EXPECT_DOUBLE_EQ(e["top1"].get<double>(), top1);  // 18 / 25
  EXPECT_DOUBLE_EQ(e["paired_kl"].get<double>(), paired_kl);  // 6.9 / 25, not int2's whole-window 9 / 64
  EXPECT_DOUBLE_EQ(e["paired_top1"].get<double>(), paired_top1);  // 23 / 25
  expect_ci_holds(e["kl"], e["kl_ci95"], "kl");
  expect_ci_holds(e["top1"], e["top1_ci95"], "top1");
  expect_ci_holds(e["paired_kl"], e["paired_kl_ci95"], "paired kl");
  expect_ci_holds(e["paired_top1"], e["paired_top1_ci95"], "paired top1");
  EXPECT_LT(e["kl_ci95"][0].get<double>(), e["kl_ci95"][1].get<double>());  // the windows differ: a real interval
  // The paired difference: every window's KL sum is 0.5 above int2's over 5 rows, so the CI collapses to 0.1.
  const json& d = e["fidelity_vs_paired"];
  EXPECT_NEAR(d["kl"]["estimate"].get<double>(), 0.1, 1e-12);
  EXPECT_NEAR(d["kl"]["ci95"][0].get<double>(), 0.1, 1e-12);
  EXPECT_NEAR(d["kl"]["ci95"][1].get<double>(), 0.1, 1e-12);
  EXPECT_NEAR(d["kl"]["estimate"].get<double>(), kl - paired_kl, 1e-12);
  EXPECT_NEAR(d["top1"]["estimate"].get<double>(), top1 - paired_top1, 1e-12);  // (18 - 23) / 25
  expect_ci_holds(d["top1"]["estimate"], d["top1"]["ci95"], "top1 difference");
  // The same pairing the NLL gets: the paired row's ppl on those targets is its tail's.
  EXPECT_NEAR(e["paired_ppl"].get<double>(), std::exp((sum(kInt2TailPerl.nll) + sum(kInt2TailPython.nll)) / 20.0),
              1e-12);

  // report.md: the KL table with the numbers and their CIs
  j["eviction"] = referee_eviction_json(j);
  const std::string md = referee_eviction_markdown(j);
  const std::string row = fmt::format(
      "| evict(int2) | 0/0 | {:.5f} [{:.5f}, {:.5f}] | {:.5f} [{:.5f}, {:.5f}] | {:+.5f} [{:+.5f}, {:+.5f}] | {:.4f} [{:.4f}, "
      "{:.4f}] | {:.4f} [{:.4f}, {:.4f}] | {:+.4f} [{:+.4f}, {:+.4f}] |",
      kl, e["kl_ci95"][0].get<double>(), e["kl_ci95"][1].get<double>(), paired_kl,
      e["paired_kl_ci95"][0].get<double>(), e["paired_kl_ci95"][1].get<double>(), d["kl"]["estimate"].get<double>(),
      d["kl"]["ci95"][0].get<double>(), d["kl"]["ci95"][1].get<double>(), top1, e["top1_ci95"][0].get<double>(),
      e["top1_ci95"][1].get<double>(), paired_top1, e["paired_top1_ci95"][0].get<double>(),
      e["paired_top1_ci95"][1].get<double>(), d["top1"]["estimate"].get<double>(),
      d["top1"]["ci95"][0].get<double>(), d["top1"]["ci95"][1].get<double>());
  EXPECT_NE(md.find(row), std::string::npos) << row << "\n" << md;
  EXPECT_NE(md.find("| 0.37600 ["), std::string::npos) << md;
  EXPECT_NE(md.find("| +0.10000 [+0.10000, +0.10000] |"), std::string::npos) << md;
}

TEST(RefereeEviction, APairedRecordWithoutAKlTailGivesNullsNotAnotherSpansKl) {
  json j = fake_results();
  for (const char* d : {"perl", "python"}) j["runs"][1]["results"]["kl"]["64"][d].erase("tail");
  const json e = referee_eviction_json(j)["common"]["64"][0];
  EXPECT_DOUBLE_EQ(e["kl"].get<double>(), 0.376);  // its own rows are always there
  EXPECT_TRUE(e["paired_kl"].is_null());
  EXPECT_TRUE(e["paired_kl_ci95"].is_null());
  EXPECT_TRUE(e["paired_top1"].is_null());
  EXPECT_TRUE(e["fidelity_vs_paired"].is_null());
  EXPECT_FALSE(e["vs_paired"].is_null());  // its NLL tail is still there
  j["eviction"] = referee_eviction_json(j);
  const std::string md = referee_eviction_markdown(j);
  EXPECT_NE(md.find("| evict(int2) | 0/0 | 0.37600 ["), std::string::npos) << md;
  EXPECT_NE(md.find("] | - | - | 0.7200 ["), std::string::npos) << md;
  // A tail from another prompt is not the eviction row's rows either.
  json other = fake_results();
  for (const char* d : {"perl", "python"}) other["runs"][1]["results"]["kl"]["64"][d]["tail"]["prompt_tokens"] = 48;
  EXPECT_TRUE(referee_eviction_json(other)["common"]["64"][0]["paired_kl"].is_null());
  // A malformed tail (window arrays of different lengths) is one clear error naming the run.
  json bad = fake_results();
  bad["runs"][1]["results"]["kl"]["64"]["perl"]["tail"]["window_tokens"] = {5};
  try {
    referee_eviction_json(bad);
    ADD_FAILURE() << "no error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("run int2__0-0"), std::string::npos) << err.what();
  }
}
