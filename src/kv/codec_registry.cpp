#include "kv/codec_registry.h"

#include <array>

#include "common/error.h"
#include "kv/codec_bf16.h"
#include "kv/codec_f16.h"
#include "kv/codec_f32.h"
#include "kv/codec_int.h"
#include "kv/codec_kivi.h"
#include "kv/codec_llamacpp.h"

namespace kvq {

namespace {

// CPU factories, one per codec family; the row supplies the bits (specs are validated by make_codec).
std::unique_ptr<KvCodec> make_f32(const CodecSpec& s, SimdLevel) { return std::make_unique<F32Codec>(s.head_dim); }
std::unique_ptr<KvCodec> make_bf16(const CodecSpec& s, SimdLevel level) {
  return std::make_unique<Bf16Codec>(s.head_dim, level);
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
std::unique_ptr<KvCodec> make_f16(const CodecSpec& s, SimdLevel level) {
  return std::make_unique<F16Codec>(s.head_dim, level);
}
std::unique_ptr<KvCodec> make_llamacpp(const CodecSpec& s, SimdLevel level) {
  return std::make_unique<LlamaCppCodec>(codec_traits(s.type).id, s.head_dim, level);
}

constexpr std::string_view kF32Aliases[] = {"fp32", "float32"};
constexpr std::string_view kBf16Aliases[] = {"bfloat16"};
constexpr std::string_view kF16Aliases[] = {"fp16", "float16"};

// clang-format off
// id            name     aliases       summary                                                              bits grouped clip   clip_k clip_v per_ch transform fq    factory [fixed_bits]
constexpr std::array kTable{
  CodecTraits{CodecId::kF32,   "f32",   kF32Aliases,  "float32 rows, lossless (reference cache)",                       32, false, false, 1.0f,  1.0f,  false, "none", false, make_f32},
  CodecTraits{CodecId::kBf16,  "bf16",  kBf16Aliases, "bfloat16 rows",                                                  16, false, false, 1.0f,  1.0f,  false, "none", false, make_bf16},
  CodecTraits{CodecId::kInt8,  "int8",  {},           "8-bit codes per token, fp16 scale/zero per group of G values",  8,  true,  true,  1.0f,  1.0f,  false, "none", true,  make_int},
  CodecTraits{CodecId::kInt4,  "int4",  {},           "4-bit codes per token, fp16 scale/zero per group of G values",  4,  true,  true,  1.0f,  1.0f,  false, "none", true,  make_int},
  CodecTraits{CodecId::kInt2,  "int2",  {},           "2-bit codes per token, fp16 scale/zero per group of G values",  2,  true,  true,  0.96f, 0.92f, false, "none", true,  make_int},
  CodecTraits{CodecId::kKivi2, "kivi2", {},           "KIVI: keys per channel over G tokens, values per token, 2 bits", 2,  true,  false, 1.0f,  1.0f,  true,  "none", false, make_kivi},
  CodecTraits{CodecId::kKivi4, "kivi4", {},           "KIVI: keys per channel over G tokens, values per token, 4 bits", 4,  true,  false, 1.0f,  1.0f,  true,  "none", false, make_kivi},
  // llama.cpp's -ctk / -ctv types (docs/research/llamacpp-kv.md): f16 rows; blocks of 32 values with an fp16 scale,
  // bit-exact to its reference quantizers, rotated by its attn_rot (the last column: bits per element stored).
  CodecTraits{CodecId::kF16,   "f16",   kF16Aliases,  "IEEE half rows (llama.cpp's default cache type)",                16, false, false, 1.0f,  1.0f,  false, "none", false, make_f16},
  CodecTraits{CodecId::kQ8_0,  "q8_0",  {},           "llama.cpp q8_0: blocks of 32, fp16 absmax scale, 8-bit codes",   8,  false, false, 1.0f,  1.0f,  false, "attn_rot", false, make_llamacpp, 8.5f},
  CodecTraits{CodecId::kQ5_0,  "q5_0",  {},           "llama.cpp q5_0: blocks of 32, fp16 absmax scale, 5-bit codes",   5,  false, false, 1.0f,  1.0f,  false, "attn_rot", false, make_llamacpp, 5.5f},
  CodecTraits{CodecId::kQ4_1,  "q4_1",  {},           "llama.cpp q4_1: blocks of 32, fp16 scale and min, 4-bit codes",  4,  false, false, 1.0f,  1.0f,  false, "attn_rot", false, make_llamacpp, 5.0f},
  CodecTraits{CodecId::kQ4_0,  "q4_0",  {},           "llama.cpp q4_0: blocks of 32, fp16 absmax scale, 4-bit codes",   4,  false, false, 1.0f,  1.0f,  false, "attn_rot", false, make_llamacpp, 4.5f},
  CodecTraits{CodecId::kIq4Nl, "iq4_nl", {},          "llama.cpp iq4_nl: blocks of 32, fp16 scale, 4-bit table codes",  4,  false, false, 1.0f,  1.0f,  false, "attn_rot", false, make_llamacpp, 4.5f},
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

const CodecTraits& codec_traits(std::string_view name) {
  const CodecTraits* t = find_codec(name);
  KVQ_CHECK(t, "unknown KV cache type '{}' (supported: {})", name, codec_names(", "));
  return *t;
}

CodecSpec codec_spec(std::string_view type, bool is_key, int group, float clip) {
  const CodecTraits& t = codec_traits(type);
  KVQ_CHECK(clip <= 0 || t.takes_clip, "--kv-clip-{}: cache type '{}' takes no clip ({})", is_key ? "k" : "v", t.name,
            t.grouped            ? "it is plain min/max"
            : t.fixed_bits > 0.f ? "its blocks keep llama.cpp's own scales"
                                 : "it stores unquantized rows");
  CodecSpec s;
  s.type = std::string(t.name);
  s.group = group;
  s.clip = clip > 0 ? clip : (is_key ? t.default_clip_k : t.default_clip_v);
  s.per_channel = is_key && t.per_channel_keys;
  return s;
}

}  // namespace kvq
