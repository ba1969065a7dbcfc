// The value rotation of a KV transform folded into the weights on either side of the cache, so that a step with a
// rotation file costs what a step without one costs on the value side (docs/guide/methods.md §4). With R the value
// rotation of kv head g in a layer (KvTransform::r_v; rows are vectors, v <- v R):
//   the cache stores v R = (h W_gᵀ + b_g) R         ->  W_V' rows of head g = Rᵀ W_g,   b_V' = b_g R
//   attention returns o' = o R, and y = o' Rᵀ W_Oᵀ  ->  W_O' columns of query head j = W_O[:, j] R_{g(j)}
// A step then stores the same values and computes the same outputs without either rotation, up to one rounding of
// each folded weight to the checkpoint's dtype (bf16: a relative 2^-9 at most; f32 checkpoints: fp32 rounding).
// The products run in fp32 (sgemm), each weight rounded once (round to nearest even).
//
// Who folds: the commands that serve or time a model with a fixed rotation (run, serve, bench decode; --fold-values
// off keeps the rotations per step). The fidelity commands (ppl, eval, referee, calibrate) do not: their figures are
// those of the model's own weights. Device dummy weights (--dummy-weights --device cuda) are not folded but left as
// generated, the value rotation dropped from the steps all the same: rotated i.i.d. N(0, σ²) weights are another draw
// of them (cli/options.cpp: make_runner).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kv/transform.h"
#include "model/config.h"
#include "model/weights.h"

namespace kvq {

class ThreadPool;

struct ValueFold {
  std::shared_ptr<const KvTransform> transform;  // the transform whose r_v is in the weights
  std::shared_ptr<const KvTransform> rest;       // the same without r_v: what a step still applies (keys, queries)
  struct Layer {
    WeightTensor wv, wo;     // [n_kv * d, hidden], [hidden, n_heads * d] in the checkpoint's dtype, owned here
    std::vector<float> bv;   // [n_kv * d] folded value bias (Qwen2), else empty
  };
  std::vector<Layer> layers;
  size_t bytes = 0;      // host bytes of the folded matrices
  double seconds = 0;    // time the fold took

  // The tensor a model with this fold reads for (role, layer): the folded W_V, W_O or b_V, else the weights' own.
  const WeightTensor& matrix(const Weights& w, TensorRole role, int layer) const;
  const std::vector<float>& vector(const Weights& w, TensorRole role, int layer) const;

  std::vector<std::unique_ptr<uint8_t[]>> owned;  // the folded matrices' bytes
};

// t without its value rotation (r_v, v_hadamard): what a step still applies once the value rotation is folded.
std::shared_ptr<const KvTransform> without_value_rotation(const KvTransform& t);

// Folds t's value rotation (t->r_v, which must be non-empty and fit cfg) into copies of w's W_V, b_V and W_O; the
// widening, rounding and the GEMMs' threads are pool's. The original tensors' mapped pages are released afterwards
// (WeightTensor::release): the fold reads them once.
std::unique_ptr<ValueFold> fold_value_rotation(const Weights& w, const ModelConfig& cfg,
                                               std::shared_ptr<const KvTransform> t, ThreadPool& pool);

}  // namespace kvq
