#include "model/linear.h"

#include <cblas.h>

#include <algorithm>

#include "common/error.h"
#include "common/half.h"

namespace kvq {

namespace {

constexpr int kRowsPerItem = 64;  // output rows per work item of the bf16 path

// The bf16 bits of w when every element is exactly a bfloat16 (its low 16 bits are zero); empty otherwise.
std::vector<uint16_t> exact_bf16(const std::vector<float>& w) {
  std::vector<uint16_t> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    const bf16_t b = f32_to_bf16(w[i]);
    if (bf16_to_f32(b) != w[i] && !(w[i] != w[i])) return {};
    out[i] = b;
  }
  return out;
}

}  // namespace

Linear::Linear(const std::vector<float>& w, int out, int in, const std::vector<float>& bias, SimdLevel simd)
    : w_(w.data()), bias_(bias.empty() ? nullptr : bias.data()), out_(out), in_(in) {
  // The row kernels read rows in units of 32 values.
  if (in % 32 == 0) w_bf16_ = exact_bf16(w);
  if (!w_bf16_.empty()) bf16_ = row_kernels(RowFormat::kBf16, simd);
}

void Linear::apply_rows(const float* x, int n, float* y, ThreadPool& pool) const {
  KVQ_CHECK(reads_bf16(), "internal: Linear::apply_rows needs the bf16 copy ({} x {} layer)", out_, in_);
  for (int i0 = 0; i0 < n; i0 += kGemvRows)
    apply(x + size_t(i0) * in_, std::min(kGemvRows, n - i0), y + size_t(i0) * out_, pool);
}

void Linear::apply(const float* x, int n, float* y, ThreadPool& pool) const {
  if (n <= kGemvRows && reads_bf16()) {
    const int items = (out_ + kRowsPerItem - 1) / kRowsPerItem;
    pool.parallel_for(items, [&](int64_t item, int) {
      const int o0 = int(item) * kRowsPerItem, rows = std::min(kRowsPerItem, out_ - o0);
      RowsView view;
      view.rows = reinterpret_cast<const uint8_t*>(w_bf16_.data() + size_t(o0) * in_);
      view.row_stride = size_t(in_) * sizeof(uint16_t);
      view.d = view.group = in_;
      view.n_rows = rows;
      bf16_.scores(view, x, n, y + o0, size_t(out_));
    });
  } else if (n == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, out_, in_, 1.f, w_, in_, x, 1, 0.f, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out_, in_, 1.f, x, in_, w_, in_, 0.f, y, out_);
  }
  if (bias_)
    for (int i = 0; i < n; ++i)
      for (int o = 0; o < out_; ++o) y[size_t(i) * out_ + o] += bias_[o];
}

}  // namespace kvq
