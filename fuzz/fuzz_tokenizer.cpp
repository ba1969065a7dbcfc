// libFuzzer target for the tokenizer.
//   Input starting with '{': tokenizer.json text for Tokenizer::parse. Bad input must raise kvq::Error, never
//   crash; a tokenizer that parses must encode and decode a fixed sample.
//   Any other input: raw bytes for encode() with the fixed tests/tokenizer/basic.json tokenizer (a leading
//   0x01 is dropped, so texts starting with '{' are reachable). Checks: every id is in range, decode(encode(x))
//   == x for every x (kvq encodes invalid UTF-8 bytewise, and basic.json's special tokens strip nothing), and
//   StreamDecoder's pieces concatenate to the same bytes.
// Seed corpus: the fixtures, e.g. `mkdir -p /tmp/corpus && cp tests/tokenizer/*.json /tmp/corpus/`.
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <string_view>

#include "common/error.h"
#include "tokenizer/tokenizer.h"

namespace {

const kvq::Tokenizer& fixed_tokenizer() {
  static const kvq::Tokenizer t = kvq::Tokenizer::load(std::string(KVQ_SOURCE_DIR) + "/tests/tokenizer/basic.json");
  return t;
}

void require(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "fuzz_tokenizer: invariant violated: %s\n", what);
    std::abort();
  }
}

void fuzz_parse(std::string_view json) {
  try {
    const kvq::Tokenizer t = kvq::Tokenizer::parse(json, "fuzz input");
    const auto ids = t.encode("Hello, world! \xE6\x97\xA5 <|endoftext|>  \n\n 123 \xFF");
    for (int32_t id : ids) require(id >= 0 && id < t.vocab_size(), "parsed tokenizer: id out of range");
    (void)t.decode(ids);
  } catch (const kvq::Error&) {
    // expected for malformed or unsupported input
  }
}

void fuzz_encode(std::string_view text) {
  const kvq::Tokenizer& t = fixed_tokenizer();
  const std::vector<int32_t> ids = t.encode(text);
  for (int32_t id : ids) require(id >= 0 && id < t.vocab_size(), "id out of range");
  require(t.decode(ids) == text, "decode(encode(x)) != x");
  kvq::StreamDecoder sd(t);
  std::string streamed;
  for (int32_t id : ids) streamed += sd.push(id);
  streamed += sd.flush();
  require(streamed == text, "streamed decode != x");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  if (!in.empty() && in[0] == '{') {
    if (size <= (1 << 16)) fuzz_parse(in);
  } else {
    fuzz_encode(!in.empty() && in[0] == '\x01' ? in.substr(1) : in);
  }
  return 0;
}
