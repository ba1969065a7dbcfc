#include "codecs/support_matrix.h"

#include <algorithm>

#include <fmt/format.h>

#include "codecs/registry.h"
#include "common/error.h"
#include "rotation/hadamard.h"  // is_power_of_two
#include "cuda/gpu_instances.h"
#include "kv/cache.h"

namespace kvq {

namespace {

// Whether a cache of transform t can be built at head_dim d: a Hadamard of d (TurboQuant, OScaR) needs a power of two
// (rotation/rotation_file.h codec_transform), on either device.
bool hadamard_fits(CodecTransform t, int d) {
  return is_power_of_two(d) || (t != CodecTransform::kHadamard && t != CodecTransform::kHadamardKeys);
}

SupportRow row_of(const CodecTraits& t, const CodecSpec& spec, const CodecSpec& k, const CodecSpec& v,
                  std::string role) {
  SupportRow r{std::string(t.name), std::move(role), spec.head_dim, t.grouped ? spec.group : 0, 0, 0, false, ""};
  if (t.per_head) {  // one codec per (layer, kv head) from a calibration file: its bytes are the file's (PN-Mix)
    r.cpu = spec.head_dim % 32 == 0 && spec.head_dim <= kCpuMaxHeadDim;
    for (const cuda::GpuInstance& g : cuda::kGpuInstances)  // the first row that stores its keys at this head_dim
      if (g.k == t.id && cuda::gpu_row_compiled(g, spec.head_dim)) {
        r.cuda = cuda::gpu_path_name(g.path);
        break;
      }
    return r;
  }
  try {
    const auto codec = make_codec(spec);
    r.bytes_per_token = double(codec->bytes_per_block()) / codec->tokens_per_block();
    r.bits = codec->bits_per_element();
    r.cpu = hadamard_fits(t.transform, spec.head_dim);
  } catch (const Error&) {
    // Not a CPU shape (e.g. a group that does not divide head_dim): listed as unsupported.
  }
  CacheConfig both;  // this codec for keys and values, the default windows and pages
  both.k = k, both.v = v;
  int gpu = cuda::gpu_instance(both, spec.head_dim);
  // No row pairs it with itself (TurboQuant's keys and values): the first row at this head_dim that stores it on
  // either side (this spec: a KIVI value row of a group that does not divide head_dim is not stored whatever its keys).
  if (gpu < 0 && cuda::gpu_spec_stored(spec))
    for (int i = 0; i < cuda::kGpuInstanceCount && gpu < 0; ++i) {
      const cuda::GpuInstance& g = cuda::kGpuInstances[i];
      if ((g.k == t.id || g.v == t.id) && cuda::gpu_row_compiled(g, spec.head_dim)) gpu = i;
    }
  if (gpu >= 0) r.cuda = cuda::gpu_path_name(cuda::kGpuInstances[gpu].path);
  return r;
}

}  // namespace

std::vector<SupportRow> support_matrix(const std::vector<int>& head_dims) {
  std::vector<SupportRow> rows;
  for (const CodecTraits& t : codec_table())
    for (int d : head_dims)
      for (int g : kGroups) {
        if (!t.grouped && g != kGroups[0]) continue;  // one row: ungrouped codecs ignore G
        const CodecSpec k = codec_spec(t.name, true, g, 0.f), v = codec_spec(t.name, false, g, 0.f);
        CodecSpec kd = k, vd = v;
        kd.head_dim = vd.head_dim = d;
        if (t.per_channel_keys) {
          rows.push_back(row_of(t, kd, kd, vd, "k"));
          rows.push_back(row_of(t, vd, kd, vd, "v"));
        } else {
          rows.push_back(row_of(t, kd, kd, vd, t.keys_only ? "k" : "k,v"));
        }
      }
  return rows;
}

std::string format_support_matrix(const std::vector<SupportRow>& rows) {
  size_t w = 8;  // the codec column: as wide as the longest name
  for (const SupportRow& r : rows) w = std::max(w, r.codec.size());
  std::string out = fmt::format("{:<{}} {:<4} {:>8} {:>5} {:>11} {:>6}  {:<4} {}\n", "codec", w, "kv", "head_dim",
                                "group", "bytes/token", "bits", "cpu", "cuda (keys and values of this codec, or the side a GPU pair stores)");
  for (const SupportRow& r : rows)
    out += fmt::format("{:<{}} {:<4} {:>8} {:>5} {:>11} {:>6}  {:<4} {}\n", r.codec, w, r.role, r.head_dim,
                       r.group ? std::to_string(r.group) : "-",
                       !r.cpu ? "-" : r.bits > 0 ? fmt::format("{:g}", r.bytes_per_token) : "per file",
                       !r.cpu ? "-" : r.bits > 0 ? fmt::format("{:.3f}", r.bits) : "file", r.cpu ? "yes" : "no",
                       r.cuda.empty() ? "no" : r.cuda);
  return out;
}

std::vector<PresetRow> preset_matrix(const std::vector<int>& head_dims) {
  std::vector<PresetRow> rows;
  for (const CodecPreset& p : codec_presets())
    for (int d : head_dims) {
      CacheConfig c;  // the preset's codecs and window codec, the default windows and pages
      c.k = codec_spec(codec_traits(p.k).name, true, kDefaultGroup, 0.f);
      c.v = codec_spec(codec_traits(p.v).name, false, kDefaultGroup, 0.f);
      c.k.head_dim = c.v.head_dim = d;
      c.window = std::string(codec_traits(p.window).name);
      PresetRow r{std::string(p.name), c.k.type, c.v.type, c.window, p.kvq_extension, d, 0, 0,
                  std::string(transform_name(implied_transform(c.k, c.v))), false, ""};
      try {
        const auto k = make_codec(c.k), v = make_codec(c.v);
        r.bytes_per_token = double(k->bytes_per_block()) + double(v->bytes_per_block());
        r.bits = 8.0 * r.bytes_per_token / (2.0 * d);
        r.cpu = hadamard_fits(implied_transform(c.k, c.v), d);
      } catch (const Error&) {
      }
      const int gpu = cuda::gpu_instance(c, d);
      if (gpu >= 0) r.cuda = cuda::gpu_path_name(cuda::kGpuInstances[gpu].path);
      rows.push_back(r);
    }
  return rows;
}

std::string format_preset_matrix(const std::vector<PresetRow>& rows) {
  std::string out = fmt::format("{:<20} {:<8} {:<6} {:<7} {:>8} {:>11} {:>6}  {:<10} {:<4} {:<10} {}\n", "preset",
                                "keys", "values", "windows", "head_dim", "bytes/token", "bits", "transform", "cpu",
                                "cuda", "");
  for (const PresetRow& r : rows)
    out += fmt::format("{:<20} {:<8} {:<6} {:<7} {:>8} {:>11} {:>6}  {:<10} {:<4} {:<10} {}\n", r.preset, r.k, r.v,
                       r.window, r.head_dim, r.cpu ? fmt::format("{:g}", r.bytes_per_token) : "-",
                       r.cpu ? fmt::format("{:.3f}", r.bits) : "-", r.transform, r.cpu ? "yes" : "no",
                       r.cuda.empty() ? "no" : r.cuda, r.kvq_extension ? "(kvq extension)" : "(vLLM)");
  return out;
}

namespace {

std::string md_cell(std::string_view s) {
  std::string out;
  for (const char ch : s) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
  return out;
}

// The codec table, one row a codec: its name, what it stores and what it implies.
std::string codec_table_markdown() {
  std::string out = "| codec | stores | groups | clip k / v | keys | transform | notes |\n"
                    "|---|---|---|---|---|---|---|\n";
  for (const CodecTraits& t : codec_table()) {
    std::string notes;
    const auto note = [&](std::string_view n) { notes += (notes.empty() ? "" : "; ") + std::string(n); };
    for (std::string_view a : t.aliases) note(fmt::format("alias `{}`", a));
    if (t.keys_only) note("keys only");
    if (t.pow2_head_dim) note("power-of-two head_dim");
    if (t.head_dim_unit != 32) note(fmt::format("CPU: head_dim a multiple of {} (80 included)", t.head_dim_unit));
    if (t.pre_rope_keys) note("keys stored without RoPE");
    if (t.token_scale_keys) note("keys token-scaled");
    if (t.per_head) note("one codec per (layer, kv head), from `--pnmix FILE`");
    if (t.fake_quant) note("calibrated for by OptR");
    out += fmt::format("| `{}` | {} | {} | {} | {} | {} | {} |\n", t.name, md_cell(t.summary),
                       t.grouped ? "`--kv-group`" : fixed_format(t) ? "its own" : "-",
                       t.takes_clip ? fmt::format("{:g} / {:g}", t.default_clip_k, t.default_clip_v) : "-",
                       t.per_channel_keys ? "per channel" : "per token", transform_name(t.transform),
                       notes.empty() ? "" : notes);
  }
  return out;
}

}  // namespace

std::string support_markdown() {
  std::string out =
      "# KV-cache codecs\n\n"
      "Generated by `kvq info --codecs --markdown` from the codec table (`src/codecs/registry.cpp`) and the GPU "
      "instance table (`src/cuda/gpu_instances.h`); a test holds this page to that output, so it cannot drift. "
      "`-ctk T` / `-ctv T` pick a key and a value codec, `--kv-cache-dtype P` a preset of both "
      "([cli.md](cli.md)). What each format is, and whose: [methods.md](methods.md).\n\n"
      "## The codecs\n\n" + codec_table_markdown() +
      fmt::format("\nOn the CPU every codec takes head_dim a multiple of 32 up to {} (f32, bf16 and f16: of 16); the "
                  "grouped ones need their group (32, 64 or 128) to divide head_dim for per-token rows, and "
                  "`--kv-group` defaults to the largest that does. So a head_dim of 80 (StableLM, Phi-2) runs the "
                  "unquantized rows only: every quantized codec reads 32-value units.\n",
                  kCpuMaxHeadDim) +
      "\n## Bytes and bits stored, and where each runs\n\n"
      "Bytes per (token, kv head) and bits per element of the quantized region, from each codec's own block size "
      "(scales, zeros and norms included; the BF16 sink and recent windows are counted by `kvq info -m DIR -c N`). "
      "cuda: the GPU attention path when keys and values use this codec, else of the first GPU pair that stores it on "
      "one side; `no`: the GPU refuses it with the list of what it runs.\n\n"
      "| codec | kv | head_dim | group | bytes/token | bits | cpu | cuda |\n|---|---|---|---|---|---|---|---|\n";
  for (const SupportRow& r : support_matrix())
    out += fmt::format("| `{}` | {} | {} | {} | {} | {} | {} | {} |\n", r.codec, r.role, r.head_dim,
                       r.group ? std::to_string(r.group) : "-",
                       !r.cpu ? "-" : r.bits > 0 ? fmt::format("{:g}", r.bytes_per_token) : "per file",
                       !r.cpu ? "-" : r.bits > 0 ? fmt::format("{:.3f}", r.bits) : "file", r.cpu ? "yes" : "no",
                       r.cuda.empty() ? "no" : r.cuda);
  out += "\n## Presets (`--kv-cache-dtype`)\n\n"
         "A key and a value codec and the windows' codec; bytes and bits of the two codecs.\n\n"
         "| preset | keys | values | windows | head_dim | bytes/token | bits | transform | cpu | cuda | whose |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const PresetRow& r : preset_matrix())
    out += fmt::format("| `{}` | `{}` | `{}` | {} | {} | {} | {} | {} | {} | {} | {} |\n", r.preset, r.k, r.v,
                       r.window, r.head_dim, r.cpu ? fmt::format("{:g}", r.bytes_per_token) : "-",
                       r.cpu ? fmt::format("{:.3f}", r.bits) : "-", r.transform, r.cpu ? "yes" : "no",
                       r.cuda.empty() ? "no" : r.cuda, r.kvq_extension ? "kvq extension" : "vLLM");
  out += "\n## The GPU's compiled instances\n\n"
         "The key / value pairs the CUDA backend runs (the first row that fits a cache runs it; a layer of "
         "`--kv-skip-layers` runs the bf16 row); any other pair is refused before any work, with a line naming it.\n\n"
         "| path | keys | values | windows | groups | pages a multiple of | head_dim | GQA kernels |\n"
         "|---|---|---|---|---|---|---|---|\n";
  for (const cuda::GpuInstance& r : cuda::kGpuInstances)
    out += fmt::format("| {} | `{}` | `{}` | {} | {} | {} | {} | {} |\n", cuda::gpu_path_name(r.path),
                       cuda::gpu_detail::side_text(r.k, true, cuda::kAnyGroup),
                       cuda::gpu_detail::side_text(r.v, false, cuda::kAnyGroup), codec_traits(r.window).name,
                       codec_traits(r.k).grouped || codec_traits(r.v).grouped ? cuda::gpu_detail::groups_text(r.groups)
                                                                               : "-",
                       r.page_multiple, cuda::gpu_detail::head_dims_text(r.head_dims),
                       r.gqa == cuda::GpuGqa::kEvery
                           ? fmt::format("g = 1, 2, 4 and any g <= 8 at {}, any g <= 8 at the others",
                                         cuda::kEveryGqaHeadDim)
                           : "any g <= 8");
  out += "\nWindows: the sink and recent rows, bf16 but for KV4-RL's int8 row (its ring keeps each recent token's int4 "
         "rows too); a quantized per-token side's group divides head_dim. int2 "
         "takes tensor cores at head_dim 128 (one 128-value group a row), CUDA cores at the others. At head_dim 128 "
         "the other formats run on decoded tiles: each warp decodes a tile of 16 positions to f16 in shared memory and "
         "runs the tensor-core tile code on it (pages of a multiple of 16; sliding windows and pages of 8 take the "
         "CUDA-core rows). A codec the GPU runs at 128 runs at every other head_dim that the CPU takes it at, except "
         "where the GPU compiles no pair for it: KIVI's (kivi2, kivi4) and Kitty's (kitty_int2, kitty_int2_20) at 256, whose key-block demotion would "
         "hold G x d bf16 in shared memory (64 KB at G = 128); TurboQuant's and llama.cpp's (q8_0, q4_0) at 256, and "
         "fp8e5m2, fp8_per_token_head, q5_0, q4_1 and iq4_nl at 96 and 256, left out of the build-time budget (a "
         "CUDA-core kernel at 256 costs 6-16 s of ptxas; fp8e4m3, vLLM's `fp8`, runs at all four); TurboQuant's values "
         "(tqv2, tqv3, tqv4) at 96, whose only pairs are TurboQuant keys, which like OScaR need a power-of-two "
         "head_dim for their Hadamard on either device; NexusQuant's nexusquant and e8_2 (the referee's rows) at 64 "
         "and 256, which run on decoded tiles alone (a row goes back through its Hadamard, and a key through RoPE at "
         "its position, across the lanes that decode it: pages of a multiple of 16, no sliding window; their ablations "
         "nexusquant_strict, e8_2_strict and e8_2_postrope stay on the CPU). head_dim 80 takes unquantized rows only "
         "(the other codecs take multiples of 32): bf16 on the GPU, f32, bf16 and f16 on the CPU (the GPU stores no "
         "f32 rows at any head_dim, and f16 at 64, 96, 128 and 256).\n";
  return out;
}

}  // namespace kvq
