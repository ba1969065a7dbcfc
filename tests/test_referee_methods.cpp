// The referee's method table is consistent: every row names a known rotation, a learned rotation names its base,
// objective and the row whose clips it takes, every baseline and clip source is a row, one row is the leakage
// row's method, parsing a label gives its row; the codecs follow METHODS' defaults; the plan reads the rows.
#include <set>

#include <gtest/gtest.h>

#include "common/error.h"
#include "eval/referee.h"
#include "eval/referee_plan.h"
#include "eval/referee_pooled.h"
#include "eval/referee_results.h"

using namespace kvq;
using nlohmann::json;

TEST(RefereeMethods, EveryRowNamesKnownRotationsBasesBaselinesAndClipSources) {
  std::set<std::string> labels;
  int leakage_rows = 0;
  for (const RefereeMethod& m : referee_methods()) {
    SCOPED_TRACE(m.label);
    EXPECT_FALSE(m.label.empty());
    EXPECT_TRUE(labels.insert(m.label).second) << "label listed twice";
    EXPECT_FALSE(m.key_type.empty());
    EXPECT_FALSE(m.value_type.empty());
    EXPECT_FALSE(m.window_type.empty());
    EXPECT_NO_THROW(m.rotation_kind());
    const RefereeRotation& rot = m.rotation_kind();
    EXPECT_FALSE(rot.learned && !rot.calibrated) << "a learned rotation is calibrated";
    if (rot.learned) {
      EXPECT_FALSE(m.objective.empty());
      ASSERT_NO_THROW(referee_rotation(m.base));
      EXPECT_FALSE(referee_rotation(m.base).learned) << "a learned rotation starts from a rotation of its own kind";
      EXPECT_FALSE(m.clips_from.empty()) << "a learned rotation belongs to the grid of the row it starts from";
    } else {
      EXPECT_EQ(m.base, "");
      EXPECT_EQ(m.objective, "");
    }
    if (!m.clips_from.empty()) {
      const RefereeMethod* from = find_referee_method(m.clips_from);
      ASSERT_NE(from, nullptr) << "clips_from " << m.clips_from << " is no row";
      EXPECT_TRUE(m.tunes_clips);
      EXPECT_TRUE(from->tunes_clips);
      EXPECT_TRUE(from->clips_from.empty()) << "clips are taken from a row that tunes its own";
      EXPECT_FALSE(from->rotation_kind().learned);
      EXPECT_EQ(from->key_type, m.key_type);
      EXPECT_EQ(from->value_type, m.value_type);
    }
    if (!m.baseline.empty()) {
      ASSERT_NE(find_referee_method(m.baseline), nullptr) << "baseline " << m.baseline << " is no row";
      EXPECT_NE(m.baseline, m.label);
    }
    if (m.tunes_clips) {  // only a codec with a quantile clip has one to tune
      EXPECT_LT(method_codec_spec(m.key_type, true).clip, 1.0f);
      EXPECT_LT(method_codec_spec(m.value_type, false).clip, 1.0f);
    }
    if (m.leakage) {
      ++leakage_rows;
      EXPECT_TRUE(m.needs_calibration()) << "the leakage row is calibrated on an eval file";
    }
  }
  EXPECT_EQ(leakage_rows, 1);
  std::set<std::string> rotations;
  for (const RefereeRotation& r : referee_rotations()) EXPECT_TRUE(rotations.insert(r.name).second) << r.name;
  EXPECT_THROW(referee_rotation("spin"), Error);
}

TEST(RefereeMethods, ParsingEachLabelGivesItsRowAndTheWholeListTheTable) {
  std::string all;
  for (const RefereeMethod& m : referee_methods()) {
    const std::vector<RefereeMethod> one = parse_referee_methods(m.label);
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(method_json(one[0]), method_json(m));
    EXPECT_EQ(one[0].clips_from, m.clips_from);
    EXPECT_EQ(one[0].baseline, m.baseline);
    EXPECT_EQ(find_referee_method(m.label), &m);
    all += (all.empty() ? "" : ",") + m.label;
  }
  const std::vector<RefereeMethod> every = parse_referee_methods(all);
  ASSERT_EQ(every.size(), referee_methods().size());
  for (size_t i = 0; i < every.size(); ++i) EXPECT_EQ(every[i].label, referee_methods()[i].label);
  EXPECT_EQ(find_referee_method("int3"), nullptr);
  // the demo / CI subset
  EXPECT_EQ(referee_quick_methods(), "bf16,int8,int2,kivi2,int2+quarot,int2+oscar,optr(oscar)");
  EXPECT_NO_THROW(parse_referee_methods(referee_quick_methods()));
}

TEST(RefereeMethods, NaturalBaseOfARecordIsItsRowsBaselineAndOldLabelsFollowTheSameRule) {
  for (const RefereeMethod& m : referee_methods()) {
    json j = method_json(m);
    EXPECT_EQ(natural_base(j), m.baseline) << m.label;
    j["label"] = "retired-" + m.label;  // a label the table no longer holds: the rule, which today's rows follow
    EXPECT_EQ(natural_base(j), m.baseline) << m.label;
  }
}

TEST(RefereeMethods, CodecSpecsFollowMethodsDefaultsAndTheCacheTakesTheRowsWindows) {
  EXPECT_EQ(method_codec_spec("int2", true).clip, 0.96f);
  EXPECT_EQ(method_codec_spec("int2", false).clip, 0.92f);
  for (const char* t : {"bf16", "int8", "int4"}) {
    EXPECT_EQ(method_codec_spec(t, true).clip, 1.0f) << t;
    EXPECT_FALSE(method_codec_spec(t, true).per_channel) << t;
  }
  const CodecSpec kivi_k = method_codec_spec("kivi2", true), kivi_v = method_codec_spec("kivi2", false);
  EXPECT_TRUE(kivi_k.per_channel);
  EXPECT_FALSE(kivi_v.per_channel);
  EXPECT_EQ(kivi_k.clip, 1.0f);
  EXPECT_EQ(kivi_v.clip, 1.0f);
  const CacheConfig c = method_cache(*find_referee_method("kivi2"), {16, 64}, 64);
  EXPECT_EQ(c.k.type, "kivi2");
  EXPECT_EQ(c.v.type, "kivi2");
  EXPECT_EQ(c.k.group, 64);
  EXPECT_EQ(c.v.group, 64);
  EXPECT_EQ(c.window, "bf16");
  EXPECT_EQ(c.sink, 16);
  EXPECT_EQ(c.recent, 64);
  // KV4-RL: int4 keys and values, the INT8 window codec (METHODS §5.6), judged against int4 (bf16 windows).
  const RefereeMethod* kv4rl = find_referee_method("kv4rl");
  ASSERT_NE(kv4rl, nullptr);
  const CacheConfig k4 = method_cache(*kv4rl, {64, 256}, 128);
  EXPECT_EQ(k4.k.type, "int4");
  EXPECT_EQ(k4.v.type, "int4");
  EXPECT_EQ(k4.window, "int8");
  EXPECT_EQ(kv4rl->baseline, "int4");
}

TEST(RefereeMethods, ThePlanRunsWindowlessRowsOnceAndAddsTheLeakageRow) {
  RefereeConfig cfg;
  cfg.methods = parse_referee_methods("bf16,int2,kivi2");
  cfg.windows = parse_referee_windows("64/256,0/0");
  RefereeData data;
  data.domains.resize(2);
  data.domains[0].name = "linux";
  data.domains[1].name = "python";
  data.leak_domain = 1;
  std::vector<std::string> keys, windows;
  for (const PlannedRun& r : plan_referee_runs(cfg, data)) {
    keys.push_back(r.key);
    windows.push_back(run_windows_label(r));
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"bf16", "int2__64-256", "int2__0-0", "kivi2__64-256", "kivi2__0-0",
                                            "optr_oscar__64-256__leak-python"}));
  EXPECT_EQ(windows, (std::vector<std::string>{"any", "64/256", "0/0", "64/256", "0/0", "64/256"}));
  cfg.leakage = false;
  EXPECT_EQ(plan_referee_runs(cfg, data).size(), 5u);
}
