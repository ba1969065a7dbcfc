#include "kv/codec_registry.h"

#include <array>

#include "common/error.h"
#include "kv/codec_bf16.h"
#include "kv/codec_f32.h"
#include "kv/codec_int.h"
#include "kv/codec_kivi.h"
#include "kv/codec_kitty.h"
#include "kv/codec_llamacpp.h"
#include "kv/codec_nexus.h"
#include "kv/codec_oscar.h"
#include "kv/codec_pnmix.h"
#include "kv/codec_turboquant.h"

namespace kvq {

namespace {

// CPU factories, one per codec family; the row supplies the bits (specs are validated by make_codec).
std::unique_ptr<KvCodec> make_f32(const CodecSpec& s, SimdLevel) { return std::make_unique<F32Codec>(s.head_dim); }
std::unique_ptr<KvCodec> make_bf16(const CodecSpec& s, SimdLevel level) {
  return std::make_unique<Half16Codec>(RowFormat::kBf16, s.head_dim, level);
}
std::unique_ptr<KvCodec> make_int(const CodecSpec& s, SimdLevel level) {
  return std::make_unique<IntCodec>(s.type, s.head_dim, s.group, codec_traits(s.type).code_bits, s.clip, level);
}
// KIVI: keys per channel over G-token blocks, values per-token rows of the same bits.
std::unique_ptr<KvCodec> make_kivi(const CodecSpec& s, SimdLevel level) {
  const int bits = codec_traits(s.type).code_bits;
  if (s.per_channel) return std::make_unique<KiviKeyCodec>(s.head_dim, s.group, bits, s.clip, level);
  return make_int(s, level);
}
// Kitty: keys per channel over 128-token blocks with boost_percent of the channels at 4 bits, values per token.
template <int kBoostPercent>
std::unique_ptr<KvCodec> make_kitty(const CodecSpec& s, SimdLevel level) {
  if (s.per_channel) return std::make_unique<KittyKeyCodec>(s.type, s.head_dim, kBoostPercent, level);
  return std::make_unique<KittyValueCodec>(s.type, s.head_dim, level);
}

// NexusQuant: the storage format and the E8 rule of each row (keys without RoPE: kv/codec_rope.h, by the cache).
std::unique_ptr<KvCodec> make_nexus(const CodecSpec& s, SimdLevel level) {
  const CodecId id = codec_traits(s.type).id;
  const bool int8 = id == CodecId::kNexusquant || id == CodecId::kNexusquantStrict;
  const bool strict = id == CodecId::kNexusquantStrict || id == CodecId::kE8_2Strict;
  return std::make_unique<NexusCodec>(s.type, s.head_dim, int8 ? NexusFormat::kInt8 : NexusFormat::kE8_2,
                                      strict ? E8Rule::kStrict : E8Rule::kShipped, level);
}

// OScaR: keys (per_channel) in blocks of 32 tokens, values per-token rows; both fix their groups at 32.
std::unique_ptr<KvCodec> make_oscar(const CodecSpec& s, SimdLevel level) {
  if (s.per_channel) return std::make_unique<OscarKeyCodec>(s.head_dim, level);
  return std::make_unique<OscarValueCodec>(s.head_dim, level);
}

// TurboQuant: codebook keys (norm-corrected or not), FP8 keys, uniform values; the row supplies the bits.
std::unique_ptr<KvCodec> make_tq_key(const CodecSpec& s, SimdLevel level) {
  return std::make_unique<TqKeyCodec>(s.type, s.head_dim, codec_traits(s.type).code_bits, false, level);
}
std::unique_ptr<KvCodec> make_tq_key_nc(const CodecSpec& s, SimdLevel level) {
  return std::make_unique<TqKeyCodec>(s.type, s.head_dim, codec_traits(s.type).code_bits, true, level);
}
std::unique_ptr<KvCodec> make_fp8(const CodecSpec& s, SimdLevel level) {
  return std::make_unique<Fp8Codec>(s.head_dim, level);
}
std::unique_ptr<KvCodec> make_tq_value(const CodecSpec& s, SimdLevel level) {
  return std::make_unique<TqValueCodec>(s.type, s.head_dim, codec_traits(s.type).code_bits, level);
}
// llama.cpp's cache types: f16 rows; blocks of 32 values (the row's id names the block type).
std::unique_ptr<KvCodec> make_f16(const CodecSpec& s, SimdLevel level) {
  return std::make_unique<Half16Codec>(RowFormat::kF16, s.head_dim, level);
}
std::unique_ptr<KvCodec> make_llamacpp(const CodecSpec& s, SimdLevel level) {
  return std::make_unique<LlamaCppCodec>(codec_traits(s.type).id, s.head_dim, level);
}

// PN-Mix keys: the head's widths from the calibration table (kv/codec_pnmix.h).
std::unique_ptr<KvCodec> make_pnmix(const CodecSpec& s, SimdLevel) { return make_pnmix_key_codec(s); }

constexpr std::string_view kF32Aliases[] = {"fp32", "float32"};
constexpr std::string_view kFp8Aliases[] = {"fp8_e4m3"};
constexpr std::string_view kBf16Aliases[] = {"bfloat16"};
constexpr std::string_view kF16Aliases[] = {"fp16", "float16"};

// clang-format off
// id            name     aliases       summary                                                              bits grouped clip   clip_k clip_v per_ch transform fq    factory
constexpr std::array kTable{
  CodecTraits{CodecId::kF32,   "f32",   kF32Aliases,  "float32 rows, lossless (reference cache)",                       32, false, false, 1.0f,  1.0f,  false, "none", false, make_f32},
  CodecTraits{CodecId::kBf16,  "bf16",  kBf16Aliases, "bfloat16 rows",                                                  16, false, false, 1.0f,  1.0f,  false, "none", false, make_bf16},
  CodecTraits{CodecId::kInt8,  "int8",  {},           "8-bit codes per token, fp16 scale/zero per group of G values",  8,  true,  true,  1.0f,  1.0f,  false, "none", true,  make_int},
  CodecTraits{CodecId::kInt4,  "int4",  {},           "4-bit codes per token, fp16 scale/zero per group of G values",  4,  true,  true,  1.0f,  1.0f,  false, "none", true,  make_int},
  CodecTraits{CodecId::kInt2,  "int2",  {},           "2-bit codes per token, fp16 scale/zero per group of G values",  2,  true,  true,  0.96f, 0.92f, false, "none", true,  make_int},
  CodecTraits{CodecId::kKivi2, "kivi2", {},           "KIVI: keys per channel over G tokens, values per token, 2 bits", 2,  true,  false, 1.0f,  1.0f,  true,  "none", false, make_kivi},
  CodecTraits{CodecId::kKivi4, "kivi4", {},           "KIVI: keys per channel over G tokens, values per token, 4 bits", 4,  true,  false, 1.0f,  1.0f,  true,  "none", false, make_kivi},
  // NexusQuant (METHODS §5.3): the Hadamard is inside the codec (no cache transform), fp16 scale per row (2 row
  // bytes), power-of-two head_dim; keys stored without RoPE except in the post-RoPE ablation.
  CodecTraits{CodecId::kNexusquant,       "nexusquant",        {}, "NexusQuant E8, shipped rule, L=4: int8 2·p, fp16 scale", 8, false, false, 1.0f, 1.0f, false, "none", false, make_nexus, 2, true, true},
  CodecTraits{CodecId::kNexusquantStrict, "nexusquant_strict", {}, "nexusquant, strict Conway-Sloane E8 (ablation)",         8, false, false, 1.0f, 1.0f, false, "none", false, make_nexus, 2, true, true},
  CodecTraits{CodecId::kE8_2,             "e8_2",              {}, "E8_2: 2-bit levels ±0.5, ±1.5 · d, fp16 d = max|y|/2",  2, false, false, 1.0f, 1.0f, false, "none", false, make_nexus, 2, true, true},
  CodecTraits{CodecId::kE8_2Strict,       "e8_2_strict",       {}, "e8_2, strict D8 + 1/2 parity (ablation)",                2, false, false, 1.0f, 1.0f, false, "none", false, make_nexus, 2, true, true},
  CodecTraits{CodecId::kE8_2PostRope,     "e8_2_postrope",     {}, "e8_2 on post-RoPE keys (ablation)",                      2, false, false, 1.0f, 1.0f, false, "none", false, make_nexus, 2, true, false},
  // OScaR (METHODS §5.4): groups fixed at 32, keys token-scaled, the Hadamard transform.
  CodecTraits{CodecId::kOscarInt2, "oscar_int2", {}, "OScaR: keys / their norm over kv heads, per channel over 32 tokens; values per token over 32 channels; 2 bits",
              2, false, false, 1.0f, 1.0f, true, kTransformHadamard, false, make_oscar, 0, false, false, true},
  // Kitty (METHODS §5.5): per-channel keys over 128-token blocks, a quarter (or a fifth) of the channels at 4 bits.
  CodecTraits{CodecId::kKitty2, "kitty_int2", {},     "Kitty: keys per channel over 128-token blocks, the 25% of channels of largest mean |k| at 4 bits, the rest 2; values per token, 2 bits", 2, false, false, 1.0f, 1.0f, true, "none", false, make_kitty<25>},
  CodecTraits{CodecId::kKitty2At20, "kitty_int2_20", {}, "Kitty as in its accuracy runs: as kitty_int2 with 20% of the key channels at 4 bits", 2, false, false, 1.0f, 1.0f, true, "none", false, make_kitty<20>},
  // TurboQuant (METHODS §5.2, kv/turboquant.h): per-row parameter bytes (fp16 norm; fp16 scale and min), keys only
  CodecTraits{CodecId::kTq2,     "tq2",     {},          "TurboQuant keys: 2-bit Lloyd-Max codes of the rotated unit key, fp16 norm", 2, false, false, 1.0f, 1.0f, false, kTransformHadamardKeys, false, make_tq_key, 2, false, false, false, true},
  CodecTraits{CodecId::kTq3,     "tq3",     {},          "TurboQuant keys: 3-bit Lloyd-Max codes of the rotated unit key, fp16 norm", 3, false, false, 1.0f, 1.0f, false, kTransformHadamardKeys, false, make_tq_key, 2, false, false, false, true},
  CodecTraits{CodecId::kTq4,     "tq4",     {},          "TurboQuant keys: 4-bit Lloyd-Max codes of the rotated unit key, fp16 norm", 4, false, false, 1.0f, 1.0f, false, kTransformHadamardKeys, false, make_tq_key, 2, false, false, false, true},
  CodecTraits{CodecId::kTq2nc,   "tq2nc",   {},          "TurboQuant keys as tq2, norm-corrected (n c / ||c||)",                     2, false, false, 1.0f, 1.0f, false, kTransformHadamardKeys, false, make_tq_key_nc, 2, false, false, false, true},
  CodecTraits{CodecId::kTq3nc,   "tq3nc",   {},          "TurboQuant keys as tq3, norm-corrected (n c / ||c||)",                     3, false, false, 1.0f, 1.0f, false, kTransformHadamardKeys, false, make_tq_key_nc, 2, false, false, false, true},
  CodecTraits{CodecId::kTq4nc,   "tq4nc",   {},          "TurboQuant keys as tq4, norm-corrected (n c / ||c||)",                     4, false, false, 1.0f, 1.0f, false, kTransformHadamardKeys, false, make_tq_key_nc, 2, false, false, false, true},
  CodecTraits{CodecId::kFp8e4m3, "fp8e4m3", kFp8Aliases, "FP8 e4m3 values, no scale, saturating (TurboQuant k8v4 keys)",         8, false, false, 1.0f, 1.0f, false, "none", false, make_fp8},
  CodecTraits{CodecId::kTqv2,    "tqv2",    {},          "TurboQuant values: 2-bit codes per row, fp16 scale and min",              2, false, false, 1.0f, 1.0f, false, "none", false, make_tq_value, 4},
  CodecTraits{CodecId::kTqv3,    "tqv3",    {},          "TurboQuant values: 3-bit codes per row, fp16 scale and min",              3, false, false, 1.0f, 1.0f, false, "none", false, make_tq_value, 4},
  CodecTraits{CodecId::kTqv4,    "tqv4",    {},          "TurboQuant values: 4-bit codes per row, fp16 scale and min",              4, false, false, 1.0f, 1.0f, false, "none", false, make_tq_value, 4},
  // llama.cpp's -ctk / -ctv types (docs/research/llamacpp-kv.md): f16 rows; blocks of 32 values with an fp16 scale,
  // bit-exact to its reference quantizers, rotated by its attn_rot; fixed formats (no row bytes): the bits, 8.5, 5.5,
  // 5, 4.5 and 4.5, are their blocks' bytes (kv/llamacpp_blocks.h).
  CodecTraits{CodecId::kF16,   "f16",   kF16Aliases,  "IEEE half rows (llama.cpp's default cache type)",                16, false, false, 1.0f,  1.0f,  false, "none", false, make_f16},
  CodecTraits{CodecId::kQ8_0,  "q8_0",  {},           "llama.cpp q8_0: blocks of 32, fp16 absmax scale, 8-bit codes",   8,  false, false, 1.0f,  1.0f,  false, kTransformAttnRot, false, make_llamacpp},
  CodecTraits{CodecId::kQ5_0,  "q5_0",  {},           "llama.cpp q5_0: blocks of 32, fp16 absmax scale, 5-bit codes",   5,  false, false, 1.0f,  1.0f,  false, kTransformAttnRot, false, make_llamacpp},
  CodecTraits{CodecId::kQ4_1,  "q4_1",  {},           "llama.cpp q4_1: blocks of 32, fp16 scale and min, 4-bit codes",  4,  false, false, 1.0f,  1.0f,  false, kTransformAttnRot, false, make_llamacpp},
  CodecTraits{CodecId::kQ4_0,  "q4_0",  {},           "llama.cpp q4_0: blocks of 32, fp16 absmax scale, 4-bit codes",   4,  false, false, 1.0f,  1.0f,  false, kTransformAttnRot, false, make_llamacpp},
  CodecTraits{CodecId::kIq4Nl, "iq4_nl", {},          "llama.cpp iq4_nl: blocks of 32, fp16 scale, 4-bit table codes",  4,  false, false, 1.0f,  1.0f,  false, kTransformAttnRot, false, make_llamacpp},
  // PN-Mix (METHODS §5.7, kvq's definition): keys only, 1-4 bits per RoPE pair from a calibration file (--pnmix),
  // one codec per (layer, kv head); code_bits is the default average, the file's budget is what is stored. The
  // §1 grid per width group, with its key clip.
  CodecTraits{CodecId::kPnmix, "pnmix", {}, "PN-Mix keys: 1-4 bits per RoPE channel pair (--pnmix FILE from kvq calibrate), fp16 scale/zero per width group",
              2, false, true, 0.96f, 1.0f, false, "none", false, make_pnmix, 0, false, false, false, true, true},
};

// The --kv-cache-dtype presets: vLLM's TurboQuant presets (TQ_PRESETS: key bits / value bits / norm correction), then
// kvq's own. Their layer policy as shipped (layers 0, 1, L-2, L-1 in BF16) and window sizes are not part of a preset;
// the window codec is (bf16 unless named: KV4-RL's INT8 windows, METHODS §5.6).
constexpr std::array kPresets{
  CodecPreset{"turboquant_k8v4",    CodecId::kFp8e4m3, CodecId::kTqv4, "vLLM TurboQuant: FP8 keys, 4-bit values", false},
  CodecPreset{"turboquant_4bit_nc", CodecId::kTq4nc,   CodecId::kTqv4, "vLLM TurboQuant: 4-bit norm-corrected keys, 4-bit values", false},
  CodecPreset{"turboquant_k3v4_nc", CodecId::kTq3nc,   CodecId::kTqv4, "vLLM TurboQuant: 3-bit norm-corrected keys, 4-bit values", false},
  CodecPreset{"turboquant_3bit_nc", CodecId::kTq3nc,   CodecId::kTqv3, "vLLM TurboQuant: 3-bit norm-corrected keys, 3-bit values", false},
  CodecPreset{"turboquant_2bit",    CodecId::kTq2nc,   CodecId::kTqv2, "kvq extension: 2-bit norm-corrected keys, 2-bit values", true},
  CodecPreset{"kv4rl",              CodecId::kInt4,    CodecId::kInt4, "KV4-RL (kvq's definition): int4 keys and values, INT8 sink and recent windows", true, CodecId::kInt8},
};
// clang-format on

constexpr bool rows_in_id_order() {
  for (size_t i = 0; i < kTable.size(); ++i)
    if (size_t(kTable[i].id) != i) return false;
  return true;
}
static_assert(rows_in_id_order(), "codec table rows must be in CodecId order");

}  // namespace

std::span<const CodecTraits> codec_table() { return kTable; }

const CodecTraits& codec_traits(CodecId id) { return kTable.at(size_t(id)); }

const CodecTraits* find_codec(std::string_view name) {
  for (const CodecTraits& t : kTable) {
    if (t.name == name) return &t;
    for (std::string_view a : t.aliases)
      if (a == name) return &t;
  }
  return nullptr;
}

std::span<const CodecPreset> codec_presets() { return kPresets; }

const CodecPreset* find_preset(std::string_view name) {
  for (const CodecPreset& p : kPresets)
    if (p.name == name) return &p;
  return nullptr;
}

std::string preset_names(std::string_view sep) {
  std::string out;
  for (const CodecPreset& p : kPresets)
    out += fmt::format("{}{} ({} / {}{}{})", out.empty() ? "" : std::string(sep), p.name, codec_traits(p.k).name,
                       codec_traits(p.v).name,
                       p.window == CodecId::kBf16 ? "" : fmt::format(", {} windows", codec_traits(p.window).name),
                       p.kvq_extension ? ", kvq extension" : "");
  return out;
}

std::string_view implied_transform(const CodecSpec& k, const CodecSpec& v) {
  const std::string_view tk = codec_traits(k.type).transform, tv = codec_traits(v.type).transform;
  KVQ_CHECK(tk == kTransformNone || tv == kTransformNone || tk == tv,
            "cache types k={} and v={} imply different transforms ({}, {})", k.type, v.type, tk, tv);
  return tk != kTransformNone ? tk : tv;
}

const CodecTraits& codec_traits(std::string_view name) {
  const CodecTraits* t = find_codec(name);
  KVQ_CHECK(t, "unknown KV cache type '{}' (supported: {})", name, codec_names(", "));
  return *t;
}

CodecSpec codec_spec(std::string_view type, bool is_key, int group, float clip) {
  const CodecTraits& t = codec_traits(type);
  KVQ_CHECK(clip <= 0 || t.takes_clip, "--kv-clip-{}: cache type '{}' takes no clip ({})", is_key ? "k" : "v", t.name,
            t.grouped ? "it is plain min/max"
                      : t.code_bits >= 16 ? "it stores unquantized rows" : "its format has no clip");
  CodecSpec s;
  s.type = std::string(t.name);
  s.group = group;
  s.clip = clip > 0 ? clip : (is_key ? t.default_clip_k : t.default_clip_v);
  s.per_channel = is_key && t.per_channel_keys;
  s.token_scale = is_key && t.token_scale_keys;
  return s;
}

}  // namespace kvq
