#include "codecs/registry.h"

#include <array>

#include "codecs/half/codec_bf16.h"
#include "codecs/fp8/codec_fp8.h"
#include "codecs/half/codec_f32.h"
#include "codecs/int/codec_int.h"
#include "codecs/kitty/codec_kitty.h"
#include "codecs/kivi/codec_kivi.h"
#include "codecs/llamacpp/codec_llamacpp.h"
#include "codecs/nexus/codec_nexus.h"
#include "codecs/oscar/codec_oscar.h"
#include "codecs/pnmix/codec_pnmix.h"
#include "codecs/turboquant/codec_turboquant.h"
#include "common/error.h"

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
std::unique_ptr<KvCodec> make_tq_value(const CodecSpec& s, SimdLevel level) {
  return std::make_unique<TqValueCodec>(s.type, s.head_dim, codec_traits(s.type).code_bits, level);
}
// vLLM's FP8 caches: e4m3 or e5m2 codes, an fp32 scale per row for the per-token-head row.
std::unique_ptr<KvCodec> make_fp8(const CodecSpec& s, SimdLevel level) {
  const CodecId id = codec_traits(s.type).id;
  return std::make_unique<Fp8Codec>(s.type, fp8::format_of(id),
                                    id == CodecId::kFp8PerTokenHead, s.head_dim, level, s.tensor_scale);
}
// llama.cpp's cache types: f16 rows; blocks of 32 values (the row's id names the block type).
std::unique_ptr<KvCodec> make_f16(const CodecSpec& s, SimdLevel level) {
  return std::make_unique<Half16Codec>(RowFormat::kF16, s.head_dim, level);
}
std::unique_ptr<KvCodec> make_llamacpp(const CodecSpec& s, SimdLevel level) {
  return std::make_unique<LlamaCppCodec>(codec_traits(s.type).id, s.head_dim, level);
}

// PN-Mix keys: the head's widths from the calibration table (codecs/pnmix/codec_pnmix.h).
std::unique_ptr<KvCodec> make_pnmix(const CodecSpec& s, SimdLevel) { return make_pnmix_key_codec(s); }

constexpr std::string_view kF32Aliases[] = {"fp32", "float32"};
constexpr std::string_view kFp8Aliases[] = {"fp8", "fp8_e4m3"};
constexpr std::string_view kFp8e5m2Aliases[] = {"fp8_e5m2"};
constexpr std::string_view kBf16Aliases[] = {"bfloat16"};
constexpr std::string_view kF16Aliases[] = {"fp16", "float16"};

// Rows name only what differs from CodecTraits' defaults. clang-format keeps its hands off the alignment.
// clang-format off
constexpr std::array kTable{
  CodecTraits{.id = CodecId::kF32,  .name = "f32",  .aliases = kF32Aliases,
              .summary = "float32 rows, lossless (reference cache)",
              .code_bits = 32, .make = make_f32, .head_dim_unit = 16},
  CodecTraits{.id = CodecId::kBf16, .name = "bf16", .aliases = kBf16Aliases,
              .summary = "bfloat16 rows",
              .code_bits = 16, .make = make_bf16, .head_dim_unit = 16},
  // The METHODS §1 grid per token: fp16 scale / zero per group of G values, the quantile clip, fake-quantized by
  // calibration.
  CodecTraits{.id = CodecId::kInt8, .name = "int8",
              .summary = "8-bit codes per token, fp16 scale/zero per group of G values",
              .code_bits = 8, .grouped = true, .takes_clip = true, .fake_quant = true, .make = make_int},
  CodecTraits{.id = CodecId::kInt4, .name = "int4",
              .summary = "4-bit codes per token, fp16 scale/zero per group of G values",
              .code_bits = 4, .grouped = true, .takes_clip = true, .fake_quant = true, .make = make_int},
  CodecTraits{.id = CodecId::kInt2, .name = "int2",
              .summary = "2-bit codes per token, fp16 scale/zero per group of G values",
              .code_bits = 2, .grouped = true, .takes_clip = true, .default_clip_k = 0.96f, .default_clip_v = 0.92f,
              .fake_quant = true, .make = make_int},
  // KIVI (METHODS §5.1): keys per channel over G-token blocks, values per token, plain min/max.
  CodecTraits{.id = CodecId::kKivi2, .name = "kivi2",
              .summary = "KIVI: keys per channel over G tokens, values per token, 2 bits",
              .code_bits = 2, .grouped = true, .per_channel_keys = true, .make = make_kivi},
  CodecTraits{.id = CodecId::kKivi4, .name = "kivi4",
              .summary = "KIVI: keys per channel over G tokens, values per token, 4 bits",
              .code_bits = 4, .grouped = true, .per_channel_keys = true, .make = make_kivi},
  // NexusQuant (METHODS §5.3): the Hadamard is inside the codec (no cache transform), an fp16 scale per row,
  // power-of-two head_dim; keys stored without RoPE except in the post-RoPE ablation.
  CodecTraits{.id = CodecId::kNexusquant, .name = "nexusquant",
              .summary = "NexusQuant E8, shipped rule, L=4: int8 2·p, fp16 scale",
              .code_bits = 8, .make = make_nexus, .row_bytes = 2, .pow2_head_dim = true, .pre_rope_keys = true},
  CodecTraits{.id = CodecId::kNexusquantStrict, .name = "nexusquant_strict",
              .summary = "nexusquant, strict Conway-Sloane E8 (ablation)",
              .code_bits = 8, .make = make_nexus, .row_bytes = 2, .pow2_head_dim = true, .pre_rope_keys = true},
  CodecTraits{.id = CodecId::kE8_2, .name = "e8_2",
              .summary = "E8_2: 2-bit levels ±0.5, ±1.5 · d, fp16 d = max|y|/2",
              .code_bits = 2, .make = make_nexus, .row_bytes = 2, .pow2_head_dim = true, .pre_rope_keys = true},
  CodecTraits{.id = CodecId::kE8_2Strict, .name = "e8_2_strict",
              .summary = "e8_2, strict D8 + 1/2 parity (ablation)",
              .code_bits = 2, .make = make_nexus, .row_bytes = 2, .pow2_head_dim = true, .pre_rope_keys = true},
  CodecTraits{.id = CodecId::kE8_2PostRope, .name = "e8_2_postrope",
              .summary = "e8_2 on post-RoPE keys (ablation)",
              .code_bits = 2, .make = make_nexus, .row_bytes = 2, .pow2_head_dim = true},
  // OScaR (METHODS §5.4): groups fixed at 32, keys token-scaled, the Hadamard transform.
  CodecTraits{.id = CodecId::kOscarInt2, .name = "oscar_int2",
              .summary = "OScaR: keys / their norm over kv heads, per channel over 32 tokens; values per token over 32 "
                         "channels; 2 bits",
              .code_bits = 2, .per_channel_keys = true, .transform = CodecTransform::kHadamard, .make = make_oscar,
              .token_scale_keys = true},
  // Kitty (METHODS §5.5): per-channel keys over 128-token blocks, a quarter (or a fifth) of the channels at 4 bits.
  CodecTraits{.id = CodecId::kKitty2, .name = "kitty_int2",
              .summary = "Kitty: keys per channel over 128-token blocks, the 25% of channels of largest mean |k| at 4 "
                         "bits, the rest 2; values per token, 2 bits",
              .code_bits = 2, .per_channel_keys = true, .make = make_kitty<25>},
  CodecTraits{.id = CodecId::kKitty2At20, .name = "kitty_int2_20",
              .summary = "Kitty as in its accuracy runs: as kitty_int2 with 20% of the key channels at 4 bits",
              .code_bits = 2, .per_channel_keys = true, .make = make_kitty<20>},
  // TurboQuant (METHODS §5.2, codecs/turboquant/turboquant.h): per-row parameter bytes (fp16 norm; fp16 scale and
  // min); the codebook keys imply the Hadamard on keys and store keys only.
  CodecTraits{.id = CodecId::kTq2, .name = "tq2",
              .summary = "TurboQuant keys: 2-bit Lloyd-Max codes of the rotated unit key, fp16 norm",
              .code_bits = 2, .transform = CodecTransform::kHadamardKeys, .make = make_tq_key, .row_bytes = 2,
              .keys_only = true},
  CodecTraits{.id = CodecId::kTq3, .name = "tq3",
              .summary = "TurboQuant keys: 3-bit Lloyd-Max codes of the rotated unit key, fp16 norm",
              .code_bits = 3, .transform = CodecTransform::kHadamardKeys, .make = make_tq_key, .row_bytes = 2,
              .keys_only = true},
  CodecTraits{.id = CodecId::kTq4, .name = "tq4",
              .summary = "TurboQuant keys: 4-bit Lloyd-Max codes of the rotated unit key, fp16 norm",
              .code_bits = 4, .transform = CodecTransform::kHadamardKeys, .make = make_tq_key, .row_bytes = 2,
              .keys_only = true},
  CodecTraits{.id = CodecId::kTq2nc, .name = "tq2nc",
              .summary = "TurboQuant keys as tq2, norm-corrected (n c / ||c||)",
              .code_bits = 2, .transform = CodecTransform::kHadamardKeys, .make = make_tq_key_nc, .row_bytes = 2,
              .keys_only = true},
  CodecTraits{.id = CodecId::kTq3nc, .name = "tq3nc",
              .summary = "TurboQuant keys as tq3, norm-corrected (n c / ||c||)",
              .code_bits = 3, .transform = CodecTransform::kHadamardKeys, .make = make_tq_key_nc, .row_bytes = 2,
              .keys_only = true},
  CodecTraits{.id = CodecId::kTq4nc, .name = "tq4nc",
              .summary = "TurboQuant keys as tq4, norm-corrected (n c / ||c||)",
              .code_bits = 4, .transform = CodecTransform::kHadamardKeys, .make = make_tq_key_nc, .row_bytes = 2,
              .keys_only = true},
  CodecTraits{.id = CodecId::kTqv2, .name = "tqv2",
              .summary = "TurboQuant values: 2-bit codes per row, fp16 scale and min",
              .code_bits = 2, .make = make_tq_value, .row_bytes = 4},
  CodecTraits{.id = CodecId::kTqv3, .name = "tqv3",
              .summary = "TurboQuant values: 3-bit codes per row, fp16 scale and min",
              .code_bits = 3, .make = make_tq_value, .row_bytes = 4},
  CodecTraits{.id = CodecId::kTqv4, .name = "tqv4",
              .summary = "TurboQuant values: 4-bit codes per row, fp16 scale and min",
              .code_bits = 4, .make = make_tq_value, .row_bytes = 4},
  // vLLM's FP8 caches (codecs/fp8/fp8.h): --kv-cache-dtype fp8 / fp8_e4m3 / fp8_e5m2 at its default per-tensor scale
  // of 1.0 or calibrated ones (--kv-scales), and fp8_per_token_head; round to nearest even, saturating.
  CodecTraits{.id = CodecId::kFp8e4m3, .name = "fp8e4m3", .aliases = kFp8Aliases,
              .summary = "FP8 e4m3 values of x / s, s per layer: 1.0 or --kv-scales (vLLM's fp8; TurboQuant k8v4's keys)",
              .code_bits = 8, .make = make_fp8},
  CodecTraits{.id = CodecId::kFp8e5m2, .name = "fp8e5m2", .aliases = kFp8e5m2Aliases,
              .summary = "FP8 e5m2 values of x / s, s per layer: 1.0 or --kv-scales (vLLM's fp8_e5m2)",
              .code_bits = 8, .make = make_fp8},
  CodecTraits{.id = CodecId::kFp8PerTokenHead, .name = "fp8_per_token_head",
              .summary = "FP8 e4m3 values of x / s, fp32 s = absmax / 448 per token and kv head (vLLM)",
              .code_bits = 8, .make = make_fp8, .row_bytes = 4},
  // llama.cpp's -ctk / -ctv types (docs/research/llamacpp-kv.md): f16 rows; blocks of 32 values with an fp16 scale,
  // bit-exact to its reference quantizers, rotated by its attn_rot; fixed formats (no row bytes): the bits, 8.5, 5.5,
  // 5, 4.5 and 4.5, are their blocks' bytes (codecs/llamacpp/llamacpp_blocks.h).
  CodecTraits{.id = CodecId::kF16, .name = "f16", .aliases = kF16Aliases,
              .summary = "IEEE half rows (llama.cpp's default cache type)",
              .code_bits = 16, .make = make_f16, .head_dim_unit = 16},
  CodecTraits{.id = CodecId::kQ8_0, .name = "q8_0",
              .summary = "llama.cpp q8_0: blocks of 32, fp16 absmax scale, 8-bit codes",
              .code_bits = 8, .transform = CodecTransform::kAttnRot, .make = make_llamacpp},
  CodecTraits{.id = CodecId::kQ5_0, .name = "q5_0",
              .summary = "llama.cpp q5_0: blocks of 32, fp16 absmax scale, 5-bit codes",
              .code_bits = 5, .transform = CodecTransform::kAttnRot, .make = make_llamacpp},
  CodecTraits{.id = CodecId::kQ4_1, .name = "q4_1",
              .summary = "llama.cpp q4_1: blocks of 32, fp16 scale and min, 4-bit codes",
              .code_bits = 4, .transform = CodecTransform::kAttnRot, .make = make_llamacpp},
  CodecTraits{.id = CodecId::kQ4_0, .name = "q4_0",
              .summary = "llama.cpp q4_0: blocks of 32, fp16 absmax scale, 4-bit codes",
              .code_bits = 4, .transform = CodecTransform::kAttnRot, .make = make_llamacpp},
  CodecTraits{.id = CodecId::kIq4Nl, .name = "iq4_nl",
              .summary = "llama.cpp iq4_nl: blocks of 32, fp16 scale, 4-bit table codes",
              .code_bits = 4, .transform = CodecTransform::kAttnRot, .make = make_llamacpp},
  // PN-Mix (METHODS §5.7, kvq's definition): keys only, 1-4 bits per RoPE pair from a calibration file (--pnmix),
  // one codec per (layer, kv head); code_bits is the default average, the file's budget is what is stored. The §1
  // grid per width group, with its key clip.
  CodecTraits{.id = CodecId::kPnmix, .name = "pnmix",
              .summary = "PN-Mix keys: 1-4 bits per RoPE channel pair (--pnmix FILE from kvq calibrate), fp16 "
                         "scale/zero per width group",
              .code_bits = 2, .takes_clip = true, .default_clip_k = 0.96f, .make = make_pnmix, .keys_only = true,
              .per_head = true},
};

// The --kv-cache-dtype presets: vLLM's TurboQuant presets (TQ_PRESETS: key bits / value bits / norm correction), then
// kvq's own. Their layer policy as shipped (layers 0, 1, L-2, L-1 in BF16) and window sizes are not part of a preset;
// the window codec is (bf16 unless named: KV4-RL's INT8 windows, METHODS §5.6).
constexpr std::array kPresets{
  CodecPreset{.name = "turboquant_k8v4",    .k = CodecId::kFp8e4m3, .v = CodecId::kTqv4,
              .summary = "vLLM TurboQuant: FP8 keys, 4-bit values"},
  CodecPreset{.name = "turboquant_4bit_nc", .k = CodecId::kTq4nc,   .v = CodecId::kTqv4,
              .summary = "vLLM TurboQuant: 4-bit norm-corrected keys, 4-bit values"},
  CodecPreset{.name = "turboquant_k3v4_nc", .k = CodecId::kTq3nc,   .v = CodecId::kTqv4,
              .summary = "vLLM TurboQuant: 3-bit norm-corrected keys, 4-bit values"},
  CodecPreset{.name = "turboquant_3bit_nc", .k = CodecId::kTq3nc,   .v = CodecId::kTqv3,
              .summary = "vLLM TurboQuant: 3-bit norm-corrected keys, 3-bit values"},
  CodecPreset{.name = "turboquant_2bit",    .k = CodecId::kTq2nc,   .v = CodecId::kTqv2,
              .summary = "kvq extension: 2-bit norm-corrected keys, 2-bit values", .kvq_extension = true},
  CodecPreset{.name = "kv4rl",              .k = CodecId::kInt4,    .v = CodecId::kInt4,
              .summary = "KV4-RL (kvq's definition): int4 keys and values, INT8 sink and recent windows",
              .kvq_extension = true, .window = CodecId::kInt8},
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

int default_group(int head_dim) {
  for (int i = int(std::size(kGroups)) - 1; i >= 0; --i)
    if (head_dim > 0 && head_dim % kGroups[i] == 0) return kGroups[i];
  return 0;
}

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

std::string_view transform_name(CodecTransform t) {
  switch (t) {
    case CodecTransform::kNone: return "none";
    case CodecTransform::kHadamard: return "hadamard";
    case CodecTransform::kHadamardKeys: return "hadamard_k";
    case CodecTransform::kAttnRot: return "attn_rot";
  }
  KVQ_FAIL("unknown codec transform {}", int(t));
}

CodecTransform implied_transform(const CodecSpec& k, const CodecSpec& v) {
  const CodecTransform tk = codec_traits(k.type).transform, tv = codec_traits(v.type).transform;
  KVQ_CHECK(tk == CodecTransform::kNone || tv == CodecTransform::kNone || tk == tv,
            "cache types k={} and v={} imply different transforms ({}, {})", k.type, v.type, transform_name(tk),
            transform_name(tv));
  return tk != CodecTransform::kNone ? tk : tv;
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
