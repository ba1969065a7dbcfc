#include "cli/options.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "codecs/llamacpp/attn_rot.h"
#include "codecs/fp8/fp8_scales.h"
#include "codecs/pnmix/pnmix_file.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "kv/codec_rope.h"
#include "rotation/hadamard.h"
#include "rotation/rotation_file.h"
#ifdef KVQ_HAVE_CUDA
#include "cuda/gpu_cache.h"
#include "cuda/gpu_instances.h"
#include "cuda/gpu_model.h"
#include "cuda/runtime.h"
#endif

namespace kvq::cli {

namespace {
constexpr uint64_t kDummyWeightsSeed = 0;  // --dummy-weights: one fixed seed, so runs time the same weights

// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read (then nothing is checked against it).
size_t available_host_bytes() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  std::fclose(f);
  return size_t(kib) * 1024;
}
}  // namespace

namespace {

// The key and value codec names of the flags: -ctk / -ctv, or --kv-cache-dtype's preset or codec (validated).
std::pair<std::string, std::string> codec_types(const CacheOptions& o) {
  for (const std::string* t : {&o.type_k, &o.type_v})
    KVQ_CHECK(!find_preset(*t), "--cache-type-{}: '{}' is a preset of keys and values: use --kv-cache-dtype {}",
              t == &o.type_k ? "k" : "v", *t, *t);
  const CodecPreset* preset = o.type_both.empty() ? nullptr : find_preset(o.type_both);
  KVQ_CHECK(o.type_both.empty() || preset || find_codec(o.type_both),
            "--kv-cache-dtype '{}' is neither a cache type ({}) nor a preset ({})", o.type_both, codec_names(", "),
            preset_names());
  if (preset) return {std::string(codec_traits(preset->k).name), std::string(codec_traits(preset->v).name)};
  KVQ_CHECK(o.type_both.empty() || !codec_traits(o.type_both).keys_only,
            "--kv-cache-dtype {0}: {0} stores keys only; name a value type too (-ctk {0} -ctv int2, or {0}:int2 in "
            "bench attention --caches)", o.type_both);
  if (!o.type_both.empty()) return {o.type_both, o.type_both};
  return {o.type_k, o.type_v};
}

}  // namespace

bool CacheOptions::default_group_used() const {
  const auto [tk, tv] = codec_types(*this);
  return group == 0 && (codec_traits(tk).grouped || codec_traits(tv).grouped);
}

CacheConfig CacheOptions::config(int head_dim) const {
  CacheConfig c;
  // --kv-cache-dtype: a preset (its key and value codecs) or one codec for both.
  const CodecPreset* preset = type_both.empty() ? nullptr : find_preset(type_both);
  const auto [tk, tv] = codec_types(*this);
  const CodecTraits &kt = codec_traits(tk), &vt = codec_traits(tv);
  KVQ_CHECK(group == 0 || kt.grouped || vt.grouped,
            "--kv-group {}: neither cache type ({}, {}) takes a group size (unquantized rows, or a format with its own "
            "groups)", group, kt.name, vt.name);
  // Not given: the largest supported group dividing head_dim (head_dim 80 has none: the grouped codecs refuse it).
  const int g = group > 0 ? group : default_group(head_dim) > 0 ? default_group(head_dim) : kDefaultGroup;
  c.k = codec_spec(tk, true, g, clip_k);
  c.v = codec_spec(tv, false, g, clip_v);
  c.sink = sink;
  c.recent = recent;
  c.page_tokens = page;
  c.demote_block = demote_block;  // checked against the codecs by the cache (kvq::cache_layout)
  c.max_chunk = chunk;
  c.skip_layers = parse_skip_layers(skip_layers);
  // --kv-window-type: the window codec (kv/cache.h). A preset that names its windows (KV4-RL) keeps them; a lossless
  // cache keeps lossless windows unless told otherwise.
  KVQ_CHECK(window_type.empty() || window_type == "bf16" || window_type == "int8",
            "--kv-window-type '{}' is not supported (bf16: BF16 sinks and recent window; int8: INT8 rows, KV4-RL)",
            window_type);
  const bool preset_window = preset && preset->window != CodecId::kBf16;
  KVQ_CHECK(window_type.empty() || !preset_window || window_type == codec_traits(preset->window).name,
            "--kv-window-type {} conflicts with --kv-cache-dtype {}: the preset keeps {} windows", window_type,
            type_both, codec_traits(preset ? preset->window : CodecId::kBf16).name);
  if (!window_type.empty()) c.window = window_type;
  else if (preset_window) c.window = std::string(codec_traits(preset->window).name);
  else if (kt.id == CodecId::kF32 && vt.id == CodecId::kF32) c.window = "f32";
  c.prompt_policy = parse_prompt_policy(prompt_policy);
  KVQ_CHECK((c.prompt_policy == PromptPolicy::kEvict) == (evict_bits != 0),
            "--evict-bits {} with --prompt-policy {}: the evict policy needs its bit budget (--evict-bits B, e.g. the "
            "quantized row's effective bits), the others take none", evict_bits, prompt_policy);
  KVQ_CHECK(c.prompt_policy == PromptPolicy::kEvict || evict_ctx == 0,
            "--evict-ctx {} with --prompt-policy {}: only the evict policy has a budget to state at a context",
            evict_ctx, prompt_policy);
  c.evict_bits = evict_bits;
  c.evict_ctx = evict_ctx;
  return c;
}

void add_model_options(CLI::App* cmd, ModelOptions& o) {
  cmd->add_option("-m,--model", o.dir, "Hugging Face checkpoint directory (config.json, safetensors, tokenizer.json)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("-t,--threads", o.threads, "worker threads (0: all cores)")->check(CLI::Range(0, 1024));
  add_simd_option(cmd, o.simd);
  add_dummy_weights_option(cmd, o);
}

void add_simd_option(CLI::App* cmd, std::string& level) {
  cmd->add_option("--simd", level, "CPU kernels' instruction set: scalar, avx2, avx512, avx512vnni (default: the "
                  "best this CPU has: " + std::string(simd_level_name(best_simd_level())) + "; a level it lacks is "
                  "an error)");
}

void add_dummy_weights_option(CLI::App* cmd, ModelOptions& o) {
  cmd->add_flag("--dummy-weights", o.dummy_weights,
                "random weights of config.json's shapes (transformers' init), generated where the model runs: no "
                "safetensors are read; timing only (bench decode, serve with token ids only, and info; the other "
                "commands refuse them)");
}

void require_checkpoint(const ModelOptions& o, std::string_view command) {
  KVQ_CHECK(!o.dummy_weights,
            "{}: --dummy-weights are random weights for timing only (kvq bench decode, kvq serve); {} needs a "
            "checkpoint's weights", command, command);
}

namespace {

// "int2 0.96, others 1": the codec table's default clips for keys or values, for the help text.
std::string clip_defaults(bool is_key) {
  std::string out;
  for (const CodecTraits& t : codec_table()) {
    const float c = is_key ? t.default_clip_k : t.default_clip_v;
    if (t.takes_clip && c < 1.0f) out += fmt::format("{} {:g}, ", t.name, c);
  }
  return out + "others 1 (plain min/max)";
}

}  // namespace

void add_cache_options(CLI::App* cmd, CacheOptions& o) {
  const std::string types = codec_names("|");
  cmd->add_option("--cache-type-k", o.type_k, "key cache type (" + types + "; alias -ctk)");
  cmd->add_option("--cache-type-v", o.type_v, "value cache type (" + types + "; alias -ctv)");
  cmd->add_option("--kv-cache-dtype", o.type_both,
                  "cache type for keys and values, or a preset of both: " + preset_names() +
                      " (presets imply their transform: no --rotation)");
  cmd->add_option("--kv-group", o.group, "values per scale/zero group (128, 64, 32; KIVI keys: tokens); default: the "
                  "largest of them that divides head_dim")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--kv-clip-k", o.clip_k, "key quantile clip ratio (default: the type's, " + clip_defaults(true) + ")")
      ->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--kv-clip-v", o.clip_v,
                  "value quantile clip ratio (default: the type's, " + clip_defaults(false) + ")")
      ->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--kv-sink", o.sink, "first tokens kept in the window type (attention sinks)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--kv-recent", o.recent, "most recent tokens kept in the window type")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--kv-window-type", o.window_type,
                  "codec of the sink and recent windows: bf16 (default) or int8 (8-bit codes per token, fp16 "
                  "scale/zero per --kv-group values; KV4-RL; on the GPU with int4 keys and values)");
  cmd->add_option("--kv-page", o.page, "tokens per cache page")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--kv-demote-block", o.demote_block,
                  "tokens that leave the recent window together and are quantized at once: a positive multiple of "
                  "the cache type's own block (default: that block; 1 for per-token rows, the group for per-channel "
                  "keys, 32 for oscar_int2); e.g. 256 with --kv-sink 0 --kv-recent 0 is OScaR's FP16 residual of the "
                  "newest n mod 256 tokens")
      ->check(CLI::Range(1, kMaxDemoteBlock));
  cmd->add_option("-b,--batch-size", o.chunk, "prefill chunk in tokens")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--rotation", o.rotation, "key/value rotation: none, hadamard (QuaRot), or a rotation file from "
                  "kvq calibrate");
  cmd->add_option("--pnmix", o.pnmix, "PN-Mix key widths for -ctk pnmix: a file from kvq calibrate --method pnmix "
                  "(checked against the model)");
  cmd->add_option("--kv-scales", o.kv_scales, "vLLM's per-tensor FP8 scales (k_scale, v_scale per layer) for an fp8 or "
                  "fp8_e5m2 cache: a file from kvq calibrate --method fp8-scales (default: vLLM's scale 1.0)");
  cmd->add_option("--kv-skip-layers", o.skip_layers,
                  "comma-separated layers that keep BF16 rows for everything (negative: from the end), e.g. 0,1,-2,-1 "
                  "(vLLM TurboQuant's boundary layers); counted in the effective bits");
  cmd->add_option("--attn-rot", o.attn_rot,
                  "llama.cpp's KV rotation, implied by its cache types (" +
                      codec_names_if([](const CodecTraits& t) { return t.transform == CodecTransform::kAttnRot; }) +
                      "): auto (as llama.cpp: keys when -ctk is one, values when -ctv is one, head_dim % 64 == 0) or "
                      "off (as llama.cpp's LLAMA_ATTN_ROT_DISABLE=1, which kvq also honours); default auto")
      ->check(CLI::IsMember({"auto", "off"}));
}

void add_prompt_options(CLI::App* cmd, CacheOptions& c, PromptLength& p) {
  cmd->add_option("--prompt-policy", c.prompt_policy,
                  "prefill semantics at the end of each window's prompt (METHODS §5 'as shipped'): decode-faithful "
                  "(default), exact-prompt (the prompt attends to its exact K/V), quantize-after-prompt (the prompt is "
                  "quantized once after prefill, later tokens stay bf16) or evict (keep sinks, recent window and the "
                  "top prompt tokens within --evict-bits; bf16 caches; on the GPU without a sliding window)");
  cmd->add_option("--evict-bits", c.evict_bits,
                  "evict: bits per element the cache may store at the context of --evict-ctx (a fraction bits/16 of "
                  "its BF16 bytes there, e.g. a quantized row's effective bits at that context); by default at the "
                  "prompt's end: the kept prompt tokens cost bits/16 of the prompt's BF16 bytes")
      ->check(CLI::Range(0.0, 16.0));
  cmd->add_option("--evict-ctx", c.evict_ctx,
                  "evict: the context N at which the bytes meet --evict-bits: every token after the prompt is kept, so "
                  "floor(bits N / 16) - (N - P) prompt tokens are (the referee's eviction row: N = the window; "
                  "default: the prompt's end)")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--prompt-tokens", p.tokens,
                  "tokens of each window that are the prompt: prefilled, then the prompt policy applies and only the "
                  "later targets are scored (0: none, every target scored)")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--prompt-fraction", p.fraction, "the prompt as a fraction of each window (instead of --prompt-tokens)")
      ->check(CLI::Range(0.0, 1.0));
}

void add_kv_budget_option(CLI::App* cmd, CacheOptions& o) {
  cmd->add_option("--kv-budget-gib", o.kv_budget_gib,
                  "KV cache memory in GiB (pages + per-sequence windows); sequences take pages as they grow. Default: "
                  "enough for every sequence at the full context on the CPU, 0.9 of the free memory on the GPU")
      ->check(CLI::PositiveNumber);
}

void add_device_options(CLI::App* cmd, ModelOptions& o) {
  cmd->add_option("--device", o.device, "where the model runs: cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--gpu-gemm", o.gpu_gemm, "GEMM inputs on the GPU: bf16 (fp32 accumulation) or fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  cmd->add_option("--cuda-graphs", o.cuda_graphs, "replay decode steps on the GPU as CUDA graphs: on or off")
      ->check(CLI::IsMember({"on", "off"}));
}

void add_fold_values_option(CLI::App* cmd, ModelOptions& o) {
  o.fold_values = true;
  cmd->add_option_function<std::string>(
         "--fold-values", [&o](const std::string& v) { o.fold_values = v == "on"; },
         "fold a value rotation (--rotation FILE or hadamard, or a cache type's own) into W_V / W_O once at load, so "
         "that steps skip it: on (default) or off. The cached values equal the unfolded ones up to one rounding of "
         "the folded weights to the checkpoint's dtype")
      ->check(CLI::IsMember({"on", "off"}));
}

void check_device_available(const ModelOptions& m) {
  KVQ_CHECK(m.device == "cpu" || m.device == "cuda", "--device '{}' is not supported (cpu or cuda)", m.device);
  if (m.device == "cpu") return;
#ifdef KVQ_HAVE_CUDA
  cuda::require_device();
  cuda::parse_gemm_precision(m.gpu_gemm);
#else
  KVQ_FAIL("--device cuda: this kvq was built without the CUDA backend (configure with -DKVQ_CUDA=ON and nvcc)");
#endif
}

void check_gpu_cache(const CacheConfig& cache, int head_dim) {
#ifdef KVQ_HAVE_CUDA
  const std::string why = cuda::gpu_unsupported(cache, head_dim);  // the instance table (cuda/gpu_instances.h)
  KVQ_CHECK(why.empty(), "--device cuda: cache {} is not supported on the GPU: {}", cache.describe(), why);
#endif
}

namespace {

// --device cuda: a device and a GPU-supported cache, checked before any weights are read.
void check_device(const ModelOptions& m, const CacheConfig& cache, int head_dim) {
  check_device_available(m);
  if (m.device == "cpu") return;
  check_gpu_cache(cache, head_dim);
}

// Whether llama.cpp's KV rotation (codecs/llamacpp/attn_rot.h), which its cache types imply, is on: yes unless
// --attn-rot off or llama.cpp's own switch LLAMA_ATTN_ROT_DISABLE (read once here, as llama.cpp reads it once per
// cache) says off; --attn-rot auto against that switch is an error (never a silent override).
bool attn_rot_on(const CacheOptions& c) {
  const char* env = std::getenv("LLAMA_ATTN_ROT_DISABLE");
  const bool env_off = env != nullptr && std::atoi(env) != 0;
  KVQ_CHECK(!(env_off && c.attn_rot == "auto"),
            "--attn-rot auto conflicts with LLAMA_ATTN_ROT_DISABLE={} in the environment (llama.cpp's switch, which "
            "kvq honours): unset it or drop --attn-rot auto",
            env);
  return c.attn_rot != "off" && !env_off;
}

// The widths of -ctk pnmix from --pnmix FILE, checked against the model (kvq::Error naming what does not fit).
std::shared_ptr<const PairBitTable> pnmix_widths(const ModelOptions& m, const CacheOptions& c, const CacheConfig& cache,
                                                 const ModelConfig& mc) {
  KVQ_CHECK(codec_traits(cache.k.type).per_head, "--pnmix {}: the file holds the key widths of -ctk pnmix, the key "
            "cache type is {}", c.pnmix, cache.k.type);
  KVQ_CHECK(!c.pnmix.empty(), "-ctk {} needs --pnmix FILE: the key widths from kvq calibrate --method pnmix",
            cache.k.type);
  KVQ_CHECK(!m.dummy_weights, "--pnmix {}: a PN-Mix file is calibrated for a checkpoint's weights, not "
            "--dummy-weights", c.pnmix);
  PnmixFile f = load_pnmix_file(c.pnmix);
  check_pnmix_fits(f, Checkpoint::open(m.dir).fingerprint(), mc.n_layers, mc.n_kv_heads, mc.head_dim);
  return std::make_shared<const PairBitTable>(std::move(f.table));
}

// Logs the attn_rot decision of a cache whose types imply it, as llama.cpp logs attn_rot_k / attn_rot_v.
void log_attn_rot(const CacheOptions& c, const CacheConfig& cache, int head_dim, bool on) {
  if (on)
    std::fprintf(stderr, "kvq: attn_rot (llama.cpp's KV rotation): %s (head_dim %d; --attn-rot off disables)\n",
                 attn_rot_for(cache, head_dim).describe().c_str(), head_dim);
  else
    std::fprintf(stderr, "kvq: attn_rot (llama.cpp's KV rotation) off: %s\n",
                 c.attn_rot == "off" ? "--attn-rot off" : "LLAMA_ATTN_ROT_DISABLE in the environment");
}

// --fold-values on: the cache's value rotation folded into the model's W_V / W_O (once; logged when it is done).
void fold_values(Model& model, const std::shared_ptr<const KvTransform>& t) {
  if (!t || t->r_v.empty() || model.value_fold(t.get())) return;
  const ValueFold* f = model.fold_value_rotation(t);
  std::fprintf(stderr,
               "kvq: value rotation '%s' folded into W_V / W_O (%.1f MiB, %.2f s): steps skip it; cached values equal "
               "the unfolded ones up to one rounding of those weights (--fold-values off: rotate per step)\n",
               t->name.c_str(), double(f->bytes) / double(1 << 20), f->seconds);
}

}  // namespace

std::unique_ptr<Runner> make_runner(Model& model, const ModelOptions& o, const Plan& p, int max_ctx, int max_seqs) {
  check_device(o, p.cache, p.model.head_dim);
  if (o.fold_values) fold_values(model, p.cache.transform);
  if (o.device == "cpu") return std::make_unique<CpuRunner>(model, p.cache, max_ctx, max_seqs, p.kv_budget_bytes);
#ifdef KVQ_HAVE_CUDA
  auto g = std::make_unique<cuda::GpuModel>(model, p.cache, max_ctx, max_seqs, cuda::parse_gemm_precision(o.gpu_gemm),
                                            p.kv_budget_bytes);
  g->set_cuda_graphs(o.cuda_graphs == "on");
  return g;
#else
  KVQ_FAIL("--device cuda: this kvq was built without the CUDA backend");
#endif
}

std::unique_ptr<Runner> make_runner(ModelSource& model, const ModelOptions& o, const Plan& p, int max_ctx,
                                    int max_seqs) {
  if (model.host) return make_runner(*model.host, o, p, max_ctx, max_seqs);
  check_device(o, p.cache, p.model.head_dim);
  KVQ_CHECK(o.device == "cuda", "internal: dummy weights without a host model on --device {}", o.device);
  CacheConfig cache = p.cache;
  if (o.fold_values && cache.transform && !cache.transform->r_v.empty()) {
    // Dummy weights are i.i.d. N(0, σ²): W_V and W_O rotated by orthogonal matrices are another draw of the same
    // weights, so the fold leaves them as generated and the steps skip the value rotation, as a folded model's do.
    std::fprintf(stderr, "kvq: value rotation '%s' folded (dummy weights: rotated i.i.d. weights are another draw of "
                 "them, so they stay as generated): steps skip it (--fold-values off: rotate per step)\n",
                 cache.transform->name.c_str());
    cache.transform = without_value_rotation(*cache.transform);
  }
#ifdef KVQ_HAVE_CUDA
  auto g = std::make_unique<cuda::GpuModel>(model.config, cuda::DeviceDummyWeights{model.seed}, cache, max_ctx,
                                            max_seqs, cuda::parse_gemm_precision(o.gpu_gemm), p.kv_budget_bytes);
  g->set_cuda_graphs(o.cuda_graphs == "on");
  return g;
#else
  KVQ_FAIL("--device cuda: this kvq was built without the CUDA backend");
#endif
}

RunnerFactory make_runner_factory(Model& model, const ModelOptions& o) {
  if (o.device == "cpu") return cpu_runner_factory(model);
  check_device_available(o);  // each cache is checked when its runner is built
  return [&model, o](const CacheConfig& cache, int max_ctx) {
    Plan p;
    p.model = model.config();
    p.cache = cache;
    return make_runner(model, o, p, max_ctx);
  };
}

void log_runner(const Runner& r, const char* what) {
  const CacheFootprint f = r.footprint(r.max_ctx());
  const PagePool& pool = r.page_pool();
  const CacheLayout& l = pool.layout();
  const double mib = double(1 << 20);
  std::fprintf(stderr,
               "kvq: %s %s | KV cache %s: %.1f MiB: pool of %d pages x %d tokens (a sequence's windows take %d of "
               "them, %.1f MiB), holds %d x %d tokens, %.2f effective bits/element at %d\n",
               what, r.describe().c_str(), r.cache_config().describe().c_str(), double(r.cache_bytes()) / mib,
               pool.n_pages(), l.page_tokens, l.window_pages(), double(l.window_pages()) * double(l.page_bytes) / mib,
               pool.sequences_at(r.max_ctx()), r.max_ctx(), f.bits_per_element, r.max_ctx());
}

Plan plan(const ModelOptions& m, const CacheOptions& c, int ctx_request, bool beyond_trained_ctx) {
  Plan p;
  p.model = ModelConfig::load(m.dir + "/config.json");
  KVQ_CHECK(ctx_request >= 0, "context {} must be positive", ctx_request);
  KVQ_CHECK(beyond_trained_ctx || ctx_request <= p.model.max_ctx,
            "context {} exceeds the model's maximum of {} tokens", ctx_request, p.model.max_ctx);
  p.ctx = ctx_request > 0 ? ctx_request : p.model.max_ctx;
  p.cache = c.config(p.model.head_dim);
  p.cache.simd = parse_simd_level(m.simd);  // an unknown level, or one this CPU lacks: one line before any work
  p.cache.key_rope = p.model.rope_inv_freq();  // for key codecs that store keys without RoPE (kv/codec_rope.h)
  p.cache.attn_window = p.model.layer_window;  // sliding-window attention (Mistral): the cache reads through it
  p.kv_budget_bytes = size_t(c.kv_budget_gib * double(1ull << 30));
  const ModelConfig& mc = p.model;
  if (!c.pnmix.empty() || codec_traits(p.cache.k.type).per_head) p.cache.k.pair_bits = pnmix_widths(m, c, p.cache, mc);
  if (!c.kv_scales.empty()) {  // the cache checks the types and format when the probe below builds it
    KVQ_CHECK(c.rotation == "none", "--kv-scales {}: vLLM's per-tensor FP8 scales take no --rotation (they were "
              "calibrated on the model's own keys and values)", c.kv_scales);
    auto scales = std::make_shared<Fp8Scales>(load_fp8_scales(c.kv_scales));
    check_fp8_scales_fit(*scales, m.dummy_weights ? "" : Checkpoint::open(m.dir).fingerprint(), mc.n_layers);
    p.cache.kv_scales = std::move(scales);
  }
  // The transform the codecs imply (the codec table's transform column: TurboQuant's Hadamard on keys, OScaR's on keys
  // and values, llama.cpp's attn_rot unless --attn-rot off), built once; another --rotation would replace it.
  const bool llama_rot = implied_transform(p.cache.k, p.cache.v) == CodecTransform::kAttnRot, attn_rot = attn_rot_on(c);
  std::shared_ptr<const KvTransform> implied =
      llama_rot && !attn_rot ? nullptr : codec_transform(p.cache, mc.n_layers, mc.n_kv_heads, mc.head_dim);
  {  // builds the codecs (with that transform) and resolves the skipped layers: names what's unsupported
    CacheConfig probe_cfg = p.cache;
    probe_cfg.transform = implied;
    KvCache probe(probe_cfg, mc.n_layers, mc.n_kv_heads, mc.head_dim, 1);
  }
  // --device cuda without a device or with a CPU-only cache: refused before any work.
  check_device(m, p.cache, p.model.head_dim);
  if (implied) {
    KVQ_CHECK(c.rotation == "none",
              "--rotation {} conflicts with cache types k={} v={}{}: they imply their own transform ({}); drop "
              "--rotation{}", c.rotation, p.cache.k.type, p.cache.v.type,
              c.type_both.empty() ? "" : " (--kv-cache-dtype " + c.type_both + ")", implied->name,
              llama_rot ? " or give --attn-rot off" : "");
    p.cache.transform = std::move(implied);
  } else if (c.rotation == "hadamard") {
    KVQ_CHECK(is_power_of_two(mc.head_dim), "--rotation hadamard needs a power-of-two head_dim (model has {})",
              mc.head_dim);
    p.cache.transform = std::make_shared<KvTransform>(hadamard_transform(mc.n_layers, mc.n_kv_heads, mc.head_dim));
  } else if (c.rotation == "random") {
    KVQ_CHECK(c.random_rotation, "--rotation random is a timing stand-in for a rotation file: kvq bench decode only");
    p.cache.transform =
        std::make_shared<KvTransform>(random_rotation_transform(mc.n_layers, mc.n_kv_heads, mc.head_dim, 0));
  } else if (c.rotation != "none") {
    KVQ_CHECK(!m.dummy_weights, "--rotation {}: a rotation file is calibrated for a checkpoint's weights; with "
              "--dummy-weights use none or hadamard", c.rotation);
    RotationFile f = load_rotation_file(c.rotation);
    check_rotation_fits(f, Checkpoint::open(m.dir).fingerprint(), mc.n_layers, mc.n_kv_heads, mc.head_dim, p.cache);
    p.cache.transform = std::make_shared<KvTransform>(std::move(f.transform));
  }
  make_key_codec(p.cache, mc.head_dim);  // keys stored without RoPE refuse a key-side transform before any work
  if (llama_rot) log_attn_rot(c, p.cache, mc.head_dim, attn_rot);
  if (c.default_group_used()) p.default_group = p.cache.v.group;
  return p;
}

Tokenizer load_tokenizer(const ModelOptions& o) { return Tokenizer::load(o.dir + "/tokenizer.json"); }

namespace {

// The group the cache took by default, once the command's checks passed (so that a bad input stays one error line).
void log_default_group(const Plan& p) {
  if (p.default_group > 0)
    std::fprintf(stderr, "kvq: --kv-group %d (the default: the largest of 128, 64, 32 that divides head_dim %d)\n",
                 p.default_group, p.model.head_dim);
}

}  // namespace

std::unique_ptr<Model> load_model(const ModelOptions& o, const Plan& p) {
  KVQ_CHECK(!o.dummy_weights, "internal: --dummy-weights reached load_model (use load_model_source)");
  log_default_group(p);
  auto m = Model::load(o.dir, o.threads, parse_simd_level(o.simd));
  std::fprintf(stderr, "kvq: loaded %s: %s, %zu parameters, %d threads, %.2f s\n", o.dir.c_str(),
               std::string(arch_name(m->config().arch)).c_str(), m->weights().n_params, m->pool().size(),
               m->load_seconds());
  return m;
}

ModelSource load_model_source(const ModelOptions& o, const Plan& p) {
  ModelSource m;
  m.config = p.model;
  if (!o.dummy_weights) {
    m.host = load_model(o, p);
    return m;
  }
  log_default_group(p);
  m.dummy = true;
  m.seed = kDummyWeightsSeed;
  const ModelConfig& c = p.model;
  const std::string what = fmt::format("{}, {} parameters ~ N(0, {:g}^2), norms 1 (seed {})", arch_name(c.arch),
                                       model_params(c), c.initializer_range, m.seed);
  if (o.device == "cpu") {
    // The CPU model holds its dummy weights in bf16, generated in place (model/weights.h): 2 bytes a parameter of
    // the matrices. Refused up front rather than found out by the kernel's OOM killer after minutes of generation.
    const double need = double(model_matrix_bytes(c, 2)), avail = double(available_host_bytes()), gib = 1ull << 30;
    KVQ_CHECK(avail == 0 || need < avail,
              "--dummy-weights --device cpu: {}'s {} parameters take ~{:.1f} GiB of host memory (bf16), {:.1f} GiB "
              "are available; use a smaller config or --device cuda", o.dir, model_params(c), need / gib,
              avail / gib);
    m.host = Model::dummy(o.dir, c, m.seed, o.threads, parse_simd_level(o.simd));
    fmt::print(stderr,
               "kvq: dummy weights for {}: {}, generated in host memory on {} threads in {:.2f} s: timing only\n",
               o.dir, what, m.host->pool().size(), m.host->load_seconds());
  } else {
    fmt::print(stderr, "kvq: dummy weights for {}: {}, generated in device memory by each runner: timing only\n",
               o.dir, what);
  }
  return m;
}

std::vector<std::string> expand_aliases(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-ctk") a = "--cache-type-k";
    else if (a == "-ctv") a = "--cache-type-v";
    else if (a == "-np") a = "--parallel";
    args.push_back(a);
  }
  return args;
}

void log_cache(const KvCache& cache, const char* what) {
  const CacheFootprint f = cache.footprint(cache.max_ctx());
  std::fprintf(stderr, "kvq: %s KV cache %s: %.1f MiB for %d tokens, %.2f effective bits/element at %d\n", what,
               cache.config().describe().c_str(), double(cache.bytes_allocated()) / (1 << 20),
               cache.token_capacity(), f.bits_per_element, cache.max_ctx());
}

}  // namespace kvq::cli
