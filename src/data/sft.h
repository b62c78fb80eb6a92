// Supervised fine-tuning data: examples (a prompt and its response, or a chat of messages)
// whose loss counts only on what the model should learn to write (the response; the
// assistant's turns), packed whole into sequences of T + 1 tokens or one per sequence, padded.
// Each epoch visits every training sequence once, in an order drawn from (seed, epoch).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

namespace shardtrain::data {

enum class SftFormat {
  kPromptResponse,  // {"prompt": ..., "response": ...}: [BOS] prompt response [EOS]
  kChat,            // {"messages": [{"role": ..., "content": ...}, ...], "tools": [...]} in the tokenizer's
                    // chat template; messages may carry tool_calls and other fields, "tools" is optional
};

struct SftOptions {
  SftFormat format = SftFormat::kPromptResponse;
  std::string prompt_field = "prompt";
  std::string response_field = "response";
  std::string messages_field = "messages";
  // Count the loss on every token (the prompt, system and user turns and the chat headers too),
  // not only on the response and the assistant's turns.
  bool train_on_prompt = false;
  // Several whole examples per sequence (true) or one, padded (false).
  bool packing = true;
  double val_fraction = 0.05;
  int64_t seq_len = 0;  // T; sequences hold T + 1 tokens (inputs and shifted targets)
  uint64_t seed = 0;
  // The global batch: sequences per micro-batch over all ranks and micro-batches per step, so
  // that step s, micro-batch m, sequence i is training sequence (s - 1)·micro·global + m·global + i.
  int64_t global_batch = 1;
  int64_t micro_batches = 1;
};

// A conversation as a JSON object: `messages_field`, a non-empty list of {"role", "content", ...}
// messages (content a string, a list of parts or null; absent beside tool_calls; other fields
// kept in the file's order for the template), and "tools", a list of tool schemas (optional).
// The form of a chat data line and of `generate --conversation`. Throws naming `where`, the
// message and the field.
struct ChatConversation {
  std::vector<ChatMessage> messages;
  jinja::Value tools = jinja::Value::none();
};
ChatConversation parse_conversation(const std::string& json_text, const std::string& where,
                                    const std::string& messages_field = "messages");

// One example as token ids, and for each position whether predicting that token counts in
// the loss (counted[0], the first token, is never predicted).
struct SftExample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> counted;
  int64_t lost_turns = 0;  // chat: assistant turns not found in the template's text (none counts)
};

// [BOS] prompt response [EOS]; prompt and response are encoded separately, so the response's
// tokens are exactly encode(response). The response and EOS count (everything with
// train_on_prompt).
SftExample format_prompt_response(const Tokenizer& tokenizer, std::string_view prompt, std::string_view response,
                                  bool train_on_prompt);
// The chat template's text for `messages` (no generation prompt) and `tools`, encoded as one
// string, as transformers' apply_chat_template(tokenize=True) does. Tokens with a byte inside an
// assistant message's turn count: from its content (or, for tool calls without content, from
// where the generation prompt ends) to the end of what the template wrote for it, so its
// end-of-turn marker (<|eot_id|>, </s>, <|im_end|>) too; or, where the template marks the
// assistant's text with {% generation %} blocks, those (everything with train_on_prompt).
SftExample format_chat(const BpeTokenizer& tokenizer, std::span<const ChatMessage> messages, bool train_on_prompt,
                       const jinja::Value& tools = jinja::Value::none());

// Sequences of T + 1 tokens: examples whole, in the given order, several to a sequence while
// they fit (`packing`) or one each; the rest padded with `pad_id`, which never counts. An
// example longer than T + 1 keeps its first T + 1 tokens.
struct SftSequences {
  std::vector<int32_t> ids;       // [count, T + 1]
  std::vector<uint8_t> counted;   // [count, T + 1]
  int64_t count = 0;
  int64_t truncated = 0;          // examples cut to T + 1 tokens
  int64_t counted_tokens = 0;
};
SftSequences pack_examples(std::span<const SftExample> examples, std::span<const int64_t> order, int64_t seq_len,
                           bool packing, int32_t pad_id);

// The files an example source reads, in name order: a file itself; a folder's or pattern's
// Parquet files when it has any, else its JSONL files (a folder's .jsonl and .json files, also
// compressed; a pattern's matches). An error naming the source when there are none.
struct ExampleFiles {
  std::vector<std::string> files;
  bool parquet = false;  // Parquet rows, else JSONL lines
};
ExampleFiles example_files(const std::string& source);

// Every example of `path` (as SftData reads it: JSONL lines or Parquet rows) tokenized, in file
// order, on every core. Errors name the file and the line or row.
std::vector<SftExample> read_sft_examples(const std::string& path, const Tokenizer& tokenizer,
                                          const SftOptions& options);

// Example files: tokenized examples as a token cache keeps them (data/token_cache.h).
// Format, version 1 (little-endian; n examples, t tokens):
//   offset      size   field
//        0         8   magic "STSFT\0\0\0"
//        8         4   u32 version = 1
//       12         4   u32 zero
//       16         8   u64 n
//       24         8   u64 t
//       32         8   i64 vocab_size (every id is < vocab_size)
//       40   8(n+1)   u64 offsets: example i is tokens [offsets[i], offsets[i+1]); offsets[0] = 0, offsets[n] = t
//        .       4n    u32 lost_turns of each example
//        .       4t    i32 ids
//        .        t    u8 counted (0 or 1)
// The file is exactly that long. Written to "<path>.tmp" and renamed when complete.
void write_sft_examples(const std::string& path, std::span<const SftExample> examples, int64_t vocab_size);
// Reads and checks every field (magic, version, sizes, offsets, ids below vocab_size and
// model_vocab, counted 0 or 1), naming the file and what is wrong.
std::vector<SftExample> read_sft_examples_file(const std::string& path, int64_t model_vocab);

// A JSONL file (each line one example, blank lines skipped) or a Parquet file (each row one
// example, its fields read as the JSON a line would hold) of examples for training; an
// example goes to the held-out split with probability val_fraction by a hash of (seed, its
// index among the examples). Training sequences are packed from the examples in a seeded order; fill_train takes
// training sequence g = the formula in SftOptions, epoch g / count, in that epoch's order.
// Held-out batches: ceil(sequences / B), the last one partial when B does not divide them.
class SftData final : public TrainingData {
 public:
  SftData(const std::string& path, const Tokenizer& tokenizer, const SftOptions& options);
  // From examples already tokenized (read_sft_examples' in file order, or an example file's);
  // `path` names the source in errors and the summary, and `origin` ends the summary's first part.
  SftData(const std::vector<SftExample>& examples, const std::string& path, const Tokenizer& tokenizer,
          const SftOptions& options, const std::string& origin = "");

  void fill_train(Tensor& ids_BT, Tensor& targets_BT, int64_t step, int64_t micro,
                  int64_t first_sequence) const override;
  int64_t eval_batches(int64_t B, int64_t T) const override;
  void fill_eval(Tensor& ids_BT, Tensor& targets_BT, int64_t index) const override;
  std::string summary() const override { return summary_; }
  std::string held_out_size() const override;
  std::optional<EpochSize> epoch_size() const override;
  bool in_order() const override { return true; }
  void fill_sequence(Tensor& ids_1T, Tensor& targets_1T, int64_t g) const override;

  const SftSequences& train_sequences() const { return train_; }
  const SftSequences& held_out_sequences() const { return val_; }
  // Which training sequence global index g (the SftOptions formula) reads.
  int64_t train_sequence_at(int64_t g) const;

 private:
  SftOptions options_;
  SftSequences train_, val_;
  int64_t val_examples_ = 0;
  std::string summary_;
  mutable int64_t order_epoch_ = -1;  // the epoch whose order order_ holds
  mutable std::vector<int64_t> order_;
};

}  // namespace shardtrain::data
