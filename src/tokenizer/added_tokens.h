// Added tokens (Hugging Face `tokenizers` AddedVocabulary): special and non-special tokens matched in the
// text before pre-tokenization and emitted as their ids directly. Matching follows HF's find_matches:
// leftmost-longest non-overlapping occurrences (Aho-Corasick LeftmostLongest), then per match
//   single_word: dropped when a word character (Rust regex \w) touches either end;
//   lstrip: the match grows left over whitespace, but not into the previous match;
//   rstrip: the match grows right over whitespace.
// A dropped match does not make a shorter or overlapping occurrence eligible (as in HF).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvq {

struct AddedToken {
  std::string content;       // the literal text matched (UTF-8)
  int32_t id = -1;           // token id
  bool special = false;      // special token (decode still emits it)
  bool single_word = false;  // only match as a whole word
  bool lstrip = false;       // swallow whitespace on the left
  bool rstrip = false;       // swallow whitespace on the right
  bool normalized = true;    // matched in the normalized text (true) or the raw input (false)
};

class AddedTokenMatcher {
 public:
  struct Piece {
    size_t begin, end;  // byte range in the text
    int32_t id;         // added token id, or -1 for text between added tokens
  };

  AddedTokenMatcher() = default;
  // tokens: the set matched in one pass (their content already in the form the text will be in).
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }
  // Cuts text into pieces covering it in order; gaps are non-empty, token pieces include stripped spaces.
  void split(std::string_view text, std::vector<Piece>& out) const;

 private:
  std::vector<AddedToken> tokens_;                // sorted by content length, longest first
  std::array<std::vector<uint32_t>, 256> by_first_byte_;  // first byte -> indices into tokens_, longest first
};

}  // namespace kvq
