// Hugging Face tokenizer.json BPE, exact to HF `tokenizers`, in its two Llama forms: byte-level
// (Llama 3, GPT-2 style: added tokens split the text first, a PCRE2 regex splits the rest into
// pre-tokens, each merged by BPE rank over raw bytes) and SentencePiece-style (Llama 2: each
// stretch between added tokens gets a leading "▁" and its spaces become "▁", and the whole
// stretch is merged from characters, with byte fallback). Encoding is thread-safe (const,
// shared cache).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/chat_template.h"
#include "data/tokenizer.h"

namespace shardtrain::data {

// One turn of a conversation, e.g. {"user", "Hello"}.
// What the loader accepts (anything else is rejected with an error naming the file, the JSON
// key and the value found):
//   truncation, padding: null.
//   Byte-level: normalizer null or NFC (Qwen2; Unicode NFC by utf8proc); pre_tokenizer
//     ByteLevel(add_prefix_space=false, use_regex=false), alone or last in a Sequence after Split
//     steps (pattern Regex or String, behavior "Isolated", invert=false); every one of the 256
//     byte tokens in the vocab (so unk_token and byte_fallback never apply); decoder ByteLevel.
//   SentencePiece-style (Llama 2): normalizer Sequence[Prepend("▁"), Replace(" " -> "▁")] and
//     pre_tokenizer null, or (transformers' newer conversions) normalizer null and pre_tokenizer
//     Metaspace(replacement "▁", prepend_scheme "first" or "always", split false) with no
//     normalized added tokens; byte_fallback true with all 256 <0xXX> tokens in the vocab;
//     decoder Sequence[Replace("▁" -> " "), ByteFallback, Fuse, Strip(" ", 1, 0)].
//   model: BPE with vocab, merges ("a b" strings or ["a", "b"] pairs), ignore_merges, no
//     dropout, no continuing_subword_prefix / end_of_word_suffix.
//   post_processor: ignored (encode() never adds BOS/EOS).
//   added_tokens: content, id, special, normalized, lstrip, rstrip; single_word must be false.
// Differences from HF: decode() returns the raw bytes (HF replaces invalid UTF-8 with U+FFFD,
// which only matters for id sequences that cut a character); encode() rejects invalid UTF-8
// (HF's API only takes valid strings).
class BpeTokenizer final : public Tokenizer {
 public:
  // Loads `path` (tokenizer.json, or a folder holding it), and tokenizer_config.json from the
  // same folder when present.
  explicit BpeTokenizer(const std::string& path);
  // Loads both files; an empty `tokenizer_config_path` means none.
  BpeTokenizer(const std::string& tokenizer_json_path, const std::string& tokenizer_config_path);
  ~BpeTokenizer() override;
  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;

  // Throws on invalid UTF-8, naming the byte offset.
  std::vector<int32_t> encode(std::string_view text) const override;
  // Appends the ids of `text` to `ids` (saves an allocation per call in loops).
  void encode_append(std::string_view text, std::vector<int32_t>& ids) const;
  // Throws naming the id and its position when an id has no token. SentencePiece-style: the
  // text's first space is dropped (so decode(encode(text)) is text).
  std::string decode(std::span<const int32_t> ids) const override;
  // Largest id + 1 (128,256 for Llama 3: model vocab plus added tokens).
  int64_t vocab_size() const override;
  // From tokenizer_config.json's bos_token / eos_token (a string or {"content": ...}; null
  // means none); without that file or key, <|begin_of_text|> / <|end_of_text|> when they
  // are added tokens (<s> / </s> for SentencePiece-style ones); otherwise -1.
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  // "bpe-" and 64-bit hashes of tokenizer.json's bytes and tokenizer_config.json's (its chat
  // template, BOS and EOS), when there is one.
  std::string fingerprint() const override;

  // The id of a token given as written in tokenizer.json (added-token content, or a vocab
  // entry in its spelling such as "Ġthe" or "▁the"); -1 when there is none.
  int32_t token_to_id(std::string_view token) const;
  // The bytes id `id` stands for inside a sequence (SentencePiece: "▁the" is " the"; decode()
  // of a sequence also drops its first space, as HF's Strip decoder does); throws when the id
  // has no token.
  std::string id_to_bytes(int32_t id) const;
  bool is_special(int32_t id) const;

  // Whether tokenizer_config.json has a chat template this build can render (a string, or the
  // one named "default" of a list; data/chat_template.h); chat_template_problem() says why not.
  bool has_chat_template() const;
  const std::string& chat_template_problem() const;
  // The template's text for `messages`, as transformers' apply_chat_template(tokenize=False)
  // renders it (bos_token and eos_token the configured tokens' text). Throws when there is no
  // template, or it fails or raises an exception for these messages.
  std::string apply_chat_template(std::span<const ChatMessage> messages,
                                  bool add_generation_prompt) const;
  // The same text, with where each message's turn lies in it (ChatTemplate::Text); `tools`: the
  // tool schemas the template may list, or none.
  ChatTemplate::Text render_chat(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                 const jinja::Value& tools = jinja::Value::none()) const;

 private:
  struct Impl;  // bpe_tokenizer_internal.h
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardtrain::data
