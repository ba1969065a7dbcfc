// Host side of the GPU paged KV cache: validation, device allocations, step descriptors and the kernel launches
// (kv_append.cu, decode_attention.cu). Sizes come from kv/cache_layout.h and the pages, block tables and sequence
// slots from kv/page_pool.h, as on the CPU (kv/cache.{h,cpp}); the block tables are uploaded from the pool.
#include "cuda/gpu_cache.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>

#include "codecs/fp8/fp8_scales.h"
#include "codecs/group_quant.h"
#include "codecs/layout.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "cuda/gpu_instances.h"
#include "cuda/gpu_kernels.h"
#include "cuda/runtime.h"
#include "kv/codec_rope.h"
#include "kv/evict.h"
#include "kv/prefix_cache.h"
#include "rotation/rope.h"

namespace kvq::cuda {

namespace {

// The traits row of a validated spec's type (gpu_instances.h has refused unknown types before any of these).
const CodecTraits& traits(const CodecSpec& s) { return codec_traits(s.type); }

// The clip's quantile index in a group (codecs/group_quant.h); -1 (plain max |x|) for codecs without groups.
int clip_index(const CodecSpec& s) { return traits(s).grouped ? clip_quantile_index(s.clip, s.group) : -1; }

// What a layer of --kv-skip-layers stores: bf16 rows for keys and values (kv/cache.h), run by the bf16 instance row.
CacheConfig skipped_layer_config(const CacheConfig& cfg) {
  CacheConfig c = cfg;
  c.k = CodecSpec{.type = "bf16", .head_dim = cfg.k.head_dim};
  c.v = CodecSpec{.type = "bf16", .head_dim = cfg.v.head_dim};
  c.kv_scales = nullptr;  // FP8's
  c.skip_layers.clear();
  return c;
}

// The cache must have an instance row (gpu_instances.h), and so must its skipped layers' bf16 rows: one line naming
// the combination and what the GPU runs.
void check_config(const CacheConfig& cfg, int head_dim) {
  const std::string why = gpu_unsupported(cfg, head_dim);
  KVQ_CHECK(why.empty(), "GPU KV cache: {}", why);
  if (cfg.skip_layers.empty()) return;
  const std::string skip_why = gpu_unsupported(skipped_layer_config(cfg), head_dim);
  KVQ_CHECK(skip_why.empty(), "GPU KV cache: the bf16 rows of --kv-skip-layers: {}", skip_why);
}

// The exact-prompt twin's config (gpu_cache.h): bf16 keys, values and windows, decode-faithful, on pages a tensor-core
// tile fits, with cfg's windows, chunk, sliding windows and transform (so its rows are the CPU exact store's).
CacheConfig exact_twin_config(const CacheConfig& cfg, int head_dim) {
  CacheConfig t;
  t.k = t.v = CodecSpec{.type = "bf16", .head_dim = head_dim};
  t.sink = cfg.sink, t.recent = cfg.recent, t.max_chunk = cfg.max_chunk;
  t.page_tokens = cfg.page_tokens % 16 == 0 ? cfg.page_tokens : 2 * cfg.page_tokens;
  t.transform = cfg.transform;
  t.attn_window = cfg.attn_window;
  t.simd = cfg.simd;
  return t;
}

int sm_count() {
  int dev = 0, n = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  return n;
}

}  // namespace

bool gpu_codec_supported(const CodecSpec& spec) { return gpu_spec_stored(spec); }

int auto_split_tokens(int64_t base, int max_view, int64_t resident) {
  // A block's fixed cost in positions: loading the queries, writing its partial and its share of the merge.
  constexpr int64_t kBlockCost = 128;
  base = std::max<int64_t>(base, 1), resident = std::max<int64_t>(resident, 1), max_view = std::max(max_view, 1);
  const int max_splits = std::max(1, (max_view + 255) / 256);
  int best = 0, last = 0;
  int64_t best_time = 0;
  for (int s = 1; s <= max_splits; ++s) {
    const int split = ((max_view + s - 1) / s + 127) / 128 * 128;
    if (split == last) continue;
    last = split;
    const int64_t blocks = base * ((max_view + split - 1) / split);
    const int64_t waves = (blocks + resident - 1) / resident;
    const int64_t time = waves * (split + kBlockCost);
    if (best == 0 || time < best_time) best = split, best_time = time;  // ties keep the fewer splits
  }
  return best;
}

int window_blocks(const CacheGeometry& g, int64_t base, int64_t resident, int longest) {
  // A view's windows hold at most S0 + W + B - 1 positions (kv/cache.h), or `longest` (a frozen view's); a block takes
  // 64 of them per pass.
  const int most = std::max(1, (std::max(longest, g.sink + g.recent + g.block_tokens - 1) + 63) / 64);
  return int(std::clamp<int64_t>(resident / std::max<int64_t>(base, 1), 1, most));
}

namespace {

// The geometry of layer `layer` of a cache: its sizes copied from the layout (kv/cache_layout.h, the CPU cache's), the
// codec fields from the GPU codecs of what the layer stores (the config's, or bf16 rows for a skipped layer).
CacheGeometry geometry(const CacheLayout& l, const CacheConfig& cache_cfg, int max_ctx, int layer) {
  const CacheConfig cfg = l.skipped.has(layer) ? skipped_layer_config(cache_cfg) : cache_cfg;
  CacheGeometry g{};
  g.n_layers = l.n_layers, g.n_kv = l.n_kv, g.head_dim = uint16_t(l.head_dim);
  g.sink = l.sink, g.recent = l.recent, g.page_tokens = l.page_tokens;
  g.block_tokens = l.block_tokens;
  g.ring_tokens = l.ring_tokens;
  g.pages_per_seq = std::max(1, l.pages_per_seq(max_ctx));  // the page pool's block table width
  g.instance = gpu_instance(cfg, l.head_dim);
  if (g.instance >= 0) g.k_codec = kGpuInstances[g.instance].k, g.v_codec = kGpuInstances[g.instance].v;
  // The blocks are the CPU codecs' (the layout's): per-token rows, or per-channel key blocks of G tokens, so the pages
  // are byte-equal; a skipped layer stores bf16 rows.
  const bool skipped = l.skipped.has(layer);
  const CodecBlock k = skipped ? CodecBlock{1, l.skip_row} : l.k, v = skipped ? CodecBlock{1, l.skip_row} : l.v;
  g.k_block_tokens = k.tokens;
  g.k_block = int(k.bytes);
  g.k_row = k.tokens == 1 ? int(k.bytes) : 0;  // per-channel key blocks are addressed by block, never by row
  g.v_row = int(v.bytes);
  g.k_group = traits(cfg.k).grouped ? cfg.k.group : l.head_dim;
  g.v_group = traits(cfg.v).grouped ? cfg.v.group : l.head_dim;
  g.k_clip_index = clip_index(cfg.k), g.v_clip_index = clip_index(cfg.v);
  g.k_region = l.layer_k_region(layer);
  g.head_bytes = l.layer_head_bytes(layer);
  g.layer_offset = l.layer_offset(layer);
  g.page_bytes = l.page_bytes;
  g.scale_base = l.scale_offset(0);
  g.scale_region = l.scale_region;
  // vLLM's per-tensor FP8 scales (--kv-scales; 1 without: its default, and for every codec that takes none)
  g.k_scale = cfg.kv_scales ? cfg.kv_scales->k_scale.at(size_t(layer)) : 1.f;
  g.v_scale = cfg.kv_scales ? cfg.kv_scales->v_scale.at(size_t(layer)) : 1.f;
  // The windows, the same for every layer: bf16 rows, or int8 rows (KV4-RL: window_spec, the values' group) with the
  // ring slots' body rows after them
  g.window_row = int(l.window_row);
  g.ring_body = int(l.ring_body);
  const CodecSpec window = window_spec(cache_cfg, l.head_dim);
  g.window_group = traits(window).grouped ? window.group : l.head_dim;
  g.window_clip_index = clip_index(window);
  return g;
}

}  // namespace

CacheGeometry cache_geometry(const CacheConfig& cfg, int n_layers, int n_kv_heads, int max_ctx, int layer) {
  return geometry(kvq::cache_layout(cfg, n_layers, n_kv_heads, cfg.k.head_dim), cfg, max_ctx, layer);
}

struct GpuKvCache::Impl {
  CacheConfig cfg;
  int n_layers, n_kv, d, max_ctx;
  CacheLayout layout{};                 // sizes, as the CPU cache's (footprint() too)
  std::optional<PagePool> pool;         // pages, block tables ([slots][pages_per_seq], uploaded), slots, lengths
  std::vector<CacheGeometry> geo;       // [n_layers]: each layer's codecs, instance row and part of a page
  cudaStream_t stream = nullptr;
  int n_sms = 0;
  DeviceBuffer pages, page_table_dev;   // the pool (windows included) and its block tables
  DeviceBuffer window_base_dev;         // int64 [slots]: CacheGeometry::window_base
  bool table_dirty = false;             // the pool's block tables or windows changed since the last upload
  DeviceBuffer mu, rk, rv, rvt;
  std::unique_ptr<PrefixCache> prefix;  // null: prefix caching off
  bool own_stream = true;               // the stream is the cache's (else a caller's: not destroyed here)
  // exact-prompt and quantize-after-prompt (gpu_cache.h): the bf16 twin on this stream, and each slot's sequence in it
  // while its prompt is open (-1: no prompt open); step_exact: the open step's sequences read the twin.
  std::unique_ptr<GpuKvCache> exact;
  std::vector<int> exact_seq;
  bool step_exact = false;
  // quantize-after-prompt: each slot's frozen end (CacheGeometry::frozen_end; INT_MAX until its prompt ends), uploaded
  // with the tables; empty for the other policies.
  std::vector<int> frozen_end;
  DeviceBuffer frozen_end_dev;
  // evict (kv/evict.h; empty for the other policies), per slot: whether its prompt is open (its queries observed),
  // the last kEvictObserve of them ([n_layers][kEvictObserve][evict_heads][d] fp32, position p at row p %
  // kEvictObserve, allocated at its first attention) and the positions its eviction removed: the cache holds slots
  // [0, pool length), the sequence's positions run evicted further (length()).
  std::vector<char> evict_open;
  std::vector<DeviceBuffer> evict_obs;
  std::vector<int> evict_heads, evicted;
  bool step_observes = false;  // the open step observes queries of an evict prompt
  void observe_queries(int layer, const float* d_q, int n_heads);
  void evict(int seq);
  TransformPtrs tptrs{};
  DeviceBuffer k_table;                 // the key codec's device tables (CacheGeometry::k_table), or none
  DeviceBuffer k_rope;                  // keys stored without RoPE: every position's angles (CacheGeometry::k_rope)
  // The step.
  bool in_step = false;
  std::vector<int> step_seqs, step_n;
  std::vector<RowDesc> rows_host;       // [rows] then [demote items], each in round order
  int n_rows = 0, n_items = 0;
  DeviceBuffer desc;                    // RowDesc[rows + items]
  // The step's rounds (kv/cache_layout.h): round r appends and attends rows [r A, (r + 1) A) of each sequence's
  // chunk (A = layout.append_tokens), so the ring never holds more than one round beyond the window. Its rows are
  // desc[row0, row0 + n_rows), its demotion items desc[n_rows (the step's) + item0, ... + n_items). A step of one
  // round (every decode step) has the rows in step order.
  struct Round {
    int row0 = 0, n_rows = 0, item0 = 0, n_items = 0;
  };
  std::vector<Round> rounds;
  DeviceBuffer append_index;            // int[rows]: the step row (of k / v) of each desc row; steps of several rounds
  DeviceBuffer q_work, part_acc, part_ml;
  DeviceBuffer arrivals;                // int[decode rows][n_kv]: the fused merge's counts, zero between launches
  int split_tokens = 0;                 // 0 = automatic
  // The step's attention plan (plan_attention), one per round, the same for every layer: which rows take which kernel,
  // and each kernel's splits.
  struct Plan {
    int n_dec = 0;                      // rows of the decode kernels: all n_rows, or the subset decode_desc names
    bool dec_subset = false;            // some rows take the prefill kernel, or the step has several rounds: decode
                                        // rows from decode_desc / _index
    int split = 0, n_splits = 0;        // decode: positions per KV split, splits of the longest view
    int n_win = 1;                      // decode, tensor-core path: blocks per (row, kv head) over the bf16 windows
    int n_pf = 0, n_tiles = 0;          // prefill kernel: rows (prefill_index) and query tiles (prefill_tiles)
    int pf_split = 0, pf_splits = 0;    // prefill kernel: positions per KV split, splits of its longest view
    int dec_off = 0, tile_off = 0, pf_off = 0;  // the round's first entries of decode_desc / _index, prefill_tiles,
                                                // prefill_index
  };
  std::vector<Plan> plans;              // [rounds]
  int plan_heads = 0;                   // query heads `plans` is for; 0 = not planned yet this step
  int resident_heads = 0;               // n_heads that `resident` was measured for (0 = not yet)
  int64_t resident = 0;                 // attention blocks the GPU holds at once (SMs x blocks per SM)
  int64_t prefill_resident = 0;         // prefill blocks the GPU holds at once (0 = not measured yet)
  bool reference = false;
  bool prefill_ok = false;              // every layer's instance row has the prefill kernel (gpu_prefill_kernel), and
                                        // its tiles fit the GPU's shared memory
  int prefill_rows = kPrefillMinRows;   // set_prefill_rows
  int64_t prefill_calls = 0;
  DeviceBuffer decode_desc, decode_index, prefill_tiles, prefill_index;  // the kernels' rows of a mixed step

  int quant_end(int t) const { return layout.quant_end(t); }
  // The quantized end of slot seq's view at t (cuda::view_quant_end on the host's copy of the frozen ends).
  int view_quant_end(int seq, int t) const {
    return frozen_end.empty() ? quant_end(t) : std::min(quant_end(t), frozen_end[size_t(seq)]);
  }
  // Slot seq's windows in the pool (sinks [n_layers][2][n_kv][S0] rows, then the ring, rows of layout.window_row
  // bytes; with int8 windows then the ring slots' body rows: kv/cache_layout.h).
  uint8_t* windows(int seq) const { return pages.as<uint8_t>() + pool->window_offset(seq); }
  uint8_t* ring(int seq) const { return windows(seq) + layout.sink_bytes(); }
  // int8 windows: the body rows of ring slot 0 ([ring_tokens][ring_body] bytes).
  uint8_t* ring_body(int seq) const { return windows(seq) + layout.ring_body_offset(); }
  // The block tables and the windows' offsets (bytes) to the device.
  void upload_tables() {
    check(cudaMemcpyAsync(page_table_dev.get(), pool->table().data(), pool->table().size() * sizeof(int),
                          cudaMemcpyHostToDevice, stream),
          "page table upload");
    window_base_host.resize(size_t(pool->n_slots()));
    for (int s = 0; s < pool->n_slots(); ++s)
      window_base_host[size_t(s)] = pool->live(s) ? pool->window_offset(s) : -1;
    check(cudaMemcpyAsync(window_base_dev.get(), window_base_host.data(), window_base_host.size() * sizeof(int64_t),
                          cudaMemcpyHostToDevice, stream),
          "window table upload");
    if (!frozen_end.empty())
      check(cudaMemcpyAsync(frozen_end_dev.get(), frozen_end.data(), frozen_end.size() * sizeof(int),
                            cudaMemcpyHostToDevice, stream),
            "frozen ends upload");
    table_dirty = false;
  }
  std::vector<int64_t> window_base_host;  // the upload's source (pageable: read by the time cudaMemcpyAsync returns)
  const std::vector<Plan>& plan_attention(int n_heads);
  // The config's transform on the device (identity() = none).
  void upload_transform(const KvTransform& t);
  static void grow(DeviceBuffer& b, size_t bytes) {
    if (b.bytes() < bytes) b = DeviceBuffer(std::max(bytes, b.bytes() * 3 / 2));
  }
  void upload(DeviceBuffer& b, const void* host, size_t bytes) {
    grow(b, bytes);
    check(cudaMemcpyAsync(b.get(), host, bytes, cudaMemcpyHostToDevice, stream), "GPU KV cache: upload");
  }
};

CacheLayout GpuKvCache::layout_of(const CacheConfig& cfg, int n_layers, int n_kv_heads, int head_dim, int max_ctx) {
  check_config(cfg, head_dim);  // the instance table (cuda/gpu_instances.h)
  KVQ_CHECK(n_layers > 0 && n_kv_heads > 0, "GPU KV cache: n_layers {} and n_kv_heads {} must be > 0", n_layers,
            n_kv_heads);
  // The layout validates everything else (sizes, page size, windows) with the CPU cache's messages.
  CacheLayout layout = kvq::cache_layout(cfg, n_layers, n_kv_heads, head_dim);
  KVQ_CHECK(cfg.page_tokens % 8 == 0, "GPU KV cache: page size {} must be a multiple of 8 (aligned row loads)",
            cfg.page_tokens);
  // quantize-after-prompt: every row from a sequence's frozen end on stays a window row, read from the ring at
  // slot = position (the CPU's exact store), so the ring holds max_ctx rows.
  if (cfg.prompt_policy == PromptPolicy::kQuantizeAfterPrompt)
    layout.ring_tokens = std::max(layout.ring_tokens, max_ctx);
  return layout;
}

GpuKvCache::GpuKvCache(const CacheConfig& cfg, int n_layers, int n_kv_heads, int head_dim, int max_ctx, int max_seqs,
                       size_t budget_bytes, void* stream)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.cfg = cfg;
  m.n_layers = n_layers, m.n_kv = n_kv_heads, m.d = head_dim, m.max_ctx = max_ctx;
  m.layout = layout_of(cfg, n_layers, n_kv_heads, head_dim, max_ctx);
  const bool frozen = cfg.prompt_policy == PromptPolicy::kQuantizeAfterPrompt;
  KVQ_CHECK(max_ctx > 0 && (max_seqs > 0 || (max_seqs == 0 && budget_bytes > 0)),
            "GPU KV cache: bad sizes (ctx {}, seqs {})", max_ctx, max_seqs);
  m.pool.emplace(m.layout, max_ctx,
                 budget_bytes > 0 ? PagePool::for_budget(m.layout, max_ctx, max_seqs, budget_bytes)
                                  : PagePool::for_sequences(m.layout, max_ctx, max_seqs));
  require_device();

  m.geo.reserve(size_t(n_layers));
  for (int l = 0; l < n_layers; ++l) {
    const CacheGeometry& g = m.geo.emplace_back(geometry(m.layout, cfg, max_ctx, l));
    KVQ_CHECK(g.pages_per_seq == m.pool->table_width(), "GPU KV cache: layer {}: a block table of {} pages, the pool's "
              "has {} (internal)", l, g.pages_per_seq, m.pool->table_width());
  }

  const PagePool& pool = *m.pool;
  m.pages = DeviceBuffer(size_t(pool.n_pages()) * size_t(m.layout.page_bytes));
  m.page_table_dev = DeviceBuffer(pool.table().size() * sizeof(int));
  m.window_base_dev = DeviceBuffer(size_t(pool.n_slots()) * sizeof(int64_t));
  if (frozen) {
    m.frozen_end.assign(size_t(pool.n_slots()), std::numeric_limits<int>::max());
    m.frozen_end_dev = DeviceBuffer(m.frozen_end.size() * sizeof(int));
  }
  if (cfg.prompt_policy == PromptPolicy::kEvict) {
    const size_t slots = size_t(pool.n_slots());
    m.evict_open.assign(slots, 0), m.evict_obs.resize(slots);
    m.evict_heads.assign(slots, 0), m.evicted.assign(slots, 0);
  }
  m.own_stream = stream == nullptr;
  if (m.own_stream) check(cudaStreamCreate(&m.stream), "cudaStreamCreate");
  else m.stream = static_cast<cudaStream_t>(stream);
  // Zeroed storage: a stale row can never decode to NaN (windows are zeroed again when a sequence opens and closes,
  // new_sequence / free_sequence); the page table starts as all -1 (never read).
  check(cudaMemsetAsync(m.pages.get(), 0, m.pages.bytes(), m.stream), "cudaMemset pool");
  m.upload_tables();
  for (CacheGeometry& g : m.geo) {
    g.pool = m.pages.as<uint8_t>();
    g.window_base = m.window_base_dev.as<int64_t>();
    g.page_table = m.page_table_dev.as<int>();
    g.frozen_end = frozen ? m.frozen_end_dev.as<int>() : nullptr;
  }
  m.n_sms = sm_count();
  // (both also read, once and before any stream capture, the shared-memory layout of the code this GPU loaded)
  m.prefill_ok = std::all_of(m.geo.begin(), m.geo.end(), [](const CacheGeometry& g) {
    return attention_prefill_supported(g);
  });
  for (const CacheGeometry& g : m.geo) {
    attention_mma_supported(g);
    KVQ_CHECK(kGpuInstances[g.instance].path != GpuPath::kDecodedTile || tiles_aligned16(g),
              "GPU cache: the decoded-tile kernel copies tiles of 16 rows at 16-byte offsets, and this layout's "
              "pages of {} rows ({} bytes) do not keep them", g.page_tokens, g.page_bytes);
  }
  if (cfg.transform) m.upload_transform(*cfg.transform);
  // The tables the key codec decodes with (KvCodec::device_table: TurboQuant's codebook, PN-Mix's widths), the CPU
  // codecs' own, so both store the same codes: [n_layers][n_kv] of one size, layer l's geometry at its head 0 (the
  // kernels add head h's offset, dev::key_table); skipped (bf16) layers never read theirs.
  CodecSpec kspec = cfg.k;
  kspec.head_dim = head_dim;
  if (const std::vector<uint8_t> first = make_codec(kspec)->device_table(); !first.empty()) {
    const bool per_head = codec_traits(kspec.type).per_head;  // else every head's is the first
    std::vector<uint8_t> tables;
    tables.reserve(first.size() * size_t(n_layers) * size_t(n_kv_heads));
    for (int l = 0; l < n_layers; ++l)
      for (int h = 0; h < n_kv_heads; ++h) {
        CodecSpec head_spec = kspec;
        head_spec.layer = l, head_spec.kv_head = h;
        const std::vector<uint8_t> t = per_head ? make_codec(head_spec)->device_table() : first;
        KVQ_CHECK(t.size() == first.size(), "GPU KV cache: key tables of {} and {} bytes", t.size(), first.size());
        tables.insert(tables.end(), t.begin(), t.end());
      }
    m.upload(m.k_table, tables.data(), tables.size());
    check(cudaStreamSynchronize(m.stream), "GPU KV cache: key tables upload");  // tables goes away
    for (int l = 0; l < n_layers; ++l)
      m.geo[size_t(l)].k_table = m.k_table.as<uint8_t>() + size_t(l) * size_t(n_kv_heads) * first.size();
  }
  // Keys stored without RoPE (NexusQuant's): the cos / sin of every position, rope_angles' values as the CPU's
  // RopeKeyCodec tabulates them, so both undo and re-apply the same rotation. make_key_codec checks the frequencies
  // and refuses a key transform, as the CPU cache does.
  if (codec_traits(kspec.type).pre_rope_keys) {
    make_key_codec(cfg, head_dim);
    std::vector<float> angles(size_t(max_ctx) * size_t(head_dim));
    for (int pos = 0; pos < max_ctx; ++pos) {
      float* a = angles.data() + size_t(pos) * size_t(head_dim);
      rope_angles(pos, cfg.key_rope.data(), head_dim / 2, a, a + head_dim / 2);
    }
    m.upload(m.k_rope, angles.data(), angles.size() * sizeof(float));
    check(cudaStreamSynchronize(m.stream), "GPU KV cache: RoPE angles upload");  // angles goes away
    for (CacheGeometry& g : m.geo) g.k_rope = m.k_rope.as<float>();
  }
  if (cfg.prompt_policy == PromptPolicy::kExactPrompt || frozen) {  // a twin for every slot, at max_ctx
    m.exact = std::make_unique<GpuKvCache>(exact_twin_config(cfg, head_dim), n_layers, n_kv_heads, head_dim, max_ctx,
                                           pool.n_slots(), 0, m.stream);
    m.exact_seq.assign(size_t(pool.n_slots()), -1);
  }
  check(cudaStreamSynchronize(m.stream), "GPU KV cache: init");
}

GpuKvCache::~GpuKvCache() {
  if (impl_ && impl_->stream) {
    cudaStreamSynchronize(impl_->stream);
    impl_->exact.reset();
    if (impl_->own_stream) cudaStreamDestroy(impl_->stream);
  }
}

const CacheConfig& GpuKvCache::config() const { return impl_->cfg; }
int GpuKvCache::n_layers() const { return impl_->n_layers; }
int GpuKvCache::n_kv_heads() const { return impl_->n_kv; }
int GpuKvCache::head_dim() const { return impl_->d; }
int GpuKvCache::max_ctx() const { return impl_->max_ctx; }
int GpuKvCache::max_seqs() const { return impl_->pool->n_slots(); }
const PagePool& GpuKvCache::pool() const { return *impl_->pool; }
void* GpuKvCache::stream() const { return impl_->stream; }
int GpuKvCache::quant_end(int t) const { return impl_->quant_end(t); }
void GpuKvCache::set_split_tokens(int n) {
  KVQ_CHECK(n >= 0, "GPU KV cache: split tokens {} must be >= 0", n);
  impl_->split_tokens = (n + 127) / 128 * 128;
}
void GpuKvCache::set_reference_attention(bool on) { impl_->reference = on; }
void GpuKvCache::set_prefill_rows(int n) {
  KVQ_CHECK(n >= 0, "GPU KV cache: prefill rows {} must be >= 0 (0 = every chunk row by row)", n);
  impl_->prefill_rows = n;
  impl_->plan_heads = 0;  // the next attention() re-plans, also inside a step
}
int64_t GpuKvCache::prefill_kernel_calls() const { return impl_->prefill_calls; }
bool GpuKvCache::prefill_kernel_available() const { return impl_->prefill_ok; }

void GpuKvCache::Impl::upload_transform(const KvTransform& t) {
  Impl& m = *this;
  m.tptrs = TransformPtrs{};
  if (t.identity()) return;  // its shape was checked with the layout (kvq::cache_layout)
  const size_t rows = size_t(m.n_layers) * m.n_kv;
  auto put = [&](const std::vector<float>& src, size_t n, DeviceBuffer& dst, const char* what) -> const float* {
    if (src.empty()) return nullptr;
    KVQ_CHECK(src.size() == n, "GPU KV cache: transform {} holds {} floats, expected {}", what, src.size(), n);
    dst = DeviceBuffer(n * sizeof(float));
    check(cudaMemcpyAsync(dst.get(), src.data(), n * sizeof(float), cudaMemcpyHostToDevice, m.stream),
          "transform upload");
    return dst.as<float>();
  };
  m.tptrs.key_mean = put(t.key_mean, rows * m.d, m.mu, "key_mean");
  m.tptrs.r_k = put(t.r_k, rows * m.d * m.d, m.rk, "r_k");
  m.tptrs.r_v = put(t.r_v, rows * m.d * m.d, m.rv, "r_v");
  if (!t.r_v.empty()) {  // R_V^T for the merges' o R_V^T: a lane's column of R_V^T is a run of a row (coalesced)
    const size_t d = size_t(m.d);
    std::vector<float> rvt(t.r_v.size());
    for (size_t i = 0; i < rows; ++i)
      for (size_t a = 0; a < d; ++a)
        for (size_t b = 0; b < d; ++b) rvt[(i * d + b) * d + a] = t.r_v[(i * d + a) * d + b];
    m.tptrs.r_vt = put(rvt, rows * d * d, m.rvt, "r_v");
  }
  m.tptrs.k_hadamard = t.r_k.empty() ? 0 : t.k_hadamard;
  m.tptrs.v_hadamard = t.r_v.empty() ? 0 : t.v_hadamard;
  check(cudaStreamSynchronize(m.stream), "transform upload");  // the host vectors may go away
}

int GpuKvCache::new_sequence() {
  Impl& m = *impl_;
  const int seq = m.pool->open();
  // The window pages held body pages of other sequences: zeroed, so no unwritten ring row decodes to NaN.
  check(cudaMemsetAsync(m.windows(seq), 0, size_t(m.layout.window_bytes()), m.stream), "GPU KV cache: new windows");
  m.table_dirty = true;
  if (m.exact) m.exact_seq[size_t(seq)] = m.exact->new_sequence();  // its prompt opens
  if (!m.evicted.empty()) m.evict_open[size_t(seq)] = 1, m.evicted[size_t(seq)] = 0, m.evict_heads[size_t(seq)] = 0;
  return seq;
}

void GpuKvCache::free_sequence(int seq) {
  Impl& m = *impl_;
  KVQ_CHECK(seq >= 0 && seq < m.pool->n_slots() && m.pool->live(seq), "GPU KV cache: sequence {} is not live", seq);
  KVQ_CHECK(!m.in_step, "GPU KV cache: free_sequence inside a step");
  if (m.exact) end_prompt(seq);
  if (!m.frozen_end.empty()) m.frozen_end[size_t(seq)] = std::numeric_limits<int>::max();
  if (!m.evicted.empty()) m.evict_open[size_t(seq)] = 0, m.evict_obs[size_t(seq)] = {}, m.evicted[size_t(seq)] = 0;
  // Zeroed for the sequences whose body pages they become (stale bf16 bytes could read as NaN codes, e.g. FP8's). Not
  // checked: the engine frees sequences while it handles a failed step, and a device that fails here fails the next
  // step's first call, which reports it.
  (void)cudaMemsetAsync(m.windows(seq), 0, size_t(m.layout.window_bytes()), m.stream);
  m.pool->close(seq);
  m.table_dirty = true;
}

void GpuKvCache::end_prompt(int seq) {
  Impl& m = *impl_;
  KVQ_CHECK(seq >= 0 && seq < m.pool->n_slots() && m.pool->live(seq), "GPU KV cache: sequence {} is not live", seq);
  KVQ_CHECK(!m.in_step, "GPU KV cache: end_prompt inside a step");
  if (!m.evicted.empty() && m.evict_open[size_t(seq)]) return m.evict(seq);
  if (!m.exact || m.exact_seq[size_t(seq)] < 0) return;
  m.exact->free_sequence(m.exact_seq[size_t(seq)]);
  m.exact_seq[size_t(seq)] = -1;
  if (!m.frozen_end.empty()) {  // quantize-after-prompt: the quantized region stops at qe(P - 1)
    m.frozen_end[size_t(seq)] = m.quant_end(m.pool->length(seq) - 1);
    m.table_dirty = true;
  }
}

bool GpuKvCache::step_off_signature() const {
  return impl_->in_step && (impl_->step_exact || impl_->step_observes);
}

// At the end of seq's prompt of P tokens (kv/evict.h; the CPU's KvCache::evict): the scores of every prompt position
// of every (layer, kv head) on the device, the kept positions chosen on the host by the CPU's evict_keep (its ties),
// then every layer's kept rows compacted into slots [0, kept): the slot holds kept tokens, its positions run P - kept
// further.
void GpuKvCache::Impl::evict(int seq) {
  // the checks first: a refused eviction leaves the prompt open
  const int P = pool->length(seq);
  const int kept = evict_kept(cfg.evict_bits, int(8 * layout.window_row / d), P, cfg.evict_ctx, cfg.sink, cfg.recent);
  const int n_heads = evict_heads[size_t(seq)];
  KVQ_CHECK(kept == P || n_heads > 0,
            "GPU KV cache: evict: no prompt queries were observed (attention() of the prompt's rows)");
  evict_open[size_t(seq)] = 0;
  const DeviceBuffer obs = std::move(evict_obs[size_t(seq)]);
  if (kept == P) return;  // everything is kept, in place
  const size_t heads = size_t(n_layers) * n_kv, per_layer = size_t(kEvictObserve) * n_heads * d;
  const size_t scratch = size_t(std::min(P, kEvictObserve)) * n_kv * P * sizeof(double);
  DeviceBuffer p(scratch), part(scratch), scores(heads * P * sizeof(double));
  for (int l = 0; l < n_layers; ++l)
    check(launch_evict_scores(geo[size_t(l)], l, seq, P, obs.as<float>() + l * per_layer, n_heads,
                              1.f / std::sqrt(float(d)), p.as<double>(), part.as<double>(),
                              scores.as<double>() + l * n_kv * size_t(P), stream),
          "GPU KV cache: evict scores");
  std::vector<double> host(heads * P);
  check(cudaMemcpyAsync(host.data(), scores.get(), host.size() * sizeof(double), cudaMemcpyDeviceToHost, stream),
        "GPU KV cache: evict scores download");
  check(cudaStreamSynchronize(stream), "GPU KV cache: evict scores");
  std::vector<int> keep(heads * kept);
  for (size_t lh = 0; lh < heads; ++lh) {
    const std::vector<int> k =
        evict_keep(std::vector<double>(host.begin() + lh * P, host.begin() + (lh + 1) * P), cfg.sink, cfg.recent, kept);
    std::copy(k.begin(), k.end(), keep.begin() + lh * kept);
  }
  DeviceBuffer keep_dev(keep.size() * sizeof(int)), tmp(size_t(2) * n_kv * kept * d * sizeof(uint16_t));
  keep_dev.upload(keep.data(), keep.size() * sizeof(int));
  for (int l = 0; l < n_layers; ++l)
    check(launch_evict_compact(geo[size_t(l)], l, seq, P, keep_dev.as<int>() + l * n_kv * size_t(kept), kept,
                               tmp.as<uint16_t>(), stream),
          "GPU KV cache: evict compaction");
  check(cudaStreamSynchronize(stream), "GPU KV cache: evict compaction");
  pool->set_length(seq, kept);
  evicted[size_t(seq)] = P - kept;
}

// evict: the step's rows of sequences inside their prompts, the last kEvictObserve of each, into their observed
// queries (as KvCache::observe_queries keeps them; unscaled: the score kernel scales them).
void GpuKvCache::Impl::observe_queries(int layer, const float* d_q, int n_heads) {
  if (!step_observes) return;
  const size_t row = size_t(n_heads) * d;
  int row0 = 0;  // the step's rows are its sequences' in order
  for (size_t b = 0; b < step_seqs.size(); row0 += step_n[b], ++b) {
    const int s = step_seqs[b], n = step_n[b], pos0 = pool->length(s);
    if (!evict_open[size_t(s)]) continue;
    DeviceBuffer& obs = evict_obs[size_t(s)];
    if (evict_heads[size_t(s)] == 0) {
      obs = DeviceBuffer(size_t(n_layers) * kEvictObserve * row * sizeof(float));
      check(cudaMemsetAsync(obs.get(), 0, obs.bytes(), stream), "GPU KV cache: observed queries");
      evict_heads[size_t(s)] = n_heads;
    }
    KVQ_CHECK(evict_heads[size_t(s)] == n_heads, "GPU KV cache: {} query heads, the prompt's earlier steps had {}",
              n_heads, evict_heads[size_t(s)]);
    for (int i = std::max(0, n - kEvictObserve); i < n;) {  // runs of consecutive rows (two where they wrap)
      const int at = (pos0 + i) % kEvictObserve, run = std::min(n - i, kEvictObserve - at);
      check(cudaMemcpyAsync(obs.as<float>() + (size_t(layer) * kEvictObserve + at) * row, d_q + size_t(row0 + i) * row,
                            size_t(run) * row * sizeof(float), cudaMemcpyDeviceToDevice, stream),
            "GPU KV cache: observed queries");
      i += run;
    }
  }
}

void GpuKvCache::fork_sequence(int src, int dst) {
  Impl& m = *impl_;
  KVQ_CHECK(!m.in_step, "GPU KV cache: fork_sequence inside a step");
  KVQ_CHECK(src >= 0 && src < m.pool->n_slots() && m.pool->live(src), "GPU KV cache: sequence {} is not live", src);
  KVQ_CHECK((!m.exact || m.exact_seq[size_t(src)] < 0) && (m.evicted.empty() || !m.evict_open[size_t(src)]),
            "GPU KV cache: fork_sequence of a sequence whose prompt is open ({}: end_prompt first)",
            prompt_policy_name(m.cfg.prompt_policy));
  m.pool->fork(src, dst);
  if (m.exact) end_prompt(dst);  // dst holds src's cache, past its prompt: it reads the cache as stored
  if (!m.evicted.empty()) m.evict_open[size_t(dst)] = 0, m.evicted[size_t(dst)] = m.evicted[size_t(src)];
  if (!m.frozen_end.empty()) m.frozen_end[size_t(dst)] = m.frozen_end[size_t(src)];
  m.table_dirty = true;
  const size_t page = size_t(m.layout.page_bytes);
  for (int i = 0; i < m.pool->pages(src); ++i)
    check(cudaMemcpyAsync(m.pages.as<uint8_t>() + size_t(m.pool->page(dst, i)) * page,
                          m.pages.as<uint8_t>() + size_t(m.pool->page(src, i)) * page, page, cudaMemcpyDeviceToDevice,
                          m.stream),
          "GPU KV cache: fork pages");
  check(cudaMemcpyAsync(m.windows(dst), m.windows(src), size_t(m.layout.window_bytes()), cudaMemcpyDeviceToDevice,
                        m.stream),
        "GPU KV cache: fork windows");
}

namespace {
// The recent rows [r0, len) of every (layer, K / V, kv head) of one sequence's ring ([rows][ring_tokens] rows of `row`
// bytes) to or from host rows [rows][len - r0]: one strided copy per contiguous run of ring slots (two when they
// wrap). The ring slots' body rows of int8 windows ([ring_tokens] of `row` bytes) are the case rows = 1.
void copy_ring_rows(uint8_t* ring_slot, uint8_t* host, size_t slot_rows, size_t row, int ring_tokens, int r0, int len,
                    bool to_host, cudaStream_t stream) {
  for (int p = r0; p < len;) {
    const int slot = p % ring_tokens, n = std::min(len - p, ring_tokens - slot);
    uint8_t* dev = ring_slot + size_t(slot) * row;
    uint8_t* h = host + size_t(p - r0) * row;
    const size_t dev_pitch = size_t(ring_tokens) * row, host_pitch = size_t(len - r0) * row;
    check(to_host ? cudaMemcpy2DAsync(h, host_pitch, dev, dev_pitch, size_t(n) * row, slot_rows,
                                      cudaMemcpyDeviceToHost, stream)
                  : cudaMemcpy2DAsync(dev, dev_pitch, h, host_pitch, size_t(n) * row, slot_rows,
                                      cudaMemcpyHostToDevice, stream),
          "GPU KV cache: prefix ring rows");
    p += n;
  }
}
}  // namespace

void GpuKvCache::enable_prefix_cache(int64_t state_bytes) {
  Impl& m = *impl_;
  KVQ_CHECK(m.cfg.prompt_policy == PromptPolicy::kDecodeFaithful,
            "GPU KV cache: prefix caching needs the decode-faithful prompt policy, not '{}'",
            prompt_policy_name(m.cfg.prompt_policy));
  // The copied state lives in host memory: a quarter of the device pool's bytes, at most 4 GiB.
  if (state_bytes <= 0)
    state_bytes = std::clamp<int64_t>(int64_t(m.pool->bytes() / 4), int64_t(1) << 20, int64_t(4) << 30);
  const std::string d = fmt::format("{} page={} chunk={} shape={}x{}x{} gpu", m.cfg.describe(), m.cfg.page_tokens,
                                    m.cfg.max_chunk, m.n_layers, m.n_kv, m.d);
  uint64_t key = 1469598103934665603ull;
  for (unsigned char c : d) key = (key ^ c) * 1099511628211ull;
  m.prefix = std::make_unique<PrefixCache>(*m.pool, key, state_bytes);
}

int GpuKvCache::prefix_match(const int32_t* ids, int n, int step) const {
  const Impl& m = *impl_;
  return m.prefix && n > 1 ? m.prefix->longest(ids, n - 1, step) : 0;
}

void GpuKvCache::prefix_count(int hit_tokens, int miss_tokens) {
  if (impl_->prefix) impl_->prefix->count(hit_tokens, miss_tokens);
}

PrefixCacheStats GpuKvCache::prefix_stats() const {
  return impl_->prefix ? impl_->prefix->stats() : PrefixCacheStats{};
}

// The entry's state, as on the CPU (kv/cache.cpp): the slot's sinks | the partly filled last page (when there is one) |
// the recent rows [r0, len) of every (layer, K / V, kv head) | with int8 windows, their body rows
// [len - r0][ring_body].
void GpuKvCache::prefix_store(int seq, const int32_t* ids, int len) {
  Impl& m = *impl_;
  if (!m.prefix) return;
  KVQ_CHECK(!m.in_step && m.pool->live(seq) && len == m.pool->length(seq) && len > 0,
            "GPU KV cache: prefix_store of {} tokens of sequence {}, which holds {}", len, seq, m.pool->length(seq));
  if (m.prefix->contains(ids, len)) {
    m.prefix->find(ids, len);
    return;
  }
  // q: the quantized end; the ring holds [q, len) (nothing while len <= S0: every row is a sink).
  const int S0 = m.cfg.sink, P = m.cfg.page_tokens, q = std::max(S0, m.quant_end(len - 1)), r0 = len > S0 ? q : len;
  const int full = (q - S0) / P;
  const bool partial = (q - S0) % P != 0;
  const size_t slot_rows = size_t(m.n_layers) * 2 * m.n_kv, row = size_t(m.layout.window_row);
  const size_t sink = slot_rows * size_t(S0) * row, page = size_t(m.layout.page_bytes);
  const size_t body = size_t(m.layout.ring_body);
  std::vector<uint8_t> state(sink + (partial ? page : 0) + size_t(len - r0) * (slot_rows * row + body));
  uint8_t* out = state.data();
  if (sink > 0)
    check(cudaMemcpyAsync(out, m.windows(seq), sink, cudaMemcpyDeviceToHost, m.stream), "GPU KV cache: prefix sinks");
  out += sink;
  if (partial) {
    check(cudaMemcpyAsync(out, m.pages.as<uint8_t>() + size_t(m.pool->page(seq, full)) * page, page,
                          cudaMemcpyDeviceToHost, m.stream),
          "GPU KV cache: prefix page");
    out += page;
  }
  copy_ring_rows(m.ring(seq), out, slot_rows, row, m.layout.ring_tokens, r0, len, true, m.stream);
  out += slot_rows * size_t(len - r0) * row;
  if (body > 0) copy_ring_rows(m.ring_body(seq), out, 1, body, m.layout.ring_tokens, r0, len, true, m.stream);
  check(cudaStreamSynchronize(m.stream), "GPU KV cache: prefix store");
  std::vector<int> pages(static_cast<size_t>(full));
  for (int i = 0; i < full; ++i) pages[size_t(i)] = m.pool->page(seq, i);
  m.prefix->insert(ids, len, std::move(pages), std::move(state));
}

void GpuKvCache::prefix_attach(int seq, const int32_t* ids, int len) {
  Impl& m = *impl_;
  KVQ_CHECK(m.prefix, "GPU KV cache: prefix_attach without a prefix cache (enable_prefix_cache)");
  KVQ_CHECK(!m.in_step && m.pool->live(seq) && m.pool->length(seq) == 0 && m.pool->pages(seq) == 0,
            "GPU KV cache: prefix_attach into sequence {}, which is not new", seq);
  const PrefixCache::Entry* e = m.prefix->find(ids, len);
  KVQ_CHECK(e, "GPU KV cache: no cached prefix of {} tokens to attach", len);
  const std::vector<int> pages = e->pages;  // copies: taking the partial page may evict the entry
  const std::vector<uint8_t> state = e->state;
  for (int p : pages) m.pool->share(seq, p);
  const int S0 = m.cfg.sink, P = m.cfg.page_tokens, q = std::max(S0, m.quant_end(len - 1)), r0 = len > S0 ? q : len;
  const bool partial = (q - S0) % P != 0;
  const size_t slot_rows = size_t(m.n_layers) * 2 * m.n_kv, row = size_t(m.layout.window_row);
  const size_t sink = slot_rows * size_t(S0) * row, page = size_t(m.layout.page_bytes);
  const size_t body = size_t(m.layout.ring_body);
  const uint8_t* in = state.data();
  if (sink > 0)
    check(cudaMemcpyAsync(m.windows(seq), in, sink, cudaMemcpyHostToDevice, m.stream), "GPU KV cache: prefix sinks");
  in += sink;
  if (partial) {
    const int id = m.pool->take_page(seq);
    check(cudaMemcpyAsync(m.pages.as<uint8_t>() + size_t(id) * page, in, page, cudaMemcpyHostToDevice, m.stream),
          "GPU KV cache: prefix page");
    in += page;
  }
  copy_ring_rows(m.ring(seq), const_cast<uint8_t*>(in), slot_rows, row, m.layout.ring_tokens, r0, len, false,
                 m.stream);
  in += slot_rows * size_t(len - r0) * row;
  if (body > 0)
    copy_ring_rows(m.ring_body(seq), const_cast<uint8_t*>(in), 1, body, m.layout.ring_tokens, r0, len, false,
                   m.stream);
  check(cudaStreamSynchronize(m.stream), "GPU KV cache: prefix attach");  // `state` goes away here
  m.pool->set_length(seq, len);
  m.table_dirty = true;
}

int GpuKvCache::length(int seq) const {
  const Impl& m = *impl_;
  KVQ_CHECK(seq >= 0 && seq < m.pool->n_slots(), "GPU KV cache: no sequence {}", seq);
  return m.pool->length(seq) + (m.evicted.empty() ? 0 : m.evicted[size_t(seq)]);
}

void GpuKvCache::begin_step(const std::vector<int>& seqs, const std::vector<int>& n) {
  Impl& m = *impl_;
  KVQ_CHECK(!m.in_step, "GPU KV cache: begin_step while a step is open (commit_step first)");
  KVQ_CHECK(!seqs.empty() && seqs.size() == n.size(), "GPU KV cache: begin_step with {} sequences and {} counts",
            seqs.size(), n.size());
  // Validate everything before changing anything: here the step's shape, in the pool's reserve() the context and
  // the pages (all sequences' pages or none).
  std::set<int> seen;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int s = seqs[b];
    KVQ_CHECK(s >= 0 && s < m.pool->n_slots() && m.pool->live(s), "GPU KV cache: sequence {} is not live", s);
    KVQ_CHECK(seen.insert(s).second, "GPU KV cache: sequence {} appears twice in one step", s);
    KVQ_CHECK(n[b] >= 1 && n[b] <= m.cfg.max_chunk,
              "GPU KV cache: {} tokens for sequence {} (must be 1 .. the chunk size {})", n[b], s, m.cfg.max_chunk);
    // an evicted sequence's positions run past its slots (the pool checks the slots)
    const int end = length(s) + n[b];
    KVQ_CHECK(end <= m.max_ctx, "context overflow: {} tokens exceed the cache's context of {} tokens", end, m.max_ctx);
  }
  // exact-prompt, quantize-after-prompt: a step of sequences inside their prompts also appends to the twin, whose
  // attention it reads.
  std::vector<int> twin;
  for (int s : seqs)
    if (m.exact && m.exact_seq[size_t(s)] >= 0) twin.push_back(m.exact_seq[size_t(s)]);
  KVQ_CHECK(twin.empty() || twin.size() == seqs.size(),
            "GPU KV cache: {}: a step of {} sequences inside their prompts and {} after them (run them in separate "
            "steps)", prompt_policy_name(m.cfg.prompt_policy), twin.size(), seqs.size() - twin.size());
  if (!twin.empty()) m.exact->begin_step(twin, n);  // checks the twin's pool first (the same context)
  const int used = m.pool->used_pages();
  try {
    m.pool->reserve(seqs, n);
  } catch (...) {
    if (!twin.empty()) m.exact->abort_step();
    throw;
  }
  m.step_exact = !twin.empty();
  m.step_observes = std::any_of(seqs.begin(), seqs.end(), [&](int s) {
    return !m.evicted.empty() && m.evict_open[size_t(s)];
  });
  if (m.pool->used_pages() != used) m.table_dirty = true;
  m.rows_host.clear();
  std::vector<RowDesc> items;
  std::vector<int> step_row0(seqs.size()), act;
  int rounds = 0, row = 0;
  for (size_t b = 0; b < seqs.size(); ++b)
    step_row0[b] = row, row += n[b], rounds = std::max(rounds, m.layout.rounds(n[b]));
  m.rounds.assign(size_t(rounds), {});
  for (size_t r = 0; r < m.rounds.size(); ++r) {
    Impl::Round& rd = m.rounds[r];
    rd.row0 = int(m.rows_host.size()), rd.item0 = int(items.size());
    for (size_t b = 0; b < seqs.size(); ++b) {
      const auto [a, e] = m.layout.round_rows(n[b], int(r));
      if (a >= e) continue;
      const int s = seqs[b], len = m.pool->length(s);
      for (int i = a; i < e; ++i) m.rows_host.push_back({s, len + i}), act.push_back(step_row0[b] + i);
      // (a frozen view demotes nothing past its end: quantize-after-prompt after the prompt)
      for (int p = std::max(m.cfg.sink, m.view_quant_end(s, len + a - 1)); p < m.view_quant_end(s, len + e - 1); ++p)
        items.push_back({s, p});
    }
    rd.n_rows = int(m.rows_host.size()) - rd.row0, rd.n_items = int(items.size()) - rd.item0;
  }
  m.n_rows = int(m.rows_host.size());
  m.n_items = int(items.size());
  m.rows_host.insert(m.rows_host.end(), items.begin(), items.end());
  if (m.table_dirty) m.upload_tables();
  m.upload(m.desc, m.rows_host.data(), m.rows_host.size() * sizeof(RowDesc));
  if (m.rounds.size() > 1) m.upload(m.append_index, act.data(), act.size() * sizeof(int));
  m.step_seqs = seqs;
  m.step_n = n;
  m.plan_heads = 0;
  m.in_step = true;
}

int GpuKvCache::step_rows() const { return impl_->in_step ? impl_->n_rows : 0; }

void GpuKvCache::append(int layer, const float* d_k, const float* d_v) {
  Impl& m = *impl_;
  KVQ_CHECK(m.in_step, "GPU KV cache: append outside a step (begin_step first)");
  KVQ_CHECK(layer >= 0 && layer < m.n_layers, "GPU KV cache: layer {} of {}", layer, m.n_layers);
  for (size_t r = 0; r < m.rounds.size(); ++r) append_round(layer, d_k, d_v, int(r));
}

void GpuKvCache::append_round(int layer, const float* d_k, const float* d_v, int round) {
  Impl& m = *impl_;
  const Impl::Round& rd = m.rounds[size_t(round)];
  const RowDesc* rows = m.desc.as<RowDesc>();
  const int* act = m.rounds.size() > 1 ? m.append_index.as<int>() + rd.row0 : nullptr;
  const CacheGeometry& g = m.geo[size_t(layer)];
  check(launch_append_rows(g, layer, rows + rd.row0, act, rd.n_rows, d_k, d_v, m.tptrs, m.stream),
        "GPU KV cache: append kernel");
  check(launch_demote_rows(g, layer, rows + m.n_rows + rd.item0, rd.n_items, m.stream), "GPU KV cache: demote kernel");
  if (m.step_exact) m.exact->append_round(layer, d_k, d_v, round);  // the same rounds: the same chunk sizes
}

void GpuKvCache::append_and_attend(int layer, const float* d_k, const float* d_v, const float* d_q, int n_heads,
                                   float* d_out) {
  Impl& m = *impl_;
  KVQ_CHECK(m.in_step, "GPU KV cache: append outside a step (begin_step first)");
  KVQ_CHECK(layer >= 0 && layer < m.n_layers, "GPU KV cache: layer {} of {}", layer, m.n_layers);
  m.observe_queries(layer, d_q, n_heads);
  bool prefill = false;
  for (size_t r = 0; r < m.rounds.size(); ++r) {
    append_round(layer, d_k, d_v, int(r));
    prefill |= attention_round(layer, d_q, n_heads, d_out, int(r));
  }
  (m.step_exact ? *m.exact->impl_ : m).prefill_calls += prefill;  // counted by the cache whose rows it read
}

// Which rows take which kernel (the one dispatch point of attention()), the split sizes of each for the step's views
// and n_heads query heads, and scratch for their partials: one plan per round, the rows of every round in one upload.
const std::vector<GpuKvCache::Impl::Plan>& GpuKvCache::Impl::plan_attention(int n_heads) {
  KVQ_CHECK(in_step, "GPU KV cache: attention outside a step (begin_step first)");
  if (plan_heads == n_heads) return plans;
  KVQ_CHECK(n_heads >= n_kv && n_heads % n_kv == 0 && n_heads / n_kv <= kMaxGroupHeads,
            "GPU attention: {} query heads over {} kv heads is not supported (GQA group of 1 .. {})", n_heads, n_kv,
            kMaxGroupHeads);
  const int g = n_heads / n_kv;
  if (resident_heads != n_heads) {  // one plan for every layer: the fewest resident blocks of the layers' instances
    int per_sm = 0, last_instance = -2;
    for (const CacheGeometry& geo_l : geo) {
      if (geo_l.instance == last_instance) continue;
      int n = 0;
      check(attention_blocks_per_sm(geo_l, n_heads, &n), "GPU attention: occupancy query");
      per_sm = last_instance == -2 ? n : std::min(per_sm, n);
      last_instance = geo_l.instance;
    }
    resident = int64_t(std::max(per_sm, 1)) * n_sms;
    resident_heads = n_heads;
  }

  // The dispatch: a sequence whose round has >= prefill_rows rows takes the prefill kernel for them, the other rows
  // the decode kernels. A round's rows of sequence b are its step rows [row_b + a, row_b + e).
  std::vector<RowDesc> dec_rows;
  std::vector<int> dec_index, pf_index;
  std::vector<PrefillTile> tiles;
  const bool several = rounds.size() > 1;
  plans.assign(rounds.size(), Plan{});
  size_t parts = 0;  // partial slots x g of the largest launch (they run one after the other and share the scratch)
  int most_dec = 0;
  for (size_t r = 0; r < rounds.size(); ++r) {
    Plan& plan = plans[r];
    plan.dec_off = int(dec_rows.size()), plan.tile_off = int(tiles.size()), plan.pf_off = int(pf_index.size());
    int row = 0, dec_view = 0, pf_view = 0, dec_window = 0;
    for (size_t b = 0; b < step_seqs.size(); ++b) {
      const int s = step_seqs[b], nb = step_n[b];
      if (const auto [a, e] = layout.round_rows(nb, int(r)); a < e) {
        const int n = e - a, pos0 = pool->length(s) + a;
        if (prefill_ok && !reference && prefill_rows > 0 && n >= prefill_rows) {
          const int lrow0 = int(pf_index.size()) - plan.pf_off;
          for (int i = 0; i < n; ++i) pf_index.push_back(row + a + i);
          for (int r0 = 0; r0 < n * g; r0 += kPrefillTileRows) tiles.push_back({s, pos0, n, lrow0, r0});
          pf_view = std::max(pf_view, pos0 + n);
        } else {
          for (int i = 0; i < n; ++i) dec_rows.push_back({s, pos0 + i}), dec_index.push_back(row + a + i);
          dec_view = std::max(dec_view, pos0 + n);
          if (const int t = pos0 + n - 1; !frozen_end.empty())  // a frozen view's windows grow with the sequence
            dec_window = std::max(dec_window, std::min(cfg.sink, t + 1) + t + 1 -
                                                  std::max(cfg.sink, view_quant_end(s, t)));
        }
      }
      row += nb;
    }
    plan.n_dec = int(dec_rows.size()) - plan.dec_off;
    plan.n_tiles = int(tiles.size()) - plan.tile_off;
    plan.dec_subset = plan.n_dec > 0 && (several || plan.n_tiles > 0);
    most_dec = std::max(most_dec, plan.n_dec);
    if (plan.n_dec > 0) {
      const int64_t base = int64_t(plan.n_dec) * n_kv;  // (row, kv head) pairs
      const int n_win = window_blocks(geo[0], base, resident, dec_window);  // the windows: the same in every layer
      int split = split_tokens ? split_tokens : auto_split_tokens(base, dec_view, resident);
      split = std::max(split, (dec_view + 65534 - n_win) / (65535 - n_win));  // grid z = splits + n_win <= 65535
      split = (split + 127) / 128 * 128;
      plan.split = split;
      plan.n_splits = (dec_view + split - 1) / split;
      plan.n_win = n_win;
      parts = std::max(parts, size_t(base) * (plan.n_splits + n_win) * g);
    }
    if (plan.n_tiles > 0 && prefill_resident == 0) {
      int per_sm = 0;
      for (size_t l = 0; l < geo.size(); ++l) {
        int n = 0;
        check(attention_prefill_blocks_per_sm(geo[l], &n), "GPU prefill attention: occupancy query");
        per_sm = l == 0 ? n : std::min(per_sm, n);
      }
      prefill_resident = int64_t(std::max(per_sm, 1)) * n_sms;
    }
    if (plan.n_tiles > 0) {
      // Splits of >= 1024 positions while the grid holds fewer than two waves of blocks.
      const int64_t base = int64_t(plan.n_tiles) * n_kv;
      int64_t splits = 1;
      if (base < 2 * prefill_resident)
        splits = std::min<int64_t>((2 * prefill_resident + base - 1) / base, std::max(1, pf_view / 1024));
      int split = split_tokens ? split_tokens : int((pf_view + splits - 1) / splits);
      split = std::max(split, (pf_view + 65534) / 65535);  // grid z <= 65535
      split = (split + kPrefillKeys - 1) / kPrefillKeys * kPrefillKeys;
      plan.n_pf = int(pf_index.size()) - plan.pf_off;
      plan.pf_split = split;
      plan.pf_splits = (pf_view + split - 1) / split;
      parts = std::max(parts, size_t(plan.n_pf) * n_kv * plan.pf_splits * g);
    }
  }
  if (std::any_of(plans.begin(), plans.end(), [](const Plan& p) { return p.dec_subset; })) {
    upload(decode_desc, dec_rows.data(), dec_rows.size() * sizeof(RowDesc));
    upload(decode_index, dec_index.data(), dec_index.size() * sizeof(int));
  }
  if (!tiles.empty()) {
    upload(prefill_tiles, tiles.data(), tiles.size() * sizeof(PrefillTile));
    upload(prefill_index, pf_index.data(), pf_index.size() * sizeof(int));
  }
  grow(q_work, size_t(n_rows) * n_heads * size_t(d) * sizeof(float));
  grow(part_acc, parts * size_t(d) * sizeof(float));
  grow(part_ml, parts * 2 * sizeof(float));
  if (const size_t bytes = size_t(most_dec) * n_kv * sizeof(int); arrivals.bytes() < bytes) {
    grow(arrivals, bytes);
    check(cudaMemsetAsync(arrivals.get(), 0, arrivals.bytes(), stream), "cudaMemset arrivals");  // kept zero after
  }
  plan_heads = n_heads;
  return plans;
}

void GpuKvCache::attention(int layer, const float* d_q, int n_heads, float* d_out) {
  Impl& m = *impl_;
  KVQ_CHECK(m.in_step, "GPU KV cache: attention outside a step (begin_step first)");
  KVQ_CHECK(layer >= 0 && layer < m.n_layers, "GPU KV cache: layer {} of {}", layer, m.n_layers);
  KVQ_CHECK(m.rounds.size() == 1,
            "GPU KV cache: attention() after append() of chunks longer than the ring's {} rows: append_and_attend",
            m.layout.append_tokens);
  m.observe_queries(layer, d_q, n_heads);
  const bool prefill = attention_round(layer, d_q, n_heads, d_out, 0);
  (m.step_exact ? *m.exact->impl_ : m).prefill_calls += prefill;  // counted by the cache whose rows it read
}

bool GpuKvCache::attention_round(int layer, const float* d_q, int n_heads, float* d_out, int round) {
  Impl& m = *impl_;
  if (m.step_exact) return m.exact->attention_round(layer, d_q, n_heads, d_out, round);  // the prompt's exact rows
  const Impl::Plan& p = m.plan_attention(n_heads)[size_t(round)];
  const CacheGeometry& g = m.geo[size_t(layer)];
  AttentionLaunch base{};
  base.layer = layer;
  base.window = m.cfg.attn_window_of(layer);
  base.n_heads = n_heads;
  base.scale = 1.f / std::sqrt(float(m.d));
  base.q_work = m.q_work.as<float>();
  base.part_acc = m.part_acc.as<float>();
  base.part_ml = m.part_ml.as<float>();
  if (p.n_dec > 0) {  // the decode kernels: every row, or the rows of the step's short sequences
    AttentionLaunch a = base;
    a.n_rows = p.n_dec;
    a.rows = p.dec_subset ? m.decode_desc.as<RowDesc>() + p.dec_off : m.desc.as<RowDesc>();
    a.row_index = p.dec_subset ? m.decode_index.as<int>() + p.dec_off : nullptr;
    a.split_tokens = p.split;
    a.n_splits = p.n_splits;
    a.n_win = p.n_win;
    a.n_slots = p.n_splits;  // launch_attention adds the window slots when it takes the tensor-core path
    a.arrivals = m.arrivals.as<int>();  // used by the tensor-core path only
    check(launch_attention(g, a, m.tptrs, d_q, d_out, m.reference, m.stream), "GPU attention kernel");
  }
  if (p.n_tiles > 0) {  // the prefill kernel: the chunks of >= prefill_rows rows
    AttentionLaunch a = base;
    a.n_rows = p.n_pf;
    a.row_index = m.prefill_index.as<int>() + p.pf_off;
    a.tiles = m.prefill_tiles.as<PrefillTile>() + p.tile_off;
    a.n_tiles = p.n_tiles;
    a.split_tokens = p.pf_split;
    a.n_splits = a.n_slots = p.pf_splits;
    check(launch_attention_prefill(g, a, m.tptrs, d_q, d_out, m.stream), "GPU prefill attention kernel");
  }
  return p.n_tiles > 0;
}

GpuKvCache::StepSignature GpuKvCache::step_signature(int n_heads) {
  Impl& m = *impl_;
  KVQ_CHECK(m.rounds.size() == 1, "GPU KV cache: a step of {} rounds is not captured in a graph", m.rounds.size());
  const Impl::Plan& p = m.plan_attention(n_heads)[0];
  return {m.n_rows,        m.n_items,          n_heads,           p.split,           p.n_splits,
          p.n_win,         p.n_dec,            p.n_tiles,         p.pf_split,        p.pf_splits,
          m.reference,     m.desc.get(),       m.q_work.get(),    m.part_acc.get(),  m.part_ml.get(),
          m.arrivals.get(),   m.decode_desc.get(), m.decode_index.get(), m.prefill_tiles.get(), m.prefill_index.get(),
          m.tptrs.key_mean, m.tptrs.r_k,      m.tptrs.r_vt};
}

void GpuKvCache::commit_step() {
  Impl& m = *impl_;
  KVQ_CHECK(m.in_step, "GPU KV cache: commit_step without begin_step");
  for (size_t b = 0; b < m.step_seqs.size(); ++b) m.pool->commit(m.step_seqs[b], m.step_n[b]);
  if (m.step_exact) m.exact->commit_step();
  m.in_step = m.step_exact = m.step_observes = false;
  m.n_rows = m.n_items = 0;
}

void GpuKvCache::abort_step() {
  Impl& m = *impl_;
  if (m.step_exact) m.exact->abort_step();
  m.in_step = m.step_exact = m.step_observes = false;
  m.n_rows = m.n_items = 0;
  m.plan_heads = 0;
}

CacheFootprint GpuKvCache::footprint(int n_tokens) const { return impl_->layout.footprint(n_tokens); }
CacheFootprint GpuKvCache::footprint(int n_tokens, int prompt_tokens) const {
  return prompt_footprint(impl_->layout, impl_->cfg, n_tokens, prompt_tokens);
}

size_t GpuKvCache::bytes_allocated() const {
  const Impl& m = *impl_;
  return m.pages.bytes() + m.page_table_dev.bytes() + m.window_base_dev.bytes() +
         (m.exact ? m.exact->bytes_allocated() : 0);
}

size_t GpuKvCache::step_bytes_read(int layer) const {
  const Impl& m = *impl_;
  const CacheGeometry& g = m.geo.at(size_t(layer));
  const size_t window_row = size_t(g.window_row);
  size_t bytes = 0;
  for (int r = 0; r < m.n_rows; ++r) {
    const int t = m.rows_host[size_t(r)].pos;
    const int n_sink = std::min(m.cfg.sink, t + 1);
    const int n_quant = std::max(0, m.view_quant_end(m.rows_host[size_t(r)].seq, t) - m.cfg.sink);
    const int n_recent = t + 1 - n_sink - n_quant;
    // n_quant is a multiple of B, so of the K block's tokens; token-scaled keys read ν of every position too.
    const size_t quant = size_t(n_quant / g.k_block_tokens) * g.k_block + size_t(n_quant) * g.v_row +
                         (g.scale_region > 0 ? size_t(n_quant) * sizeof(float) : 0);
    bytes += size_t(m.n_kv) * (2 * window_row * size_t(n_sink + n_recent) + quant);
  }
  return bytes;
}

std::vector<float> GpuKvCache::download_scales(int seq, int layer, int pos0, int n) const {
  const Impl& m = *impl_;
  KVQ_CHECK(layer >= 0 && layer < m.n_layers, "GPU KV cache: download_scales of layer {} of {}", layer, m.n_layers);
  const CacheGeometry& g = m.geo[size_t(layer)];
  KVQ_CHECK(g.scale_region > 0, "GPU KV cache: download_scales of a cache whose keys are not token-scaled");
  KVQ_CHECK(seq >= 0 && seq < m.pool->n_slots() && m.pool->live(seq), "GPU KV cache: sequence {} is not live", seq);
  const int qe = m.view_quant_end(seq, m.pool->length(seq) - 1);
  KVQ_CHECK(layer >= 0 && layer < m.n_layers && pos0 >= g.sink && n >= 0 && pos0 + n <= qe,
            "GPU KV cache: download_scales(seq {}, layer {}, [{}, {})) outside the quantized region [{}, {})", seq,
            layer, pos0, pos0 + n, g.sink, qe);
  check(cudaStreamSynchronize(m.stream), "GPU KV cache: download_scales");
  std::vector<float> out(static_cast<size_t>(n));
  for (int p = pos0; p < pos0 + n; ++p) {
    const int q = p - g.sink;
    const size_t at = size_t(m.pool->page(seq, q / g.page_tokens)) * g.page_bytes + size_t(g.scale_base) +
                      size_t(layer) * g.scale_region + sizeof(float) * size_t(q % g.page_tokens);
    check(cudaMemcpy(&out[size_t(p - pos0)], m.pages.as<uint8_t>() + at, sizeof(float), cudaMemcpyDeviceToHost),
          "GPU KV cache: download_scales");
  }
  return out;
}

std::vector<uint8_t> GpuKvCache::download_rows(int seq, int layer, int kv_head, bool values, int pos0, int n) const {
  const Impl& m = *impl_;
  KVQ_CHECK(layer >= 0 && layer < m.n_layers, "GPU KV cache: download_rows of layer {} of {}", layer, m.n_layers);
  const CacheGeometry& g = m.geo[size_t(layer)];
  KVQ_CHECK(seq >= 0 && seq < m.pool->n_slots() && m.pool->live(seq), "GPU KV cache: sequence {} is not live", seq);
  const int len = m.pool->length(seq);
  KVQ_CHECK(layer >= 0 && layer < m.n_layers && kv_head >= 0 && kv_head < m.n_kv && pos0 >= 0 && n >= 0 &&
                pos0 + n <= len,
            "GPU KV cache: download_rows(seq {}, layer {}, head {}, [{}, {})) outside the cache (length {})", seq,
            layer, kv_head, pos0, pos0 + n, len);
  check(cudaStreamSynchronize(m.stream), "GPU KV cache: download_rows");
  const int kv = values ? 1 : 0, qe = m.view_quant_end(seq, len - 1);
  const size_t wrow = size_t(g.window_row);
  const size_t win_base = (size_t(layer) * 2 + kv) * g.n_kv + kv_head;  // the (layer, K / V, head) of a window
  const bool kivi = kv == 0 && kivi_keys(g);
  std::vector<uint8_t> out;
  for (int p = pos0; p < pos0 + n; ++p) {
    const uint8_t* src;
    size_t bytes;
    if (p < g.sink) {
      src = m.windows(seq) + (win_base * g.sink + p) * wrow, bytes = wrow;
    } else if (p < qe) {
      const int q = p - g.sink;
      const int page = m.pool->page(seq, q / g.page_tokens);
      const uint8_t* h =
          m.pages.as<uint8_t>() + size_t(page) * g.page_bytes + g.layer_offset + size_t(kv_head) * g.head_bytes;
      const int j = q % g.page_tokens;
      if (kivi) {  // the whole key block, once: at its first position, or at pos0 inside it
        if (p != pos0 && j % g.k_block_tokens != 0) continue;
        bytes = size_t(g.k_block);
        src = h + size_t(j / g.k_block_tokens) * bytes;
      } else {
        bytes = size_t(kv ? g.v_row : g.k_row);
        src = kv ? h + g.k_region + size_t(j) * bytes : h + size_t(j) * bytes;
      }
    } else {
      src = m.ring(seq) + (win_base * g.ring_tokens + p % g.ring_tokens) * wrow, bytes = wrow;
    }
    const size_t at = out.size();
    out.resize(at + bytes);
    check(cudaMemcpy(out.data() + at, src, bytes, cudaMemcpyDeviceToHost), "GPU KV cache: download_rows");
  }
  return out;
}

}  // namespace kvq::cuda
