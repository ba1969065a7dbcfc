// The referee's method and rotation tables, and the one translation from a method's cache type to its codecs.
#include "referee/methods.h"

#include <algorithm>
#include <sstream>

#include "codecs/registry.h"
#include "common/error.h"
#include "model/config.h"
#include "rotation/rotation_file.h"

namespace kvq {

namespace {

KvTransform quarot(const ModelConfig& mc) {
  KvTransform t = hadamard_transform(mc.n_layers, mc.n_kv_heads, mc.head_dim);
  t.name = "quarot";
  return t;
}

}  // namespace

const std::vector<RefereeRotation>& referee_rotations() {
  static const std::vector<RefereeRotation> kRotations = {
      {.name = "none"},
      {.name = "quarot", .data_free = quarot},
      {.name = "oscar", .calibrated = true},
      {.name = "optr", .calibrated = true, .learned = true},
      {.name = "pnmix", .calibrated = true, .key_widths = true},
      {.name = "fp8-scales", .calibrated = true, .tensor_scales = true},
  };
  return kRotations;
}

const RefereeRotation& referee_rotation(const std::string& name) {
  const auto& all = referee_rotations();
  auto it = std::find_if(all.begin(), all.end(), [&](const RefereeRotation& r) { return r.name == name; });
  if (it != all.end()) return *it;
  std::string known;
  for (const RefereeRotation& r : all) known += (known.empty() ? "" : ", ") + r.name;
  KVQ_FAIL("unknown referee rotation '{}' (known: {})", name, known);
}

namespace {

// The as-shipped paths of the camps (METHODS §5, research/methods-2026-12.md), one each.
const ShippedPath kBf16Shipped{.defined = true};  // the as-shipped protocol's reference: the same tokens scored
// vLLM: layers 0, 1, L-2, L-1 in BF16 (always, for dense models), no windows, the first prefill chunk attends to exact
// K/V.
const ShippedPath kTurboQuantShipped{.defined = true, .skip_layers = "0,1,-2,-1", .prompt = kPromptExact};
const ShippedPath kNexusShipped{.defined = true, .prompt = kPromptQuantizeAfter};
const ShippedPath kE8_2Shipped{.defined = true, .note = "e8_2 is the camp's llama.cpp port: llama.cpp's path, no "
                                                         "windows, the prompt reads the cache as decode does"};
// OScaR: no sinks, an FP16 residual of the newest n mod 256 tokens (0..255), packed 256 at a time; exact prefill. With
// S0 = 0, W = 0 and B = 256, kvq's qe(t) = floor((t + 1) / 256) · 256 is that schedule exactly (kv/cache.h).
const ShippedPath kOscarShipped{
    .defined = true, .windows = {0, 0}, .demote_block = 256, .prompt = kPromptExact,
    .note = "OScaR ships no sinks and an FP16 residual of the newest n mod 256 tokens (0..255, packed 256 at a time); "
            "kvq's as-shipped row is that schedule exactly: windows 0/0 with a demotion block of 256 "
            "(--kv-demote-block 256), so a query at t reads positions below floor((t + 1) / 256) · 256 through the "
            "codecs and the rest exactly (bf16 rows where OScaR keeps fp16), after an exact prompt"};
const ShippedPath kKittyShipped{
    .defined = true, .windows = {32, 128},
    .note = "Kitty ships sink 32, keys of the unfilled 128-token page in FP16 and values' newest 128 in an FP16 ring; "
            "kvq's 32/128 windows keep 128..255 newest keys exact (Kitty 0..127) and the same values"};
const ShippedPath kLlamaCppShipped{.defined = true};  // no windows, attn_rot on (method_attn_rot), decode-faithful
// vLLM's FP8 caches: no windows; vLLM writes a step's K/V into the cache before its attention reads the pages, so the
// prompt reads the FP8 rows as decode does (kvq's decode-faithful prompt); the per-tensor scale is its default 1.0.
const ShippedPath kVllmFp8Shipped{
    .defined = true,
    .note = "vLLM's fp8 caches ship no windows and read the FP8 pages for the prompt as for decode; kvq's fp8 and "
            "fp8_e5m2 rows store at vLLM's default per-tensor scale 1.0 (a checkpoint's calibrated k_scale / v_scale: "
            "the fp8(scales) row), fp8_per_token_head at its own per-row scales"};
// Eviction: LORE-KV has no public code and AnDPro ships none kvq could read, so there is no camp path to follow.
const ShippedPath kEvictShipped{
    .defined = true, .windows = {64, 256}, .prompt = kPromptEvict,
    .note = "no eviction code is public (LORE-KV none; AnDPro's paper only), so the as-shipped eviction row is the "
            "common row at kvq's 64/256 windows: the same cache, prompt, budget and targets, paired with the "
            "as-shipped rows on those targets"};

}  // namespace

// The table. Plain caches have no rotation; INT2 methods tune their clips; a learned rotation (OptR) takes the clips
// of the row it starts from and is judged against it; a calibrated rotation against the data-free one, that against
// none. The camps' formats (METHODS §5.2-5.5, llama.cpp's types) take no clip: nothing to tune. Rows with a shipped
// path also run as shipped.
const std::vector<RefereeMethod>& referee_methods() {
  static const std::vector<RefereeMethod> kMethods = {
      {.label = "bf16", .key_type = "bf16", .value_type = "bf16", .rotation = "none", .windows_matter = false,
       .quick = true, .shipped = kBf16Shipped},
      {.label = "int8", .key_type = "int8", .value_type = "int8", .rotation = "none", .quick = true},
      {.label = "int4", .key_type = "int4", .value_type = "int4", .rotation = "none"},
      {.label = "kv4rl", .key_type = "int4", .value_type = "int4", .window_type = "int8", .rotation = "none",
       .baseline = "int4",
       .note = "kv4rl is int4 with INT8 sink and recent windows (METHODS §5.6); its body rows are quantized from the "
               "BF16 values, so they equal int4's and the rows differ in the windows only.",
       .camp = "KV4-RL", .kvq_extension = true},
      {.label = "int2", .key_type = "int2", .value_type = "int2", .rotation = "none", .tunes_clips = true,
       .quick = true},
      {.label = "kivi2", .key_type = "kivi2", .value_type = "kivi2", .rotation = "none", .quick = true,
       .camp = "KIVI"},
      {.label = "int2+quarot", .key_type = "int2", .value_type = "int2", .rotation = "quarot", .tunes_clips = true,
       .baseline = "int2", .quick = true,
       .note = "int2+quarot uses the data-free Hadamard rotation (no calibration).", .camp = "QuaRot"},
      {.label = "int2+oscar", .key_type = "int2", .value_type = "int2", .rotation = "oscar", .tunes_clips = true,
       .baseline = "int2+quarot", .quick = true, .camp = "OSCAR"},
      {.label = "optr(quarot)", .key_type = "int2", .value_type = "int2", .rotation = "optr", .base = "quarot",
       .objective = "post-wo", .tunes_clips = true, .clips_from = "int2+quarot", .baseline = "int2+quarot",
       .camp = "OptR"},
      {.label = "optr(oscar)", .key_type = "int2", .value_type = "int2", .rotation = "optr", .base = "oscar",
       .objective = "post-wo", .tunes_clips = true, .clips_from = "int2+oscar", .baseline = "int2+oscar",
       .leakage = true, .quick = true, .camp = "OptR"},
      {.label = "optr-joint(oscar)", .key_type = "int2", .value_type = "int2", .rotation = "optr", .base = "oscar",
       .objective = "joint", .tunes_clips = true, .clips_from = "int2+oscar", .baseline = "int2+oscar",
       .camp = "OptR"},
      {.label = "optr-pre-wo(oscar)", .key_type = "int2", .value_type = "int2", .rotation = "optr", .base = "oscar",
       .objective = "pre-wo", .tunes_clips = true, .clips_from = "int2+oscar", .baseline = "int2+oscar",
       .camp = "OptR"},
      {.label = "optr-recon(oscar)", .key_type = "int2", .value_type = "int2", .rotation = "optr", .base = "oscar",
       .objective = "recon", .tunes_clips = true, .clips_from = "int2+oscar", .baseline = "int2+oscar",
       .camp = "OptR"},
      // PN-Mix (METHODS §5.7, kvq's definition: no primary source): key widths per RoPE pair calibrated on
      // --calib-data at an average of 2 code bits per element, values int2; the energy score as the ablation.
      {.label = "pnmix", .key_type = "pnmix", .value_type = "int2", .rotation = "pnmix", .pnmix_score = "product",
       .baseline = "int2",
       .note = "pnmix keys take 2 code bits per element on average (widths per RoPE pair from the calibration "
               "traces) plus one fp16 scale/zero per width slot and row: the bits counted are what is stored (3.0 "
               "per key element at d = 128, four slots), not the budget.",
       .camp = "PN-Mix"},
      {.label = "pnmix(energy)", .key_type = "pnmix", .value_type = "int2", .rotation = "pnmix",
       .pnmix_score = "energy", .baseline = "int2", .camp = "PN-Mix"},
      // PN-Mix at int2's bits (METHODS §6: compare at equal b_eff): 1.5 code bits per key element on average; with
      // the width slots models/ref's calibration gives (1..3 bits: three), its key rows are int2's 36 bytes.
      {.label = "pnmix(1.5b)", .key_type = "pnmix", .value_type = "int2", .rotation = "pnmix",
       .pnmix_score = "product", .pnmix_key_bits = 1.5, .baseline = "int2",
       .note = "pnmix at 1.5 code bits per key element, so that its stored key rows (code bits plus one fp16 "
               "scale/zero per width slot) match int2's bytes: the equal-bits PN-Mix row.",
       .camp = "PN-Mix"},
      // TurboQuant: vLLM's four presets and kvq's 2-bit extension (codec_presets(), METHODS §5.2).
      {.label = "turboquant_k8v4", .key_type = "fp8e4m3", .value_type = "tqv4", .rotation = "none",
       .camp = "TurboQuant (vLLM)", .shipped = kTurboQuantShipped},
      {.label = "turboquant_4bit_nc", .key_type = "tq4nc", .value_type = "tqv4", .rotation = "none",
       .camp = "TurboQuant (vLLM)", .shipped = kTurboQuantShipped},
      {.label = "turboquant_k3v4_nc", .key_type = "tq3nc", .value_type = "tqv4", .rotation = "none",
       .camp = "TurboQuant (vLLM)", .shipped = kTurboQuantShipped},
      {.label = "turboquant_3bit_nc", .key_type = "tq3nc", .value_type = "tqv3", .rotation = "none",
       .camp = "TurboQuant (vLLM)", .shipped = kTurboQuantShipped},
      {.label = "turboquant_2bit", .key_type = "tq2nc", .value_type = "tqv2", .rotation = "none", .quick = true,
       .note = "turboquant_2bit is kvq's extension of TurboQuant (2-bit norm-corrected keys, 2-bit values); vLLM "
               "ships no 2-bit preset. Its as-shipped row follows vLLM's path for the other presets.",
       .camp = "TurboQuant (vLLM)", .kvq_extension = true, .shipped = kTurboQuantShipped},
      // vLLM's FP8 caches (codecs/fp8/fp8.h): --kv-cache-dtype fp8 (e4m3), fp8_e5m2 and fp8_per_token_head.
      {.label = "fp8", .key_type = "fp8e4m3", .value_type = "fp8e4m3", .rotation = "none", .camp = "vLLM (FP8)",
       .shipped = kVllmFp8Shipped},
      // A checkpoint's calibrated scales (the static per-tensor scheme FP8 checkpoints ship): kvq calibrate --method
      // fp8-scales on --calib-data, s = amax / 448 per layer for keys and for values (METHODS §5.10).
      {.label = "fp8(scales)", .key_type = "fp8e4m3", .value_type = "fp8e4m3", .rotation = "fp8-scales",
       .baseline = "fp8",
       .note = "fp8(scales) is vLLM's fp8 with per-tensor scales calibrated on --calib-data as FP8 checkpoints ship "
               "them (k_scale, v_scale = each layer's largest |key|, |value| / 448; kvq calibrate --method "
               "fp8-scales), judged against fp8 at vLLM's default scale 1.0.",
       .camp = "vLLM (FP8)", .shipped = kVllmFp8Shipped},
      {.label = "fp8_e5m2", .key_type = "fp8e5m2", .value_type = "fp8e5m2", .rotation = "none", .camp = "vLLM (FP8)",
       .shipped = kVllmFp8Shipped},
      {.label = "fp8_per_token_head", .key_type = "fp8_per_token_head", .value_type = "fp8_per_token_head",
       .rotation = "none", .camp = "vLLM (FP8)", .shipped = kVllmFp8Shipped},
      // NexusQuant (METHODS §5.3): the shipped int8 E8 codec and the camp's 2-bit llama.cpp block.
      {.label = "nexusquant", .key_type = "nexusquant", .value_type = "nexusquant", .rotation = "none",
       .camp = "NexusQuant", .shipped = kNexusShipped},
      {.label = "e8_2", .key_type = "e8_2", .value_type = "e8_2", .rotation = "none", .quick = true,
       .camp = "NexusQuant", .shipped = kE8_2Shipped},
      // OScaR and Kitty (METHODS §5.4, §5.5).
      {.label = "oscar_int2", .key_type = "oscar_int2", .value_type = "oscar_int2", .rotation = "none",
       .camp = "OScaR", .shipped = kOscarShipped},
      {.label = "kitty_int2", .key_type = "kitty_int2", .value_type = "kitty_int2", .rotation = "none", .quick = true,
       .camp = "Kitty", .shipped = kKittyShipped},
      {.label = "kitty_int2_20", .key_type = "kitty_int2_20", .value_type = "kitty_int2_20", .rotation = "none",
       .camp = "Kitty", .shipped = kKittyShipped},
      // Eviction at equal bytes (METHODS §5.8): a bf16 cache keeping sinks, the recent window and the prompt tokens of
      // highest AnDPro-style score, as many as int2 at the same windows stores at each ctx.
      {.label = "evict(int2)", .key_type = "bf16", .value_type = "bf16", .rotation = "none", .baseline = "int2",
       .quick = true,
       .note = "evict(int2) is eviction at equal bytes (METHODS §5.8; an AnDPro-style score, LORE-KV has no public "
               "code): a bf16 cache that, once after a prompt of the first 15/16 of each window, keeps the sinks, the "
               "recent window and the prompt tokens of highest score, as many as make its bytes at the ctx those int2 "
               "stores at the same windows; the last 1/16 (generated after the prompt) is kept bf16, counted at 16 "
               "bits inside that budget, and is all that is scored (paired with the other runs on the same targets).",
       .camp = "LORE-KV (AnDPro-style)", .equal_bytes = "int2", .shipped = kEvictShipped},
      // llama.cpp's KV cache types (issue #23), -ctk/-ctv as users run them.
      {.label = "q8_0", .key_type = "q8_0", .value_type = "q8_0", .rotation = "none", .camp = "llama.cpp",
       .shipped = kLlamaCppShipped},
      {.label = "q8_0/q4_0", .key_type = "q8_0", .value_type = "q4_0", .rotation = "none", .camp = "llama.cpp",
       .shipped = kLlamaCppShipped},
      {.label = "q5_0", .key_type = "q5_0", .value_type = "q5_0", .rotation = "none", .camp = "llama.cpp",
       .shipped = kLlamaCppShipped},
      {.label = "q4_1", .key_type = "q4_1", .value_type = "q4_1", .rotation = "none", .camp = "llama.cpp",
       .shipped = kLlamaCppShipped},
      {.label = "q4_0", .key_type = "q4_0", .value_type = "q4_0", .rotation = "none", .quick = true,
       .camp = "llama.cpp", .shipped = kLlamaCppShipped},
      {.label = "iq4_nl", .key_type = "iq4_nl", .value_type = "iq4_nl", .rotation = "none", .camp = "llama.cpp",
       .shipped = kLlamaCppShipped},
  };
  return kMethods;
}

const RefereeMethod* find_referee_method(const std::string& label) {
  const auto& all = referee_methods();
  auto it = std::find_if(all.begin(), all.end(), [&](const RefereeMethod& m) { return m.label == label; });
  return it == all.end() ? nullptr : &*it;
}

std::vector<RefereeMethod> parse_referee_methods(const std::string& list) {
  std::vector<RefereeMethod> out;
  std::stringstream ss(list);
  std::string known;
  for (const RefereeMethod& m : referee_methods()) known += (known.empty() ? "" : ", ") + m.label;
  for (std::string t; std::getline(ss, t, ',');) {
    const RefereeMethod* m = find_referee_method(t);
    KVQ_CHECK(m, "unknown referee method '{}' (known: {})", t, known);
    KVQ_CHECK(std::none_of(out.begin(), out.end(), [&](const RefereeMethod& o) { return o.label == t; }),
              "referee method '{}' is listed twice", t);
    out.push_back(*m);
  }
  KVQ_CHECK(!out.empty() && list.back() != ',', "bad method list '{}' (known: {})", list, known);
  return out;
}

std::string RefereeWindows::label() const { return std::to_string(sink) + "/" + std::to_string(recent); }

std::vector<RefereeWindows> parse_referee_windows(const std::string& list) {
  std::vector<RefereeWindows> out;
  std::stringstream ss(list);
  auto number = [&](const std::string& s) {
    KVQ_CHECK(!s.empty() && s.size() <= 7 && std::all_of(s.begin(), s.end(), ::isdigit),
              "bad window setting list '{}': '{}' is not a non-negative integer (e.g. 64/256,0/0)", list, s);
    return std::stoi(s);
  };
  for (std::string t; std::getline(ss, t, ',');) {
    const size_t slash = t.find('/');
    KVQ_CHECK(slash != std::string::npos, "bad window setting '{}' in '{}' (sink/recent, e.g. 64/256)", t, list);
    RefereeWindows w{number(t.substr(0, slash)), number(t.substr(slash + 1))};
    KVQ_CHECK(std::none_of(out.begin(), out.end(), [&](const RefereeWindows& o) { return o.label() == w.label(); }),
              "window setting '{}' is listed twice", w.label());
    out.push_back(w);
  }
  KVQ_CHECK(!out.empty() && list.back() != ',', "bad window setting list '{}' (e.g. 64/256,16/64,0/0)", list);
  return out;
}

std::string referee_quick_methods() {
  std::string list;
  for (const RefereeMethod& m : referee_methods())
    if (m.quick) list += (list.empty() ? "" : ",") + m.label;
  return list;
}

CodecSpec method_codec_spec(const std::string& type, bool is_key) {
  return codec_spec(type, is_key, kDefaultGroup, 0.f);  // the caller sets the group
}

std::string protocol_name(RefereeProtocol p) { return p == RefereeProtocol::Common ? "common" : "as-shipped"; }

std::vector<RefereeProtocol> parse_referee_protocols(const std::string& list) {
  std::vector<RefereeProtocol> out;
  std::stringstream ss(list);
  for (std::string t; std::getline(ss, t, ',');) {
    KVQ_CHECK(t == "common" || t == "as-shipped", "unknown referee protocol '{}' (known: common, as-shipped)", t);
    const RefereeProtocol p = t == "common" ? RefereeProtocol::Common : RefereeProtocol::AsShipped;
    KVQ_CHECK(std::find(out.begin(), out.end(), p) == out.end(), "referee protocol '{}' is listed twice", t);
    out.push_back(p);
  }
  KVQ_CHECK(!out.empty() && list.back() != ',', "bad protocol list '{}' (common, as-shipped or both)", list);
  return out;
}

CacheConfig method_cache(const RefereeMethod& m, const RefereeWindows& w, int group, RefereeProtocol protocol) {
  const bool shipped = protocol == RefereeProtocol::AsShipped;
  KVQ_CHECK(!shipped || m.shipped.defined, "referee method '{}' has no as-shipped path", m.label);
  CacheConfig c;
  c.k = method_codec_spec(m.key_type, true);
  c.v = method_codec_spec(m.value_type, false);
  for (CodecSpec* spec : {&c.k, &c.v})  // a format with its own groups (OScaR, llama.cpp's blocks) keeps them
    if (codec_traits(spec->type).grouped) spec->group = group;
  c.window = m.window_type;
  const RefereeWindows& win = shipped ? m.shipped.windows : w;
  c.sink = win.sink;
  c.recent = win.recent;
  if (shipped) c.demote_block = m.shipped.demote_block;
  if (shipped) c.skip_layers = parse_skip_layers(m.shipped.skip_layers);
  return c;
}

bool method_attn_rot(const RefereeMethod& m, RefereeProtocol protocol) {
  const CodecSpec k = method_codec_spec(m.key_type, true), v = method_codec_spec(m.value_type, false);
  return implied_transform(k, v) == CodecTransform::kAttnRot && protocol == RefereeProtocol::AsShipped;
}

std::shared_ptr<const KvTransform> method_transform(const RefereeMethod& m, RefereeProtocol protocol,
                                                    const CacheConfig& cache, int n_layers, int n_kv_heads,
                                                    int head_dim) {
  if (implied_transform(cache.k, cache.v) == CodecTransform::kAttnRot && !method_attn_rot(m, protocol)) return nullptr;
  return codec_transform(cache, n_layers, n_kv_heads, head_dim);
}

std::string method_prompt_policy(const RefereeMethod& m, RefereeProtocol protocol) {
  if (m.evicts()) return kPromptEvict;  // the decision after the prompt is the method, under both protocols
  return protocol == RefereeProtocol::AsShipped ? m.shipped.prompt : kPromptDecodeFaithful;
}

double method_equal_bytes_bits(const RefereeMethod& m, const RefereeWindows& w, int group, int ctx, int n_layers,
                               int n_kv_heads, int head_dim) {
  const RefereeMethod* paired = find_referee_method(m.equal_bytes);
  KVQ_CHECK(paired && !paired->evicts(), "referee method '{}': its equal-bytes row '{}' is not a quantized row",
            m.label, m.equal_bytes);
  return cache_layout(method_cache(*paired, w, group), n_layers, n_kv_heads, head_dim).footprint(ctx)
      .bits_per_element;
}

void set_equal_bytes_budget(CacheConfig& c, const RefereeMethod& m, const RefereeWindows& w, int group, int ctx,
                            int n_layers, int n_kv_heads, int head_dim) {
  if (!m.evicts()) return;
  c.evict_bits = method_equal_bytes_bits(m, w, group, ctx, n_layers, n_kv_heads, head_dim);
  c.evict_ctx = ctx;
}

}  // namespace kvq
