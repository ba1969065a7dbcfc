// A small seeded random generator for evaluation (bootstrap resampling, passkey prompts): SplitMix64, so a seed
// gives the same stream on every platform and compiler (std:: distributions are implementation-defined).
#pragma once

#include <cstdint>
#include <string_view>

namespace kvq {

class EvalRng {
 public:
  explicit EvalRng(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform integer in [0, n), n > 0, without modulo bias (rejection).
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do r = next();
    while (r >= limit);
    return r % n;
  }
  // Uniform integer in [lo, hi], both inclusive (as Python's random.randint).
  int64_t uniform_int(int64_t lo, int64_t hi) { return lo + int64_t(below(uint64_t(hi - lo) + 1)); }

 private:
  uint64_t state_;  // SplitMix64 counter
};

// Derives an independent stream seed from a base seed and a tag (task, context length, domain index ...).
inline uint64_t mix_seed(uint64_t seed, uint64_t tag) {
  EvalRng r(seed ^ (tag * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull));
  return r.next();
}

// FNV-1a of a tag such as "kl/2048/linux", for per-stream bootstrap seeds (mix_seed(seed, tag_hash(tag))).
inline uint64_t tag_hash(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace kvq
