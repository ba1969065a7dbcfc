#include "eval/passkey.h"

#include <chrono>
#include <cmath>

#include "common/error.h"
#include "eval/metrics.h"

namespace kvq {

namespace {

std::string fill_key(std::string s, int key) {
  const std::string k = std::to_string(key);
  for (size_t p = s.find("{key}"); p != std::string::npos; p = s.find("{key}", p + k.size())) s.replace(p, 5, k);
  return s;
}

}  // namespace

PasskeyParts passkey_parts(const Tokenizer& tok, int key) {
  KVQ_CHECK(key >= kPasskeyKeyMin && key <= kPasskeyKeyMax, "pass key {} outside [{}, {}]", key, kPasskeyKeyMin,
            kPasskeyKeyMax);
  return PasskeyParts{tok.encode(fill_key(kPasskeyNeedle, key)), tok.encode(kPasskeyQuestion),
                      tok.encode(fill_key(kPasskeyAnswer, key))};
}

int64_t round_half_even(double x) { return int64_t(std::nearbyint(x)); }  // default rounding mode: to nearest even

PasskeyPrompt make_passkey_prompt(const Tokenizer& tok, std::span<const int32_t> haystack, int ctx, int key,
                                  double depth, int64_t hay_start) {
  KVQ_CHECK(depth >= 0 && depth <= 1, "passkey depth {} outside [0, 1]", depth);
  PasskeyParts parts = passkey_parts(tok, key);
  const int fixed = int(parts.needle.size() + parts.question.size() + parts.answer.size());
  const int n_hay = ctx - fixed;
  KVQ_CHECK(n_hay >= 1, "passkey context {} is too short: needle, question and answer alone take {} tokens", ctx,
            fixed);
  KVQ_CHECK(hay_start >= 0 && hay_start + n_hay <= int64_t(haystack.size()),
            "passkey haystack of {} tokens cannot supply {} tokens from {}", haystack.size(), n_hay, hay_start);
  PasskeyPrompt p;
  p.key = key;
  p.depth = depth;
  p.n_hay = n_hay;
  p.hay_start = hay_start;
  p.needle_pos = int(round_half_even(depth * double(n_hay)));
  const int32_t* h = haystack.data() + hay_start;
  p.prompt.reserve(size_t(ctx));
  p.prompt.insert(p.prompt.end(), h, h + p.needle_pos);
  p.prompt.insert(p.prompt.end(), parts.needle.begin(), parts.needle.end());
  p.prompt.insert(p.prompt.end(), h + p.needle_pos, h + n_hay);
  p.prompt.insert(p.prompt.end(), parts.question.begin(), parts.question.end());
  p.answer = std::move(parts.answer);
  return p;
}

PasskeyPrompt PasskeyGenerator::next(int ctx, double depth) {
  const int key = int(rng_.uniform_int(kPasskeyKeyMin, kPasskeyKeyMax));
  const PasskeyParts parts = passkey_parts(*tok_, key);
  const int64_t n_hay = ctx - int64_t(parts.needle.size() + parts.question.size() + parts.answer.size());
  KVQ_CHECK(n_hay >= 1, "passkey context {} is too short for the needle, question and answer", ctx);
  KVQ_CHECK(int64_t(hay_.size()) >= n_hay + 1, "the eval text has {} tokens, too few for a {}-token passkey haystack",
            hay_.size(), n_hay);
  const int64_t start = rng_.uniform_int(0, int64_t(hay_.size()) - n_hay - 1);
  return make_passkey_prompt(*tok_, hay_, ctx, key, depth, start);
}

int32_t prefill_argmax(Runner& runner, int seq, std::span<const int32_t> prompt) {
  KVQ_CHECK(!prompt.empty(), "prefill_argmax: an empty prompt");
  const int chunk = runner.cache_config().max_chunk;
  int32_t next = 0;
  for (size_t i = 0; i < prompt.size(); i += size_t(chunk)) {
    const int n = int(std::min(prompt.size() - i, size_t(chunk)));
    const bool last = i + size_t(n) == prompt.size();
    runner.forward({seq}, {n}, prompt.data() + i, last ? LogitRows::Last : LogitRows::None, nullptr, &next);
  }
  return next;
}

std::vector<int32_t> greedy_decode(Runner& runner, std::span<const int32_t> prompt, int n_new) {
  KVQ_CHECK(!prompt.empty() && n_new >= 1, "greedy_decode: {} prompt tokens, {} new", prompt.size(), n_new);
  const int seq = runner.new_sequence();
  std::vector<int32_t> out;
  int32_t next = 0;
  try {
    out.push_back(prefill_argmax(runner, seq, prompt));
    runner.end_prompt(seq);  // the first answer token comes from the prefill; the rest read the cache after it
    while (int(out.size()) < n_new) {
      runner.forward({seq}, {1}, &out.back(), LogitRows::Last, nullptr, &next);
      out.push_back(next);
    }
  } catch (...) {
    runner.free_sequence(seq);
    throw;
  }
  runner.free_sequence(seq);
  return out;
}

PasskeyResult run_passkey(Runner& runner, PasskeyGenerator& gen, int ctx, const std::vector<double>& depths, int trials,
                          const std::function<void(int, int)>& progress) {
  KVQ_CHECK(trials >= 1 && !depths.empty(), "passkey: {} trials at {} depths", trials, depths.size());
  KVQ_CHECK(ctx <= runner.config().max_ctx, "context {} exceeds the model's maximum of {} tokens", ctx,
            runner.config().max_ctx);
  KVQ_CHECK(ctx <= runner.max_ctx(), "passkey: context {} exceeds the runner's {} tokens", ctx, runner.max_ctx());
  PasskeyResult r;
  r.ctx = ctx;
  const auto t0 = std::chrono::steady_clock::now();
  const int total = int(depths.size()) * trials;
  for (double depth : depths) {
    PasskeyCell cell;
    cell.depth = depth;
    for (int t = 0; t < trials; ++t) {
      const PasskeyPrompt p = gen.next(ctx, depth);
      const std::vector<int32_t> got = greedy_decode(runner, p.prompt, int(p.answer.size()));
      const bool ok = got == p.answer;
      cell.correct += ok ? 1 : 0;
      cell.keys.push_back(p.key);
      cell.correct_by_trial.push_back(ok ? 1 : 0);
      ++cell.trials;
      if (progress) progress(r.trials + cell.trials, total);
    }
    r.correct += cell.correct;
    r.trials += cell.trials;
    r.by_depth.push_back(cell);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kvq
