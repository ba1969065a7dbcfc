#include "codecs/fp8/fp8_scales.h"

#include <cmath>

#include "common/error.h"
#include "common/version.h"
#include "model/safetensors.h"

namespace kvq {

namespace {

constexpr const char* kMetaKey = "kvq_fp8_scales";
constexpr const char* kTensors[4] = {"k_amax", "v_amax", "k_scale", "v_scale"};

float scale_of(float amax, fp8::Format f) {
  const float s = amax / fp8_max(f);
  return s > 0.f ? s : fp8::kMinScale;
}

}  // namespace

float fp8_max(fp8::Format f) { return f == fp8::Format::kE4m3 ? 448.f : 57344.f; }
const char* fp8_format_name(fp8::Format f) { return f == fp8::Format::kE4m3 ? "e4m3" : "e5m2"; }

Fp8Scales Fp8Scales::from_amax(fp8::Format format, std::vector<float> k_amax, std::vector<float> v_amax) {
  KVQ_CHECK(!k_amax.empty() && k_amax.size() == v_amax.size(), "fp8 scales: {} key and {} value maxima",
            k_amax.size(), v_amax.size());
  Fp8Scales s;
  s.format = format;
  for (size_t l = 0; l < k_amax.size(); ++l) {
    KVQ_CHECK(std::isfinite(k_amax[l]) && std::isfinite(v_amax[l]) && k_amax[l] >= 0.f && v_amax[l] >= 0.f,
              "fp8 scales: layer {} has maxima {} / {} (finite and >= 0 expected)", l, k_amax[l], v_amax[l]);
    s.k_scale.push_back(scale_of(k_amax[l], format));
    s.v_scale.push_back(scale_of(v_amax[l], format));
  }
  s.k_amax = std::move(k_amax);
  s.v_amax = std::move(v_amax);
  return s;
}

void save_fp8_scales(const std::string& path, const Fp8Scales& s, nlohmann::json meta) {
  const int L = s.n_layers();
  KVQ_CHECK(L > 0 && int(s.v_scale.size()) == L && int(s.k_amax.size()) == L && int(s.v_amax.size()) == L,
            "save_fp8_scales: inconsistent layer counts");
  meta["method"] = "fp8-scales";
  meta["format"] = fp8_format_name(s.format);
  meta["n_layers"] = L;
  meta["kvq_version"] = std::string(KVQ_VERSION) + " (" + git_describe() + ")";
  const std::vector<float>* values[4] = {&s.k_amax, &s.v_amax, &s.k_scale, &s.v_scale};
  std::vector<OwnedTensor> tensors;
  for (int i = 0; i < 4; ++i) tensors.push_back(OwnedTensor::from_f32(kTensors[i], DType::F32, {L}, *values[i]));
  write_safetensors(path, tensors, {{kMetaKey, meta.dump()}});
}

Fp8Scales load_fp8_scales(const std::string& path) {
  auto f = SafeTensorsFile::open(path);  // refuses a truncated file or a broken header, naming it
  const auto it = f->metadata().find(kMetaKey);
  KVQ_CHECK(it != f->metadata().end(), "{}: not a kvq FP8 scales file (no '{}' metadata; kvq calibrate --method "
            "fp8-scales writes one)", path, kMetaKey);
  nlohmann::json meta;
  int L = 0;
  std::string format;
  try {
    meta = nlohmann::json::parse(it->second);
    L = meta.at("n_layers").get<int>();
    format = meta.at("format").get<std::string>();
    KVQ_CHECK(meta.at("method").get<std::string>() == "fp8-scales", "{}: method '{}' is not fp8-scales", path,
              meta.at("method").get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    KVQ_FAIL("{}: FP8 scales metadata is not valid ({})", path, e.what());
  }
  KVQ_CHECK(L > 0 && L < 4096, "{}: implausible layer count {}", path, L);
  KVQ_CHECK(format == "e4m3" || format == "e5m2", "{}: format '{}' is neither e4m3 nor e5m2", path, format);
  const fp8::Format fmt = format == "e4m3" ? fp8::Format::kE4m3 : fp8::Format::kE5m2;
  std::vector<float> v[4];
  for (int i = 0; i < 4; ++i) {
    const TensorInfo& info = f->at(kTensors[i]);
    KVQ_CHECK(info.dtype == DType::F32 && info.shape == std::vector<int64_t>{L}, "{}: tensor {} is {} [{}], expected "
              "F32 [{}]", path, kTensors[i], dtype_name(info.dtype), fmt::join(info.shape, ", "), L);
    v[i].resize(size_t(L));
    to_f32(TensorRef{&info, f->data(info)}, v[i].data());
  }
  Fp8Scales out;
  try {
    out = Fp8Scales::from_amax(fmt, v[0], v[1]);
  } catch (const Error& e) {
    KVQ_FAIL("{}: {} (corrupt)", path, e.what());
  }
  for (int l = 0; l < L; ++l)
    KVQ_CHECK(v[2][size_t(l)] == out.k_scale[size_t(l)] && v[3][size_t(l)] == out.v_scale[size_t(l)],
              "{}: layer {}'s scales {} / {} are not its maxima / {} ({} / {}; corrupt)", path, l, v[2][size_t(l)],
              v[3][size_t(l)], fp8_max(fmt), out.k_scale[size_t(l)], out.v_scale[size_t(l)]);
  out.meta = std::move(meta);
  out.path = path;
  return out;
}

void check_fp8_scales_fit(const Fp8Scales& s, const std::string& model_fingerprint, int n_layers) {
  KVQ_CHECK(s.n_layers() == n_layers, "{}: FP8 scales for {} layers, this model has {}", s.path, s.n_layers(),
            n_layers);
  const std::string fp = s.meta.value("model_fingerprint", "");
  KVQ_CHECK(model_fingerprint.empty() || fp == model_fingerprint,
            "{}: FP8 scales were calibrated on another model (fingerprint {}…, this model {}…)", s.path,
            fp.empty() ? "none" : fp.substr(0, 12), model_fingerprint.substr(0, 12));
}

}  // namespace kvq
