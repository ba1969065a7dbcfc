#include "codecs/group_quant.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"

namespace kvq {

int clip_quantile_index(float clip, int n) {
  return clip >= 1.0f ? -1 : std::min(int(std::floor(double(clip) * n)), n - 1);
}

namespace {

// The clip threshold: the (k + 1)-th smallest |x_i|, k = floor(clip · n) (clip = 1: the largest). The clips used
// (0.92 - 0.99 of 32 - 128 values) keep the m = n - k <= 16 largest: one pass holding them sorted in a small array
// gives the same order statistic as a selection over all n (a token's append to an int2 cache 24% faster,
// docs/results/cpu.md); more, or a NaN, takes std::nth_element.
float clip_threshold(const float* x, int n, float clip) {
  const int k = clip_quantile_index(clip, n);
  if (k < 0) {
    float m = 0.f;
    for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
    return m;
  }
  const int m = n - k;  // the threshold is the m-th largest
  constexpr int kTop = 16;
  if (m <= kTop) {
    float top[kTop] = {};  // top[0 .. m): the m largest so far, ascending (m >= 1: k <= n - 1)
    bool nan = false;
    for (int i = 0; i < m; ++i) top[i] = std::fabs(x[i]), nan = nan || std::isnan(top[i]);
    if (!nan) std::sort(top, top + m);
    for (int i = m; i < n && !nan; ++i) {
      const float v = std::fabs(x[i]);
      if (!(v > top[0])) {
        nan = std::isnan(v);
        continue;
      }
      int j = 1;
      for (; j < m && top[j] < v; ++j) top[j - 1] = top[j];
      top[j - 1] = v;
    }
    if (!nan) return top[0];
  }
  float buf[512];
  std::vector<float> heap;
  float* a = buf;
  if (n > 512) {
    heap.resize(size_t(n));
    a = heap.data();
  }
  for (int i = 0; i < n; ++i) a[i] = std::fabs(x[i]);
  std::nth_element(a, a + k, a + n);
  return a[k];
}

}  // namespace

GroupQuant quantize_group(const float* x, int n, int bits, float clip, uint8_t* codes) {
  KVQ_CHECK(n > 0 && bits >= 1 && bits <= 8, "quantize_group: n={} bits={}", n, bits);
  GroupQuant q{};
  q.thr = clip_threshold(x, n, clip);
  float lo = INFINITY, hi = -INFINITY;
  for (int i = 0; i < n; ++i) {
    const float v = clip_value(x[i], q.thr);
    if (v < lo) lo = v, q.i_min = i;
    if (v > hi) hi = v, q.i_max = i;
  }
  const float scale = group_scale(lo, hi, bits);
  if (group_degenerate(lo, hi, scale)) {
    // Degenerate: every value decodes to lo (exact when lo is representable in fp16).
    q.scale = degenerate_scale(lo);
    q.zero = degenerate_zero(lo);
    std::fill(codes, codes + n, uint8_t(0));
    return q;
  }
  q.scale = f32_to_fp16(scale);
  q.zero = group_zero(lo, scale);
  const float zero = fp16_to_f32(q.zero), levels = quant_levels(bits);
  for (int i = 0; i < n; ++i) codes[i] = quant_code(clip_value(x[i], q.thr), scale, zero, levels);
  return q;
}

}  // namespace kvq
