// kvq eval: decode-faithful fidelity metrics of one KV-cache configuration (docs/guide/methods.md §8): ppl per domain,
// KL and top-1 against a BF16-cache run in lockstep, passkey retrieval over ctx × depth, per-layer errors.
#include <algorithm>
#include <cstdio>

#include "cli/commands.h"
#include "cli/options.h"
#include "common/error.h"
#include "eval/evaluator.h"

namespace kvq::cli {

namespace {

struct EvalOptions {
  ModelOptions model;
  CacheOptions cache;
  PromptLength prompt;
  std::string tasks = "ppl,kl,passkey,layers";
  std::string ctx = "2048";
  std::string data = "data/eval";
  int windows = 0;
  int passkey_trials = 10;
  uint64_t seed = 0;
  int bootstrap = 1000;
  bool json = false;
};

std::string fmt_eta(double s) {
  if (s < 0) return "?";
  const long t = long(s + 0.5);
  return t >= 3600 ? fmt::format("{}h{:02}m", t / 3600, t / 60 % 60) : fmt::format("{}m{:02}s", t / 60, t % 60);
}

void run(const EvalOptions& o) {
  require_checkpoint(o.model, "eval");
  EvalConfig c;
  c.tasks = parse_eval_tasks(o.tasks);
  c.ctx = parse_ctx_list(o.ctx);
  c.windows = o.windows;
  c.passkey_trials = o.passkey_trials;
  c.seed = o.seed;
  c.bootstrap = o.bootstrap;
  c.prompt_tokens = o.prompt.tokens;
  c.prompt_fraction = o.prompt.fraction;
  list_eval_files(o.data);  // a missing or empty data directory fails before the model loads
  // ctx > the model's maximum, a bad cache or rotation: one clear error before any work
  const Plan p = plan(o.model, o.cache, *std::max_element(c.ctx.begin(), c.ctx.end()));
  const Tokenizer tok = load_tokenizer(o.model);
  std::vector<EvalDomain> domains = load_eval_domains(o.data, tok);
  auto model = load_model(o.model, p);
  const CacheConfig& cc = p.cache;
  const RunnerFactory runners = make_runner_factory(*model, o.model);
  std::fprintf(stderr, "kvq: eval %s at ctx %s on %zu domains from %s, cache %s\n", o.tasks.c_str(), o.ctx.c_str(),
               domains.size(), o.data.c_str(), cc.describe().c_str());
  std::string last;
  const EvalReport r = evaluate(*model, runners, tok, cc, std::move(domains), c,
                                [&](const std::string& stage, double frac, double eta) {
                                  std::fprintf(stderr, "\rkvq: %-28s %5.1f%%  ETA %-8s", stage.c_str(), 100 * frac,
                                               fmt_eta(eta).c_str());
                                  std::fflush(stderr);
                                  last = stage;
                                });
  if (!last.empty()) std::fputc('\n', stderr);
  if (o.json) {
    nlohmann::json j = report_json(r);
    // The prefill semantics of every number (eval/perplexity.h): the policy, and per ctx the prompt and the targets
    // scored per window.
    j["prompt"] = {{"policy", prompt_policy_name(cc.prompt_policy)}, {"evict_bits", cc.evict_bits},
                   {"evict_ctx", cc.evict_ctx}, {"by_ctx", {}}};
    for (size_t i = 0; i < r.prompt_tokens.size(); ++i)
      j["prompt"]["by_ctx"].push_back({{"ctx", c.ctx[i]},
                                       {"prompt_tokens", r.prompt_tokens[i]},
                                       {"scored_tokens_per_window", scored_targets(c.ctx[i], r.prompt_tokens[i])}});
    std::printf("%s\n", j.dump().c_str());
  }
  else
    std::printf("%s", report_table(r).c_str());
}

}  // namespace

void add_eval(CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* cmd = app.add_subcommand("eval", "fidelity metrics of a KV-cache configuration (ppl, kl, passkey, layers)");
  add_model_options(cmd, o->model);
  add_cache_options(cmd, o->cache);
  add_prompt_options(cmd, o->cache, o->prompt);
  add_device_options(cmd, o->model);
  cmd->add_option("--tasks", o->tasks, "comma-separated tasks: ppl, kl, passkey, layers");
  cmd->add_option("--ctx", o->ctx, "comma-separated context lengths, e.g. 2048,4096,8192");
  cmd->add_option("--data", o->data, "directory of eval texts; every DIR/*.txt is one domain");
  cmd->add_option("--windows", o->windows, "windows per domain and ctx for ppl/kl/layers (0: all)")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--passkey-trials", o->passkey_trials, "passkey prompts per (ctx, depth)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--seed", o->seed, "seed of the passkey prompts and the bootstrap");
  cmd->add_option("--bootstrap", o->bootstrap, "bootstrap resamples for the CIs")->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--json", o->json, "print one JSON object with every number");
  cmd->callback([o] { run(*o); });
}

}  // namespace kvq::cli
