#include "model/value_fold.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/half.h"
#include "common/thread_pool.h"

namespace kvq {

namespace {

constexpr int64_t kRowsPerItem = 64;  // rows a pool item widens or rounds

// All of w widened to fp32, rows spread over the pool.
std::vector<float> widen(const WeightTensor& w, ThreadPool& pool) {
  std::vector<float> out(w.numel());
  const size_t cols = size_t(w.cols);
  pool.parallel_for((w.rows + kRowsPerItem - 1) / kRowsPerItem, [&](int64_t item, int) {
    const int64_t r0 = item * kRowsPerItem, r1 = std::min(w.rows, r0 + kRowsPerItem);
    w.to_f32(size_t(r0) * cols, size_t(r1 - r0) * cols, out.data() + size_t(r0) * cols);
  });
  return out;
}

// src [rows, cols] rounded once to dtype (round to nearest even) into memory the fold owns; a value that does not fit
// the dtype is an error naming the tensor.
WeightTensor narrow(const std::vector<float>& src, int64_t rows, int64_t cols, DType dtype, const char* what,
                    int layer, ValueFold& fold, ThreadPool& pool) {
  WeightTensor w;
  w.dtype = dtype, w.rows = rows, w.cols = cols;
  fold.owned.push_back(std::make_unique<uint8_t[]>(w.nbytes()));
  uint8_t* bytes = fold.owned.back().get();
  w.data = bytes;
  fold.bytes += w.nbytes();
  const size_t n = size_t(cols);
  pool.parallel_for((rows + kRowsPerItem - 1) / kRowsPerItem, [&](int64_t item, int) {
    const size_t i0 = size_t(item * kRowsPerItem) * n, i1 = size_t(std::min(rows, (item + 1) * kRowsPerItem)) * n;
    for (size_t i = i0; i < i1; ++i) {
      const float x = src[i];
      if (dtype == DType::F32) {
        std::memcpy(bytes + 4 * i, &x, 4);
        continue;
      }
      const uint16_t h = dtype == DType::BF16 ? f32_to_bf16(x) : f32_to_fp16(x);
      const float back = dtype == DType::BF16 ? bf16_to_f32(h) : fp16_to_f32(h);
      KVQ_CHECK(std::isfinite(back) || !std::isfinite(x), "value rotation fold: layer {} {} value {} overflows {}",
                layer, what, x, dtype_name(dtype));
      std::memcpy(bytes + 2 * i, &h, 2);
    }
  });
  return w;
}

}  // namespace

const WeightTensor& ValueFold::matrix(const Weights& w, TensorRole role, int layer) const {
  if (role == TensorRole::Wv) return layers.at(size_t(layer)).wv;
  if (role == TensorRole::Wo) return layers.at(size_t(layer)).wo;
  return w.matrix(role, layer);
}

const std::vector<float>& ValueFold::vector(const Weights& w, TensorRole role, int layer) const {
  if (role == TensorRole::Bv) return layers.at(size_t(layer)).bv;
  return w.vector(role, layer);
}

std::shared_ptr<const KvTransform> without_value_rotation(const KvTransform& t) {
  auto rest = std::make_shared<KvTransform>(t);
  rest->r_v.clear();
  rest->v_hadamard = 0;
  return rest;
}

std::unique_ptr<ValueFold> fold_value_rotation(const Weights& w, const ModelConfig& cfg,
                                               std::shared_ptr<const KvTransform> t, ThreadPool& pool) {
  const auto t0 = std::chrono::steady_clock::now();
  const int L = cfg.n_layers, hk = cfg.n_kv_heads, hq = cfg.n_heads, d = cfg.head_dim, H = cfg.hidden_size;
  KVQ_CHECK(t && !t->r_v.empty(), "value rotation fold: the transform '{}' has no value rotation",
            t ? t->name : "none");
  KVQ_CHECK(t->n_layers == L && t->n_kv_heads == hk && t->head_dim == d &&
                t->r_v.size() == size_t(L) * hk * d * d && int(w.layers.size()) == L,
            "value rotation fold: transform '{}' of (layers {}, kv heads {}, d {}) does not fit the model ({}, {}, {})",
            t->name, t->n_layers, t->n_kv_heads, t->head_dim, L, hk, d);
  auto fold = std::make_unique<ValueFold>();
  fold->transform = t;
  fold->rest = without_value_rotation(*t);
  fold->layers.resize(size_t(L));
  const int g = hq / hk;  // query heads per kv head
  std::vector<float> out;
  for (int l = 0; l < L; ++l) {
    const LayerWeights& lw = w.layers[size_t(l)];
    ValueFold::Layer& fl = fold->layers[size_t(l)];
    const float* R = t->r_v.data() + size_t(l) * hk * d * d;  // [hk][d][d]
    // W_V' rows of head h = R_hᵀ W_V[h rows]; b_V' = b_h R_h.
    const std::vector<float> wv = widen(lw.wv, pool);
    out.assign(wv.size(), 0.f);
    for (int h = 0; h < hk; ++h)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, H, d, 1.f, R + size_t(h) * d * d, d,
                  wv.data() + size_t(h) * d * H, H, 0.f, out.data() + size_t(h) * d * H, H);
    fl.wv = narrow(out, lw.wv.rows, lw.wv.cols, lw.wv.dtype, "v_proj", l, *fold, pool);
    if (!lw.bv.empty()) {
      fl.bv.assign(lw.bv.size(), 0.f);
      for (int h = 0; h < hk; ++h)
        for (int i = 0; i < d; ++i)
          for (int c = 0; c < d; ++c)
            fl.bv[size_t(h) * d + c] += lw.bv[size_t(h) * d + i] * R[(size_t(h) * d + i) * d + c];
    }
    // W_O' columns of query head j = W_O[:, j] R_{j / g}.
    const std::vector<float> wo = widen(lw.wo, pool);
    out.assign(wo.size(), 0.f);
    const int qd = hq * d;
    for (int j = 0; j < hq; ++j)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, H, d, d, 1.f, wo.data() + size_t(j) * d, qd,
                  R + size_t(j / g) * d * d, d, 0.f, out.data() + size_t(j) * d, qd);
    fl.wo = narrow(out, lw.wo.rows, lw.wo.cols, lw.wo.dtype, "o_proj", l, *fold, pool);
    lw.wv.release();
    lw.wo.release();
  }
  fold->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return fold;
}

}  // namespace kvq
