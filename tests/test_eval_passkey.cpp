// Passkey prompts: the reference model's training format, the needle's ids at round(depth · n_hay) for every
// depth, the prompt length ctx - len(answer), and the generator's determinism per seed.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "eval/passkey.h"
#include "tokenizer/tokenizer.h"

using namespace kvq;

namespace {

const Tokenizer& ref_tokenizer() {
  static Tokenizer tok = Tokenizer::load(std::string(KVQ_SOURCE_DIR) + "/models/ref/tokenizer.json");
  return tok;
}

std::vector<int32_t> haystack(int n) {  // distinct ids, so any misplacement shows
  std::vector<int32_t> h(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) h[size_t(i)] = 100 + i % 7000;
  return h;
}

}  // namespace

TEST(EvalPasskey, PartsSpellTheTrainingFormat) {
  const Tokenizer& tok = ref_tokenizer();
  const PasskeyParts p = passkey_parts(tok, 48213);
  EXPECT_EQ(tok.decode(p.needle), " The pass key is 48213. Remember it. 48213 is the pass key. ");
  EXPECT_EQ(tok.decode(p.question), " What is the pass key? The pass key is");
  EXPECT_EQ(tok.decode(p.answer), " 48213");
  EXPECT_THROW(passkey_parts(tok, 9999), Error);
  EXPECT_THROW(passkey_parts(tok, 100000), Error);
}

TEST(EvalPasskey, RoundHalfEvenMatchesPythonRound) {
  EXPECT_EQ(round_half_even(2.5), 2);
  EXPECT_EQ(round_half_even(3.5), 4);
  EXPECT_EQ(round_half_even(0.5), 0);
  EXPECT_EQ(round_half_even(0.3 * 1000), 300);
  EXPECT_EQ(round_half_even(2.6), 3);
}

TEST(EvalPasskey, NeedleSitsAtRoundDepthTimesHayForEveryDepth) {
  const Tokenizer& tok = ref_tokenizer();
  const std::vector<int32_t> hay = haystack(5000);
  const int ctx = 512, key = 31337;
  const PasskeyParts parts = passkey_parts(tok, key);
  const int n_hay = ctx - int(parts.needle.size() + parts.question.size() + parts.answer.size());
  for (int i = 0; i <= 10; ++i) {
    const double depth = i / 10.0;
    const int64_t start = 17 * i;
    const PasskeyPrompt p = make_passkey_prompt(tok, hay, ctx, key, depth, start);
    ASSERT_EQ(p.prompt.size(), size_t(ctx) - parts.answer.size()) << depth;
    EXPECT_EQ(p.n_hay, n_hay);
    const int pos = int(round_half_even(depth * n_hay));
    EXPECT_EQ(p.needle_pos, pos);
    EXPECT_EQ(std::vector<int32_t>(p.prompt.begin() + pos, p.prompt.begin() + pos + long(parts.needle.size())),
              parts.needle);
    EXPECT_EQ(std::vector<int32_t>(p.prompt.begin(), p.prompt.begin() + pos),
              std::vector<int32_t>(hay.begin() + start, hay.begin() + start + pos));
    const size_t after = size_t(pos) + parts.needle.size();
    EXPECT_EQ(std::vector<int32_t>(p.prompt.begin() + long(after), p.prompt.end() - long(parts.question.size())),
              std::vector<int32_t>(hay.begin() + start + pos, hay.begin() + start + n_hay));
    EXPECT_EQ(std::vector<int32_t>(p.prompt.end() - long(parts.question.size()), p.prompt.end()), parts.question);
    EXPECT_EQ(p.answer, parts.answer);
  }
  EXPECT_THROW(make_passkey_prompt(tok, hay, 30, key, 0.5, 0), Error);     // ctx shorter than the parts
  EXPECT_THROW(make_passkey_prompt(tok, hay, 512, key, 0.5, 4900), Error); // haystack runs out
  EXPECT_THROW(make_passkey_prompt(tok, hay, 512, key, 1.5, 0), Error);    // depth outside [0, 1]
}

TEST(EvalPasskey, GeneratorIsDeterministicPerSeed) {
  const Tokenizer& tok = ref_tokenizer();
  const std::vector<int32_t> hay = haystack(20000);
  PasskeyGenerator a(tok, hay, 5), b(tok, hay, 5), c(tok, hay, 6);
  bool any_diff = false;
  for (int i = 0; i < 8; ++i) {
    const PasskeyPrompt pa = a.next(1024, 0.3), pb = b.next(1024, 0.3), pc = c.next(1024, 0.3);
    EXPECT_EQ(pa.prompt, pb.prompt);
    EXPECT_EQ(pa.key, pb.key);
    EXPECT_EQ(pa.hay_start, pb.hay_start);
    EXPECT_GE(pa.key, kPasskeyKeyMin);
    EXPECT_LE(pa.key, kPasskeyKeyMax);
    EXPECT_EQ(tok.decode(pa.answer), " " + std::to_string(pa.key));
    EXPECT_GE(pa.hay_start, 0);
    EXPECT_LE(pa.hay_start + pa.n_hay, int64_t(hay.size()) - 1);
    EXPECT_EQ(pa.prompt.size() + pa.answer.size(), size_t(1024));
    any_diff |= pa.key != pc.key || pa.hay_start != pc.hay_start;
  }
  EXPECT_TRUE(any_diff);
}
