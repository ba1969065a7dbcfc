#include "calib/adam.h"

#include <cmath>

#include "common/error.h"

namespace kvq {

Adam::Adam(const AdamConfig& cfg, Eigen::Index rows, Eigen::Index cols)
    : cfg_(cfg), m_(Eigen::MatrixXd::Zero(rows, cols)), v_(Eigen::MatrixXd::Zero(rows, cols)) {
  KVQ_CHECK(cfg.lr > 0 && cfg.beta1 >= 0 && cfg.beta1 < 1 && cfg.beta2 >= 0 && cfg.beta2 < 1 && cfg.eps > 0,
            "Adam: lr = {}, beta1 = {}, beta2 = {}, eps = {} out of range", cfg.lr, cfg.beta1, cfg.beta2, cfg.eps);
}

void Adam::step(Eigen::MatrixXd& param, const Eigen::MatrixXd& grad) {
  KVQ_CHECK(param.rows() == m_.rows() && param.cols() == m_.cols() && grad.rows() == m_.rows() &&
                grad.cols() == m_.cols(),
            "Adam: parameter {}x{} / gradient {}x{}, expected {}x{}", param.rows(), param.cols(), grad.rows(),
            grad.cols(), m_.rows(), m_.cols());
  KVQ_CHECK(grad.allFinite(), "Adam: non-finite gradient at step {}", t_ + 1);
  ++t_;
  m_ = cfg_.beta1 * m_ + (1 - cfg_.beta1) * grad;
  v_ = cfg_.beta2 * v_ + (1 - cfg_.beta2) * grad.cwiseAbs2();
  const double c1 = 1 - std::pow(cfg_.beta1, t_), c2 = 1 - std::pow(cfg_.beta2, t_);
  param.array() -= cfg_.lr * (m_.array() / c1) / ((v_.array() / c2).sqrt() + cfg_.eps);
}

}  // namespace kvq
