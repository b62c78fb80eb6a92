// Chat templates as transformers renders them, and the turns they give fine-tuning's loss
// mask: ChatML (Qwen2), Llama 2 and Mistral forms of our own writing, tool calls and tool
// schemas (a JSONL file of them too), generation blocks, the date of strftime_now, and the
// counted tokens of Llama 2's SentencePiece-style vocabulary
// (built at set-up into .deps/llama2-tokenizer; skipped without it) and of Llama 3's (in
// ../shared/data; skipped without it).
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/chat_template.h"
#include "data/sft.h"
#include "testing/compare.h"
#include "testing/counted_runs.h"
#include "testing/shared_data.h"

namespace shardtrain::data {
namespace {

namespace fs = std::filesystem;
using testing::counted_runs;

// Templates of our own writing in the turn formats of ChatML (Qwen2) and Llama 2.
const char* const kChatMl =
    "{% for m in messages %}{% if loop.first and messages[0].role != 'system' %}"
    "<|im_start|>system\nYou are helpful.<|im_end|>\n{% endif %}"
    "{{ '<|im_start|>' ~ m.role ~ '\\n' ~ m.content ~ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

const char* const kLlama2 =
    "{% set has_system = messages[0].role == 'system' %}{% set turns = messages[1:] if has_system else messages %}"
    "{% for turn in turns %}{% if (turn.role == 'user') != (loop.index0 is even) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% set text = ('<<SYS>>\\n' ~ messages[0].content ~ '\\n<</SYS>>\\n\\n' if loop.first and has_system else '')"
    " ~ turn.content %}"
    "{% if turn.role == 'user' %}{{ bos_token }}[INST] {{ text.strip() }} [/INST]"
    "{% else %} {{ text.strip() }} {{ eos_token }}{% endif %}{% endfor %}";

// ChatML with tools and tool calls, in the form Qwen2.5's template uses (our own writing): the
// tool schemas in the system turn, each call in <tool_call> tags, tool results in a user turn,
// content given as a string or as a list of text parts.
const char* const kChatMlTools = R"J({%- if tools -%}
<|im_start|>system{{ '
' }}{% if messages[0].role == 'system' %}{{ messages[0].content }}{{ '

' }}{% endif -%}
# Tools{{ '
' }}<tools>{% for t in tools %}{{ '
' }}{{ t | tojson }}{% endfor %}{{ '
' }}</tools><|im_end|>{{ '
' }}
{%- elif messages[0].role == 'system' -%}
<|im_start|>system{{ '
' }}{{ messages[0].content }}<|im_end|>{{ '
' }}
{%- endif -%}
{%- for m in messages -%}
  {%- if m.role == 'assistant' -%}
    <|im_start|>assistant{{ '
' }}{% if m.content %}{{ m.content }}{% endif -%}
    {%- for call in m.tool_calls | default([]) -%}
      {%- if m.content or not loop.first %}{{ '
' }}{% endif -%}
      <tool_call>{{ '
' }}{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
      {{- '
' }}</tool_call>
    {%- endfor -%}
    <|im_end|>{{ '
' }}
  {%- elif m.role == 'tool' -%}
    <|im_start|>user{{ '
' }}<tool_response>{{ '
' }}{{ m.content }}{{ '
' }}</tool_response><|im_end|>{{ '
' }}
  {%- elif m.role != 'system' -%}
    <|im_start|>{{ m.role }}{{ '
' }}
    {%- if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endif -%}
    <|im_end|>{{ '
' }}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant{{ '
' }}{% endif -%})J";

// A conversation as a dataset line gives it (objects in the file's key order), and its tools.
const char* const kToolChat = R"J({"messages": [
  {"role": "system", "content": "Be useful."},
  {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
  {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function":
    {"name": "get_weather", "arguments": {"place": "Paris", "days": 2}}}]},
  {"role": "tool", "name": "get_weather", "content": "{\"temperature\": 21}"},
  {"role": "assistant", "content": "It is 21 degrees."}],
 "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
   "properties": {"place": {"type": "string"}, "days": {"type": "integer"}}}}}]})J";

std::vector<ChatMessage> messages_of(const nlohmann::ordered_json& line) {
  std::vector<ChatMessage> out;
  for (const auto& m : line["messages"]) {
    ChatMessage c;
    c.role = m["role"].get<std::string>();
    if (m["content"].is_string()) c.content = m["content"].get<std::string>();
    c.json = jinja::Value::from_json(m);
    out.push_back(std::move(c));
  }
  return out;
}

std::string at(const ChatTemplate::Text& t, size_t message) {
  return t.text.substr(t.turns[message].first, t.turns[message].second - t.turns[message].first);
}

TEST(ChatTemplate, TurnsRunFromTheContentToTheEndOfItsTurn) {
  const std::vector<ChatMessage> chat = {{"user", "Hi?"}, {"assistant", "Hello."}, {"user", "Bye"}};
  const ChatTemplate chatml(kChatMl, "", "<|endoftext|>", "chatml");
  const ChatTemplate::Text t = chatml.render(chat, true);
  EXPECT_EQ(t.text,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(at(t, 0), "Hi?<|im_end|>\n");
  EXPECT_EQ(at(t, 1), "Hello.<|im_end|>\n");
  EXPECT_EQ(at(t, 2), "Bye<|im_end|>\n");
  EXPECT_TRUE(t.generation.empty());

  // Llama 2: the system message goes inside the first user turn; the assistant's turn ends
  // with its </s>; content is stripped
  const std::vector<ChatMessage> with_system = {
      {"system", "Be brief."}, {"user", " 2+2? "}, {"assistant", " 4. "}, {"user", "3+3?"}};
  const ChatTemplate llama2(kLlama2, "<s>", "</s>", "llama2");
  const ChatTemplate::Text l = llama2.render(with_system, false);
  EXPECT_EQ(l.text, "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n 2+2? [/INST] 4. </s><s>[INST] 3+3? [/INST]");
  EXPECT_EQ(at(l, 0), "Be brief.");  // the system message's own text only: it is no turn of its own
  EXPECT_EQ(at(l, 2), "4. </s>");
  EXPECT_EQ(at(l, 3), "3+3? [/INST]");
  const std::vector<ChatMessage> out_of_order = {{"user", "a"}, {"user", "b"}};
  EXPECT_TRUE(testing::throws_with([&] { (void)llama2.render(out_of_order, false); },
                                   "the template raised an exception: Conversation roles must alternate"));

  // a template that rewrites the content: the turn runs from the end of the text of the messages
  // before it (this template has no generation prompt) to the end of its loop iteration
  const ChatTemplate upper("{% for m in messages %}{{ m.content | upper }}{% endfor %}", "", "", "upper");
  const ChatTemplate::Text u = upper.render(chat, false);
  EXPECT_EQ(u.text, "HI?HELLO.BYE");
  EXPECT_EQ(at(u, 1), "HELLO.");
}

// An assistant's tool calls have no content in the text: their turn starts where the generation
// prompt after the messages before them ends. Tools print in the file's key order; content given
// as parts is found by its text.
TEST(ChatTemplate, ToolCallTurnsStartWhereTheGenerationPromptEnds) {
  const auto line = nlohmann::ordered_json::parse(kToolChat);
  const std::vector<ChatMessage> chat = messages_of(line);
  const jinja::Value tools = jinja::Value::from_json(line["tools"]);
  const ChatTemplate t(kChatMlTools, "", "<|im_end|>", "chatml-tools");
  const ChatTemplate::Text r = t.render(chat, false, tools);
  EXPECT_EQ(r.text,
            "<|im_start|>system\nBe useful.\n\n# Tools\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": "
            "\"get_weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"place\": {\"type\": "
            "\"string\"}, \"days\": {\"type\": \"integer\"}}}}}\n</tools><|im_end|>\n"
            "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"place\": \"Paris\", "
            "\"days\": 2}}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n{\"temperature\": 21}\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\nIt is 21 degrees.<|im_end|>\n");
  EXPECT_EQ(at(r, 1), "Weather in Paris?<|im_end|>\n");
  EXPECT_EQ(at(r, 2),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"place\": \"Paris\", \"days\": 2}}\n"
            "</tool_call><|im_end|>\n");
  EXPECT_EQ(at(r, 3), "{\"temperature\": 21}\n</tool_response><|im_end|>\n");
  EXPECT_EQ(at(r, 4), "It is 21 degrees.<|im_end|>\n");
  // without tools, the system turn is plain
  EXPECT_EQ(t.render(chat, false).text.substr(0, 39), "<|im_start|>system\nBe useful.<|im_end|>");
  EXPECT_TRUE(testing::throws_with([&] { (void)t.render(chat, false, jinja::Value::string("x")); },
                                   "tools must be a list of schemas, found a string"));

  // a template that refuses the conversation before the call (it must end with the assistant)
  // leaves the call's turn unfound rather than guessed
  const ChatTemplate strict(
      "{% if messages[-1].role != 'assistant' %}{{ raise_exception('end with the assistant') }}{% endif %}"
      "{% for m in messages %}[{{ m.role }}]{{ m.content if m.content is string else '' }}"
      "{% for c in m.tool_calls | default([]) %}call {{ c.function.name }}{% endfor %}{% endfor %}",
      "", "", "strict");
  const std::vector<ChatMessage> call_last(chat.begin(), chat.begin() + 3);
  const ChatTemplate::Text s = strict.render(call_last, false);
  EXPECT_EQ(s.text, "[system]Be useful.[user][assistant]call get_weather");
  EXPECT_EQ(s.turns[2], (std::pair<size_t, size_t>{0, 0}));
}

TEST(ChatTemplate, GenerationBlocksAndTheDate) {
  const ChatTemplate t(
      "{{ strftime_now('%Y-%m-%d') }}|{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
      "{{ m.content }}!{% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}",
      "", "", "generation");
  const std::vector<ChatMessage> chat = {{"user", "q"}, {"assistant", "a"}};
  const ChatTemplate::Text r = t.render(chat, false, jinja::Value::none(), 1721995200);  // 2024-07-26 12:00 UTC
  EXPECT_EQ(r.text.substr(10), "|q|a!|");
  EXPECT_TRUE(r.text.starts_with("2024-07-2")) << r.text;  // the 26th in any time zone within 12 h of UTC
  ASSERT_EQ(r.generation.size(), 1u);
  EXPECT_EQ(r.text.substr(r.generation[0].first, r.generation[0].second - r.generation[0].first), "a!");
}

// A tokenizer folder: `tokenizer_json` beside a tokenizer_config.json with `config`.
std::string folder_with(const std::string& tokenizer_json, const nlohmann::json& config, const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_chat_" + name + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(tokenizer_json, dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  return dir.string();
}

TEST(ChatTemplate, Llama2VocabularyCountsTheAnswersAndTheirEos) {
  const std::string vocab = testing::source_dir() + "/.deps/llama2-tokenizer/tokenizer.json";
  if (!fs::exists(vocab)) GTEST_SKIP() << "no " << vocab << " (scripts/setup.sh --tests builds it)";
  const std::string dir =
      folder_with(vocab, {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"chat_template", kLlama2}}, "llama2");
  const BpeTokenizer t(dir);
  ASSERT_TRUE(t.has_chat_template()) << t.chat_template_problem();
  const std::vector<ChatMessage> chat = {
      {"user", "What is 2+2?"}, {"assistant", "4, of course."}, {"user", "And 3+3?"}, {"assistant", "6."}};
  const SftExample e = format_chat(t, chat, false);
  EXPECT_EQ(e.ids, t.encode(t.apply_chat_template(chat, false)));
  EXPECT_EQ(e.ids.front(), t.bos_id());
  // the answer's first token holds the template's space before it ("▁4"): it counts
  EXPECT_EQ(counted_runs(t, e), "[4, of course. </s>][6. </s>]");
  fs::remove_all(dir);
}

TEST(ChatTemplate, Llama3VocabularyWithGenerationBlocksCountsThemOnly) {
  ST_REQUIRE_SHARED_DATA(shared);
  const std::string tmpl =
      "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
      "{% if m.role == 'assistant' %}{% generation %}{{ m.content | trim }}<|eot_id|>{% endgeneration %}"
      "{% else %}{{ m.content | trim }}<|eot_id|>{% endif %}{% endfor %}";
  const std::string dir = folder_with(shared + "/tokenizers/llama3/tokenizer.json",
                                      {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"},
                                       {"chat_template", tmpl}},
                                      "llama3");
  const BpeTokenizer t(dir);
  ASSERT_TRUE(t.has_chat_template()) << t.chat_template_problem();
  const std::vector<ChatMessage> chat = {{"user", "Capital of France?"}, {"assistant", " Paris. "}};
  const SftExample e = format_chat(t, chat, false);
  EXPECT_EQ(counted_runs(t, e), "[Paris.<|eot_id|>]");
  const SftExample all = format_chat(t, chat, true);
  for (size_t i = 1; i < all.counted.size(); ++i) EXPECT_TRUE(all.counted[i]) << i;
  fs::remove_all(dir);
}

// A JSONL file of tool-calling chats: the calls and the answers count, with what the template
// wrote after them; a template that hides where a call's turn starts has it reported, not guessed.
TEST(ChatTemplate, ToolCallFilesCountTheCallsAndTheAnswers) {
  ST_REQUIRE_SHARED_DATA(shared);
  const std::string vocab = shared + "/tokenizers/llama3/tokenizer.json";
  const std::string line = nlohmann::ordered_json::parse(kToolChat).dump();
  const fs::path file = fs::temp_directory_path() / ("shardtrain_tool_chat_" + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(file) << line << "\n";
  SftOptions o;
  o.format = SftFormat::kChat;
  o.seq_len = 255;
  o.val_fraction = 0;
  o.packing = false;
  const std::string dir = folder_with(vocab, {{"eos_token", "<|end_of_text|>"}, {"chat_template", kChatMlTools}}, "tools");
  const BpeTokenizer t(dir);
  const SftData d(file.string(), t, o);
  ASSERT_EQ(d.train_sequences().count, 1);
  SftExample row;
  row.ids = d.train_sequences().ids;
  row.counted = d.train_sequences().counted;
  EXPECT_EQ(counted_runs(t, row),
            "[<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"place\": \"Paris\", \"days\": 2}}\n"
            "</tool_call><|im_end|>\n][It is 21 degrees.<|im_end|>\n]");
  EXPECT_EQ(d.summary().find("not found"), std::string::npos) << d.summary();

  const std::string strict_dir = folder_with(
      vocab,
      {{"eos_token", "<|end_of_text|>"},
       {"chat_template", "{% if messages[-1].role != 'assistant' %}{{ raise_exception('end with the assistant') }}"
                         "{% endif %}{% for m in messages %}[{{ m.role }}]{{ m.content if m.content is string }}"
                         "{% for c in m.tool_calls | default([]) %}call {{ c.function.name }}{% endfor %}"
                         "{% endfor %}"}},
      "strict");
  const BpeTokenizer strict(strict_dir);
  const SftData s(file.string(), strict, o);
  EXPECT_NE(s.summary().find("1 assistant turns in 1 examples were not found in the template's text"),
            std::string::npos)
      << s.summary();
  fs::remove_all(dir);
  fs::remove_all(strict_dir);
  fs::remove(file);
}

}  // namespace
}  // namespace shardtrain::data
