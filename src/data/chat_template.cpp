// Chat templates: the context transformers gives them, and each message's turn in the text.
#include "data/chat_template.h"

#include <algorithm>
#include <ctime>

#include "core/error.h"

namespace shardtrain::data {

using jinja::Value;

ChatTemplate::ChatTemplate(std::string_view source, std::string bos_token, std::string eos_token, std::string where)
    : template_(source, where), bos_token_(std::move(bos_token)), eos_token_(std::move(eos_token)),
      where_(std::move(where)) {}

namespace {

// A message's content as the template sees it: a string, or a list of parts whose "text"
// strings are, tagged `tag` (where they land in the text marks the message's turn).
Value tagged_content(const Value& content, int tag) {
  if (content.is_string()) return Value::string(content.str(), tag);
  if (content.kind() != Value::Kind::kList) return content;  // none, or what the template makes of it
  Value::List parts;
  for (const Value& part : content.items()) {
    if (part.kind() != Value::Kind::kDict) {
      parts.push_back(part);
      continue;
    }
    Value::Dict d;
    for (const auto& [key, v] : part.entries().entries)
      d.entries.emplace_back(key, key == "text" && v.is_string() ? Value::string(v.str(), tag) : v);
    parts.push_back(Value::dict(std::move(d)));
  }
  return Value::list(std::move(parts));
}

Value message_value(const ChatMessage& m, int tag) {
  Value::Dict d;
  if (m.json.kind() != Value::Kind::kDict) {
    d.set("role", Value::string(m.role));
    d.set("content", Value::string(m.content, tag));
  } else {
    for (const auto& [key, v] : m.json.entries().entries)
      d.entries.emplace_back(key, key == "content" ? tagged_content(v, tag) : v);
  }
  return Value::dict(std::move(d));
}

bool is_prefix(const std::string& prefix, const std::string& text) {
  return prefix.size() <= text.size() && text.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

struct ChatTemplate::Rendered {
  jinja::Rendered r;
  Value::List messages;  // the dicts the template's loops visited (Rendered::Iteration::item)
};

ChatTemplate::Rendered ChatTemplate::render_text(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                                 const Value& tools, int64_t now, size_t max_output) const {
  Rendered out;
  for (size_t i = 0; i < messages.size(); ++i) out.messages.push_back(message_value(messages[i], static_cast<int>(i)));
  Value::Dict context;
  context.set("messages", Value::list(out.messages));
  // transformers passes the tokenizer's special tokens that are set; an unset one is undefined
  if (!bos_token_.empty()) context.set("bos_token", Value::string(bos_token_));
  if (!eos_token_.empty()) context.set("eos_token", Value::string(eos_token_));
  context.set("add_generation_prompt", Value::boolean(add_generation_prompt));
  context.set("tools", tools);
  context.set("documents", Value::none());
  const std::string where = where_;
  context.set("raise_exception", Value::function("raise_exception", [where](jinja::Call& c) -> Value {
    ST_THROW(where, " (", c.where, "): the template raised an exception: ",
             jinja::to_python_string(c.arg(0, "message")));
  }));
  context.set("strftime_now", Value::function("strftime_now", [now](jinja::Call& c) {
    const Value format = c.arg(0, "format");
    ST_CHECK(format.is_string(), c.where, ": strftime_now() takes a format string");
    const auto t_now = static_cast<std::time_t>(now);
    std::tm t{};
    localtime_r(&t_now, &t);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, format.str().c_str(), &t);
    return Value::string(std::string(buf, n));
  }));
  out.r = template_.render(Value::dict(std::move(context)), max_output);
  return out;
}

ChatTemplate::Text ChatTemplate::render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                        const Value& tools, int64_t now_for_tests) const {
  ST_CHECK(tools.is_none() || tools.kind() == Value::Kind::kList, where_, ": tools must be a list of schemas, found a ",
           tools.type_name());
  // one moment for this render and the prefixes below, so that their dates agree
  const int64_t now = now_for_tests >= 0 ? now_for_tests : static_cast<int64_t>(std::time(nullptr));
  const Rendered full = render_text(messages, add_generation_prompt, tools, now, jinja::Template::kMaxOutput);
  const jinja::Rendered& r = full.r;
  Text out;
  out.text = r.text;
  out.generation = r.generation;
  out.turns.assign(messages.size(), {0, 0});
  for (size_t i = 0; i < messages.size(); ++i) {
    const Value::Dict* item = &full.messages[i].entries();
    // the end of the loop iteration over this message that holds byte `at`
    auto iteration_end = [&](size_t at) {
      size_t end = at;
      for (const jinja::Rendered::Iteration& it : r.iterations)
        if (it.item == item && it.begin <= at && at < it.end) end = std::max(end, it.end);
      return end;
    };
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
    if (first != std::string::npos) {
      out.turns[i] = {first, std::max(last, iteration_end(first))};
      continue;
    }
    // No content in the text: the turn starts where the messages before it, with the generation
    // prompt, end. A template may refuse that conversation (one that must end with a user's
    // message, say); the turn is then not found. Text longer than this one's cannot be its
    // prefix: the renders stop soon after (with room for text a block set captures and drops).
    const size_t max_output = std::min(jinja::Template::kMaxOutput, 2 * out.text.size() + 4096);
    const auto prefix_text = [&](size_t count, bool generation_prompt) -> std::string {
      try {
        return render_text(messages.first(count), generation_prompt, tools, now, max_output).r.text;
      } catch (const Error&) {
        return {};
      }
    };
    const std::string prompt = prefix_text(i, true);
    if (prompt.empty() || !is_prefix(prompt, out.text)) continue;
    first = prompt.size();
    size_t end = first < out.text.size() ? iteration_end(first) : first;
    if (end == first) {  // no loop iteration holds it: to where the text through this message ends
      const std::string through = prefix_text(i + 1, false);
      if (is_prefix(through, out.text)) end = std::max(end, through.size());
    }
    if (end > first) out.turns[i] = {first, end};
  }
  return out;
}

}  // namespace shardtrain::data
