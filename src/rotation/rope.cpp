#include "rotation/rope.h"

#include <cmath>
#include <cstddef>
#include <vector>

namespace kvq {

void rope_rows(float* x, int n, int heads, int d, int pos0, const float* inv_freq, bool inverse) {
  const int half = d / 2;
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int i = 0; i < n; ++i) {
    for (int f = 0; f < half; ++f) {
      const float angle = float(pos0 + i) * inv_freq[f];  // fp32 product, as transformers does
      cs[size_t(f)] = float(std::cos(double(angle)));
      sn[size_t(f)] = float(std::sin(double(angle)));
      if (inverse) sn[size_t(f)] = -sn[size_t(f)];  // the rotation by -angle is the transpose
    }
    for (int h = 0; h < heads; ++h) {
      float* r = x + (size_t(i) * heads + h) * d;
      for (int f = 0; f < half; ++f) {
        const float a = r[f], b = r[f + half], c = cs[size_t(f)], s = sn[size_t(f)];
        r[f] = a * c - b * s;
        r[f + half] = b * c + a * s;
      }
    }
  }
}

}  // namespace kvq
