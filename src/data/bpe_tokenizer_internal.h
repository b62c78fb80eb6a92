// Internals of BpeTokenizer shared by bpe_tokenizer.cpp (encoding, decoding) and
// bpe_tokenizer_load.cpp (tokenizer.json parsing): raw-byte vocab tables, the BPE cache, the
// PCRE2 wrapper and BpeTokenizer::Impl. Not an API; include only from those two files.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/utf8.h"

struct pcre2_real_code_8;  // pcre2_code with PCRE2_CODE_UNIT_WIDTH 8

namespace shardtrain::data::bpe_detail {

// ---- UTF-8 ----

// Decodes the (valid) UTF-8 character at s[i]; sets `length`.
inline char32_t decode_utf8(std::string_view s, size_t i, size_t& length) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) {
    length = 1;
    return c;
  }
  if (c < 0xE0) {
    length = 2;
    return (char32_t(c & 0x1F) << 6) | (b(1) & 0x3F);
  }
  if (c < 0xF0) {
    length = 3;
    return (char32_t(c & 0x0F) << 12) | (char32_t(b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  }
  length = 4;
  return (char32_t(c & 0x07) << 18) | (char32_t(b(1) & 0x3F) << 12) | (char32_t(b(2) & 0x3F) << 6) |
         (b(3) & 0x3F);
}

// Rust's char::is_whitespace (Unicode White_Space), used by HF for lstrip / rstrip.
bool is_unicode_white_space(char32_t c);
// Python's str.isspace, used by Jinja's `trim` filter.
bool is_python_space(char32_t c);

// ---- The byte-level alphabet (GPT-2 bytes_to_unicode): printable Latin-1 bytes stand for
// themselves, the other 68 bytes for U+0100.. in byte order ----

struct ByteLevelAlphabet {
  std::array<char32_t, 256> byte_to_char{};
  std::array<int16_t, 324> char_to_byte{};  // -1: not in the alphabet

  ByteLevelAlphabet();
  // The bytes a byte-level spelled token stands for; false when a character is outside the
  // alphabet (the ByteLevel decoder then keeps the token's own UTF-8, and so do we).
  bool to_bytes(std::string_view token, std::string& bytes) const;
};

const ByteLevelAlphabet& alphabet();

// ---- Hash tables: flat, open addressing, built once at load time ----

inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, s.data() + i, 8);
    h = (h ^ word) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 29;
  h *= 0xFF51AFD7ED558CCDull;
  return h ^ (h >> 32);
}

inline size_t table_capacity(size_t entries) {
  size_t capacity = 16;
  while (capacity < 2 * entries) capacity *= 2;
  return capacity;
}

// Byte strings -> ids. Keys live in one arena.
class StringIdTable {
 public:
  void reserve(size_t entries) { slots_.assign(table_capacity(entries), Slot{}); }
  // False when the key is already present (the table keeps the first id).
  bool insert(std::string_view key, int32_t id) {
    ST_ASSERT(2 * (size_ + 1) <= slots_.size(), "table sized for fewer entries");
    ST_ASSERT(arena_.size() + key.size() < (uint64_t{1} << 32), "vocab arena past 4 GiB");
    const uint64_t hash = hash_bytes(key);
    for (size_t i = hash & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      Slot& slot = slots_[i];
      if (slot.id < 0) {
        slot = {hash, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()), id};
        arena_.append(key);
        ++size_;
        return true;
      }
      if (matches(slot, key, hash)) return false;
    }
  }
  int32_t find(std::string_view key) const { return find(key, hash_bytes(key)); }
  int32_t find(std::string_view key, uint64_t hash) const {
    for (size_t i = hash & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& slot = slots_[i];
      if (slot.id < 0) return -1;
      if (matches(slot, key, hash)) return slot.id;
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0;
    uint32_t length = 0;
    int32_t id = -1;
  };
  bool matches(const Slot& slot, std::string_view key, uint64_t hash) const {
    return slot.hash == hash && slot.length == key.size() &&
           std::memcmp(arena_.data() + slot.offset, key.data(), key.size()) == 0;
  }
  std::string arena_;
  std::vector<Slot> slots_ = std::vector<Slot>(16);
  size_t size_ = 0;
};

// (left id, right id) -> (rank, merged id). A repeated pair keeps the last rank, as HF's
// HashMap built from the merges list does.
class PairTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  void reserve(size_t entries) {
    slots_.assign(table_capacity(entries), Entry{});
    shift_ = 64 - std::countr_zero(slots_.size());
  }
  void insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
    const uint64_t key = pack(left, right);
    for (size_t i = slot_of(key);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == kEmpty) ++size_;
      if (slots_[i].key == kEmpty || slots_[i].key == key) {
        slots_[i] = {key, rank, merged};
        ST_ASSERT(2 * size_ <= slots_.size(), "table sized for fewer entries");
        return;
      }
    }
  }
  const Entry* find(int32_t left, int32_t right) const {
    const uint64_t key = pack(left, right);
    for (size_t i = slot_of(key);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == key) return &slots_[i];
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(int32_t left, int32_t right) {
    return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
  }
  size_t slot_of(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
  std::vector<Entry> slots_ = std::vector<Entry>(16);
  int shift_ = 60;
  size_t size_ = 0;
};

// Results of BPE for pre-tokens not in the vocab, shared by all threads: 64 shards, each a
// map from the 64-bit hash to (piece, ids) under a reader-writer lock. A full shard is
// cleared, which bounds memory (about 64 x 4096 entries).
class PieceCache {
 public:
  static constexpr size_t kMaxPieceBytes = 256;

  bool find(std::string_view piece, uint64_t hash, std::vector<int32_t>& ids) const {
    if (piece.size() > kMaxPieceBytes) return false;
    const Shard& shard = shards_[hash % kShards];
    std::shared_lock lock(shard.mutex);
    const auto it = shard.map.find(hash);
    if (it == shard.map.end() || it->second.piece != piece) return false;
    ids.insert(ids.end(), it->second.ids.begin(), it->second.ids.end());
    return true;
  }
  void insert(std::string_view piece, uint64_t hash, std::span<const int32_t> ids) {
    if (piece.size() > kMaxPieceBytes) return;
    Shard& shard = shards_[hash % kShards];
    std::unique_lock lock(shard.mutex);
    if (shard.map.size() >= kMaxEntriesPerShard) shard.map.clear();
    shard.map[hash] = Entry{std::string(piece), std::vector<int32_t>(ids.begin(), ids.end())};
  }

 private:
  static constexpr size_t kShards = 64;
  static constexpr size_t kMaxEntriesPerShard = 4096;
  struct Entry {
    std::string piece;
    std::vector<int32_t> ids;
  };
  struct Shard {
    mutable std::shared_mutex mutex;
    std::unordered_map<uint64_t, Entry> map;
  };
  std::array<Shard, kShards> shards_;
};

// A compiled pre-tokenizer pattern (PCRE2 with UTF + UCP, JIT when available).
class Regex {
 public:
  // `where` names the JSON key for the compile error message.
  Regex(const std::string& pattern, bool literal, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The first match at or after `start` of valid UTF-8 `subject`; false when none.
  bool find(std::string_view subject, size_t start, size_t& begin, size_t& end) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
};

// Added tokens of one matching pass, found leftmost-longest like HF's Aho-Corasick.
struct AddedTokenMatcher {
  std::array<std::vector<int32_t>, 256> by_first_byte;  // indexes into added tokens, longest first
  bool empty = true;

  void add(const std::vector<AddedToken>& tokens, int32_t index) {
    by_first_byte[static_cast<unsigned char>(tokens[index].content[0])].push_back(index);
    empty = false;
  }
  void finish(const std::vector<AddedToken>& tokens) {
    for (std::vector<int32_t>& list : by_first_byte) {
      std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
        return tokens[a].content.size() > tokens[b].content.size();
      });
    }
  }
  // The first match at or after `from`: its token index and start, or -1.
  int32_t find(const std::vector<AddedToken>& tokens, std::string_view text, size_t from,
               size_t& begin) const {
    for (size_t p = from; p < text.size(); ++p) {
      const std::vector<int32_t>& list = by_first_byte[static_cast<unsigned char>(text[p])];
      for (int32_t index : list) {
        if (text.substr(p).starts_with(tokens[index].content)) {
          begin = p;
          return index;
        }
      }
    }
    return -1;
  }
};

// SentencePiece's word boundary, U+2581 ("▁"), which stands for a space.
inline constexpr std::string_view kMetaspace = "\u2581";

}  // namespace shardtrain::data::bpe_detail

namespace shardtrain::data {

struct BpeTokenizer::Impl {
  std::string path;
  std::string fingerprint;  // "bpe-" + hashes of tokenizer.json's and tokenizer_config.json's bytes
  // SentencePiece-style BPE (Llama 2): a normalizer prepends "▁" and turns spaces into "▁", no
  // pre-tokenizer splits the text, BPE starts from characters (a character outside the vocab
  // falls back to its bytes' <0xXX> tokens), and decoding turns "▁" back into spaces and
  // strips the text's first space. false: byte-level BPE (Llama 3, GPT-2).
  bool sentencepiece = false;
  bool nfc = false;  // byte-level with the NFC normalizer (Qwen2): text between added tokens composed first
  // How a stretch gets its leading "▁": always (the Prepend normalizer, even before another
  // "▁"), or as the Metaspace pre-tokenizer does (only when it does not start with one, and
  // with prepend_scheme "first" only at the start of the text).
  enum class Prefix { kPrependAlways, kMetaspaceAlways, kMetaspaceFirst } prefix = Prefix::kPrependAlways;
  bpe_detail::StringIdTable vocab;  // byte-level: raw bytes -> id; sentencepiece: the spelling -> id
  bpe_detail::PairTable merges;     // (left id, right id) -> (rank, merged id)
  std::array<int32_t, 256> byte_id{};  // byte-level: each byte's token; sentencepiece: its <0xXX> token
  bool ignore_merges = false;
  std::vector<std::unique_ptr<bpe_detail::Regex>> splits;  // applied in order, each Isolated
  std::vector<bpe_detail::AddedToken> added;
  bpe_detail::AddedTokenMatcher added_raw;         // normalized=false: first, on the raw text
  bpe_detail::AddedTokenMatcher added_normalized;  // normalized=true: then on what is left
  std::unordered_map<std::string, int32_t> added_by_content;
  // id -> decoded bytes token_bytes[token_offset[id] ..][:token_length[id]]; length -1: no token
  std::string token_bytes;
  std::vector<uint64_t> token_offset;
  std::vector<int32_t> token_length;
  std::vector<bool> special;
  int32_t bos = -1;
  int32_t eos = -1;
  // The chat template of tokenizer_config.json (null: none, or one this build cannot render).
  std::unique_ptr<ChatTemplate> chat;
  std::string chat_problem;  // why there is none; empty when there is one
  std::string bos_text;
  mutable bpe_detail::PieceCache cache;

  // Loading (bpe_tokenizer_load.cpp).
  void load_model(const nlohmann::json& root);
  void load_pre_tokenizer(const nlohmann::json& root);
  void load_added_tokens(const nlohmann::json& root);
  void load_config(const std::string& config_path);
  void load_sentencepiece_parts(const nlohmann::json& root);
  // The vocab id of a token as tokenizer.json spells it (-1: none).
  int32_t find_spelled(std::string_view spelled) const;
  int32_t resolve_token(const std::string& file, const std::string& key,
                        const nlohmann::json& value) const;
  void set_token(int32_t id, std::string_view bytes);
  // Pass 0 splits on non-normalized added tokens, pass 1 on normalized ones, then the regex.
  void encode_added(int pass, std::string_view text, std::vector<int32_t>& ids) const;
  void encode_gap(int pass, std::string_view gap, bool at_start, std::vector<int32_t>& ids) const;
  void encode_split(size_t level, std::string_view text, std::vector<int32_t>& ids) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;
  void merge(std::string_view piece, std::vector<int32_t>& ids) const;
  // sentencepiece: one stretch of text between added tokens with its spaces as "▁" and its
  // prefix; `at_start`: the stretch starts the text.
  std::string normalize(std::string_view text, bool at_start) const;
};

}  // namespace shardtrain::data
