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
  const int gpu = cuda::gpu_instance(both, spec.head_dim);
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
          rows.push_back(row_of(t, kd, kd, vd, "k,v"));
        }
      }
  return rows;
}

std::string format_support_matrix(const std::vector<SupportRow>& rows) {
  size_t w = 8;  // the codec column: as wide as the longest name
  for (const SupportRow& r : rows) w = std::max(w, r.codec.size());
  std::string out = fmt::format("{:<{}} {:<4} {:>8} {:>5} {:>11} {:>6}  {:<4} {}\n", "codec", w, "kv", "head_dim",
                                "group", "bytes/token", "bits", "cpu", "cuda (keys and values of this codec)");
  for (const SupportRow& r : rows)
    out += fmt::format("{:<{}} {:<4} {:>8} {:>5} {:>11} {:>6}  {:<4} {}\n", r.codec, w, r.role, r.head_dim,
                       r.group ? std::to_string(r.group) : "-", r.cpu ? fmt::format("{:g}", r.bytes_per_token) : "-",
                       r.cpu ? fmt::format("{:.3f}", r.bits) : "-", r.cpu ? "yes" : "no",
                       r.cuda.empty() ? "no" : r.cuda);
  return out;
}

}  // namespace kvq
