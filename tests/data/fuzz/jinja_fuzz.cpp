// libFuzzer target: arbitrary bytes as a chat template, parsed and rendered with a small chat
// context. Every input must render or raise shardtrain::Error; a crash, a hang past the
// fuzzer's timeout, a sanitizer report or any other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
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
  return 0;
}
