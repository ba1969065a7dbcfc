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
#include "kv/codec_registry.h"

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
    // A row's transform is its rotation or the one its codecs imply, never both (run_cache takes one).
    const std::string_view implied = implied_transform(method_codec_spec(m.key_type, true),
                                                       method_codec_spec(m.value_type, false));
    if (implied != kTransformNone) {
      EXPECT_EQ(m.rotation, "none");
    }
    if (m.tunes_clips) {
      EXPECT_TRUE(codec_traits(m.key_type).takes_clip && codec_traits(m.value_type).takes_clip);
    }
    if (m.shipped.defined) {  // a camp's row: its windows fit the cache, its skip list parses
      EXPECT_NO_THROW(parse_skip_layers(m.shipped.skip_layers));
      EXPECT_TRUE(m.shipped.prompt == kPromptDecodeFaithful || m.shipped.prompt == kPromptExact ||
                  m.shipped.prompt == kPromptQuantizeAfter) << m.shipped.prompt;
      if (m.label != "bf16") {
        EXPECT_NE(m.camp, "kvq") << "kvq's own rows have no as-shipped path";
      }
    }
    if (const CodecPreset* p = find_preset(m.label)) {  // a preset's row stores the preset's codecs
      EXPECT_EQ(m.key_type, codec_traits(p->k).name);
      EXPECT_EQ(m.value_type, codec_traits(p->v).name);
      EXPECT_EQ(m.kvq_extension, p->kvq_extension);
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
  EXPECT_EQ(referee_quick_methods(), "bf16,int8,int2,kivi2,int2+quarot,int2+oscar,optr(oscar),turboquant_2bit,e8_2,"
                                     "kitty_int2,q4_0");
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
  cfg.protocols = {RefereeProtocol::Common};
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

// The as-shipped rows resolve to the cache configs of METHODS §5 (windows, skipped layers, attn_rot, prompt policy),
// and the common protocol to the referee's windows, no skipped layer, attn_rot off and decode-faithful scoring.
TEST(RefereeMethods, AsShippedRowsResolveToTheirCampsWindowsSkipLayersAttnRotAndPromptPolicy) {
  const auto shipped = [](const char* label) {
    const RefereeMethod* m = find_referee_method(label);
    EXPECT_NE(m, nullptr) << label;
    return std::make_pair(*m, method_cache(*m, {64, 256}, 128, RefereeProtocol::AsShipped));
  };
  const int L = 4, H = 2, D = 128;  // a small model shape: the transforms need a power-of-two head_dim only
  for (const char* tq : {"turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
                         "turboquant_2bit"}) {
    SCOPED_TRACE(tq);
    const auto [m, c] = shipped(tq);
    EXPECT_EQ(c.sink, 0);
    EXPECT_EQ(c.recent, 0);
    EXPECT_EQ(c.skip_layers, (std::vector<int>{0, 1, -2, -1}));
    EXPECT_EQ(method_prompt_policy(m, RefereeProtocol::AsShipped), "exact-prompt");
    EXPECT_FALSE(method_attn_rot(m, RefereeProtocol::AsShipped));
    // its key Hadamard is part of the format (k8v4's FP8 keys have none): under both protocols
    const auto t = method_transform(m, RefereeProtocol::AsShipped, c, L, H, D);
    EXPECT_EQ(t != nullptr, std::string(tq) != "turboquant_k8v4");
    const CacheConfig common = method_cache(m, {16, 64}, 128, RefereeProtocol::Common);
    EXPECT_EQ(common.sink, 16);
    EXPECT_EQ(common.recent, 64);
    EXPECT_TRUE(common.skip_layers.empty());
    EXPECT_EQ(method_prompt_policy(m, RefereeProtocol::Common), "decode-faithful");
    EXPECT_EQ(method_transform(m, RefereeProtocol::Common, common, L, H, D) != nullptr, t != nullptr);
  }
  {
    const auto [m, c] = shipped("nexusquant");
    EXPECT_EQ(c.sink + c.recent, 0);
    EXPECT_TRUE(c.skip_layers.empty());
    EXPECT_EQ(method_prompt_policy(m, RefereeProtocol::AsShipped), "quantize-after-prompt");
  }
  {
    const auto [m, c] = shipped("e8_2");
    EXPECT_EQ(c.sink + c.recent, 0);
    EXPECT_EQ(method_prompt_policy(m, RefereeProtocol::AsShipped), "decode-faithful");
  }
  {
    const auto [m, c] = shipped("oscar_int2");
    EXPECT_EQ(c.sink, 0);
    EXPECT_EQ(c.recent, 128);
    EXPECT_EQ(method_prompt_policy(m, RefereeProtocol::AsShipped), "exact-prompt");
    ASSERT_NE(method_transform(m, RefereeProtocol::AsShipped, c, L, H, D), nullptr);  // OScaR's Hadamard
  }
  for (const char* kitty : {"kitty_int2", "kitty_int2_20"}) {
    const auto [m, c] = shipped(kitty);
    EXPECT_EQ(c.sink, 32) << kitty;
    EXPECT_EQ(c.recent, 128) << kitty;
    EXPECT_EQ(method_prompt_policy(m, RefereeProtocol::AsShipped), "decode-faithful");
  }
  for (const char* llama : {"q8_0", "q8_0/q4_0", "q5_0", "q4_1", "q4_0", "iq4_nl"}) {
    SCOPED_TRACE(llama);
    const auto [m, c] = shipped(llama);
    EXPECT_EQ(c.sink + c.recent, 0);
    EXPECT_TRUE(c.skip_layers.empty());
    EXPECT_EQ(method_cache(m, {0, 0}, 64).k.group, method_codec_spec(m.key_type, true).group)
        << "llama.cpp's blocks keep their own size";
    EXPECT_TRUE(method_attn_rot(m, RefereeProtocol::AsShipped));
    EXPECT_FALSE(method_attn_rot(m, RefereeProtocol::Common));
    const auto t = method_transform(m, RefereeProtocol::AsShipped, c, L, H, D);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->name.rfind("attn_rot", 0), 0u) << t->name;
    EXPECT_EQ(method_transform(m, RefereeProtocol::Common, method_cache(m, {64, 256}, 128), L, H, D), nullptr);
  }
  // kvq's own rows have no as-shipped path: asking for one is an error, not a silent common run
  EXPECT_THROW(method_cache(*find_referee_method("int2"), {0, 0}, 128, RefereeProtocol::AsShipped), Error);
  EXPECT_EQ(parse_referee_protocols("as-shipped,common"),
            (std::vector<RefereeProtocol>{RefereeProtocol::AsShipped, RefereeProtocol::Common}));
  EXPECT_THROW(parse_referee_protocols("common,common"), Error);
  EXPECT_THROW(parse_referee_protocols("vllm"), Error);
}

TEST(RefereeMethods, ThePlanAddsOneAsShippedRunPerCampRowAndRecordsItsPath) {
  RefereeConfig cfg;
  cfg.methods = parse_referee_methods("bf16,int2,turboquant_2bit,q4_0");
  cfg.windows = parse_referee_windows("64/256,0/0");
  cfg.leakage = false;
  RefereeData data;
  std::vector<std::string> keys, windows;
  std::vector<PlannedRun> plan = plan_referee_runs(cfg, data);
  for (const PlannedRun& r : plan) {
    keys.push_back(r.key);
    windows.push_back(run_windows_label(r));
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"bf16", "int2__64-256", "int2__0-0", "turboquant_2bit__64-256",
                                            "turboquant_2bit__0-0", "q4_0__64-256", "q4_0__0-0", "bf16__shipped",
                                            "turboquant_2bit__shipped", "q4_0__shipped"}));
  EXPECT_EQ(windows.back(), "0/0");
  EXPECT_EQ(run_prompt_tokens(plan.back(), 1024), 512);
  EXPECT_EQ(run_prompt_tokens(plan.front(), 1024), 0);
  const json tq = run_settings(cfg, data, plan[8]);
  EXPECT_EQ(tq["protocol"], "as-shipped");
  EXPECT_EQ(tq["layer_skip"], "0,1,-2,-1");
  EXPECT_EQ(tq["prompt_policy"], "exact-prompt");
  EXPECT_EQ(tq["attn_rot"], false);
  const json q4 = run_settings(cfg, data, plan[9]);
  EXPECT_EQ(q4["attn_rot"], true);
  EXPECT_EQ(q4["layer_skip"], "none");
  const json q4_common = run_settings(cfg, data, plan[6]);
  EXPECT_EQ(q4_common["protocol"], "common");
  EXPECT_EQ(q4_common["attn_rot"], false);
  EXPECT_EQ(q4_common["prompt_policy"], "decode-faithful");
  cfg.protocols = {RefereeProtocol::AsShipped};
  EXPECT_EQ(plan_referee_runs(cfg, data).size(), 3u);
}
