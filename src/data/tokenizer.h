// The tokenizer interface the data pipeline and generation use. Implementations: the
// byte-level tokenizer of the built-in default job (byte_tokenizer.h) and Hugging Face
// tokenizer.json byte-level BPE (bpe_tokenizer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shardtrain::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of `text`; special tokens written in the text are recognised. No BOS/EOS added.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Text of `ids`; special tokens are written out as their text.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  // -1 when the tokenizer has no such token.
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  // What determines encode()'s output and the chat template's, as a short string ("byte"; a
  // BPE tokenizer: hashes of its tokenizer.json and tokenizer_config.json): equal fingerprints
  // give equal tokens, which is what a token cache is keyed by. Empty: the tokenizer cannot
  // say, and no cache is used.
  virtual std::string fingerprint() const { return {}; }
};

// The tokenizer `spec` names: `byte` (ByteTokenizer), or a tokenizer.json or the folder holding
// one (BpeTokenizer, with tokenizer_config.json beside it; the byte-level tokenizer.json an
// export writes, without a chat template beside it, gives the ByteTokenizer: the same ids).
// A path that is not there, or a folder without tokenizer.json, fails naming `option` (where
// spec came from: "`data.tokenizer`", "--tokenizer") and the values it takes, `accepted`.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec, std::string_view option,
                                          std::string_view accepted);

}  // namespace shardtrain::data
