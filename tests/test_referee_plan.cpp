// kvq referee --plan (referee/rehearsal.h) on models/ref's shape with random weights, tiny (ctx 256, one window of one
// small domain, passkey at two depths): the plan lists every run of plan_referee_runs in order with the evaluation's
// work (windows, prompts and forwarded tokens as evaluate() counts them), an estimate that is the sum of its measured
// parts, one measurement per distinct cache, the runs a device refuses with its reason, a run recorded in OUT/runs as
// done, the calibrations (cached once OUT/rotations holds them), and a config without a tokenizer.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "common/error.h"
#include "referee/plan.h"
#include "referee/referee.h"
#include "test_helpers.h"
#include "referee/rehearsal.h"

using namespace kvq;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kSource = KVQ_SOURCE_DIR;

using test::head_of;

struct Dirs {
  fs::path root = fs::temp_directory_path() / ("kvq_test_referee_plan_" + std::to_string(getpid()));
  fs::path eval = root / "eval", out = root / "out", calib = root / "calib.txt", shape = root / "shape";
  Dirs() {
    fs::remove_all(root);
    fs::create_directories(eval);
    fs::create_directories(shape);
    std::ofstream(eval / "python.txt", std::ios::binary) << head_of(kSource + "/data/eval/python.txt", 6000);
    std::ofstream(calib, std::ios::binary) << head_of(kSource + "/data/calib/python.txt", 3000);
    fs::copy_file(kSource + "/models/ref/config.json", shape / "config.json");  // a shape: no weights, no tokenizer
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
  c.methods = parse_referee_methods("bf16,int2,int2+oscar,e8_2,evict(int2)");
  c.windows = parse_referee_windows("0/0");
  c.eval_windows = 1;
  c.passkey_trials = 1;
  c.depths = {0.0, 1.0};
  c.bootstrap = 50;
  c.seed = 5;
  c.threads = 2;
  c.leakage = false;
  c.calib_tokens = 1024;
  c.calib_chunk = 256;
  return c;
}

// The CPU over random weights of models/ref's shape; a stand-in device that has no kernels for E8 caches.
struct Device {
  std::unique_ptr<Model> model = Model::dummy(kSource + "/models/ref",
                                              ModelConfig::load(kSource + "/models/ref/config.json"), 0, 2);
  PlanDevice dev{"cpu", cpu_runner_factory(*model), [](const CacheConfig& c, int) {
                   KVQ_CHECK(c.k.type != "e8_2", "no kernels for {} keys here", c.k.type);
                 }};
};

const RefereeLog quiet = [](const std::string&, bool) {};

const json& run_of(const json& plan, const std::string& key) {
  for (const json& r : plan["runs"])
    if (r["key"] == key) return r;
  ADD_FAILURE() << "no run " << key;
  return plan["runs"][0];
}

}  // namespace

TEST(RefereePlan, ListsEveryRunWithItsWorkStatusAndAMeasuredEstimate) {
  Dirs d;
  Device dev;
  const RefereeConfig cfg = tiny(d);
  const json p = plan_referee(cfg, dev.dev, quiet);

  RefereeData data;
  check_referee_inputs(cfg, data);
  read_referee_data(cfg, nullptr, data);
  const std::vector<PlannedRun> runs = plan_referee_runs(cfg, data);
  ASSERT_EQ(p["runs"].size(), runs.size());
  for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(p["runs"][i]["key"], runs[i].key) << i;

  std::set<std::string> estimated;
  double total = 0;
  for (const json& r : p["runs"]) {
    const std::string key = r["key"];
    // one window of 256 tokens forwarded three times (reference, method, per-layer pass), two passkey prompts
    ASSERT_EQ(r["per_ctx"].size(), 1u);
    const json& at = r["per_ctx"][0];
    EXPECT_EQ(at["windows"], 1) << key;
    EXPECT_EQ(at["prompts"], 2) << key;
    EXPECT_EQ(r["tokens"].get<double>(), 256.0 * 3 + 2 * 256.0) << key;
    if (r["method"] == "e8_2") {
      EXPECT_EQ(r["status"], "refused") << key;
      EXPECT_NE(r["reason"].get<std::string>().find("no kernels for e8_2 keys"), std::string::npos) << r.dump();
      EXPECT_EQ(r["estimate_s"].get<double>(), 0.0);
      continue;
    }
    EXPECT_EQ(r["status"], "runs") << key;
    const double parts = at["build_s"].get<double>() + at["windows"].get<int>() * at["window_s"].get<double>() +
                         at["prompts"].get<int>() * at["prompt_s"].get<double>();
    EXPECT_GT(at["window_s"].get<double>(), 0.0) << key;
    EXPECT_GT(at["prompt_s"].get<double>(), 0.0) << key;
    EXPECT_NEAR(r["estimate_s"].get<double>(), parts, 1e-9 * parts) << key;
    total += parts;
    estimated.insert(key);
  }
  // bf16, int2, int2+oscar, evict(int2) common; bf16 and evict(int2) as shipped: six distinct caches, each timed once
  EXPECT_EQ(estimated.size(), 6u);
  EXPECT_EQ(p["totals"]["caches_timed"], 6);
  EXPECT_NEAR(p["totals"]["estimate_s"].get<double>(), total, 1e-9 * total);
  EXPECT_EQ(p["totals"]["by_status"]["refused"], 2);  // e8_2 common and as shipped
  EXPECT_EQ(run_of(p, "int2_oscar__0-0")["calibration"]["method"], "oscar");
  EXPECT_EQ(run_of(p, "int2_oscar__0-0")["calibration"]["cached"], false);
  EXPECT_TRUE(run_of(p, "int2__0-0")["calibration"].is_null());
  EXPECT_EQ(p["calibrations"]["count"], 1);
  EXPECT_EQ(p["config"]["windows_counted"], "in the eval texts' tokens");
  EXPECT_EQ(p["model"]["layers"], 8);

  const std::string table = referee_plan_table(p);
  EXPECT_NE(table.find("| 2 | int2 0/0 | common | runs | - | 1.3k |"), std::string::npos) << table;
  EXPECT_NE(table.find("refused"), std::string::npos);
  EXPECT_NE(table.find("e8_2__0-0 refused: no kernels for e8_2 keys here"), std::string::npos) << table;
}

TEST(RefereePlan, CountsRecordedRunsAsDoneAndCachedCalibrations) {
  Dirs d;
  Device dev;
  RefereeConfig cfg = tiny(d);
  cfg.methods = parse_referee_methods("bf16,int2+oscar");
  cfg.protocols = {RefereeProtocol::Common};
  RefereeConfig first = cfg;
  first.methods = parse_referee_methods("bf16");
  run_referee(first, quiet);                 // OUT/runs/bf16.json
  RefereeConfig calib = cfg;
  calib.calibrate_only = true;
  run_referee(calib, quiet);                 // OUT/rotations/int2_oscar-*.safetensors
  const json p = plan_referee(cfg, dev.dev, quiet);
  ASSERT_EQ(p["runs"].size(), 2u);
  EXPECT_EQ(p["runs"][0]["status"], "done");
  EXPECT_EQ(p["runs"][0]["estimate_s"].get<double>(), 0.0);
  EXPECT_EQ(p["runs"][1]["status"], "runs");
  EXPECT_EQ(p["runs"][1]["calibration"]["cached"], true);
  EXPECT_TRUE(fs::exists(p["runs"][1]["calibration"]["file"].get<std::string>()));
  EXPECT_EQ(p["totals"]["by_status"]["done"], 1);
  EXPECT_EQ(p["calibrations"]["cached"], 1);

  // a run recorded with other settings is run again
  cfg.seed = 6;
  EXPECT_EQ(plan_referee(cfg, dev.dev, quiet)["runs"][0]["status"], "runs");
}

TEST(RefereePlan, AShapeWithoutTokenizerTakesTheWindowsAsAskedAndRefusesAll) {
  Dirs d;
  Device dev;
  RefereeConfig cfg = tiny(d);
  cfg.model_dir = d.shape.string();
  cfg.methods = parse_referee_methods("int2");
  cfg.protocols = {RefereeProtocol::Common};
  cfg.eval_windows = 3;  // more than the 6000-byte domain holds: a plan without a tokenizer cannot tell
  const json p = plan_referee(cfg, dev.dev, quiet);
  EXPECT_EQ(p["config"]["windows_counted"], "assumed (no tokenizer.json)");
  EXPECT_EQ(p["runs"][0]["per_ctx"][0]["windows"], 3);
  EXPECT_EQ(p["runs"][0]["tokens"].get<double>(), 3 * 256.0 * 3 + 2 * 256.0);
  cfg.eval_windows = 0;
  try {
    plan_referee(cfg, dev.dev, quiet);
    FAIL() << "--windows 0 without a tokenizer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tokenizer.json"), std::string::npos) << e.what();
  }
}
