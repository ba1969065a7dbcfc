// Calibration driver: captures post-RoPE traces from the runtime on calibration text and builds the rotations of
// one method (METHODS §3-4) for every layer and kv head:
//   quarot  R_K = R_V = H / sqrt(d), data-free
//   oscar   per-layer spectral rotations U·H·P from query / attention-weighted value covariances
//   optr    per-(layer, kv head) R = R0 · expm(A − Aᵀ) on top of quarot or oscar, on the post-W_O objective
//           (or kvq's joint / pre-wo / recon objectives), with key centering
// Traces: the calibration tokens are cut into chunks; each chunk runs through the model once and the tap keeps,
// per layer, what the method needs (covariance sums for OSCAR, the chunk's keys/values and its last n_q queries
// for OptR's calibration and held-out chunks).
#pragma once

#include <functional>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kv/cache.h"
#include "kv/transform.h"
#include "model/model.h"

namespace kvq {

struct CalibrateConfig {
  std::string method = "optr";         // quarot | oscar | optr | pnmix (key widths per RoPE pair: calib/pnmix.h) |
                                       // fp8-scales (vLLM's per-tensor FP8 scales: calib/fp8_scales.h)
  std::string base = "oscar";          // optr's base rotation: quarot | oscar
  std::string objective = "post-wo";   // optr: post-wo (two-phase OptR) | joint | pre-wo | recon
  int tokens = 32768;                  // calibration token budget
  int chunk = 2048;                    // tokens per calibration chunk
  int n_queries = 64;                  // optr: the last n_q query positions of a chunk
  int calib_chunks = 2;                // optr: calibration chunks per layer
  int heldout_chunks = 2;              // optr: held-out chunks per layer
  int steps = 80;                      // optr: Adam steps per phase
  double lr = 0.02;                    // optr: Adam learning rate
  double lambda_k = 1.0;               // optr: λ_K of the key phase
  int center_keys = -1;                // subtract per-(layer, head) key means: 1 / 0, -1 = the method's default (optr)
  CacheConfig cache;                   // the INT grid calibrated for: type (bits), group, clips, windows
  std::string pnmix_score = "product"; // pnmix: product (E‖q^(i)‖ E‖k^(i)‖) | energy ((E‖q^(i)‖² + E‖k^(i)‖²) / 2)
  double key_bits = 2.0;               // pnmix: average key bits per element, in [1, 4]
  void validate(const ModelConfig& m) const;
};

struct CalibrateHeadReport {
  int layer = 0, head = 0;
  double key_before = 0, key_after = 0;      // held-out loss of the key (or joint) phase at R0 / kept R
  double value_before = 0, value_after = 0;  // held-out loss of the value phase
  bool key_kept = false, value_kept = false;
};

struct CalibrateReport {
  std::vector<CalibrateHeadReport> heads;
  double capture_seconds = 0, optimise_seconds = 0;
  int tokens_used = 0, chunks = 0;
};

// progress(stage, done, total) — stage "capture" or "optimise".
using CalibrateProgress = std::function<void(const char* stage, int done, int total)>;

// The capture of every method: the first min(|ids|, cfg.tokens) / cfg.chunk chunks of ids run through the model with
// tap installed (a bf16 cache, each chunk a fresh sequence), begin_chunk(c) before chunk c; progress "capture".
// Returns the number of chunks (kvq::Error when not even one fits).
int capture_chunks(Model& model, const std::vector<int32_t>& ids, const CalibrateConfig& cfg, Model::LayerTap& tap,
                   const std::function<void(int chunk)>& begin_chunk, const CalibrateProgress& progress);

// The rotation-file metadata of a calibration (rotation/rotation_file.h): method, base, objective, calibration data
// and budget, the model fingerprint, and for OptR its optimiser settings, the cache grid it was calibrated for
// ("cache", which check_rotation_fits() compares) and the per-head held-out report ("heads", plus kept counts).
nlohmann::json calibration_metadata(const CalibrateConfig& cfg, const KvTransform& t, const CalibrateReport& rep,
                                    const std::string& model_fingerprint, const std::string& data_file,
                                    const std::string& data_sha256);

// Builds the transform for cfg from the calibration ids; the transform's name is the method label
// (e.g. "optr(oscar)"). The model's KV transform must be unset (traces are taken without rotation).
KvTransform calibrate(Model& model, const std::vector<int32_t>& ids, const CalibrateConfig& cfg,
                      CalibrateReport* report = nullptr, const CalibrateProgress& progress = {});

}  // namespace kvq
