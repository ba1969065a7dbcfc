// The sizes of a paged KV cache (kv/cache.h): THE arithmetic of pages, windows and the quantized region, shared by the
// CPU cache, the GPU cache (cuda/gpu_cache.cpp copies it into its CacheGeometry) and the page pool (kv/page_pool.h). A
// plain value: no STL, includable from .cu files (KVQ_HD). Built on the host by kvq::cache_layout() (kv/cache.h) from a
// validated CacheConfig and the codecs' block sizes.
//
//   page     [n_layers][n_kv] { K blocks [P / Bk][k.bytes] | V blocks [P / Bv][v.bytes] }     page_bytes
//            page i of a sequence covers quantized positions [S0 + i P, S0 + (i + 1) P); a layer in the skip set
//            (--kv-skip-layers) stores bf16 rows instead, { K rows [P][skip_row] | V rows [P][skip_row] }, so layer
//            l starts at layer_offset(l) and its heads are layer_head_bytes(l) apart
//            then, for token-scaled keys only, ν [n_layers][P] fp32 after every layer's heads  scale_region
//   windows  per live sequence, in window_pages() pages of the pool in a row (at window_offset(first page)):
//            sinks [n_layers][2][n_kv][S0] + ring [n_layers][2][n_kv][ring_tokens]
//            rows of the window codec (window_row bytes each)                                  window_bytes()
//            a quantized window codec (int8 windows, KV4-RL: METHODS §5.6) cannot give back the value a body row is
//            quantized from, so the ring also keeps each slot's body rows, [ring_tokens][ring_body] bytes: every
//            layer's { K | V } rows of that position ([n_kv] per layer, a page's order), encoded at append from the
//            row's BF16 value; demotion copies them into the page. Per-token body codecs only (kvq::cache_layout).
// A sequence of n tokens holds pages_for(n) pages: its quantized region is [S0, qe(n - 1)).
//
// Token-scaled keys (CodecSpec::token_scale, OScaR: METHODS §5.4, codecs/oscar/oscar_format.h) need one scale per
// (token, layer) across the kv heads, which no per-head codec block can hold: the page ends with a token-scale region,
// ν of quantized position S0 + i P + j of layer l at float [l][j]. The cache computes ν over all heads when a block is
// demoted (from the window rows), divides the key rows by it before encode, and attention multiplies the quantized
// region's scores by it; windows keep plain rows. 4 bytes per token per layer: 4 / n_kv per (token, kv head).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "codecs/layout.h"  // KVQ_HD

namespace kvq {

// Bytes stored per token per layer for a context of n tokens, counted from the structures actually stored.
struct CacheFootprint {
  double bytes_per_token_per_layer;  // all layers' sinks + windows + quantized region, averaged over n tokens
  double bits_per_element;           // effective bits per cached K/V element at n tokens (METHODS §6)
  double quant_bits_per_element;     // b_q: the quantized region alone (scales, zeros included)
};

// qe(t): end of the quantized region for a query at position t >= -1 (kv/cache.h):
//   qe(t) = S0 + floor(max(0, t + 1 - W - S0) / B) * B.
KVQ_HD inline int quant_end(int t, int sink, int recent, int block_tokens) {
  const int span = t + 1 - recent - sink;
  return sink + (span > 0 ? span / block_tokens * block_tokens : 0);
}

// A set of layers (--kv-skip-layers), as a bit mask over layers [0, kMaxLayers).
struct LayerSet {
  static constexpr int kMaxLayers = 256;
  uint64_t bits[kMaxLayers / 64];  // bit l % 64 of word l / 64: layer l is in the set
  KVQ_HD bool has(int l) const { return l >= 0 && l < kMaxLayers && ((bits[l / 64] >> (l % 64)) & 1u); }
  KVQ_HD void add(int l) { bits[l / 64] |= uint64_t(1) << (l % 64); }
  KVQ_HD int count_below(int l) const {  // members < l
    int n = 0;
    for (int i = 0; i < l && i < kMaxLayers; ++i) n += has(i);
    return n;
  }
};

// A codec's storage unit (KvCodec::tokens_per_block / bytes_per_block).
struct CodecBlock {
  int tokens;     // tokens per block: 1, or G for per-channel (KIVI) keys
  int64_t bytes;  // bytes per block
};

// Rows of a chunk appended to the ring (and attended) at once. The ring holds W + B + this many rows, not the whole
// prefill chunk: at 128, with int2's defaults (W 256, B 1), 385 slots instead of 769 at the default chunk of 512, so a
// sequence's windows take 449 rows instead of 833 (the sinks included). Smaller rounds cost more attention launches per
// prefill chunk (docs/results/h200.md measures the GPU's).
inline constexpr int kAppendTokens = 128;

struct CacheLayout {
  int n_layers, n_kv, head_dim;  // the model's KV shape: layers, kv heads, d
  int sink, recent;              // S0, W
  int page_tokens;               // P: quantized positions per page
  int max_chunk;                 // most tokens of a sequence one step appends (the prefill chunk)
  int append_tokens;             // most rows one append writes into the ring: min(max_chunk, kAppendTokens). A longer
                                 // chunk is appended and attended this many rows at a time (kvq::append_and_attend,
                                 // GpuKvCache::append_and_attend), so the ring need not hold the whole chunk
  int codec_tokens;              // lcm of the K / V codecs' tokens per block: demotion encodes, and quantized pieces
                                 // start, in these units
  int block_tokens;              // B: demotion granularity, codec_tokens or CacheConfig::demote_block (a multiple of
                                 // it: OScaR's residual, demoted 256 at a time)
  int ring_tokens;               // ring slots per (layer, K/V, head): W + B + append_tokens
  CodecBlock k, v;               // blocks of the K / V codecs (quantized region of the layers not skipped)
  int64_t window_row;            // bytes of one window-codec row (sinks and ring)
  int64_t ring_body;             // bytes of the body rows one ring slot keeps beside its window rows (all layers,
                                 // kv heads, K and V: page_bytes / P), or 0 when demotion encodes the window rows
  int64_t k_region, v_region;    // bytes of one page's K / V blocks of one (layer, kv head), layers not skipped
  int64_t head_bytes;            // k_region + v_region
  LayerSet skipped;              // layers that keep bf16 rows in their quantized region too (--kv-skip-layers)
  int n_skipped;                 // layers in `skipped`
  int64_t skip_row;              // bytes of one bf16 row: the K and V blocks of a skipped layer
  int64_t skip_head_bytes;       // one page's K + V rows of one (skipped layer, kv head): 2 P skip_row
  int64_t scale_region;          // bytes of one page's token scales ν of one layer: P fp32, or 0 (not token-scaled)
  int64_t page_bytes;            // one page: every layer's heads, n_kv * Σ_l layer_head_bytes(l), + n_layers * scale_region
  int64_t k_meta;                // bytes the key codec of one (layer, kv head) stores once, beside its blocks (PN-Mix's map
                                 // of pair widths: KvCodec::metadata_bytes), layers not skipped; 0 for every other
                                 // codec

  KVQ_HD int quant_end(int t) const { return kvq::quant_end(t, sink, recent, block_tokens); }
  // The rounds of an append of n rows of one sequence (the ring holds one round beyond the window): rounds(n) of them,
  // round r its rows [r · append_tokens, min(n, (r + 1) · append_tokens)), empty (begin >= end) past its last.
  struct RowRange {
    int begin, end;
  };
  KVQ_HD int rounds(int n) const { return (n + append_tokens - 1) / append_tokens; }
  KVQ_HD RowRange round_rows(int n, int r) const {
    const int begin = r * append_tokens;
    return {begin, begin + append_tokens < n ? begin + append_tokens : n};
  }
  // Layer l's part of a page: its heads' { K | V } blocks, at layer_offset(l), layer_head_bytes(l) per head.
  KVQ_HD int64_t layer_head_bytes(int l) const { return skipped.has(l) ? skip_head_bytes : head_bytes; }
  KVQ_HD int64_t layer_k_region(int l) const { return skipped.has(l) ? skip_head_bytes / 2 : k_region; }
  KVQ_HD int64_t layer_offset(int l) const {
    const int s = skipped.count_below(l);
    return int64_t(n_kv) * ((l - s) * head_bytes + s * skip_head_bytes);
  }
  // Byte offset in a page of layer l's token scales (float [P]); meaningful when scale_region > 0.
  KVQ_HD int64_t scale_offset(int l) const { return layer_offset(n_layers) + l * scale_region; }
  // Pages a sequence of n_tokens tokens holds (what reserve() has taken once its length is n_tokens).
  KVQ_HD int pages_for(int n_tokens) const {
    const int quant_tokens = n_tokens > 0 ? quant_end(n_tokens - 1) - sink : 0;
    return (quant_tokens + page_tokens - 1) / page_tokens;
  }
  // Pages covering positions [S0, max_ctx): the width of a block table.
  KVQ_HD int pages_per_seq(int max_ctx) const {
    const int quant_tokens = max_ctx > sink ? max_ctx - sink : 0;
    return (quant_tokens + page_tokens - 1) / page_tokens;
  }
  KVQ_HD int64_t sink_bytes() const { return int64_t(n_layers) * 2 * n_kv * sink * window_row; }
  KVQ_HD int64_t ring_bytes() const {
    return int64_t(n_layers) * 2 * n_kv * ring_tokens * window_row + int64_t(ring_tokens) * ring_body;
  }
  // Windows of one sequence (sinks + ring): [n_layers][2][n_kv][S0] sink rows, then the ring.
  KVQ_HD int64_t window_bytes() const { return sink_bytes() + ring_bytes(); }
  // Where the ring slots' body rows start in a sequence's windows (int8 windows: after every window row).
  KVQ_HD int64_t ring_body_offset() const { return window_bytes() - int64_t(ring_tokens) * ring_body; }
  // A sequence's windows come from the page pool (kv/page_pool.h): window_pages() pages in a row, taken when the
  // sequence starts and returned when it ends; they start at window_offset(first page), aligned to kWindowAlign bytes
  // (the pages' own size may not be a multiple of it: then the run has room for the padding).
  static constexpr int64_t kWindowAlign = 256;
  KVQ_HD int window_pages() const {
    const int64_t pad = page_bytes % kWindowAlign == 0 ? 0 : kWindowAlign - 1;
    return int((window_bytes() + pad + page_bytes - 1) / page_bytes);
  }
  KVQ_HD int64_t window_offset(int first_page) const {
    return (int64_t(first_page) * page_bytes + kWindowAlign - 1) / kWindowAlign * kWindowAlign;
  }
  // Everything one sequence of n_tokens takes from the pool: its windows' pages and its own.
  KVQ_HD int64_t sequence_bytes(int n_tokens) const { return int64_t(sequence_pages(n_tokens)) * page_bytes; }
  KVQ_HD int sequence_pages(int n_tokens) const { return window_pages() + pages_for(n_tokens); }

  // Bytes per (token, layer) of a window row (K and V of every kv head) and of a quantized-region token (codec blocks
  // per token, skipped layers' bf16 rows averaged over the layers, ν).
  KVQ_HD double window_token_bytes() const { return 2.0 * n_kv * double(window_row); }
  KVQ_HD double quant_token_bytes() const {
    const double coded = n_kv * (double(k.bytes) / k.tokens + double(v.bytes) / v.tokens);
    return (double(n_layers - n_skipped) * coded + double(n_skipped) * 2.0 * n_kv * double(skip_row)) /
               double(n_layers) +
           double(scale_region) / page_tokens;
  }
  // Per (token, layer): K and V rows of every kv head. Sinks and the W most recent tokens are window rows, the rest is
  // stored by the codecs (and ν of token-scaled keys); residual tokens of a partly filled KIVI block are counted as
  // window rows. Skipped layers' bf16 rows count in the quantized region (averaged over the layers), so b_q and b_eff
  // include them. The body rows kept beside quantized window rows (ring_body) count for every window token but the
  // sinks (they are never demoted). A key codec's metadata (k_meta) counts once per (layer, kv head), over the n
  // tokens.
  CacheFootprint footprint(int n) const {
    const double window = window_token_bytes();
    const double pending = double(ring_body) / n_layers;  // body rows of one recent-window token, per layer
    const double quant = quant_token_bytes();
    const int in_quant = quant_end(n - 1) - sink;
    const int n_window = n < n - in_quant ? n : n - in_quant;
    const int n_quant = n - n_window;
    const int n_sink = n < sink ? n : sink;
    const double meta = double(n_layers - n_skipped) * n_kv * double(k_meta) / n_layers;  // per layer, once
    return footprint_of(n, n_window * window + (n_window - n_sink) * pending + n_quant * quant + meta, quant);
  }
  // The same under quantize-after-prompt (kv/cache.h) after a prompt of `prompt` tokens: [S0, qe(prompt - 1)) stored
  // by the codecs, every other row a window row (the exact store's, never demoted; the policy takes bf16 or f32
  // windows only).
  CacheFootprint frozen_footprint(int n, int prompt) const {
    const double quant = quant_token_bytes();
    const int n_quant = prompt > 0 ? quant_end(prompt - 1) - sink : 0;
    return footprint_of(n, double(n - n_quant) * window_token_bytes() + double(n_quant) * quant, quant);
  }
  // The footprint of n tokens that take `total` bytes per layer, `quant` bytes per (token, layer) where quantized.
  CacheFootprint footprint_of(int n, double total, double quant) const {
    const double elems = 2.0 * n_kv * head_dim;  // K + V elements per token per layer
    CacheFootprint f;
    f.bytes_per_token_per_layer = total / n;
    f.bits_per_element = 8.0 * total / (double(n) * elems);
    f.quant_bits_per_element = 8.0 * quant / elems;
    return f;
  }
};

// The layout of already validated sizes (kvq::cache_layout in kv/cache.h validates a CacheConfig and calls this):
// page_tokens a multiple of both codecs' tokens per block, window rows per token, skipped layers < n_layers;
// token_scale: keys scaled by ν (never with skipped layers: kvq::cache_layout refuses the pair); body_in_ring: the
// ring keeps each slot's body rows (a quantized window codec; per-token K / V blocks and no ν, which
// kvq::cache_layout checks); k_meta: KvCodec::metadata_bytes of the key codec; demote_block: B, a positive multiple
// of the codecs' lcm block (kvq::cache_layout checks), or 0 for that block itself.
inline CacheLayout make_cache_layout(int n_layers, int n_kv, int head_dim, int sink, int recent, int page_tokens,
                                     int max_chunk, CodecBlock k, CodecBlock v, int64_t window_row,
                                     LayerSet skipped = {}, bool token_scale = false, bool body_in_ring = false,
                                     int64_t k_meta = 0, int demote_block = 0) {
  auto gcd = [](int a, int b) {
    while (b) {
      const int r = a % b;
      a = b, b = r;
    }
    return a;
  };
  CacheLayout l{};
  l.n_layers = n_layers, l.n_kv = n_kv, l.head_dim = head_dim;
  l.sink = sink, l.recent = recent, l.page_tokens = page_tokens, l.max_chunk = max_chunk;
  l.codec_tokens = k.tokens / gcd(k.tokens, v.tokens) * v.tokens;
  l.block_tokens = demote_block > 0 ? demote_block : l.codec_tokens;
  l.append_tokens = max_chunk < kAppendTokens ? max_chunk : kAppendTokens;
  l.ring_tokens = recent + l.block_tokens + l.append_tokens;
  l.k = k, l.v = v;
  l.window_row = window_row;
  l.k_region = int64_t(page_tokens / k.tokens) * k.bytes;
  l.v_region = int64_t(page_tokens / v.tokens) * v.bytes;
  l.head_bytes = l.k_region + l.v_region;
  l.skipped = skipped;
  l.n_skipped = skipped.count_below(n_layers);
  l.skip_row = layout::bf16_row_bytes(head_dim);
  l.skip_head_bytes = 2 * int64_t(page_tokens) * l.skip_row;
  l.scale_region = token_scale ? int64_t(page_tokens) * 4 : 0;
  l.page_bytes = l.layer_offset(n_layers) + l.scale_region * n_layers;
  l.ring_body = body_in_ring ? l.page_bytes / page_tokens : 0;  // per-token rows: a page is P of them
  l.k_meta = k_meta;
  return l;
}

}  // namespace kvq
