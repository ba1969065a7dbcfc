// kvq run: generate text from a prompt, streaming tokens to stdout.
#include <chrono>
#include <cstdio>
#include <random>

#include "cli/commands.h"
#include "cli/options.h"
#include "common/error.h"
#include "engine/scheduler.h"
#include "model/sampler.h"

namespace kvq::cli {

namespace {

struct RunOptions {
  ModelOptions model;
  CacheOptions cache;
  std::string prompt;
  int n_predict = 128;
  int ctx = 0;
  SamplerConfig sampler;
  int64_t seed = -1;
};

void run(const RunOptions& o) {
  require_checkpoint(o.model, "run");
  SamplerConfig sc = o.sampler;
  sc.seed = o.seed >= 0 ? uint64_t(o.seed) : std::random_device{}();
  sc.validate();
  const Plan p = plan(o.model, o.cache, o.ctx);
  const Tokenizer tok = load_tokenizer(o.model);
  std::vector<int32_t> ids = tok.encode(o.prompt);
  KVQ_CHECK(!ids.empty(), "the prompt is empty");
  KVQ_CHECK(int(ids.size()) + o.n_predict <= p.ctx,
            "context overflow: prompt of {} tokens + {} to generate exceed the context of {} tokens", ids.size(),
            o.n_predict, p.ctx);
  auto model = load_model(o.model, p);
  auto runner = make_runner(*model, o.model, p, p.ctx);
  Runner& r = *runner;
  log_runner(r, "run:");
  std::fprintf(stderr, "kvq: sampling temp %.2f top-k %d top-p %.2f seed %llu\n", sc.temperature, sc.top_k,
               sc.top_p, (unsigned long long)sc.seed);
  GenerateParams gp;
  gp.max_tokens = o.n_predict;
  gp.sampler = sc;
  gp.stop_ids = r.config().eos_token_ids;
  const size_t n_prompt = ids.size();
  Scheduler sched(r);
  sched.add(std::make_unique<Generation>(std::move(ids), gp, &tok));
  std::fputs(o.prompt.c_str(), stdout);
  std::fflush(stdout);

  // The one request loop (engine/scheduler.h): chunked prefill, then one token per step.
  const auto t0 = std::chrono::steady_clock::now();
  auto t1 = t0;  // the first token (or the end of the prefill)
  int generated = 0;
  bool first = true;
  while (!sched.idle()) {
    for (Scheduler::Update& u : sched.step()) {
      if (first) t1 = std::chrono::steady_clock::now(), first = false;
      std::fputs(u.output.text.c_str(), stdout);
      std::fflush(stdout);
      generated = u.generated_tokens;
      KVQ_CHECK(u.output.finish != FinishReason::Error, "{}", u.output.error);
    }
  }
  if (first) t1 = std::chrono::steady_clock::now();
  std::fputs("\n", stdout);
  std::fflush(stdout);
  const auto t2 = std::chrono::steady_clock::now();
  const double pre = std::chrono::duration<double>(t1 - t0).count();
  const double dec = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr, "kvq: prefill %zu tokens in %.2f s (%.1f tok/s), generated %d tokens in %.2f s (%.1f tok/s)\n",
               n_prompt, pre, double(n_prompt) / pre, generated, dec, generated / std::max(dec, 1e-9));
}

}  // namespace

void add_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "generate text from a prompt");
  add_model_options(cmd, o->model);
  add_cache_options(cmd, o->cache);
  add_kv_budget_option(cmd, o->cache);
  add_device_options(cmd, o->model);
  add_fold_values_option(cmd, o->model);
  cmd->add_option("-p,--prompt", o->prompt, "prompt text")->required();
  cmd->add_option("-n,--n-predict", o->n_predict, "tokens to generate")->check(CLI::Range(0, 1 << 24));
  cmd->add_option("-c,--ctx-size", o->ctx, "context length (0: the model's maximum)");
  cmd->add_option("--temp", o->sampler.temperature, "temperature (0: greedy)");
  cmd->add_option("--top-k", o->sampler.top_k, "top-k sampling (0: off)");
  cmd->add_option("--top-p", o->sampler.top_p, "top-p (nucleus) sampling (1: off)");
  cmd->add_option("-s,--seed", o->seed, "RNG seed (-1: random)");
  cmd->callback([o] { run(*o); });
}

}  // namespace kvq::cli
