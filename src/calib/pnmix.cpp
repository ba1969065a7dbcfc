#include "calib/pnmix.h"

#include <chrono>
#include <cmath>

#include "common/error.h"

namespace kvq {

PairScore parse_pair_score(const std::string& name) {
  if (name == "product") return PairScore::kProduct;
  KVQ_CHECK(name == "energy", "--pnmix-score '{}' is not supported (product: E|q| E|k| per pair; energy: "
            "(E|q|^2 + E|k|^2) / 2)", name);
  return PairScore::kEnergy;
}

const char* pair_score_name(PairScore s) { return s == PairScore::kProduct ? "product" : "energy"; }

int pnmix_code_bits(double key_bits, int head_dim) {
  KVQ_CHECK(std::isfinite(key_bits) && key_bits >= kPnmixMinBits && key_bits <= kPnmixMaxBits,
            "--key-bits {}: the average key bits must be in [{}, {}] (every pair stores 1 to 4 bits)", key_bits,
            kPnmixMinBits, kPnmixMaxBits);
  // Each greedy step gives one pair (two channels) one bit: B·d = d + 2k.
  const double steps = (key_bits - 1.0) * head_dim / 2.0;
  const long k = std::lround(steps);
  const double step = 2.0 / head_dim;
  KVQ_CHECK(std::fabs(steps - double(k)) < 1e-9,
            "--key-bits {} is not reachable at head_dim {}: each step gives one RoPE pair (2 elements) one bit, so "
            "the average is 1 + 2k/{} (nearest: {:g} or {:g})", key_bits, head_dim, head_dim,
            1.0 + std::floor(steps) * step, 1.0 + std::ceil(steps) * step);
  return head_dim + 2 * int(k);
}

std::vector<uint8_t> allocate_pair_bits(const float* scores, int n_pairs, int code_bits) {
  KVQ_CHECK(n_pairs > 0 && code_bits >= 2 * kPnmixMinBits * n_pairs && code_bits <= 2 * kPnmixMaxBits * n_pairs &&
                code_bits % 2 == 0,
            "pnmix allocation: {} code bits for {} pairs (between {} and {}, even)", code_bits, n_pairs,
            2 * n_pairs, 8 * n_pairs);
  std::vector<uint8_t> b(static_cast<size_t>(n_pairs), static_cast<uint8_t>(kPnmixMinBits));
  for (int step = 0; step < (code_bits - 2 * n_pairs) / 2; ++step) {
    int best = -1;
    double best_gain = 0;
    for (int i = 0; i < n_pairs; ++i) {
      if (b[size_t(i)] >= kPnmixMaxBits) continue;
      // s_i · 4^{-b_i}, exact: a power-of-two scaling of the float score. Strictly greater: ties keep the lower i.
      const double gain = std::ldexp(double(scores[i]), -2 * b[size_t(i)]);
      if (best < 0 || gain > best_gain) best = i, best_gain = gain;
    }
    ++b[size_t(best)];
  }
  return b;
}

PairNormStats::PairNormStats(int L, int H, int hq, int d)
    : n_layers(L), n_kv(H), n_heads(hq), head_dim(d),
      q_norm(size_t(L) * H * (d / 2), 0.0), q_sq(q_norm), k_norm(q_norm), k_sq(q_norm),
      q_rows(size_t(L), 0), k_rows(size_t(L), 0) {
  KVQ_CHECK(L > 0 && H > 0 && hq % H == 0 && d % 2 == 0, "pnmix: {} layers, {} query / {} kv heads, head_dim {}", L,
            hq, H, d);
}

void PairNormStats::add(int layer, int n, const float* q, const float* k) {
  const int half = head_dim / 2, g = n_heads / n_kv;
  auto accumulate = [&](const float* row, double* norm, double* sq) {
    for (int i = 0; i < half; ++i) {
      const double a = row[i], b = row[i + half], e = a * a + b * b;
      norm[i] += std::sqrt(e);
      sq[i] += e;
    }
  };
  for (int h = 0; h < n_kv; ++h) {
    const size_t at = (size_t(layer) * n_kv + h) * half;
    for (int t = 0; t < n; ++t) {
      accumulate(k + (size_t(t) * n_kv + h) * head_dim, &k_norm[at], &k_sq[at]);
      for (int j = 0; j < g; ++j)  // the GQA group of kv head h: query heads h g .. h g + g - 1
        accumulate(q + (size_t(t) * n_heads + h * g + j) * head_dim, &q_norm[at], &q_sq[at]);
    }
  }
  k_rows[size_t(layer)] += n;
  q_rows[size_t(layer)] += int64_t(n) * g;
}

std::vector<float> PairNormStats::scores(PairScore score) const {
  const int half = head_dim / 2;
  std::vector<float> s(q_norm.size());
  for (int l = 0; l < n_layers; ++l) {
    KVQ_CHECK(q_rows[size_t(l)] > 0 && k_rows[size_t(l)] > 0, "pnmix: no calibration rows for layer {}", l);
    const double nq = double(q_rows[size_t(l)]), nk = double(k_rows[size_t(l)]);
    for (size_t i = size_t(l) * n_kv * half; i < size_t(l + 1) * n_kv * half; ++i)
      s[i] = float(score == PairScore::kProduct ? (q_norm[i] / nq) * (k_norm[i] / nk)
                                                : (q_sq[i] / nq + k_sq[i] / nk) / 2.0);
  }
  return s;
}

PairBitTable allocate_table(const std::vector<float>& scores, int n_layers, int n_kv_heads, int head_dim,
                            int code_bits, PairScore score) {
  PairBitTable t;
  t.n_layers = n_layers, t.n_kv_heads = n_kv_heads, t.head_dim = head_dim;
  t.name = std::string("pnmix(") + pair_score_name(score) + ")";
  const int half = head_dim / 2;
  KVQ_CHECK(scores.size() == size_t(n_layers) * n_kv_heads * half, "pnmix: {} scores for {} x {} heads x {} pairs",
            scores.size(), n_layers, n_kv_heads, half);
  for (int m = 0; m < n_layers * n_kv_heads; ++m) {
    const std::vector<uint8_t> b = allocate_pair_bits(scores.data() + size_t(m) * half, half, code_bits);
    t.bits.insert(t.bits.end(), b.begin(), b.end());
  }
  t.validate();
  return t;
}

namespace {

class PairNormTap final : public Model::LayerTap {
 public:
  explicit PairNormTap(PairNormStats& s) : s_(s) {}
  void on_qkv(int layer, int, int n, const float* q, const float* k, const float*) override { s_.add(layer, n, q, k); }

 private:
  PairNormStats& s_;
};

}  // namespace

PnmixCalibration calibrate_pnmix(Model& model, const std::vector<int32_t>& ids, const CalibrateConfig& cfg,
                                 const CalibrateProgress& progress) {
  const ModelConfig& mc = model.config();
  KVQ_CHECK(cfg.method == "pnmix", "calibrate_pnmix: method '{}'", cfg.method);
  cfg.validate(mc);
  const PairScore score = parse_pair_score(cfg.pnmix_score);
  const int code_bits = pnmix_code_bits(cfg.key_bits, mc.head_dim);
  PairNormStats stats(mc.n_layers, mc.n_kv_heads, mc.n_heads, mc.head_dim);
  PairNormTap tap(stats);
  const auto t0 = std::chrono::steady_clock::now();
  PnmixCalibration out;
  out.chunks = capture_chunks(model, ids, cfg, tap, [](int) {}, progress);
  out.tokens_used = out.chunks * cfg.chunk;
  out.capture_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.scores = stats.scores(score);
  out.table = allocate_table(out.scores, mc.n_layers, mc.n_kv_heads, mc.head_dim, code_bits, score);
  return out;
}

PairBitTable timing_pair_bits(int n_layers, int n_kv_heads, int head_dim, double key_bits) {
  const size_t pairs = size_t(head_dim / 2);
  std::vector<float> scores(size_t(n_layers) * size_t(n_kv_heads) * pairs);
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = 1.f / float(1 + i % pairs);
  PairBitTable t = allocate_table(scores, n_layers, n_kv_heads, head_dim, pnmix_code_bits(key_bits, head_dim),
                                  PairScore::kProduct);
  t.name = "pnmix(timing)";
  return t;
}

}  // namespace kvq
