// The paged KV cache in GPU memory and the decode attention over it (issue #7).
//
// Same semantics as the CPU KvCache (kv/cache.h): BF16 (or KV4-RL's INT8) sink [0, S0) and recent windows, a quantized
// paged region [S0, qe(t)) with the decode-faithful view qe(t) of every query position t, demotion when a block leaves
// the recent window (a whole block of B = block_tokens positions at once: G for KIVI keys, 32 for OScaR's, else 1, or
// CacheConfig::demote_block, a multiple of it, e.g. 256). Same block layouts: rows and blocks are codecs/layout.h /
// codecs/oscar/oscar_format.h structs (Bf16Row, IntRow, KiviKeyBlock, OscarKeyBlock, OscarValueRow) and, for
// token-scaled keys, the page's ν region, byte for byte what the CPU cache stores, so a page copied from the GPU
// decodes with the CPU codec.
//
// A step works on a batch of sequences: sequence b contributes tokens [pos0_b, pos0_b + n_b) with pos0_b its current
// length, and their rows are concatenated (vLLM "varlen"): row r of k/v/q belongs to one (b, i). Decode is n_b = 1 for
// every b; prefill is one sequence with n_b = chunk.
//
// The cache owns the per-layer transform of its config (CacheConfig::transform: key means, R_K, R_V, kv/transform.h),
// uploaded at construction: append() centres and rotates keys and rotates values before quantizing; attention() rotates
// queries and un-rotates outputs, so callers pass plain post-RoPE q / k / v and get plain attention outputs, exactly
// like the CPU path with a KvTransform.
//
// Prompt policies (CacheConfig::prompt_policy, kv/cache.h): decode-faithful, and exact-prompt and
// quantize-after-prompt, the CPU cache's semantics with its exact store kept as a bf16 twin cache on the same stream
// (the rows as appended: centred, rotated, rounded to bf16, as the CPU's window codec stores them): while a sequence's
// prompt is open its rows go to both caches and its queries read the twin only; end_prompt(seq) frees its twin
// sequence. From then on, exact-prompt reads the cache as stored; quantize-after-prompt freezes the sequence's
// quantized region at qe(P - 1) (CacheGeometry::frozen_end: nothing more is demoted, and every view reads the rows from
// there on in the ring, which holds max_ctx rows: the CPU's exact store). A step takes sequences all inside or all
// after their prompts (the CPU evaluates one at a time).
// evict (bf16 keys and values, no sliding window): while a sequence's prompt is open, attention() keeps the last
// kEvictObserve queries of every layer (kv/evict.h); end_prompt scores the prompt's rows with them on the device, keeps
// the CPU's choice (evict_keep) and compacts each (layer, kv head)'s kept rows into slots [0, kept), in position
// order (every head keeps as many). From then on the cache holds slots: the sequence's next token is position P but
// slot kept, length() is the position (slots + P - kept), and download_rows' positions are slots.
//
// All pointers named d_* are device pointers; all calls are asynchronous on the cache's stream unless noted.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kv/cache.h"
#include "kv/transform.h"

namespace kvq::cuda {

// Whether some row of the GPU instance table (cuda/gpu_instances.h) stores this spec, for keys or values, at its
// head_dim, whatever the other side: bf16; int8, int4, int2 and kivi2 / kivi4 without per_channel (per-token groups
// G = 32/64/128); kivi2 / kivi4 with per_channel (KIVI keys over blocks of G = 32/64/128 tokens); oscar_int2 (its
// token-scaled per-channel key blocks of 32 tokens with ν once per token and layer, its value rows). A whole cache is
// checked by gpu_instance / gpu_unsupported there: the constructor refuses a combination without a compiled
// instance (and per_channel values) with one line naming it and what the GPU runs.
bool gpu_codec_supported(const CodecSpec& spec);

class GpuKvCache {
 public:
  // Allocates the page pool for max_seqs sequences of up to max_ctx tokens each, windows included (a sequence's windows
  // are pages of the pool while it lives); or, with budget_bytes > 0, as many pages as that many bytes hold
  // (PagePool::for_budget: max_seqs slots, 0 = as many as the budget holds at max_ctx). Same sizes and page
  // bookkeeping as the CPU cache (kv/cache_layout.h, kv/page_pool.h).
  // stream: the cudaStream_t to run on (null: one of its own, destroyed with it).
  GpuKvCache(const CacheConfig& cfg, int n_layers, int n_kv_heads, int head_dim, int max_ctx, int max_seqs,
             size_t budget_bytes = 0, void* stream = nullptr);
  ~GpuKvCache();
  // The constructor's checks of cfg for this shape (kvq::Error naming what the GPU does not support) and the cache's
  // layout for sequences of up to max_ctx tokens (quantize-after-prompt: a ring of max_ctx rows); needs no device.
  static CacheLayout layout_of(const CacheConfig& cfg, int n_layers, int n_kv_heads, int head_dim, int max_ctx);
  GpuKvCache(const GpuKvCache&) = delete;
  GpuKvCache& operator=(const GpuKvCache&) = delete;

  const CacheConfig& config() const;
  int n_layers() const;
  int n_kv_heads() const;
  int head_dim() const;
  int max_ctx() const;
  int max_seqs() const;
  const PagePool& pool() const;  // pages, block tables (uploaded at begin_step), admission arithmetic

  int new_sequence();
  void free_sequence(int seq);
  int length(int seq) const;  // the positions it holds (evict: its slots and the positions evicted)
  // dst (a new sequence, empty) becomes a copy of src: its sinks and ring rows and its own pages holding the same
  // bytes (device-to-device copies on the cache's stream). kvq::Error before anything changes when the pool lacks the
  // pages; not inside a step.
  void fork_sequence(int src, int dst);
  // Prefix caching, as KvCache's (kv/prefix_cache.h): the final pages stay in device memory, shared by id; the copied
  // rest (sinks, the partial page, the recent rows) is downloaded into the entry at store and uploaded at attach.
  // state_bytes: the host bytes of those copies at most (0: a quarter of the pool's bytes, at most 4 GiB).
  void enable_prefix_cache(int64_t state_bytes = 0);
  int prefix_match(const int32_t* ids, int n, int step) const;
  void prefix_attach(int seq, const int32_t* ids, int len);
  void prefix_store(int seq, const int32_t* ids, int len);
  void prefix_count(int hit_tokens, int miss_tokens);
  PrefixCacheStats prefix_stats() const;

  // The end of seq's prompt (exact-prompt: its queries read the cache as stored from now on; evict: the eviction;
  // decode-faithful: nothing). Not inside a step.
  void end_prompt(int seq);
  // Whether the open step enqueues launches step_signature does not describe, so GpuModel does not capture it in a
  // graph: its queries read the exact twin (exact-prompt, quantize-after-prompt: sequences inside their prompts), or
  // it observes an evict prompt's queries.
  bool step_off_signature() const;
  // Starts a step: seqs[b] appends n[b] tokens at its current length. Reserves pages (throws kvq::Error on
  // context overflow or an exhausted pool, before anything changes) and uploads the step's descriptors and, when
  // they changed, the pool's block tables.
  void begin_step(const std::vector<int>& seqs, const std::vector<int>& n);
  int step_rows() const;  // Σ n[b]: rows of the step's q / k / v / out

  // One layer of the step. d_k, d_v: [rows, n_kv_heads, d] fp32 post-RoPE keys / values (not transformed);
  // stores them (centre, rotate, quantize, pack; windows in bf16 or int8) and demotes what leaves the recent window, a
  // round of the layout's append_tokens rows of each sequence at a time (layout_of; the ring holds no more).
  void append(int layer, const float* d_k, const float* d_v);
  // d_q: [rows, n_heads, d] fp32 post-RoPE queries; d_out: [rows, n_heads, d] fp32 attention outputs (before W_O).
  // Each query at position t reads its decode-faithful view; split-KV with an exact LSE merge.
  // The softmax scale 1/sqrt(d) is applied here (q is NOT pre-scaled, unlike kvq::cache_attention's input).
  // THE dispatch of the attention kernels: a sequence of the step with at least set_prefill_rows rows takes the
  // tensor-core prefill kernel (prefill_attention.cu) when every layer's instance row has it (gpu_prefill_kernel,
  // named by gpu_path_text) and the reference twin is off; every other row takes the decode kernel of its row.
  // A step whose sequences append more than the layout's append_tokens rows each takes append_and_attend instead:
  // the ring holds no more than that beyond the window (kv/cache_layout.h).
  void attention(int layer, const float* d_q, int n_heads, float* d_out);
  // One layer of the step as a model runs it: append() and attention() a round of the layout's append_tokens rows of
  // each sequence at a time (every round's rows appended, then its queries attended): every query reads the rows it
  // would with a ring as long as the chunk.
  void append_and_attend(int layer, const float* d_k, const float* d_v, const float* d_q, int n_heads, float* d_out);
  // Ends the step: lengths += n.
  void commit_step();
  // Ends a step that failed between begin_step and commit_step (an exception from a launch): lengths stay, the pages
  // begin_step reserved stay with their sequences (freed with them), and the cache takes the next begin_step or
  // free_sequence. Does nothing outside a step.
  void abort_step();

  // What this step's launches take besides the contents of device memory: row and demotion counts, the attention
  // plan, the buffers they read and write. Two steps with equal signatures enqueue the same kernels with the same
  // arguments, so a CUDA graph captured from one replays the other (GpuModel). Fixes the step's attention plan for
  // n_heads query heads and grows its buffers now, so that no allocation falls inside a capture.
  struct StepSignature {
    int n_rows, n_items;                        // rows appended and attended; rows demoted per layer
    int n_heads, split_tokens, n_splits, n_win;  // the attention plan: the decode kernel's
    int n_decode_rows, n_prefill_tiles, prefill_split, prefill_splits;  // the rows of each kernel; the prefill plan
    bool reference;                             // set_reference_attention
    const void *desc, *q_work, *part_acc, *part_ml, *arrivals;  // step descriptors and attention scratch
    const void *decode_desc, *decode_index, *prefill_tiles, *prefill_index;  // each kernel's rows (mixed steps)
    const void *key_mean, *r_k, *r_v;           // the transform (CacheConfig::transform, uploaded once)
    bool operator==(const StepSignature&) const = default;
  };
  StepSignature step_signature(int n_heads);

  // Same accounting as the CPU cache (counted from the structs stored); with a prompt of prompt_tokens, what the policy
  // keeps (KvCache::footprint: quantize-after-prompt's rows from qe(P - 1) on are window rows).
  CacheFootprint footprint(int n_tokens) const;
  CacheFootprint footprint(int n_tokens, int prompt_tokens) const;
  size_t bytes_allocated() const;
  // Bytes one attention() call reads from the cache for the current step (K and V rows of every view, windows
  // included), for the benchmark's GB/s figure.
  size_t step_bytes_read(int layer) const;

  void* stream() const;  // the cudaStream_t everything runs on

  // --- Testing and benchmarking knobs (defaults are what production uses).
  // Positions per KV split of attention(), the decode and the prefill kernel's: 0 = automatic (whole waves of resident
  // blocks, auto_split_tokens; prefill: splits of >= 1024 positions up to two waves); else a multiple of 128 (rounded
  // up). The split-KV merge is exact, so results do not depend on it beyond float rounding.
  void set_split_tokens(int n);
  // Run the simple reference twin of the attention kernel instead of the fast path (prefill chunks too: row by row).
  void set_reference_attention(bool on);
  // A step's sequence of at least n rows takes the prefill kernel (default kPrefillMinRows, cuda/gpu_kernels.h; 1:
  // every row, decode rows too; 0: none, every chunk row by row on the decode kernels, the path it is tested against).
  // Takes effect at the next attention(), also inside a step.
  void set_prefill_rows(int n);
  // attention() calls that ran the prefill kernel (for one step's layer, once each), since construction.
  int64_t prefill_kernel_calls() const;
  // Whether chunks of >= set_prefill_rows rows take the prefill kernel: every layer's instance row has it
  // (gpu_prefill_kernel) and its tiles fit this GPU's shared memory (not d = 256 on sm_86 / sm_89).
  bool prefill_kernel_available() const;
  // Synchronously downloads the stored rows of positions [pos0, pos0 + n) of (seq, layer, kv_head), K (values = false)
  // or V, as a query at position length(seq) - 1 reads them: window rows (bf16, 2 d bytes; or int8 IntRows) for sinks
  // and the recent window, codec rows (layout::IntRow, or bf16 for a bf16 codec) for the quantized region; rows
  // concatenated in position order. KIVI keys (per_channel) in the quantized region come as whole blocks: every
  // layout::KiviKeyBlock (4 d + G d b / 8 bytes) holding a position of the range, once, in position order (a range that
  // starts or ends inside a block still gets the whole block). For comparing bytes with the CPU cache's blocks.
  std::vector<uint8_t> download_rows(int seq, int layer, int kv_head, bool values, int pos0, int n) const;
  // Token-scaled keys (OScaR): synchronously downloads ν of quantized positions [pos0, pos0 + n) of (seq, layer),
  // as a query at position length(seq) - 1 reads them (the page's token-scale region, kv/cache_layout.h).
  std::vector<float> download_scales(int seq, int layer, int pos0, int n) const;
  // End of the quantized region for a query at position t (kv/cache.h's qe(t)).
  int quant_end(int t) const;

 private:
  void append_round(int layer, const float* d_k, const float* d_v, int round);
  bool attention_round(int layer, const float* d_q, int n_heads, float* d_out, int round);  // true: the prefill kernel
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvq::cuda
