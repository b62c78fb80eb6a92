// Supervised fine-tuning examples: JSONL lines or Parquet rows, loss masks, packing and the
// per-epoch order. Examples are read on one thread (errors name the line or row), encoded in
// parallel.
#include "data/sft.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "core/random.h"
#include "data/corpus.h"
#include "data/parallel.h"
#include "data/utf8.h"
#include "io/input_file.h"
#include "io/parquet.h"

namespace shardtrain::data {
namespace {

constexpr int32_t kIgnore = -100;  // model::StepOptions::ignore_index

// A seeded permutation of [0, n) (Fisher-Yates over counter-based draws: the same on every
// platform and rank).
std::vector<int64_t> permutation(int64_t n, uint64_t seed, uint64_t key) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(hash3(seed, key, static_cast<uint64_t>(i)) % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

// One parsed line or row: the strings its example is made of.
struct RawExample {
  int64_t line = 0;  // 1-based line of a JSONL file or row of a Parquet file
  std::string file;  // the Parquet file of the row (several make one source)
  std::string prompt, response;
  std::vector<ChatMessage> messages;
  jinja::Value tools = jinja::Value::none();
};

using Json = nlohmann::ordered_json;  // objects in the file's key order, as the templates print them

std::string field_string(const Json& j, const std::string& field, const std::string& where) {
  const auto it = j.find(field);
  ST_CHECK(it != j.end(), where, ": no field `", field, "`");
  ST_CHECK(it->is_string(), where, ": field `", field, "` is ", it->type_name(), ", expected a string");
  return it->get<std::string>();
}

Json parse_object(const std::string& text, const std::string& where) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    const std::string bad_utf8 = utf8_problem(text);
    ST_CHECK(bad_utf8.empty(), where, ": ", bad_utf8);
    ST_THROW(where, ": malformed JSON: ", e.what());
  }
  ST_CHECK(j.is_object(), where, ": expected a JSON object, found ", j.type_name());
  return j;
}

ChatConversation conversation_of(const Json& j, const std::string& where, const std::string& messages_field) {
  const auto it = j.find(messages_field);
  ST_CHECK(it != j.end(), where, ": no field `", messages_field, "`");
  ST_CHECK(it->is_array() && !it->empty(), where, ": field `", messages_field,
           "` must be a non-empty array of {\"role\", \"content\"} objects, found ",
           it->is_array() ? "an empty array" : it->type_name());
  ChatConversation c;
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& m = (*it)[i];
    const std::string at = fmt::format("{}: message {}", where, i);
    ST_CHECK(m.is_object(), at, ": expected an object with `role` and `content`, found ", m.type_name());
    ChatMessage message;
    message.role = field_string(m, "role", at);
    const auto content = m.find("content");
    if (content != m.end() && content->is_string() && m.size() == 2) {
      message.content = content->get<std::string>();
    } else {  // tool calls, a tool's name or id, content as parts or none: the template sees it all
      ST_CHECK(content != m.end() || m.contains("tool_calls"), at, ": no field `content` (nor `tool_calls`)");
      ST_CHECK(content == m.end() || content->is_string() || content->is_null() || content->is_array(), at,
               ": field `content` is ", content->type_name(), ", expected a string, a list of parts or null");
      if (content != m.end() && content->is_string()) message.content = content->get<std::string>();
      message.json = jinja::Value::from_json(m);
    }
    c.messages.push_back(std::move(message));
  }
  if (const auto tools = j.find("tools"); tools != j.end() && !tools->is_null()) {
    ST_CHECK(tools->is_array(), where, ": field `tools` is ", tools->type_name(),
             ", expected a list of tool schemas (or null)");
    c.tools = jinja::Value::from_json(*tools);
  }
  return c;
}

RawExample parse_example(const Json& j, int64_t number, const std::string& where, const SftOptions& o) {
  RawExample r;
  r.line = number;
  if (o.format == SftFormat::kPromptResponse) {
    r.prompt = field_string(j, o.prompt_field, where);
    r.response = field_string(j, o.response_field, where);
    ST_CHECK(!r.response.empty(), where, ": field `", o.response_field, "` is empty; an example needs a response");
    return r;
  }
  ChatConversation c = conversation_of(j, where, o.messages_field);
  const bool assistant = std::any_of(c.messages.begin(), c.messages.end(),
                                     [](const ChatMessage& m) { return m.role == "assistant"; });
  ST_CHECK(assistant || o.train_on_prompt, where,
           ": no message has role `assistant`, so nothing would count in the loss (or set `data.train_on_prompt`)");
  r.messages = std::move(c.messages);
  r.tools = std::move(c.tools);
  return r;
}

// A JSONL file's examples, one per non-blank line.
std::vector<RawExample> read_jsonl_examples(const std::string& path, const SftOptions& o) {
  io::InputFile in(path);  // line by line, decompressed when it is a .gz or .zst file
  std::vector<RawExample> raw;
  std::string line;
  for (int64_t number = 1; in.read_line(line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = fmt::format("`{}` line {}", path, number);
    raw.push_back(parse_example(parse_object(line, where), number, where, o));
  }
  return raw;
}

// A Parquet file's examples, one per row: the fields an example needs (and `tools` beside
// messages when the file has it) read as JSON, so a row is what the same JSONL line would be.
std::vector<RawExample> read_parquet_examples(const std::string& path, const SftOptions& o) {
  const io::ParquetFile file(path);
  // each field the example needs, with the key that names it
  std::vector<std::pair<std::string, const char*>> needed;
  if (o.format == SftFormat::kPromptResponse)
    needed = {{o.prompt_field, "data.prompt_field"}, {o.response_field, "data.response_field"}};
  else
    needed = {{o.messages_field, "data.messages_field"}};
  std::vector<std::string> fields;
  for (const auto& [field, key] : needed) {
    ST_CHECK(file.has_field(field), "`", path, "`: no field `", field, "` (", key, " names it); the file's fields are ",
             file.describe_fields());
    fields.push_back(field);
  }
  if (o.format == SftFormat::kChat && file.has_field("tools") && o.messages_field != "tools") fields.push_back("tools");
  std::vector<RawExample> raw;
  int64_t row = 0;
  for (int g = 0; g < file.num_row_groups(); ++g) {
    for (const Json& j : file.read_rows(g, fields)) {
      ++row;
      raw.push_back(parse_example(j, row, fmt::format("`{}` row {}", path, row), o));
    }
  }
  return raw;
}

}  // namespace

ChatConversation parse_conversation(const std::string& json_text, const std::string& where,
                                    const std::string& messages_field) {
  return conversation_of(parse_object(json_text, where), where, messages_field);
}

SftExample format_prompt_response(const Tokenizer& tokenizer, std::string_view prompt, std::string_view response,
                                  bool train_on_prompt) {
  SftExample e;
  if (tokenizer.bos_id() >= 0) e.ids.push_back(tokenizer.bos_id());
  const std::vector<int32_t> p = tokenizer.encode(prompt);
  e.ids.insert(e.ids.end(), p.begin(), p.end());
  e.counted.assign(e.ids.size(), train_on_prompt ? 1 : 0);
  const std::vector<int32_t> r = tokenizer.encode(response);
  e.ids.insert(e.ids.end(), r.begin(), r.end());
  if (tokenizer.eos_id() >= 0) e.ids.push_back(tokenizer.eos_id());
  e.counted.resize(e.ids.size(), 1);
  if (!e.counted.empty()) e.counted[0] = 0;
  return e;
}

SftExample format_chat(const BpeTokenizer& tokenizer, std::span<const ChatMessage> messages, bool train_on_prompt,
                       const jinja::Value& tools) {
  const ChatTemplate::Text chat = tokenizer.render_chat(messages, false, tools);
  SftExample e;
  // The text's bytes that count: the assistant's turns, or the template's generation blocks
  // where it marks the assistant's text itself.
  std::vector<uint8_t> counts(chat.text.size(), train_on_prompt ? 1 : 0);
  if (!train_on_prompt) {
    if (!chat.generation.empty()) {
      for (const auto& [first, end] : chat.generation) std::fill(counts.begin() + first, counts.begin() + end, 1);
    } else {
      for (size_t i = 0; i < messages.size(); ++i) {
        if (messages[i].role != "assistant") continue;
        std::fill(counts.begin() + chat.turns[i].first, counts.begin() + chat.turns[i].second, 1);
        e.lost_turns += chat.turns[i].first == chat.turns[i].second ? 1 : 0;
      }
    }
  }
  e.ids = tokenizer.encode(chat.text);
  e.counted.assign(e.ids.size(), 0);
  // Each token's first byte in the text: the sum of the lengths before it. Tokens are exact
  // byte strings (special tokens their text), but for the "▁" a SentencePiece-style tokenizer
  // puts before a stretch of text (its start, after a special token) that the text does not
  // have: that space takes no byte of the text.
  size_t offset = 0;
  bool stretch_start = true;
  for (size_t i = 0; i < e.ids.size(); ++i) {
    const std::string bytes = tokenizer.id_to_bytes(e.ids[i]);
    const bool special = tokenizer.is_special(e.ids[i]);
    size_t length = bytes.size();
    if (!special && stretch_start && !bytes.empty() && bytes[0] == ' ' &&
        (offset >= chat.text.size() || chat.text[offset] != ' '))
      --length;
    // a token counts where any of its bytes does (SentencePiece's "▁answer" after "[/INST]" holds
    // the template's space before the answer)
    bool any = false;
    for (size_t b = offset; b < offset + length && b < counts.size() && !any; ++b) any = counts[b] != 0;
    e.counted[i] = i > 0 && any ? 1 : 0;
    offset += length;
    stretch_start = special;
  }
  ST_ASSERT(offset == chat.text.size(), "chat tokens cover ", offset, " bytes of a ", chat.text.size(), "-byte text");
  return e;
}

SftSequences pack_examples(std::span<const SftExample> examples, std::span<const int64_t> order, int64_t seq_len,
                           bool packing, int32_t pad_id) {
  const auto row = static_cast<size_t>(seq_len + 1);
  SftSequences s;
  size_t used = row;  // tokens in the open sequence; `row`: none is open
  for (const int64_t index : order) {
    const SftExample& e = examples[static_cast<size_t>(index)];
    const size_t n = std::min(e.ids.size(), row);
    if (n == 0) continue;
    s.truncated += e.ids.size() > row ? 1 : 0;
    if (!packing || used + n > row) {  // open a new sequence, padded until filled
      s.ids.resize(s.ids.size() + row, pad_id);
      s.counted.resize(s.counted.size() + row, 0);
      ++s.count;
      used = 0;
    }
    const size_t at = s.ids.size() - row + used;
    std::copy_n(e.ids.begin(), n, s.ids.begin() + static_cast<std::ptrdiff_t>(at));
    std::copy_n(e.counted.begin(), n, s.counted.begin() + static_cast<std::ptrdiff_t>(at));
    // The first token of a sequence is never a target.
    if (used == 0) s.counted[at] = 0;
    used += n;
    if (!packing) used = row;
  }
  for (size_t i = 0; i < s.counted.size(); ++i) s.counted_tokens += s.counted[i];
  return s;
}

namespace {

const BpeTokenizer* chat_tokenizer(const std::string& path, const Tokenizer& tokenizer, const SftOptions& o) {
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(&tokenizer);
  if (o.format == SftFormat::kChat) {
    ST_CHECK(bpe != nullptr && bpe->has_chat_template(), "`data.format` = chat needs a tokenizer with a chat "
             "template (tokenizer_config.json's chat_template); `", path, "` would be read with ",
             bpe == nullptr ? "the byte-level tokenizer" : "a tokenizer without one: " + bpe->chat_template_problem(),
             ". Fine-tune a model whose tokenizer_config.json has a `chat_template` (an instruct model's folder), or "
             "write the examples as prompt/response pairs and use `data.format` = sft");
  }
  return bpe;
}

}  // namespace

ExampleFiles example_files(const std::string& source) {
  ExampleFiles f;
  if (!std::filesystem::is_directory(source) && !is_source_pattern(source)) {
    f.files = {source};
    f.parquet = io::is_parquet_file(source);
    return f;
  }
  const std::vector<std::string> all = source_files(source);
  f.parquet = std::any_of(all.begin(), all.end(), [](const std::string& p) { return io::is_parquet_file(p); });
  f.files = document_files(source, f.parquet ? DocumentFormat::kParquet : DocumentFormat::kJsonl);
  return f;
}

std::vector<SftExample> read_sft_examples(const std::string& path, const Tokenizer& tokenizer,
                                          const SftOptions& o) {
  const BpeTokenizer* bpe = chat_tokenizer(path, tokenizer, o);
  // one file, or the Parquet or JSONL files of a folder or pattern: their rows or lines one
  // after another, in name order
  const ExampleFiles source = example_files(path);
  const bool parquet = source.parquet;
  std::vector<RawExample> raw;
  for (const std::string& file : source.files) {
    std::vector<RawExample> part = parquet ? read_parquet_examples(file, o) : read_jsonl_examples(file, o);
    for (RawExample& r : part) r.file = file;
    raw.insert(raw.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  ST_CHECK(!raw.empty(), "`", path, "` holds no examples");

  std::vector<SftExample> examples(raw.size());
  const auto n = static_cast<int64_t>(raw.size());
  parallel_for_lowest_error(n, 0, [&](int64_t i) {
    const RawExample& r = raw[static_cast<size_t>(i)];
    examples[static_cast<size_t>(i)] =
        with_context([&] { return fmt::format("tokenizing `{}` {} {}", r.file, parquet ? "row" : "line", r.line); }, [&] {
          return o.format == SftFormat::kChat ? format_chat(*bpe, r.messages, o.train_on_prompt, r.tools)
                                              : format_prompt_response(tokenizer, r.prompt, r.response,
                                                                       o.train_on_prompt);
        });
  });
  return examples;
}

SftData::SftData(const std::string& path, const Tokenizer& tokenizer, const SftOptions& options)
    : SftData(read_sft_examples(path, tokenizer, options), path, tokenizer, options) {}

SftData::SftData(const std::vector<SftExample>& examples, const std::string& path, const Tokenizer& tokenizer,
                 const SftOptions& options, const std::string& origin)
    : options_(options) {
  const SftOptions& o = options_;
  ST_CHECK(o.val_fraction >= 0 && o.val_fraction <= 1, "`data.val_fraction` must be in [0, 1], found ", o.val_fraction);
  const bool held_out_only = o.val_fraction >= 1;
  ST_CHECK(o.seq_len > 0 && o.global_batch > 0 && o.micro_batches > 0, "SFT data: bad shape");
  chat_tokenizer(path, tokenizer, o);
  ST_CHECK(!examples.empty(), "`", path, "` holds no examples");
  const auto n = static_cast<int64_t>(examples.size());

  int64_t lost_turns = 0, lost_examples = 0;
  for (const SftExample& e : examples) {
    lost_turns += e.lost_turns;
    lost_examples += e.lost_turns > 0 ? 1 : 0;
  }

  const uint64_t split_key = name_key("sft validation split");
  std::vector<int64_t> train_index, val_index;
  for (int64_t i = 0; i < n; ++i)
    (held_out_only || uniform_at(o.seed, split_key, static_cast<uint64_t>(i)) < o.val_fraction ? val_index
                                                                                                : train_index)
        .push_back(i);
  val_examples_ = static_cast<int64_t>(val_index.size());
  ST_CHECK(held_out_only || !train_index.empty(), "`", path, "`: all ", n,
           " examples went to the held-out split; lower `data.val_fraction`");
  // Training examples are packed in a seeded order, so neighbours in a sequence are unrelated.
  const std::vector<int64_t> shuffled = permutation(static_cast<int64_t>(train_index.size()), o.seed,
                                                    name_key("sft packing order"));
  std::vector<int64_t> train_order(train_index.size());
  for (size_t i = 0; i < shuffled.size(); ++i) train_order[i] = train_index[static_cast<size_t>(shuffled[i])];
  const int32_t pad = tokenizer.eos_id() >= 0 ? tokenizer.eos_id() : 0;
  train_ = pack_examples(examples, train_order, o.seq_len, o.packing, pad);
  val_ = pack_examples(examples, val_index, o.seq_len, o.packing, pad);
  ST_CHECK(held_out_only || train_.counted_tokens > 0, "`", path, "`: no training token counts in the loss");
  ST_CHECK(!held_out_only || val_.counted_tokens > 0, "`", path, "`: no held-out token counts in the loss");

  const double row = static_cast<double>(o.seq_len + 1);
  if (held_out_only)
    summary_ = fmt::format(
        "{} examples in `{}` ({}), all held out -> {} sequences of {} tokens ({:.1f} % of their tokens counted in "
        "the loss, {} examples cut to fit)",
        n, path, o.format == SftFormat::kChat ? "chat" : "prompt/response", val_.count, o.seq_len + 1,
        100.0 * static_cast<double>(val_.counted_tokens) / (row * static_cast<double>(val_.count)), val_.truncated);
  else
    summary_ = fmt::format(
        "{} examples in `{}` ({}) -> {} training sequences of {} tokens ({}, {:.1f} % of their tokens counted in "
        "the loss, {} examples cut to fit), {} held-out examples -> {} sequences",
        n, path, o.format == SftFormat::kChat ? "chat" : "prompt/response", train_.count, o.seq_len + 1,
        o.packing ? "packed" : "one example each",
        100.0 * static_cast<double>(train_.counted_tokens) / (row * static_cast<double>(train_.count)),
        train_.truncated + val_.truncated, val_examples_, val_.count);
  summary_ += origin;
  if (lost_turns > 0)
    summary_ += fmt::format("; {} assistant turns in {} examples were not found in the template's text and do not "
                            "count (a template that rewrites the content; see data.format = chat in docs/fine-tuning.md)",
                            lost_turns, lost_examples);
}

int64_t SftData::train_sequence_at(int64_t g) const {
  ST_ASSERT(g >= 0);
  const int64_t epoch = g / train_.count;
  if (epoch != order_epoch_) {
    const uint64_t key = hash3(name_key("sft epoch order"), 0, static_cast<uint64_t>(epoch));
    order_ = permutation(train_.count, options_.seed, key);
    order_epoch_ = epoch;
  }
  return order_[static_cast<size_t>(g % train_.count)];
}

namespace {

// Row b of ids and targets from sequence `s` (T + 1 tokens): targets are the next tokens where
// they count, ignored elsewhere.
void put_sequence(Tensor& ids_BT, Tensor& targets_BT, int64_t b, const SftSequences& seqs, int64_t s) {
  const int64_t T = ids_BT.size(1);
  ST_ASSERT(s >= 0 && s < seqs.count);
  const int32_t* src = seqs.ids.data() + s * (T + 1);
  const uint8_t* counted = seqs.counted.data() + s * (T + 1);
  int32_t* ids = ids_BT.data<int32_t>() + b * T;
  int32_t* targets = targets_BT.data<int32_t>() + b * T;
  for (int64_t t = 0; t < T; ++t) {
    ids[t] = src[t];
    targets[t] = counted[t + 1] ? src[t + 1] : kIgnore;
  }
}

}  // namespace

void SftData::fill_train(Tensor& ids_BT, Tensor& targets_BT, int64_t step, int64_t micro,
                         int64_t first_sequence) const {
  const int64_t B = ids_BT.size(0);
  ST_ASSERT(ids_BT.size(1) == options_.seq_len && targets_BT.shape() == ids_BT.shape());
  ST_CHECK(step >= 1, "SFT data: steps count from 1, found ", step);
  ST_CHECK(train_.count > 0, "this data was opened for evaluation only");
  const int64_t first = ((step - 1) * options_.micro_batches + micro) * options_.global_batch + first_sequence;
  for (int64_t b = 0; b < B; ++b) put_sequence(ids_BT, targets_BT, b, train_, train_sequence_at(first + b));
}

void SftData::fill_sequence(Tensor& ids_1T, Tensor& targets_1T, int64_t g) const {
  ST_ASSERT(ids_1T.size(0) == 1 && ids_1T.size(1) == options_.seq_len && targets_1T.shape() == ids_1T.shape());
  ST_CHECK(train_.count > 0, "this data was opened for evaluation only");
  put_sequence(ids_1T, targets_1T, 0, train_, train_sequence_at(g));
}

int64_t SftData::eval_batches(int64_t B, int64_t T) const {
  ST_ASSERT(T == options_.seq_len && B > 0);
  return (val_.count + B - 1) / B;  // the last one partial: a small held-out split is evaluated whole
}

void SftData::fill_eval(Tensor& ids_BT, Tensor& targets_BT, int64_t index) const {
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1);
  ST_CHECK(index >= 0 && index < eval_batches(B, T), "evaluation batch ", index, " is past the held-out ",
           held_out_size());
  const int32_t pad = val_.ids.empty() ? 0 : val_.ids.back();
  for (int64_t b = 0; b < B; ++b) {
    if (index * B + b < val_.count) {
      put_sequence(ids_BT, targets_BT, b, val_, index * B + b);
    } else {  // past the split's end: a row that counts nothing
      std::fill_n(ids_BT.data<int32_t>() + b * T, T, pad);
      std::fill_n(targets_BT.data<int32_t>() + b * T, T, kIgnore);
    }
  }
}

std::optional<EpochSize> SftData::epoch_size() const {
  if (train_.count == 0) return std::nullopt;  // evaluation only
  return EpochSize{EpochSize::Unit::kSequences, train_.count};
}

std::string SftData::held_out_size() const {
  return fmt::format("{} examples in {} sequences", val_examples_, val_.count);
}

// ---- example files ----

namespace {

constexpr char kSftMagic[8] = {'S', 'T', 'S', 'F', 'T', '\0', '\0', '\0'};
constexpr uint32_t kSftVersion = 1;
constexpr size_t kSftHeaderBytes = 40;

template <typename T>
void put(std::vector<uint8_t>& out, T value) {
  const auto* p = reinterpret_cast<const uint8_t*>(&value);  // little-endian hosts only (x86-64, arm64)
  out.insert(out.end(), p, p + sizeof(T));
}

template <typename T>
T get(std::span<const uint8_t> bytes, size_t at) {
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof(T));
  return value;
}

}  // namespace

void write_sft_examples(const std::string& path, std::span<const SftExample> examples, int64_t vocab_size) {
  uint64_t tokens = 0;
  for (const SftExample& e : examples) {
    ST_ASSERT(e.ids.size() == e.counted.size());
    tokens += e.ids.size();
  }
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  ST_CHECK(f != nullptr, "cannot create `", tmp, "`: ", std::strerror(errno));
  bool ok = true;
  auto write = [&](const std::vector<uint8_t>& bytes) {
    ok = ok && std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  };
  std::vector<uint8_t> buffer;
  buffer.insert(buffer.end(), kSftMagic, kSftMagic + sizeof(kSftMagic));
  put<uint32_t>(buffer, kSftVersion);
  put<uint32_t>(buffer, 0);
  put<uint64_t>(buffer, examples.size());
  put<uint64_t>(buffer, tokens);
  put<int64_t>(buffer, vocab_size);
  uint64_t offset = 0;
  put<uint64_t>(buffer, offset);
  for (const SftExample& e : examples) put<uint64_t>(buffer, offset += e.ids.size());
  for (const SftExample& e : examples) put<uint32_t>(buffer, static_cast<uint32_t>(e.lost_turns));
  write(buffer);
  for (const SftExample& e : examples) {
    buffer.clear();
    for (const int32_t id : e.ids) {
      ST_CHECK(id >= 0 && id < vocab_size, "`", path, "`: id ", id, " outside [0, ", vocab_size, ")");
      put<int32_t>(buffer, id);
    }
    write(buffer);
  }
  for (const SftExample& e : examples) {
    buffer.assign(e.counted.begin(), e.counted.end());
    write(buffer);
  }
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const std::string error = ok ? std::string() : std::strerror(errno);
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    ST_THROW("writing `", tmp, "`: ", error.empty() ? std::strerror(errno) : error);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  ST_CHECK(!ec, "renaming `", tmp, "` to `", path, "`: ", ec.message());
}

std::vector<SftExample> read_sft_examples_file(const std::string& path, int64_t model_vocab) {
  const MappedFile file(path);
  const std::span<const uint8_t> bytes = file.bytes();
  auto fail = [&](const auto&... what) { ST_THROW("example file `", path, "`: ", what..., " (corrupt; remove it)"); };
  if (bytes.size() < kSftHeaderBytes || std::memcmp(bytes.data(), kSftMagic, sizeof(kSftMagic)) != 0)
    fail("no STSFT header");
  const auto version = get<uint32_t>(bytes, 8);
  if (version != kSftVersion) fail("version ", version, ", this build reads ", kSftVersion);
  const auto n = get<uint64_t>(bytes, 16), t = get<uint64_t>(bytes, 24);
  const auto vocab = get<int64_t>(bytes, 32);
  if (vocab <= 0 || vocab > model_vocab) fail("vocab_size ", vocab, " outside [1, the model's ", model_vocab, "]");
  // every size below is checked against the file before it is multiplied into an offset
  const uint64_t size = bytes.size();
  if (n > size / 12 || t > size / 5) fail("header counts ", n, " examples and ", t, " tokens, more than ", size, " bytes hold");
  const uint64_t offsets_at = kSftHeaderBytes, lost_at = offsets_at + 8 * (n + 1), ids_at = lost_at + 4 * n;
  const uint64_t counted_at = ids_at + 4 * t;
  if (counted_at + t != size) fail("holds ", size, " bytes; ", n, " examples of ", t, " tokens need ", counted_at + t);
  std::vector<SftExample> examples(n);
  uint64_t previous = get<uint64_t>(bytes, offsets_at);
  if (previous != 0) fail("the first offset is ", previous, ", not 0");
  for (uint64_t i = 0; i < n; ++i) {
    const auto next = get<uint64_t>(bytes, offsets_at + 8 * (i + 1));
    if (next < previous || next > t) fail("example ", i, " ends at ", next, ", outside [", previous, ", ", t, "]");
    SftExample& e = examples[i];
    e.lost_turns = get<uint32_t>(bytes, lost_at + 4 * i);
    e.ids.resize(next - previous);
    if (next > previous) std::memcpy(e.ids.data(), bytes.data() + ids_at + 4 * previous, 4 * (next - previous));
    e.counted.assign(bytes.begin() + static_cast<std::ptrdiff_t>(counted_at + previous),
                     bytes.begin() + static_cast<std::ptrdiff_t>(counted_at + next));
    for (size_t k = 0; k < e.ids.size(); ++k) {
      if (e.ids[k] < 0 || e.ids[k] >= vocab) fail("example ", i, ": id ", e.ids[k], " outside [0, ", vocab, ")");
      if (e.counted[k] > 1) fail("example ", i, ": counted flag ", int{e.counted[k]}, " is not 0 or 1");
    }
    previous = next;
  }
  if (previous != t) fail("the last offset is ", previous, ", not the ", t, " tokens");
  return examples;
}

}  // namespace shardtrain::data
