// Chat templates: the context transformers gives them, and each message's turn in the text.
#include "data/chat_template.h"

#include <ctime>

#include "core/error.h"

namespace shardtrain::data {

using jinja::Value;

ChatTemplate::ChatTemplate(std::string_view source, std::string bos_token, std::string eos_token, std::string where)
    : template_(source, where), bos_token_(std::move(bos_token)), eos_token_(std::move(eos_token)),
      where_(std::move(where)) {}

ChatTemplate::Text ChatTemplate::render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                        int64_t now_for_tests) const {
  Value::List list;
  for (size_t i = 0; i < messages.size(); ++i) {
    Value::Dict m;
    m.set("role", Value::string(messages[i].role));
    m.set("content", Value::string(messages[i].content, static_cast<int>(i)));  // tagged: where it lands
    list.push_back(Value::dict(std::move(m)));
  }
  const Value message_list = Value::list(list);
  Value::Dict context;
  context.set("messages", message_list);
  // transformers passes the tokenizer's special tokens that are set; an unset one is undefined
  if (!bos_token_.empty()) context.set("bos_token", Value::string(bos_token_));
  if (!eos_token_.empty()) context.set("eos_token", Value::string(eos_token_));
  context.set("add_generation_prompt", Value::boolean(add_generation_prompt));
  context.set("tools", Value::none());
  context.set("documents", Value::none());
  const std::string where = where_;
  context.set("raise_exception", Value::function("raise_exception", [where](jinja::Call& c) -> Value {
    ST_THROW(where, " (", c.where, "): the template raised an exception: ",
             jinja::to_python_string(c.arg(0, "message")));
  }));
  context.set("strftime_now", Value::function("strftime_now", [now_for_tests](jinja::Call& c) {
    const Value format = c.arg(0, "format");
    ST_CHECK(format.is_string(), c.where, ": strftime_now() takes a format string");
    const std::time_t now = now_for_tests >= 0 ? static_cast<std::time_t>(now_for_tests) : std::time(nullptr);
    std::tm t{};
    localtime_r(&now, &t);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, format.str().c_str(), &t);
    return Value::string(std::string(buf, n));
  }));
  const jinja::Rendered r = template_.render(Value::dict(std::move(context)));

  Text out;
  out.text = r.text;
  out.generation = r.generation;
  out.turns.assign(messages.size(), {0, 0});
  for (size_t i = 0; i < messages.size(); ++i) {
    // the first run of the content's bytes (segments are in output order)
    size_t first = std::string::npos, last = 0;
    for (const jinja::Segment& s : r.segments) {
      if (s.tag != static_cast<int>(i)) continue;
      if (first == std::string::npos) {
        first = s.begin;
        last = s.end;
      } else if (s.begin == last) {
        last = s.end;
      }
    }
    if (first == std::string::npos) continue;
    // to the end of the loop iteration over this message that wrote its content
    size_t end = last;
    const Value::Dict* item = &list[i].entries();
    for (const jinja::Rendered::Iteration& it : r.iterations)
      if (it.item == item && it.begin <= first && first < it.end) end = std::max(end, it.end);
    out.turns[i] = {first, end};
  }
  return out;
}

}  // namespace shardtrain::data
