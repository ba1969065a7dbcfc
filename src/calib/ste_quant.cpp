#include "calib/ste_quant.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "codecs/group_quant.h"
#include "common/error.h"

namespace kvq {

void check_ste_spec(const SteQuantSpec& spec, int cols) {
  KVQ_CHECK(spec.bits >= 1 && spec.bits <= 8, "STE quantizer: bits = {}, supported 1..8", spec.bits);
  KVQ_CHECK(spec.group > 0 && cols > 0 && cols % spec.group == 0,
            "STE quantizer: group = {} does not divide the row length {}", spec.group, cols);
  KVQ_CHECK(spec.clip > 0.f && spec.clip <= 1.f, "STE quantizer: clip = {}, must be in (0, 1]", spec.clip);
}

template <class T>
void ste_quant_forward(const RowMat<T>& x, const SteQuantSpec& spec, RowMat<T>& xhat, SteState<T>& st) {
  const int rows = int(x.rows()), cols = int(x.cols()), G = spec.group;
  check_ste_spec(spec, cols);
  const int n_groups = cols / G;
  const T levels = T((1 << spec.bits) - 1);
  st.spec = spec;
  st.rows = rows;
  st.cols = cols;
  st.resid.resize(rows, cols);
  st.clip_value.resize(rows, cols);
  st.pass.assign(size_t(rows) * cols, 0);
  st.i_min.assign(size_t(rows) * n_groups, 0);
  st.i_max.assign(size_t(rows) * n_groups, 0);
  xhat.resize(rows, cols);
  std::vector<float> buf(static_cast<size_t>(G));
  std::vector<uint8_t> codes(static_cast<size_t>(G));
  for (int r = 0; r < rows; ++r)
    for (int gi = 0; gi < n_groups; ++gi) {
      const int c0 = gi * G;
      const float* src = nullptr;  // the group as the cache quantizer sees it (float)
      if constexpr (std::is_same_v<T, float>) {
        src = &x(r, c0);  // row-major: the group is contiguous
      } else {
        for (int i = 0; i < G; ++i) buf[size_t(i)] = float(x(r, c0 + i));
        src = buf.data();
      }
      const GroupQuant q = quantize_group(src, G, spec.bits, spec.clip, codes.data());
      const T thr = T(q.thr);
      const size_t gidx = size_t(r) * n_groups + gi;
      st.i_min[gidx] = c0 + q.i_min;
      st.i_max[gidx] = c0 + q.i_max;
      // The clip decision is the quantizer's own (on the float value), so T = double agrees with T = float.
      for (int i = 0; i < G; ++i) {
        const int c = c0 + i;
        st.pass[size_t(r) * cols + c] = std::fabs(src[i]) <= q.thr ? 1 : 0;
        st.clip_value(r, c) = st.pass[size_t(r) * cols + c] ? x(r, c) : std::clamp(x(r, c), -thr, thr);
      }
      const T s = (st.clip_value(r, c0 + q.i_max) - st.clip_value(r, c0 + q.i_min)) / levels;
      for (int i = 0; i < G; ++i) {
        const int c = c0 + i;
        const T xq = T(dequant_value(codes[size_t(i)], q.scale, q.zero));
        xhat(r, c) = xq;
        st.resid(r, c) = s > T(0) ? (xq - st.clip_value(r, c)) / s : T(0);
      }
    }
}

template <class T>
void ste_quant_surrogate(const RowMat<T>& x, const SteState<T>& st, RowMat<T>& xhat) {
  KVQ_CHECK(x.rows() == st.rows && x.cols() == st.cols, "ste_quant_surrogate: x is {}x{}, state is {}x{}", x.rows(),
            x.cols(), st.rows, st.cols);
  const int G = st.spec.group, n_groups = st.cols / G;
  const T levels = T((1 << st.spec.bits) - 1);
  xhat.resize(st.rows, st.cols);
  for (int r = 0; r < st.rows; ++r) {
    const auto xt = [&](int c) { return st.pass[size_t(r) * st.cols + c] ? x(r, c) : st.clip_value(r, c); };
    for (int gi = 0; gi < n_groups; ++gi) {
      const size_t gidx = size_t(r) * n_groups + gi;
      const T s = (xt(st.i_max[gidx]) - xt(st.i_min[gidx])) / levels;
      for (int c = gi * G; c < (gi + 1) * G; ++c) xhat(r, c) = xt(c) + st.resid(r, c) * s;
    }
  }
}

template <class T>
void ste_quant_backward(const SteState<T>& st, const RowMat<T>& g, RowMat<T>& gx) {
  KVQ_CHECK(g.rows() == st.rows && g.cols() == st.cols, "ste_quant_backward: gradient is {}x{}, state is {}x{}",
            g.rows(), g.cols(), st.rows, st.cols);
  const int G = st.spec.group, n_groups = st.cols / G;
  const T inv_levels = T(1) / T((1 << st.spec.bits) - 1);
  gx.resize(st.rows, st.cols);
  for (int r = 0; r < st.rows; ++r) {
    const uint8_t* m = st.pass.data() + size_t(r) * st.cols;
    for (int gi = 0; gi < n_groups; ++gi) {
      T c = 0;
      for (int col = gi * G; col < (gi + 1) * G; ++col) {
        c += g(r, col) * st.resid(r, col);
        gx(r, col) = m[col] ? g(r, col) : T(0);
      }
      c *= inv_levels;
      const size_t gidx = size_t(r) * n_groups + gi;
      const int imax = st.i_max[gidx], imin = st.i_min[gidx];
      if (m[imax]) gx(r, imax) += c;
      if (m[imin]) gx(r, imin) -= c;
    }
  }
}

template void ste_quant_forward<float>(const RowMat<float>&, const SteQuantSpec&, RowMat<float>&, SteState<float>&);
template void ste_quant_forward<double>(const RowMat<double>&, const SteQuantSpec&, RowMat<double>&,
                                        SteState<double>&);
template void ste_quant_surrogate<float>(const RowMat<float>&, const SteState<float>&, RowMat<float>&);
template void ste_quant_surrogate<double>(const RowMat<double>&, const SteState<double>&, RowMat<double>&);
template void ste_quant_backward<float>(const SteState<float>&, const RowMat<float>&, RowMat<float>&);
template void ste_quant_backward<double>(const SteState<double>&, const RowMat<double>&, RowMat<double>&);

}  // namespace kvq
