// Matrix exponential and its adjoint Fréchet derivative, for OptR's R = R0 · expm(A − Aᵀ) (METHODS §4).
//
// Reference path (any square X): scaling and squaring with the degree-13 Padé approximant (Higham 2005), and
// the adjoint Fréchet derivative as the spec writes it: the upper-right d×d block of expm([[Xᵀ, G],[0, Xᵀ]]).
// Fast path (skew-symmetric X, the OptR case): X is normal, iX is Hermitian, so X = U diag(-iμ) Uᴴ with U
// unitary; expm and the Fréchet derivative follow in closed form (divided differences of exp on the spectrum).
// Tests hold the fast path to the reference one.
#pragma once

#include <Eigen/Dense>

namespace kvq {

// expm(X) by Padé-13 scaling and squaring. expm(0) is exactly I. T = float or double.
template <class T>
Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic> expm(const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>& x);

// Gradient w.r.t. X of <G, expm(X)>: the adjoint Fréchet derivative L(Xᵀ, G), computed as the upper-right block
// of expm([[Xᵀ, G],[0, Xᵀ]]) (G rescaled internally so its norm does not inflate the number of squarings).
Eigen::MatrixXd expm_frechet_adjoint_ref(const Eigen::MatrixXd& x, const Eigen::MatrixXd& g);

// X = A − Aᵀ for a square A.
Eigen::MatrixXd skew_part(const Eigen::MatrixXd& a);
// ∂L/∂A from ∂L/∂X for X = A − Aᵀ: G − Gᵀ.
Eigen::MatrixXd skew_grad(const Eigen::MatrixXd& g_x);

// Fast expm and adjoint Fréchet derivative of ONE skew-symmetric X (one eigendecomposition, reused by both).
class SkewExpm {
 public:
  // X must be skew-symmetric (|X + Xᵀ| <= 1e-10 · (1 + |X|), else kvq::Error). X == 0 is handled exactly.
  explicit SkewExpm(const Eigen::MatrixXd& x);
  // expm(X), orthogonal; exactly I when X == 0.
  const Eigen::MatrixXd& exp() const { return exp_; }
  // Gradient w.r.t. X of <G, expm(X)>, i.e. L(Xᵀ, G); exactly G when X == 0.
  Eigen::MatrixXd adjoint(const Eigen::MatrixXd& g) const;

 private:
  bool zero_ = false;          // X == 0 exactly
  Eigen::MatrixXcd u_;         // (d, d) unitary eigenvectors of iX (columns)
  Eigen::VectorXd mu_;         // (d) real eigenvalues of iX; X's eigenvalues are -i·mu
  Eigen::MatrixXd exp_;        // (d, d) expm(X)
};

}  // namespace kvq
