#include "calib/expm.h"

#include <cmath>
#include <complex>

#include "calib/gemm.h"
#include "common/error.h"

namespace kvq {

namespace {

// Padé-13 coefficients and the 1-norm bound under which it meets double precision (Higham 2005, Table 2.3).
constexpr double kPade13[14] = {64764752532480000.0, 32382376266240000.0, 7771770303897600.0,
                                1187353796428800.0,  129060195264000.0,   10559470521600.0,
                                670442572800.0,      33522128640.0,       1323241920.0,
                                40840800.0,          960960.0,            16380.0,
                                182.0,               1.0};
constexpr double kTheta13 = 5.371920351148152;

}  // namespace

template <class T>
Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic> expm(const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>& x) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  KVQ_CHECK(x.rows() == x.cols(), "expm: matrix is {}x{}, must be square", x.rows(), x.cols());
  KVQ_CHECK(x.allFinite(), "expm: matrix has non-finite entries");
  const Eigen::Index d = x.rows();
  if (x.isZero(0)) return Mat::Identity(d, d);  // exact, without the solve's rounding
  const double norm1 = double(x.cwiseAbs().colwise().sum().maxCoeff());
  int s = 0;
  if (norm1 > kTheta13) s = int(std::ceil(std::log2(norm1 / kTheta13)));
  const Mat a = x * T(std::ldexp(1.0, -s));
  const Mat id = Mat::Identity(d, d);
  const Mat a2 = a * a, a4 = a2 * a2, a6 = a4 * a2;
  const auto b = [](int i) { return T(kPade13[i]); };
  const Mat u_inner = a6 * (b(13) * a6 + b(11) * a4 + b(9) * a2) + b(7) * a6 + b(5) * a4 + b(3) * a2 + b(1) * id;
  const Mat u = a * u_inner;
  const Mat v = a6 * (b(12) * a6 + b(10) * a4 + b(8) * a2) + b(6) * a6 + b(4) * a4 + b(2) * a2 + b(0) * id;
  Mat r = (v - u).partialPivLu().solve(v + u);
  for (int i = 0; i < s; ++i) r = (r * r).eval();
  return r;
}

template Eigen::MatrixXf expm<float>(const Eigen::MatrixXf&);
template Eigen::MatrixXd expm<double>(const Eigen::MatrixXd&);

Eigen::MatrixXd expm_frechet_adjoint_ref(const Eigen::MatrixXd& x, const Eigen::MatrixXd& g) {
  KVQ_CHECK(x.rows() == x.cols() && g.rows() == x.rows() && g.cols() == x.cols(),
            "expm_frechet_adjoint_ref: X is {}x{}, G is {}x{}", x.rows(), x.cols(), g.rows(), g.cols());
  const Eigen::Index d = x.rows();
  const double gn = g.cwiseAbs().colwise().sum().maxCoeff();
  if (gn == 0.0) return Eigen::MatrixXd::Zero(d, d);
  const double xn = x.cwiseAbs().colwise().sum().maxCoeff();
  const double c = std::max(xn, 1.0) / gn;  // the block is linear in G: scale G to the size of X, unscale after
  Eigen::MatrixXd m = Eigen::MatrixXd::Zero(2 * d, 2 * d);
  m.topLeftCorner(d, d) = x.transpose();
  m.bottomRightCorner(d, d) = x.transpose();
  m.topRightCorner(d, d) = c * g;
  return expm<double>(m).topRightCorner(d, d) / c;
}

Eigen::MatrixXd skew_part(const Eigen::MatrixXd& a) {
  KVQ_CHECK(a.rows() == a.cols(), "skew_part: matrix is {}x{}", a.rows(), a.cols());
  return a - a.transpose();
}

Eigen::MatrixXd skew_grad(const Eigen::MatrixXd& g_x) { return g_x - g_x.transpose(); }

SkewExpm::SkewExpm(const Eigen::MatrixXd& x) {
  KVQ_CHECK(x.rows() == x.cols() && x.rows() > 0, "SkewExpm: matrix is {}x{}", x.rows(), x.cols());
  KVQ_CHECK(x.allFinite(), "SkewExpm: matrix has non-finite entries");
  const double xmax = x.cwiseAbs().maxCoeff();
  KVQ_CHECK((x + x.transpose()).cwiseAbs().maxCoeff() <= 1e-10 * (1.0 + xmax),
            "SkewExpm: matrix is not skew-symmetric (max |X + Xᵀ| = {})",
            (x + x.transpose()).cwiseAbs().maxCoeff());
  const Eigen::Index d = x.rows();
  if (xmax == 0.0) {
    zero_ = true;
    exp_ = Eigen::MatrixXd::Identity(d, d);
    return;
  }
  const Eigen::MatrixXcd h = std::complex<double>(0.0, 1.0) * x.cast<std::complex<double>>();
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXcd> es(h);
  KVQ_CHECK(es.info() == Eigen::Success, "SkewExpm: eigendecomposition did not converge");
  u_ = es.eigenvectors();
  mu_ = es.eigenvalues();
  Eigen::VectorXcd e(d);
  for (Eigen::Index i = 0; i < d; ++i) e(i) = std::polar(1.0, -mu_(i));  // exp(-i mu)
  exp_ = zgemm(u_ * e.asDiagonal(), false, u_, true).real();
}

Eigen::MatrixXd SkewExpm::adjoint(const Eigen::MatrixXd& g) const {
  const Eigen::Index d = exp_.rows();
  KVQ_CHECK(g.rows() == d && g.cols() == d, "SkewExpm::adjoint: G is {}x{}, expected {}x{}", g.rows(), g.cols(), d, d);
  if (zero_) return g;
  // Xᵀ = -X has eigenvalues +i·mu on the same eigenvectors. L(Xᵀ, G) = U (Φ ∘ (Uᴴ G U)) Uᴴ with the divided
  // differences Φ_jk = (e^{iμj} − e^{iμk}) / (i(μj − μk)) = e^{i(μj+μk)/2} · sinc((μj − μk)/2).
  Eigen::MatrixXcd m = zgemm(u_, true, zgemm(g.cast<std::complex<double>>(), false, u_, false), false);
  for (Eigen::Index k = 0; k < d; ++k)
    for (Eigen::Index j = 0; j < d; ++j) {
      const double h = 0.5 * (mu_(j) - mu_(k));
      const double sinc = std::fabs(h) < 1e-8 ? 1.0 - h * h / 6.0 : std::sin(h) / h;
      m(j, k) *= sinc * std::polar(1.0, 0.5 * (mu_(j) + mu_(k)));
    }
  return zgemm(zgemm(u_, false, m, false), false, u_, true).real();
}

}  // namespace kvq
