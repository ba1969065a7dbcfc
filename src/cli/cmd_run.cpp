// kvq run: generate text from a prompt, streaming tokens to stdout.
#include <chrono>
#include <cstdio>
#include <random>

#include "cli/commands.h"
#include "cli/options.h"
#include "common/error.h"
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
  const int seq = r.new_sequence();
  const int V = r.config().vocab_size, chunk = r.cache_config().max_chunk;
  std::vector<float> logits(static_cast<size_t>(V));
  std::fputs(o.prompt.c_str(), stdout);
  std::fflush(stdout);

  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < ids.size(); i += size_t(chunk)) {
    const int n = int(std::min(ids.size() - i, size_t(chunk)));
    r.forward(seq, ids.data() + i, n, logits.data(), false);
  }
  const auto t1 = std::chrono::steady_clock::now();
  Sampler sampler(sc);
  StreamDecoder stream(tok);
  const auto& eos = r.config().eos_token_ids;
  int generated = 0;
  for (; generated < o.n_predict; ++generated) {
    int32_t next = sampler.sample(logits.data(), V);
    if (std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    std::fputs(stream.push(next).c_str(), stdout);
    std::fflush(stdout);
    if (generated + 1 < o.n_predict) r.forward(seq, &next, 1, logits.data(), false);
  }
  std::fputs(stream.flush().c_str(), stdout);
  std::fputs("\n", stdout);
  const auto t2 = std::chrono::steady_clock::now();
  const double pre = std::chrono::duration<double>(t1 - t0).count();
  const double dec = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr, "kvq: prefill %zu tokens in %.2f s (%.1f tok/s), generated %d tokens in %.2f s (%.1f tok/s)\n",
               ids.size(), pre, double(ids.size()) / pre, generated, dec, generated / std::max(dec, 1e-9));
}

}  // namespace

void add_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "generate text from a prompt");
  add_model_options(cmd, o->model);
  add_cache_options(cmd, o->cache);
  add_kv_budget_option(cmd, o->cache);
  add_device_options(cmd, o->model);
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
