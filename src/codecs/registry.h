// The codec table: the one place a KV-cache storage format is registered (as ggml's type_traits).
//
// Each row says everything the rest of kvq needs to know about a codec — its names, what one stored block costs,
// which flags it honours and their defaults, the key layout, the transform it implies, the CPU factory and the
// shapes it supports. make_codec, the CLI (help, validation, defaults), the referee's method table,
// calibration's fake-quant hook, `kvq info --codecs` and the tests' codec lists read it; a new codec is a row here
// plus its own file (block struct, encode/decode, fast paths beside their scalar reference).
//
// What the GPU supports is not here: it is the instance table of the compiled CUDA kernels (cuda/gpu_instances.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "codecs/codec.h"
#include "codecs/codec_id.h"
#include "simd/simd.h"

namespace kvq {

// Typed identity of a codec (codecs/codec_id.h); the table's rows are in this order.

// The transform a codec implies: what the CLI builds for the cache beside (or instead of) --rotation
// (codec_transform, rotation/rotation_file.h; installed by cli/options.cpp plan()).
enum class CodecTransform : uint8_t {
  kNone,          // only --rotation
  kHadamard,      // QuaRot's Hadamard on keys and values (OScaR, METHODS §5.4: --rotation hadamard's transform)
  kHadamardKeys,  // TurboQuant (METHODS §5.2): the normalised Sylvester Hadamard on keys, the same for every layer and
                  // head, queries rotated once per step; values unrotated (rotation_file.h: hadamard_key_transform)
  kAttnRot,       // llama.cpp's KV rotation (its cache types' attn_rot, codecs/llamacpp/attn_rot.h): block
                  // Walsh-Hadamard on the keys when the key type is one of its quantized types, on the values when
                  // the value type is; both need head_dim % 64 == 0
};
// "none", "hadamard", "hadamard_k", "attn_rot": the transform's name in logs, `kvq info --codecs` and
// KvTransform::name.
std::string_view transform_name(CodecTransform t);

// One row of the codec table. Rows are written with designated initializers and name only what differs from these
// defaults: an unquantized per-token codec of keys and values, without groups, clip, transform or position.
struct CodecTraits {
  CodecId id;
  std::string_view name;                        // the --cache-type-k / -v value, CodecSpec::type
  std::span<const std::string_view> aliases{};  // other accepted names (e.g. "fp32"), canonicalised to name
  std::string_view summary;                     // one line: what a row / block stores
  int code_bits = 16;                           // bits of one stored value code: 32 (f32), 16 (bf16), 8, 4, 2
  bool grouped = false;           // fp16 scale/zero per group of --kv-group values (KIVI keys: tokens); false:
                                  // unquantized rows, or a format that fixes its own groups (fixed_format: OScaR's
                                  // 32, llama.cpp's blocks of 32)
  bool takes_clip = false;        // the quantile clip of METHODS §1 applies (--kv-clip-k / --kv-clip-v)
  float default_clip_k = 1.0f;    // clips when not given (1.0 = plain min/max)
  float default_clip_v = 1.0f;
  bool per_channel_keys = false;  // keys per channel over blocks of G tokens (KIVI; OScaR: 32); values per token
  CodecTransform transform = CodecTransform::kNone;  // the transform the codec implies
  bool fake_quant = false;        // calibration's straight-through quantizer (calib/ste_quant.h) models it: the
                                  // METHODS §1 grid per token at code_bits (OptR calibrates for it)
  // CPU factory for a validated spec (make_codec validates, then calls this).
  std::unique_ptr<KvCodec> (*make)(const CodecSpec& spec, SimdLevel level) = nullptr;
  int row_bytes = 0;              // bytes per stored row besides its codes and group params (a per-row fp16 scale);
                                  // 0 for formats of fixed blocks, whose scales come per block (bytes_per_block)
  int head_dim_unit = 32;         // head_dim must be a multiple of this: the row kernels read units of 32 values;
                                  // the unquantized rows (f32, bf16, f16) take 16, the last 16 values of a row
                                  // read by a scalar tail (head_dim 80: StableLM, Phi-2)
  bool pow2_head_dim = false;     // head_dim must be a power of two (the codec applies a Sylvester Hadamard itself)
  bool pre_rope_keys = false;     // keys stored without RoPE: the cache removes it at each key's position before
                                  // encoding and re-applies it after decoding (kv/codec_rope.h; needs the model's RoPE)
  bool token_scale_keys = false;  // keys divided by their per-token norm over all kv heads, which then scales the
                                  // scores (OScaR; CodecSpec::token_scale)
  bool keys_only = false;         // stores keys only (TurboQuant's codebook keys: their transform rotates keys, not
                                  // values)
  bool per_head = false;          // one codec per (layer, kv head), built from CodecSpec::pair_bits (PN-Mix keys:
                                  // widths calibrated per head on the model's own post-RoPE keys, so no key-side
                                  // transform); every head's blocks have the same bytes
};

// A named pair of key and value codecs, the --kv-cache-dtype values beside the codec names (vLLM's TurboQuant
// presets, kvq's turboquant_2bit, and KV4-RL), with the codec of its windows. The transform a preset implies is its
// codecs' (the transform column).
struct CodecPreset {
  std::string_view name;     // the --kv-cache-dtype value
  CodecId k, v;              // key codec, value codec
  std::string_view summary;  // one line: what it stores and whose it is
  bool kvq_extension = false;  // not a published preset: labelled "kvq extension" wherever it is printed
  CodecId window = CodecId::kBf16;  // codec of the sink / recent windows (CacheConfig::window; KV4-RL: int8)
};

// The supported shapes on the CPU: head_dim a multiple of the row's head_dim_unit (32; 16 for f32, bf16 and f16) up to
// 256; quantized codecs take groups of 32, 64 or 128 (dividing head_dim for per-token rows; KIVI keys: tokens per
// block), so head_dim 80 runs unquantized rows only.
inline constexpr int kCpuMaxHeadDim = 256;
inline constexpr int kGroups[] = {32, 64, 128};
inline constexpr int kDefaultGroup = 128;  // G when --kv-group is not given and 128 divides head_dim
// The default --kv-group of a model: the largest of kGroups (128, 64, 32) that divides head_dim, or 0 when none does
// (head_dim 80: no per-token grouped codec takes it).
int default_group(int head_dim);

// A quantized format that fixes its own groups and blocks (--kv-group does not apply): e.g. OScaR, llama.cpp's q4_0.
inline bool fixed_format(const CodecTraits& t) { return !t.grouped && t.code_bits < 16; }

std::span<const CodecTraits> codec_table();
const CodecTraits& codec_traits(CodecId id);
// By name or alias; null when unknown.
const CodecTraits* find_codec(std::string_view name);
// By name or alias; throws kvq::Error "unknown KV cache type 'x' (supported: f32, bf16, ...)".
const CodecTraits& codec_traits(std::string_view name);
// The names of the rows that satisfy pred, in table order, joined by sep: codec_names_if(all, "|") = "f32|bf16|...".
template <class Pred>
std::string codec_names_if(Pred pred, std::string_view sep = ", ") {
  std::string out;
  for (const CodecTraits& t : codec_table())
    if (pred(t)) out += (out.empty() ? "" : std::string(sep)) + std::string(t.name);
  return out;
}
inline std::string codec_names(std::string_view sep) {
  return codec_names_if([](const CodecTraits&) { return true; }, sep);
}

std::span<const CodecPreset> codec_presets();
const CodecPreset* find_preset(std::string_view name);  // null when unknown
// "turboquant_k8v4 (fp8e4m3 / tqv4), ..., kv4rl (int4 / int4, int8 windows, kvq extension)", joined by sep.
std::string preset_names(std::string_view sep = ", ");

// The transform a key / value codec pair implies: kNone, or the one its codecs name (one pair implies at most one; a
// conflict is a kvq::Error).
CodecTransform implied_transform(const CodecSpec& k, const CodecSpec& v);

// The CodecSpec of a --cache-type value for keys (is_key) or values, with the flags' group and clip
// (clip <= 0: the codec's default; a codec without a clip stores 1.0). The type is canonicalised (aliases), KIVI
// and OScaR keys get per_channel, OScaR keys token_scale. Throws kvq::Error for an unknown type.
CodecSpec codec_spec(std::string_view type, bool is_key, int group, float clip);

}  // namespace kvq
