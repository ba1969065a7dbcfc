// kvq info: architecture, sizes, and the KV-cache accounting (bytes stored per token, effective bits).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "codecs/support_matrix.h"
#include "common/error.h"

namespace kvq::cli {

namespace {

struct InfoOptions {
  ModelOptions model;
  CacheOptions cache;
  int ctx = 0;
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

void run(const InfoOptions& o) {
  KVQ_CHECK(!o.markdown || o.codecs, "info: --markdown prints the codec page: it needs --codecs");
  KVQ_CHECK(!(o.markdown && o.json), "info: --markdown and --json exclude each other");
  if (o.codecs) return print_codecs(o.json, o.markdown);
  KVQ_CHECK(!o.model.dir.empty(), "info: -m DIR is required (or --codecs for the codec support matrix)");
  const Plan p = plan(o.model, o.cache, o.ctx);
  const ModelConfig& c = p.model;
  const int ctx = p.ctx;
  const CacheConfig& cc = p.cache;
  // --dummy-weights, or a config without weights (models/shapes/): the parameters the config calls for
  // (model/weights.h's table), no checkpoint to read.
  size_t n_params = 0;
  std::string fingerprint = "none (dummy weights)";
  if (o.model.dummy_weights) {
    n_params = model_params(c);
  } else if (!Checkpoint::has_weights(o.model.dir)) {
    n_params = model_params(c);
    fingerprint = "none (config.json without weights: parameters counted from the config)";
  } else {
    const Checkpoint ckpt = Checkpoint::open(o.model.dir);
    for (const auto& name : ckpt.names()) n_params += size_t(ckpt.get(name).info->numel());
    fingerprint = ckpt.fingerprint();
  }
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
                        {"kv_bytes_at_ctx", per_token * ctx}};
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
  std::printf("fingerprint  %s\n", fingerprint.c_str());
  std::printf("KV cache     %s\n", cc.describe().c_str());
  std::printf("  bf16 cache           %.0f bytes/token (%.0f per layer)\n", bf16_per_token,
              bf16_per_token / c.n_layers);
  std::printf("  this cache at %-6d %.1f bytes/token (%.2f per layer), %.1f MiB for the whole context\n", ctx,
              per_token, f.bytes_per_token_per_layer, per_token * ctx / (1 << 20));
  std::printf("  bits/element         %.3f quantized region, %.3f effective at %d tokens (windows included)\n",
              f.quant_bits_per_element, f.bits_per_element, ctx);
}

}  // namespace

void add_info(CLI::App& app) {
  auto o = std::make_shared<InfoOptions>();
  CLI::App* cmd = app.add_subcommand("info", "model architecture and KV-cache accounting");
  add_model_options(cmd, o->model);
  cmd->get_option("--model")->required(false);  // --codecs needs no model; run() asks for -m otherwise
  add_cache_options(cmd, o->cache);
  cmd->add_option("-c,--ctx-size", o->ctx, "context for the effective-bits accounting (0: the model's maximum)");
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
