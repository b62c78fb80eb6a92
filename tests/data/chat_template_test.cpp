// Chat templates as transformers renders them, and the turns they give fine-tuning's loss
// mask: ChatML (Qwen2), Llama 2 and Mistral forms of our own writing, generation blocks, the
// date of strftime_now, and the counted tokens of Llama 2's SentencePiece-style vocabulary
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
#include "testing/shared_data.h"

namespace shardtrain::data {
namespace {

namespace fs = std::filesystem;

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

  // a template that rewrites the content leaves no turn for it
  const ChatTemplate upper("{% for m in messages %}{{ m.content | upper }}{% endfor %}", "", "", "upper");
  const ChatTemplate::Text u = upper.render(chat, false);
  EXPECT_EQ(u.text, "HI?HELLO.BYE");
  EXPECT_EQ(u.turns[1], (std::pair<size_t, size_t>{0, 0}));
}

TEST(ChatTemplate, GenerationBlocksAndTheDate) {
  const ChatTemplate t(
      "{{ strftime_now('%Y-%m-%d') }}|{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
      "{{ m.content }}!{% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}",
      "", "", "generation");
  const std::vector<ChatMessage> chat = {{"user", "q"}, {"assistant", "a"}};
  const ChatTemplate::Text r = t.render(chat, false, 1721995200);  // 2024-07-26 12:00 UTC
  EXPECT_EQ(r.text.substr(10), "|q|a!|");
  EXPECT_TRUE(r.text.starts_with("2024-07-2")) << r.text;  // the 26th in any time zone within 12 h of UTC
  ASSERT_EQ(r.generation.size(), 1u);
  EXPECT_EQ(r.text.substr(r.generation[0].first, r.generation[0].second - r.generation[0].first), "a!");
}

// The counted tokens of a chat example, joined and bracketed per run.
std::string counted_runs(const BpeTokenizer& t, const SftExample& e) {
  std::string out;
  std::vector<int32_t> run;
  for (size_t i = 0; i <= e.ids.size(); ++i) {
    if (i < e.ids.size() && e.counted[i]) {
      run.push_back(e.ids[i]);
    } else if (!run.empty()) {
      out += '[';
      out += t.decode(run);
      out += ']';
      run.clear();
    }
  }
  return out;
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

}  // namespace
}  // namespace shardtrain::data
