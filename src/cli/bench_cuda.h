// kvq bench attention --device cuda (cmd_bench_cuda.cpp): decode-step attention of the GPU cache over a grid of
// batch x context shapes, against kvq's bf16 GPU kernel and the device's measured read bandwidth.
#pragma once

#include <vector>

#include "kv/cache.h"

namespace kvq::cli {

struct GpuAttentionBench {
  CacheConfig cache;         // codecs and windows under test (the bf16 baseline uses the same windows)
  std::vector<int> batches;  // sequences per decode step, one query each
  std::vector<int> ctxs;     // tokens in every sequence's cache
  int q_heads = 32, kv_heads = 8, head_dim = 128;
  int iters = 20;            // timed steps per shape (median reported)
  bool json = false;         // one JSON array of records instead of the table
};

// Throws kvq::Error when built without CUDA or when no device is available.
void bench_attention_cuda(const GpuAttentionBench& o);

}  // namespace kvq::cli
