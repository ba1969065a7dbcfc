// Decode-faithful attention over the paged mixed-precision KV cache (CPU).
//
// For a chunk of queries at positions [pos0, pos0 + n) of one sequence and one layer, every query t attends to
// positions 0..t through the cache as decode would hold it at step t (kv/cache.h): BF16 sinks, the quantized
// region read through the codecs, and the BF16 recent window. Segments are merged exactly with log-sum-exp.
//
// Work is split into items (query tile × kv head × KV split). A tile holds the queries of every query head of
// the GQA group, so each cached row is read once per tile for the whole group. Decode (one query) splits the
// KV runs across threads and merges the partial softmax states exactly. The sequences of a batched step go
// through one loop of all their items: one hand-out and one wait a layer, not one per sequence.
#pragma once

#include <span>
#include <vector>

#include "common/thread_pool.h"
#include "kv/cache.h"

namespace kvq {

struct AttentionShape {
  int n_heads;     // query heads
  int n_kv_heads;  // kv heads; query head j uses kv head j / (n_heads / n_kv_heads)
  int head_dim;    // d
};

// The queries of one sequence in a step: positions [pos0, pos0 + n) of sequence seq.
// q:   [n, n_heads, d] queries, already scaled by 1/sqrt(d) and transformed like the cached keys
// out: [n, n_heads, d] attention outputs (before any value un-rotation)
struct AttentionJob {
  int seq, pos0, n;
  const float* q;
  float* out;
};

// Attention of several sequences' queries at one layer. A job's items and their split of the KV runs depend only on
// the job and the pool's size, so each sequence's output is the same bits in a batch of any size or alone.
void cache_attention(const KvCache& cache, std::span<const AttentionJob> jobs, int layer, const AttentionShape& shape,
                     ThreadPool& pool);

// One sequence's attention: the batch of one job.
void cache_attention(const KvCache& cache, int seq, int layer, int pos0, int n, const float* q, float* out,
                     const AttentionShape& shape, ThreadPool& pool);

// One sequence's rows of a step at one layer: its keys and values, appended, and its queries, attended.
struct AppendJob {
  int seq, pos0, n;
  const float* k;  // [n, n_kv_heads, d] keys and values for positions [pos0, pos0 + n), as KvCache::append takes them
  const float* v;
  const float* q;  // [n, n_heads, d] queries and outputs, as AttentionJob's
  float* out;
};

// A model step's cache work at one layer: every job's rows appended and its queries attended, in rounds of
// cache.layout().append_tokens rows (each round appends the jobs' next rows, then attends their queries), since the
// ring holds no more than one round beyond the window. Every query reads the rows it would with a ring as long as
// the chunk (a round's job may split its KV runs differently: the same result up to the merge's rounding).
void append_and_attend(KvCache& cache, std::span<const AppendJob> jobs, int layer, const AttentionShape& shape,
                       ThreadPool& pool);
// One sequence's: the batch of one job.
void append_and_attend(KvCache& cache, int seq, int layer, int pos0, int n, const float* k, const float* v,
                       const float* q, float* out, const AttentionShape& shape, ThreadPool& pool);

// Online-softmax state of a set of query rows over some keys: running max m, sum l and weighted sum acc.
struct SoftmaxState {
  std::vector<float> m, l, acc;  // [rows], [rows], [rows, d]
  void reset(int rows, int d);
  // Fold another state over disjoint keys into this one (exact log-sum-exp merge).
  void merge(const SoftmaxState& other, int d);
};

}  // namespace kvq
