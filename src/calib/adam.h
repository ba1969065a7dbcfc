// Adam (Kingma & Ba) on one dense parameter matrix, bias-corrected; OptR's optimiser (lr 0.02).
#pragma once

#include <Eigen/Dense>

namespace kvq {

struct AdamConfig {
  double lr = 0.02;      // step size
  double beta1 = 0.9;    // first-moment decay
  double beta2 = 0.999;  // second-moment decay
  double eps = 1e-8;     // denominator guard
};

class Adam {
 public:
  Adam(const AdamConfig& cfg, Eigen::Index rows, Eigen::Index cols);
  // param ← param − lr · m̂ / (sqrt(v̂) + eps) after folding grad into the moments.
  void step(Eigen::MatrixXd& param, const Eigen::MatrixXd& grad);
  int steps_taken() const { return t_; }

 private:
  AdamConfig cfg_;
  Eigen::MatrixXd m_;  // (rows, cols) first moment
  Eigen::MatrixXd v_;  // (rows, cols) second moment
  int t_ = 0;          // steps taken
};

}  // namespace kvq
