// The tokenizer of the built-in default job: one token per byte (0..255) plus
// <|begin_of_text|> (256) and <|end_of_text|> (257). Needs no files; an export writes it as
// Hugging Face tokenizer files (byte_tokenizer_files) that give the same ids.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace shardtrain::data {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return 258; }
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  std::string fingerprint() const override { return "byte"; }
};

// The byte-level tokenizer as a Hugging Face folder's files, {name, contents}:
//   tokenizer.json: BPE without merges over the 256 byte tokens of the ByteLevel alphabet, id =
//     the byte; <|begin_of_text|> (256) and <|end_of_text|> (257) as special added tokens; a
//     ByteLevel pre-tokenizer without regex and a ByteLevel decoder; a post-processor that puts
//     BOS first (add_special_tokens in HF; encode() here never adds it).
//   tokenizer_config.json: PreTrainedTokenizerFast, BOS and EOS, no space clean-up on decode.
//   special_tokens_map.json: BOS and EOS.
// HF `tokenizers` and transformers read them as ids equal to ByteTokenizer's on any valid UTF-8.
std::vector<std::pair<std::string, std::string>> byte_tokenizer_files();

// Whether `tokenizer_json` (a file's contents) is the tokenizer.json byte_tokenizer_files() writes.
bool is_byte_tokenizer_json(std::string_view tokenizer_json);

}  // namespace shardtrain::data
