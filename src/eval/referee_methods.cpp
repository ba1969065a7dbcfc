// The referee's method and rotation tables, and the one translation from a method's cache type to its codecs.
#include "eval/referee_methods.h"

#include <algorithm>
#include <sstream>

#include "common/error.h"
#include "kv/codec_registry.h"
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

// The table. Plain caches have no rotation; INT2 methods tune their clips; a learned rotation (OptR) takes the clips
// of the row it starts from and is judged against it; a calibrated rotation against the data-free one, that against
// none.
const std::vector<RefereeMethod>& referee_methods() {
  static const std::vector<RefereeMethod> kMethods = {
      {.label = "bf16", .key_type = "bf16", .value_type = "bf16", .rotation = "none", .windows_matter = false,
       .quick = true},
      {.label = "int8", .key_type = "int8", .value_type = "int8", .rotation = "none", .quick = true},
      {.label = "int4", .key_type = "int4", .value_type = "int4", .rotation = "none"},
      {.label = "kv4rl", .key_type = "int4", .value_type = "int4", .window_type = "int8", .rotation = "none",
       .baseline = "int4",
       .note = "kv4rl is int4 with INT8 sink and recent windows (METHODS §5.6); its body rows are quantized from the "
               "BF16 values, so they equal int4's and the rows differ in the windows only (CPU only)."},
      {.label = "int2", .key_type = "int2", .value_type = "int2", .rotation = "none", .tunes_clips = true,
       .quick = true},
      {.label = "kivi2", .key_type = "kivi2", .value_type = "kivi2", .rotation = "none", .quick = true},
      {.label = "int2+quarot", .key_type = "int2", .value_type = "int2", .rotation = "quarot", .tunes_clips = true,
       .baseline = "int2", .quick = true,
       .note = "int2+quarot uses the data-free Hadamard rotation (no calibration)."},
      {.label = "int2+oscar", .key_type = "int2", .value_type = "int2", .rotation = "oscar", .tunes_clips = true,
       .baseline = "int2+quarot", .quick = true},
      {.label = "optr(quarot)", .key_type = "int2", .value_type = "int2", .rotation = "optr", .base = "quarot",
       .objective = "post-wo", .tunes_clips = true, .clips_from = "int2+quarot", .baseline = "int2+quarot"},
      {.label = "optr(oscar)", .key_type = "int2", .value_type = "int2", .rotation = "optr", .base = "oscar",
       .objective = "post-wo", .tunes_clips = true, .clips_from = "int2+oscar", .baseline = "int2+oscar",
       .leakage = true, .quick = true},
      {.label = "optr-joint(oscar)", .key_type = "int2", .value_type = "int2", .rotation = "optr", .base = "oscar",
       .objective = "joint", .tunes_clips = true, .clips_from = "int2+oscar", .baseline = "int2+oscar"},
      {.label = "optr-pre-wo(oscar)", .key_type = "int2", .value_type = "int2", .rotation = "optr", .base = "oscar",
       .objective = "pre-wo", .tunes_clips = true, .clips_from = "int2+oscar", .baseline = "int2+oscar"},
      {.label = "optr-recon(oscar)", .key_type = "int2", .value_type = "int2", .rotation = "optr", .base = "oscar",
       .objective = "recon", .tunes_clips = true, .clips_from = "int2+oscar", .baseline = "int2+oscar"},
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

CacheConfig method_cache(const RefereeMethod& m, const RefereeWindows& w, int group) {
  CacheConfig c;
  c.k = method_codec_spec(m.key_type, true);
  c.v = method_codec_spec(m.value_type, false);
  c.k.group = c.v.group = group;
  c.window = m.window_type;
  c.sink = w.sink;
  c.recent = w.recent;
  return c;
}

}  // namespace kvq
