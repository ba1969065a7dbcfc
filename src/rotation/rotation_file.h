// Rotation files: the calibrated key/value rotations and key means of one model, as a safetensors file.
//
// Tensors (float32), per layer i:
//   layers.{i}.r_k       [n_kv_heads, d, d] per-head key rotation, or [d, d] shared by the layer's heads
//   layers.{i}.r_v       [n_kv_heads, d, d] or [d, d] value rotation
//   layers.{i}.key_mean  [n_kv_heads, d] post-RoPE key mean (optional: absent = no centering)
// Metadata "__metadata__": {"kvq_rotation": JSON} with method, base, objective, calibration settings (bits, group,
// clips, windows, lambda, steps, lr), calibration data sha256 and token count, the model fingerprint, kvq version.
// Rotations are row-vector convention: a cached key is (k - mu) R_K, a query q R_K; values v R_V, outputs o R_V^T.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "kv/cache.h"
#include "kv/transform.h"

namespace kvq {

struct RotationFile {
  KvTransform transform;  // [n_layers, n_kv_heads, d, d] matrices, identity where absent
  nlohmann::json meta;    // the "kvq_rotation" metadata object
};

// Writes t and meta (meta gains n_layers, n_kv_heads, head_dim, kvq_version).
void save_rotation_file(const std::string& path, const KvTransform& t, nlohmann::json meta);

// Reads and validates a rotation file: structure, shapes, orthogonality (|R R^T - I| < 1e-3), finite values.
RotationFile load_rotation_file(const std::string& path);

// Refuses (kvq::Error naming the field) a file calibrated for another model, or — for methods whose rotations
// depend on the cache grid (OptR) — for other cache settings (bits, group, clips, windows).
void check_rotation_fits(const RotationFile& f, const std::string& model_fingerprint, int n_layers, int n_kv_heads,
                         int head_dim, const CacheConfig& cache);

// The data-free QuaRot transform: R_K = R_V = H_d / sqrt(d) for every layer and head (no centering).
KvTransform hadamard_transform(int n_layers, int n_kv_heads, int head_dim);
// TurboQuant's key transform (METHODS §5.2): R_K = H_d / sqrt(d) for every layer and head, values unrotated (no R_V,
// no centering); named transform_name(CodecTransform::kHadamardKeys) (codecs/registry.h).
KvTransform hadamard_key_transform(int n_layers, int n_kv_heads, int head_dim);

// A timing stand-in for a calibrated rotation file (kvq bench decode --rotation random, where a model of dummy weights
// has no data to calibrate on): per (layer, kv head) a random orthogonal R_K and R_V (Gram–Schmidt of a Gaussian
// matrix, in double) and random key means: the structure and cost of an OptR file, none of its fidelity. Named
// "random (timing only)"; the same matrices for the same seed.
KvTransform random_rotation_transform(int n_layers, int n_kv_heads, int head_dim, uint64_t seed);
// The rows of the row-major d×d matrix m orthonormalised in order (modified Gram–Schmidt, in double): of a Gaussian
// matrix, a random orthogonal one.
void orthonormalise_rows(double* m, int d);

// The transform a cache's codecs imply (the codec table's transform column: implied_transform), or null when they
// imply none. The Hadamard needs a power-of-two head_dim: otherwise a kvq::Error names the codecs. llama.cpp's
// attn_rot (codecs/llamacpp/attn_rot.h) is built as llama.cpp builds it, so it is null when head_dim % 64 != 0.
std::shared_ptr<const KvTransform> codec_transform(const CacheConfig& cache, int n_layers, int n_kv_heads,
                                                   int head_dim);

}  // namespace kvq
