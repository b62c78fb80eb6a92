// A tokenizer's chat template (tokenizer_config.json's `chat_template`), rendered by the Jinja
// interpreter (data/jinja.h) as transformers' apply_chat_template renders it: `messages` as a
// list of {"role", "content"}, `bos_token` and `eos_token` as strings, `add_generation_prompt`,
// `tools` and `documents` none, and the globals raise_exception and strftime_now. Where each
// message's turn lies in the text is found from the provenance of its content's bytes.
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
    // <|eot_id|>, </s> or <|im_end|>, included); empty ({0, 0}) where the content does not
    // appear in the text as given (a template that rewrites it).
    std::vector<std::pair<size_t, size_t>> turns;
    // The template's {% generation %} blocks (transformers' marks of the assistant's text), in
    // order; empty for templates without them.
    std::vector<std::pair<size_t, size_t>> generation;
  };
  // Throws naming the template's line where it fails or calls raise_exception. strftime_now
  // formats the current local time, as transformers does (`now_for_tests`: this moment instead,
  // seconds since the epoch, when >= 0).
  Text render(std::span<const ChatMessage> messages, bool add_generation_prompt, int64_t now_for_tests = -1) const;

 private:
  jinja::Template template_;
  std::string bos_token_, eos_token_, where_;
};

}  // namespace shardtrain::data
