// kvq::Tokenizer — a Hugging Face `tokenizers` tokenizer.json (byte-level BPE) reproduced id for id.
//
// encode(text) runs HF's pipeline:
//   1. added tokens with normalized = false are matched in the raw text (added_tokens.h);
//   2. each gap is normalized (null or NFC), then added tokens with normalized = true are matched in it;
//   3. each remaining gap is pre-tokenized (pretokenizer.h) and every pre-token is BPE-encoded (bpe.h);
//   4. a TemplateProcessing post-processor adds its fixed ids around the sequence.
// Supported components: model BPE (byte_fallback false, no dropout, no subword prefix/suffix, ignore_merges,
// merges as "a b" strings or [a, b] pairs); normalizer null | NFC | Sequence of NFC; pre_tokenizer
// ByteLevel | Split | Sequence (ending in ByteLevel); decoder ByteLevel; post_processor null | ByteLevel |
// TemplateProcessing (single sequence) | Sequence of those. Anything else is a kvq::Error naming it.
//
// Invalid UTF-8 input (HF cannot receive it: Python and Rust strings are valid UTF-8): added tokens are
// still matched, and every maximal run of bytes that are not well-formed UTF-8 becomes one pre-token of its
// own, encoded byte-level like any other, so decode(encode(x)) == x holds for arbitrary bytes.
//
// decode(ids) returns the raw bytes (vocab tokens through the byte-level map, added tokens as their
// content; special tokens are not skipped); it is not made valid UTF-8. StreamDecoder releases text only
// up to complete UTF-8 sequences, for streaming generation.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvq {

struct TokenizerImpl;  // tokenizer.cpp

class Tokenizer {
 public:
  static Tokenizer load(const std::string& path);  // reads and parses a tokenizer.json file
  // Parses tokenizer.json text; where names the source in error messages (e.g. the path).
  static Tokenizer parse(std::string_view json_text, std::string_view where);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text) const;  // thread-safe
  std::string decode(std::span<const int32_t> ids) const;     // kvq::Error on an unknown id
  std::string token_bytes(int32_t id) const;                  // raw bytes of one token
  // One past the largest id of the vocab and the added tokens.
  int vocab_size() const;
  // Id of a token as written in tokenizer.json (added tokens first, then the vocab: "Ġthe", "<|im_end|>").
  std::optional<int32_t> find(std::string_view token) const;

  // BPE pieces cached so far (for tests of the cache bound).
  size_t cache_size() const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
};

// Turns a stream of ids into text that never splits a UTF-8 sequence: push() returns the bytes that are
// complete so far, flush() whatever is left (possibly an incomplete sequence). Invalid bytes are passed on
// as soon as they cannot start a valid sequence.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tok_(&tokenizer) {}
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer* tok_;  // not owned; must outlive the decoder
  std::string pending_;   // bytes of an incomplete trailing UTF-8 sequence (at most 3)
};

}  // namespace kvq
