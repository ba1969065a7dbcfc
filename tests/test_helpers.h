// Small helpers shared by several test files.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codecs/pnmix/codec_pnmix.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "model/config.h"
#include "model/runner.h"
#include "rotation/rotation_file.h"

namespace kvq::test {

// The first `bytes` bytes of the file at path (fewer when it is shorter): small eval and calibration texts.
inline std::string head_of(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  std::string text(bytes, '\0');
  in.read(text.data(), std::streamsize(text.size()));
  text.resize(size_t(in.gcount()));
  return text;
}

// n token ids of models/ref's vocabulary, a different sequence for each salt (prompts of the engine and prefix tests).
inline std::vector<int32_t> token_ids(int n, int salt) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = int32_t((i * 7919 + salt * 104729) % 8000 + 1);
  return v;
}

// Feeds tokens [from, to) of t to seq in chunks ending at multiples of chunk (as a fresh run from 0 feeds them);
// returns the logits of every row of the last chunk. With store: caches the state after each whole chunk, as the
// scheduler does (prefix caching).
inline std::vector<float> feed_chunks(Runner& r, int seq, const std::vector<int32_t>& t, int from, int to, int chunk,
                                      bool store) {
  const int V = r.config().vocab_size;
  std::vector<float> logits;
  for (int at = from; at < to;) {
    const int n = std::min(to, (at / chunk + 1) * chunk) - at;
    logits.assign(size_t(n) * V, 0.f);
    r.forward(seq, t.data() + at, n, logits.data(), true);
    at += n;
    if (store && at % chunk == 0) r.prefix_store(seq, t.data(), at);
  }
  return logits;
}

// The message of the kvq::Error that f throws, or "(no error)" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The RoPE inverse frequencies (ModelConfig::rope_inv_freq, default RoPE of base theta) of head_dim d: what the runner
// puts in CacheConfig::key_rope for key codecs that store keys without RoPE.
inline std::vector<float> rope_inv_freq(int d, double theta = 10000.0) {
  ModelConfig mc;
  mc.head_dim = d;
  mc.rope.theta = theta;
  return mc.rope_inv_freq();
}

// n values drawn from N(0, sigma²) by a generator seeded with seed (the codec tests' random rows).
inline std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  return x;
}

// A random orthogonal d×d matrix (Gram–Schmidt of a Gaussian matrix, in double), row-major.
inline std::vector<float> random_orthogonal(int d, std::mt19937& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> m(size_t(d) * d);
  for (auto& x : m) x = nd(rng);
  orthonormalise_rows(m.data(), d);
  return std::vector<float>(m.begin(), m.end());
}

// A PN-Mix width table (codecs/pnmix/codec_pnmix.h) for tests: every (layer, kv head) at head_dim d gets the pattern
// 1, 1, 3, 4, 1, 2, 2, 2 over its pairs (average 2 bits, all four widths), rotated by the head's index so heads differ.
inline std::shared_ptr<const PairBitTable> pnmix_widths(int n_layers, int n_kv_heads, int d) {
  constexpr uint8_t kPattern[8] = {1, 1, 3, 4, 1, 2, 2, 2};
  auto t = std::make_shared<PairBitTable>();
  t->n_layers = n_layers, t->n_kv_heads = n_kv_heads, t->head_dim = d, t->name = "pnmix(test)";
  for (int m = 0; m < n_layers * n_kv_heads; ++m)
    for (int i = 0; i < d / 2; ++i) t->bits.push_back(kPattern[(i + m) % 8]);
  return t;
}

// s with pnmix_widths attached when its codec is one per (layer, kv head) (PN-Mix keys), for the table-driven tests.
inline CodecSpec with_test_widths(CodecSpec s, int n_layers, int n_kv_heads) {
  if (const CodecTraits* t = find_codec(s.type); t && t->per_head) s.pair_bits = pnmix_widths(n_layers, n_kv_heads, s.head_dim);
  return s;
}

}  // namespace kvq::test
