// The normalised Sylvester Walsh–Hadamard rotation H_d / sqrt(d) (METHODS §4, QuaRot; also the middle factor
// of OSCAR's R = U·H·P). d must be a power of two. Sylvester order: H_1 = [1], H_2d = [[H, H], [H, -H]], so
// entry (i, j) is (-1)^popcount(i & j) / sqrt(d). The matrix is symmetric and orthogonal (its own inverse).
#pragma once

#include <Eigen/Dense>

#include <vector>

namespace kvq {

bool is_power_of_two(int d);

// Explicit d×d matrix H_d / sqrt(d) (the reference; d a power of two, 1 <= d <= 2^14).
Eigen::MatrixXd hadamard_matrix(int d);

// `copies` row-major d×d float matrices, each block-diagonal with d / n blocks H_n / sqrt(n) (n a power of two
// dividing d; n = d: the plain H_d) — the per-(layer, kv head) layout of KvTransform's r_k / r_v.
std::vector<float> block_hadamard(int n, int d, int copies);

// In-place fast Walsh–Hadamard transform of n_rows contiguous rows of length d, O(d log d) per row:
// each row x becomes x · H_d / sqrt(d) (== H_d x / sqrt(d), H being symmetric). Equals the matrix product.
void fwht_rows(float* x, int n_rows, int d);
void fwht_rows(double* x, int n_rows, int d);
// The same butterflies unnormalised: each row x becomes x · H_d, entries ±1 (KvTransform scales the result by its
// matrix's own float 1/sqrt(d), so that it rounds to the dense product's floats).
void walsh_hadamard_rows(double* x, int n_rows, int d);

}  // namespace kvq
