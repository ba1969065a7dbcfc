#include "server/chat_template.h"

#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace kvq::server {

namespace {

constexpr const char* kNames[] = {"chatml", "qwen2", "qwen2.5", "qwen3", "llama3", "llama3.1"};
constexpr const char* kQwen2System = "You are a helpful assistant.";
constexpr const char* kQwen25System = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

std::string trim(std::string_view s) {  // Jinja's trim: leading and trailing whitespace
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return std::string(s.substr(b, s.find_last_not_of(ws) - b + 1));
}

// Qwen3: content.split('</think>')[-1].lstrip('\n')
std::string strip_think(const std::string& content) {
  const size_t end = content.rfind("</think>");
  if (end == std::string::npos) return content;
  std::string s = content.substr(end + 8);
  return s.substr(std::min(s.find_first_not_of('\n'), s.size()));
}

std::string render_chatml(const ChatTemplate& t, const std::vector<ChatMessage>& messages) {
  std::string out;
  const bool has_system = !messages.empty() && messages[0].role == "system";
  if (!has_system && t.name == "qwen2") out += std::string("<|im_start|>system\n") + kQwen2System + "<|im_end|>\n";
  if (!has_system && t.name == "qwen2.5") out += std::string("<|im_start|>system\n") + kQwen25System + "<|im_end|>\n";
  size_t last_user = 0;
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i].role == "user") last_user = i;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool strip = t.name == "qwen3" && m.role == "assistant" && i < last_user;
    out += "<|im_start|>" + m.role + "\n" + (strip ? strip_think(m.content) : m.content) + "<|im_end|>\n";
  }
  return out + "<|im_start|>assistant\n";
}

std::string render_llama3(const ChatTemplate& t, const std::vector<ChatMessage>& messages) {
  std::string out = t.write_bos ? "<|begin_of_text|>" : "";
  auto turn = [&](const std::string& role, const std::string& content) {
    out += "<|start_header_id|>" + role + "<|end_header_id|>\n\n" + content + "<|eot_id|>";
  };
  size_t first = 0;
  if (t.name == "llama3.1") {  // the system turn always, with the knowledge and today lines
    std::string system;
    if (!messages.empty() && messages[0].role == "system") system = trim(messages[0].content), first = 1;
    turn("system", "Cutting Knowledge Date: December 2023\nToday Date: " + t.date + "\n\n" + system);
  }
  for (size_t i = first; i < messages.size(); ++i) turn(messages[i].role, trim(messages[i].content));
  return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

std::string today() {  // strftime_now("%d %b %Y")
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
  return buf;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  KVQ_CHECK(f, "cannot read {}", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// chat_template as tokenizer_config.json writes it: a string, or a list of {name, template} (the "default" one).
std::optional<std::string> template_text(const nlohmann::json& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) {
    for (const auto& t : v)
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
        return t["template"].get<std::string>();
    KVQ_FAIL("{}: chat_template is a list without a \"default\" template", where);
  }
  KVQ_CHECK(v.is_null(), "{}: chat_template must be a string or a list of named templates", where);
  return std::nullopt;
}

}  // namespace

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages) const {
  return name.rfind("llama3", 0) == 0 ? render_llama3(*this, messages) : render_chatml(*this, messages);
}

std::string chat_template_names() {
  std::string s;
  for (const char* n : kNames) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

ChatTemplate chat_template_by_name(std::string_view name, std::string source) {
  bool known = false;
  for (const char* n : kNames) known |= name == n;
  KVQ_CHECK(known, "unknown chat template '{}' (kvq renders: {})", name, chat_template_names());
  ChatTemplate t;
  t.name = std::string(name);
  t.source = std::move(source);
  const bool llama = t.name.rfind("llama3", 0) == 0;
  t.end_of_turn = llama ? "<|eot_id|>" : "<|im_end|>";
  t.date = "26 Jul 2024";
  return t;
}

ChatTemplate detect_chat_template(std::string_view jinja, std::string source) {
  auto has = [&](std::string_view s) { return jinja.find(s) != std::string_view::npos; };
  std::string name;
  if (has("<|im_start|>")) {
    name = has("</think>") ? "qwen3" : has(kQwen25System) ? "qwen2.5" : has(kQwen2System) ? "qwen2" : "chatml";
  } else if (has("<|start_header_id|>") && has("<|eot_id|>")) {
    name = has("Cutting Knowledge Date") ? "llama3.1" : "llama3";
  } else {
    std::string head(jinja.substr(0, 60));
    for (char& c : head)
      if (c == '\n') c = ' ';
    KVQ_FAIL("{}: the chat template is not one kvq renders natively (ChatML as Qwen writes it, Llama 3): it starts "
             "\"{}{}\"; choose one with --chat-template ({})",
             source, head, jinja.size() > 60 ? "..." : "", chat_template_names());
  }
  ChatTemplate t = chat_template_by_name(name, std::move(source));
  if (has("strftime_now")) t.date = today();
  return t;
}

std::optional<ChatTemplate> load_chat_template(const std::string& model_dir, const std::string& name) {
  if (!name.empty()) return chat_template_by_name(name, "--chat-template");
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  if (fs::exists(dir / "tokenizer_config.json")) {
    const std::string where = (dir / "tokenizer_config.json").string();
    const nlohmann::json cfg = nlohmann::json::parse(read_file(where), nullptr, false);
    KVQ_CHECK(!cfg.is_discarded() && cfg.is_object(), "{}: not a JSON object", where);
    if (cfg.contains("chat_template"))
      if (auto text = template_text(cfg["chat_template"], where)) return detect_chat_template(*text, where);
  }
  if (fs::exists(dir / "chat_template.jinja"))
    return detect_chat_template(read_file(dir / "chat_template.jinja"), (dir / "chat_template.jinja").string());
  if (fs::exists(dir / "chat_template.json")) {
    const std::string where = (dir / "chat_template.json").string();
    const nlohmann::json j = nlohmann::json::parse(read_file(where), nullptr, false);
    KVQ_CHECK(!j.is_discarded() && j.is_object(), "{}: not a JSON object", where);
    if (auto text = template_text(j.value("chat_template", nlohmann::json()), where))
      return detect_chat_template(*text, where);
  }
  return std::nullopt;
}

}  // namespace kvq::server
