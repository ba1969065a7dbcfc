#include "kv/transform.h"

#include <algorithm>
#include <array>
#include <vector>

#include "common/thread_pool.h"
#include "rotation/hadamard.h"

namespace kvq {

namespace {

// Rows handed to the rotation kernel at once, and so the work of one pool item: enough for its blocks of rows to share
// each tile of R, few enough that a prefill chunk spreads over every thread.
constexpr int kRowsPerItem = 32;

// The rows (t, j) of x [n, heads, d] whose head j belongs to a given kv head (j / (heads / n_kv)).
struct HeadRows {
  float* x = nullptr;
  int heads = 0;
};

// One rotation: per kv head h, the rows of every part that belong to h, rotated by mats[(layer, h)] (transpose: by its
// transpose). Keys and queries share R_K and so one job: each tile of R_K is read once for both.
struct RotationJob {
  const float* mats = nullptr;  // [n_layers, n_kv, d, d]; null: no job
  bool transpose = false;
  std::array<HeadRows, 2> parts{};
  int hadamard = 0;  // > 0: every matrix is block-diagonal H_n / sqrt(n) with n = hadamard (KvTransform::k_hadamard)
};

// rows[r] <- rows[r] · R for R block-diagonal with blocks H_n · scale (scale = R[0][0], the matrix's own float
// 1/sqrt(n)): each block's unnormalised Walsh–Hadamard butterflies in double (rotation/hadamard.h), then one product by
// the scale and one rounding to float. H_n is symmetric, so R's transpose is R.
void hadamard_rows(float* const* rows, int n_rows, int d, int n, float scale) {
  double stack[kMaxRotationDim];
  std::vector<double> heap;
  double* x = d <= kMaxRotationDim ? stack : (heap.resize(size_t(d)), heap.data());
  for (int r = 0; r < n_rows; ++r) {
    float* row = rows[r];
    for (int a = 0; a < d; ++a) x[a] = row[a];
    walsh_hadamard_rows(x, d / n, n);  // the d / n blocks of n as rows
    for (int a = 0; a < d; ++a) row[a] = float(x[a] * double(scale));
  }
}

// Runs the jobs' rows in items of up to kRowsPerItem rows of one kv head, spread over the pool when there is one.
void run_rotations(const std::array<RotationJob, 2>& jobs, int layer, int n_kv, int d, int n, const TransformExec& e) {
  const RotateRowsFn rotate = rotate_rows_kernel(e.simd);
  int rows_per_head[2] = {0, 0}, items_per_head[2] = {0, 0};
  for (int j = 0; j < 2; ++j) {
    if (!jobs[size_t(j)].mats) continue;
    for (const HeadRows& p : jobs[size_t(j)].parts) rows_per_head[j] += p.x ? n * (p.heads / n_kv) : 0;
    items_per_head[j] = (rows_per_head[j] + kRowsPerItem - 1) / kRowsPerItem;
  }
  const int64_t items0 = int64_t(n_kv) * items_per_head[0], items = items0 + int64_t(n_kv) * items_per_head[1];
  const auto item = [&](int64_t i, int) {
    const int j = i < items0 ? 0 : 1;
    const RotationJob& job = jobs[size_t(j)];
    const int64_t k = j == 0 ? i : i - items0;
    const int h = int(k / items_per_head[j]), r0 = int(k % items_per_head[j]) * kRowsPerItem;
    const int nr = std::min(kRowsPerItem, rows_per_head[j] - r0);
    float* rows[kRowsPerItem];
    for (int r = 0; r < nr; ++r) {
      int x = r0 + r;  // the x-th row of kv head h over the parts
      for (const HeadRows& p : job.parts) {
        if (!p.x) continue;
        const int g = p.heads / n_kv;
        if (x < n * g) {
          rows[r] = p.x + (size_t(x / g) * p.heads + h * g + x % g) * d;
          break;
        }
        x -= n * g;
      }
    }
    const float* R = job.mats + (size_t(layer) * n_kv + h) * d * d;
    if (job.hadamard > 0) hadamard_rows(rows, nr, d, job.hadamard, R[0]);
    else rotate(rows, nr, R, d, job.transpose);
  };
  if (e.pool && e.pool->size() > 1 && items > 1) {
    e.pool->parallel_for(items, item);
  } else {
    for (int64_t i = 0; i < items; ++i) item(i, 0);
  }
}

const float* mats_or_null(const std::vector<float>& m) { return m.empty() ? nullptr : m.data(); }

}  // namespace

void KvTransform::centre_keys(int layer, int n, float* k) const {
  if (key_mean.empty()) return;
  const int d = head_dim;
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < n_kv_heads; ++h) {
      float* row = k + (size_t(t) * n_kv_heads + h) * d;
      const float* mu = key_mean.data() + (size_t(layer) * n_kv_heads + h) * d;
      for (int c = 0; c < d; ++c) row[c] -= mu[c];
    }
}

void KvTransform::inputs(int layer, int n, float* k, float* v, int n_heads, float* q, const TransformExec& x) const {
  if (k) centre_keys(layer, n, k);
  std::array<RotationJob, 2> jobs{};
  if (k || q) jobs[0] = {mats_or_null(r_k), false, {HeadRows{k, n_kv_heads}, HeadRows{q, n_heads}}, k_hadamard};
  if (v) jobs[1] = {mats_or_null(r_v), false, {HeadRows{v, n_kv_heads}, HeadRows{}}, v_hadamard};
  run_rotations(jobs, layer, n_kv_heads, head_dim, n, x);
}

void KvTransform::keys(int layer, int n, float* k, const TransformExec& x) const {
  inputs(layer, n, k, nullptr, 0, nullptr, x);
}

void KvTransform::values(int layer, int n, float* v, const TransformExec& x) const {
  inputs(layer, n, nullptr, v, 0, nullptr, x);
}

void KvTransform::queries(int layer, int n, int n_heads, float* q, const TransformExec& x) const {
  inputs(layer, n, nullptr, nullptr, n_heads, q, x);
}

void KvTransform::outputs(int layer, int n, int n_heads, float* o, const TransformExec& x) const {
  const RotationJob job{mats_or_null(r_v), true, {HeadRows{o, n_heads}, HeadRows{}}, v_hadamard};
  run_rotations({job, RotationJob{}}, layer, n_kv_heads, head_dim, n, x);
}

}  // namespace kvq
