// Tokenizer (src/tokenizer/): byte-level BPE from a Hugging Face tokenizer.json, checked on small fixtures
// whose ids follow from the merge table by hand (tests/tokenizer/make_fixtures.py), and on the golden cases
// written by Hugging Face tokenizers (TokenizerGolden.*).
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

using namespace kvq;
using Ids = std::vector<int32_t>;

namespace {

std::string fixture(const std::string& name) { return std::string(KVQ_SOURCE_DIR) + "/tests/tokenizer/" + name; }

Tokenizer load_fixture(const std::string& name) { return Tokenizer::load(fixture(name)); }

// Fixture ids: specials 0..2, byte b -> 3 + b, then the merged tokens.
int32_t B(char c) { return 3 + static_cast<uint8_t>(c); }
constexpr int32_t kHello = 262, kGWorld = 267, kGG = 268, kAA = 269, kAAAA = 270, kNN = 271, kOr = 264, kLl = 260;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return std::string(e.what()) + " | " + e.where() + " | " + e.hint();
  }
  return "<no kvq::Error>";
}

std::string decode(const Tokenizer& t, const Ids& ids) { return t.decode(std::span<const int32_t>(ids)); }

}  // namespace

TEST(TokenizerUnicode, ByteLevelMapIsGpt2BytesToUnicode) {
  const auto& m = unicode::byte_level_map();
  EXPECT_EQ(m.byte_to_cp['A'], U'A');
  EXPECT_EQ(m.byte_to_cp[' '], U'\u0120');   // 'Ġ'
  EXPECT_EQ(m.byte_to_cp['\n'], U'\u010A');  // 'Ċ'
  EXPECT_EQ(m.byte_to_cp[0], U'\u0100');
  EXPECT_EQ(m.byte_to_cp[0x7F], U'\u0121');
  EXPECT_EQ(m.byte_to_cp[0xAD], U'\u0143');
  EXPECT_EQ(m.byte_to_cp[0xFF], U'\u00FF');
  std::string raw;
  ASSERT_TRUE(unicode::byte_level_decode("\xC4\xA0the", raw));  // "Ġthe"
  EXPECT_EQ(raw, " the");
  EXPECT_FALSE(unicode::byte_level_decode(" the", raw));  // ' ' itself is not in the alphabet
}

TEST(TokenizerUnicode, Utf8IncompleteTailHoldsOnlyCompletableSequences) {
  EXPECT_EQ(unicode::utf8_incomplete_tail("abc"), 0u);
  EXPECT_EQ(unicode::utf8_incomplete_tail("a\xE6"), 1u);          // first byte of 日
  EXPECT_EQ(unicode::utf8_incomplete_tail("a\xE6\x97"), 2u);      // two of three
  EXPECT_EQ(unicode::utf8_incomplete_tail("a\xE6\x97\xA5"), 0u);  // complete 日
  EXPECT_EQ(unicode::utf8_incomplete_tail("\xF0\x9F\x98"), 3u);   // three of 😀's four
  EXPECT_EQ(unicode::utf8_incomplete_tail("\xE0\x80"), 0u);       // overlong: can never complete
  EXPECT_EQ(unicode::utf8_incomplete_tail("\x80"), 0u);           // stray continuation
  EXPECT_EQ(unicode::utf8_incomplete_tail("\xFF"), 0u);
  EXPECT_TRUE(unicode::is_valid_utf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(unicode::is_valid_utf8("\xED\xA0\x80"));  // surrogate
  EXPECT_FALSE(unicode::is_valid_utf8("\xC0\xAF"));      // overlong '/'
}

TEST(TokenizerUnicode, NfcComposesCombiningAccent) {
  EXPECT_EQ(unicode::nfc("cafe\xCC\x81"), "caf\xC3\xA9");
  EXPECT_EQ(unicode::nfc("plain ascii"), "plain ascii");
}

TEST(TokenizerBasic, MergesByRankLeftmostFirst) {
  const Tokenizer t = load_fixture("basic.json");
  EXPECT_EQ(t.vocab_size(), 272);
  EXPECT_EQ(t.encode("hello world"), (Ids{kHello, kGWorld}));
  EXPECT_EQ(t.encode("hello world!"), (Ids{kHello, kGWorld, B('!')}));
  EXPECT_EQ(t.encode("Hello"), (Ids{B('H'), B('e'), kLl, B('o')}));  // no "e ll" merge
  EXPECT_EQ(t.encode("aaaaa"), (Ids{kAAAA, B('a')}));                // a a | a a | a, then aa aa
  EXPECT_EQ(t.encode("   "), (Ids{kGG, B(' ')}));                    // one pre-token, leftmost Ġ Ġ first
  EXPECT_EQ(t.encode("\n\n\n"), (Ids{kNN, B('\n')}));
  EXPECT_EQ(t.encode(""), Ids{});
}

TEST(TokenizerBasic, SplitIsolatedKeepsMatchesAndGaps) {
  const Tokenizer t = load_fixture("basic.json");
  // Qwen2 pattern: "\s*[\r\n]+" keeps the newline pair together (ĊĊ), "\s+(?!\S)" leaves the space that
  // precedes a word to that word: "a  world" -> "a", " ", " world".
  EXPECT_EQ(t.encode("a\n\nb"), (Ids{B('a'), kNN, B('b')}));
  EXPECT_EQ(t.encode("a  world"), (Ids{B('a'), B(' '), kGWorld}));
  // Contractions are case-insensitive in the Qwen2 pattern: "'S" is its own pre-token.
  EXPECT_EQ(t.encode("HELLO'S"), (Ids{B('H'), B('E'), B('L'), B('L'), B('O'), B('\''), B('S')}));
  EXPECT_EQ(t.encode("more"), (Ids{B('m'), kOr, B('e')}));
}

TEST(TokenizerBasic, BothMergeFormatsGiveTheSameIds) {
  const Tokenizer a = load_fixture("basic.json");
  const Tokenizer b = load_fixture("basic_pairs.json");
  for (const char* s : {"hello world", "aaaaaaa", "  \n\n world hello", "Hello, World!"})
    EXPECT_EQ(a.encode(s), b.encode(s)) << s;
}

TEST(TokenizerBasic, SpecialTokensAreMatchedInRawTextAndSplitAround) {
  const Tokenizer t = load_fixture("basic.json");
  EXPECT_EQ(t.encode("<|endoftext|>"), (Ids{0}));
  EXPECT_EQ(t.encode("text<|endoftext|>more"),
            (Ids{B('t'), B('e'), B('x'), B('t'), 0, B('m'), kOr, B('e')}));
  EXPECT_EQ(t.encode("<|im_start|>hello<|im_end|>"), (Ids{1, kHello, 2}));
  EXPECT_EQ(t.encode("<|im_end"), (Ids{B('<'), B('|'), B('i'), B('m'), B('_'), B('e'), B('n'), B('d')}));
  EXPECT_EQ(decode(t, {1, kHello, 2}), "<|im_start|>hello<|im_end|>");
  EXPECT_EQ(t.find("<|im_end|>"), 2);
  EXPECT_EQ(t.find("\xC4\xA0world"), kGWorld);  // "Ġworld", as written in the file
  EXPECT_EQ(t.find(" world"), std::nullopt);
}

TEST(TokenizerBasic, IgnoreMergesEmitsWholeVocabPreTokens) {
  const Tokenizer t = load_fixture("ignore_merges.json");
  const int32_t yz = 272, xyz = 274;
  EXPECT_EQ(t.encode("xyz"), (Ids{xyz}));  // in the vocab: emitted directly
  EXPECT_EQ(t.encode("xyzz"), (Ids{B('x'), yz, B('z')}));  // not in the vocab: merges (y z first)
  // Without ignore_merges the same table gives [x, yz].
  std::ifstream in(fixture("ignore_merges.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  j["model"]["ignore_merges"] = false;
  const Tokenizer u = Tokenizer::parse(j.dump(), "ignore_merges.json with ignore_merges = false");
  EXPECT_EQ(u.encode("xyz"), (Ids{B('x'), yz}));
}

TEST(TokenizerAddedTokens, SingleWordLstripRstripAndNormalizedFlags) {
  const Tokenizer t = load_fixture("added_flags.json");
  const int32_t mask = 272, tool = 273, cafe = 274;
  EXPECT_EQ(t.encode("a [MASK] b"), (Ids{B('a'), B(' '), mask, B(' '), B('b')}));
  // A word character touching it: not a single word, so the text is encoded as text.
  EXPECT_EQ(t.encode("a[MASK]"), (Ids{B('a'), B('['), B('M'), B('A'), B('S'), B('K'), B(']')}));
  EXPECT_EQ(t.encode("x  <tool>\t y"), (Ids{B('x'), tool, B('y')}));  // both sides' whitespace swallowed
  EXPECT_EQ(t.encode("le caf\xC3\xA9"), (Ids{B('l'), B('e'), B(' '), cafe}));
  // No normalizer: the decomposed spelling is different text and does not match.
  const Ids decomposed = t.encode("caf" "e\xCC\x81");
  EXPECT_TRUE(std::find(decomposed.begin(), decomposed.end(), cafe) == decomposed.end());
  EXPECT_EQ(decode(t, {B('x'), tool, B('y')}), "x<tool>y");
}

TEST(TokenizerAddedTokens, NfcNormalizerMatchesDecomposedText) {
  const Tokenizer t = load_fixture("nfc.json");
  const int32_t cafe = 274;
  EXPECT_EQ(t.encode("caf" "e\xCC\x81"), (Ids{cafe}));
  EXPECT_EQ(t.encode("e\xCC\x81"), (Ids{B('\xC3'), B('\xA9')}));  // é composed, then byte-level
  EXPECT_EQ(t.encode("hello world"), (Ids{kHello, kGWorld}));
}

TEST(TokenizerPreTokenizer, Gpt2ByteLevelRegexSplitsNewlinesApart) {
  const Tokenizer t = load_fixture("gpt2.json");
  // GPT-2's pattern has no "\s*[\r\n]+": the two newlines become separate pre-tokens (no ĊĊ merge).
  EXPECT_EQ(t.encode("a\n\nb"), (Ids{B('a'), B('\n'), B('\n'), B('b')}));
  EXPECT_EQ(t.encode("hello world"), (Ids{kHello, kGWorld}));
  EXPECT_EQ(t.encode("I'm"), (Ids{B('I'), B('\''), B('m')}));
}

TEST(TokenizerPreTokenizer, ByteLevelPrefixSpaceGoesOnEveryIncomingPiece) {
  std::ifstream in(fixture("gpt2.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  j["pre_tokenizer"]["add_prefix_space"] = true;
  const Tokenizer t = Tokenizer::parse(j.dump(), "gpt2.json with add_prefix_space");
  EXPECT_EQ(t.encode("hello world"), (Ids{B(' '), kHello, kGWorld}));  // " hello" has no merge "Ġ hello"
  EXPECT_EQ(t.encode(" world"), (Ids{kGWorld}));                      // already starts with a space
  // Inside a Sequence, HF's ByteLevel prepends the space to each piece the Split step produced.
  std::ifstream in2(fixture("basic.json"));
  nlohmann::json k = nlohmann::json::parse(in2);
  k["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
  const Tokenizer u = Tokenizer::parse(k.dump(), "basic.json with add_prefix_space");
  EXPECT_EQ(u.encode("hello world!"), (Ids{B(' '), kHello, kGWorld, B(' '), B('!')}));
}

TEST(TokenizerPreTokenizer, SplitRemovedDropsTheMatches) {
  std::ifstream in(fixture("basic.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  j["pre_tokenizer"]["pretokenizers"][0] = {
      {"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Removed"}, {"invert", false}};
  const Tokenizer t = Tokenizer::parse(j.dump(), "basic.json with Split(\"-\", Removed)");
  EXPECT_EQ(t.encode("hello-hello--aa"), (Ids{kHello, kHello, kAA}));
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Isolated";
  const Tokenizer u = Tokenizer::parse(j.dump(), "basic.json with Split(\"-\", Isolated)");
  EXPECT_EQ(u.encode("hello-hello--aa"), (Ids{kHello, B('-'), kHello, B('-'), B('-'), kAA}));
}

TEST(TokenizerPreTokenizer, TemplateProcessingAddsItsIds) {
  std::ifstream in(fixture("basic.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  j["post_processor"] = nlohmann::json::parse(R"({"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
               {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
    "pair": [], "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]},
                                   "<|im_end|>": {"id": "<|im_end|>", "ids": [2], "tokens": ["<|im_end|>"]}}})");
  const Tokenizer t = Tokenizer::parse(j.dump(), "basic.json with a template");
  EXPECT_EQ(t.encode("hello"), (Ids{1, kHello, 2}));
}

TEST(TokenizerErrors, UnsupportedOrBrokenComponentsAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"err_model_type.json", "model type \"WordPiece\""},
      {"err_merge_missing_token.json", "\"zz\", which is not in the vocab"},
      {"err_merge_result_missing.json", "makes \"zz\""},
      {"err_normalizer.json", "normalizer \"Lowercase\""},
      {"err_pre_tokenizer.json", "pre_tokenizer \"Metaspace\""},
      {"err_decoder.json", "decoder \"WordPiece\""},
      {"err_byte_fallback.json", "byte_fallback"},
      {"err_bad_json.json", "malformed tokenizer JSON"},
      {"does_not_exist.json", "cannot open tokenizer file"},
  };
  for (const auto& [file, expect] : cases) {
    const std::string msg = error_of([&] { Tokenizer::load(fixture(file)); });
    EXPECT_NE(msg.find(expect), std::string::npos) << file << ": " << msg;
    EXPECT_NE(msg.find(file), std::string::npos) << "error must name the file: " << msg;
  }
  EXPECT_NE(error_of([] { Tokenizer::parse("[1, 2]", "inline"); }).find("JSON object"), std::string::npos);
}

TEST(TokenizerErrors, InconsistentOrUnsupportedSettingsAreNamed) {
  std::ifstream in(fixture("basic.json"));
  const nlohmann::json base = nlohmann::json::parse(in);
  const auto msg = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = base;
    edit(j);
    return error_of([&] { Tokenizer::parse(j.dump(), "edited basic.json"); });
  };
  const auto has = [](const std::string& m, const char* s) { return m.find(s) != std::string::npos; };
  std::string m = msg([](auto& j) { j["model"]["vocab"]["hello"] = -4; });
  EXPECT_TRUE(has(m, "vocab token \"hello\": id must be an integer")) << m;
  m = msg([](auto& j) { j["model"]["vocab"]["hello"] = 261; });
  EXPECT_TRUE(has(m, "used by two tokens")) << m;
  m = msg([](auto& j) { j["added_tokens"][1]["id"] = 7; });
  EXPECT_TRUE(has(m, "\"<|im_start|>\" has id 7 but the vocab gives it id 1")) << m;
  m = msg([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; });
  EXPECT_TRUE(has(m, "invert")) << m;
  m = msg([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithPrevious"; });
  EXPECT_TRUE(has(m, "behavior \"MergedWithPrevious\"")) << m;
  m = msg([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; });
  EXPECT_TRUE(has(m, "does not compile")) << m;
  m = msg([](auto& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); });
  EXPECT_TRUE(has(m, "exactly one ByteLevel")) << m;
  m = msg([](auto& j) { j["post_processor"] = {{"type", "BertProcessing"}}; });
  EXPECT_TRUE(has(m, "post_processor \"BertProcessing\"")) << m;
  m = msg([](auto& j) { j["truncation"] = {{"max_length", 8}}; });
  EXPECT_TRUE(has(m, "\"truncation\" is set")) << m;
  m = msg([](auto& j) { j["model"]["vocab"].erase("\xC4\xA0"); });  // the token of byte ' ' ("Ġ")
  EXPECT_TRUE(has(m, "\"\xC4\xA0\", which is not in the vocab")) << m;  // merge "Ġ w" names it first
  m = msg([](auto& j) {
    j["model"]["vocab"].erase("\xC4\x81");  // the token of byte 0x01, which no merge uses
  });
  EXPECT_TRUE(has(m, "lacks the token for byte 0x01")) << m;
}

TEST(TokenizerErrors, UnknownIdsAreRejectedOnDecode) {
  const Tokenizer t = load_fixture("basic.json");
  EXPECT_NE(error_of([&] { decode(t, {kHello, 272}); }).find("272"), std::string::npos);
  EXPECT_NE(error_of([&] { t.token_bytes(-1); }).find("-1"), std::string::npos);
}

TEST(TokenizerRoundTrip, InvalidUtf8IsEncodedBytewiseAndRoundTrips) {
  const Tokenizer t = load_fixture("basic.json");
  for (const std::string& s : {std::string("ab\xFF" "cd"), std::string("\xE3\x81"), std::string("hello\xC0\xAF world"),
                              std::string("\xED\xA0\x80<|endoftext|>\x80\x80"), std::string("\n\xF5\n")}) {
    const Ids ids = t.encode(s);
    EXPECT_EQ(decode(t, ids), s);
  }
  // An invalid run is one pre-token of its own: its neighbours are encoded as if it were a boundary.
  EXPECT_EQ(t.encode("hello\xFFhello"), (Ids{kHello, B('\xFF'), kHello}));
}

TEST(TokenizerRoundTrip, RandomTextRoundTripsAndBothFastBpePathsMatchReference) {
  const Tokenizer t = load_fixture("basic.json");
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"a", "h", "e", "l", "o", " ", "\n", "w", "r", "d", "\xC3\xA9",
                                             "\xE6\x97\xA5", "\xF0\x9F\x98\x80", "'", "1", "\t", "<|endoftext|>"};
  for (int iter = 0; iter < 300; ++iter) {
    std::string s;
    const int n = rng() % 40;
    for (int i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
    ASSERT_EQ(decode(t, t.encode(s)), s) << s;
  }
  // BpeModel fast path (heap + linked list) against the O(n^2) reference on merge-heavy pieces.
  std::unordered_map<std::string, int32_t> vocab;
  for (int b = 0; b < 256; ++b) vocab[std::string(1, char(b))] = b;
  std::unordered_map<uint64_t, BpeModel::Merge> merges;
  const std::vector<std::pair<std::string, std::string>> table = {
      {"a", "b"}, {"b", "a"}, {"a", "a"}, {"ab", "a"}, {"aa", "b"}, {"ba", "ab"}, {"b", "b"}, {"aab", "aa"},
      {"bb", "a"}, {"aa", "aa"}, {"aba", "b"}};
  for (int32_t r = 0; r < static_cast<int32_t>(table.size()); ++r) {
    const auto& [l, rt] = table[r];
    if (!vocab.count(l + rt)) vocab[l + rt] = static_cast<int32_t>(vocab.size());
    merges[BpeModel::pair_key(vocab.at(l), vocab.at(rt))] = {r, vocab.at(l + rt)};
  }
  const BpeModel bpe(vocab, merges, false);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s;
    const int n = 1 + rng() % (2 * BpeModel::kSmallPiece);  // both the stack-array and the heap path
    for (int i = 0; i < n; ++i) s += (rng() % 2) ? 'a' : 'b';
    const Ids ref = bpe.encode_ref(s);
    Ids fast, heap;
    bpe.encode_uncached(s, fast);
    bpe.encode_heap(s, heap);
    ASSERT_EQ(fast, ref) << s;
    ASSERT_EQ(heap, ref) << s;
  }
}

TEST(TokenizerRoundTrip, CacheStaysBoundedAndResultsStable) {
  const Tokenizer t = load_fixture("basic.json");
  std::mt19937 rng(3);
  std::string text;
  for (size_t i = 0; i < BpeModel::kCacheMaxEntries + 5000; ++i) {
    text += ' ';
    for (int k = 0; k < 6; ++k) text += static_cast<char>('a' + rng() % 26);
  }
  const Ids first = t.encode(text);
  EXPECT_LE(t.cache_size(), BpeModel::kCacheMaxEntries);
  EXPECT_GT(t.cache_size(), 0u);
  EXPECT_EQ(t.encode(text), first);  // now partly from the cache
}

TEST(TokenizerRoundTrip, ConcurrentEncodesAgreeWithSerialOnes) {
  const Tokenizer t = load_fixture("basic.json");
  const std::string text = "hello world aaaa hello\n\n world  hello-world <|im_end|> aaaaaaa";
  const Ids expect = t.encode(text);
  std::vector<Ids> got(4);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int i = 0; i < 200; ++i) got[k] = t.encode(text);
    });
  for (auto& th : threads) th.join();
  for (const Ids& g : got) EXPECT_EQ(g, expect);
}

TEST(TokenizerStream, EmitsOnlyCompleteUtf8AndConcatenatesToDecode) {
  Tokenizer moved = load_fixture("basic.json");
  const Tokenizer t = std::move(moved);  // Tokenizer is movable
  const std::string text = "h\xC3\xA9llo \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80!";
  const Ids ids = t.encode(text);
  StreamDecoder sd(t);
  std::string all;
  size_t n_empty = 0;
  for (int32_t id : ids) {
    const std::string piece = sd.push(id);
    EXPECT_TRUE(unicode::is_valid_utf8(piece)) << piece;
    n_empty += piece.empty();
    all += piece;
  }
  all += sd.flush();
  EXPECT_EQ(all, text);
  EXPECT_EQ(n_empty, 1u + 2u + 2u + 3u);  // bytes held back inside é, 日, 本 and 😀
  // A dangling lead byte comes out on flush.
  StreamDecoder sd2(t);
  EXPECT_EQ(sd2.push(B('\xE6')), "");
  EXPECT_EQ(sd2.flush(), "\xE6");
}

// ---- Golden: ids written by Hugging Face tokenizers for the reference model's tokenizer.json ----

namespace {
const std::string kGoldenTokenizer = std::string(KVQ_SOURCE_DIR) + "/models/ref/tokenizer.json";
const std::string kGoldenCases = std::string(KVQ_SOURCE_DIR) + "/tests/golden/tokenizer_cases.json";

bool golden_present() { return std::filesystem::exists(kGoldenTokenizer) && std::filesystem::exists(kGoldenCases); }

nlohmann::json golden_cases() {
  std::ifstream in(kGoldenCases);
  return nlohmann::json::parse(in).at("cases");
}
}  // namespace

TEST(TokenizerGolden, IdsEqualHuggingFaceOnEveryCase) {
  if (!golden_present()) GTEST_SKIP() << "no " << kGoldenTokenizer << " / " << kGoldenCases << " yet (written by scripts/make_golden.py)";
  const Tokenizer t = Tokenizer::load(kGoldenTokenizer);
  const nlohmann::json cases = golden_cases();
  ASSERT_GT(cases.size(), 0u);
  for (const auto& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    EXPECT_EQ(t.encode(text), c.at("ids").get<Ids>()) << "text: " << text;
  }
}

TEST(TokenizerGolden, DecodeOfEncodeIsIdentityOnEveryCase) {
  if (!golden_present()) GTEST_SKIP() << "no " << kGoldenTokenizer << " / " << kGoldenCases << " yet (written by scripts/make_golden.py)";
  const Tokenizer t = Tokenizer::load(kGoldenTokenizer);
  for (const auto& c : golden_cases()) {
    const std::string text = c.at("text").get<std::string>();
    EXPECT_EQ(t.decode(t.encode(text)), text);
    EXPECT_EQ(t.decode(c.at("ids").get<Ids>()), text);
  }
}
