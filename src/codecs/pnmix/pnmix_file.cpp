#include "codecs/pnmix/pnmix_file.h"

#include <cmath>

#include "calib/pnmix.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "common/version.h"
#include "model/safetensors.h"

namespace kvq {

namespace {

constexpr const char* kMetaKey = "kvq_pnmix";

std::string tensor_name(int layer, const char* what) { return "layers." + std::to_string(layer) + "." + what; }

// The tensor `name` of f with dtype and shape [heads, pairs]; kvq::Error naming it otherwise.
const TensorInfo& head_tensor(const SafeTensorsFile& f, const std::string& name, DType dtype, int heads, int pairs) {
  const TensorInfo& info = f.at(name);
  KVQ_CHECK(info.dtype == dtype && info.shape == (std::vector<int64_t>{heads, pairs}),
            "{}: tensor {} is {} [{}], expected {} [{}, {}]", f.path(), name, dtype_name(info.dtype),
            fmt::join(info.shape, ", "), dtype_name(dtype), heads, pairs);
  return info;
}

}  // namespace

void save_pnmix_file(const std::string& path, const PairBitTable& t, const std::vector<float>& scores,
                     nlohmann::json meta) {
  t.validate();
  const int L = t.n_layers, H = t.n_kv_heads, half = t.pairs();
  KVQ_CHECK(scores.size() == t.bits.size(), "save_pnmix_file: {} scores for {} widths", scores.size(), t.bits.size());
  meta["method"] = "pnmix";
  meta["n_layers"] = L;
  meta["n_kv_heads"] = H;
  meta["head_dim"] = t.head_dim;
  meta["code_bits"] = t.code_bits();
  meta["key_bits"] = t.key_bits();
  meta["kvq_version"] = std::string(KVQ_VERSION) + " (" + git_describe() + ")";
  std::vector<OwnedTensor> tensors;
  const size_t n = size_t(H) * half;
  for (int l = 0; l < L; ++l) {
    tensors.push_back(OwnedTensor::from_f32(tensor_name(l, "pair_score"), DType::F32, {H, half},
                                            std::vector<float>(scores.begin() + long(l * n),
                                                               scores.begin() + long((l + 1) * n))));
    OwnedTensor bits{tensor_name(l, "pair_bits"), DType::U8, {H, half},
                     std::vector<uint8_t>(t.bits.begin() + long(l * n), t.bits.begin() + long((l + 1) * n))};
    tensors.push_back(std::move(bits));
  }
  write_safetensors(path, tensors, {{kMetaKey, meta.dump()}});
}

PnmixFile load_pnmix_file(const std::string& path) {
  auto f = SafeTensorsFile::open(path);  // refuses a truncated file or a broken header, naming it
  const auto it = f->metadata().find(kMetaKey);
  KVQ_CHECK(it != f->metadata().end(), "{}: not a kvq PN-Mix calibration file (no '{}' metadata; kvq calibrate "
            "--method pnmix writes one)", path, kMetaKey);
  PnmixFile out;
  int code_bits = 0;
  std::string score;
  PairBitTable& t = out.table;
  try {
    out.meta = nlohmann::json::parse(it->second);
    t.n_layers = out.meta.at("n_layers").get<int>();
    t.n_kv_heads = out.meta.at("n_kv_heads").get<int>();
    t.head_dim = out.meta.at("head_dim").get<int>();
    code_bits = out.meta.at("code_bits").get<int>();
    score = out.meta.at("score").get<std::string>();
    KVQ_CHECK(out.meta.at("method").get<std::string>() == "pnmix", "{}: method '{}' is not pnmix", path,
              out.meta.at("method").get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    KVQ_FAIL("{}: PN-Mix metadata is not valid ({})", path, e.what());
  }
  const int L = t.n_layers, H = t.n_kv_heads, d = t.head_dim;
  KVQ_CHECK(L > 0 && H > 0 && L < 4096 && H < 4096 && d > 0 && d % 32 == 0 && d <= kCpuMaxHeadDim,
            "{}: implausible sizes (layers {}, kv heads {}, head_dim {}: a multiple of 32 up to {})", path, L, H, d,
            kCpuMaxHeadDim);
  KVQ_CHECK(score == "product" || score == "energy", "{}: score '{}' is neither product nor energy", path, score);
  const PairScore ps = parse_pair_score(score);
  t.name = std::string("pnmix(") + pair_score_name(ps) + ")";
  const int half = t.pairs();
  for (int l = 0; l < L; ++l) {  // every tensor's shape before any allocation: the file backs the sizes it states
    head_tensor(*f, tensor_name(l, "pair_bits"), DType::U8, H, half);
    head_tensor(*f, tensor_name(l, "pair_score"), DType::F32, H, half);
  }
  t.bits.resize(size_t(L) * H * half);
  out.scores.resize(t.bits.size());
  for (int l = 0; l < L; ++l) {
    const TensorInfo& bits = head_tensor(*f, tensor_name(l, "pair_bits"), DType::U8, H, half);
    const uint8_t* src = f->data(bits);
    std::copy(src, src + size_t(H) * half, t.bits.begin() + long(size_t(l) * H * half));
    const TensorInfo& sc = head_tensor(*f, tensor_name(l, "pair_score"), DType::F32, H, half);
    to_f32(TensorRef{&sc, f->data(sc)}, out.scores.data() + size_t(l) * H * half);
  }
  for (float s : out.scores)
    KVQ_CHECK(std::isfinite(s) && s >= 0.f, "{}: a pair score is {} (corrupt: scores are finite and >= 0)", path, s);
  try {
    t.validate();
  } catch (const Error& e) {
    KVQ_FAIL("{}: {}", path, e.what());
  }
  KVQ_CHECK(t.code_bits() == code_bits, "{}: the widths store {} code bits per row, the metadata says {} (corrupt)",
            path, t.code_bits(), code_bits);
  for (int m = 0; m < L * H; ++m) {
    const std::vector<uint8_t> want = allocate_pair_bits(out.scores.data() + size_t(m) * half, half, code_bits);
    KVQ_CHECK(std::equal(want.begin(), want.end(), t.bits.begin() + long(size_t(m) * half)),
              "{}: the widths of layer {} kv head {} are not the allocation of its stored scores at {} code bits "
              "(corrupt)", path, m / H, m % H, code_bits);
  }
  return out;
}

void check_pnmix_fits(const PnmixFile& f, const std::string& model_fingerprint, int n_layers, int n_kv_heads,
                      int head_dim) {
  const PairBitTable& t = f.table;
  KVQ_CHECK(t.head_dim == head_dim, "PN-Mix file is for head_dim {}, this model has head_dim {}", t.head_dim,
            head_dim);
  KVQ_CHECK(t.n_layers == n_layers && t.n_kv_heads == n_kv_heads,
            "PN-Mix file is for a model with {} layers × {} kv heads, this model has {} × {}", t.n_layers,
            t.n_kv_heads, n_layers, n_kv_heads);
  const std::string fp = f.meta.value("model_fingerprint", "");
  KVQ_CHECK(fp == model_fingerprint, "PN-Mix file was calibrated on another model (fingerprint {}…, this model {}…)",
            fp.empty() ? "none" : fp.substr(0, 12), model_fingerprint.substr(0, 12));
}

}  // namespace kvq
