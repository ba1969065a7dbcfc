#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/error.h"
#include "tokenizer/unicode.h"

namespace kvq {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

Regex::Regex(std::string_view pattern) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (code == nullptr)
    throw Error(fmt::format("pre-tokenizer regex does not compile at offset {}: {}", err_off, pcre2_message(err)),
                fmt::format("pattern {}", pattern_));
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const {
  auto* code = static_cast<pcre2_code*>(code_);
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  KVQ_CHECK(md != nullptr, "out of memory allocating PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    // The caller guarantees valid UTF-8, so PCRE2's own check is skipped.
    int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // deep backtracking: the interpreter keeps its frames on the heap
      rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    KVQ_CHECK(rc >= 0, "pre-tokenizer regex failed on a {}-byte text at offset {}: {} (pattern {})", text.size(),
              pos, pcre2_message(rc), pattern_);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      matches.emplace_back(b, e);
      pos = e;
    } else {  // empty match: step over one character
      const int n = unicode::utf8_seq_len(text, b);
      pos = b + (n > 0 ? n : 1);
    }
  }
}

PreTokenizer::PreTokenizer(std::vector<Step> steps) : steps_(std::move(steps)) {
  size_t n_byte_level = 0;
  for (const Step& s : steps_) n_byte_level += s.kind == Step::Kind::kByteLevel;
  KVQ_CHECK(n_byte_level == 1 && steps_.back().kind == Step::Kind::kByteLevel,
            "pre_tokenizer must end in exactly one ByteLevel step (kvq implements byte-level BPE only); "
            "got {} ByteLevel step(s) among {}",
            n_byte_level, steps_.size());
}

void PreTokenizer::run(std::string_view text, const std::function<void(std::string_view)>& emit) const {
  if (!text.empty()) run_step(0, text, emit);
}

void PreTokenizer::run_step(size_t step, std::string_view text,
                            const std::function<void(std::string_view)>& emit) const {
  if (step == steps_.size()) {
    emit(text);
    return;
  }
  const Step& s = steps_[step];
  std::string prefixed;
  if (s.kind == Step::Kind::kByteLevel && s.add_prefix_space && text.front() != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed += ' ';
    prefixed += text;
    text = prefixed;
  }
  if (s.kind == Step::Kind::kByteLevel && s.regex == nullptr) {
    run_step(step + 1, text, emit);
    return;
  }
  std::vector<std::pair<size_t, size_t>> matches;
  if (s.regex != nullptr) {
    s.regex->find_all(text, matches);
  } else {  // literal String pattern: non-overlapping occurrences, left to right
    for (size_t at = text.find(s.literal); !s.literal.empty() && at != std::string_view::npos;
         at = text.find(s.literal, at + s.literal.size()))
      matches.emplace_back(at, at + s.literal.size());
  }
  const bool keep_matches = s.kind == Step::Kind::kByteLevel || s.behavior == Behavior::kIsolated;
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (b > prev) run_step(step + 1, text.substr(prev, b - prev), emit);
    if (keep_matches) run_step(step + 1, text.substr(b, e - b), emit);
    prev = e;
  }
  if (prev < text.size()) run_step(step + 1, text.substr(prev), emit);
}

}  // namespace kvq
