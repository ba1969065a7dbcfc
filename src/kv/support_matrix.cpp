#include "kv/support_matrix.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "cuda/gpu_instances.h"
#include "kv/cache.h"
#include "kv/codec_registry.h"

namespace kvq {

namespace {

SupportRow row_of(const CodecTraits& t, const CodecSpec& spec, const CodecSpec& k, const CodecSpec& v,
                  std::string role) {
  SupportRow r{std::string(t.name), std::move(role), spec.head_dim, t.grouped ? spec.group : 0, 0, 0, false, ""};
  if (t.per_head) {  // one codec per (layer, kv head) from a calibration file: its bytes are the file's (PN-Mix)
    r.cpu = spec.head_dim % 32 == 0 && spec.head_dim <= kCpuMaxHeadDim;
    return r;
  }
  try {
    const auto codec = make_codec(spec);
    r.bytes_per_token = double(codec->bytes_per_block()) / codec->tokens_per_block();
    r.bits = codec->bits_per_element();
    r.cpu = true;
  } catch (const Error&) {
    // Not a CPU shape (e.g. a group that does not divide head_dim): listed as unsupported.
  }
  CacheConfig both;  // this codec for keys and values, the default windows and pages
  both.k = k, both.v = v;
  int gpu = cuda::gpu_instance(both, spec.head_dim);
  // No row pairs it with itself (TurboQuant's keys and values): the first row that stores it on either side.
  if (gpu < 0 && (cuda::gpu_spec_stored(k) || cuda::gpu_spec_stored(v)))
    for (int i = 0; i < cuda::kGpuInstanceCount && gpu < 0; ++i)
      if (cuda::kGpuInstances[i].k == t.id || cuda::kGpuInstances[i].v == t.id) gpu = i;
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
                  std::string(implied_transform(c.k, c.v)), false, ""};
      try {
        const auto k = make_codec(c.k), v = make_codec(c.v);
        r.bytes_per_token = double(k->bytes_per_block()) + double(v->bytes_per_block());
        r.bits = 8.0 * r.bytes_per_token / (2.0 * d);
        r.cpu = true;
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

}  // namespace kvq
