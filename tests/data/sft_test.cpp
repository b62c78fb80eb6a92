// Supervised fine-tuning data: which tokens count for prompt/response and chat examples
// (chat against the Llama 3 template's own text), packing, the per-epoch order over ranks and
// micro-batches, held-out batches and the errors bad files get.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "testing/compare.h"
#include "testing/counted_runs.h"

#include "data/bpe_tokenizer.h"
#include "data/byte_tokenizer.h"
#include "data/sft.h"
#include "testing/shared_data.h"

namespace shardtrain::data {
namespace {

using testing::throws_with;

std::string temp_file(const std::string& name, const std::string& contents) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("shardtrain_sft_" + std::to_string(::getpid()) + "_" + name)).string();
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

// The text of the tokens of `e` that count, as bytes (byte tokenizer).
std::string counted_text(const SftExample& e) {
  std::string s;
  for (size_t i = 0; i < e.ids.size(); ++i)
    if (e.counted[i] && e.ids[i] < 256) s += static_cast<char>(e.ids[i]);
  return s;
}

TEST(Sft, PromptResponseCountsTheResponseAndEos) {
  ByteTokenizer t;
  const SftExample e = format_prompt_response(t, "Q: 2+2?\n", "A: 4", false);
  std::vector<int32_t> expected = {ByteTokenizer::kBos};
  for (char c : std::string("Q: 2+2?\nA: 4")) expected.push_back(static_cast<unsigned char>(c));
  expected.push_back(ByteTokenizer::kEos);
  EXPECT_EQ(e.ids, expected);
  EXPECT_EQ(counted_text(e), "A: 4");
  EXPECT_TRUE(e.counted.back());  // EOS: the model learns to stop
  const SftExample all = format_prompt_response(t, "Q: 2+2?\n", "A: 4", true);
  EXPECT_FALSE(all.counted[0]);
  for (size_t i = 1; i < all.counted.size(); ++i) EXPECT_TRUE(all.counted[i]);
}

// The chat example's ids are the template's text encoded as one string; the counted tokens
// are exactly the assistant turns' contents and their <|eot_id|>.
TEST(Sft, ChatCountsTheAssistantTurnsOfTheLlama3Template) {
  ST_REQUIRE_SHARED_DATA(dir);
  const BpeTokenizer t(dir + "/tokenizers/llama3");
  ASSERT_TRUE(t.has_chat_template());
  const std::vector<ChatMessage> chat = {{"system", "You answer briefly."},
                                         {"user", "What is the capital of France?"},
                                         {"assistant", "  Paris.\n"},
                                         {"user", "And of Italy?"},
                                         {"assistant", "Rome, since 1871."}};
  const SftExample e = format_chat(t, chat, false);
  EXPECT_EQ(e.ids, t.encode(t.apply_chat_template(chat, false)));
  EXPECT_EQ(e.ids.front(), t.bos_id());
  EXPECT_EQ(testing::counted_runs(t, e), "[Paris.<|eot_id|>][Rome, since 1871.<|eot_id|>]");
  const SftExample all = format_chat(t, chat, true);
  EXPECT_EQ(all.ids, e.ids);
  for (size_t i = 1; i < all.counted.size(); ++i) EXPECT_TRUE(all.counted[i]);
}

SftExample example(int32_t first, size_t n) {
  SftExample e;
  for (size_t i = 0; i < n; ++i) {
    e.ids.push_back(first + static_cast<int32_t>(i));
    e.counted.push_back(i > 0 ? 1 : 0);
  }
  return e;
}

TEST(Sft, PackingKeepsExamplesWholeAndPadsWithUncountedTokens) {
  const std::vector<SftExample> ex = {example(100, 4), example(200, 5), example(300, 12), example(400, 2)};
  const std::vector<int64_t> order = {0, 1, 2, 3};
  // Sequences of 9 tokens (T = 8): [0 1] share one, [2] is cut to 9, [3] alone.
  const SftSequences p = pack_examples(ex, order, 8, true, 7);
  ASSERT_EQ(p.count, 3);
  EXPECT_EQ(p.truncated, 1);
  const std::vector<int32_t> expected = {100, 101, 102, 103, 200, 201, 202, 203, 204,  //
                                         300, 301, 302, 303, 304, 305, 306, 307, 308,  //
                                         400, 401, 7,   7,   7,   7,   7,   7,   7};
  EXPECT_EQ(p.ids, expected);
  const std::vector<uint8_t> counted = {0, 1, 1, 1, 0, 1, 1, 1, 1,  //
                                        0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                        0, 1, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(p.counted, counted);
  EXPECT_EQ(p.counted_tokens, 3 + 4 + 8 + 1);
  const SftSequences one = pack_examples(ex, order, 8, false, 7);
  EXPECT_EQ(one.count, 4);
  EXPECT_EQ(one.ids[9], 200);
  EXPECT_EQ(one.ids[13], 204);
  EXPECT_EQ(one.ids[14], 7);
}

std::string prompt_response_jsonl(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    s += "{\"prompt\": \"question " + std::to_string(i) + "? \", \"response\": \"answer " + std::to_string(i) +
         ".\", \"id\": " + std::to_string(i) + "}\n";
    if (i % 7 == 3) s += "\n";  // blank lines are skipped
  }
  return s;
}

// Every epoch reads every training sequence once, however the global batch is split over
// ranks and micro-batches; targets count only the responses.
TEST(Sft, EachEpochVisitsEverySequenceOnceAcrossRanksAndMicroBatches) {
  const std::string path = temp_file("epochs.jsonl", prompt_response_jsonl(120));
  ByteTokenizer t;
  SftOptions o;
  o.seq_len = 64;
  o.seed = 11;
  o.val_fraction = 0.1;
  o.global_batch = 2 * 3;  // 2 ranks x 3 sequences
  o.micro_batches = 2;
  const SftData d(path, t, o);
  const SftSequences& train = d.train_sequences();
  ASSERT_GT(train.count, 10);
  EXPECT_GT(d.held_out_sequences().count, 0);
  EXPECT_NE(d.summary().find("120 examples"), std::string::npos) << d.summary();
  // Drawn the way the trainer draws: rank r takes sequences r*B .. r*B + B-1 of each micro-batch.
  std::vector<std::vector<int32_t>> seen;
  Tensor ids = Tensor::empty({3, 64}, DType::kI32), targets = Tensor::empty({3, 64}, DType::kI32);
  const int64_t steps = (2 * train.count + 11) / 12;
  for (int64_t step = 1; step <= steps; ++step)
    for (int64_t m = 0; m < 2; ++m)
      for (int64_t rank = 0; rank < 2; ++rank) {
        d.fill_train(ids, targets, step, m, rank * 3);
        for (int64_t b = 0; b < 3; ++b) {
          const int32_t* row = ids.data<int32_t>() + b * 64;
          const int32_t* tg = targets.data<int32_t>() + b * 64;
          seen.emplace_back(row, row + 64);
          // A counted target is the next input; the prompt's are ignored.
          for (int64_t i = 0; i + 1 < 64; ++i)
            if (tg[i] != -100) {
              EXPECT_EQ(tg[i], row[i + 1]);
            }
        }
      }
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::set<std::vector<int32_t>> rows;
    for (int64_t i = 0; i < train.count; ++i) rows.insert(seen[static_cast<size_t>(epoch * train.count + i)]);
    std::set<std::vector<int32_t>> all;
    for (int64_t s = 0; s < train.count; ++s)
      all.emplace(train.ids.begin() + s * 65, train.ids.begin() + s * 65 + 64);
    EXPECT_EQ(rows, all) << "epoch " << epoch;
  }
  EXPECT_NE(seen[0], seen[static_cast<size_t>(train.count)]);  // the second epoch has its own order
  // The counted text of a whole sequence: its examples' responses and EOS.
  d.fill_train(ids, targets, 1, 0, 0);
  std::string answer;
  for (int64_t i = 0; i < 64; ++i) {
    const int32_t v = targets.data<int32_t>()[i];
    if (v >= 0 && v < 256) answer += static_cast<char>(v);
  }
  EXPECT_EQ(answer.rfind("answer ", 0), 0u) << answer;
  EXPECT_EQ(answer.find("question"), std::string::npos) << answer;

  ASSERT_GE(d.eval_batches(3, 64), 1);
  d.fill_eval(ids, targets, 0);
  EXPECT_EQ(ids.data<int32_t>()[0], ByteTokenizer::kBos);
  std::filesystem::remove(path);
}

TEST(Sft, BadFilesAreNamedByLineAndField) {
  ByteTokenizer t;
  SftOptions o;
  o.seq_len = 32;
  const std::string missing =
      temp_file("missing.jsonl", "{\"prompt\": \"a\", \"response\": \"b\"}\n{\"prompt\": \"c\"}\n");
  EXPECT_TRUE(throws_with([&] { SftData(missing, t, o); }, "missing.jsonl` line 2: no field `response`"));
  const std::string number = temp_file("number.jsonl", "{\"prompt\": 3, \"response\": \"b\"}\n");
  EXPECT_TRUE(throws_with([&] { SftData(number, t, o); }, "line 1: field `prompt` is number, expected a string"));
  const std::string broken = temp_file("broken.jsonl", "{\"prompt\": \"a\", \n");
  EXPECT_TRUE(throws_with([&] { SftData(broken, t, o); }, "line 1: malformed JSON"));
  // Latin-1 text (0xe9 for é) is not UTF-8: said as such, with the byte
  const std::string latin1 = temp_file("latin1.jsonl", "{\"prompt\": \"a\", \"response\": \"b\"}\n"
                                                       "{\"prompt\": \"caf\xe9\", \"response\": \"b\"}\n");
  EXPECT_TRUE(throws_with([&] { SftData(latin1, t, o); },
                          "latin1.jsonl` line 2: not valid UTF-8 (byte 15 of the line is 0xe9)"));
  EXPECT_TRUE(throws_with([&] { SftData(temp_file("empty.jsonl", "\n\n"), t, o); }, "holds no examples"));
  o.format = SftFormat::kChat;
  const std::string chat = temp_file("chat.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
  EXPECT_TRUE(throws_with([&] { SftData(chat, t, o); }, "needs a tokenizer with a chat template"));
  for (const std::string& p : {missing, number, broken, chat}) std::filesystem::remove(p);
}

TEST(Sft, ChatFilesNeedAnAssistantTurnUnlessEveryTokenCounts) {
  ST_REQUIRE_SHARED_DATA(dir);
  const BpeTokenizer t(dir + "/tokenizers/llama3");
  SftOptions o;
  o.format = SftFormat::kChat;
  o.seq_len = 64;
  o.val_fraction = 0;
  const std::string no_assistant =
      temp_file("user_only.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
  EXPECT_TRUE(throws_with([&] { SftData(no_assistant, t, o); }, "line 1: no message has role `assistant`"));
  const std::string bad_message = temp_file("bad_message.jsonl", "{\"messages\": [{\"role\": \"user\"}]}\n");
  EXPECT_TRUE(throws_with([&] { SftData(bad_message, t, o); }, "line 1: message 0: no field `content`"));
  const std::string number_content = temp_file(
      "number_content.jsonl", "{\"messages\": [{\"role\": \"assistant\", \"content\": 3, \"name\": \"x\"}]}\n");
  EXPECT_TRUE(throws_with([&] { SftData(number_content, t, o); },
                          "line 1: message 0: field `content` is number, expected a string, a list of parts or null"));
  const std::string bad_tools = temp_file(
      "bad_tools.jsonl",
      "{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}], \"tools\": {\"name\": \"f\"}}\n");
  EXPECT_TRUE(throws_with([&] { SftData(bad_tools, t, o); },
                          "line 1: field `tools` is object, expected a list of tool schemas (or null)"));
  std::filesystem::remove(number_content);
  std::filesystem::remove(bad_tools);
  o.train_on_prompt = true;
  const SftData d(no_assistant, t, o);
  EXPECT_EQ(d.train_sequences().count, 1);
  std::filesystem::remove(no_assistant);
  std::filesystem::remove(bad_message);
}

}  // namespace
}  // namespace shardtrain::data
