// Launchers of the GPU cache kernels (kv_append.cu, decode_attention.cu, evict.cu, bench_kernels.cu): plain C++ (no
// CUDA or fmt types), so host .cpp files and .cu files share it. Every launcher returns a cudaError_t as int (0 =
// success, launch errors included); gpu_cache.cpp checks them with kvq::cuda::check().
#pragma once

#include <cstddef>
#include <cstdint>

#include "codecs/codec_id.h"
#include "codecs/layout.h"        // KVQ_HD
#include "kv/cache_layout.h"  // quant_end

namespace kvq {
struct CacheConfig;  // kv/cache.h
}

namespace kvq::cuda {

constexpr int kMaxHeadDim = 256;   // widest d of a compiled instance (gpu_instances.h lists the d of every row)
constexpr int kMaxGroupHeads = 8;  // g = n_heads / n_kv_heads supported by the attention kernel

// Where everything of the cache lives on the device and how it is laid out (same layouts as kv/cache.h; the sizes,
// n_layers .. pages_per_seq and k_region .. page_bytes, are copied from the cache's kv/cache_layout.h CacheLayout).
// A geometry is that of ONE layer (the codecs, instance and page part of that layer; cache_geometry): a layer of
// --kv-skip-layers stores bf16 rows and runs the bf16 instance row; the windows are the same for every layer.
//   pool   [n_pages][n_layers][n_kv] { K blocks [P / Gk][k_block] | V rows [P][v_row] }, the layer at layer_offset
//          K blocks are rows (Gk = 1: layout::IntRow / Bf16Row) or, for KIVI keys, layout::KiviKeyBlock of Gk = G
//          tokens (OScaR keys: layout::OscarKeyBlock, Gk = 32); V blocks are always rows (layout::IntRow / Bf16Row /
//          OscarValueRow); token-scaled keys (OScaR) end each page with ν [n_layers][P] fp32 (kv/cache_layout.h)
//   windows  of each live sequence, in pages of the pool from byte window_base[seq] on (PagePool::window_offset),
//          the CPU cache's layout (kv/cache_layout.h): sinks [n_layers][2][n_kv][S0] rows, then the ring
//          [n_layers][2][n_kv][ring_tokens] rows, position s at slot s % ring_tokens, rows of window_row bytes (bf16:
//          d values; int8 windows, KV4-RL: layout::IntRow of 8 bits at window_group); with int8 windows the ring then
//          keeps each slot's body rows, [ring_tokens][ring_body] (every layer's K | V rows of the position, a page's
//          order), which demotion copies into the page
//   pages  [max_seqs][pages_per_seq] page ids, quantized position S0 + i P + j in page pages[i], row j
struct CacheGeometry {
  int n_layers, n_kv;          // layers, kv heads
  int sink, recent;            // S0, W
  int page_tokens;             // P
  int block_tokens;            // B: demotion granularity, lcm of the K / V tokens per block (1, or G of KIVI keys),
                               // or CacheConfig::demote_block (a multiple of it; demotion stays per position)
  int ring_tokens;             // ring slots per (seq, layer, K/V, head): W + B + append_tokens (kv/cache_layout.h)
  int pages_per_seq;           // columns of the page table (PagePool::table_width)
  int instance;                // the row of kGpuInstances (cuda/gpu_instances.h) that runs this cache; -1 = none
  CodecId k_codec, v_codec;    // that row's codecs: the blocks stored for keys / values (device types: codecs.cuh)
  uint16_t head_dim;           // d: values per row; the kernels run the instance (instance, d) (gpu_instances.h). In
                               // the codec ids' padding, so that the geometry, every kernel's argument, keeps its
                               // size and layout (and the kernels their registers)
  int k_group, v_group;        // G of the int codecs (values per scale/zero group; KIVI keys: tokens per block)
  int k_clip_index, v_clip_index;  // quantile index min(floor(clip G), G - 1); -1 = plain max |x| (clip >= 1)
  int k_block_tokens;          // Gk: tokens per stored K block, 1 (per-token rows) or G (KIVI keys, per channel)
  int k_row, v_row;            // bytes of one stored K / V row (0 for per-channel key blocks: never read by row)
  int k_block;                 // bytes of one stored K block: k_row, or the layout::KiviKeyBlock for KIVI keys
  int64_t k_region, head_bytes;  // bytes of one page's K blocks of one head; K + V blocks of one head (this layer)
  int64_t layer_offset;        // bytes of a page before this layer (CacheLayout::layer_offset): head h at
                               // layer_offset + h · head_bytes
  int64_t page_bytes;          // bytes of one page (all layers, all heads)
  int64_t scale_base;          // token-scaled keys: byte offset of ν in a page (CacheLayout::scale_offset(0))
  int64_t scale_region;        // bytes of one layer's ν in a page (P fp32); 0 = keys not token-scaled
  uint8_t* pool;               // page pool
  const int64_t* window_base;  // [max_seqs] the byte where each slot's windows start in the pool (-1: none)
  int window_row;              // bytes of one window row (sinks and ring): 2 d (bf16), or an int8 IntRow
  int window_group;            // values per (scale, zero) group of int8 window rows (the values' G); d for bf16
  int window_clip_index;       // the int8 window rows' clip (window_spec's: plain min/max, -1)
  int ring_body;               // bytes of the body rows a ring slot keeps (int8 windows: CacheLayout::ring_body), or 0
  const int* page_table;       // [max_seqs][pages_per_seq]
  const void* k_table;         // the key codec's tables of this layer's kv heads (KvCodec::device_table, the CPU
                               // codec's: TurboQuant's codebook, PN-Mix's layout::PnmixHeadTable), head h's at byte
                               // h · K::kTableBytes (dev::key_table); null for the other key codecs
  const float* k_rope;         // keys stored without RoPE (NexusQuant's, dev::pre_rope): [max_ctx][cos d/2 | sin d/2],
                               // rotation/rope.h's rope_angles of every position (RopeKeyCodec's table); else null
  float k_scale, v_scale;      // this layer's per-tensor scales of tensor-scaled codecs (vLLM's FP8 rows,
                               // dev::tensor_scaled: stored fp8(x / s), read fp8⁻¹(code) · s; --kv-scales), else 1
  const int* frozen_end;       // quantize-after-prompt: [max_seqs] where each slot's quantized region stops once its
                               // prompt has ended, qe(P - 1) (INT_MAX before); null for the other policies
};

// The sizes and layout of layer `layer` of a cache (every field but the device pointers, which stay null) at the
// head_dim of cfg's specs (cfg.k.head_dim): the one place that turns a validated CacheConfig into a geometry; host only
// (gpu_cache.cpp), testable without a GPU.
CacheGeometry cache_geometry(const CacheConfig& cfg, int n_layers, int n_kv_heads, int max_ctx, int layer = 0);

// Whether every tile of 16 positions of g's pages starts at a multiple of 16 bytes, its key rows and its value rows:
// the decoded-tile kernel copies tiles by 16-byte cp.async (decode_attention_mma.cu). Pages of a multiple of 16 rows
// whose regions are multiples of 16 bytes (kv/cache_layout.h), as every decoded-tile row's caches have
// (GpuHeadDimsTable tests it); GpuKvCache refuses a decoded-tile cache without it.
KVQ_HD inline bool tiles_aligned16(const CacheGeometry& g) {
  return g.page_tokens % 16 == 0 && (g.page_bytes | g.layer_offset | g.head_bytes | g.k_region) % 16 == 0;
}

// qe(t): end of the quantized region for a query at position t (kv/cache.h), t >= -1:
//   qe(t) = S0 + floor(max(0, t + 1 - W - S0) / B) * B.
KVQ_HD inline int quant_end(const CacheGeometry& g, int t) {
  return kvq::quant_end(t, g.sink, g.recent, g.block_tokens);
}
// The end of the quantized region of slot seq's view at t: qe(t), or the sequence's frozen end when that is less
// (quantize-after-prompt after the prompt: CacheGeometry::frozen_end). The kernels' one definition of a view.
KVQ_HD inline int view_quant_end(const CacheGeometry& g, int seq, int t) {
  const int qe = quant_end(g, t);
  return g.frozen_end != nullptr && g.frozen_end[seq] < qe ? g.frozen_end[seq] : qe;
}
// True for KIVI / OScaR keys (per-channel blocks of Gk tokens) in the quantized region.
KVQ_HD inline bool kivi_keys(const CacheGeometry& g) { return g.k_block_tokens > 1; }

// One row of a step: which sequence, which position.
struct RowDesc {
  int seq;  // sequence slot
  int pos;  // position t of this row's token
};

// Optional per-layer transform (null pointers = none), all fp32 on the device.
struct TransformPtrs {
  const float* key_mean;  // [n_layers][n_kv][d] or null
  const float* r_k;       // [n_layers][n_kv][d][d] or null
  const float* r_v;       // [n_layers][n_kv][d][d] or null
  const float* r_vt;      // R_V transposed, for the merges' o R_V^T (null with r_v)
  int k_hadamard = 0;     // > 0: r_k is block-diagonal H_n / sqrt(n), n = k_hadamard (KvTransform::k_hadamard)
  int v_hadamard = 0;     // the same for r_v
};

// Append: rows of k / v ([rows][n_kv][d] fp32, untransformed) -> centre + rotate -> bf16 sink or ring rows. Row r of
// d_rows takes k / v row d_act_rows[r] (r itself when null: a step's round of rows is a subset of its rows).
int launch_append_rows(const CacheGeometry& g, int layer, const RowDesc* d_rows, const int* d_act_rows, int n_rows,
                       const float* d_k, const float* d_v, const TransformPtrs& t, void* stream);
// Demote: positions d_items[i] (seq, pos) of `layer` from the ring into their pages (group quantizer). The items
// cover whole blocks of B positions; with KIVI keys, the item at a block's first position also quantizes the K
// block of its G positions per channel (layout::KiviKeyBlock).
int launch_demote_rows(const CacheGeometry& g, int layer, const RowDesc* d_items, int n_items, void* stream);

// The evict prompt policy (evict.cu; kv/evict.h), once at the end of slot seq's prompt of P tokens, per layer, on
// caches of bf16 rows (windows and pages):
// Scores: d_score[h][t] of every prompt position t of every kv head h, the CPU's evict_scores from the last
// min(P, kEvictObserve) prompt queries, d_obs [kEvictObserve][n_heads][d] fp32 post-RoPE (unscaled: the kernel takes
// q · scale as model.cpp does), position p at row p % kEvictObserve, over the rows a query at P - 1 reads; d_p and
// d_part: [min(P, kEvictObserve)][n_kv][P] doubles of scratch each.
int launch_evict_scores(const CacheGeometry& g, int layer, int seq, int P, const float* d_obs, int n_heads, float scale,
                        double* d_p, double* d_part, double* d_score, void* stream);
// Compaction: the rows of positions d_keep [n_kv][kept] (increasing, from the view of a query at P - 1) staged in d_tmp
// ([2][n_kv][kept][d] bf16), then written to slots [0, kept) where a query at slot kept - 1 reads them: the slot then
// holds a sequence of `kept` tokens.
int launch_evict_compact(const CacheGeometry& g, int layer, int seq, int P, const int* d_keep, int kept,
                         uint16_t* d_tmp, void* stream);

// A query tile of the prefill kernel (prefill_attention.cu): kPrefillTileRows rows (position, query head) of one
// chunk, flattened as i * g + h for the chunk's row i (position pos0 + i) and head h of the GQA group.
struct PrefillTile {
  int seq;    // sequence slot
  int pos0;   // position of the chunk's first row
  int n;      // rows (positions) of the chunk
  int lrow0;  // launch row of the chunk's first row (q_work and partial rows)
  int r0;     // the tile's first flattened row, a multiple of kPrefillTileRows
};
constexpr int kPrefillTileRows = 64;  // (position, head) rows per query tile: 4 warps x 16
constexpr int kPrefillKeys = 64;      // positions per key / value tile
// Default of GpuKvCache::set_prefill_rows: a step's sequence of at least this many rows takes the prefill kernel.
constexpr int kPrefillMinRows = 16;

// Attention of one layer over the decode-faithful view of every row of a launch: the step's rows, or the part of them
// that one path takes (row_index).
struct AttentionLaunch {
  int layer;
  int n_rows;              // query rows of the launch
  const RowDesc* rows;     // [n_rows] device (the decode kernels)
  const int* row_index;    // [n_rows] device: the step row (of q and out) of launch row r; null = r itself
  const PrefillTile* tiles;  // [n_tiles] device (the prefill kernel; null for the decode kernels)
  int n_tiles;
  int n_heads;             // query heads; g = n_heads / n_kv <= kMaxGroupHeads
  float scale;             // softmax scale applied to q before the key rotation (1 / sqrt(d))
  int split_tokens;        // positions per KV split (multiple of 128)
  int n_splits;            // splits per (row, kv head): ceil(max view length / split_tokens)
  int n_win;               // tensor-core path: blocks per (row, kv head) over the bf16 sink and recent windows
  int n_slots;             // partial slots per (row, kv head): n_splits, + n_win on the tensor-core path
  int window;              // the layer's sliding window (CacheConfig::attn_window): a query at t reads positions
                           // (t - window, t]; 0 = every position. CUDA-core rows only (gpu_instances.h). In the
                           // padding before q_work: the launch keeps its size
  float* q_work;           // [n_rows][n_heads][d] scratch: scaled, rotated queries of the launch rows
  float* part_acc;         // [n_rows][n_kv][n_slots][g][d] scratch: unnormalised partial outputs
  float* part_ml;          // [n_rows][n_kv][n_slots][g][2] scratch: partial (max, sum)
  // The merge inside the attention launch (the tensor-core decode path): the last of a (row, kv head)'s n_slots
  // blocks to finish merges them into out (launch_attention sets r_vt and out). arrivals: [n_rows][n_kv] device
  // counts of finished blocks, zero between launches (that last block resets its count); null: a merge launch.
  int* arrivals;
  const float* r_vt;  // TransformPtrs::r_vt
  float* out;
};
static_assert(sizeof(void*) != 8 || sizeof(AttentionLaunch) == 112, "window sits in padding: every kernel's argument "
              "keeps its size");
// The first and last launch of every attention path: q_work <- (q[row_index[r]] · scale) R_K for every launch row r,
// and out[row_index[r]] <- (the exact log-sum-exp merge of r's n_slots partials) R_V^T (the tensor-core decode path
// merges inside its launch instead when a.arrivals is set).
int launch_prepare_queries(const CacheGeometry& g, const AttentionLaunch& a, const TransformPtrs& t, const float* d_q,
                           void* stream);
int launch_merge_partials(const CacheGeometry& g, const AttentionLaunch& a, const TransformPtrs& t, float* d_out,
                          void* stream);
// The tensor-core path (decode_attention_mma.cu), for the caches whose instance row says so (int2 rows of one
// 128-value group or bf16 rows, and the decoded tiles of every other format at d = 128; pages of a multiple of 16 rows;
// gpu_instances.h). One launch fills slots
// [0, n_splits) with the splits and slots n_splits .. n_splits + n_win - 1 with the bf16 sink and recent windows
// (n_slots = n_splits + n_win).
bool attention_mma_supported(const CacheGeometry& g);
int launch_attention_mma(const CacheGeometry& g, const AttentionLaunch& a, void* stream);
// *blocks = how many blocks of the tensor-core kernel for g and n_heads query heads one SM holds at once.
int attention_mma_blocks_per_sm(const CacheGeometry& g, int n_heads, int* blocks);
// The prefill kernel (prefill_attention.cu): FlashAttention-2 tiles of a chunk's queries x key / value tiles of its
// decode-faithful views, on tensor cores, for the caches of a tensor-core instance row (gpu_prefill_kernel in
// gpu_instances.h). Grid (tile, kv head, KV split of split_tokens positions, a multiple of kPrefillKeys): every
// block writes its partial of slot z (n_slots = n_splits); then the merge. q: the step's [rows][n_heads][d]
// queries, out: the step's outputs; a.row_index maps the launch's rows to them.
bool attention_prefill_supported(const CacheGeometry& g);
int launch_attention_prefill(const CacheGeometry& g, const AttentionLaunch& a, const TransformPtrs& t,
                             const float* d_q, float* d_out, void* stream);
// *blocks = how many blocks of the prefill kernel for g one SM holds at once.
int attention_prefill_blocks_per_sm(const CacheGeometry& g, int* blocks);
// q: the step's [rows][n_heads][d] fp32 post-RoPE queries (unscaled); out: the step's [rows][n_heads][d] plain
// outputs; the launch's rows are a.row_index's (all of them when null).
// reference = true runs the simple one-thread-per-token twin (decode_attention_ref.cu) instead of the fast path.
int launch_attention(const CacheGeometry& g, const AttentionLaunch& a, const TransformPtrs& t, const float* d_q,
                     float* d_out, bool reference, void* stream);
// *blocks = how many blocks of the kernel that launch_attention runs over the splits (tensor-core or CUDA-core) one SM
// holds at once. The reference twin takes the fast path's split size, so this is its count too.
int attention_blocks_per_sm(const CacheGeometry& g, int n_heads, int* blocks);
// The automatic split size (positions, a multiple of 128) for `base` blocks per split (rows x kv heads) over views
// of up to max_view positions on a GPU that holds `resident` blocks at once: the split count whose estimated time,
// waves x (split positions + a block's fixed cost), is least; splits hold >= 256 positions. Host only.
int auto_split_tokens(int64_t base, int max_view, int64_t resident);
// Tensor-core path: blocks per (row, kv head) over the bf16 windows, so that a small grid does not wait on one
// block walking S0 + W positions: as many as the GPU holds beside the `base` pairs, at most one per 64 positions of
// the largest window (S0 + W + B - 1, or `longest`, a step's frozen views' longest), at least 1. Host only.
int window_blocks(const CacheGeometry& g, int64_t base, int64_t resident, int longest = 0);

// Benchmark helpers (bench_kernels.cu).
// Fills d[0, n) with N(0, 1) samples of a counter-based generator (seed, index).
int launch_fill_normal(float* d, size_t n, uint64_t seed, float scale, void* stream);
// Reads d[0, bytes) with 16-byte loads (bytes a multiple of 16) and folds it into *d_sink; `ms` = elapsed time.
int read_probe(const void* d, size_t bytes, unsigned long long* d_sink, int iters, float* ms_median, void* stream);

}  // namespace kvq::cuda
