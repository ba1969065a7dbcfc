// PN-Mix calibration (docs/guide/methods.md §5.7, kvq's definition): the width of every RoPE channel pair of every
// (layer, kv head), allocated from calibration traces.
//
//   pair i of a split-half head = channels (i, i + d/2); ‖x^(i)‖ = sqrt(x_i² + x_{i+d/2}²), which RoPE leaves unchanged
//   product (default)  s_i = E‖q^(i)‖ · E‖k^(i)‖
//   energy (ablation)  s_i = (E‖q^(i)‖² + E‖k^(i)‖²) / 2            (Block-GTQ's energy sum)
// E over the calibration tokens; for q also over the g query heads of the kv head's GQA group, pooled: one mean over
// the n·g query rows (choice), the queries as the model computes them (post-RoPE, before the 1/sqrt(d) scale).
//
// Greedy allocation of an average budget of B bits per element: every pair starts at 1 bit; (B - 1)·d/2 times, the
// pair of largest s_i · 4^{-b_i} among those below 4 bits gets one more bit (ties: the lowest pair index, choice).
// Each step adds 2 code bits (the pair's two channels), so B must be 1 + 2k/d for an integer k (d = 128: multiples of
// 1/64) and lie in [1, 4].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "calib/calibrate.h"
#include "codecs/pnmix/codec_pnmix.h"
#include "model/model.h"

namespace kvq {

enum class PairScore { kProduct, kEnergy };
PairScore parse_pair_score(const std::string& name);  // "product" | "energy"; kvq::Error naming both otherwise
const char* pair_score_name(PairScore s);

// Code bits of one row, B·d, for an average of key_bits bits per element at head_dim; kvq::Error when B is outside
// [1, 4] or not reachable (B·d - d not an even integer), naming the nearest reachable budgets.
int pnmix_code_bits(double key_bits, int head_dim);

// The greedy rule above for one head: n_pairs scores, a row of code_bits bits (pnmix_code_bits); widths [n_pairs].
std::vector<uint8_t> allocate_pair_bits(const float* scores, int n_pairs, int code_bits);

// Running sums of the pair norms of one model's queries and keys, per (layer, kv head, pair).
struct PairNormStats {
  int n_layers = 0, n_kv = 0, n_heads = 0, head_dim = 0;
  std::vector<double> q_norm, q_sq, k_norm, k_sq;  // [n_layers][n_kv][d/2] sums of ‖q^(i)‖, ‖q^(i)‖², ‖k^(i)‖, ‖k^(i)‖²
  std::vector<long long> q_rows, k_rows;           // [n_layers] rows summed per (layer, kv head)

  PairNormStats(int n_layers, int n_kv_heads, int n_heads, int head_dim);
  // One layer's chunk as Model::LayerTap gives it: q [n, n_heads, d], k [n, n_kv, d].
  void add(int layer, int n, const float* q, const float* k);
  // The importance of every pair, [n_layers][n_kv][d/2], rounded to float (what the file stores and the allocation
  // reads).
  std::vector<float> scores(PairScore score) const;
};

struct PnmixCalibration {
  PairBitTable table;         // the widths
  std::vector<float> scores;  // [n_layers][n_kv][d/2] the importance they were allocated from
  int tokens_used = 0, chunks = 0;
  double capture_seconds = 0;
};

// The widths of every (layer, kv head) for cfg (method pnmix: cfg.pnmix_score, cfg.key_bits, cfg.tokens, cfg.chunk)
// from the calibration ids.
PnmixCalibration calibrate_pnmix(Model& model, const std::vector<int32_t>& ids, const CalibrateConfig& cfg,
                                 const CalibrateProgress& progress = {});

// The widths of every head from scores [n_layers][n_kv][d/2] (allocate_pair_bits per head), named
// "pnmix(<score>)".
PairBitTable allocate_table(const std::vector<float>& scores, int n_layers, int n_kv_heads, int head_dim,
                            int code_bits, PairScore score);

// Widths where only a cache's shape and speed matter (bench attention's random rows, the referee's cache checks and
// timing): the greedy allocation of key_bits over scores 1 / (1 + i) falling with the pair index, so that a head mixes
// widths as a calibrated one does (at d = 128, 2 bits: all four), every head alike, named "pnmix(timing)". Never
// evaluated.
PairBitTable timing_pair_bits(int n_layers, int n_kv_heads, int head_dim, double key_bits = 2.0);

}  // namespace kvq
