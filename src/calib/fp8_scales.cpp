#include "calib/fp8_scales.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>

#include "common/error.h"

namespace kvq {

namespace {

// The running maxima of |k| and |v| per layer; a non-finite value is one clear error (a model that makes NaNs has no
// range to calibrate).
class AmaxTap final : public Model::LayerTap {
 public:
  AmaxTap(int n_layers, int n_kv, int head_dim) : row_(size_t(n_kv) * head_dim), k_(size_t(n_layers)), v_(k_) {}
  void on_qkv(int layer, int pos0, int n, const float*, const float* k, const float* v) override {
    for (auto [x, amax, what] : {std::tuple{k, &k_, "key"}, std::tuple{v, &v_, "value"}}) {
      float m = (*amax)[size_t(layer)];
      for (size_t i = 0; i < size_t(n) * row_; ++i) {
        KVQ_CHECK(std::isfinite(x[i]), "calibrate fp8-scales: layer {} has a non-finite {} at position {}", layer,
                  what, pos0 + int(i / row_));
        m = std::max(m, std::fabs(x[i]));
      }
      (*amax)[size_t(layer)] = m;
    }
  }
  std::vector<float> keys() const { return k_; }
  std::vector<float> values() const { return v_; }

 private:
  size_t row_;
  std::vector<float> k_, v_;  // [n_layers]
};

}  // namespace

Fp8Calibration calibrate_fp8_scales(Model& model, const std::vector<int32_t>& ids, const CalibrateConfig& cfg,
                                    fp8::Format format, const CalibrateProgress& progress) {
  const ModelConfig& mc = model.config();
  KVQ_CHECK(cfg.method == "fp8-scales", "calibrate_fp8_scales: method '{}'", cfg.method);
  cfg.validate(mc);
  AmaxTap tap(mc.n_layers, mc.n_kv_heads, mc.head_dim);
  const auto t0 = std::chrono::steady_clock::now();
  Fp8Calibration out;
  out.chunks = capture_chunks(model, ids, cfg, tap, [](int) {}, progress);
  out.tokens_used = out.chunks * cfg.chunk;
  out.capture_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.scales = Fp8Scales::from_amax(format, tap.keys(), tap.values());
  return out;
}

}  // namespace kvq
