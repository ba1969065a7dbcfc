// OptR optimiser (METHODS §4): per layer and kv head, R = R0 · expm(A − Aᵀ) with A = 0 at the start (so R = R0
// exactly), Adam (lr 0.02, 80 steps) on the mean loss over the calibration chunks. The held-out chunks' mean loss
// is evaluated at step 0, every eval_every steps and at the last step; each head keeps its best R, and keeps it
// only if that held-out loss beats R0's (strictly), else R0.
// Modes: two-phase (the published OptR: key phase with values exact, then value phase with keys fixed at the key
// phase's result), or one joint phase over A_K and A_V on the joint / pre-wo / recon objective (kvq's additions).
// Heads are independent (per-head losses summed for a step = independent per-head problems), so they run in
// parallel on n_threads std::threads, one head per thread at a time, with OpenBLAS single-threaded meanwhile
// (BlasSingleThreadScope in calib/gemm.h).
#pragma once

#include <vector>

#include <Eigen/Dense>

#include "calib/adam.h"
#include "calib/optr_loss.h"

namespace kvq {

enum class OptrMode { kTwoPhase, kJoint, kPreWo, kRecon };
const char* optr_mode_name(OptrMode m);

struct OptrConfig {
  OptrLossConfig loss;                // quantizer, windows, λ_K, softmax scale
  OptrMode mode = OptrMode::kTwoPhase;
  AdamConfig adam;                    // lr 0.02
  int steps = 80;                     // Adam steps per phase
  int eval_every = 20;                // held-out evaluation period (plus step 0 and the last step)
  int n_threads = 1;                  // worker threads across heads
};

// One kv head of one layer.
struct OptrHeadInput {
  std::vector<OptrChunk<float>> calib;    // calibration chunks (the reference uses 2)
  std::vector<OptrChunk<float>> heldout;  // held-out chunks (the reference uses 2)
  Eigen::MatrixXd r0_k;                   // (d, d) base key rotation (QuaRot or OSCAR)
  Eigen::MatrixXd r0_v;                   // (d, d) base value rotation
};

// Outcome of one optimisation phase of one head.
struct OptrPhaseResult {
  double heldout_before = 0;  // held-out loss at R0 (step 0)
  double heldout_after = 0;   // held-out loss of the rotation kept (== before when not kept)
  bool kept = false;          // the learned rotation beat R0 on the held-out chunks
  int best_step = 0;          // step whose rotation was kept (0: R0)
};

struct OptrHeadResult {
  Eigen::MatrixXf r_k;    // (d, d) final key rotation
  Eigen::MatrixXf r_v;    // (d, d) final value rotation
  OptrPhaseResult key;    // two-phase: the key phase; joint modes: the joint phase
  OptrPhaseResult value;  // two-phase: the value phase; joint modes: same as key
};

// R = R0 · expm(A − Aᵀ) (exactly R0 when A == 0).
Eigen::MatrixXd optr_rotation(const Eigen::MatrixXd& r0, const Eigen::MatrixXd& a);

void check_optr_config(const OptrConfig& cfg);

// Calibrates every head of one layer. Chunks are modified only by caching the fixed-key probabilities of the
// value phase (optr_fix_keys).
std::vector<OptrHeadResult> optr_calibrate_layer(std::vector<OptrHeadInput>& heads, const OptrConfig& cfg);

}  // namespace kvq
