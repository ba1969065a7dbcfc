// kvq eval: the fidelity metrics of docs/guide/methods.md §8 for one KV-cache configuration, decode-faithful (§2):
//   ppl      per domain, with a bootstrap 95% CI over windows
//   kl       KL(p_bf16 ‖ p_method) per token and top-1 agreement against a BF16-cache run in lockstep
//   passkey  needle retrieval accuracy over context lengths × depths × trials, Wilson 95% CIs
//   layers   per-layer post-W_O attention-output error and hidden-state error (eval/layer_errors.h)
// Definitions: ppl scores the ctx - 1 next tokens of each window; KL and top-1 compare the ctx next-token
// distributions of each window (double precision, per token, then Σ over windows / Σ tokens); the BF16 reference
// cache keeps the method's sink / recent / page / chunk settings, so a BF16 "method" gives KL == 0 exactly.
// CIs: percentile bootstrap over windows (ratio of sums; degenerate with one window), seeded per stream by
// mix_seed(seed, hash("ppl/<ctx>/<domain>")) etc.; passkey: Wilson intervals, prompts seeded by
// mix_seed(seed, ctx) (the format is the training format; the random draws are kvq's own, not Python's).
// Every ctx of the list is evaluated; ppl / kl / layers use the first `windows` non-overlapping windows of each
// domain. The report holds every number plus what is needed to reproduce it (model fingerprint, data sha256,
// cache description and bits, seeds, kvq version): report_json() is what the referee aggregates.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/bootstrap.h"
#include "eval/fidelity.h"
#include "eval/passkey.h"
#include "eval/perplexity.h"
#include "kv/cache.h"
#include "model/model.h"
#include "model/runner.h"
#include "tokenizer/tokenizer.h"

namespace kvq {

struct EvalDomain {
  std::string name;             // file stem: "linux"
  std::string path;             // the .txt file
  std::string sha256;           // hex digest of the file's bytes
  size_t bytes = 0;             // file size
  std::vector<int32_t> ids;     // the file's tokens
};

// The DIR/*.txt files in sorted order; kvq::Error on a missing directory or one without .txt files.
std::vector<std::string> list_eval_files(const std::string& dir);
// Every DIR/*.txt in sorted name order, tokenized. kvq::Error on a missing or empty directory or an empty file.
std::vector<EvalDomain> load_eval_domains(const std::string& dir, const Tokenizer& tok);

struct EvalConfig {
  std::vector<std::string> tasks;          // subset of ppl, kl, passkey, layers (parse_eval_tasks)
  std::vector<int> ctx;                    // context lengths (parse_ctx_list)
  int windows = 0;                         // windows per domain and ctx for ppl / kl / layers (<= 0: all)
  int passkey_trials = 10;                 // prompts per (ctx, depth)
  std::vector<double> depths = default_depths();  // needle depths
  uint64_t seed = 0;                       // base seed of the passkey prompts and the bootstrap
  int bootstrap = 1000;                    // bootstrap resamples
  // The prompt of each ppl / kl / layers window (eval/perplexity.h: [0, P) prefilled, Runner::end_prompt, the rest
  // teacher-forced, targets >= P scored): prompt_tokens, or floor(prompt_fraction · ctx); both 0: no prompt (today's
  // scoring, every result unchanged). Passkey's prompt is always the needle prompt (its answer follows end_prompt).
  int prompt_tokens = 0;
  double prompt_fraction = 0;
  int prompt_at(int ctx) const;            // P for windows of ctx tokens (kvq::Error when both are given, or P >= ctx)
  // A tail of each ppl / kl window (eval/perplexity.h): its NLL over the targets at positions >= T =
  // floor(tail_fraction · ctx) is recorded too, and its KL and top-1 against the BF16 run over the rows predicting
  // them, from the same passes (the referee pairs runs of different prompts on it); 0: none.
  double tail_fraction = 0;
  int tail_at(int ctx) const;              // T for windows of ctx tokens (0: none; kvq::Error unless P <= T < ctx)

  bool has(const std::string& task) const;
  static std::vector<double> default_depths();  // 0, 0.1, ..., 1.0
};

// The windows of ctx tokens that ppl / kl / layers evaluate in a text of `tokens` tokens: its first `windows`
// non-overlapping ones, or every full one (windows <= 0).
int eval_windows_of(size_t tokens, int ctx, int windows);
// The work evaluate() counts at one ctx, in forwarded tokens: `windows` windows of ctx tokens (every domain's), each
// forwarded once for ppl alone, twice with kl (the BF16 reference beside the method), three times with layers (the
// forced per-layer pass too), and c's passkey prompts of ctx tokens. The referee's plan counts its runs with it.
double eval_work_tokens(const EvalConfig& c, int ctx, int64_t windows);

// "ppl,kl" -> {"ppl", "kl"}; kvq::Error on an unknown or repeated task or an empty list.
std::vector<std::string> parse_eval_tasks(const std::string& list);
// "2048,4096" -> {2048, 4096}; kvq::Error on anything but positive integers (empty items included).
std::vector<int> parse_ctx_list(const std::string& list);

struct PplEntry {
  std::string domain;       // domain name, or "all" for the pooled windows of every domain
  int ctx = 0;              // window length
  int prompt_tokens = 0;    // P of each window (targets at positions < P are not scored)
  std::vector<double> window_nll;  // summed NLL per window (method cache)
  int tail_prompt_tokens = 0;      // T: the tail's start (0: no tail)
  std::vector<double> window_nll_tail;  // summed NLL per window over the targets at positions >= T (empty: none)
  int64_t tokens = 0;       // scored tokens
  double ppl = 0;           // exp(Σ nll / tokens)
  Interval ci;              // bootstrap 95% CI of ppl (estimate = ppl)
  double ppl_bf16 = 0;      // the BF16-cache ppl of the same windows when the lockstep pass ran (else 0)
};

struct KlEntry {
  std::string domain;       // domain name, or "all" for the pooled windows of every domain
  int ctx = 0;              // window length
  int prompt_tokens = 0;    // P of each window (rows predicting positions < P are not compared)
  int windows = 0;          // windows compared
  int64_t tokens = 0;       // positions compared
  Interval kl;              // mean KL per token (nats), bootstrap 95% CI over windows
  Interval top1;            // top-1 agreement fraction, bootstrap 95% CI over windows
  std::vector<WindowFidelity> per_window;  // the per-window sums (for paired comparisons across methods)
  int tail_prompt_tokens = 0;  // T: the tail's start (EvalConfig::tail_fraction; 0: no tail)
  int64_t tail_tokens = 0;     // rows compared in the tail (per_window[].tokens_tail summed)
  Interval kl_tail{};          // mean KL per token over the tail's rows (those predicting positions >= T), 95% CI
  Interval top1_tail{};        // top-1 agreement over the same rows, 95% CI
};

struct PasskeyEntry {
  PasskeyResult result;            // counts per depth
  Interval accuracy;               // Wilson 95% interval over all trials of this ctx
  std::vector<Interval> by_depth;  // Wilson 95% per depth (order of result.by_depth)
  uint64_t seed = 0;               // seed of this ctx's prompt generator
};

struct LayerEntry {
  int ctx = 0;             // window length
  LayerErrorSums sums;     // pooled over every window of every domain
};

struct EvalReport {
  EvalConfig config;                 // what was asked
  std::string model_dir, model_fingerprint;
  CacheConfig cache;                 // the method's cache
  std::vector<CacheFootprint> footprint;  // per config.ctx entry, at that context length (with its prompt, under the
                                          // cache's prompt policy: Runner::prompt_footprint)
  std::vector<int> prompt_tokens;         // per config.ctx entry: P (config.prompt_at)
  std::vector<EvalDomain> domains;   // name, path, sha256, bytes (ids cleared)
  std::vector<int64_t> domain_tokens;  // tokens per domain, same order
  std::vector<PplEntry> ppl;
  std::vector<KlEntry> kl;
  std::vector<PasskeyEntry> passkey;
  std::vector<LayerEntry> layers;
  std::string runner;                // where the passes ran: Runner::describe() of the method's runner
  double seconds = 0;                // wall time of the evaluation
};

// Progress: a stage label, the fraction of all work done and the estimated seconds left.
using EvalProgress = std::function<void(const std::string& stage, double fraction, double eta_seconds)>;

// Checks every input before any work (tasks, ctx against the model and the data, windows, trials) and runs the
// tasks through runners from `runners` (per ctx: the method's, and for kl / layers the BF16 reference and the forced
// pass; any device). model gives the configuration, the fingerprint and the thread pool of the per-token metrics.
EvalReport evaluate(Model& model, const RunnerFactory& runners, const Tokenizer& tok, const CacheConfig& cache,
                    std::vector<EvalDomain> domains, const EvalConfig& config, const EvalProgress& progress = {});
// The CPU path: cpu_runner_factory(model).
EvalReport evaluate(Model& model, const Tokenizer& tok, const CacheConfig& cache, std::vector<EvalDomain> domains,
                    const EvalConfig& config, const EvalProgress& progress = {});

// eval/report.cpp
nlohmann::json report_json(const EvalReport& r);   // every number, fingerprints, seeds, version
std::string report_table(const EvalReport& r);     // readable tables, one per task

}  // namespace kvq
