// The tokenizer of the built-in default job: one token per byte (0..255) plus
// <|begin_of_text|> (256) and <|end_of_text|> (257). Needs no files.
#pragma once

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

}  // namespace shardtrain::data
