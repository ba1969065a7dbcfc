#include "kv/cache.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <numeric>

#include "codecs/fp8/fp8_scales.h"
#include "codecs/oscar/oscar_format.h"
#include "codecs/pnmix/codec_pnmix.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "kv/codec_rope.h"
#include "kv/evict.h"

namespace kvq {

struct KvCache::Sequence {
  uint8_t* window = nullptr;       // in the pool's pages (PagePool::window_offset): [n_layers][2][n_kv][S0] sink
                                   // rows, then the ring: [n_layers][2][n_kv][ring_tokens] window rows, then
                                   // [ring_tokens][ring_body] (CacheLayout::window_bytes)
  int prompt_end = -1;             // P once end_prompt was called, else -1
  int kept = -1;                   // evict, after end_prompt: prompt tokens kept (the same for every layer and head)
  std::vector<int> positions;      // evict, after end_prompt: [n_layers][n_kv][max_ctx] position of each exact slot
  std::vector<float> obs;          // evict, prompt open: [n_layers][kEvictObserve][obs_heads * d] the last queries,
  int obs_heads = 0;               // position pos in row pos % kEvictObserve
  std::vector<int> ring_end;       // [n_layers] the end of the rows last appended to the layer's ring (the ring holds
                                   // [ring_end - ring_tokens, ring_end)); below length() after a restore: then length()
};

namespace {
constexpr std::string_view kPromptPolicyNames[] = {"decode-faithful", "exact-prompt", "quantize-after-prompt", "evict"};
}  // namespace

PromptPolicy parse_prompt_policy(std::string_view name) {
  for (size_t i = 0; i < std::size(kPromptPolicyNames); ++i)
    if (name == kPromptPolicyNames[i]) return PromptPolicy(i);
  throw Error(fmt::format("unknown prompt policy '{}' (known: decode-faithful, exact-prompt, quantize-after-prompt, "
                          "evict)", name));
}

std::string_view prompt_policy_name(PromptPolicy p) { return kPromptPolicyNames[size_t(p)]; }

namespace {

void check_windows(const CacheConfig& cfg) {
  KVQ_CHECK(cfg.sink >= 0 && cfg.recent >= 0, "KV cache: --kv-sink {} / --kv-recent {} must be >= 0", cfg.sink,
            cfg.recent);
}

CodecSpec with_head_dim(CodecSpec s, int head_dim) {
  s.head_dim = head_dim;
  return s;
}

// What a prompt policy needs of the rest of the config (kv/cache.h).
void check_prompt_policy(const CacheConfig& cfg) {
  const std::string_view name = prompt_policy_name(cfg.prompt_policy);
  const bool evict = cfg.prompt_policy == PromptPolicy::kEvict;
  KVQ_CHECK(evict || (cfg.evict_bits == 0 && cfg.evict_ctx == 0),
            "KV cache: evict_bits {} / evict_ctx {} with prompt policy '{}' (evict only)", cfg.evict_bits,
            cfg.evict_ctx, name);
  KVQ_CHECK(cfg.evict_ctx >= 0, "KV cache: evict_ctx {} must be >= 0 (0: the prompt's end)", cfg.evict_ctx);
  // Rows after the prompt (quantize-after-prompt) and kept rows (evict) stay in the window codec, read from the exact
  // store: an int8 window cannot be that store.
  KVQ_CHECK(!(evict || cfg.prompt_policy == PromptPolicy::kQuantizeAfterPrompt) || !window_quantized(cfg),
            "KV cache: prompt policy '{}' keeps rows in the window codec, which must be unquantized (bf16 or f32), "
            "not '{}'", name, cfg.window);
  if (!evict) return;
  for (const CodecSpec* c : {&cfg.k, &cfg.v})
    KVQ_CHECK(codec_traits(c->type).code_bits >= 16,
              "KV cache: prompt policy 'evict' keeps tokens unquantized: the key and value types must be bf16 or f32, "
              "not {} (--evict-bits sets the bytes instead)", c->type);
  KVQ_CHECK(!cfg.transform || cfg.transform->identity(),
            "KV cache: prompt policy 'evict' scores the stored rows: no KV transform ('{}')", cfg.rotation());
}

// The sliding windows (CacheConfig::attn_window) against the model's layers.
void check_attn_window(const CacheConfig& cfg, int n_layers) {
  KVQ_CHECK(cfg.attn_window.empty() || cfg.attn_window.size() == size_t(n_layers),
            "KV cache: sliding windows for {} layers, the cache has {}", cfg.attn_window.size(), n_layers);
  for (int w : cfg.attn_window) KVQ_CHECK(w >= 0, "KV cache: sliding window {} must be >= 0", w);
}

// The cache's config, checked before any codec is built.
const CacheConfig& checked(const CacheConfig& cfg, int n_layers, int max_ctx, int max_seqs, size_t budget_bytes) {
  check_windows(cfg);
  check_attn_window(cfg, n_layers);
  KVQ_CHECK(cfg.max_chunk > 0 && max_ctx > 0 && (max_seqs > 0 || (max_seqs == 0 && budget_bytes > 0)),
            "KV cache: bad sizes (chunk {}, ctx {}, seqs {})", cfg.max_chunk, max_ctx, max_seqs);
  return cfg;
}

PagePool::Size pool_size(const CacheLayout& layout, int max_ctx, int max_seqs, size_t budget_bytes) {
  return budget_bytes > 0 ? PagePool::for_budget(layout, max_ctx, max_seqs, budget_bytes)
                          : PagePool::for_sequences(layout, max_ctx, max_seqs);
}

}  // namespace

CodecSpec window_spec(const CacheConfig& cfg, int head_dim) {
  CodecSpec s = codec_spec(cfg.window, false, cfg.v.group, 0.f);
  s.head_dim = head_dim;
  return s;
}

bool window_quantized(const CacheConfig& cfg) { return codec_traits(cfg.window).code_bits < 16; }

std::vector<int> parse_skip_layers(const std::string& list) {
  std::vector<int> out;
  if (list.empty()) return out;
  for (size_t at = 0; at <= list.size();) {
    const size_t end = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, end - at);
    int l = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), l);
    KVQ_CHECK(!item.empty(), "--kv-skip-layers '{}': empty item (a comma-separated list of layer indices, e.g. "
              "0,1,-2,-1)", list);
    KVQ_CHECK(ec == std::errc() && ptr == item.data() + item.size(),
              "--kv-skip-layers '{}': '{}' is not a layer index (integers; negative = from the end, -1 = the last)",
              list, item);
    KVQ_CHECK(std::find(out.begin(), out.end(), l) == out.end(), "--kv-skip-layers '{}': layer {} is named twice",
              list, l);
    out.push_back(l);
    at = end + 1;
  }
  return out;
}

LayerSet skipped_layers(const CacheConfig& cfg, int n_layers) {
  LayerSet set{};
  std::vector<int> named_by(size_t(std::max(n_layers, 0)), -1);  // the index of the item that named each layer
  for (size_t i = 0; i < cfg.skip_layers.size(); ++i) {
    const int item = cfg.skip_layers[i];
    const int l = item < 0 ? n_layers + item : item;
    KVQ_CHECK(l >= 0 && l < n_layers,
              "--kv-skip-layers: layer {} is out of range for a model of {} layers (0 .. {}, or -{} .. -1 from the "
              "end)", item, n_layers, n_layers - 1, n_layers);
    KVQ_CHECK(l < LayerSet::kMaxLayers, "--kv-skip-layers: layer {} of {}: at most {} layers can be skipped over",
              l, n_layers, LayerSet::kMaxLayers);
    KVQ_CHECK(named_by[size_t(l)] < 0, "--kv-skip-layers: {} and {} both name layer {} of {}",
              cfg.skip_layers[size_t(std::max(named_by[size_t(l)], 0))], item, l, n_layers);
    named_by[size_t(l)] = int(i);
    set.add(l);
  }
  return set;
}

CacheLayout cache_layout(const CacheConfig& cfg, const KvCodec& k, const KvCodec& v, const KvCodec& window,
                         int n_layers, int n_kv_heads, int head_dim) {
  check_windows(cfg);
  check_prompt_policy(cfg);
  KVQ_CHECK(cfg.max_chunk > 0, "KV cache: bad sizes (chunk {})", cfg.max_chunk);
  if (cfg.prompt_policy == PromptPolicy::kEvict)  // the bits, against the rows evict keeps (the window codec's)
    evict_budget(cfg.evict_bits, 8 * int(window.bytes_per_block()) / head_dim, 0);
  if (const KvTransform* t = cfg.transform.get(); t && !t->identity())
    KVQ_CHECK(t->n_layers == n_layers && t->n_kv_heads == n_kv_heads && t->head_dim == head_dim,
              "KV cache: transform '{}' of (layers {}, kv heads {}, d {}) does not fit the cache ({}, {}, {})", t->name,
              t->n_layers, t->n_kv_heads, t->head_dim, n_layers, n_kv_heads, head_dim);
  KVQ_CHECK(window.tokens_per_block() == 1, "KV cache: window type '{}' is not a per-token codec", cfg.window);
  const bool body_in_ring = window_quantized(cfg);  // body rows encoded at append (kv/cache.h)
  KVQ_CHECK(!body_in_ring || (k.tokens_per_block() == 1 && v.tokens_per_block() == 1 && !cfg.k.token_scale),
            "KV cache: window type '{}' needs per-token key and value codecs without a token scale (each row is "
            "quantized into the body at append, from its BF16 value): k={} has blocks of {} tokens{}, v={} of {}",
            cfg.window, k.name(), k.tokens_per_block(), cfg.k.token_scale ? " and a token scale" : "", v.name(),
            v.tokens_per_block());
  if (const PairBitTable* w = cfg.k.pair_bits.get(); w && codec_traits(cfg.k.type).per_head)
    KVQ_CHECK(w->n_layers == n_layers && w->n_kv_heads == n_kv_heads && w->head_dim == head_dim,
              "KV cache: {} widths '{}' are for {} layers × {} kv heads × d {}, the cache is {} × {} × {}", cfg.k.type,
              w->name, w->n_layers, w->n_kv_heads, w->head_dim, n_layers, n_kv_heads, head_dim);
  KVQ_CHECK(!cfg.v.token_scale, "KV cache: value type '{}' with a token scale (only keys take one)", cfg.v.type);
  if (const Fp8Scales* sc = cfg.kv_scales.get()) {
    const CodecId want = fp8::unscaled_row_of(sc->format);
    KVQ_CHECK(codec_traits(cfg.k.type).id == want && codec_traits(cfg.v.type).id == want,
              "KV cache: per-tensor FP8 scales{} ({}) are for an {} cache on both sides (-ctk/-ctv {}), not k={} v={}",
              sc->path.empty() ? "" : " " + sc->path, fp8_format_name(sc->format), fp8_format_name(sc->format),
              codec_traits(want).name, cfg.k.type, cfg.v.type);
    KVQ_CHECK(sc->n_layers() == n_layers, "KV cache: per-tensor FP8 scales{} for {} layers, the cache has {}",
              sc->path.empty() ? "" : " " + sc->path, sc->n_layers(), n_layers);
    KVQ_CHECK(!cfg.transform || cfg.transform->identity(),
              "KV cache: per-tensor FP8 scales{} were calibrated on the model's own keys and values: a KV transform "
              "('{}', --rotation) would change their range (use --rotation none)",
              sc->path.empty() ? "" : " " + sc->path, cfg.rotation());
  }
  KVQ_CHECK(!cfg.k.token_scale || cfg.skip_layers.empty(),
            "KV cache: --kv-skip-layers with token-scaled keys ({}) is not supported", cfg.k.type);
  KVQ_CHECK(!codec_traits(cfg.v.type).keys_only, "KV cache: value type '{}' stores keys only (value types: {})",
            cfg.v.type, codec_names_if([](const CodecTraits& t) { return !t.keys_only; }));
  // TurboQuant's codebook is the Lloyd-Max quantizer of Hadamard-rotated unit keys: its codes mean nothing without
  // that rotation, so the cache refuses them without it (never silently without it, nor with another). OScaR's
  // Hadamard improves its quantizer but is not part of its format: storage tests may run it under any transform; the
  // CLI always builds the implied one (cli/options.cpp plan()).
  const CodecTransform implied = implied_transform(cfg.k, cfg.v);
  KVQ_CHECK(implied != CodecTransform::kHadamardKeys ||
                (cfg.transform && cfg.transform->name == transform_name(implied)),
            "KV cache: cache types k={} v={} imply the transform '{}', the cache has '{}' (rotation/rotation_file.h: "
            "codec_transform builds it)", cfg.k.type, cfg.v.type, transform_name(implied), cfg.rotation());
  const int block_tokens = std::lcm(k.tokens_per_block(), v.tokens_per_block());
  KVQ_CHECK(cfg.page_tokens > 0 && cfg.page_tokens % block_tokens == 0,
            "KV cache: page size {} is not a multiple of the codec block of {} tokens ({} keys, {} values)",
            cfg.page_tokens, block_tokens, k.name(), v.name());
  KVQ_CHECK(cfg.demote_block == 0 || (cfg.demote_block > 0 && cfg.demote_block % block_tokens == 0 &&
                                      cfg.demote_block <= kMaxDemoteBlock),
            "KV cache: demotion block {} (--kv-demote-block) must be a positive multiple of the codec block of {} "
            "tokens ({} keys, {} values), at most {}", cfg.demote_block, block_tokens, k.name(), v.name(),
            kMaxDemoteBlock);
  return make_cache_layout(n_layers, n_kv_heads, head_dim, cfg.sink, cfg.recent, cfg.page_tokens, cfg.max_chunk,
                           {k.tokens_per_block(), int64_t(k.bytes_per_block())},
                           {v.tokens_per_block(), int64_t(v.bytes_per_block())}, int64_t(window.bytes_per_block()),
                           skipped_layers(cfg, n_layers), cfg.k.token_scale, body_in_ring,
                           int64_t(k.metadata_bytes()), cfg.demote_block);
}

CacheLayout cache_layout(const CacheConfig& cfg, int n_layers, int n_kv_heads, int head_dim) {
  check_windows(cfg);
  const auto k = make_key_codec(cfg, head_dim), v = make_codec_at(with_head_dim(cfg.v, head_dim), cfg.simd);
  const auto window = make_codec_at(window_spec(cfg, head_dim), cfg.simd);
  return cache_layout(cfg, *k, *v, *window, n_layers, n_kv_heads, head_dim);
}

std::string CacheConfig::describe() const {
  auto one = [](const CodecSpec& c) {
    if (c.pair_bits && codec_traits(c.type).per_head)  // PN-Mix: which calibration, its budget and clip
      return fmt::format("{}/{:g}b/r{:g}", c.pair_bits->name, c.pair_bits->key_bits(), c.clip);
    if (!codec_traits(c.type).grouped) return c.type;
    return fmt::format("{}/g{}/r{:g}", c.type, c.group, c.clip);
  };
  std::string skip;
  for (int l : skip_layers) skip += (skip.empty() ? " skip_layers=" : ",") + std::to_string(l);
  std::string prompt;  // nothing for decode-faithful: every existing description stays as it was
  if (prompt_policy == PromptPolicy::kEvict)  // "@N": the bits are stated at context N, not at the prompt's end
    prompt = fmt::format(" prompt=evict/b{:g}{}", evict_bits, evict_ctx > 0 ? fmt::format("@{}", evict_ctx) : "");
  else if (prompt_policy != PromptPolicy::kDecodeFaithful) prompt = " prompt=" + std::string(prompt_policy_name(prompt_policy));
  // nothing for the codecs' own block either: " demote=256" only where B was set
  const std::string demote = demote_block > 0 ? fmt::format(" demote={}", demote_block) : "";
  // nor for a model without sliding windows: " sliding=4096" (the widest layer's) only where one slides
  const int slide = attn_window.empty() ? 0 : *std::max_element(attn_window.begin(), attn_window.end());
  const std::string sliding = slide > 0 ? fmt::format(" sliding={}", slide) : "";
  // nor for vLLM's default FP8 scale of 1.0: " scales=FILE" (its name) only with --kv-scales
  const std::string scales =
      kv_scales ? " scales=" + (kv_scales->path.empty() ? std::string("calibrated")
                                                        : kv_scales->path.substr(kv_scales->path.rfind('/') + 1))
                : "";
  return fmt::format("k={} v={} sink={} recent={}{} window={} rotation={}{}{}{}{}", one(k), one(v), sink, recent,
                     demote, window, rotation(), scales, skip, prompt, sliding);
}

KvCache::KvCache(const CacheConfig& cfg, int n_layers, int n_kv_heads, int head_dim, int max_ctx, int max_seqs,
                 size_t budget_bytes)
    : cfg_(checked(cfg, n_layers, max_ctx, max_seqs, budget_bytes)),
      n_layers_(n_layers),
      n_kv_(n_kv_heads),
      d_(head_dim),
      max_ctx_(max_ctx),
      k_codec_(make_key_codec(cfg, head_dim, max_ctx)),
      v_codec_(make_value_codec(cfg, head_dim)),
      window_(make_codec_at(window_spec(cfg, head_dim), cfg.simd)),
      skip_codec_(make_codec_at(CodecSpec{.type = "bf16", .head_dim = head_dim}, cfg.simd)),
      layout_(cache_layout(cfg, *k_codec_, *v_codec_, *window_, n_layers, n_kv_heads, head_dim)),
      pool_(layout_, max_ctx, pool_size(layout_, max_ctx, max_seqs, budget_bytes)) {
  for (int l = 0; l < n_layers; ++l) layer_offset_.push_back(layout_.layer_offset(l));
  exact_codec_ = window_quantized(cfg_) ? skip_codec_.get() : window_.get();
  if (codec_traits(cfg.k.type).per_head)  // one key codec per (layer, kv head), all with head 0's block bytes
    for (int l = 0; l < n_layers; ++l)
      for (int h = 0; h < n_kv_heads; ++h) {
        head_k_codecs_.push_back(make_key_codec(cfg, head_dim, max_ctx, l, h));
        KVQ_CHECK(head_k_codecs_.back()->bytes_per_block() == k_codec_->bytes_per_block(),
                  "KV cache: {} keys of layer {} kv head {} store {} bytes per block, layer 0 head 0 {}: a page has "
                  "one layout", cfg.k.type, l, h, head_k_codecs_.back()->bytes_per_block(),
                  k_codec_->bytes_per_block());
      }
  if (cfg.kv_scales)  // vLLM's per-tensor FP8 scales: each layer's codecs (same blocks, their own scale)
    for (int l = 0; l < n_layers; ++l) {
      layer_k_codecs_.push_back(make_key_codec(cfg, head_dim, max_ctx, l));
      layer_v_codecs_.push_back(make_value_codec(cfg, head_dim, l));
    }
  pages_.reset(new uint8_t[std::max<size_t>(1, size_t(pool_.n_pages()) * size_t(layout_.page_bytes))]);
  seqs_.resize(size_t(pool_.n_slots()));
  exact_.resize(size_t(pool_.n_slots()));
  for (auto& s : seqs_) s = std::make_unique<Sequence>();
}

KvCache::~KvCache() = default;

int KvCache::new_sequence() {
  const int seq = pool_.open();
  Sequence& s = *seqs_[size_t(seq)];
  s.window = pages_.get() + pool_.window_offset(seq);
  std::memset(s.window, 0, size_t(layout_.window_bytes()));
  s.ring_end.assign(size_t(n_layers_), 0);
  if (cfg_.prompt_policy != PromptPolicy::kDecodeFaithful && !exact_[size_t(seq)])  // kept for the slot's next ones
    exact_[size_t(seq)].reset(new uint8_t[size_t(n_layers_) * 2 * n_kv_ * max_ctx_ * exact_codec_->bytes_per_block()]);
  return seq;
}

void KvCache::free_sequence(int seq) {
  Sequence& s = *seqs_.at(size_t(seq));
  if (pool_.live(seq)) pool_.close(seq);
  s = Sequence{};
}

int KvCache::length(int seq) const { return pool_.length(seq); }

uint64_t KvCache::config_key() const {
  const std::string d = fmt::format("{} page={} chunk={} shape={}x{}x{}", cfg_.describe(), cfg_.page_tokens,
                                    cfg_.max_chunk, n_layers_, n_kv_, d_);
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : d) h = (h ^ c) * 1099511628211ull;
  return h;
}

void KvCache::enable_prefix_cache(int64_t state_bytes) {
  KVQ_CHECK(cfg_.prompt_policy == PromptPolicy::kDecodeFaithful,
            "KV cache: prefix caching needs the decode-faithful prompt policy, not '{}'",
            prompt_policy_name(cfg_.prompt_policy));
  if (state_bytes <= 0) state_bytes = std::max<int64_t>(int64_t(pool_.bytes() / 4), int64_t(1) << 20);
  prefix_ = std::make_unique<PrefixCache>(pool_, config_key(), state_bytes);
}

int KvCache::prefix_match(const int32_t* ids, int n, int step) const {
  return prefix_ && n > 1 ? prefix_->longest(ids, n - 1, step) : 0;
}

void KvCache::prefix_count(int hit_tokens, int miss_tokens) {
  if (prefix_) prefix_->count(hit_tokens, miss_tokens);
}

PrefixCacheStats KvCache::prefix_stats() const { return prefix_ ? prefix_->stats() : PrefixCacheStats{}; }

// The state of a sequence at length len besides its final pages, as the entry keeps it:
//   sinks [sink_bytes()] | the partly filled last page [page_bytes] (when there is one) |
//   window rows of [r0, len) [n_layers][2][n_kv][len - r0][window_row] | their body rows [len - r0][ring_body]
// with r0 = max(S0, qe(len - 1)): the rows the ring still holds and a continuation reads.
void KvCache::prefix_store(int seq, const int32_t* ids, int len) {
  if (!prefix_) return;
  KVQ_CHECK(pool_.live(seq) && len == pool_.length(seq) && len > 0,
            "KV cache: prefix_store of {} tokens of sequence {}, which holds {}", len, seq, pool_.length(seq));
  if (prefix_->contains(ids, len)) {
    prefix_->find(ids, len);  // most recently used
    return;
  }
  Sequence& s = *seqs_[size_t(seq)];
  // q: the quantized end; the ring holds [q, len) (nothing while len <= S0: every row is a sink).
  const int S0 = cfg_.sink, P = cfg_.page_tokens, q = std::max(S0, quant_end(len - 1)), r0 = len > S0 ? q : len;
  const int full = (q - S0) / P, partial = (q - S0) % P != 0;
  const size_t row = size_t(layout_.window_row), n_rows = size_t(len - r0);
  const size_t sinks = size_t(layout_.sink_bytes());
  std::vector<uint8_t> state(sinks + (partial ? size_t(layout_.page_bytes) : 0) +
                             size_t(n_layers_) * 2 * n_kv_ * n_rows * row + n_rows * size_t(layout_.ring_body));
  uint8_t* out = state.data();
  out = std::copy_n(s.window, sinks, out);
  if (partial) {
    const uint8_t* page = page_ptr(pool_.page(seq, full));
    out = std::copy(page, page + layout_.page_bytes, out);
  }
  for (int l = 0; l < n_layers_; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < n_kv_; ++h)
        for (int p = r0; p < len; ++p) out = std::copy_n(ring_row(s, l, kv, h, p), row, out);
  if (layout_.ring_body > 0)
    for (int p = r0; p < len; ++p) {
      const uint8_t* body = ring_body_row(s, 0, 0, 0, p);  // the slot of p: every layer's rows from there
      out = std::copy_n(body, size_t(layout_.ring_body), out);
    }
  std::vector<int> pages(static_cast<size_t>(full));
  for (int i = 0; i < full; ++i) pages[size_t(i)] = pool_.page(seq, i);
  prefix_->insert(ids, len, std::move(pages), std::move(state));
}

void KvCache::prefix_attach(int seq, const int32_t* ids, int len) {
  KVQ_CHECK(prefix_, "KV cache: prefix_attach without a prefix cache (enable_prefix_cache)");
  KVQ_CHECK(pool_.live(seq) && pool_.length(seq) == 0 && pool_.pages(seq) == 0,
            "KV cache: prefix_attach into sequence {}, which is not new", seq);
  const PrefixCache::Entry* e = prefix_->find(ids, len);
  KVQ_CHECK(e, "KV cache: no cached prefix of {} tokens to attach", len);
  // Copies first: taking the partial page may evict this very entry.
  const std::vector<int> pages = e->pages;
  const std::vector<uint8_t> state = e->state;
  for (int p : pages) pool_.share(seq, p);
  Sequence& s = *seqs_[size_t(seq)];
  const int S0 = cfg_.sink, P = cfg_.page_tokens, q = std::max(S0, quant_end(len - 1)), r0 = len > S0 ? q : len;
  const bool partial = (q - S0) % P != 0;
  const size_t row = size_t(layout_.window_row);
  const uint8_t* in = state.data();
  std::copy_n(in, size_t(layout_.sink_bytes()), s.window);
  in += layout_.sink_bytes();
  if (partial) {
    std::copy_n(in, size_t(layout_.page_bytes), page_ptr(pool_.take_page(seq)));
    in += layout_.page_bytes;
  }
  for (int l = 0; l < n_layers_; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < n_kv_; ++h)
        for (int p = r0; p < len; ++p, in += row) std::copy_n(in, row, ring_row(s, l, kv, h, p));
  if (layout_.ring_body > 0)
    for (int p = r0; p < len; ++p, in += layout_.ring_body)
      std::copy_n(in, size_t(layout_.ring_body), ring_body_row(s, 0, 0, 0, p));
  KVQ_CHECK(in == state.data() + state.size(), "KV cache: a cached prefix of {} bytes, {} read (internal)",
            state.size(), in - state.data());
  pool_.set_length(seq, len);
}

void KvCache::fork(int src, int dst) {
  KVQ_CHECK(cfg_.prompt_policy == PromptPolicy::kDecodeFaithful,
            "KV cache: a fork copies decode-faithful caches only, not prompt policy '{}'",
            prompt_policy_name(cfg_.prompt_policy));
  pool_.fork(src, dst);
  for (int i = 0; i < pool_.pages(src); ++i)
    std::memcpy(page_ptr(pool_.page(dst, i)), page_ptr(pool_.page(src, i)), size_t(layout_.page_bytes));
  Sequence& d = *seqs_.at(size_t(dst));
  uint8_t* window = d.window;  // dst's own windows, a copy of src's
  d = *seqs_.at(size_t(src));
  d.window = window;
  std::memcpy(d.window, seqs_[size_t(src)]->window, size_t(layout_.window_bytes()));
}

int KvCache::quant_end(int t) const { return layout_.quant_end(t); }

void KvCache::reserve(int seq, int n_new) { pool_.reserve(seq, n_new); }

uint8_t* KvCache::sink_row(Sequence& s, int layer, int kv, int head, int pos) const {
  return s.window + (((size_t(layer) * 2 + kv) * n_kv_ + head) * cfg_.sink + pos) * size_t(layout_.window_row);
}

uint8_t* KvCache::ring_row(Sequence& s, int layer, int kv, int head, int pos) const {
  const int ring = layout_.ring_tokens;
  return s.window + layout_.sink_bytes() +
         (((size_t(layer) * 2 + kv) * n_kv_ + head) * ring + pos % ring) * size_t(layout_.window_row);
}

uint8_t* KvCache::ring_body_row(Sequence& s, int layer, int kv, int head, int pos) const {
  // Slot pos % ring_tokens after the window rows; in it, layer l's heads as in a page, one row each (P = 1).
  const CacheLayout& l = layout_;
  const int64_t P = l.page_tokens;
  const int64_t in_slot = (layer_offset_[size_t(layer)] + head * l.layer_head_bytes(layer) +
                           (kv ? l.layer_k_region(layer) : 0)) / P;
  return s.window + l.ring_body_offset() + (pos % l.ring_tokens) * l.ring_body + in_slot;
}

// The body rows of position pos (every kv head of one layer, k / v: [n_kv, d]), encoded from their BF16 values: what
// demotion would encode from a BF16 window row.
void KvCache::encode_ring_body(Sequence& s, int layer, int pos, const float* k, const float* v) {
  float row[kCpuMaxHeadDim];
  for (int h = 0; h < n_kv_; ++h)
    for (int kv = 0; kv < 2; ++kv) {
      const float* x = (kv ? v : k) + size_t(h) * d_;
      for (int c = 0; c < d_; ++c) row[c] = bf16_to_f32(f32_to_bf16(x[c]));
      (kv ? v_codec(layer) : k_codec(layer, h)).encode_at(row, pos, ring_body_row(s, layer, kv, h, pos));
    }
}

uint8_t* KvCache::exact_row(int seq, int layer, int kv, int head, int slot) const {
  return exact_[size_t(seq)].get() +
         ((size_t(layer) * 2 + kv) * n_kv_ + head) * max_ctx_ * exact_codec_->bytes_per_block() +
         size_t(slot) * exact_codec_->bytes_per_block();
}

int KvCache::exact_slot(const Sequence& s, int pos) const {
  return s.kept >= 0 && pos >= s.prompt_end ? s.kept + (pos - s.prompt_end) : pos;
}

bool KvCache::reads_exact(const Sequence& s) const {
  const PromptPolicy p = cfg_.prompt_policy;
  return p == PromptPolicy::kEvict || (p != PromptPolicy::kDecodeFaithful && s.prompt_end < 0);
}

void KvCache::append(int seq, int layer, int pos0, int n, const float* k, const float* v) {
  KVQ_CHECK(pool_.live(seq), "KV cache: append to sequence {}, which is not live", seq);
  KVQ_CHECK(layer >= 0 && layer < n_layers_, "KV cache: append to layer {} of {}", layer, n_layers_);
  Sequence& s = *seqs_[size_t(seq)];
  const int len = pool_.length(seq);
  // The step's first rows of this layer (again after a step that failed), or the rows after its last append.
  KVQ_CHECK(n >= 0 && (pos0 == len || pos0 == s.ring_end[size_t(layer)]),
            "KV cache: append at {} but sequence {} holds {} tokens (layer {} appended up to {})", pos0, seq, len,
            layer, s.ring_end[size_t(layer)]);
  // The ring holds W + B + append_tokens rows: a longer append goes in rounds, each demoting before the next writes.
  const size_t row = size_t(n_kv_) * d_;
  for (int r = 0; r < layout_.rounds(n); ++r) {
    const auto [a, e] = layout_.round_rows(n, r);
    append_rows(seq, s, layer, pos0 + a, e - a, k + size_t(a) * row, v + size_t(a) * row);
    s.ring_end[size_t(layer)] = pos0 + e;
  }
}

void KvCache::append_rows(int seq, Sequence& s, int layer, int pos0, int n, const float* k, const float* v) {
  const PromptPolicy policy = cfg_.prompt_policy;
  const bool after = s.prompt_end >= 0;
  // The exact store: the prompt's rows while it is open (exact-prompt, quantize-after-prompt), every row after it
  // (quantize-after-prompt), every row of an evict sequence.
  if (policy != PromptPolicy::kDecodeFaithful && !(after && policy == PromptPolicy::kExactPrompt))
    for (int i = 0; i < n; ++i) {
      const int slot = exact_slot(s, pos0 + i);
      for (int h = 0; h < n_kv_; ++h) {
        exact_codec_->encode(k + (size_t(i) * n_kv_ + h) * d_, exact_row(seq, layer, 0, h, slot));
        exact_codec_->encode(v + (size_t(i) * n_kv_ + h) * d_, exact_row(seq, layer, 1, h, slot));
        if (s.kept >= 0) s.positions[(size_t(layer) * n_kv_ + h) * max_ctx_ + slot] = pos0 + i;
      }
    }
  // Only the exact store is read from here on: nothing more is demoted (quantize-after-prompt's codec region ends at
  // the prompt), and an evict sequence never reads the windows or pages.
  if (policy == PromptPolicy::kEvict || (after && policy == PromptPolicy::kQuantizeAfterPrompt)) return;
  for (int i = 0; i < n; ++i) {
    const int pos = pos0 + i;
    const float* ki = k + size_t(i) * n_kv_ * d_;
    const float* vi = v + size_t(i) * n_kv_ * d_;
    for (int h = 0; h < n_kv_; ++h) {
      const float* rows[2] = {ki + size_t(h) * d_, vi + size_t(h) * d_};
      for (int kv = 0; kv < 2; ++kv)
        window_->encode(rows[kv], pos < cfg_.sink ? sink_row(s, layer, kv, h, pos) : ring_row(s, layer, kv, h, pos));
    }
    if (layout_.ring_body > 0 && pos >= cfg_.sink) encode_ring_body(s, layer, pos, ki, vi);
  }
  demote(seq, s, layer, quant_end(pos0 - 1), quant_end(pos0 + n - 1));
}

void KvCache::demote(int seq, Sequence& s, int layer, int from, int to) {
  // Quantize blocks [from, to) of every head from the ring into their pages (with quantized windows: copy the body
  // rows encoded at append). [from, to) is whole demotion blocks; it is encoded a codec block at a time, which divides
  // the page size, so each lies in one page (a demotion block may span several).
  const int S0 = cfg_.sink, P = cfg_.page_tokens;
  from = std::max(from, S0);
  const int B = layout_.codec_tokens;
  std::vector<float> rows(size_t(B) * d_);
  for (int b0 = from; b0 < to; b0 += B) {
    const int q = b0 - S0;
    KVQ_CHECK(q / P < pool_.pages(seq), "KV cache: demotion past the reserved pages (reserve() not called)");
    const int page_id = pool_.page(seq, q / P);
    uint8_t* page = page_ptr(page_id);
    float* nu = cfg_.k.token_scale ? page_scales(page_id, layer) + q % P : nullptr;  // ν of the block's positions
    if (nu) demote_scales(s, layer, b0, B, nu);
    for (int h = 0; h < n_kv_; ++h) {
      uint8_t* head = page + head_offset(layer, h);
      for (int kv = 0; kv < 2; ++kv) {
        const KvCodec& codec = kv ? v_codec(layer) : k_codec(layer, h);
        const int tpb = codec.tokens_per_block();
        uint8_t* region = head + (kv ? layout_.layer_k_region(layer) : 0);
        for (int t0 = b0; t0 < b0 + B; t0 += tpb) {
          uint8_t* block = region + size_t((t0 - S0) % P / tpb) * codec.bytes_per_block();
          if (layout_.ring_body > 0) {  // per-token rows (cache_layout): the body row of t0
            std::memcpy(block, ring_body_row(s, layer, kv, h, t0), codec.bytes_per_block());
            continue;
          }
          for (int r = 0; r < tpb; ++r) {
            float* row = rows.data() + size_t(r) * d_;
            window_->decode(ring_row(s, layer, kv, h, t0 + r), row);
            if (kv == 0 && nu)
              for (int c = 0; c < d_; ++c) row[c] = exact::div(row[c], nu[t0 + r - b0]);
          }
          codec.encode_at(rows.data(), t0, block);
        }
      }
    }
  }
}

// nu[i] = ν of position b0 + i for the n positions of a codec block: the norm of its key rows over all kv heads
// (codecs/oscar/oscar_format.h), from the window rows the codecs will encode.
void KvCache::demote_scales(Sequence& s, int layer, int b0, int n, float* nu) const {
  std::vector<float> row(static_cast<size_t>(d_));
  for (int i = 0; i < n; ++i) {
    float sum = 0.f;
    for (int h = 0; h < n_kv_; ++h) {
      window_->decode(ring_row(s, layer, 0, h, b0 + i), row.data());
      sum = exact::add(sum, token_sum_squares([&](int c) { return row[size_t(c)]; }, d_));
    }
    nu[i] = token_scale(sum);
  }
}

void KvCache::commit(int seq, int n) { pool_.commit(seq, n); }

void KvCache::end_prompt(int seq) {
  Sequence& s = *seqs_.at(size_t(seq));
  KVQ_CHECK(pool_.live(seq), "KV cache: end_prompt of sequence {}, which is not live", seq);
  KVQ_CHECK(s.prompt_end < 0, "KV cache: end_prompt called twice for sequence {} (its prompt ended at {})", seq,
            s.prompt_end);
  // exact-prompt and quantize-after-prompt: the pages already hold what the prompt's chunks demoted, [S0, qe(P - 1));
  // only what is read changes (runs()). evict checks everything before it changes anything: a refused eviction leaves
  // the prompt open.
  if (cfg_.prompt_policy == PromptPolicy::kEvict) evict(seq, s);
  s.prompt_end = pool_.length(seq);
}

int KvCache::prompt_end(int seq) const { return seqs_.at(size_t(seq))->prompt_end; }

void KvCache::observe_queries(int seq, int layer, int pos0, int n, const float* q, int n_heads) {
  Sequence& s = *seqs_.at(size_t(seq));
  if (cfg_.prompt_policy != PromptPolicy::kEvict || s.prompt_end >= 0) return;
  KVQ_CHECK(n_heads % n_kv_ == 0 && (s.obs_heads == 0 || s.obs_heads == n_heads),
            "KV cache: {} query heads for {} kv heads", n_heads, n_kv_);
  const size_t row = size_t(n_heads) * d_;
  if (s.obs_heads == 0) s.obs.assign(size_t(n_layers_) * kEvictObserve * row, 0.f), s.obs_heads = n_heads;
  for (int i = std::max(0, n - kEvictObserve); i < n; ++i)
    std::copy_n(q + size_t(i) * row, row,
                s.obs.data() + (size_t(layer) * kEvictObserve + (pos0 + i) % kEvictObserve) * row);
}

// At the end of the prompt: per (layer, kv head), score the prompt's tokens with the last queries (kv/evict.h), keep
// the budget's worth and compact their exact rows into slots [0, kept), in position order; later tokens follow them.
void KvCache::evict(int seq, Sequence& s) {
  const int P = pool_.length(seq);  // prompt_end is set once this returns
  const int row_bits = 8 * int(exact_codec_->bytes_per_block()) / d_;
  const int budget = evict_kept(cfg_.evict_bits, row_bits, P, cfg_.evict_ctx, cfg_.sink, cfg_.recent);
  KVQ_CHECK(P == 0 || s.obs_heads > 0, "KV cache: evict: no prompt queries were observed (KvCache::observe_queries)");
  s.positions.assign(size_t(n_layers_) * n_kv_ * max_ctx_, 0);
  s.kept = budget;
  if (P == 0) return;
  const int n_q = std::min(P, kEvictObserve), g = s.obs_heads / n_kv_;
  std::vector<int> q_pos(static_cast<size_t>(n_q));
  std::iota(q_pos.begin(), q_pos.end(), P - n_q);
  std::vector<float> keys(size_t(P) * d_), values(size_t(P) * d_), queries(size_t(n_q) * g * d_);
  const size_t row_bytes = exact_codec_->bytes_per_block();
  for (int l = 0; l < n_layers_; ++l)
    for (int h = 0; h < n_kv_; ++h) {
      for (int t = 0; t < P; ++t) {
        exact_codec_->decode(exact_row(seq, l, 0, h, t), keys.data() + size_t(t) * d_);
        exact_codec_->decode(exact_row(seq, l, 1, h, t), values.data() + size_t(t) * d_);
      }
      for (int i = 0; i < n_q; ++i)  // query heads h g .. h g + g - 1 of the observed positions
        std::copy_n(s.obs.data() + ((size_t(l) * kEvictObserve + q_pos[size_t(i)] % kEvictObserve) * s.obs_heads +
                                    size_t(h) * g) * d_,
                    size_t(g) * d_, queries.data() + size_t(i) * g * d_);
      const std::vector<double> score =
          evict_scores(keys.data(), values.data(), P, d_, queries.data(), q_pos.data(), n_q, g);
      const std::vector<int> keep = evict_keep(score, cfg_.sink, cfg_.recent, budget);
      int* pos = s.positions.data() + (size_t(l) * n_kv_ + h) * max_ctx_;
      for (size_t i = 0; i < keep.size(); ++i) {  // slot i <= keep[i]: moving forward in order overwrites nothing kept
        for (int kv = 0; kv < 2; ++kv)
          std::memmove(exact_row(seq, l, kv, h, int(i)), exact_row(seq, l, kv, h, keep[i]), row_bytes);
        pos[i] = keep[i];
      }
    }
  s.obs = {};
}

void KvCache::runs(int seq, int layer, int kv_head, int t_first, int t_last, std::vector<Run>& out) const {
  Sequence& s = *seqs_.at(size_t(seq));
  const int S0 = cfg_.sink, P = cfg_.page_tokens;
  out.clear();
  // A sliding window: no query of [t_first, t_last] reads a position below lo (attention masks each query's own).
  const int w = cfg_.attn_window_of(layer), lo = w > 0 ? std::max(0, t_first - w + 1) : 0;
  // The exact store's rows [from, t_last]: slots from exact_slot(from) on (evict: kept positions, then later tokens).
  const auto exact_run = [&](int from) {
    if (s.kept < 0) from = std::max(from, lo);  // after an eviction the slots are not positions: masked per query
    const int slot0 = exact_slot(s, from), n = exact_slot(s, t_last) + 1 - slot0;
    const int* pos = s.kept >= 0 ? s.positions.data() + (size_t(layer) * n_kv_ + kv_head) * max_ctx_ + slot0 : nullptr;
    if (n > 0)
      out.push_back({RunKind::Exact, pos ? pos[0] : from, n, exact_row(seq, layer, 0, kv_head, slot0),
                     exact_row(seq, layer, 1, kv_head, slot0), nullptr, exact_codec_, exact_codec_, pos});
  };
  if (reads_exact(s)) return exact_run(0);  // an open prompt (but decode-faithful), or an evict sequence
  // Quantize-after-prompt after its prompt: the codec region stopped at qe(P - 1); every later row is exact.
  const bool frozen = cfg_.prompt_policy == PromptPolicy::kQuantizeAfterPrompt && s.prompt_end >= 0;
  const int frozen_end = frozen && s.prompt_end > 0 ? quant_end(s.prompt_end - 1) : S0;
  const int n_sink = std::min({S0, t_last + 1, frozen ? s.prompt_end : S0});
  if (n_sink > lo)
    out.push_back({RunKind::Sink, lo, n_sink - lo, sink_row(s, layer, 0, kv_head, lo),
                   sink_row(s, layer, 1, kv_head, lo), nullptr, window_.get(), window_.get(), nullptr});
  const int q_end = frozen ? frozen_end : quant_end(t_last);
  const KvCodec &kc = k_codec(layer, kv_head), &vc = v_codec(layer);
  for (int p0 = S0; p0 < q_end; p0 += P) {
    const int end = std::min(p0 + P, q_end);
    if (end <= lo) continue;  // behind every query's sliding window
    // From the codec block holding lo on (quantized runs start on codec blocks).
    const int a = lo > p0 ? p0 + (lo - p0) / layout_.codec_tokens * layout_.codec_tokens : p0;
    const int page = pool_.page(seq, (p0 - S0) / P);
    const uint8_t* head = page_ptr(page) + head_offset(layer, kv_head);
    const uint8_t* k = head + size_t((a - p0) / kc.tokens_per_block()) * kc.bytes_per_block();
    const uint8_t* v = head + layout_.layer_k_region(layer) + size_t((a - p0) / vc.tokens_per_block()) *
                                                                  vc.bytes_per_block();
    out.push_back({RunKind::Quant, a, end - a, k, v, cfg_.k.token_scale ? page_scales(page, layer) + (a - p0) : nullptr,
                   &kc, &vc, nullptr});
  }
  if (frozen) return exact_run(q_end > S0 ? q_end : n_sink);
  // Recent rows: everything from the first query's window start to the last query, split at the ring's wrap. The
  // ring holds the last ring_tokens rows appended: a chunk longer than append_tokens is attended a round at a time
  // (kvq::append_and_attend), else its first queries' rows would be gone.
  const int first = std::max({S0, quant_end(t_first), lo});
  const int end = std::max(s.ring_end.empty() ? 0 : s.ring_end[size_t(layer)], pool_.length(seq));
  KVQ_CHECK(first > t_last || (t_last < end && first >= end - layout_.ring_tokens),
            "KV cache: queries at [{}, {}] of sequence {} read ring rows [{}, {}], but the ring holds [{}, {}) (attend "
            "each append of at most {} rows before the next: kvq::append_and_attend)", t_first, t_last, seq, first,
            t_last, std::max(0, end - layout_.ring_tokens), end, layout_.append_tokens);
  for (int p0 = first; p0 <= t_last;) {
    const int slot = p0 % layout_.ring_tokens;
    const int n = std::min(t_last + 1 - p0, layout_.ring_tokens - slot);
    out.push_back({RunKind::Recent, p0, n, ring_row(s, layer, 0, kv_head, p0), ring_row(s, layer, 1, kv_head, p0),
                   nullptr, window_.get(), window_.get(), nullptr});
    p0 += n;
  }
}

CacheFootprint KvCache::footprint(int n) const { return layout_.footprint(n); }

CacheFootprint KvCache::footprint(int n, int prompt) const { return prompt_footprint(layout_, cfg_, n, prompt); }

CacheFootprint prompt_footprint(const CacheLayout& layout, const CacheConfig& cfg, int n, int prompt) {
  KVQ_CHECK(prompt >= 0 && prompt <= n && n > 0, "KV cache: footprint of {} tokens with a prompt of {}", n, prompt);
  const PromptPolicy policy = cfg.prompt_policy;
  // decode-faithful and exact-prompt store the same rows (the prompt's exact rows are prefill state, not cache).
  if (policy == PromptPolicy::kDecodeFaithful || policy == PromptPolicy::kExactPrompt) return layout.footprint(n);
  // [0, S0) window rows, [S0, qe(P - 1)) the codecs, the rest window rows (exact store: the window codec)
  if (policy == PromptPolicy::kQuantizeAfterPrompt) return layout.frozen_footprint(n, prompt);
  // evict: the kept prompt tokens and every later one, unquantized (rows of the window codec, which evict keeps
  // unquantized: check_prompt_policy)
  const double exact = layout.window_token_bytes();
  const int kept = evict_kept(cfg.evict_bits, int(8 * layout.window_row / layout.head_dim), prompt, cfg.evict_ctx,
                              cfg.sink, cfg.recent);
  return layout.footprint_of(n, double(kept + n - prompt) * exact, exact);
}

size_t KvCache::bytes_allocated() const {
  size_t exact = 0;  // the exact stores of the prompt policies
  for (const auto& e : exact_)
    if (e) exact += size_t(n_layers_) * 2 * n_kv_ * max_ctx_ * exact_codec_->bytes_per_block();
  return pool_.bytes() + exact;
}

int KvCache::token_capacity() const { return max_ctx_ * pool_.sequences_at(max_ctx_); }

}  // namespace kvq
