// kvq bench attention --device cuda (cmd_bench_cuda.cpp): decode-step attention of the GPU cache over a grid of
// batch x context shapes, against kvq's bf16 GPU kernel and the device's measured read bandwidth; or (--prefill) one
// prefill chunk's attention per context, the tensor-core prefill kernel against the per-row path.
#pragma once

#include <string>
#include <vector>

#include "kv/cache.h"
#include "model/config.h"
#include "model/runner.h"

namespace kvq::cli {

struct GpuAttentionBench {
  std::vector<CacheConfig> caches;  // codecs and windows under test, each against one bf16 baseline of the first's
                                    // windows (with the transform their codecs imply)
  std::vector<int> batches;  // sequences per decode step, one query each
  std::vector<int> ctxs;     // tokens in every sequence's cache
  int q_heads = 32, kv_heads = 8, head_dim = 128;
  int iters = 20;            // timed steps per shape (median reported)
  int prefill = 0;           // > 0: time one prefill chunk of this many queries at each ctx (batch 1), the prefill
                             // kernel against the per-row path, instead of the decode grid
  int split_tokens = 0;      // positions per KV split of the decode kernel (0: the planner's; GpuKvCache)
  bool json = false;         // one JSON array of records instead of the table
};

// Throws kvq::Error when built without CUDA or when no device is available.
void bench_attention_cuda(const GpuAttentionBench& o);

// One shape of that bench for one cache (the referee's cost column): the median microseconds of a decode step's
// attention at batch x ctx and the bytes it reads, on the device named in `device`. Throws kvq::Error without CUDA,
// for a cache the GPU does not run, or when the shape does not fit the free memory.
struct GpuAttentionCost {
  double us = 0, bytes_read = 0;
  std::string device;
};
GpuAttentionCost attention_cost_cuda(const CacheConfig& cfg, int batch, int ctx, int q_heads, int kv_heads,
                                     int head_dim, int iters);

// kvq bench gemm: the decode step's bf16 GEMMs at a model's shapes (config.json only) at each row count, as GpuModel
// runs them (cuBLAS): time and share of the read probe of each, and of a step's GEMMs in all.
struct GpuGemmBench {
  ModelConfig model;
  std::vector<int> rows;  // rows per GEMM: sequences of a decode step
  int iters = 20;
  int lt_algos = 0;       // > 0: also time the first lt_algos algorithms of cuBLASLt's heuristic per GEMM
};
// Throws kvq::Error when built without CUDA or when no device is available.
void bench_gemm_cuda(const GpuGemmBench& o);

// The device's streaming-read bandwidth, bytes/s (cuda::read_bandwidth_probe over up to 2 GiB of free memory): what
// bench attention and bench decode set their steps against. Throws without CUDA.
double read_bandwidth_cuda();

// kvq bench decode --kv-budget-gib: what a cache built from a byte budget really holds, sequences opened and
// reserved to ctx tokens each until the pool refused one (allocated, not computed).
struct PoolProbe {
  int held = 0;          // sequences reserved to ctx
  int n_slots = 0;       // the pool's sequence slots and pages
  int n_pages = 0;
  size_t bytes = 0;      // bytes the cache allocated (pages + windows)
  std::string refusal;   // the kvq::Error that ended the fill
};
// The same probe of the GPU cache (cuda::GpuKvCache); the CPU one is in cmd_bench.cpp. Throws without CUDA.
PoolProbe probe_pool_cuda(const CacheConfig& cfg, int n_layers, int n_kv_heads, int head_dim, int ctx,
                          size_t budget_bytes);

// kvq bench decode --fill-cache: the caches of seqs (open, empty) filled to ctx tokens with random K/V rows, N(0, 1),
// through the GPU cache's own append and demotion: steps of up to max_chunk rows of every sequence, all layers. The
// runner must be the GPU runner (cuda::GpuModel). Throws without CUDA.
void fill_cache_cuda(Runner& runner, const std::vector<int>& seqs, int ctx);

}  // namespace kvq::cli
