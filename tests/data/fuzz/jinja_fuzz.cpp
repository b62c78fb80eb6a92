// libFuzzer target: arbitrary bytes as a chat template, parsed and rendered with a small chat
// context, then as a ChatTemplate over a conversation with a tool call (the turns it finds,
// through the shorter conversations it renders, must lie in the text). Every input must render
// or raise shardtrain::Error; a crash, a hang past the fuzzer's timeout, a sanitizer report or
// any other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "data/chat_template.h"
#include "data/jinja.h"

namespace {

using shardtrain::data::jinja::Value;

Value context() {
  Value::List messages;
  for (const char* role : {"system", "user", "assistant"}) {
    Value::Dict m;
    m.set("role", Value::string(role));
    m.set("content", Value::string(std::string(" content of ") + role + " \n", static_cast<int>(messages.size())));
    messages.push_back(Value::dict(std::move(m)));
  }
  Value::Dict c;
  c.set("messages", Value::list(std::move(messages)));
  c.set("bos_token", Value::string("<s>"));
  c.set("eos_token", Value::string("</s>"));
  c.set("add_generation_prompt", Value::boolean(true));
  c.set("tools", Value::none());
  c.set("raise_exception", Value::function("raise_exception", [](shardtrain::data::jinja::Call&) -> Value {
    ST_THROW("raise_exception");
  }));
  return Value::dict(std::move(c));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Value ctx = context();
  try {
    const shardtrain::data::jinja::Template t(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    const auto r = t.render(ctx);
    for (const auto& s : r.segments)
      if (s.begin > s.end || s.end > r.text.size()) __builtin_trap();
    for (const auto& it : r.iterations)
      if (it.begin > it.end || it.end > r.text.size()) __builtin_trap();
    for (const auto& [begin, end] : r.generation)
      if (begin > end || end > r.text.size()) __builtin_trap();
  } catch (const shardtrain::Error&) {
  }
  try {
    static const std::vector<shardtrain::data::ChatMessage> chat = [] {
      std::vector<shardtrain::data::ChatMessage> c = {{"system", "Be brief."}, {"user", "Weather?"}};
      shardtrain::data::ChatMessage call;
      call.role = "assistant";
      Value::Dict function;
      function.set("name", Value::string("get_weather"));
      function.set("arguments", Value::string("{\"place\": \"Paris\"}"));
      Value::Dict tool_call;
      tool_call.set("function", Value::dict(std::move(function)));
      Value::Dict m;
      m.set("role", Value::string("assistant"));
      m.set("content", Value::none());
      m.set("tool_calls", Value::list({Value::dict(std::move(tool_call))}));
      call.json = Value::dict(std::move(m));
      c.push_back(std::move(call));
      c.push_back({"tool", "21 C"});
      c.push_back({"assistant", "21 degrees."});
      return c;
    }();
    const shardtrain::data::ChatTemplate t(std::string_view(reinterpret_cast<const char*>(data), size), "<s>", "</s>",
                                           "fuzz");
    const auto r = t.render(chat, false, Value::list({Value::string("tool")}));
    for (const auto& [first, end] : r.turns)
      if (first > end || end > r.text.size()) __builtin_trap();
  } catch (const shardtrain::Error&) {
  }
  return 0;
}
