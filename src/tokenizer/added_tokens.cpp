#include "tokenizer/added_tokens.h"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "tokenizer/unicode.h"

namespace kvq {

namespace {

// The code point ending just before byte offset at, or -1 when none / not well-formed UTF-8.
int64_t char_before(std::string_view s, size_t at) {
  size_t b = at;
  for (int k = 0; k < 4 && b > 0; ++k) {
    --b;
    if ((static_cast<uint8_t>(s[b]) & 0xC0) != 0x80) {
      const int n = unicode::utf8_seq_len(s, b);
      if (n > 0 && b + n == at) return unicode::utf8_decode(s, b, n);
      return -1;
    }
  }
  return -1;
}

// The code point starting at byte offset at and its length, or {-1, 0}.
std::pair<int64_t, int> char_at(std::string_view s, size_t at) {
  if (at >= s.size()) return {-1, 0};
  const int n = unicode::utf8_seq_len(s, at);
  if (n == 0) return {-1, 0};
  return {unicode::utf8_decode(s, at, n), n};
}

size_t utf8_len(char32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) {
  for (AddedToken& t : tokens)
    if (!t.content.empty()) tokens_.push_back(std::move(t));  // HF ignores empty added tokens
  std::stable_sort(tokens_.begin(), tokens_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (uint32_t i = 0; i < tokens_.size(); ++i)
    by_first_byte_[static_cast<uint8_t>(tokens_[i].content[0])].push_back(i);
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Piece>& out) const {
  size_t start_offset = 0;  // end of the previous emitted token piece
  size_t pos = 0;           // where the leftmost-longest scan resumes (end of the previous raw match)
  while (pos < text.size()) {
    // Leftmost position with any match; there, the longest token.
    const AddedToken* tok = nullptr;
    size_t at = pos;
    for (; at < text.size(); ++at) {
      for (uint32_t i : by_first_byte_[static_cast<uint8_t>(text[at])]) {
        const std::string& c = tokens_[i].content;
        if (c.size() <= text.size() - at && std::memcmp(text.data() + at, c.data(), c.size()) == 0) {
          tok = &tokens_[i];
          break;
        }
      }
      if (tok != nullptr) break;
    }
    if (tok == nullptr) break;
    size_t start = at, stop = at + tok->content.size();
    pos = stop;
    if (tok->single_word) {
      const int64_t before = char_before(text, start);
      const int64_t after = char_at(text, stop).first;
      if ((before >= 0 && unicode::is_word_char(static_cast<char32_t>(before))) ||
          (after >= 0 && unicode::is_word_char(static_cast<char32_t>(after))))
        continue;
    }
    if (tok->lstrip) {
      size_t new_start = start;
      for (int64_t c; (c = char_before(text, new_start)) >= 0 && unicode::is_whitespace(static_cast<char32_t>(c));)
        new_start -= utf8_len(static_cast<char32_t>(c));
      start = std::max(new_start, start_offset);
    }
    if (tok->rstrip) {
      for (auto [c, n] = char_at(text, stop); c >= 0 && unicode::is_whitespace(static_cast<char32_t>(c));
           std::tie(c, n) = char_at(text, stop))
        stop += n;
    }
    if (start < start_offset) continue;  // an earlier rstrip already swallowed this match's start
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok->id});
    start_offset = stop;
    pos = std::max(pos, stop);
  }
  if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
}

}  // namespace kvq
