#include "model/linear.h"

#include <cblas.h>

#include <algorithm>
#include <bit>

#include "common/error.h"
#include "common/half.h"

namespace kvq {

namespace {

constexpr int kRowsPerItem = 64;  // output rows per work item of the row-kernel path
constexpr int kWidenRows = 16;    // rows of a tile one worker widens at once

// dst[0, n) = the 16-bit values at src widened to fp32 (exactly); src is aligned to 2 bytes (model/weights.h).
void widen16(DType dtype, const uint8_t* src, int n, float* dst) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
  if (dtype == DType::BF16)
    for (int i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(uint32_t(h[i]) << 16);
  else
    for (int i = 0; i < n; ++i) dst[i] = fp16_to_f32(h[i]);
}

}  // namespace

Linear::Linear(const WeightTensor& w, const std::vector<float>& bias, SimdLevel simd)
    : w_(w), bias_(bias.empty() ? nullptr : bias.data()) {
  KVQ_CHECK(!w.empty() && w.rows > 0 && w.cols > 0, "Linear: an empty weight");
  KVQ_CHECK(w.dtype == DType::F32 || w.dtype == DType::BF16 || w.dtype == DType::F16, "Linear: weights of dtype {}",
            dtype_name(w.dtype));
  KVQ_CHECK(bias.empty() || bias.size() == size_t(w.rows), "Linear: a bias of {} for {} outputs", bias.size(), w.rows);
  // The row kernels read rows in units of 32 values.
  if (w.dtype != DType::F32 && w.cols % 32 == 0) {
    rows_ = row_kernels(w.dtype == DType::BF16 ? RowFormat::kBf16 : RowFormat::kF16, simd);
    if (w.dtype == DType::BF16) gemv_ = bf16_gemv_kernel(simd);
  }
}

void Linear::apply(const float* x, int n, float* y, ThreadPool& pool) const {
  const int out = this->out(), in = this->in();
  if (w_.dtype == DType::F32) {
    const float* w = reinterpret_cast<const float*>(w_.data);
    if (n == 1)
      cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.f, w, in, x, 1, 0.f, y, 1);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.f, x, in, w, in, 0.f, y, out);
  } else if (n <= kGemvRows && reads_rows()) {
    apply_row_block(x, n, y, pool);
  } else {
    apply_tiles(x, n, y, pool);
  }
  if (bias_)
    for (int i = 0; i < n; ++i)
      for (int o = 0; o < out; ++o) y[size_t(i) * out + o] += bias_[o];
}

void Linear::apply_rows(const float* x, int n, float* y, ThreadPool& pool) const {
  KVQ_CHECK(reads_rows(), "internal: Linear::apply_rows needs 16-bit rows of a multiple of 32 ({} x {} layer)", out(),
            in());
  for (int i0 = 0; i0 < n; i0 += kGemvRows)
    apply(x + size_t(i0) * in(), std::min(kGemvRows, n - i0), y + size_t(i0) * out(), pool);
}

void Linear::apply_row_block(const float* x, int n, float* y, ThreadPool& pool) const {
  const int out = this->out(), in = this->in();
  const int items = (out + kRowsPerItem - 1) / kRowsPerItem;
  if (gemv_.run) {
    // x permuted once for all rows, on the calling thread, 64-byte aligned: a query vector split over two cache lines
    // costs the kernel a quarter of its speed.
    thread_local std::vector<float> scratch;
    scratch.resize(size_t(n) * in + 16);
    float* xp = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t(63));
    bf16_gemv_permute(x, n, in, gemv_.block, xp);
    pool.parallel_for(items, [&](int64_t item, int) {
      const int o0 = int(item) * kRowsPerItem, rows = std::min(kRowsPerItem, out - o0);
      gemv_.run(w_.data + size_t(o0) * in * 2, size_t(in) * 2, rows, in, xp, n, y + o0, size_t(out));
    });
    return;
  }
  pool.parallel_for(items, [&](int64_t item, int) {
    const int o0 = int(item) * kRowsPerItem, rows = std::min(kRowsPerItem, out - o0);
    RowsView view;
    view.rows = w_.data + size_t(o0) * in * 2;
    view.row_stride = size_t(in) * 2;
    view.d = view.group = in;
    view.n_rows = rows;
    rows_.scores(view, x, n, y + o0, size_t(out));
  });
}

// y = x · Wᵀ over tiles [o0, o0 + to) × [k0, k0 + kc) of W, each widened into `tile` (rows of kc floats) on the pool's
// threads, then one sgemm (OpenBLAS's own threads) that adds it into y's columns [o0, o0 + to).
void Linear::apply_tiles(const float* x, int n, float* y, ThreadPool& pool) const {
  const int out = this->out(), in = this->in();
  int kc = in, to = out;  // the whole W when it fits in kTileFloats
  if (w_.numel() > kTileFloats) {
    if (in <= out && size_t(in) * 64 <= kTileFloats) {
      // y no smaller than x: blocks of whole rows (multiples of 64), each sgemm writing its columns of y once.
      kc = in;
      to = int(kTileFloats / size_t(in)) / 64 * 64;
    } else {
      // The widest slice of kSliceK-column steps that holds every row in kTileFloats (at least kSliceK columns, the
      // rows then in blocks), each sgemm adding into y.
      const size_t steps = kTileFloats / (size_t(out) * kSliceK);
      kc = std::min(in, kSliceK * int(std::max<size_t>(steps, 1)));
      to = int(std::min<size_t>(size_t(out), kTileFloats / size_t(kc)));
    }
  }
  thread_local std::vector<float> scratch;  // the calling thread's; the pool's workers write into it through `tile`
  scratch.resize(size_t(to) * size_t(kc));
  float* tile = scratch.data();
  for (int o0 = 0; o0 < out; o0 += to) {
    const int rows = std::min(to, out - o0);
    for (int k0 = 0; k0 < in; k0 += kc) {
      const int cols = std::min(kc, in - k0);
      pool.parallel_for((rows + kWidenRows - 1) / kWidenRows, [&](int64_t item, int) {
        const int r0 = int(item) * kWidenRows, r1 = std::min(rows, r0 + kWidenRows);
        for (int r = r0; r < r1; ++r)
          widen16(w_.dtype, w_.data + (size_t(o0 + r) * in + k0) * 2, cols, tile + size_t(r) * cols);
      });
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rows, cols, 1.f, x + k0, in, tile, cols,
                  k0 == 0 ? 0.f : 1.f, y + o0, out);
    }
  }
}

}  // namespace kvq
