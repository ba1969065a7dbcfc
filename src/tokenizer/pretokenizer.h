// Pre-tokenization (Hugging Face `tokenizers` pre_tokenizers): cuts normalized text into the pre-tokens
// the BPE model sees. Supported: Split(Regex | String, behavior Isolated | Removed, invert false),
// ByteLevel(add_prefix_space, use_regex) and a Sequence of them ending in exactly one ByteLevel.
//
// Regexes run on PCRE2 (8-bit, UTF + UCP, JIT when available); HF runs them on Oniguruma. For the GPT-2,
// Qwen2 and Llama 3 patterns the two agree, up to Unicode-version differences in \p{L}/\p{N}/\s and one
// known \s difference: PCRE2 counts U+180E (MONGOLIAN VOWEL SEPARATOR) as space, Oniguruma does not.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvq {

// The GPT-2 pre-tokenizer pattern (ByteLevel with use_regex = true).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A compiled PCRE2 pattern. Immutable after construction, safe to share between threads.
class Regex {
 public:
  explicit Regex(std::string_view pattern);  // throws kvq::Error naming the pattern and PCRE2's message
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the [begin, end) byte offsets of every non-overlapping match in valid UTF-8 text, left to
  // right (an empty match advances by one character and is not reported).
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;  // source text, for error messages
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;      // JIT compilation succeeded
};

class PreTokenizer {
 public:
  enum class Behavior { kIsolated, kRemoved };  // HF SplitDelimiterBehavior (the two supported)
  struct Step {
    enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
    std::shared_ptr<const Regex> regex;  // kSplit with a Regex pattern, or ByteLevel with use_regex
    std::string literal;                 // kSplit with a String pattern (regex == nullptr)
    Behavior behavior = Behavior::kIsolated;  // kSplit only
    bool add_prefix_space = false;            // kByteLevel only: prepend ' ' to pieces not starting with one
  };

  PreTokenizer() = default;
  explicit PreTokenizer(std::vector<Step> steps);  // checks: exactly one ByteLevel step, and it is last

  // Calls emit(piece) for every non-empty pre-token of valid UTF-8 text, in order. A piece may point into
  // a temporary (ByteLevel's prefix space): it is valid only during the call.
  void run(std::string_view text, const std::function<void(std::string_view)>& emit) const;

 private:
  void run_step(size_t step, std::string_view text, const std::function<void(std::string_view)>& emit) const;

  std::vector<Step> steps_;  // applied in order; the last is ByteLevel
};

}  // namespace kvq
