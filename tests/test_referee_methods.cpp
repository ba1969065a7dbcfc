// The referee's method table is consistent: every row names a known rotation, a learned rotation names its base,
// objective and the row whose clips it takes, every baseline and clip source is a row, one row is the leakage
// row's method, parsing a label gives its row; the codecs follow METHODS' defaults; the plan reads the rows.
#include <set>

#include <gtest/gtest.h>

#include "codecs/registry.h"
#include "common/error.h"
#include "model/config.h"
#include "referee/plan.h"
#include "referee/pooled.h"
#include "referee/referee.h"
#include "referee/results.h"

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
    const CodecTransform implied = implied_transform(method_codec_spec(m.key_type, true),
                                                       method_codec_spec(m.value_type, false));
    if (implied != CodecTransform::kNone) {
      EXPECT_EQ(m.rotation, "none");
    }
    if (m.tunes_clips) {
      EXPECT_TRUE(codec_traits(m.key_type).takes_clip && codec_traits(m.value_type).takes_clip);
    }
    if (m.shipped.defined) {  // a camp's row: its windows fit the cache, its skip list parses
      EXPECT_NO_THROW(parse_skip_layers(m.shipped.skip_layers));
      EXPECT_TRUE(m.shipped.prompt == kPromptDecodeFaithful || m.shipped.prompt == kPromptExact ||
                  m.shipped.prompt == kPromptQuantizeAfter || (m.evicts() && m.shipped.prompt == kPromptEvict))
          << m.shipped.prompt;
      if (m.label != "bf16") {
        EXPECT_NE(m.camp, "kvq") << "kvq's own rows have no as-shipped path";
      }
    }
    if (const CodecPreset* p = find_preset(m.label)) {  // a preset's row stores the preset's codecs
      EXPECT_EQ(m.key_type, codec_traits(p->k).name);
      EXPECT_EQ(m.value_type, codec_traits(p->v).name);
      EXPECT_EQ(m.kvq_extension, p->kvq_extension);
    }
    if (m.evicts()) {  // an eviction row: a bf16 cache (kept rows exact) at the bytes of a quantized row, judged against it
      const RefereeMethod* paired = find_referee_method(m.equal_bytes);
      ASSERT_NE(paired, nullptr) << "equal_bytes " << m.equal_bytes << " is no row";
      EXPECT_FALSE(paired->evicts());
      EXPECT_EQ(m.baseline, m.equal_bytes);
      EXPECT_EQ(m.key_type, "bf16");
      EXPECT_EQ(m.value_type, "bf16");
      EXPECT_EQ(m.rotation, "none");
      EXPECT_TRUE(m.windows_matter);
      EXPECT_EQ(method_prompt_policy(m, RefereeProtocol::Common), kPromptEvict);
    } else {
      EXPECT_NE(method_prompt_policy(m, RefereeProtocol::Common), kPromptEvict);
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
                                     "kitty_int2,evict(int2),q4_0");
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
    EXPECT_EQ(c.recent, 0);
    EXPECT_EQ(c.demote_block, 256);  // OScaR's residual: the newest n mod 256 tokens exact
    EXPECT_EQ(method_prompt_policy(m, RefereeProtocol::AsShipped), "exact-prompt");
    ASSERT_NE(method_transform(m, RefereeProtocol::AsShipped, c, L, H, D), nullptr);  // OScaR's Hadamard
    EXPECT_EQ(method_cache(m, {64, 256}, 128, RefereeProtocol::Common).demote_block, 0);  // common: the codec's 32
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

// OScaR as shipped in the plan: its run is at windows 0/0 with a demotion block of 256 (its settings say so, so an old
// record of another schedule does not resume), its cache demotes 256 positions at once over the codec's 32-token key
// groups (qe(t) = floor((t + 1) / 256) · 256) and stores at 2048 (8 whole blocks) exactly OScaR's bytes; the common
// run keeps the codec's block and the referee's windows.
TEST(RefereeMethods, OscarAsShippedRunsWithNoWindowsAndADemotionBlockOf256) {
  const ModelConfig mc = ModelConfig::load(std::string(KVQ_SOURCE_DIR) + "/models/ref/config.json");
  RefereeConfig cfg;
  cfg.methods = parse_referee_methods("bf16,oscar_int2");
  cfg.windows = parse_referee_windows("64/256");
  cfg.leakage = false;
  RefereeData data;
  const std::vector<PlannedRun> plan = plan_referee_runs(cfg, data);
  std::vector<std::string> keys;
  for (const PlannedRun& r : plan) keys.push_back(r.key);
  ASSERT_EQ(keys, (std::vector<std::string>{"bf16", "oscar_int2__64-256", "bf16__shipped", "oscar_int2__shipped"}));
  const PlannedRun& shipped = plan[3];
  EXPECT_EQ(run_windows_label(shipped), "0/0");
  EXPECT_EQ(run_prompt_tokens(shipped, 2048), 1024);
  const json s = run_settings(cfg, data, shipped);
  EXPECT_EQ(s["demote_block"], 256);
  EXPECT_EQ(s["prompt_policy"], "exact-prompt");
  EXPECT_EQ(s["sink"], 0);
  EXPECT_EQ(s["recent"], 0);
  EXPECT_FALSE(run_settings(cfg, data, plan[1]).contains("demote_block"));
  EXPECT_FALSE(run_settings(cfg, data, plan[2]).contains("demote_block"));
  CacheConfig c = method_cache(shipped.method, shipped.windows, cfg.group, shipped.protocol);
  c.prompt_policy = parse_prompt_policy(method_prompt_policy(shipped.method, shipped.protocol));
  EXPECT_EQ(c.describe().find("demote=256") != std::string::npos, true) << c.describe();
  const KvCache cache(c, mc.n_layers, mc.n_kv_heads, mc.head_dim, 2048);
  EXPECT_EQ(cache.block_tokens(), 256);
  EXPECT_EQ(cache.codec_block_tokens(), 32);
  for (int t : {0, 254, 255, 256, 511, 1023, 2047}) EXPECT_EQ(cache.quant_end(t), (t + 1) / 256 * 256) << t;
  // 2048 = 8 blocks: all quantized, OScaR's 48 + 48 B per (token, kv head) and ν's 4 B per token and layer
  const double oscar_bits = 8.0 * (mc.n_kv_heads * 96.0 + 4) / (2.0 * mc.n_kv_heads * mc.head_dim);
  EXPECT_DOUBLE_EQ(cache.footprint(2048, 1024).bits_per_element, oscar_bits);
  // 2048 + 44: the 44 newest tokens in the residual (bf16)
  const double token = 2.0 * mc.n_kv_heads * mc.head_dim;  // K + V elements per token per layer
  EXPECT_DOUBLE_EQ(cache.footprint(2092).bits_per_element,
                   (2048 * oscar_bits * token + 44 * 16 * token) / (2092 * token));
  const CacheConfig common = method_cache(shipped.method, {64, 256}, cfg.group, RefereeProtocol::Common);
  EXPECT_EQ(KvCache(common, mc.n_layers, mc.n_kv_heads, mc.head_dim, 2048).block_tokens(), 32);
  EXPECT_NE(shipped.method.shipped.note.find("exactly"), std::string::npos) << shipped.method.shipped.note;
}

// The eviction row at equal bytes (METHODS §5.8): its budget at each ctx is the bits int2 stores at the same windows
// (by hand: b_eff(N) = 2.25 + (S0 + W) 13.75 / N, METHODS §6), and the cache it runs stores int2's bytes at that ctx
// within one token's rows (never more), its prompt the first 15/16; under both protocols it evicts (the as-shipped
// row at kvq's 64/256), and a budget that cannot hold the windows and the tokens after the prompt is refused.
TEST(RefereeMethods, TheEvictionRowStoresTheInt2RowsBytesAtEachContext) {
  const ModelConfig mc = ModelConfig::load(std::string(KVQ_SOURCE_DIR) + "/models/ref/config.json");
  const RefereeMethod& ev = *find_referee_method("evict(int2)");
  const RefereeMethod& int2 = *find_referee_method("int2");
  EXPECT_EQ(ev.equal_bytes, "int2");
  EXPECT_DOUBLE_EQ(method_equal_bytes_bits(ev, {64, 256}, 128, 2048, mc.n_layers, mc.n_kv_heads, mc.head_dim),
                   2.25 + 320 * 13.75 / 2048);
  EXPECT_DOUBLE_EQ(method_equal_bytes_bits(ev, {64, 256}, 128, 8192, mc.n_layers, mc.n_kv_heads, mc.head_dim),
                   2.25 + 320 * 13.75 / 8192);
  EXPECT_DOUBLE_EQ(method_equal_bytes_bits(ev, {0, 0}, 128, 2048, mc.n_layers, mc.n_kv_heads, mc.head_dim), 2.25);
  const double token_bytes = 2.0 * mc.n_kv_heads * mc.head_dim * 2;  // one token's bf16 K and V rows, per layer
  for (const RefereeProtocol protocol : {RefereeProtocol::Common, RefereeProtocol::AsShipped})
    for (const RefereeWindows w : {RefereeWindows{64, 256}, RefereeWindows{16, 64}, RefereeWindows{0, 0}})
      for (const int ctx : {2048, 8192}) {
        if (protocol == RefereeProtocol::AsShipped && w.label() != "64/256") continue;  // one as-shipped setting
        SCOPED_TRACE(protocol_name(protocol) + " " + w.label() + " " + std::to_string(ctx));
        const PlannedRun run{ev, protocol == RefereeProtocol::AsShipped ? ev.shipped.windows : w, false, "k", protocol};
        EXPECT_EQ(run.windows.label(), w.label());
        EXPECT_EQ(method_prompt_policy(ev, protocol), "evict");
        const int P = run_prompt_tokens(run, ctx);
        EXPECT_EQ(P, ctx - ctx / 16);
        CacheConfig c = method_cache(ev, run.windows, 128, protocol);
        c.prompt_policy = parse_prompt_policy(method_prompt_policy(ev, protocol));
        set_equal_bytes_budget(c, ev, run.windows, 128, ctx, mc.n_layers, mc.n_kv_heads, mc.head_dim);
        EXPECT_EQ(c.evict_ctx, ctx);
        const double stored = KvCache(c, mc.n_layers, mc.n_kv_heads, mc.head_dim, 1).footprint(ctx, P)
                                  .bytes_per_token_per_layer * ctx;
        const double want = KvCache(method_cache(int2, run.windows, 128), mc.n_layers, mc.n_kv_heads, mc.head_dim, 1)
                                .footprint(ctx).bytes_per_token_per_layer * ctx;
        EXPECT_LE(stored, want);
        EXPECT_GT(stored, want - token_bytes);
      }
  // 64/256 at 512: int2's 347 tokens' bytes leave 315 prompt tokens after the 32 later ones, fewer than the windows
  CacheConfig c = method_cache(ev, {64, 256}, 128);
  c.prompt_policy = PromptPolicy::kEvict;
  set_equal_bytes_budget(c, ev, {64, 256}, 128, 512, mc.n_layers, mc.n_kv_heads, mc.head_dim);
  EXPECT_THROW(KvCache(c, mc.n_layers, mc.n_kv_heads, mc.head_dim, 1).footprint(512, 480), Error);
  // every other row keeps its cache whatever the ctx
  CacheConfig other = method_cache(int2, {64, 256}, 128);
  set_equal_bytes_budget(other, int2, {64, 256}, 128, 2048, mc.n_layers, mc.n_kv_heads, mc.head_dim);
  EXPECT_EQ(other.evict_bits, 0);
  EXPECT_EQ(other.evict_ctx, 0);
}
