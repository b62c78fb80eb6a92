// Encoding and decoding of BpeTokenizer. Byte-level vocab entries are raw bytes (the byte-level
// alphabet is undone at load time), so encoding works on the input bytes directly; SentencePiece
// ones are their spellings, matched against the normalized text. Mirrors HF `tokenizers`:
// AddedVocabulary (split on added tokens, normalize what lies between), Split pre-tokenizer
// (Isolated), BPE::merge_all (with byte fallback), ByteLevel or Replace/ByteFallback/Fuse/Strip
// decoders.
#include "data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

#include "data/bpe_tokenizer_internal.h"

namespace shardtrain::data {
namespace bpe_detail {

// ---- UTF-8 ----


// Rust's char::is_whitespace (Unicode White_Space), used by HF for lstrip / rstrip.
bool is_unicode_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Python's str.isspace, used by Jinja's `trim` filter.
bool is_python_space(char32_t c) { return is_unicode_white_space(c) || (c >= 0x1C && c <= 0x1F); }

ByteLevelAlphabet::ByteLevelAlphabet() {
  char_to_byte.fill(-1);
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    byte_to_char[b] = printable ? char32_t(b) : next++;
    char_to_byte[byte_to_char[b]] = static_cast<int16_t>(b);
  }
}

bool ByteLevelAlphabet::to_bytes(std::string_view token, std::string& bytes) const {
  bytes.clear();
  size_t i = 0;
  while (i < token.size()) {
    size_t len;
    const char32_t c = decode_utf8(token, i, len);
    if (c >= char_to_byte.size() || char_to_byte[c] < 0) return false;
    bytes += static_cast<char>(char_to_byte[c]);
    i += len;
  }
  return true;
}

const ByteLevelAlphabet& alphabet() {
  static const ByteLevelAlphabet table;
  return table;
}

// ---- PCRE2 ----

namespace {

// Per-thread match data: one ovector pair is all we read (rc 0 means "more captures than
// pairs", still a match), so a single block serves every pattern.
struct ThreadMatchData {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  ~ThreadMatchData() { pcre2_match_data_free(data); }
};

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> message{};
  pcre2_get_error_message(code, message.data(), message.size());
  return reinterpret_cast<const char*>(message.data());
}

}  // namespace

Regex::Regex(const std::string& pattern, bool literal, const std::string& where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  const uint32_t flags = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0u);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), flags, &error,
                        &offset, nullptr);
  ST_CHECK(code_ != nullptr, where, ": PCRE2 cannot compile the pattern at offset ", offset, ": ",
           pcre2_message(error));
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(code_); }

bool Regex::find(std::string_view subject, size_t start, size_t& begin, size_t& end) const {
  thread_local ThreadMatchData match;
  ST_CHECK(match.data != nullptr, "PCRE2: out of memory for match data");
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  // The caller validated the UTF-8 once for the whole text (pcre2_jit_match never checks).
  const int rc =
      jit_ ? pcre2_jit_match(code_, s, subject.size(), start, 0, match.data, nullptr)
           : pcre2_match(code_, s, subject.size(), start, PCRE2_NO_UTF_CHECK, match.data, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  ST_CHECK(rc >= 0, "pre-tokenizer regex failed: ", pcre2_message(rc));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.data);
  begin = ovector[0];
  end = ovector[1];
  return true;
}

}  // namespace bpe_detail

using namespace bpe_detail;

void BpeTokenizer::Impl::set_token(int32_t id, std::string_view bytes) {
  if (static_cast<size_t>(id) >= token_length.size()) {
    token_offset.resize(id + 1, 0);
    token_length.resize(id + 1, -1);
    special.resize(id + 1, false);
  }
  token_offset[id] = token_bytes.size();
  token_length[id] = static_cast<int32_t>(bytes.size());
  token_bytes.append(bytes);
}

// ---- encoding ----

std::string BpeTokenizer::Impl::normalize(std::string_view text, bool at_start) const {
  std::string out;
  out.reserve(text.size() + 3 * (text.size() / 4 + 1));
  const bool prefix_wanted = prefix == Prefix::kPrependAlways ||
                             ((prefix == Prefix::kMetaspaceAlways || at_start) && !text.starts_with(' ') &&
                              !text.starts_with(kMetaspace));
  if (prefix_wanted) out += kMetaspace;  // on a non-empty stretch
  for (char c : text) {
    if (c == ' ')
      out += kMetaspace;
    else
      out += c;
  }
  return out;
}

// Unicode NFC (utf8proc; HF's NFC normalizer), on valid UTF-8 of any length, NULs included.
static std::string compose_nfc(std::string_view text) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &out, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  ST_CHECK(n >= 0, "NFC normalization failed: ", utf8proc_errmsg(n));
  std::string composed(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return composed;
}

// The stretches between pass 0's (raw) added tokens are normalized before pass 1, as HF's
// AddedVocabulary does (SentencePiece: each stretch gets its own leading "▁").
void BpeTokenizer::Impl::encode_gap(int pass, std::string_view gap, bool at_start,
                                    std::vector<int32_t>& ids) const {
  if (gap.empty()) return;
  if (pass == 0 && sentencepiece) {
    const std::string normalized = normalize(gap, at_start);
    return encode_added(1, normalized, ids);
  }
  if (pass == 0 && nfc) {
    const std::string composed = compose_nfc(gap);
    return encode_added(1, composed, ids);
  }
  encode_added(pass + 1, gap, ids);
}

void BpeTokenizer::Impl::encode_added(int pass, std::string_view text,
                                      std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  const AddedTokenMatcher* matcher = pass == 0   ? &added_raw
                                     : pass == 1 ? &added_normalized
                                                 : nullptr;
  if (matcher == nullptr) {
    encode_split(0, text, ids);
    return;
  }
  if (matcher->empty) {
    encode_gap(pass, text, true, ids);
    return;
  }
  size_t done = 0;
  size_t search = 0;
  size_t begin = 0;
  for (int32_t index; (index = matcher->find(added, text, search, begin)) >= 0;) {
    const AddedToken& token = added[index];
    size_t end = begin + token.content.size();
    if (token.lstrip) {  // absorb whitespace before the token, down to the previous match
      while (begin > done) {
        size_t start = begin - 1;
        while (start > done && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t len;
        if (!is_unicode_white_space(decode_utf8(text, start, len))) break;
        begin = start;
      }
    }
    if (token.rstrip) {
      size_t len;
      while (end < text.size() && is_unicode_white_space(decode_utf8(text, end, len))) end += len;
    }
    encode_gap(pass, text.substr(done, begin - done), done == 0, ids);
    ids.push_back(token.id);
    done = end;
    search = end;
  }
  encode_gap(pass, text.substr(done), done == 0, ids);
}

void BpeTokenizer::Impl::encode_split(size_t level, std::string_view text,
                                      std::vector<int32_t>& ids) const {
  if (level == splits.size()) {
    encode_piece(text, ids);
    return;
  }
  // Isolated: every match and every gap between matches is a piece; an empty match splits
  // the text at its position (as with HF's onig find_iter, the search then moves one char on).
  const Regex& regex = *splits[level];
  size_t done = 0;
  size_t search = 0;
  size_t begin, end;
  while (search <= text.size() && regex.find(text, search, begin, end)) {
    if (begin > done) encode_split(level + 1, text.substr(done, begin - done), ids);
    if (end > begin) {
      encode_split(level + 1, text.substr(begin, end - begin), ids);
      search = end;
    } else {
      if (end == text.size()) break;
      size_t len;
      decode_utf8(text, end, len);
      search = end + len;
    }
    done = end;
  }
  if (done < text.size()) encode_split(level + 1, text.substr(done), ids);
}

void BpeTokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  if (piece.empty()) return;
  if (piece.size() == 1 && !sentencepiece) {
    ids.push_back(byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const uint64_t hash = hash_bytes(piece);
  if (ignore_merges) {  // HF BPE: a pre-token that is itself in the vocab is emitted whole
    const int32_t id = vocab.find(piece, hash);
    if (id >= 0) {
      ids.push_back(id);
      return;
    }
  }
  if (cache.find(piece, hash, ids)) return;
  const size_t first = ids.size();
  merge(piece, ids);
  cache.insert(piece, hash, std::span<const int32_t>(ids).subspan(first));
}

// HF's Word::merge_all without dropout: a min-heap of (rank, position) candidates; a popped
// candidate is applied if its left symbol is alive and the pair there still merges into the
// same token; each merge queues the new pairs with its neighbours.
void BpeTokenizer::Impl::merge(std::string_view piece, std::vector<int32_t>& ids) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  constexpr size_t kKeepScratchSymbols = size_t{1} << 16;
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  heap.clear();
  symbols.clear();
  if (sentencepiece) {
    // characters; one outside the vocab falls back to its bytes' tokens (HF byte_fallback)
    for (size_t i = 0; i < piece.size();) {
      size_t len;
      decode_utf8(piece, i, len);
      const int32_t id = vocab.find(piece.substr(i, len));
      if (id >= 0) {
        symbols.push_back({id, 0, 0, true});
      } else {
        for (size_t k = i; k < i + len; ++k)
          symbols.push_back({byte_id[static_cast<unsigned char>(piece[k])], 0, 0, true});
      }
      i += len;
    }
  } else {
    for (char c : piece) symbols.push_back({byte_id[static_cast<unsigned char>(c)], 0, 0, true});
  }
  const auto n = static_cast<int32_t>(symbols.size());
  for (int32_t i = 0; i < n; ++i) {
    symbols[i].prev = i - 1;
    symbols[i].next = i + 1 < n ? i + 1 : -1;
  }
  const auto push = [&](int32_t pos) {
    const PairTable::Entry* e = merges.find(symbols[pos].id, symbols[symbols[pos].next].id);
    if (e == nullptr) return;
    heap.push_back({e->rank, pos, e->merged});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const PairTable::Entry* e = merges.find(left.id, right.id);
    if (e == nullptr || e->merged != top.merged) continue;
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    if (left.next >= 0) push(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
  if (symbols.capacity() > kKeepScratchSymbols) {  // do not hold a huge piece's scratch
    symbols = {};
    heap = {};
  }
}

// ---- BpeTokenizer ----

BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4 + 4);
  encode_append(text, ids);
  return ids;
}

void BpeTokenizer::encode_append(std::string_view text, std::vector<int32_t>& ids) const {
  const size_t bad = find_invalid_utf8(text);
  ST_CHECK(bad == std::string_view::npos, "tokenizer `", impl_->path,
           "`: text is not valid UTF-8 at byte offset ", bad, " (byte 0x", std::hex,
           static_cast<unsigned>(static_cast<unsigned char>(text[bad])), ")");
  impl_->encode_added(0, text, ids);
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  const Impl& t = *impl_;
  std::string out;
  out.reserve(ids.size() * 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    ST_CHECK(id >= 0 && static_cast<size_t>(id) < t.token_length.size() && t.token_length[id] >= 0,
             "tokenizer `", t.path, "`: id ", id, " at position ", i,
             " is not a token (vocab size ", t.token_length.size(), ")");
    out.append(t.token_bytes, t.token_offset[id], t.token_length[id]);
  }
  if (t.sentencepiece && !out.empty() && out[0] == ' ') out.erase(0, 1);  // the Strip decoder
  return out;
}

int64_t BpeTokenizer::vocab_size() const {
  return static_cast<int64_t>(impl_->token_length.size());
}
int32_t BpeTokenizer::bos_id() const { return impl_->bos; }
int32_t BpeTokenizer::eos_id() const { return impl_->eos; }

std::string BpeTokenizer::fingerprint() const { return impl_->fingerprint; }

int32_t BpeTokenizer::Impl::find_spelled(std::string_view spelled) const {
  if (sentencepiece) return vocab.find(spelled);
  std::string bytes;
  return alphabet().to_bytes(spelled, bytes) ? vocab.find(bytes) : -1;
}

int32_t BpeTokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->added_by_content.find(std::string(token));
  if (it != impl_->added_by_content.end()) return it->second;
  return impl_->find_spelled(token);
}

std::string BpeTokenizer::id_to_bytes(int32_t id) const {
  const Impl& t = *impl_;
  ST_CHECK(id >= 0 && static_cast<size_t>(id) < t.token_length.size() && t.token_length[id] >= 0, "tokenizer `",
           t.path, "`: id ", id, " is not a token (vocab size ", t.token_length.size(), ")");
  return t.token_bytes.substr(t.token_offset[id], static_cast<size_t>(t.token_length[id]));
}

bool BpeTokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[id];
}

bool BpeTokenizer::has_chat_template() const { return impl_->chat != nullptr; }
const std::string& BpeTokenizer::chat_template_problem() const { return impl_->chat_problem; }

std::string BpeTokenizer::apply_chat_template(std::span<const ChatMessage> messages,
                                              bool add_generation_prompt) const {
  return render_chat(messages, add_generation_prompt).text;
}

ChatTemplate::Text BpeTokenizer::render_chat(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                             const jinja::Value& tools) const {
  const Impl& t = *impl_;
  ST_CHECK(t.chat != nullptr, "tokenizer `", t.path, "`: cannot apply a chat template: ", t.chat_problem);
  for (size_t i = 0; i < messages.size(); ++i)
    ST_CHECK(find_invalid_utf8(messages[i].role) == std::string::npos &&
                 find_invalid_utf8(messages[i].content) == std::string::npos,
             "chat message ", i, ": role and content must be valid UTF-8");
  return t.chat->render(messages, add_generation_prompt, tools);
}

}  // namespace shardtrain::data
