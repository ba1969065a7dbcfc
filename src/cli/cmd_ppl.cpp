// kvq ppl: perplexity of a text file over non-overlapping windows, decode-faithful through the KV cache.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "common/error.h"
#include "eval/evaluator.h"
#include "eval/perplexity.h"

namespace kvq::cli {

namespace {

struct PplOptions {
  ModelOptions model;
  CacheOptions cache;
  PromptLength prompt;
  std::string file;
  int ctx = 2048;
  int chunks = 0;
  bool json = false;
};

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVQ_CHECK(f, "cannot open text file '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void run(const PplOptions& o) {
  require_checkpoint(o.model, "ppl");
  const Plan p = plan(o.model, o.cache, o.ctx);
  const int ctx = p.ctx;
  const CacheConfig& cc = p.cache;
  EvalConfig pc;  // the prompt's length: the same rule as kvq eval's
  pc.prompt_tokens = o.prompt.tokens;
  pc.prompt_fraction = o.prompt.fraction;
  const int P = pc.prompt_at(ctx);
  // What the cache stores with this prompt, from a probe (an evict budget that cannot hold the windows or the tokens
  // after the prompt is refused here, before the model loads).
  KvCache(cc, p.model.n_layers, p.model.n_kv_heads, p.model.head_dim, 1).footprint(ctx, P);
  const std::vector<int32_t> ids = load_tokenizer(o.model).encode(read_text(o.file));
  KVQ_CHECK(ids.size() >= size_t(ctx), "'{}' has {} tokens, fewer than one window of {}", o.file, ids.size(), ctx);
  auto model = load_model(o.model, p);
  auto runner = make_runner(*model, o.model, p, ctx);
  log_runner(*runner, "ppl:");
  const CacheFootprint f = runner->prompt_footprint(ctx, P);
  const PerplexityResult r = perplexity(*runner, ids, ctx, o.chunks, [](int done, int total, double ppl) {
    std::fprintf(stderr, "\rkvq: window %d/%d  ppl %.4f", done, total, ppl);
    if (done == total) std::fputc('\n', stderr);
  }, P);
  if (o.json) {
    nlohmann::json j = {{"ppl", r.ppl()},
                        {"nll", r.nll()},
                        {"tokens", r.tokens_scored},
                        {"ctx", ctx},
                        {"windows", r.window_nll.size()},
                        {"file", o.file},
                        {"cache", cc.describe()},
                        {"prompt_policy", prompt_policy_name(cc.prompt_policy)},
                        {"prompt_tokens", P},
                        {"scored_tokens_per_window", scored_targets(ctx, P)},
                        {"device", o.model.device},
                        {"kv_bits_effective", f.bits_per_element},
                        {"kv_bits_quantized", f.quant_bits_per_element},
                        {"seconds", r.seconds},
                        {"tokens_per_second", double(r.window_nll.size()) * ctx / r.seconds}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    const std::string prompt =
        P > 0 ? fmt::format(" after a prompt of {} ({})", P, prompt_policy_name(cc.prompt_policy)) : "";
    std::printf("ppl %.4f  nll %.5f  over %lld tokens in %zu windows of %d%s  (%s, %.2f bits/element)  %.1f s\n",
                r.ppl(), r.nll(), (long long)r.tokens_scored, r.window_nll.size(), ctx, prompt.c_str(),
                cc.describe().c_str(), f.bits_per_element, r.seconds);
  }
}

}  // namespace

void add_ppl(CLI::App& app) {
  auto o = std::make_shared<PplOptions>();
  CLI::App* cmd = app.add_subcommand("ppl", "perplexity of a text file (non-overlapping windows)");
  add_model_options(cmd, o->model);
  add_cache_options(cmd, o->cache);
  add_prompt_options(cmd, o->cache, o->prompt);
  add_kv_budget_option(cmd, o->cache);
  add_device_options(cmd, o->model);
  cmd->add_option("-f,--file", o->file, "text file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-c,--ctx-size", o->ctx, "window length in tokens (0: the model's maximum)");
  cmd->add_option("--chunks", o->chunks, "windows to score at most (0: all)")->check(CLI::Range(0, 1 << 30));
  cmd->add_flag("--json", o->json, "print one JSON object");
  cmd->callback([o] { run(*o); });
}

}  // namespace kvq::cli
