#include "rotation/rope.h"

#include <cmath>
#include <cstddef>
#include <vector>

namespace kvq {

void rope_angles(int pos, const float* inv_freq, int half, float* cs, float* sn) {
  for (int f = 0; f < half; ++f) {
    const float angle = float(pos) * inv_freq[f];  // fp32 product, as transformers does
    cs[f] = float(std::cos(double(angle)));
    sn[f] = float(std::sin(double(angle)));
  }
}

void rope_row(float* x, int d, const float* cs, const float* sn, bool inverse) {
  const int half = d / 2;
  for (int f = 0; f < half; ++f) {
    const float a = x[f], b = x[f + half], c = cs[f], s = inverse ? -sn[f] : sn[f];  // -angle: the transpose
    x[f] = a * c - b * s;
    x[f + half] = b * c + a * s;
  }
}

void rope_rows(float* x, int n, int heads, int d, int pos0, const float* inv_freq, bool inverse) {
  const int half = d / 2;
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int i = 0; i < n; ++i) {
    rope_angles(pos0 + i, inv_freq, half, cs.data(), sn.data());
    for (int h = 0; h < heads; ++h) rope_row(x + (size_t(i) * heads + h) * d, d, cs.data(), sn.data(), inverse);
  }
}

}  // namespace kvq
