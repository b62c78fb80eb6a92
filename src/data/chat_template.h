// A tokenizer's chat template (tokenizer_config.json's `chat_template`), rendered by the Jinja
// interpreter (data/jinja.h) as transformers' apply_chat_template renders it: `messages` as a
// list of {"role", "content", ...}, `bos_token` and `eos_token` as strings,
// `add_generation_prompt`, `tools` (the tool schemas given, or none), `documents` none, and the
// globals raise_exception and strftime_now. Where each message's turn lies in the text is found
// from the provenance of its content's bytes, or, for a message without content in the text (an
// assistant's tool calls), from where the template's generation prompt ends.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/jinja.h"

namespace shardtrain::data {

struct ChatMessage {
  std::string role;
  std::string content;
  // The message as a dataset gives it, where `role` and `content` do not say all of it: content
  // that is null, absent or a list of parts ({"type": "text", "text": ...}), and other fields
  // (tool_calls, name, tool_call_id, ...), in the file's order. Undefined: {role, content}.
  jinja::Value json = jinja::Value::undefined();
};

class ChatTemplate {
 public:
  // Parses `source`; throws naming `where` (e.g. "`tokenizer_config.json` key `chat_template`")
  // and the line of the first problem. An empty bos_token or eos_token is left undefined.
  ChatTemplate(std::string_view source, std::string bos_token, std::string eos_token, std::string where);

  struct Text {
    std::string text;
    // Per message: the bytes [first, end) of its turn from the first byte of its content to the
    // end of what the template's loop wrote for that message (its end-of-turn marker, such as
    // <|eot_id|>, </s> or <|im_end|>, included). A message whose content is not in the text as
    // given (tool calls without content; a template that rewrites it) starts where the text of
    // the messages before it with the generation prompt ends, when that text is a prefix of
    // this one. Empty ({0, 0}) where neither finds it.
    std::vector<std::pair<size_t, size_t>> turns;
    // The template's {% generation %} blocks (transformers' marks of the assistant's text), in
    // order; empty for templates without them.
    std::vector<std::pair<size_t, size_t>> generation;
  };
  // Throws naming the template's line where it fails or calls raise_exception. `tools`: the
  // tool schemas the template may list (a list, as transformers passes apply_chat_template's
  // tools) or none. strftime_now formats the current local time, as transformers does
  // (`now_for_tests`: this moment instead, seconds since the epoch, when >= 0).
  Text render(std::span<const ChatMessage> messages, bool add_generation_prompt,
              const jinja::Value& tools = jinja::Value::none(), int64_t now_for_tests = -1) const;

 private:
  struct Rendered;
  Rendered render_text(std::span<const ChatMessage> messages, bool add_generation_prompt, const jinja::Value& tools,
                       int64_t now, size_t max_output) const;

  jinja::Template template_;
  std::string bos_token_, eos_token_, where_;
};

}  // namespace shardtrain::data
