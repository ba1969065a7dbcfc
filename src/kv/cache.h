// Paged KV cache with sink / recent windows (BF16, or INT8 for KV4-RL) and a quantized (codec) region.
//
// Positions of one sequence, for a query at position t (docs/guide/methods.md §2, decode-faithful):
//   [0, S0)                 sinks, window codec (BF16), always
//   [S0, qe(t))             quantized region, read through the K / V codecs from pages
//   [max(S0, qe(t)), t]     recent window, window codec (BF16), from a ring buffer
// with qe(t) = S0 + floor(max(0, t + 1 - W - S0) / B) * B and B = block_tokens() (1 for per-token codecs, G for KIVI
// keys): a block is demoted — quantized into the paged region — once its last token has left the window.
// CacheConfig::demote_block makes B a multiple of that codec block: OScaR ships no sinks and an FP16 residual of the
// newest n mod 256 tokens, packed 256 at a time, which is exactly S0 = 0, W = 0, B = 256 (METHODS §5.4). The codecs
// still encode their own blocks (codec_block_tokens()); B only says how many positions leave the window at once. A
// prefill chunk demotes everything that leaves the window by the chunk's end before attention runs, and every query of
// the chunk reads exactly what decode would hold at its step.
//
// That is the default prompt policy, decode-faithful. The others (CacheConfig::prompt_policy, the camps' "as shipped"
// prefill semantics, docs/guide/methods.md §5) change what is read around the end of a sequence's prompt, which the
// caller marks with end_prompt(seq) at P = the sequence's length. They keep one more per-sequence store, the exact
// store: every row as appended, in the window codec (bf16; bf16 too for int8 windows), at slot = position.
//   exact-prompt           the prompt's rows go to the windows and pages as usual (so the pages equal the
//                          decode-faithful cache's) and to the exact store; until end_prompt every query reads only the
//                          exact store; after it the store is no longer written nor read: the cache as stored.
//   quantize-after-prompt  the same until end_prompt (the prompt's chunks demote [S0, qe(P - 1)) as usual, which no
//                          prompt query reads); after it nothing is demoted any more: queries read the sinks, the pages
//                          of [S0, qe(P - 1)) and the exact store from there on (every later row, never demoted).
//   evict                  (lossless K / V codecs) every query reads only the exact store. At end_prompt each (layer,
//                          kv head) keeps the sinks, the recent window and the best-scored prompt tokens (kv/evict.h;
//                          the score needs the last prompt queries, which Model hands to observe_queries), compacts
//                          their rows to slots [0, kept) in position order and records their positions; later tokens
//                          take slots kept + (position - P). An evicted row is never read again.
// footprint(n, P) counts what each policy keeps: exact-prompt the same as decode-faithful (the prompt's exact rows are
// prefill state), quantize-after-prompt window-codec rows outside [S0, qe(P - 1)), evict the kept and later rows. The
// page pool reserves pages as for decode-faithful whatever the policy (an evaluation cache, CPU only).
//
// Storage (sizes: kv/cache_layout.h; pages and sequence slots: kv/page_pool.h):
//   pages  [n_pages][n_layers][n_kv_heads] { K blocks [P / Bk][bytes_k] | V blocks [P / Bv][bytes_v] }
//          page i of a sequence's block table covers quantized positions [S0 + i P, S0 + (i + 1) P); P = page_tokens
//          a layer of CacheConfig::skip_layers stores bf16 rows there (its K / V codec is bf16), at the same positions
//   sinks  per live sequence, in pages of the pool (CacheLayout::window_pages, taken at new_sequence, returned at
//          free_sequence): [n_layers][2][n_kv_heads][S0] rows of the window codec (bf16; f32 for an f32 cache)
//   ring   then, in the same pages, [n_layers][2][n_kv_heads][ring_tokens] window-codec rows, position s at slot
//          s % ring_tokens
//          int8 windows (KV4-RL, METHODS §5.6): then [ring_tokens] slots of body rows (cache_layout.h, ring_body)
//          token-scaled keys (CodecSpec::token_scale, OScaR): the page ends with ν [n_layers][P] fp32 (cache_layout.h)
// A per_head key codec (PN-Mix: widths per (layer, kv head), CodecSpec::pair_bits) is one codec per head, all of the
// same block bytes, so pages keep one layout; each Quant run carries its head's codec. Keys and values are stored
// exactly as given: the config's transform (centring, rotation) is applied by the caller before append()
// (Model::attention_block). With token-scaled keys, demotion computes ν_t over the window rows of all kv heads, stores
// it in the page and encodes k / ν_t; a Quant run carries ν and attention multiplies the run's scores by it (METHODS
// §5.4). A key group of G tokens (per-channel keys) is demoted whole once its last token left the window, so a group
// that is not yet full is still read exactly; groups are aligned to S0 + multiples of B, which are absolute positions
// whenever S0 is a multiple of B (S0 = 0 as OScaR ships, or kvq's default 64).
//
// Demotion quantizes a row from the value the BF16 window holds, bf16(x). A BF16 (or f32) window row is that value, so
// demotion decodes it and encodes it with the body codec. A quantized window row (int8) is not, and METHODS §5.6
// chooses not to re-quantize the INT8 copy (on models/ref the two are equally good: docs/results/cpu.md); x itself is
// gone once append() returns. So with a quantized window codec append() also encodes each non-sink row's body row from
// bf16(x) into the ring slot beside its window rows, and demotion copies those bytes into the page: the pages hold
// exactly the bytes of the same cache with BF16 windows. The body rows are stored state, counted in ring_bytes() and
// footprint() (a recent-window token costs its INT8 rows plus its body rows). Only per-token body codecs without a
// token scale can be encoded a row at a time (cache_layout refuses the others).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "codecs/codec.h"
#include "common/half.h"
#include "kv/cache_layout.h"
#include "kv/page_pool.h"
#include "kv/prefix_cache.h"
#include "kv/transform.h"
#include "simd/simd.h"

namespace kvq {

struct Fp8Scales;  // codecs/fp8/fp8_scales.h

// What a sequence's cache does at the end of its prompt (KvCache::end_prompt, Runner::end_prompt): the prefill
// semantics a camp ships (docs/guide/methods.md §5 "as shipped"), labelled wherever a number is printed. P = the
// prompt's length, the sequence's length when end_prompt is called.
enum class PromptPolicy : uint8_t {
  kDecodeFaithful,       // "decode-faithful" (default): every query reads what decode would hold (§2); end_prompt
                         // does nothing
  kExactPrompt,          // "exact-prompt" (TurboQuant's first prefill chunk, OScaR): the prompt's queries attend to
                         // the prompt's exact rows; the rows are stored through the codecs as usual; queries after
                         // the prompt read the cache as stored
  kQuantizeAfterPrompt,  // "quantize-after-prompt" (NexusQuant): the prompt is exact during prefill and quantized once
                         // at end_prompt (the codec region ends at qe(P - 1)); every later row stays in the window
                         // codec (bf16), never demoted
  kEvict,                // "evict" (METHODS §5.8, AnDPro-style): at end_prompt keep sinks + recent window + the top
                         // prompt tokens by score, as many as CacheConfig::evict_bits allows; kept and later tokens
                         // stay bf16; evicted tokens are never read again
};
// "decode-faithful" | "exact-prompt" | "quantize-after-prompt" | "evict"; kvq::Error naming the known values.
PromptPolicy parse_prompt_policy(std::string_view name);
std::string_view prompt_policy_name(PromptPolicy p);

// The largest demotion block CacheConfig::demote_block may ask for (the ring holds W + B + append_tokens rows).
inline constexpr int kMaxDemoteBlock = 1 << 16;

struct CacheConfig {
  CodecSpec k{};              // key codec (type, group, clip)
  CodecSpec v{};              // value codec
  int sink = 64;              // S0: first tokens kept in the window codec
  int recent = 256;           // W: most recent tokens kept in the window codec
  int page_tokens = 128;      // P: tokens per page of the quantized region
  int max_chunk = 512;        // most tokens of a sequence one step appends (the prefill chunk; the ring holds
                              // kAppendTokens of them at most: kv/cache_layout.h)
  // B, the positions demoted at once (--kv-demote-block): 0 = the codecs' own block (the lcm of the K / V codecs'
  // tokens per block: 1, or G for per-channel keys); else a positive multiple of it (OScaR as shipped: 256). The ring
  // holds W + B + append_tokens rows; the footprint counts the rows the windows hold at each length, never the ring.
  int demote_block = 0;
  // Codec of the sink and recent windows: bf16 (METHODS §2), f32 (an f32 cache), or int8 (KV4-RL, METHODS §5.6: the
  // §1 quantizer at b = 8 per token, at the values' group, plain min/max). window_spec() builds its spec.
  std::string window = "bf16";
  // --kv-skip-layers: layers whose quantized region keeps bf16 rows (vLLM's TurboQuant keeps 0, 1, L-2, L-1), as
  // given: negative = from the end (-1 = the last layer). Resolved against the model by skipped_layers().
  std::vector<int> skip_layers;
  // The CPU kernels' instruction-set level (--simd): the codecs' scores / accumulate and attention's softmax run at
  // it. Not part of describe(): every level stores the same bytes, and the results differ only by the kernels'
  // summation order and, on the integer paths, the query's rounding (simd/simd.h).
  SimdLevel simd = best_simd_level();
  // The key/value transform of what is stored (centring, R_K, R_V; kv/transform.h), null = none. The cache owns it on
  // both devices: keys and values are transformed before they are stored, queries before and outputs after
  // attention (the CPU Model applies it around KvCache, GpuKvCache inside append() / attention()).
  std::shared_ptr<const KvTransform> transform;
  std::string rotation() const { return transform ? transform->name : "none"; }  // its label, for logs and reports
  // vLLM's per-tensor FP8 scales (--kv-scales, codecs/fp8/fp8_scales.h), null = its default 1.0: layer l's keys and
  // values are stored as fp8(x / s) with s its k_scale / v_scale (CodecSpec::tensor_scale; the cache builds one codec
  // per layer). An fp8 / fp8_e5m2 cache on both sides of the file's format, without a KV transform.
  std::shared_ptr<const Fp8Scales> kv_scales;
  // The model's RoPE inverse frequencies [head_dim / 2] (ModelConfig::rope_inv_freq), for a key codec that stores keys
  // without RoPE (the codec table's pre_rope_keys; kv/codec_rope.h). The runner fills it from the model; empty: such
  // a key codec is refused.
  std::vector<float> key_rope;
  // The model's sliding-window attention (ModelConfig::layer_window, Mistral): [n_layers] keys a query at position t
  // of layer l reads, positions (t - attn_window[l], t]; 0 = every earlier position; empty = no layer slides. The
  // runner fills it from the model (Model::forward refuses a cache without the model's windows); runs() hands out no
  // row behind the first query's window and attention masks each query's. CPU only (the GPU refuses such models).
  std::vector<int> attn_window;
  int attn_window_of(int layer) const {
    return attn_window.empty() ? 0 : attn_window[size_t(layer)];
  }
  // The prefill semantics (PromptPolicy above); decode-faithful unless a camp's "as shipped" row asks otherwise.
  PromptPolicy prompt_policy = PromptPolicy::kDecodeFaithful;
  // evict only: the bits per element the cache may store, as a fraction f = evict_bits / 16 of the BF16 bytes at
  // context N = evict_ctx (kv/evict.h): every token after the prompt is kept, so floor(f · N) - (N - P) prompt tokens
  // are and a sequence of N tokens stores floor(f · N) tokens' rows, e.g. a quantized row's bytes at N with evict_bits
  // = its b_eff at N (the referee's eviction row). evict_bits in (0, 16].
  double evict_bits = 0;
  // evict only: N above; 0 = the prompt's end (N = P: floor(f · P) prompt tokens kept, f × the prompt's BF16 bytes).
  int evict_ctx = 0;
  std::string describe() const;  // "k=int2/g128/r0.96 v=int2/g128/r0.92 sink=64 recent=256"
};

// The spec of cfg's window codec at head_dim: cfg.window at the group of the value rows (--kv-group), its default clip
// (plain min/max).
CodecSpec window_spec(const CacheConfig& cfg, int head_dim);
// The window codec is quantized (int8): demotion cannot decode a window row to the value a body row is quantized from,
// so each body row is encoded at append (see the header comment).
bool window_quantized(const CacheConfig& cfg);

// "0,1,-2,-1" -> {0, 1, -2, -1} (--kv-skip-layers); kvq::Error on an empty item, a non-integer or a repeat.
std::vector<int> parse_skip_layers(const std::string& list);
// cfg.skip_layers resolved for a model of n_layers layers (negative = from the end), as a set; kvq::Error naming a
// layer out of range or two items that name one layer.
LayerSet skipped_layers(const CacheConfig& cfg, int n_layers);

// The sizes of a cache of cfg for a model's KV shape: validates the windows, the prompt policy (and evict's bits), the
// chunk, the page size against the codecs and the skipped layers (kvq::Error naming what is wrong) and lays them out.
// The first form builds the codecs itself.
CacheLayout cache_layout(const CacheConfig& cfg, int n_layers, int n_kv_heads, int head_dim);
CacheLayout cache_layout(const CacheConfig& cfg, const KvCodec& k, const KvCodec& v, const KvCodec& window,
                         int n_layers, int n_kv_heads, int head_dim);
// What one sequence of n tokens stores when its prompt was the first `prompt` under cfg.prompt_policy, laid out as
// `layout` (KvCache::footprint(n, prompt), the GPU cache's too).
CacheFootprint prompt_footprint(const CacheLayout& layout, const CacheConfig& cfg, int n, int prompt);

class KvCache {
 public:
  // A pool for max_seqs sequences of up to max_ctx tokens each, windows included; or, with budget_bytes > 0, as many
  // pages as that many bytes hold (PagePool::for_budget: max_seqs slots, 0 = as many as the budget holds at max_ctx).
  KvCache(const CacheConfig& cfg, int n_layers, int n_kv_heads, int head_dim, int max_ctx, int max_seqs = 1,
          size_t budget_bytes = 0);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const CacheConfig& config() const { return cfg_; }
  const KvCodec& k_codec() const { return *k_codec_; }  // the configured codecs: the layers not skipped
  const KvCodec& v_codec() const { return *v_codec_; }
  // The codecs of layer l's quantized region: the configured ones, or bf16 for a skipped layer.
  const KvCodec& k_codec(int l) const {
    return layout_.skipped.has(l) ? *skip_codec_ : layer_k_codecs_.empty() ? *k_codec_ : *layer_k_codecs_[size_t(l)];
  }
  const KvCodec& v_codec(int l) const {
    return layout_.skipped.has(l) ? *skip_codec_ : layer_v_codecs_.empty() ? *v_codec_ : *layer_v_codecs_[size_t(l)];
  }
  // The key codec of (layer l, kv head h): k_codec(l), or the head's own for a per_head row (PN-Mix keys: every head
  // stores blocks of the same bytes, so k_codec(l) is the layout's).
  const KvCodec& k_codec(int l, int h) const {
    return head_k_codecs_.empty() || layout_.skipped.has(l) ? k_codec(l) : *head_k_codecs_[size_t(l) * n_kv_ + h];
  }
  bool layer_skipped(int l) const { return layout_.skipped.has(l); }
  const KvCodec& window_codec() const { return *window_; }
  int n_layers() const { return n_layers_; }
  int n_kv_heads() const { return n_kv_; }
  int head_dim() const { return d_; }
  int max_ctx() const { return max_ctx_; }
  int max_seqs() const { return pool_.n_slots(); }
  int block_tokens() const { return layout_.block_tokens; }              // B: positions demoted at once
  int codec_block_tokens() const { return layout_.codec_tokens; }        // the codecs' block (B is a multiple)
  const CacheLayout& layout() const { return layout_; }
  const PagePool& pool() const { return pool_; }  // pages, block tables, admission arithmetic

  // Sequences: ids in [0, max_seqs). A new sequence holds no tokens and no pages.
  int new_sequence();
  void free_sequence(int seq);
  int length(int seq) const;  // tokens committed
  // dst (a new sequence, empty) becomes a copy of src: its windows and its own pages holding the same bytes (n > 1
  // choices of one prompt, each then generating on its own). Decode-faithful caches only (the exact store of the
  // other prompt policies is not copied: refused). kvq::Error before anything changes when the pool lacks the pages.
  void fork(int src, int dst);

  // Prefix caching (kv/prefix_cache.h), off until enabled, decode-faithful caches only; state_bytes: the copied bytes
  // kept at most (0: a quarter of the pool's bytes). prefix_match: the longest cached prefix of ids [0, n) a new
  // sequence can continue from, a multiple of step and at most n - 1 (a token is left to feed), 0 when none.
  // prefix_attach: seq (new, empty) becomes that state (its final pages shared, the rest copied). prefix_store: caches
  // seq's state at its length as the prefix ids [0, length(seq)) (an existing entry is only touched).
  void enable_prefix_cache(int64_t state_bytes = 0);
  bool prefix_cache_enabled() const { return prefix_ != nullptr; }
  int prefix_match(const int32_t* ids, int n, int step) const;
  void prefix_attach(int seq, const int32_t* ids, int len);
  void prefix_store(int seq, const int32_t* ids, int len);
  void prefix_count(int hit_tokens, int miss_tokens);
  PrefixCacheStats prefix_stats() const;
  // The key of this cache's prefix hashes: its configuration (describe()), page, chunk and window sizes and shape.
  uint64_t config_key() const;

  // Reserve room for positions [length, length + n_new) of seq (pages for what will be demoted). Throws
  // kvq::Error on context overflow (beyond max_ctx), a chunk larger than max_chunk, or an exhausted pool, before
  // anything changes.
  void reserve(int seq, int n_new);
  // Store keys / values of one layer for positions [pos0, pos0 + n), k and v: [n, n_kv_heads, d], then demote
  // what leaves the recent window by pos0 + n. Call for every layer, then commit(); a layer's rows of one step may
  // come in several appends, in order. The ring keeps the last W + B + layout().append_tokens rows appended, so the
  // queries of a longer append must be attended a round at a time (kvq::append_and_attend does both).
  void append(int seq, int layer, int pos0, int n, const float* k, const float* v);
  void commit(int seq, int n);

  // The end of seq's prompt (its current length P): applies cfg.prompt_policy (see PromptPolicy). Once per sequence;
  // a decode-faithful cache only records P.
  void end_prompt(int seq);
  // The prompt's length once end_prompt was called, else -1.
  int prompt_end(int seq) const;
  // The evict policy scores prompt tokens with the last queries of the prompt: Model::attention_block hands each
  // layer's scaled, transformed queries q [n, n_heads, d] at positions [pos0, pos0 + n) here before attention. Does
  // nothing unless the sequence's prompt is open and the policy is evict.
  void observe_queries(int seq, int layer, int pos0, int n, const float* q, int n_heads);

  // qe(t): end of the quantized region as seen by a query at position t (see the header comment).
  int quant_end(int t) const;

  // A contiguous run of cached rows of one (layer, kv head), all in one storage. Exact: rows of the exact store
  // (non-default prompt policies, see the header comment), which a query at t reads where their position is <= t.
  enum class RunKind : uint8_t { Sink, Quant, Recent, Exact };
  struct Run {
    RunKind kind;
    int pos0;            // position of the first row
    int n;               // rows
    const uint8_t* k;    // K blocks
    const uint8_t* v;    // V blocks
    const float* scale;  // Quant runs of token-scaled keys: ν of each row [n] (scores are ν · q·k̂); else null
    const KvCodec* k_codec;  // what they are read with: k_codec(layer) / v_codec(layer) for Quant, window_codec()
    const KvCodec* v_codec;  // otherwise
    const int* positions;    // Exact runs after an eviction: the position of each row [n], increasing; else null
                             // (row i is at pos0 + i)
  };
  // Runs covering everything queries in [t_first, t_last] may read (the union of their views), in position order.
  void runs(int seq, int layer, int kv_head, int t_first, int t_last, std::vector<Run>& out) const;

  CacheFootprint footprint(int n_tokens) const;
  // What one sequence of n_tokens stores when its prompt was the first prompt_tokens under cfg.prompt_policy
  // (exact-prompt and decode-faithful: footprint(n_tokens); quantize-after-prompt: the rows from qe(P - 1) on at 16
  // bits; evict: the kept prompt tokens and every later one at 16 bits; kvq::Error when the evict budget cannot hold
  // the prompt's windows, as end_prompt would raise).
  CacheFootprint footprint(int n_tokens, int prompt_tokens) const;
  size_t bytes_allocated() const;  // pages + sinks + rings, all sequences
  int token_capacity() const;      // tokens the pool holds in sequences of max_ctx each

 private:
  struct Sequence;
  uint8_t* page_ptr(int page) const { return pages_.get() + size_t(page) * size_t(layout_.page_bytes); }
  size_t head_offset(int layer, int kv_head) const {
    return size_t(layer_offset_[size_t(layer)] + kv_head * layout_.layer_head_bytes(layer));
  }
  float* page_scales(int page, int layer) const {  // ν of the page's positions, token-scaled keys only
    return reinterpret_cast<float*>(page_ptr(page) + layout_.scale_offset(layer));
  }
  uint8_t* sink_row(Sequence& s, int layer, int kv, int head, int pos) const;
  uint8_t* ring_row(Sequence& s, int layer, int kv, int head, int pos) const;
  // The body row (the K / V codec of layer) of ring position pos, beside its window rows; quantized windows only.
  uint8_t* ring_body_row(Sequence& s, int layer, int kv, int head, int pos) const;
  void encode_ring_body(Sequence& s, int layer, int pos, const float* k, const float* v);
  void append_rows(int seq, Sequence& s, int layer, int pos0, int n, const float* k, const float* v);  // n <= A
  void demote(int seq, Sequence& s, int layer, int from, int to);
  void demote_scales(Sequence& s, int layer, int b0, int n, float* nu) const;
  // The exact store of seq (prompt policies but decode-faithful): [n_layers][2][n_kv][max_ctx] rows of exact_codec_,
  // row `slot` of (layer, K / V, head); slot = position, or after an eviction kept index / K + (position - P).
  uint8_t* exact_row(int seq, int layer, int kv, int head, int slot) const;
  int exact_slot(const Sequence& s, int pos) const;
  bool reads_exact(const Sequence& s) const;  // every query of seq reads only the exact store now
  void evict(int seq, Sequence& s);           // the evict policy at end_prompt

  CacheConfig cfg_;
  int n_layers_, n_kv_, d_, max_ctx_;
  std::unique_ptr<KvCodec> k_codec_, v_codec_, window_;
  std::unique_ptr<KvCodec> skip_codec_;  // bf16 rows of the skipped layers
  const KvCodec* exact_codec_;           // rows of the exact store: the window codec, or bf16 for int8 windows
  std::vector<std::unique_ptr<KvCodec>> head_k_codecs_;  // [n_layers][n_kv] per_head key codecs; empty otherwise
  std::vector<std::unique_ptr<KvCodec>> layer_k_codecs_, layer_v_codecs_;  // [n_layers] with kv_scales; else empty
  CacheLayout layout_;                 // region, page and window sizes
  std::vector<int64_t> layer_offset_;  // [n_layers] layout_.layer_offset(l)
  PagePool pool_;                      // free pages, block tables, sequence slots and lengths
  std::unique_ptr<uint8_t[]> pages_;   // [pool_.n_pages()][page_bytes]
  std::vector<std::unique_ptr<Sequence>> seqs_;  // windows per slot
  std::vector<std::unique_ptr<uint8_t[]>> exact_;  // per slot, allocated at its first sequence with a prompt policy
  std::unique_ptr<PrefixCache> prefix_;              // null: prefix caching off
};

}  // namespace kvq
