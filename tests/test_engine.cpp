// The engine layer (src/engine): stop strings over streamed text, the generate loop (incremental detokenisation of
// multi-byte UTF-8, stop strings, stop ids, max_tokens) on scripted token choices, and the continuous-batching
// scheduler on models/ref: concurrent greedy output equal to each request alone, admission bounded by the page pool,
// preemption (recompute) that completes every request with the output of an unpreempted run, steps within the token
// budget mixing decode tokens and prefill chunks, cancellation, and the pool's pages back to zero.
#include <gtest/gtest.h>

#include <map>

#include "common/error.h"
#include "engine/generation.h"
#include "engine/logprobs.h"
#include "engine/scheduler.h"
#include "engine/stop_matcher.h"
#include "tokenizer/unicode.h"

using namespace kvq;

namespace {

const std::string kSrc = KVQ_SOURCE_DIR;

const Tokenizer& ref_tokenizer() {
  static const Tokenizer t = Tokenizer::load(kSrc + "/models/ref/tokenizer.json");
  return t;
}

Model& ref_model() {
  static std::unique_ptr<Model> m = Model::load(kSrc + "/models/ref", 2);
  return *m;
}

// Drives a generation with scripted choices: each id is "sampled" (greedy, given as the argmax) after the forward
// that ends at the last known token. Returns the text of each update.
std::vector<std::string> script(Generation& g, const std::vector<int32_t>& choices) {
  std::vector<std::string> pieces;
  for (int32_t id : choices) {
    if (g.finished()) break;
    while (!g.predicts(g.next_chunk(512))) g.fed_chunk(g.next_chunk(512));
    g.fed_chunk(g.next_chunk(512));
    g.accept(RowLogits{.argmax = id}, ref_tokenizer().vocab_size());
    pieces.push_back(g.take_output().text);
  }
  return pieces;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x;
  return s;
}

GenerateParams greedy(int max_tokens) {
  GenerateParams p;
  p.max_tokens = max_tokens;
  p.sampler.temperature = 0;
  return p;
}

}  // namespace

TEST(StopMatcher, ReleasesWhatCannotStartAStopAndCutsAtTheFirstStop) {
  StopMatcher m({"\n\n", "END"});
  EXPECT_EQ(m.push("Hello"), "Hello");
  EXPECT_EQ(m.push(" E"), " ");       // "E" may start "END"
  EXPECT_EQ(m.push("NX"), "ENX");     // it did not
  EXPECT_EQ(m.push("a\n"), "a");      // "\n" may start "\n\n"
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("\nrest"), "");    // "\n\n": the output ends before it
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");

  StopMatcher e({"END"});
  EXPECT_EQ(e.push("xEN"), "x");
  EXPECT_EQ(e.flush(), "EN");  // the end of generation releases a tail that never became a stop string

  StopMatcher first({"bc", "abcd"});  // the earliest occurrence wins, whichever string it is
  EXPECT_EQ(first.push("zabcd"), "z");
  EXPECT_TRUE(first.stopped());
}

TEST(StopMatcher, MultiByteStopStringsSplitAcrossPushes) {
  StopMatcher m({"日本"});
  EXPECT_EQ(m.push("x日"), "x");  // a whole character held: it starts the stop string
  EXPECT_EQ(m.push("本語"), "");
  EXPECT_TRUE(m.stopped());
  StopMatcher n({"日本"});
  EXPECT_EQ(n.push("日"), "");
  EXPECT_EQ(n.push("曜"), "日曜");
}

TEST(Generation, StreamsMultiByteUtf8OnlyAsCompleteCharacters) {
  const Tokenizer& tok = ref_tokenizer();
  const std::string text = "Grüße, 日本語 und 😀 — done";
  const std::vector<int32_t> ids = tok.encode(text);
  int partial = 0;  // tokens whose bytes alone are not valid UTF-8: what makes this test meaningful
  for (int32_t id : ids) partial += !unicode::is_valid_utf8(tok.token_bytes(id));
  ASSERT_GT(partial, 2) << "the text should split characters across tokens";
  Generation g({1, 2, 3}, greedy(int(ids.size())), &tok);
  const std::vector<std::string> pieces = script(g, ids);
  for (const std::string& p : pieces) EXPECT_TRUE(unicode::is_valid_utf8(p)) << "piece: " << p;
  EXPECT_EQ(join(pieces), text);
  EXPECT_EQ(g.finish_reason(), FinishReason::Length);
  EXPECT_EQ(g.generated_tokens(), int(ids.size()));
}

TEST(Generation, StopStringAcrossTokensEndsTheTextBeforeIt) {
  const Tokenizer& tok = ref_tokenizer();
  const std::vector<int32_t> ids = tok.encode("alpha beta STOPPED gamma delta");
  GenerateParams p = greedy(100);
  p.stop = {"STOP", "zzz"};
  Generation g({5}, p, &tok);
  const std::vector<std::string> pieces = script(g, ids);
  EXPECT_EQ(join(pieces), "alpha beta ");
  EXPECT_EQ(g.finish_reason(), FinishReason::Stop);
  EXPECT_LT(g.generated_tokens(), int(ids.size()));  // it stopped, not the script's end
}

TEST(Generation, StopIdEndsWithoutItsTextAndMaxTokensEndsWithLength) {
  const Tokenizer& tok = ref_tokenizer();
  const int32_t eos = *tok.find("<|endoftext|>");
  const std::vector<int32_t> hello = tok.encode("hello world");
  GenerateParams p = greedy(50);
  p.stop_ids = {eos};
  Generation g({7}, p, &tok);
  std::vector<int32_t> choices = hello;
  choices.push_back(eos);
  choices.push_back(hello[0]);
  EXPECT_EQ(join(script(g, choices)), "hello world");
  EXPECT_EQ(g.finish_reason(), FinishReason::Stop);
  EXPECT_EQ(g.generated_tokens(), int(hello.size()) + 1);  // the stop id counts as generated

  Generation h({7}, greedy(3), &tok);
  const std::vector<int32_t> many = tok.encode("one two three four five six");
  script(h, many);
  EXPECT_EQ(h.generated_tokens(), 3);
  EXPECT_EQ(h.finish_reason(), FinishReason::Length);
}

TEST(Generation, LogprobsAreTheLogSoftmaxOfTheLogits) {
  const std::vector<float> logits = {1.f, 3.f, 2.f, 3.f};
  // log-softmax by hand: lse = log(e^1 + 2 e^3 + e^2)
  const double lse = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0));
  const GeneratedToken t = token_logprobs(logits.data(), 4, 2, 3);
  EXPECT_EQ(t.id, 2);
  EXPECT_NEAR(t.logprob, 2 - lse, 1e-6);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].id, 1);  // ties: the lower id first
  EXPECT_EQ(t.top[1].id, 3);
  EXPECT_EQ(t.top[2].id, 2);
  EXPECT_NEAR(t.top[0].logprob, 3 - lse, 1e-6);
}

namespace {

constexpr int kCtx = 64;  // tokens per sequence of the scheduler tests

// A small cache so that short requests use pages: sinks 4, window 8, pages of 8, chunks of 16.
CacheConfig small_cache() {
  CacheConfig c;
  c.sink = 4, c.recent = 8, c.page_tokens = 8, c.max_chunk = 16;
  return c;
}

struct Job {
  std::vector<int32_t> prompt;
  GenerateParams params;
};

std::vector<Job> jobs() {
  const Tokenizer& tok = ref_tokenizer();
  const char* prompts[] = {  // 20-30 tokens each: they overlap for most of their lives
      "The kernel schedules processes on every CPU, and the scheduler picks the next task to run",
      "PostgreSQL stores tables in files that are divided into pages of a fixed size, and every page holds",
      "In Perl, a hash is an unordered collection of scalar values indexed by their associated string key",
      "Python lists are mutable sequences, typically used to store collections of homogeneous items",
  };
  std::vector<Job> out;
  for (int i = 0; i < 4; ++i) {
    Job j{tok.encode(prompts[i]), greedy(10 + 2 * i)};
    if (i == 2)  // one sampled request, seeded
      j.params.sampler = SamplerConfig{.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 7};
    out.push_back(j);
  }
  return out;
}

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::None;
};

// Runs every job through one scheduler over runner; checks each step against the budget; returns per-job results.
std::vector<Result> run_all(Runner& r, const std::vector<Job>& js, SchedulerConfig cfg, Scheduler** out = nullptr,
                            std::vector<StepInfo>* steps = nullptr, int64_t* preemptions = nullptr) {
  Scheduler s(r, cfg);
  std::map<Scheduler::Id, size_t> index;
  for (size_t i = 0; i < js.size(); ++i)
    index[s.add(std::make_unique<Generation>(js[i].prompt, js[i].params, &ref_tokenizer()))] = i;
  std::vector<Result> res(js.size());
  for (int guard = 0; !s.idle(); ++guard) {
    EXPECT_LT(guard, 2000) << "the scheduler does not finish";
    if (guard >= 2000) break;
    StepInfo info;
    for (Scheduler::Update& u : s.step(&info)) {
      Result& x = res[index.at(u.id)];
      for (const auto& t : u.output.tokens) x.tokens.push_back(t.id);
      x.text += u.output.text;
      if (u.output.finish != FinishReason::None) x.finish = u.output.finish;
    }
    EXPECT_LE(info.rows, s.config().token_budget);
    if (steps) steps->push_back(info);
  }
  if (preemptions) *preemptions = s.preemptions();
  EXPECT_EQ(r.page_pool().used_pages(), 0);
  EXPECT_EQ(r.page_pool().n_live(), 0);
  return res;
}

// Each job alone in a runner that holds it whole: the reference.
std::vector<Result> run_alone(const std::vector<Job>& js) {
  std::vector<Result> out;
  for (const Job& j : js) {
    CpuRunner r(ref_model(), small_cache(), kCtx, 1);
    out.push_back(run_all(r, {j}, {})[0]);
  }
  return out;
}

}  // namespace

TEST(Scheduler, ConcurrentRequestsGiveEachRequestsOutputAlone) {
  const std::vector<Job> js = jobs();
  const std::vector<Result> alone = run_alone(js);
  CpuRunner r(ref_model(), small_cache(), kCtx, 4);
  std::vector<StepInfo> steps;
  const std::vector<Result> together = run_all(r, js, {}, nullptr, &steps);
  for (size_t i = 0; i < js.size(); ++i) {
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(together[i].text, alone[i].text) << "request " << i;
    EXPECT_EQ(together[i].finish, alone[i].finish);
    EXPECT_FALSE(alone[i].tokens.empty());
  }
  // Continuous batching: some step fed decode tokens of one request and a prefill chunk of another.
  bool mixed = false;
  for (const StepInfo& s : steps) mixed |= s.decode_rows > 0 && s.rows > s.decode_rows;
  EXPECT_TRUE(mixed);
}

TEST(Scheduler, TokenBudgetCutsOnlyTheFirstChunkAndEveryStepStaysWithinIt) {
  const std::vector<Job> js = jobs();
  CpuRunner r(ref_model(), small_cache(), kCtx, 4);
  SchedulerConfig cfg;
  cfg.token_budget = 6;  // below the chunk of 16: prefill chunks are cut to what the decode tokens leave
  std::vector<StepInfo> steps;
  const std::vector<Result> res = run_all(r, js, cfg, nullptr, &steps);
  for (const StepInfo& s : steps) EXPECT_LE(s.rows, 6);
  for (size_t i = 0; i < js.size(); ++i) {
    EXPECT_EQ(int(res[i].tokens.size()), js[i].params.max_tokens) << "request " << i;  // no stop ids: all of them
    EXPECT_EQ(res[i].finish, FinishReason::Length);
  }
}

TEST(Scheduler, PreemptionCompletesEveryRequestWithTheUnpreemptedOutput) {
  const std::vector<Job> js = jobs();
  const std::vector<Result> alone = run_alone(js);
  const ModelConfig& mc = ref_model().config();
  const CacheLayout l = cache_layout(small_cache(), mc.n_layers, mc.n_kv_heads, mc.head_dim);
  // Four slots, and pages for four sequences' windows and one sequence of the whole context: the requests cannot all
  // grow at once.
  const int pages = l.pages_for(kCtx);
  int need = 0;
  for (const Job& j : js) need += l.pages_for(int(j.prompt.size()) + j.params.max_tokens - 1);
  ASSERT_GT(need, pages);
  CpuRunner r(ref_model(), small_cache(), kCtx, 4, size_t(4 * l.window_pages() + pages) * size_t(l.page_bytes));
  ASSERT_EQ(r.page_pool().n_pages(), 4 * l.window_pages() + pages);
  int64_t preemptions = 0;
  const std::vector<Result> res = run_all(r, js, {}, nullptr, nullptr, &preemptions);
  EXPECT_GT(preemptions, 0);
  for (size_t i = 0; i < js.size(); ++i) {
    EXPECT_EQ(res[i].tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(res[i].text, alone[i].text) << "request " << i;
    EXPECT_EQ(res[i].finish, alone[i].finish) << "request " << i;
  }
}

TEST(Scheduler, AdmissionWaitsForPagesAndSlots) {
  const ModelConfig& mc = ref_model().config();
  const CacheLayout l = cache_layout(small_cache(), mc.n_layers, mc.n_kv_heads, mc.head_dim);
  const std::vector<int32_t> prompt(40, 11);  // 40 tokens: pages_for(41) = 4 pages of the quantized region
  ASSERT_EQ(l.pages_for(41), 4);
  // Two sequences' windows and 7 pages: a request takes its windows and 4 pages, so the second waits.
  CpuRunner r(ref_model(), small_cache(), 64, 3, size_t(2 * l.window_pages() + 7) * size_t(l.page_bytes));
  Scheduler s(r);
  for (int i = 0; i < 3; ++i) s.add(std::make_unique<Generation>(prompt, greedy(2), nullptr));
  StepInfo info;
  s.step(&info);
  EXPECT_EQ(info.admitted, 1);
  EXPECT_EQ(s.n_running(), 1);
  EXPECT_EQ(s.n_waiting(), 2);
  int finished = 0;
  for (int guard = 0; guard < 200 && !s.idle(); ++guard)
    for (auto& u : s.step()) finished += u.output.finish != FinishReason::None;
  EXPECT_EQ(finished, 3);
  EXPECT_EQ(r.page_pool().used_pages(), 0);
  // Two sequences' windows and 8 pages: exactly two requests at once (a request's windows are counted once: they leave
  // the free pages when its sequence opens).
  CpuRunner two(ref_model(), small_cache(), 64, 3, size_t(2 * l.window_pages() + 8) * size_t(l.page_bytes));
  Scheduler s2(two);
  for (int i = 0; i < 3; ++i) s2.add(std::make_unique<Generation>(prompt, greedy(2), nullptr));
  s2.step(&info);
  EXPECT_EQ(info.admitted, 2);
  EXPECT_EQ(s2.n_waiting(), 1);
}

TEST(Scheduler, ChoicesOfALargeVocabularyChosenInParallelEqualEachRequestAlone) {
  // models/ref's shapes with 131,072 tokens and random weights: a step of 8 or more sampled rows is enough work that
  // the scheduler chooses their tokens in parallel (Scheduler::kParallelChoiceWork); each request alone chooses on
  // the step's thread. Every sampling path: top_p, min_p, penalties and bias, log-probabilities, temperature alone.
  ModelConfig cfg = ref_model().config();
  cfg.vocab_size = 131072, cfg.n_layers = 2;
  const std::unique_ptr<Model> m = Model::dummy("large-vocab", cfg, 5, 2);
  std::vector<GenerateParams> params;
  for (int i = 0; i < 12; ++i) {
    GenerateParams p;
    p.max_tokens = 5;
    p.sampler = SamplerConfig{.temperature = 0.7f + 0.05f * float(i), .top_k = 0, .top_p = i % 4 == 0 ? 1.f : 0.9f,
                              .seed = uint64_t(100 + i), .min_p = i % 4 == 1 ? 0.01f : 0.f};
    if (i % 4 == 2) p.sampler.presence_penalty = 0.5f, p.sampler.logit_bias = {{17, 2.f}};
    if (i % 4 == 3) p.top_logprobs = 2;
    params.push_back(p);
  }
  ASSERT_TRUE(Sampler(params[0].sampler).draws_by_gumbel(cfg.vocab_size));
  const auto run = [&](const std::vector<size_t>& which) {
    CpuRunner r(*m, small_cache(), kCtx, int(which.size()));
    Scheduler s(r);
    std::map<Scheduler::Id, size_t> index;
    for (size_t i : which) {
      const std::vector<int32_t> prompt = {int32_t(1 + i), int32_t(1000 + 7 * i), int32_t(90000 + i), 5};
      index[s.add(std::make_unique<Generation>(prompt, params[i], nullptr))] = i;
    }
    std::map<size_t, std::vector<GeneratedToken>> out;
    while (!s.idle())
      for (Scheduler::Update& u : s.step())
        for (auto& t : u.output.tokens) out[index.at(u.id)].push_back(t);
    return out;
  };
  std::vector<size_t> all(params.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  const auto together = run(all);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto alone = run({i});
    ASSERT_EQ(together.at(i).size(), 5u);
    for (size_t t = 0; t < 5; ++t) {
      EXPECT_EQ(together.at(i)[t].id, alone.at(i)[t].id) << "request " << i << " token " << t;
      EXPECT_EQ(together.at(i)[t].logprob, alone.at(i)[t].logprob);
      EXPECT_EQ(together.at(i)[t].top.size(), alone.at(i)[t].top.size());
    }
  }
}

TEST(Scheduler, CancelFreesTheSequenceAndContextOverflowIsRefused) {
  CpuRunner r(ref_model(), small_cache(), 64, 2);
  Scheduler s(r);
  EXPECT_THROW(s.add(std::make_unique<Generation>(std::vector<int32_t>(60, 3), greedy(10), nullptr)), Error);
  const Scheduler::Id a = s.add(std::make_unique<Generation>(std::vector<int32_t>(40, 3), greedy(20), nullptr));
  const Scheduler::Id b = s.add(std::make_unique<Generation>(std::vector<int32_t>(10, 4), greedy(20), nullptr));
  for (int i = 0; i < 4; ++i) s.step();
  EXPECT_EQ(s.n_running(), 2);
  EXPECT_GT(r.page_pool().used_pages(), 0);
  s.cancel(a);
  EXPECT_EQ(s.n_running(), 1);
  bool saw_cancel = false;
  for (auto& u : s.step()) saw_cancel |= u.id == a && u.output.finish == FinishReason::Cancelled;
  EXPECT_TRUE(saw_cancel);
  s.cancel(b);
  s.step();
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(r.page_pool().used_pages(), 0);
  EXPECT_EQ(r.page_pool().n_live(), 0);
}

namespace {

// n choices of one prompt as a group through one scheduler over r; per-choice results, and the rows every step fed.
std::vector<Result> run_group(Runner& r, const std::vector<Job>& choices, int64_t* rows, int64_t* preemptions) {
  Scheduler s(r);
  std::vector<std::unique_ptr<Generation>> gens;
  for (const Job& j : choices) gens.push_back(std::make_unique<Generation>(j.prompt, j.params, &ref_tokenizer()));
  const std::vector<Scheduler::Id> ids = s.add_group(std::move(gens));
  std::map<Scheduler::Id, size_t> index;
  for (size_t i = 0; i < ids.size(); ++i) index[ids[i]] = i;
  std::vector<Result> res(choices.size());
  *rows = 0;
  for (int guard = 0; !s.idle() && guard < 2000; ++guard) {
    StepInfo info;
    for (Scheduler::Update& u : s.step(&info)) {
      Result& x = res[index.at(u.id)];
      for (const auto& t : u.output.tokens) x.tokens.push_back(t.id);
      x.text += u.output.text;
      if (u.output.finish != FinishReason::None) x.finish = u.output.finish;
    }
    *rows += info.rows;
  }
  EXPECT_TRUE(s.idle());
  *preemptions = s.preemptions();
  EXPECT_EQ(r.page_pool().used_pages(), 0);
  EXPECT_EQ(r.page_pool().n_live(), 0);
  return res;
}

// Three sampled choices of a 40-token prompt, seeds 5, 6, 7, with a presence penalty.
std::vector<Job> choices() {
  const std::vector<int32_t> prompt = ref_tokenizer().encode(
      "The kernel schedules processes on every CPU, and the scheduler picks the next task to run when the current "
      "one blocks or its time slice ends, so that every runnable process gets its share of the processor time and "
      "interactive tasks");
  EXPECT_GE(prompt.size(), 45u);  // past a pool of one whole context with two prompts' pages (below)
  EXPECT_LE(prompt.size(), 53u);  // + 12 tokens within the context of 64
  std::vector<Job> out;
  for (uint64_t i = 0; i < 3; ++i) {
    GenerateParams p;
    p.max_tokens = 12;
    p.sampler = SamplerConfig{.temperature = 0.9f, .top_k = 0, .top_p = 0.95f, .seed = 5 + i, .presence_penalty = 0.4f};
    out.push_back({prompt, p});
  }
  return out;
}

}  // namespace

TEST(Scheduler, ChoicesOfOnePromptArePrefilledOnceAndEqualEachChoiceServedAlone) {
  const std::vector<Job> js = choices();
  const std::vector<Result> alone = run_alone(js);
  CpuRunner r(ref_model(), small_cache(), kCtx, 4);
  int64_t rows = 0, preemptions = 0;
  const std::vector<Result> res = run_group(r, js, &rows, &preemptions);
  int64_t fed = int64_t(js[0].prompt.size());  // one prefill, then each choice's generated tokens but its last
  for (size_t i = 0; i < js.size(); ++i) {
    EXPECT_EQ(res[i].tokens, alone[i].tokens) << "choice " << i;
    EXPECT_EQ(res[i].text, alone[i].text) << "choice " << i;
    EXPECT_EQ(res[i].finish, alone[i].finish) << "choice " << i;
    fed += int64_t(res[i].tokens.size()) - 1;
  }
  EXPECT_NE(res[0].tokens, res[1].tokens);  // different seeds, different choices
  EXPECT_EQ(rows, fed);
  EXPECT_EQ(preemptions, 0);
}

TEST(Scheduler, AChoiceWithoutRoomAtTheForkIsRecomputedWithTheSameTokens) {
  const std::vector<Job> js = choices();
  const std::vector<Result> alone = run_alone(js);
  const ModelConfig& mc = ref_model().config();
  const CacheLayout l = cache_layout(small_cache(), mc.n_layers, mc.n_kv_heads, mc.head_dim);
  // Pages for one sequence of the whole context: the leader holds most of them at the fork.
  const int pages = l.pages_for(kCtx);
  ASSERT_GT(2 * l.pages_for(int(js[0].prompt.size())), pages);
  CpuRunner r(ref_model(), small_cache(), kCtx, 3, size_t(3 * l.window_pages() + pages) * size_t(l.page_bytes));
  int64_t rows = 0, preemptions = 0;
  const std::vector<Result> res = run_group(r, js, &rows, &preemptions);
  EXPECT_GT(preemptions, 0);
  for (size_t i = 0; i < js.size(); ++i) {
    EXPECT_EQ(res[i].tokens, alone[i].tokens) << "choice " << i;
    EXPECT_EQ(res[i].finish, alone[i].finish) << "choice " << i;
  }
}

TEST(Scheduler, CancellingTheLeaderBeforeTheForkLeavesTheOtherChoicesRunning) {
  const std::vector<Job> js = choices();
  const std::vector<Result> alone = run_alone(js);
  CpuRunner r(ref_model(), small_cache(), kCtx, 4);
  Scheduler s(r);
  std::vector<std::unique_ptr<Generation>> gens;
  for (const Job& j : js) gens.push_back(std::make_unique<Generation>(j.prompt, j.params, &ref_tokenizer()));
  const std::vector<Scheduler::Id> ids = s.add_group(std::move(gens));
  s.step();  // the first prefill chunk of the leader
  s.cancel(ids[0]);
  std::map<Scheduler::Id, Result> res;
  for (int guard = 0; !s.idle() && guard < 2000; ++guard)
    for (Scheduler::Update& u : s.step()) {
      for (const auto& t : u.output.tokens) res[u.id].tokens.push_back(t.id);
      if (u.output.finish != FinishReason::None) res[u.id].finish = u.output.finish;
    }
  EXPECT_EQ(res[ids[0]].finish, FinishReason::Cancelled);
  for (size_t i = 1; i < 3; ++i) EXPECT_EQ(res[ids[i]].tokens, alone[i].tokens) << "choice " << i;
  EXPECT_EQ(r.page_pool().n_live(), 0);
}
