#include "eval/evaluator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/sha256.h"
#include "eval/metrics.h"
#include "eval/rng.h"

namespace kvq {

namespace {

const std::vector<std::string> kTasks = {"ppl", "kl", "passkey", "layers"};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVQ_CHECK(f, "cannot open eval text '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Wall-clock ETA over weighted work units (forwarded tokens).
class EtaClock {
 public:
  EtaClock(double total, const EvalProgress& cb) : total_(std::max(1.0, total)), cb_(cb) {}
  void report(const std::string& stage, double done_units) {
    if (!cb_) return;
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const double frac = std::min(1.0, done_units / total_);
    cb_(stage, frac, frac > 0 ? t * (1 - frac) / frac : -1);
  }

 private:
  double total_;
  const EvalProgress& cb_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

int windows_of(const EvalDomain& d, int ctx, int windows) { return eval_windows_of(d.ids.size(), ctx, windows); }

Interval exp_interval(const Interval& i) { return Interval{std::exp(i.estimate), std::exp(i.lo), std::exp(i.hi)}; }

// tail: T of the pass (0: none), whose rows WindowFidelity::kl_sum_tail etc. summed.
// The mean KL and top-1 of the view f of windows ws, with bootstrap CIs over the windows seeded by tag (and
// tag + "/top1"), and the rows they cover.
struct FidelityCis {
  Interval kl, top1;
  int64_t tokens = 0;
};
FidelityCis fidelity_cis(const std::vector<WindowFidelity>& ws, FidelityFields f, const EvalConfig& c,
                         const std::string& tag) {
  std::vector<double> kl, agree, tokens;
  FidelityCis r;
  for (const WindowFidelity& w : ws) {
    kl.push_back(w.*f.kl);
    agree.push_back(double(w.*f.agree));
    tokens.push_back(double(w.*f.tokens));
    r.tokens += w.*f.tokens;
  }
  r.kl = bootstrap_ratio(kl, tokens, c.bootstrap, mix_seed(c.seed, tag_hash(tag))).ci;
  r.top1 = bootstrap_ratio(agree, tokens, c.bootstrap, mix_seed(c.seed, tag_hash(tag + "/top1"))).ci;
  return r;
}

KlEntry kl_entry(const std::string& domain, int ctx, const std::vector<WindowFidelity>& ws, const EvalConfig& c,
                 int tail) {
  KlEntry e;
  e.domain = domain;
  e.ctx = ctx;
  e.prompt_tokens = c.prompt_at(ctx);
  e.windows = int(ws.size());
  e.per_window = ws;
  const std::string tag = "kl/" + std::to_string(ctx) + "/" + domain;
  const FidelityCis whole = fidelity_cis(ws, kWholeWindow, c, tag);
  e.kl = whole.kl, e.top1 = whole.top1, e.tokens = whole.tokens;
  e.tail_prompt_tokens = tail;
  if (tail > 0) {  // the same windows' rows from the tail on (WindowFidelity::kl_sum_tail)
    const FidelityCis t = fidelity_cis(ws, kWindowTail, c, tag + "/tail");
    e.kl_tail = t.kl, e.top1_tail = t.top1, e.tail_tokens = t.tokens;
  }
  return e;
}

// Fills the ppl and its bootstrap CI over windows (each window scores scored_targets(ctx, P) tokens: ctx - 1 without a
// prompt).
PplEntry ppl_entry(PplEntry e, const EvalConfig& c) {
  std::vector<double> den(e.window_nll.size(), double(scored_targets(e.ctx, e.prompt_tokens)));
  const std::string tag = "ppl/" + std::to_string(e.ctx) + "/" + e.domain;
  e.ci = exp_interval(bootstrap_ratio(e.window_nll, den, c.bootstrap, mix_seed(c.seed, tag_hash(tag))).ci);
  e.ppl = e.ci.estimate;
  return e;
}

void validate(const Model& model, const Tokenizer& tok, const CacheConfig& cache, const std::vector<EvalDomain>& ds,
              const EvalConfig& c) {
  KVQ_CHECK(!c.tasks.empty(), "eval: no tasks (choose from ppl, kl, passkey, layers)");
  for (const std::string& t : c.tasks)
    KVQ_CHECK(std::find(kTasks.begin(), kTasks.end(), t) != kTasks.end(),
              "unknown eval task '{}' (known: ppl, kl, passkey, layers)", t);
  KVQ_CHECK(!c.ctx.empty(), "eval: no context lengths");
  KVQ_CHECK(!ds.empty(), "eval: no eval data");
  KVQ_CHECK(c.bootstrap >= 1, "eval: --bootstrap {} must be >= 1", c.bootstrap);
  KVQ_CHECK(model.config().vocab_size >= tok.vocab_size(), "the tokenizer's {} ids exceed the model's vocabulary of {}",
            tok.vocab_size(), model.config().vocab_size);
  const bool windowed = c.has("ppl") || c.has("kl") || c.has("layers");
  int64_t all_tokens = 0;
  for (const EvalDomain& d : ds) all_tokens += int64_t(d.ids.size());
  for (int ctx : c.ctx) {
    KVQ_CHECK(ctx >= 2, "context {} is too short (need >= 2)", ctx);
    KVQ_CHECK(ctx <= model.config().max_ctx, "context {} exceeds the model's maximum of {} tokens", ctx,
              model.config().max_ctx);
    if (windowed) c.tail_at(ctx);  // 0 <= P < ctx, and P <= T < ctx for a tail
    if (windowed)
      for (const EvalDomain& d : ds)
        KVQ_CHECK(d.ids.size() >= size_t(ctx), "eval text '{}' has {} tokens, shorter than one window of {}", d.path,
                  d.ids.size(), ctx);
    if (c.has("passkey")) {
      const PasskeyParts p = passkey_parts(tok, kPasskeyKeyMax);  // the longest key spelling is as long as any
      const int fixed = int(p.needle.size() + p.question.size() + p.answer.size());
      KVQ_CHECK(ctx >= 2 * fixed, "passkey context {} is too short: needle, question and answer take {} tokens "
                "(use at least {})", ctx, fixed, 2 * fixed);
      KVQ_CHECK(all_tokens > ctx, "the eval text has {} tokens, too few for a passkey haystack of {}", all_tokens, ctx);
    }
  }
  if (c.has("passkey")) {
    KVQ_CHECK(c.passkey_trials >= 1, "eval: --passkey-trials {} must be >= 1", c.passkey_trials);
    KVQ_CHECK(!c.depths.empty(), "eval: no passkey depths");
    for (double d : c.depths) KVQ_CHECK(d >= 0 && d <= 1, "passkey depth {} outside [0, 1]", d);
  }
  // The cache configuration is validated by constructing it once, and what it stores with each ctx's prompt (an evict
  // budget that cannot hold the prompt's windows or the tokens after it fails here, before any pass).
  KvCache probe(cache, model.config().n_layers, model.config().n_kv_heads, model.config().head_dim, c.ctx.front());
  for (int ctx : c.ctx) probe.footprint(ctx, windowed ? c.prompt_at(ctx) : 0);
}

}  // namespace

int EvalConfig::prompt_at(int ctx) const {
  KVQ_CHECK(prompt_tokens == 0 || prompt_fraction == 0,
            "give the prompt as tokens (--prompt-tokens {}) or as a fraction of the window (--prompt-fraction {}), not "
            "both", prompt_tokens, prompt_fraction);
  KVQ_CHECK(prompt_tokens >= 0 && prompt_fraction >= 0 && prompt_fraction < 1,
            "the prompt ({} tokens, fraction {}) must be >= 0 tokens or a fraction in [0, 1)", prompt_tokens,
            prompt_fraction);
  const int P = prompt_tokens > 0 ? prompt_tokens : int(std::floor(prompt_fraction * ctx));
  KVQ_CHECK(P < ctx, "a prompt of {} tokens leaves nothing to score in windows of {} (need prompt < ctx)", P, ctx);
  return P;
}

int EvalConfig::tail_at(int ctx) const {
  KVQ_CHECK(tail_fraction >= 0 && tail_fraction < 1, "the tail fraction {} must be in [0, 1)", tail_fraction);
  const int T = int(std::floor(tail_fraction * ctx));
  check_tail(ctx, prompt_at(ctx), T);
  return T;
}

bool EvalConfig::has(const std::string& task) const {
  return std::find(tasks.begin(), tasks.end(), task) != tasks.end();
}

std::vector<double> EvalConfig::default_depths() {
  std::vector<double> d;
  for (int i = 0; i <= 10; ++i) d.push_back(i / 10.0);  // the same doubles as Python's i / 10
  return d;
}

std::vector<std::string> parse_eval_tasks(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string t;
  while (std::getline(ss, t, ',')) {
    KVQ_CHECK(std::find(kTasks.begin(), kTasks.end(), t) != kTasks.end(),
              "unknown eval task '{}' (known: ppl, kl, passkey, layers)", t);
    KVQ_CHECK(std::find(out.begin(), out.end(), t) == out.end(), "eval task '{}' is listed twice", t);
    out.push_back(t);
  }
  KVQ_CHECK(!out.empty() && list.back() != ',', "bad task list '{}' (e.g. ppl,kl,passkey,layers)", list);
  return out;
}

std::vector<int> parse_ctx_list(const std::string& list) {
  std::vector<int> out;
  std::stringstream ss(list);
  std::string t;
  while (std::getline(ss, t, ',')) {
    const bool digits = !t.empty() && t.size() <= 9 && std::all_of(t.begin(), t.end(), ::isdigit);
    KVQ_CHECK(digits && std::stoi(t) > 0, "bad context list '{}': '{}' is not a positive integer (e.g. 2048,4096)",
              list, t);
    out.push_back(std::stoi(t));
  }
  KVQ_CHECK(!out.empty() && list.back() != ',', "bad context list '{}' (e.g. 2048,4096,8192)", list);
  return out;
}

std::vector<std::string> list_eval_files(const std::string& dir) {
  namespace fs = std::filesystem;
  KVQ_CHECK(fs::is_directory(dir), "eval data directory '{}' does not exist", dir);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  KVQ_CHECK(!files.empty(), "eval data directory '{}' holds no .txt files", dir);
  return files;
}

std::vector<EvalDomain> load_eval_domains(const std::string& dir, const Tokenizer& tok) {
  namespace fs = std::filesystem;
  std::vector<EvalDomain> out;
  for (const std::string& f : list_eval_files(dir)) {
    EvalDomain d;
    d.path = f;
    d.name = fs::path(f).stem().string();
    const std::string text = read_file(f);
    KVQ_CHECK(!text.empty(), "eval text '{}' is empty", f);
    d.bytes = text.size();
    d.sha256 = sha256_hex(text);
    d.ids = tok.encode(text);
    out.push_back(std::move(d));
  }
  return out;
}

double eval_work_tokens(const EvalConfig& c, int ctx, int64_t windows) {
  const int passes = c.has("layers") ? 3 : c.has("kl") ? 2 : c.has("ppl") ? 1 : 0;
  const double prompts = c.has("passkey") ? double(c.depths.size()) * c.passkey_trials : 0;
  return (double(windows) * passes + prompts) * ctx;
}

int eval_windows_of(size_t tokens, int ctx, int windows) {
  const int available = int(tokens / size_t(ctx));
  return windows > 0 ? std::min(windows, available) : available;
}

EvalReport evaluate(Model& model, const Tokenizer& tok, const CacheConfig& cache, std::vector<EvalDomain> domains,
                    const EvalConfig& c, const EvalProgress& progress) {
  return evaluate(model, cpu_runner_factory(model), tok, cache, std::move(domains), c, progress);
}

EvalReport evaluate(Model& model, const RunnerFactory& runners, const Tokenizer& tok, const CacheConfig& cache,
                    std::vector<EvalDomain> domains, const EvalConfig& c, const EvalProgress& progress) {
  validate(model, tok, cache, domains, c);
  const auto t0 = std::chrono::steady_clock::now();
  EvalReport r;
  r.config = c;
  r.model_dir = model.dir();
  r.model_fingerprint = model.fingerprint();
  r.cache = cache;
  const bool lockstep = c.has("kl") || c.has("layers");

  double total = 0;  // work units: forwarded tokens
  for (int ctx : c.ctx) {
    int64_t windows = 0;
    for (const EvalDomain& d : domains) windows += windows_of(d, ctx, c.windows);
    total += eval_work_tokens(c, ctx, windows);
  }
  EtaClock eta(total, progress);
  double done = 0;

  std::vector<int32_t> haystack;  // every domain's tokens in sorted domain order
  if (c.has("passkey"))
    for (const EvalDomain& d : domains) haystack.insert(haystack.end(), d.ids.begin(), d.ids.end());

  for (int ctx : c.ctx) {
    // This ctx's runners: the method's, and the BF16 reference and forced pass of the lockstep comparison.
    const std::unique_ptr<Runner> method = runners(cache, ctx);
    const std::unique_ptr<Runner> ref = lockstep ? runners(bf16_reference_cache(cache), ctx) : nullptr;
    const std::unique_ptr<Runner> forced = c.has("layers") ? runners(cache, ctx) : nullptr;
    const int P = c.has("ppl") || lockstep ? c.prompt_at(ctx) : 0;
    r.runner = method->describe();
    r.footprint.push_back(method->prompt_footprint(ctx, P));
    r.prompt_tokens.push_back(P);
    std::vector<WindowFidelity> pooled;
    PplEntry ppl_all;  // every domain's windows pooled
    ppl_all.domain = "all";
    ppl_all.ctx = ctx;
    ppl_all.prompt_tokens = P;
    const int T = c.has("ppl") || c.has("kl") ? c.tail_at(ctx) : 0;  // the tail of the NLLs, KL and top-1
    ppl_all.tail_prompt_tokens = T;
    double ref_nll_all = 0;
    LayerEntry layer_entry;
    layer_entry.ctx = ctx;
    for (const EvalDomain& d : domains) {
      const std::string stage = fmt::format("ctx {} {}", ctx, d.name);
      PplEntry pe;
      pe.domain = d.name;
      pe.ctx = ctx;
      pe.prompt_tokens = P;
      pe.tail_prompt_tokens = T;
      if (lockstep) {
        const double per_window = double(ctx) * (c.has("layers") ? 3 : 2);
        const FidelityResult fr = lockstep_fidelity(
            {ref.get(), method.get(), forced.get()}, d.ids, ctx, c.windows, &model.pool(),
            [&](int w, int) { eta.report(stage + (c.has("layers") ? " kl+layers" : " kl"), done + w * per_window); },
            P, T);
        done += double(fr.windows.size()) * per_window;
        if (c.has("kl")) r.kl.push_back(kl_entry(d.name, ctx, fr.windows, c, T));
        pooled.insert(pooled.end(), fr.windows.begin(), fr.windows.end());
        if (c.has("layers")) layer_entry.sums.merge(fr.layers);
        double ref_nll = 0;
        for (const WindowFidelity& w : fr.windows) {
          pe.window_nll.push_back(w.nll_method);  // identical to eval::perplexity's (tests/test_eval_end_to_end)
          if (T > 0) pe.window_nll_tail.push_back(w.nll_method_tail);
          ref_nll += w.nll_ref;
          pe.tokens += w.nll_tokens;
        }
        pe.ppl_bf16 = ppl_from_nll(ref_nll, pe.tokens);
        ref_nll_all += ref_nll;
      } else if (c.has("ppl")) {
        const PerplexityResult pr = perplexity(*method, d.ids, ctx, c.windows, [&](int w, int, double) {
          eta.report(stage + " ppl", done + double(w) * ctx);
        }, P, T);
        done += double(pr.window_nll.size()) * ctx;
        pe.window_nll = pr.window_nll;
        pe.window_nll_tail = pr.window_nll_tail;
        pe.tokens = pr.tokens_scored;
      }
      if (c.has("ppl")) {
        ppl_all.window_nll.insert(ppl_all.window_nll.end(), pe.window_nll.begin(), pe.window_nll.end());
        ppl_all.window_nll_tail.insert(ppl_all.window_nll_tail.end(), pe.window_nll_tail.begin(),
                                       pe.window_nll_tail.end());
        ppl_all.tokens += pe.tokens;
        r.ppl.push_back(ppl_entry(std::move(pe), c));
      }
    }
    if (c.has("ppl") && domains.size() > 1) {
      if (lockstep) ppl_all.ppl_bf16 = ppl_from_nll(ref_nll_all, ppl_all.tokens);
      r.ppl.push_back(ppl_entry(std::move(ppl_all), c));
    }
    if (c.has("kl") && domains.size() > 1) r.kl.push_back(kl_entry("all", ctx, pooled, c, T));
    if (c.has("layers")) r.layers.push_back(std::move(layer_entry));

    if (c.has("passkey")) {
      PasskeyEntry pk;
      pk.seed = mix_seed(c.seed, uint64_t(ctx));
      PasskeyGenerator gen(tok, haystack, pk.seed);
      const std::string stage = fmt::format("ctx {} passkey", ctx);
      pk.result = run_passkey(*method, gen, ctx, c.depths, c.passkey_trials,
                              [&](int k, int) { eta.report(stage, done + double(k) * ctx); });
      done += double(pk.result.trials) * ctx;
      pk.accuracy = wilson_interval(pk.result.correct, pk.result.trials);
      for (const PasskeyCell& cell : pk.result.by_depth) pk.by_depth.push_back(wilson_interval(cell.correct, cell.trials));
      r.passkey.push_back(std::move(pk));
    }
  }
  for (EvalDomain& d : domains) {
    r.domain_tokens.push_back(int64_t(d.ids.size()));
    d.ids.clear();
    d.ids.shrink_to_fit();
  }
  r.domains = std::move(domains);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kvq
