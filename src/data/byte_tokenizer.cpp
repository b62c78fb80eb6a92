// Byte-level tokenizer: bytes map to themselves; the two special tokens are matched in text.
#include "data/byte_tokenizer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/bpe_tokenizer_internal.h"
#include "data/utf8.h"

namespace shardtrain::data {
namespace {

constexpr std::string_view kBosText = "<|begin_of_text|>";
constexpr std::string_view kEosText = "<|end_of_text|>";

}  // namespace

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '<') {
      if (text.substr(i, kBosText.size()) == kBosText) {
        ids.push_back(kBos);
        i += kBosText.size();
        continue;
      }
      if (text.substr(i, kEosText.size()) == kEosText) {
        ids.push_back(kEos);
        i += kEosText.size();
        continue;
      }
    }
    ids.push_back(static_cast<unsigned char>(text[i]));
    ++i;
  }
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id == kBos) {
      out += kBosText;
    } else if (id == kEos) {
      out += kEosText;
    } else {
      ST_CHECK(id >= 0 && id < 256, "byte tokenizer: id ", id, " at position ", i, " outside [0, 258)");
      out += static_cast<char>(id);
    }
  }
  return out;
}

namespace {

using ordered_json = nlohmann::ordered_json;

ordered_json added_token(int32_t id, std::string_view content) {
  return {{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},   {"normalized", false}, {"special", true}};
}

// One step of the post-processor's template: the BOS token or sequence `seq`.
ordered_json bos_piece() { return {{"SpecialToken", {{"id", kBosText}, {"type_id", 0}}}}; }
ordered_json sequence_piece(const char* seq) { return {{"Sequence", {{"id", seq}, {"type_id", 0}}}}; }

std::string tokenizer_json_text() {
  ordered_json vocab = ordered_json::object();
  for (int b = 0; b < 256; ++b) {  // spelled in the ByteLevel alphabet, in id order
    std::string spelled;
    append_utf8(spelled, bpe_detail::alphabet().byte_to_char[b]);
    vocab[spelled] = b;
  }
  const ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = {added_token(ByteTokenizer::kBos, kBosText), added_token(ByteTokenizer::kEos, kEosText)};
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = byte_level;
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {bos_piece(), sequence_piece("A")}},
      {"pair", {bos_piece(), sequence_piece("A"), bos_piece(), sequence_piece("B")}},
      {"special_tokens",
       {{kBosText, {{"id", kBosText}, {"ids", {ByteTokenizer::kBos}}, {"tokens", {kBosText}}}}}}};
  j["decoder"] = byte_level;
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", ordered_json::array()}};
  return j.dump(2) + "\n";
}

}  // namespace

std::vector<std::pair<std::string, std::string>> byte_tokenizer_files() {
  ordered_json config;
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  config["bos_token"] = kBosText;
  config["eos_token"] = kEosText;
  config["clean_up_tokenization_spaces"] = false;  // decode gives back the text's own spaces
  config["model_input_names"] = {"input_ids", "attention_mask"};
  config["added_tokens_decoder"] = {
      {std::to_string(ByteTokenizer::kBos), added_token(ByteTokenizer::kBos, kBosText)},
      {std::to_string(ByteTokenizer::kEos), added_token(ByteTokenizer::kEos, kEosText)}};
  for (auto& [id, token] : config["added_tokens_decoder"].items()) token.erase("id");
  const ordered_json special_tokens = {{"bos_token", kBosText}, {"eos_token", kEosText}};
  return {{"tokenizer.json", tokenizer_json_text()},
          {"tokenizer_config.json", config.dump(2) + "\n"},
          {"special_tokens_map.json", special_tokens.dump(2) + "\n"}};
}

bool is_byte_tokenizer_json(std::string_view tokenizer_json) {
  static const std::string ours = tokenizer_json_text();
  return tokenizer_json == ours;
}

}  // namespace shardtrain::data
