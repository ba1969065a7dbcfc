// Adam: the bias-corrected first step moves every coordinate by lr against the gradient's sign; it minimises
// a quadratic; bad settings and shapes are rejected.
#include <gtest/gtest.h>

#include "calib/adam.h"
#include "common/error.h"

using namespace kvq;

TEST(CalibAdam, FirstStepIsLrTimesSignOfGradient) {
  Adam adam(AdamConfig{}, 2, 2);
  Eigen::MatrixXd p = Eigen::MatrixXd::Zero(2, 2), g(2, 2);
  g << 3.0, -0.5, 1e-3, -200.0;
  adam.step(p, g);
  Eigen::MatrixXd want(2, 2);
  want << -0.02, 0.02, -0.02, 0.02;
  EXPECT_LT((p - want).cwiseAbs().maxCoeff(), 1e-6);
  EXPECT_EQ(adam.steps_taken(), 1);
}

TEST(CalibAdam, MinimisesAQuadratic) {
  Adam adam(AdamConfig{0.05}, 3, 1);
  Eigen::MatrixXd p = Eigen::MatrixXd::Zero(3, 1), target(3, 1);
  target << 1.0, -2.0, 0.5;
  for (int t = 0; t < 2000; ++t) adam.step(p, 2.0 * (p - target));
  EXPECT_LT((p - target).cwiseAbs().maxCoeff(), 1e-3);
}

TEST(CalibAdam, RejectsBadConfigAndShapes) {
  EXPECT_THROW(Adam(AdamConfig{0.0}, 2, 2), Error);
  EXPECT_THROW(Adam(AdamConfig{0.02, 1.0}, 2, 2), Error);
  Adam adam(AdamConfig{}, 2, 2);
  Eigen::MatrixXd p = Eigen::MatrixXd::Zero(2, 2);
  EXPECT_THROW(adam.step(p, Eigen::MatrixXd::Zero(3, 2)), Error);
  Eigen::MatrixXd bad = Eigen::MatrixXd::Zero(2, 2);
  bad(0, 0) = NAN;
  EXPECT_THROW(adam.step(p, bad), Error);
}
