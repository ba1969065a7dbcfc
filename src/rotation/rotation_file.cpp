#include "rotation/rotation_file.h"

#include <cmath>
#include <random>
#include <vector>

#include "codecs/llamacpp/attn_rot.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "common/version.h"
#include "model/safetensors.h"
#include "rotation/hadamard.h"

namespace kvq {

namespace {

constexpr const char* kMetaKey = "kvq_rotation";

// The tensor `name` of f, [heads, d, d] or [d, d] (a per-layer matrix, replicated); kvq::Error naming it otherwise.
const TensorInfo& matrices(const SafeTensorsFile& f, const std::string& name, int heads, int d) {
  const TensorInfo& info = f.at(name);
  const bool per_head = info.shape == std::vector<int64_t>{heads, d, d};
  const bool per_layer = info.shape == std::vector<int64_t>{d, d};
  KVQ_CHECK(per_head || per_layer, "{}: tensor {} has shape {}, expected [{}, {}, {}] or [{}, {}]", f.path(), name,
            fmt::join(info.shape, "x"), heads, d, d, d, d);
  return info;
}

// Copies one layer's [heads, d, d] or [d, d] tensor into dst [heads, d, d] (replicating a per-layer matrix).
void read_matrices(const SafeTensorsFile& f, const std::string& name, int heads, int d, float* dst) {
  const TensorInfo& info = matrices(f, name, heads, d);
  const std::vector<float> v = to_f32(TensorRef{&info, f.data(info)});
  const bool per_head = info.shape.size() == 3;
  for (int h = 0; h < heads; ++h)
    std::copy_n(v.data() + (per_head ? size_t(h) * d * d : 0), size_t(d) * d, dst + size_t(h) * d * d);
}

void check_orthogonal(const float* r, int d, const std::string& what) {
  double worst = 0;
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      double dot = 0;
      for (int c = 0; c < d; ++c) dot += double(r[size_t(i) * d + c]) * r[size_t(j) * d + c];
      worst = std::max(worst, std::fabs(dot - (i == j ? 1.0 : 0.0)));
    }
  KVQ_CHECK(worst < 1e-3, "{} is not orthogonal (max |R R^T - I| = {:.3g})", what, worst);
}

}  // namespace

void save_rotation_file(const std::string& path, const KvTransform& t, nlohmann::json meta) {
  const int L = t.n_layers, H = t.n_kv_heads, d = t.head_dim;
  meta["n_layers"] = L;
  meta["n_kv_heads"] = H;
  meta["head_dim"] = d;
  meta["kvq_version"] = std::string(KVQ_VERSION) + " (" + git_describe() + ")";
  std::vector<OwnedTensor> tensors;
  const size_t mat = size_t(H) * d * d;
  for (int l = 0; l < L; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    auto slice = [&](const std::vector<float>& all, size_t n) {
      if (all.empty()) {  // identity
        std::vector<float> eye(mat, 0.f);
        for (int h = 0; h < H; ++h)
          for (int i = 0; i < d; ++i) eye[size_t(h) * d * d + size_t(i) * d + i] = 1.f;
        return eye;
      }
      return std::vector<float>(all.begin() + long(l * n), all.begin() + long((l + 1) * n));
    };
    tensors.push_back(OwnedTensor::from_f32(p + "r_k", DType::F32, {H, d, d}, slice(t.r_k, mat)));
    tensors.push_back(OwnedTensor::from_f32(p + "r_v", DType::F32, {H, d, d}, slice(t.r_v, mat)));
    if (!t.key_mean.empty()) {
      const size_t n = size_t(H) * d;
      tensors.push_back(OwnedTensor::from_f32(
          p + "key_mean", DType::F32, {H, d},
          std::vector<float>(t.key_mean.begin() + long(l * n), t.key_mean.begin() + long((l + 1) * n))));
    }
  }
  write_safetensors(path, tensors, {{kMetaKey, meta.dump()}});
}

RotationFile load_rotation_file(const std::string& path) {
  auto f = SafeTensorsFile::open(path);
  const auto it = f->metadata().find(kMetaKey);
  KVQ_CHECK(it != f->metadata().end(), "{}: not a kvq rotation file (no '{}' metadata)", path, kMetaKey);
  RotationFile out;
  try {
    out.meta = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& e) {
    KVQ_FAIL("{}: rotation metadata is not valid JSON ({})", path, e.what());
  }
  KvTransform& t = out.transform;
  try {
    t.n_layers = out.meta.at("n_layers").get<int>();
    t.n_kv_heads = out.meta.at("n_kv_heads").get<int>();
    t.head_dim = out.meta.at("head_dim").get<int>();
    t.name = out.meta.at("method").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    KVQ_FAIL("{}: rotation metadata lacks a field ({})", path, e.what());
  }
  const int L = t.n_layers, H = t.n_kv_heads, d = t.head_dim;
  KVQ_CHECK(L > 0 && H > 0 && d > 0 && L < 4096 && H < 4096 && d <= 1024,
            "{}: implausible rotation sizes (layers {}, kv heads {}, d {})", path, L, H, d);
  const bool centred = f->find("layers.0.key_mean") != nullptr;
  for (int l = 0; l < L; ++l) {  // every tensor's shape before any allocation: the file backs the sizes it states
    const std::string p = "layers." + std::to_string(l) + ".";
    matrices(*f, p + "r_k", H, d);
    matrices(*f, p + "r_v", H, d);
    if (centred) {
      const TensorInfo& info = f->at(p + "key_mean");
      KVQ_CHECK((info.shape == std::vector<int64_t>{H, d}), "{}: {}key_mean has shape {}, expected [{}, {}]", path,
                p, fmt::join(info.shape, "x"), H, d);
    }
  }
  t.r_k.resize(size_t(L) * H * d * d);
  t.r_v.resize(size_t(L) * H * d * d);
  if (centred) t.key_mean.resize(size_t(L) * H * d);
  for (int l = 0; l < L; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    read_matrices(*f, p + "r_k", H, d, t.r_k.data() + size_t(l) * H * d * d);
    read_matrices(*f, p + "r_v", H, d, t.r_v.data() + size_t(l) * H * d * d);
    for (int h = 0; h < H; ++h) {
      check_orthogonal(t.r_k.data() + (size_t(l) * H + h) * d * d, d,
                       fmt::format("{}: layer {} head {} R_K", path, l, h));
      check_orthogonal(t.r_v.data() + (size_t(l) * H + h) * d * d, d,
                       fmt::format("{}: layer {} head {} R_V", path, l, h));
    }
    if (centred) {
      const TensorInfo& info = f->at(p + "key_mean");
      KVQ_CHECK((info.shape == std::vector<int64_t>{H, d}), "{}: {}key_mean has shape {}, expected [{}, {}]", path,
                p, fmt::join(info.shape, "x"), H, d);
      to_f32(TensorRef{&info, f->data(info)}, t.key_mean.data() + size_t(l) * H * d);
    }
  }
  for (float x : t.key_mean) KVQ_CHECK(std::isfinite(x), "{}: non-finite key mean", path);
  return out;
}

void check_rotation_fits(const RotationFile& f, const std::string& model_fingerprint, int n_layers, int n_kv_heads,
                         int head_dim, const CacheConfig& cache) {
  const KvTransform& t = f.transform;
  KVQ_CHECK(t.n_layers == n_layers && t.n_kv_heads == n_kv_heads && t.head_dim == head_dim,
            "rotation file is for a model with {} layers × {} kv heads × d {}, this model has {} × {} × {}", t.n_layers,
            t.n_kv_heads, t.head_dim, n_layers, n_kv_heads, head_dim);
  const std::string fp = f.meta.value("model_fingerprint", "");
  KVQ_CHECK(fp.empty() || fp == model_fingerprint,
            "rotation file was calibrated on another model (fingerprint {}…, this model {}…)", fp.substr(0, 12),
            model_fingerprint.substr(0, 12));
  if (!f.meta.contains("cache")) return;  // data-free or grid-independent rotations
  const nlohmann::json& c = f.meta["cache"];
  auto mismatch = [&](const char* field, const std::string& file_value, const std::string& ours) {
    KVQ_CHECK(file_value == ours, "rotation file was calibrated for {} = {}, the cache uses {} (recalibrate, or use "
              "matching cache flags)", field, file_value, ours);
  };
  mismatch("cache type k", c.value("type_k", ""), cache.k.type);
  mismatch("cache type v", c.value("type_v", ""), cache.v.type);
  mismatch("--kv-group", std::to_string(c.value("group", 0)), std::to_string(cache.k.group));
  mismatch("--kv-clip-k", fmt::format("{:g}", c.value("clip_k", 0.0)), fmt::format("{:g}", cache.k.clip));
  mismatch("--kv-clip-v", fmt::format("{:g}", c.value("clip_v", 0.0)), fmt::format("{:g}", cache.v.clip));
  mismatch("--kv-sink", std::to_string(c.value("sink", -1)), std::to_string(cache.sink));
  mismatch("--kv-recent", std::to_string(c.value("recent", -1)), std::to_string(cache.recent));
}

KvTransform hadamard_key_transform(int n_layers, int n_kv_heads, int head_dim) {
  KvTransform t;
  t.n_layers = n_layers;
  t.n_kv_heads = n_kv_heads;
  t.head_dim = head_dim;
  t.name = std::string(transform_name(CodecTransform::kHadamardKeys));
  t.r_k = block_hadamard(head_dim, head_dim, n_layers * n_kv_heads);
  t.k_hadamard = head_dim;
  return t;
}

KvTransform hadamard_transform(int n_layers, int n_kv_heads, int head_dim) {
  KvTransform t = hadamard_key_transform(n_layers, n_kv_heads, head_dim);
  t.name = std::string(transform_name(CodecTransform::kHadamard));
  t.r_v = t.r_k;
  t.v_hadamard = head_dim;
  return t;
}

void orthonormalise_rows(double* m, int d) {
  for (int i = 0; i < d; ++i) {
    double* r = m + size_t(i) * d;
    for (int j = 0; j < i; ++j) {
      const double* o = m + size_t(j) * d;
      double dot = 0;
      for (int c = 0; c < d; ++c) dot += r[c] * o[c];
      for (int c = 0; c < d; ++c) r[c] -= dot * o[c];
    }
    double norm = 0;
    for (int c = 0; c < d; ++c) norm += r[c] * r[c];
    for (int c = 0; c < d; ++c) r[c] /= std::sqrt(norm);
  }
}

KvTransform random_rotation_transform(int n_layers, int n_kv_heads, int head_dim, uint64_t seed) {
  KVQ_CHECK(n_layers > 0 && n_kv_heads > 0 && head_dim > 0, "random_rotation_transform: shape ({}, {}, {})", n_layers,
            n_kv_heads, head_dim);
  KvTransform t;
  t.n_layers = n_layers, t.n_kv_heads = n_kv_heads, t.head_dim = head_dim, t.name = "random (timing only)";
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const size_t d = size_t(head_dim), mats = size_t(n_layers) * size_t(n_kv_heads);
  std::vector<double> m(d * d);
  const auto orthogonal = [&](std::vector<float>& out) {
    for (double& x : m) x = normal(rng);
    orthonormalise_rows(m.data(), head_dim);
    out.insert(out.end(), m.begin(), m.end());
  };
  t.r_k.reserve(mats * d * d), t.r_v.reserve(mats * d * d), t.key_mean.reserve(mats * d);
  for (size_t i = 0; i < mats; ++i) {
    orthogonal(t.r_k);
    orthogonal(t.r_v);
    for (size_t c = 0; c < d; ++c) t.key_mean.push_back(float(0.1 * normal(rng)));
  }
  return t;
}

std::shared_ptr<const KvTransform> codec_transform(const CacheConfig& cache, int n_layers, int n_kv_heads,
                                                   int head_dim) {
  const CodecTransform kind = implied_transform(cache.k, cache.v);
  if (kind == CodecTransform::kNone) return nullptr;
  // llama.cpp's: keys and values decide apart; head_dim % 64 != 0 rotates nothing
  if (kind == CodecTransform::kAttnRot) {
    const AttnRot rot = attn_rot_for(cache, head_dim);
    if (!rot.on()) return nullptr;
    return std::make_shared<KvTransform>(attn_rot_transform(rot, n_layers, n_kv_heads, head_dim));
  }
  const bool keys_only = kind == CodecTransform::kHadamardKeys;
  KVQ_CHECK(is_power_of_two(head_dim),
            "cache types k={} v={} imply the Hadamard on {} ({}), which needs a power-of-two head_dim (the model has {})",
            cache.k.type, cache.v.type, keys_only ? "keys" : "keys and values", keys_only ? "TurboQuant" : "OScaR",
            head_dim);
  return std::make_shared<KvTransform>(keys_only ? hadamard_key_transform(n_layers, n_kv_heads, head_dim)
                                                 : hadamard_transform(n_layers, n_kv_heads, head_dim));
}

}  // namespace kvq
