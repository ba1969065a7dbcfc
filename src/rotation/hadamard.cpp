#include "rotation/hadamard.h"

#include <bit>
#include <cmath>

#include "common/error.h"

namespace kvq {

bool is_power_of_two(int d) { return d > 0 && (d & (d - 1)) == 0; }

static void check_dim(int d, const char* who) {
  KVQ_CHECK(is_power_of_two(d) && d <= (1 << 14), "{}: d = {} is not a power of two in [1, 16384]", who, d);
}

Eigen::MatrixXd hadamard_matrix(int d) {
  check_dim(d, "hadamard_matrix");
  const double s = 1.0 / std::sqrt(double(d));
  Eigen::MatrixXd h(d, d);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) h(i, j) = (std::popcount(unsigned(i & j)) & 1) ? -s : s;
  return h;
}

std::vector<float> block_hadamard(int n, int d, int copies) {
  KVQ_CHECK(n >= 1 && d % n == 0 && copies >= 0, "block_hadamard: blocks of {} do not tile {} ({} copies)", n, d,
            copies);
  const Eigen::MatrixXd h = hadamard_matrix(n);
  std::vector<float> one(size_t(d) * d, 0.f);
  for (int b = 0; b < d; b += n)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) one[size_t(b + i) * d + b + j] = float(h(i, j));
  std::vector<float> all;
  all.reserve(one.size() * size_t(copies));
  for (int c = 0; c < copies; ++c) all.insert(all.end(), one.begin(), one.end());
  return all;
}

// lo[k], hi[k] <- lo[k] + hi[k], lo[k] - hi[k] for k < 8; the halves do not overlap (h >= 8).
template <class T>
static inline void butterflies8(T* __restrict lo, T* __restrict hi) {
  for (int k = 0; k < 8; ++k) {
    const T a = lo[k], b = hi[k];
    lo[k] = a + b;
    hi[k] = a - b;
  }
}

// row <- row · H_d with the unnormalised Sylvester matrix (entries ±1): log2(d) passes of butterflies.
template <class T>
static void butterflies(T* row, int d) {
  for (int h = 1; h < d; h *= 2)
    for (int i = 0; i < d; i += 2 * h) {
      if (h >= 8) {  // runs of 8 independent butterflies, which -O2 vectorizes (the same results)
        for (int j = i; j < i + h; j += 8) butterflies8(row + j, row + j + h);
        continue;
      }
      for (int j = i; j < i + h; ++j) {
        const T a = row[j], b = row[j + h];
        row[j] = a + b;
        row[j + h] = a - b;
      }
    }
}

template <class T>
static void fwht_impl(T* x, int n_rows, int d) {
  check_dim(d, "fwht_rows");
  KVQ_CHECK(n_rows >= 0, "fwht_rows: n_rows = {}", n_rows);
  const T s = T(1) / std::sqrt(T(d));
  for (int r = 0; r < n_rows; ++r) {
    T* row = x + size_t(r) * size_t(d);
    butterflies(row, d);
    for (int j = 0; j < d; ++j) row[j] *= s;
  }
}

void walsh_hadamard_rows(double* x, int n_rows, int d) {
  check_dim(d, "walsh_hadamard_rows");
  KVQ_CHECK(n_rows >= 0, "walsh_hadamard_rows: n_rows = {}", n_rows);
  for (int r = 0; r < n_rows; ++r) butterflies(x + size_t(r) * size_t(d), d);
}

void fwht_rows(float* x, int n_rows, int d) { fwht_impl(x, n_rows, d); }
void fwht_rows(double* x, int n_rows, int d) { fwht_impl(x, n_rows, d); }

}  // namespace kvq
