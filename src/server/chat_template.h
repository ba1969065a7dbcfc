// Chat templates, rendered natively (no Jinja): the families kvq loads, recognised from the model's chat_template
// (tokenizer_config.json, or chat_template.jinja / chat_template.json beside it) by what the Jinja text writes,
// or chosen by name (--chat-template). A template that is none of these is a startup error that names it.
//
//   chatml    <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n   (HF's ChatML; models/ref)
//   qwen2     chatml, with the system turn "You are a helpful assistant." when the conversation has none
//   qwen2.5   chatml, with "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
//   qwen3     chatml; assistant turns before the last user turn lose their <think>...</think> reasoning
//   llama3    <|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|> ... (Llama 3.0)
//   llama3.1  llama3, always with a system turn that starts "Cutting Knowledge Date: December 2023\nToday Date:
//             26 Jul 2024\n\n" (the template's date; the current date when it calls strftime_now: Llama 3.2, 3.3)
// Llama 3's BOS is the tokenizer's to add (its post-processor does for the Meta checkpoints); render() writes it only
// when told the tokenizer does not.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_request.h"

namespace kvq::server {

struct ChatTemplate {
  std::string name;             // one of chat_template_names()
  std::string source;           // where it came from: "tokenizer_config.json", "--chat-template", ...
  std::string end_of_turn;      // "<|im_end|>" or "<|eot_id|>": where the assistant's turn ends (a stop token)
  bool write_bos = false;       // llama3*: write "<|begin_of_text|>" (the tokenizer does not add it)
  std::string date;             // llama3.1: the "Today Date" line's date

  // The conversation and the assistant's generation prompt, as text for Tokenizer::encode.
  std::string render(const std::vector<ChatMessage>& messages) const;
};

// "chatml, qwen2, qwen2.5, qwen3, llama3, llama3.1"
std::string chat_template_names();
// A template by name; kvq::Error naming the known ones otherwise.
ChatTemplate chat_template_by_name(std::string_view name, std::string source);
// The template a chat_template Jinja text renders; kvq::Error naming it (its first characters) when it is none of
// the families above.
ChatTemplate detect_chat_template(std::string_view jinja, std::string source);
// The model directory's template: --chat-template's name when given, else its chat_template; nullopt when it has
// none (chat requests are then refused with a message saying so).
std::optional<ChatTemplate> load_chat_template(const std::string& model_dir, const std::string& name);

}  // namespace kvq::server
