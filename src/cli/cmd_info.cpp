// kvq info: architecture, sizes, the KV-cache accounting (bytes stored per token, effective bits) and the memory plan
// (model/memory_plan.h), all before any weight is read.
#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "codecs/support_matrix.h"
#include "common/error.h"
#include "model/memory_plan.h"

namespace kvq::cli {

namespace {

struct InfoOptions {
  ModelOptions model;
  CacheOptions cache;
  int ctx = 0;
  int parallel = 1;  // -np: sequences the memory plan holds
  bool json = false;
  bool codecs = false;  // --codecs: the support matrix, no model
  bool markdown = false;  // --codecs --markdown: docs/guide/codecs.md
};

// kvq info --codecs: the codec table's support matrix (codecs/support_matrix.h), as a table, JSON rows or the
// markdown page docs/guide/codecs.md.
void print_codecs(bool as_json, bool markdown) {
  if (markdown) {
    std::printf("%s", support_markdown().c_str());
    return;
  }
  const std::vector<SupportRow> rows = support_matrix();
  if (!as_json) {
    std::printf("%s\n--kv-cache-dtype presets (a key and a value codec and the windows' codec; bytes and bits of the "
                "two codecs, windows counted by kvq info -m DIR -c N):\n%s",
                format_support_matrix(rows).c_str(), format_preset_matrix(preset_matrix()).c_str());
    return;
  }
  nlohmann::json j = nlohmann::json::array();
  for (const SupportRow& r : rows)
    j.push_back({{"codec", r.codec}, {"kv", r.role}, {"head_dim", r.head_dim}, {"group", r.group},
                 {"bytes_per_token", r.bytes_per_token}, {"bits", r.bits}, {"cpu", r.cpu},
                 {"cuda", r.cuda.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.cuda)}});
  std::printf("%s\n", j.dump().c_str());
}

// The memory plan (model/memory_plan.h), one line a part.
void print_plan(const MemoryPlan& mp, const InfoOptions& o, int ctx, int chunk) {
  const bool cuda = mp.device == PlanDevice::kCuda;
  const auto b = [](size_t x) { return format_bytes(double(x)); };
  std::printf("memory plan  --device %s, %d sequence%s of %d tokens, prefill chunks of %d\n", cuda ? "cuda" : "cpu",
              o.parallel, o.parallel == 1 ? "" : "s", ctx, chunk);
  if (o.model.dummy_weights || mp.page_cache_bytes == 0)
    std::printf("  weights              %s bf16 dummy weights generated in %s + %s of fp32 norms and biases\n",
                b(mp.matrix_bytes).c_str(), cuda ? "device memory" : "host memory", b(mp.vector_bytes).c_str());
  else
    std::printf("  weights              %s %s matrices, %s + %s of fp32 norms and biases\n", b(mp.matrix_bytes).c_str(),
                mp.weight_dtype.c_str(),
                cuda ? "read once from the mapping through pinned staging, then released"
                     : "read in place from the checkpoint's mapping (page cache)",
                b(mp.vector_bytes).c_str());
  std::printf("  KV pool              %s of pages, of which %s hold the sinks and recent rings of %d running "
              "sequence%s\n", b(mp.kv_pool_bytes).c_str(), b(mp.kv_window_bytes).c_str(), o.parallel,
              o.parallel == 1 ? "" : "s");
  std::printf("  activations          %s (%s)\n", b(mp.activation_bytes).c_str(),
              cuda ? "a step's buffers at its smallest row count, cuBLAS workspace"
                   : "a prefill chunk's buffers and logits, the GEMM tile");
  if (mp.fold_bytes > 0)
    std::printf("  value fold           %s (W_V / W_O with the value rotation folded in, in host memory: run, serve, "
                "bench decode; --fold-values off: none)\n", b(mp.fold_bytes).c_str());
  if (cuda)
    std::printf("  device               %s: weights %s (%s GEMMs) + KV pool + activations\n",
                b(mp.device_bytes).c_str(), b(mp.device_weight_bytes).c_str(), o.model.gpu_gemm.c_str());
  std::printf("  host                 %s of the process's own%s\n", b(mp.host_bytes).c_str(),
              mp.page_cache_bytes == 0 ? ""
              : cuda ? (" (" + b(mp.page_cache_bytes) + " of the checkpoint pass through the page cache)").c_str()
                     : (" + " + b(mp.page_cache_bytes) + " of page cache for the mapped weights").c_str());
}

void run(const InfoOptions& o) {
  KVQ_CHECK(!o.markdown || o.codecs, "info: --markdown prints the codec page: it needs --codecs");
  KVQ_CHECK(!(o.markdown && o.json), "info: --markdown and --json exclude each other");
  if (o.codecs) return print_codecs(o.json, o.markdown);
  KVQ_CHECK(!o.model.dir.empty(), "info: -m DIR is required (or --codecs for the codec support matrix)");
  // The plan needs no device: a CPU plan, then (--device cuda) the GPU's cache checks without one.
  ModelOptions host = o.model;
  host.device = "cpu";
  const Plan p = plan(host, o.cache, o.ctx);
  const ModelConfig& c = p.model;
  const int ctx = p.ctx;
  const CacheConfig& cc = p.cache;
  const bool cuda = o.model.device == "cuda";
  if (cuda) {
    check_gpu_cache(cc, c.head_dim);
    KVQ_CHECK(o.model.gpu_gemm == "bf16" || o.model.gpu_gemm == "fp32", "--gpu-gemm '{}' is not supported (bf16 or "
              "fp32)", o.model.gpu_gemm);
  }
  // --dummy-weights, or a config without weights (models/shapes/): the parameters the config calls for
  // (model/weights.h's table), no checkpoint to read.
  size_t n_params = 0;
  std::string fingerprint = "none (dummy weights)";
  PlanInputs in{.model = c, .cache = cc, .ctx = ctx, .max_seqs = o.parallel,
                .device = cuda ? PlanDevice::kCuda : PlanDevice::kCpu, .gpu_gemm_fp32 = o.model.gpu_gemm == "fp32"};
  if (o.model.dummy_weights) {
    n_params = model_params(c);
    in.dummy = true;
  } else if (!Checkpoint::has_weights(o.model.dir)) {
    n_params = model_params(c);
    fingerprint = "none (config.json without weights: parameters counted from the config)";
    in.dummy = true;
  } else {
    const Checkpoint ckpt = Checkpoint::open(o.model.dir);  // the headers only
    for (const auto& name : ckpt.names()) n_params += size_t(ckpt.get(name).info->numel());
    fingerprint = ckpt.fingerprint();
    for (const TensorSpec& t : model_tensors(c)) {
      if (!t.matrix() || !ckpt.has(t.name)) continue;  // a missing tensor is the loader's error to name
      const TensorInfo& info = *ckpt.get(t.name).info;
      in.matrix_bytes += info.nbytes();
      const std::string dt(dtype_name(info.dtype));
      in.matrix_dtype = in.matrix_dtype.empty() || in.matrix_dtype == dt ? dt : "mixed";
    }
  }
  const MemoryPlan mp = memory_plan(in);
  KvCache cache(cc, c.n_layers, c.n_kv_heads, c.head_dim, ctx);
  const CacheFootprint f = cache.footprint(ctx);
  const double bf16_per_token = 2.0 * c.n_kv_heads * c.head_dim * 2.0 * c.n_layers;
  const double per_token = f.bytes_per_token_per_layer * c.n_layers;
  if (o.json) {
    nlohmann::json j = {{"architecture", arch_name(c.arch)}, {"parameters", n_params}, {"layers", c.n_layers},
                        {"hidden", c.hidden_size}, {"heads", c.n_heads}, {"kv_heads", c.n_kv_heads},
                        {"head_dim", c.head_dim}, {"vocab", c.vocab_size}, {"max_ctx", c.max_ctx},
                        {"fingerprint", fingerprint}, {"cache", cc.describe()}, {"ctx", ctx},
                        {"kv_bytes_per_token_bf16", bf16_per_token}, {"kv_bytes_per_token", per_token},
                        {"kv_bytes_per_token_per_layer", f.bytes_per_token_per_layer},
                        {"kv_bits_quantized", f.quant_bits_per_element}, {"kv_bits_effective", f.bits_per_element},
                        {"kv_bytes_at_ctx", per_token * ctx}, {"sliding_window", c.sliding_window()}};
    j["memory"] = {{"device", cuda ? "cuda" : "cpu"}, {"sequences", o.parallel}, {"weights_dtype", mp.weight_dtype},
                   {"weight_matrix_bytes", mp.matrix_bytes}, {"weight_vector_bytes", mp.vector_bytes},
                   {"device_weight_bytes", mp.device_weight_bytes}, {"kv_pool_bytes", mp.kv_pool_bytes},
                   {"kv_window_bytes", mp.kv_window_bytes}, {"activation_bytes", mp.activation_bytes},
                   {"host_bytes", mp.host_bytes}, {"fold_bytes", mp.fold_bytes}, {"page_cache_bytes", mp.page_cache_bytes},
                   {"device_bytes", mp.device_bytes}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("model        %s\n", o.model.dir.c_str());
  std::printf("architecture %s (%s), %zu parameters\n", std::string(arch_name(c.arch)).c_str(),
              c.model_type.c_str(), n_params);
  std::printf("layers       %d, hidden %d, intermediate %d, vocab %d\n", c.n_layers, c.hidden_size,
              c.intermediate_size, c.vocab_size);
  std::printf("attention    %d query heads, %d kv heads, head_dim %d%s%s\n", c.n_heads, c.n_kv_heads, c.head_dim,
              c.qk_norm ? ", QK-norm" : "", c.qkv_bias ? ", qkv bias" : "");
  std::printf("rope         theta %g, %s; max context %d\n", c.rope.theta, c.rope.type.c_str(), c.max_ctx);
  if (c.sliding_window() > 0)
    std::printf("sliding      window of %d positions on %zu of %d layers\n", c.sliding_window(),
                size_t(std::count_if(c.layer_window.begin(), c.layer_window.end(), [](int w) { return w > 0; })),
                c.n_layers);
  std::printf("fingerprint  %s\n", fingerprint.c_str());
  std::printf("KV cache     %s\n", cc.describe().c_str());
  std::printf("  bf16 cache           %.0f bytes/token (%.0f per layer)\n", bf16_per_token,
              bf16_per_token / c.n_layers);
  std::printf("  this cache at %-6d %.1f bytes/token (%.2f per layer), %.1f MiB for the whole context\n", ctx,
              per_token, f.bytes_per_token_per_layer, per_token * ctx / (1 << 20));
  std::printf("  bits/element         %.3f quantized region, %.3f effective at %d tokens (windows included)\n",
              f.quant_bits_per_element, f.bits_per_element, ctx);
  print_plan(mp, o, ctx, cc.max_chunk);
}

}  // namespace

void add_info(CLI::App& app) {
  auto o = std::make_shared<InfoOptions>();
  CLI::App* cmd = app.add_subcommand("info", "model architecture and KV-cache accounting");
  add_model_options(cmd, o->model);
  cmd->get_option("--model")->required(false);  // --codecs needs no model; run() asks for -m otherwise
  add_cache_options(cmd, o->cache);
  cmd->add_option("-c,--ctx-size", o->ctx, "context for the effective-bits accounting and the memory plan (0: the "
                  "model's maximum)");
  cmd->add_option("--parallel", o->parallel, "sequences the memory plan holds (alias -np)")->check(CLI::Range(1, 4096));
  add_device_options(cmd, o->model);
  cmd->add_flag("--json", o->json, "print one JSON object (with --codecs: an array of matrix rows)");
  CLI::Option* codecs = cmd->add_flag("--codecs", o->codecs, "print the codec support matrix (codec x device x "
                                      "head_dim x group: bytes and bits stored) and exit");
  cmd->add_flag("--markdown", o->markdown, "with --codecs: the matrix as the markdown page docs/guide/codecs.md");
  for (CLI::Option* other : cmd->get_options())  // the matrix takes no model, context or cache flag
    if (other != codecs && other->get_name() != "--json" && other->get_name() != "--markdown" &&
        other->get_name() != "--help")
      codecs->excludes(other);
  cmd->callback([o] { run(*o); });
}

}  // namespace kvq::cli
