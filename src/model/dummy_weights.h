// Dummy weights (--dummy-weights, as vLLM's --load-format dummy): random weights of a config's shapes for timing at
// real model sizes without a checkpoint. Timing only: the model computes nothing meaningful.
//
// The distribution is transformers' from_config initialisation (PreTrainedModel._init_weights for Qwen3 / Qwen2 /
// Llama): linear weights and the embedding ~ N(0, initializer_range^2), biases 0, RMSNorm weights 1 (no row is
// zeroed: the shipped configs have no pad_token_id). Each value is rounded to bf16, as a bf16 checkpoint holds it.
//
// The generator is counter-based: value i of a tensor is a pure function of (seed, the tensor's stream, i), so any
// thread, on the host or on the GPU, fills any range in any order. The normal deviate is the Irwin-Hall sum of 12
// uniforms (12 x 10 random bits, minus their mean): integer arithmetic and one exact scaling, so the host and the
// device produce the same bits. Its variance is 1 - 2^-20 (12 discrete uniforms of variance (1 - 2^-20) / 12), its
// tails end at 6 sigma and its kurtosis is 2.9 instead of 3: a normal in every way that matters for timing, and
// bounded, which keeps activations finite. Plain header (KVQ_HD), includable from .cu files.
#pragma once

#include <stdint.h>

#include "common/half.h"

namespace kvq {

// How transformers initialises a tensor in from_config.
enum class TensorInit : uint8_t {
  Normal,  // N(0, initializer_range^2): linear weights, the embedding
  Ones,    // RMSNorm weights
  Zeros,   // biases
};

// The splitmix64 finaliser: a bijective 64-bit mixer whose outputs over consecutive inputs pass as independent.
KVQ_HD inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Deviate i of stream `stream` under `seed`: mean 0, variance 1 - 2^-20, on the grid of multiples of 2^-10 in
// [-6, 6] (see the header comment).
KVQ_HD inline float dummy_normal(uint64_t seed, uint32_t stream, uint64_t i) {
  const uint64_t base = splitmix64(splitmix64(seed) + stream);  // the tensor's counter origin
  const uint64_t r0 = splitmix64(base + 2 * i), r1 = splitmix64(base + 2 * i + 1);
  uint32_t sum = 0;  // 12 uniforms of 10 bits: six from the low 60 bits of each word
  for (int j = 0; j < 6; ++j) sum += uint32_t(r0 >> (10 * j)) & 1023u;
  for (int j = 0; j < 6; ++j) sum += uint32_t(r1 >> (10 * j)) & 1023u;
  // (sum - 12 * 1023 / 2) / 1024: an integer below 2^24, then a power of two, both exact in fp32.
  return exact::mul(float(int32_t(sum) - 6138), 1.0f / 1024.0f);
}

// Value i of a tensor initialised as `init`: std * deviate rounded to bf16 (exactly representable in fp32), 1 or 0.
KVQ_HD inline float dummy_value(TensorInit init, float std, uint64_t seed, uint32_t stream, uint64_t i) {
  switch (init) {
    case TensorInit::Normal: return bf16_to_f32(f32_to_bf16(exact::mul(std, dummy_normal(seed, stream, i))));
    case TensorInit::Ones: return 1.0f;
    case TensorInit::Zeros: return 0.0f;
  }
  return 0.0f;
}

}  // namespace kvq
