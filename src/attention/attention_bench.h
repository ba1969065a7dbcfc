// The decode-step attention bench of the CPU cache, one function for `kvq bench attention` and the referee's cost
// column: a one-layer KvCache filled with random rows, one decode query per sequence, the median wall time of
// cache_attention over the batch, the bytes that step reads and the cost of appending a token; and the threads'
// streaming-read bandwidth the figures are set against.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "kv/cache.h"
#include "simd/simd.h"

namespace kvq {

struct AttentionBenchShape {
  int ctx = 8192;      // tokens in every sequence's cache before the timed steps
  int batch = 1;       // sequences, one decode query each per step
  int q_heads = 32, kv_heads = 8, head_dim = 128;
  int iters = 20;      // timed steps (median reported)
  bool hot = false;    // keep the cache in the CPU caches between steps (default: evict it before each)
};

struct AttentionFigures {
  double ms = 0, ms_min = 0;        // median / min wall time of one decode step (all sequences), ms
  double cpu_ms = 0;                // median CPU time of one step summed over threads, ms
  double bytes_read = 0;            // cache bytes one step reads (all sequences)
  double append_ms = 0;             // append + demote of one token of one layer, ms (median over tokens)
  std::string cache;                // describe() of the cache
  double bits = 0;                  // effective bits per element at ctx
};

// Times cfg (its codecs, windows and transform; cfg.simd the kernels' level) at shape on the pool's threads. evict:
// a buffer read before each step unless shape.hot (96 MB pushes the cache out of L1-L3), empty when hot.
AttentionFigures bench_attention_cpu(const AttentionBenchShape& shape, const CacheConfig& cfg, ThreadPool& pool,
                                     std::vector<uint8_t>& evict);

// Random rows come from no model: key codecs that store keys without RoPE (kv/codec_rope.h) get a RoPE of base 1e6
// (Qwen3's) at head_dim, so that their decode cost (re-rotating every key) is timed.
CacheConfig with_bench_rope(CacheConfig c, int head_dim);

// Streaming-read bandwidth (bytes/s) of the pool's threads over a buffer of `bytes`: best of a few passes.
double read_bandwidth(ThreadPool& pool, size_t bytes);

// Bytes a decode query at position t of seq reads from the cache of one layer: the quantized blocks and window
// rows of its decode view, every kv head (counted from the runs the attention walks).
double decode_bytes(const KvCache& cache, int seq, int t);

}  // namespace kvq
