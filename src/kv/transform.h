// Per-layer transforms between the model and the KV cache (docs/guide/methods.md §3-4), all exact in full precision:
//   keys     k <- (k - mu_{l,h}) R_K         cached; queries q <- q R_K once per step (scores unchanged)
//   values   v <- v R_V                      cached; attention outputs o <- o R_V^T once per step
// Key centering happens before rotation and applies to EVERY cached key (sink and recent windows included).
#pragma once

#include <string>
#include <vector>

#include "simd/simd.h"

namespace kvq {

class ThreadPool;

// Where a transform's rotations run: the CPU kernels' level (simd.h: every level gives the same bits) and the pool
// whose threads share the rows (nullptr: the calling thread).
struct TransformExec {
  SimdLevel simd = best_simd_level();
  ThreadPool* pool = nullptr;
};

struct KvTransform {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0;
  std::vector<float> key_mean;  // [n_layers, n_kv_heads, d] post-RoPE key means; empty = no centering
  std::vector<float> r_k;       // [n_layers, n_kv_heads, d, d] row-major key rotations; empty = identity
  std::vector<float> r_v;       // [n_layers, n_kv_heads, d, d] value rotations; empty = identity
  std::string name = "none";    // what produced it: none, hadamard, oscar, optr, ... (for logs and reports)
  // n > 0 when every (layer, head) matrix of r_k (r_v) is block-diagonal with blocks H_n / sqrt(n), the Walsh–Hadamard
  // matrix (rotation/hadamard.h: block_hadamard; QuaRot, TurboQuant's keys, llama.cpp's attn_rot): those rotations
  // run as fast transforms, O(d log n) a row instead of d² (the product's value; see KvTransform::inputs). 0: a general
  // matrix, read as it is.
  int k_hadamard = 0, v_hadamard = 0;

  bool identity() const { return key_mean.empty() && r_k.empty() && r_v.empty(); }

  // In place, rows laid out [n, heads, d]; query head j belongs to kv head j / (n_heads / n_kv_heads).
  // inputs() is what a layer does before attention: keys(), values() and queries() at once (each may be null), the
  // rows of each kv head rotated together, so that R_K is read once for its keys and queries and the pool's threads
  // share the heads even in a decode step. Every rotated value is the product's, summed in double and rounded to float
  // once; a Walsh–Hadamard block sums in the transform's order instead of a = 0 .. d-1, which can change that final
  // rounding only where the two double sums straddle a float's rounding boundary (tests/test_transform_hadamard.cpp
  // counts it: none in its million outputs).
  void inputs(int layer, int n, float* k, float* v, int n_heads, float* q, const TransformExec& x = {}) const;
  void keys(int layer, int n, float* k, const TransformExec& x = {}) const;
  void values(int layer, int n, float* v, const TransformExec& x = {}) const;
  void queries(int layer, int n, int n_heads, float* q, const TransformExec& x = {}) const;
  void outputs(int layer, int n, int n_heads, float* o, const TransformExec& x = {}) const;

 private:
  void centre_keys(int layer, int n, float* k) const;
};

}  // namespace kvq
