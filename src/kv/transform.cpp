#include "kv/transform.h"

#include <vector>

namespace kvq {

namespace {

// rows[i] <- rows[i] · R (transpose: rows[i] · R^T), R: [d, d] row-major, for n_rows rows of stride d.
// Accumulates in double so that a rotation and its inverse round-trip to float precision.
void rotate_rows(float* rows, int n_rows, const float* R, int d, bool transpose) {
  std::vector<double> tmp(static_cast<size_t>(d));
  for (int i = 0; i < n_rows; ++i) {
    float* x = rows + size_t(i) * d;
    std::fill(tmp.begin(), tmp.end(), 0.0);
    if (!transpose) {
      for (int a = 0; a < d; ++a) {
        const double xa = x[a];
        const float* r = R + size_t(a) * d;
        for (int b = 0; b < d; ++b) tmp[size_t(b)] += xa * r[b];
      }
    } else {
      for (int b = 0; b < d; ++b) {
        const float* r = R + size_t(b) * d;
        double s = 0.0;
        for (int a = 0; a < d; ++a) s += double(x[a]) * r[a];
        tmp[size_t(b)] = s;
      }
    }
    for (int c = 0; c < d; ++c) x[c] = float(tmp[size_t(c)]);
  }
}

}  // namespace

void KvTransform::keys(int layer, int n, float* k) const {
  const int d = head_dim;
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < n_kv_heads; ++h) {
      float* row = k + (size_t(t) * n_kv_heads + h) * d;
      if (!key_mean.empty()) {
        const float* mu = key_mean.data() + (size_t(layer) * n_kv_heads + h) * d;
        for (int c = 0; c < d; ++c) row[c] -= mu[c];
      }
      if (!r_k.empty()) rotate_rows(row, 1, r_k.data() + (size_t(layer) * n_kv_heads + h) * d * d, d, false);
    }
}

void KvTransform::values(int layer, int n, float* v) const {
  if (r_v.empty()) return;
  const int d = head_dim;
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < n_kv_heads; ++h)
      rotate_rows(v + (size_t(t) * n_kv_heads + h) * d, 1, r_v.data() + (size_t(layer) * n_kv_heads + h) * d * d, d,
                  false);
}

void KvTransform::queries(int layer, int n, int n_heads, float* q) const {
  if (r_k.empty()) return;
  const int d = head_dim, g = n_heads / n_kv_heads;
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < n_heads; ++j)
      rotate_rows(q + (size_t(t) * n_heads + j) * d, 1, r_k.data() + (size_t(layer) * n_kv_heads + j / g) * d * d, d,
                  false);
}

void KvTransform::outputs(int layer, int n, int n_heads, float* o) const {
  if (r_v.empty()) return;
  const int d = head_dim, g = n_heads / n_kv_heads;
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < n_heads; ++j)
      rotate_rows(o + (size_t(t) * n_heads + j) * d, 1, r_v.data() + (size_t(layer) * n_kv_heads + j / g) * d * d, d,
                  true);
}

}  // namespace kvq
