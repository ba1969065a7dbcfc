#include "model/sampler.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "model/gumbel.h"

namespace kvq {

namespace {
// The total order of candidates: larger logit first, lower id on ties.
bool before(float la, int32_t ia, float lb, int32_t ib) { return la > lb || (la == lb && ia < ib); }

// An upper bound on gumbel::score(logit, t, base, i) from float logarithms: u taken one float step up (the noise grows
// with u), -log u one part in 10^5 down, and 10^-3 added: far more than libm's float error (a few ulp, 10^-6 of the
// noise at most). A token whose bound is below the best score so far cannot be drawn: its two exact logarithms are
// skipped, and the draw is the same.
double score_bound(float logit, double t, uint64_t base, uint64_t i) {
  const float u = std::nextafter(float(gumbel::uniform(base, i)), 2.f);
  if (!(u < 1.f)) return INFINITY;
  const float e = -std::log(u) * (1.f - 1e-5f);
  return double(logit) / t + double(-std::log(e)) + 1e-3;
}
}  // namespace

void SamplerConfig::validate() const {
  KVQ_CHECK(temperature >= 0.f && std::isfinite(temperature), "--temp must be >= 0 (got {})", temperature);
  KVQ_CHECK(top_k >= 0, "--top-k must be >= 0 (got {})", top_k);
  KVQ_CHECK(top_p > 0.f && top_p <= 1.f, "--top-p must be in (0, 1] (got {})", top_p);
  KVQ_CHECK(min_p >= 0.f && min_p <= 1.f, "min_p must be in [0, 1] (got {})", min_p);
  KVQ_CHECK(std::isfinite(presence_penalty) && std::isfinite(frequency_penalty),
            "presence / frequency penalties must be finite (got {}, {})", presence_penalty, frequency_penalty);
  KVQ_CHECK(repetition_penalty > 0.f && std::isfinite(repetition_penalty), "repetition_penalty must be > 0 (got {})",
            repetition_penalty);
  for (const auto& [id, bias] : logit_bias)
    KVQ_CHECK(id >= 0 && std::isfinite(bias), "logit_bias: token {} with bias {}", id, bias);
}

bool SamplerConfig::transforms_logits() const {
  return presence_penalty != 0.f || frequency_penalty != 0.f || repetition_penalty != 1.f || !logit_bias.empty();
}

Sampler::Sampler(const SamplerConfig& cfg) : cfg_(cfg), rng_(cfg.seed) { cfg.validate(); }

void Sampler::observe_prompt(const int32_t* ids, int n) {
  for (int i = 0; i < n; ++i) {
    const int32_t id = ids[i];
    if (id < 0) continue;
    if (size_t(id) >= seen_mask_.size()) seen_mask_.resize(size_t(id) + 1, false);
    if (!seen_mask_[size_t(id)]) seen_mask_[size_t(id)] = true, seen_.push_back(id);
  }
}

void Sampler::observe(int32_t id) {
  observe_prompt(&id, 1);
  ++generated_[id];
}

void Sampler::apply_penalties(float* logits, int vocab) const {
  for (const auto& [id, bias] : cfg_.logit_bias)
    if (id < vocab) logits[id] += bias;
  if (cfg_.repetition_penalty != 1.f)
    for (int32_t id : seen_)
      if (id < vocab) {
        float& l = logits[id];
        l = l > 0.f ? l / cfg_.repetition_penalty : l * cfg_.repetition_penalty;
      }
  if (cfg_.presence_penalty != 0.f || cfg_.frequency_penalty != 0.f)
    for (const auto& [id, count] : generated_)
      if (id < vocab) logits[id] -= cfg_.frequency_penalty * float(count) + cfg_.presence_penalty;
}

void Sampler::order_prefix(size_t n) {
  if (n <= ordered_) return;
  n = std::min(std::max({n, ordered_ * 4, size_t(64)}), cand_.size());
  auto cmp = [](const Cand& a, const Cand& b) { return before(a.logit, a.id, b.logit, b.id); };
  const auto first = cand_.begin() + std::ptrdiff_t(ordered_), mid = cand_.begin() + std::ptrdiff_t(n);
  if (mid < cand_.end()) std::nth_element(first, mid - 1, cand_.end(), cmp);
  std::sort(first, mid, cmp);
  ordered_ = n;
}

int32_t Sampler::sample(const float* logits, int vocab) {
  if (cfg_.transforms_logits()) {
    work_.assign(logits, logits + vocab);
    apply_penalties(work_.data(), vocab);
    logits = work_.data();
  }
  if (cfg_.temperature == 0.f) return int32_t(std::max_element(logits, logits + vocab) - logits);
  if (draws_by_gumbel(vocab)) {
    const uint64_t base = gumbel_base();
    const double t = double(cfg_.temperature);
    int32_t best = 0;
    double best_score = gumbel::score(logits[0], t, base, 0);
    for (int i = 1; i < vocab; ++i) {
      if (score_bound(logits[i], t, base, uint64_t(i)) < best_score) continue;  // it cannot win
      const double sc = gumbel::score(logits[i], t, base, uint64_t(i));
      if (sc > best_score) best = i, best_score = sc;
    }
    return take_gumbel(best);
  }
  auto cmp = [](const Cand& a, const Cand& b) { return before(a.logit, a.id, b.logit, b.id); };
  const size_t k = cfg_.top_k > 0 ? std::min(size_t(cfg_.top_k), size_t(vocab)) : size_t(vocab);
  if (k < size_t(vocab) && k <= size_t(kMaxSortedTopK)) {
    // A small top_k in one pass: the k first of the order seen so far are kept with up to 3k more, and once there are
    // 4k the k-th becomes the bar a logit must pass (in the total order: a later id ties below it). Then sorted whole.
    cand_.clear();
    Cand bar{};
    bool barred = false;
    for (int i = 0; i < vocab; ++i) {
      if (barred && !before(logits[i], i, bar.logit, bar.id)) continue;
      cand_.push_back({logits[i], i, 0.0});
      if (cand_.size() == 4 * k) {
        std::nth_element(cand_.begin(), cand_.begin() + std::ptrdiff_t(k) - 1, cand_.end(), cmp);
        cand_.resize(k);
        bar = cand_[k - 1], barred = true;
      }
    }
    if (cand_.size() > k) std::nth_element(cand_.begin(), cand_.begin() + std::ptrdiff_t(k) - 1, cand_.end(), cmp);
    cand_.resize(k);
    std::sort(cand_.begin(), cand_.end(), cmp);
    ordered_ = k;
    return draw(vocab);
  }
  cand_.resize(size_t(vocab));
  for (int i = 0; i < vocab; ++i) cand_[size_t(i)] = {logits[i], i, 0.0};
  ordered_ = 0;
  // A larger top_k: the k first of the order by one selection.
  if (k < cand_.size()) {
    std::nth_element(cand_.begin(), cand_.begin() + std::ptrdiff_t(k) - 1, cand_.end(), cmp);
    cand_.resize(k);
  }
  return draw(vocab);
}

bool Sampler::draws_by_gumbel(int vocab) const {
  return cfg_.temperature > 0.f && (cfg_.top_k == 0 || cfg_.top_k >= vocab) && cfg_.top_p >= 1.f && cfg_.min_p == 0.f;
}

uint64_t Sampler::gumbel_base() const { return gumbel::draw_base(cfg_.seed, draws_); }

int Sampler::top_candidates(int vocab) const {
  if (cfg_.temperature <= 0.f || cfg_.transforms_logits() || draws_by_gumbel(vocab)) return 0;
  if (cfg_.top_k > 0 && cfg_.top_k < vocab) return cfg_.top_k <= kMaxSortedTopK ? cfg_.top_k : 0;
  return std::min(kMaxSortedTopK, vocab);  // top_p / min_p over the whole vocabulary: with the row's mass
}

bool Sampler::needs_row_mass(int vocab) const {
  return top_candidates(vocab) > 0 && !(cfg_.top_k > 0 && cfg_.top_k < vocab);
}

int32_t Sampler::sample_top(const int32_t* ids, const float* logits, int n, int vocab, const smath::RowMass* mass) {
  const int k = top_candidates(vocab);
  KVQ_CHECK(k > 0 && n >= k && (mass != nullptr) == needs_row_mass(vocab),
            "sampler: {} candidates{} where top_k {} of {} needs {}{}", n, mass ? " with the row's mass" : "",
            cfg_.top_k, vocab, k, needs_row_mass(vocab) ? " with the row's mass" : "");
  cand_.resize(size_t(k));
  for (int i = 0; i < k; ++i) cand_[size_t(i)] = {logits[i], ids[i], 0.0};
  ordered_ = size_t(k);
  return draw(vocab, mass);
}

int32_t Sampler::draw(int vocab, const smath::RowMass* mass) {
  float mx = cand_[0].logit;
  for (const Cand& c : cand_) mx = std::max(mx, c.logit);
  const double t = double(cfg_.temperature), min_p = double(cfg_.min_p);
  for (Cand& c : cand_) c.p = smath::weight(c.logit, mx, t);
  double total = 0;
  size_t above_min_p = 0;  // candidates with p >= min_p × the largest (whose p is exp(0) = 1)
  if (mass) {
    total = mass->total, above_min_p = size_t(mass->above_min_p);
  } else {
    const size_t n = cand_.size(), block = size_t(smath::sum_block(int64_t(n)));
    for (size_t b0 = 0; b0 < n; b0 += block) {  // smath's order of the sum
      double part = 0;
      for (size_t i = b0; i < std::min(n, b0 + block); ++i) part += cand_[i].p;
      total += part;
    }
    for (const Cand& c : cand_) above_min_p += c.p >= min_p;
  }
  // top_p: the smallest prefix of the order whose probability reaches top_p (of the top_k's); then min_p.
  size_t keep = mass ? size_t(vocab) : cand_.size();  // with mass: what the whole row would keep
  double mass_kept = total;
  if (cfg_.top_p < 1.f) {
    double cum = 0;
    bool reached = false;
    for (keep = 0; keep < cand_.size();) {
      order_prefix(keep + 1);
      cum += cand_[keep++].p;
      if ((reached = cum / total >= cfg_.top_p)) break;
    }
    if (mass && !reached && cand_.size() < size_t(vocab)) return -1;  // the nucleus reaches past the candidates
    mass_kept = cum;
  }
  if (above_min_p < keep) {
    keep = above_min_p;
    order_prefix(keep);
    mass_kept = 0;
    for (size_t i = 0; i < keep; ++i) mass_kept += cand_[i].p;
  }
  if (keep > cand_.size()) return -1;  // with mass: the draw is over more than the candidates
  std::uniform_real_distribution<double> u(0.0, mass_kept);
  double r = u(rng_);
  for (size_t i = 0; i < keep; ++i) {
    order_prefix(i + 1);
    if ((r -= cand_[i].p) <= 0) return cand_[i].id;
  }
  order_prefix(keep);
  return cand_[keep - 1].id;
}

}  // namespace kvq
