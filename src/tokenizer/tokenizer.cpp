#include "tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"

namespace kvq {

using nlohmann::json;

struct TokenizerImpl {
  bool nfc = false;                  // normalizer: NFC (true) or none
  AddedTokenMatcher raw_added;       // added tokens with normalized = false, matched in the raw text
  AddedTokenMatcher norm_added;      // added tokens with normalized = true, matched in normalized text
  PreTokenizer pre;                  // normalized text -> pre-tokens
  std::unique_ptr<BpeModel> bpe;     // pre-token -> ids
  std::vector<int32_t> prefix_ids;   // TemplateProcessing ids before the sequence
  std::vector<int32_t> suffix_ids;   // TemplateProcessing ids after the sequence
  std::vector<std::string> id_bytes;  // (vocab_size,) raw bytes each id decodes to
  std::vector<uint8_t> id_known;      // (vocab_size,) 1 where some token has this id
  std::unordered_map<std::string, int32_t> vocab;  // model vocab, strings as in the file
  std::unordered_map<std::string, int32_t> added;  // added token content -> id

  void encode_gap(std::string_view text, std::vector<int32_t>& out) const;
  void encode_valid(std::string_view text, std::vector<int32_t>& out) const;
};

namespace {

// Parsing context: every error names the file.
struct Parser {
  std::string where;

  [[noreturn]] void fail(std::string what, std::string hint = {}) const {
    throw Error(std::move(what), where, std::move(hint));
  }
  void check(bool cond, std::string_view what) const {
    if (!cond) fail(std::string(what));
  }
  // The "type" of a component object; "" when the component is null.
  std::string type_of(const json& j, std::string_view component) const {
    if (j.is_null()) return {};
    check(j.is_object(), fmt::format("{} must be an object or null", component));
    auto it = j.find("type");
    check(it != j.end() && it->is_string(), fmt::format("{} has no string \"type\"", component));
    return it->get<std::string>();
  }
  bool flag(const json& j, const char* key, bool dflt) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return dflt;
    check(it->is_boolean(), fmt::format("\"{}\" must be a boolean", key));
    return it->get<bool>();
  }
  const json& field(const json& j, const char* key, std::string_view component) const {
    auto it = j.find(key);
    check(it != j.end(), fmt::format("{} has no \"{}\"", component, key));
    return *it;
  }
  int32_t id_value(const json& j, std::string_view what) const {
    if (!(j.is_number_integer() && j.get<int64_t>() >= 0 && j.get<int64_t>() < kMaxId))
      fail(fmt::format("{}: id must be an integer in [0, {}), got {}", what, kMaxId, j.dump()));
    return static_cast<int32_t>(j.get<int64_t>());
  }
  static constexpr int64_t kMaxId = 1 << 24;  // 16M ids: far above any real vocab, bounds the id tables
};

bool parse_normalizer(const Parser& p, const json& j) {
  const std::string type = p.type_of(j, "normalizer");
  if (type.empty()) return false;
  if (type == "NFC") return true;
  if (type == "Sequence") {
    const json& list = p.field(j, "normalizers", "normalizer Sequence");
    p.check(list.is_array(), "normalizer Sequence: \"normalizers\" must be an array");
    bool nfc = false;
    for (const json& n : list) nfc |= parse_normalizer(p, n);
    return nfc;
  }
  p.fail(fmt::format("normalizer \"{}\" is not supported", type), "kvq supports null, NFC and a Sequence of NFC");
}

void parse_pre_tokenizer(const Parser& p, const json& j, std::vector<PreTokenizer::Step>& steps) {
  using Step = PreTokenizer::Step;
  const std::string type = p.type_of(j, "pre_tokenizer");
  if (type.empty()) p.fail("pre_tokenizer is null", "kvq implements byte-level BPE: a ByteLevel pre_tokenizer is required");
  if (type == "Sequence") {
    const json& list = p.field(j, "pretokenizers", "pre_tokenizer Sequence");
    p.check(list.is_array(), "pre_tokenizer Sequence: \"pretokenizers\" must be an array");
    for (const json& s : list) parse_pre_tokenizer(p, s, steps);
  } else if (type == "ByteLevel") {
    Step s;
    s.kind = Step::Kind::kByteLevel;
    s.add_prefix_space = p.flag(j, "add_prefix_space", true);
    if (p.flag(j, "use_regex", true)) s.regex = std::make_shared<Regex>(kGpt2Pattern);
    steps.push_back(std::move(s));
  } else if (type == "Split") {
    Step s;
    s.kind = Step::Kind::kSplit;
    const json& pat = p.field(j, "pattern", "pre_tokenizer Split");
    if (pat.contains("Regex") && pat["Regex"].is_string()) {
      try {
        s.regex = std::make_shared<Regex>(pat["Regex"].get<std::string>());
      } catch (const Error& e) {
        p.fail(fmt::format("pre_tokenizer Split: {} ({})", e.what(), e.where()));
      }
    } else if (pat.contains("String") && pat["String"].is_string()) {
      s.literal = pat["String"].get<std::string>();
    } else {
      p.fail("pre_tokenizer Split: \"pattern\" must be {\"Regex\": string} or {\"String\": string}");
    }
    const json& behavior = p.field(j, "behavior", "pre_tokenizer Split");
    p.check(behavior.is_string(), "pre_tokenizer Split: \"behavior\" must be a string");
    if (behavior == "Isolated") {
      s.behavior = PreTokenizer::Behavior::kIsolated;
    } else if (behavior == "Removed") {
      s.behavior = PreTokenizer::Behavior::kRemoved;
    } else {
      p.fail(fmt::format("pre_tokenizer Split behavior \"{}\" is not supported", behavior.get<std::string>()),
             "kvq supports Isolated and Removed");
    }
    p.check(!p.flag(j, "invert", false), "pre_tokenizer Split with invert = true is not supported");
    steps.push_back(std::move(s));
  } else {
    p.fail(fmt::format("pre_tokenizer \"{}\" is not supported", type),
           "kvq supports ByteLevel, Split and a Sequence of them ending in ByteLevel");
  }
}

void parse_post_processor(const Parser& p, const json& j, TokenizerImpl& t) {
  const std::string type = p.type_of(j, "post_processor");
  if (type.empty() || type == "ByteLevel") return;  // ByteLevel only adjusts offsets
  if (type == "Sequence") {
    const json& list = p.field(j, "processors", "post_processor Sequence");
    p.check(list.is_array(), "post_processor Sequence: \"processors\" must be an array");
    for (const json& s : list) parse_post_processor(p, s, t);
    return;
  }
  if (type != "TemplateProcessing")
    p.fail(fmt::format("post_processor \"{}\" is not supported", type),
           "kvq supports null, ByteLevel, TemplateProcessing and a Sequence of them");
  const json& single = p.field(j, "single", "post_processor TemplateProcessing");
  const json& specials = p.field(j, "special_tokens", "post_processor TemplateProcessing");
  p.check(single.is_array() && specials.is_object(), "post_processor TemplateProcessing: malformed single/special_tokens");
  int n_seq = 0;
  for (const json& item : single) {
    if (item.contains("Sequence")) {
      ++n_seq;
      continue;
    }
    p.check(item.contains("SpecialToken") && item["SpecialToken"].contains("id") &&
                item["SpecialToken"]["id"].is_string(),
            "post_processor TemplateProcessing: template items must be Sequence or SpecialToken");
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    auto it = specials.find(name);
    p.check(it != specials.end() && it->contains("ids") && (*it)["ids"].is_array(),
            fmt::format("post_processor TemplateProcessing: special token \"{}\" has no ids", name));
    for (const json& id : (*it)["ids"])
      (n_seq == 0 ? t.prefix_ids : t.suffix_ids).push_back(p.id_value(id, "post_processor special token"));
  }
  p.check(n_seq == 1, "post_processor TemplateProcessing: \"single\" must hold exactly one Sequence");
}

void set_token(const Parser& p, TokenizerImpl& t, int32_t id, std::string bytes) {
  if (static_cast<size_t>(id) >= t.id_bytes.size()) {
    t.id_bytes.resize(id + 1);
    t.id_known.resize(id + 1, 0);
  }
  t.id_bytes[id] = std::move(bytes);
  t.id_known[id] = 1;
}

void parse_model(const Parser& p, const json& m, TokenizerImpl& t) {
  p.check(m.is_object(), "\"model\" must be an object");
  const std::string type = m.contains("type") ? p.type_of(m, "model") : (m.contains("merges") ? "BPE" : "");
  if (type != "BPE")
    p.fail(fmt::format("model type \"{}\" is not supported", type), "kvq implements byte-level BPE models only");
  p.check(!p.flag(m, "byte_fallback", false), "BPE byte_fallback = true is not supported (byte-level BPE only)");
  if (auto it = m.find("dropout"); it != m.end() && !it->is_null())
    p.check(it->is_number() && it->get<double>() == 0.0, "BPE dropout is not supported (it makes encoding random)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto it = m.find(key); it != m.end() && !it->is_null())
      p.check(it->is_string() && it->get<std::string>().empty(), fmt::format("BPE {} is not supported", key));
  const bool ignore_merges = p.flag(m, "ignore_merges", false);

  const json& vocab = p.field(m, "vocab", "model");
  p.check(vocab.is_object(), "model \"vocab\" must be an object of token -> id");
  std::unordered_map<std::string, int32_t> byte_ids;  // raw bytes -> id
  std::string raw;
  for (const auto& [tok, jid] : vocab.items()) {
    const int32_t id = p.id_value(jid, "vocab token \"" + tok + "\"");
    if (static_cast<size_t>(id) < t.id_known.size() && t.id_known[id])
      p.fail(fmt::format("vocab id {} is used by two tokens (one is \"{}\")", id, tok));
    t.vocab.emplace(tok, id);
    if (unicode::byte_level_decode(tok, raw)) {
      byte_ids.emplace(raw, id);
      set_token(p, t, id, raw);
    } else {
      set_token(p, t, id, tok);  // not in the byte-level alphabet: HF's ByteLevel decoder emits it as is
    }
  }

  const json& merges = p.field(m, "merges", "model");
  p.check(merges.is_array(), "model \"merges\" must be an array");
  std::unordered_map<uint64_t, BpeModel::Merge> merge_map;
  merge_map.reserve(merges.size());
  int32_t rank = 0;
  for (const json& mj : merges) {
    std::string a, b;
    if (mj.is_string()) {
      const std::string s = mj.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        p.fail(fmt::format("merge {} \"{}\" is not two tokens separated by one space", rank, s));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
      a = mj[0].get<std::string>();
      b = mj[1].get<std::string>();
    } else {
      p.fail(fmt::format("merge {} must be a string \"a b\" or a pair [a, b]", rank));
    }
    auto ia = t.vocab.find(a), ib = t.vocab.find(b), iab = t.vocab.find(a + b);
    if (ia == t.vocab.end()) p.fail(fmt::format("merge {} names \"{}\", which is not in the vocab", rank, a));
    if (ib == t.vocab.end()) p.fail(fmt::format("merge {} names \"{}\", which is not in the vocab", rank, b));
    if (iab == t.vocab.end())
      p.fail(fmt::format("merge {} makes \"{}\", which is not in the vocab", rank, a + b));
    // A repeated pair keeps its last rank, as in HF (a HashMap collected in order).
    merge_map[BpeModel::pair_key(ia->second, ib->second)] = {rank, iab->second};
    ++rank;
  }
  try {
    t.bpe = std::make_unique<BpeModel>(std::move(byte_ids), std::move(merge_map), ignore_merges);
  } catch (const Error& e) {
    p.fail(e.what());
  }
}

void parse_added_tokens(const Parser& p, const json& list, TokenizerImpl& t) {
  if (list.is_null()) return;
  p.check(list.is_array(), "\"added_tokens\" must be an array");
  std::vector<AddedToken> raw, normalized;
  for (const json& j : list) {
    p.check(j.is_object() && j.contains("content") && j["content"].is_string(),
            "added_tokens entries must be objects with a string \"content\"");
    AddedToken tok;
    tok.content = j["content"].get<std::string>();
    tok.id = p.id_value(p.field(j, "id", "added token"), fmt::format("added token \"{}\"", tok.content));
    tok.special = p.flag(j, "special", false);
    tok.single_word = p.flag(j, "single_word", false);
    tok.lstrip = p.flag(j, "lstrip", false);
    tok.rstrip = p.flag(j, "rstrip", false);
    tok.normalized = p.flag(j, "normalized", true);
    if (tok.content.empty()) continue;  // HF ignores empty added tokens
    // HF gives an added token that is also a vocab token the vocab's id; a file disagreeing is corrupt.
    if (auto it = t.vocab.find(tok.content); it != t.vocab.end() && it->second != tok.id)
      p.fail(fmt::format("added token \"{}\" has id {} but the vocab gives it id {}", tok.content, tok.id, it->second));
    if (auto it = t.added.find(tok.content); it != t.added.end()) {
      if (it->second != tok.id) p.fail(fmt::format("added token \"{}\" appears with ids {} and {}", tok.content, it->second, tok.id));
      continue;
    }
    if (!t.vocab.count(tok.content) && static_cast<size_t>(tok.id) < t.id_known.size() && t.id_known[tok.id])
      p.fail(fmt::format("added token \"{}\" has id {}, which another token already uses", tok.content, tok.id));
    p.check(unicode::is_valid_utf8(tok.content), "added token content is not valid UTF-8");
    t.added.emplace(tok.content, tok.id);
    set_token(p, t, tok.id, tok.content);
    if (tok.normalized) {
      if (t.nfc) tok.content = unicode::nfc(tok.content);
      normalized.push_back(std::move(tok));
    } else {
      raw.push_back(std::move(tok));
    }
  }
  t.raw_added = AddedTokenMatcher(std::move(raw));
  t.norm_added = AddedTokenMatcher(std::move(normalized));
}

void parse_decoder(const Parser& p, const json& j) {
  const std::string type = p.type_of(j, "decoder");
  if (type == "ByteLevel") return;
  if (type == "Sequence" && j.contains("decoders") && j["decoders"].is_array() && j["decoders"].size() == 1) {
    parse_decoder(p, j["decoders"][0]);
    return;
  }
  p.fail(fmt::format("decoder \"{}\" is not supported", type.empty() ? "null" : type),
         "kvq decodes byte-level BPE: the decoder must be ByteLevel");
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open tokenizer file", path, "expected a Hugging Face tokenizer.json");
  std::ostringstream ss;
  ss << in.rdbuf();
  KVQ_CHECK(!in.bad(), "cannot read tokenizer file {}", path);
  return parse(ss.str(), path);
}

Tokenizer Tokenizer::parse(std::string_view json_text, std::string_view where) {
  const Parser p{std::string(where)};
  auto t = std::make_unique<TokenizerImpl>();
  try {
    json root = json::parse(json_text.begin(), json_text.end());
    p.check(root.is_object(), "tokenizer.json must hold a JSON object");
    for (const char* key : {"truncation", "padding"})
      if (auto it = root.find(key); it != root.end() && !it->is_null())
        p.fail(fmt::format("tokenizer \"{}\" is set; kvq does not support it", key), "set it to null");
    t->nfc = parse_normalizer(p, root.value("normalizer", json()));
    std::vector<PreTokenizer::Step> steps;
    parse_pre_tokenizer(p, root.value("pre_tokenizer", json()), steps);
    try {
      t->pre = PreTokenizer(std::move(steps));
    } catch (const Error& e) {
      p.fail(e.what());
    }
    parse_model(p, p.field(root, "model", "tokenizer.json"), *t);
    parse_added_tokens(p, root.value("added_tokens", json()), *t);
    parse_decoder(p, root.value("decoder", json()));
    parse_post_processor(p, root.value("post_processor", json()), *t);
    for (int32_t id : t->prefix_ids) p.check(id < static_cast<int32_t>(t->id_known.size()) && t->id_known[id], "post_processor names an unknown id");
    for (int32_t id : t->suffix_ids) p.check(id < static_cast<int32_t>(t->id_known.size()) && t->id_known[id], "post_processor names an unknown id");
  } catch (const json::exception& e) {
    p.fail(fmt::format("malformed tokenizer JSON: {}", e.what()));
  }
  return Tokenizer(std::move(t));
}

void TokenizerImpl::encode_valid(std::string_view text, std::vector<int32_t>& out) const {
  std::string normalized;
  if (nfc) {
    normalized = unicode::nfc(text);
    text = normalized;
  }
  auto emit = [&](std::string_view piece) { bpe->encode(piece, out); };
  if (norm_added.empty()) {
    pre.run(text, emit);
    return;
  }
  std::vector<AddedTokenMatcher::Piece> pieces;
  norm_added.split(text, pieces);
  for (const auto& pc : pieces) {
    if (pc.id >= 0) out.push_back(pc.id);
    else pre.run(text.substr(pc.begin, pc.end - pc.begin), emit);
  }
}

void TokenizerImpl::encode_gap(std::string_view text, std::vector<int32_t>& out) const {
  // Well-formed UTF-8 runs take the normal path; each maximal run of ill-formed bytes is one pre-token.
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    size_t j = i;
    for (int len; j < n && (len = unicode::utf8_seq_len(text, j)) > 0;) j += len;
    if (j > i) encode_valid(text.substr(i, j - i), out);
    size_t k = j;
    while (k < n && unicode::utf8_seq_len(text, k) == 0) ++k;
    if (k > j) bpe->encode(text.substr(j, k - j), out);
    i = k;
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const TokenizerImpl& t = *impl_;
  std::vector<int32_t> out(t.prefix_ids);
  out.reserve(text.size() / 3 + 8);
  if (t.raw_added.empty()) {
    t.encode_gap(text, out);
  } else {
    std::vector<AddedTokenMatcher::Piece> pieces;
    t.raw_added.split(text, pieces);
    for (const auto& pc : pieces) {
      if (pc.id >= 0) out.push_back(pc.id);
      else t.encode_gap(text.substr(pc.begin, pc.end - pc.begin), out);
    }
  }
  out.insert(out.end(), t.suffix_ids.begin(), t.suffix_ids.end());
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const TokenizerImpl& t = *impl_;
  KVQ_CHECK(id >= 0 && static_cast<size_t>(id) < t.id_known.size() && t.id_known[id],
            "token id {} is not in the vocabulary (vocab_size {})", id, t.id_known.size());
  return t.id_bytes[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  const TokenizerImpl& t = *impl_;
  std::string out;
  for (int32_t id : ids) {
    KVQ_CHECK(id >= 0 && static_cast<size_t>(id) < t.id_known.size() && t.id_known[id],
              "cannot decode token id {}: not in the vocabulary (vocab_size {})", id, t.id_known.size());
    out += t.id_bytes[id];
  }
  return out;
}

int Tokenizer::vocab_size() const { return static_cast<int>(impl_->id_known.size()); }

std::optional<int32_t> Tokenizer::find(std::string_view token) const {
  const std::string key(token);
  if (auto it = impl_->added.find(key); it != impl_->added.end()) return it->second;
  if (auto it = impl_->vocab.find(key); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

size_t Tokenizer::cache_size() const { return impl_->bpe->cache_size(); }

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_->token_bytes(id);
  const size_t keep = unicode::utf8_incomplete_tail(pending_);
  std::string out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace kvq
