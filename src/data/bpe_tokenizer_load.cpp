// Loading BpeTokenizer from tokenizer.json (and tokenizer_config.json): every key we rely on
// is checked, and anything we do not implement is rejected with the file, the key path and the
// value found, rather than silently tokenizing differently from HF.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/random.h"
#include "data/bpe_tokenizer_internal.h"

namespace shardtrain::data {

using namespace bpe_detail;

namespace {

using nlohmann::json;

// ---- JSON access with errors naming the file, the key path and the value found ----

std::string key_path(const std::string& parent, std::string_view name) {
  return parent.empty() ? std::string(name) : parent + "." + std::string(name);
}

std::string describe(const json& value) {
  std::string s = value.dump();
  if (s.size() > 120) {
    size_t cut = 117;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // whole chars
    s = s.substr(0, cut) + "...";
  }
  return s;
}

[[noreturn]] void reject(const std::string& file, const std::string& key, std::string_view expected,
                         const json& found) {
  ST_THROW("`", file, "`: key `", key, "`: expected ", expected, ", found ", describe(found));
}

const json* find_member(const json& object, std::string_view name) {
  auto it = object.find(std::string(name));
  return it == object.end() ? nullptr : &*it;
}

const json& require_member(const std::string& file, const json& object, const std::string& parent,
                           std::string_view name) {
  const json* v = find_member(object, name);
  if (v == nullptr) ST_THROW("`", file, "`: key `", key_path(parent, name), "` is missing");
  return *v;
}

const json& require_object(const std::string& file, const json& object, const std::string& parent,
                           std::string_view name) {
  const json& v = require_member(file, object, parent, name);
  if (!v.is_object()) reject(file, key_path(parent, name), "an object", v);
  return v;
}

std::string require_string(const std::string& file, const json& object, const std::string& parent,
                           std::string_view name) {
  const json& v = require_member(file, object, parent, name);
  if (!v.is_string()) reject(file, key_path(parent, name), "a string", v);
  return v.get<std::string>();
}

bool optional_bool(const std::string& file, const json& object, const std::string& parent,
                   std::string_view name, bool default_value) {
  const json* v = find_member(object, name);
  if (v == nullptr || v->is_null()) return default_value;
  if (!v->is_boolean()) reject(file, key_path(parent, name), "true or false", *v);
  return v->get<bool>();
}

// Keys whose only supported value is null (or absence): `what` says why.
void require_null(const std::string& file, const json& object, const std::string& parent,
                  std::string_view name, std::string_view what) {
  const json* v = find_member(object, name);
  if (v != nullptr && !v->is_null()) reject(file, key_path(parent, name), what, *v);
}

// A bool key whose only supported value is `expected`.
void require_bool_value(const std::string& file, const json& object, const std::string& parent,
                        std::string_view name, bool expected, bool default_value) {
  if (optional_bool(file, object, parent, name, default_value) != expected) {
    reject(file, key_path(parent, name),
           expected ? "true (the only value supported)" : "false (the only value supported)",
           *find_member(object, name));
  }
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ST_CHECK(in.good(), "cannot open `", path, "`");
  std::ostringstream text;
  text << in.rdbuf();
  ST_CHECK(!in.bad(), "error reading `", path, "`");
  return std::move(text).str();
}

json parse_json_text(const std::string& text, const std::string& path) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    ST_THROW("`", path, "`: malformed JSON: ", e.what());
  }
}

// Decoded bytes of a token spelled in tokenizer.json: per HF's ByteLevel decoder, or
// (SentencePiece) its Replace("▁" -> " ") and ByteFallback ("<0x0A>" is byte 10) decoders.
std::string token_text_bytes(std::string_view spelled, bool sentencepiece) {
  std::string bytes;
  if (!sentencepiece) {
    if (!alphabet().to_bytes(spelled, bytes)) bytes.assign(spelled);
    return bytes;
  }
  if (spelled.size() == 6 && spelled.starts_with("<0x") && spelled.ends_with(">")) {
    const auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
    const int hi = hex(spelled[3]), lo = hex(spelled[4]);
    if (hi >= 0 && lo >= 0) return std::string(1, static_cast<char>(hi * 16 + lo));
  }
  for (size_t i = 0; i < spelled.size();) {
    if (spelled.substr(i).starts_with(kMetaspace)) {
      bytes += ' ';
      i += kMetaspace.size();
    } else {
      bytes += spelled[i++];
    }
  }
  return bytes;
}

// The byte-fallback token of byte b: "<0x0A>".
std::string byte_token(int b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
}

}  // namespace

void BpeTokenizer::Impl::load_model(const json& root) {
  const json& model = require_object(path, root, "", "model");
  const std::string type = require_string(path, model, "model", "type");
  if (type != "BPE") reject(path, "model.type", "\"BPE\" (the only model implemented)", type);
  require_null(path, model, "model", "dropout", "null (BPE dropout is not implemented)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = find_member(model, key);
    if (v != nullptr && !v->is_null() && !(v->is_string() && v->get<std::string>().empty())) {
      reject(path, key_path("model", key), "null (not implemented)", *v);
    }
  }
  ignore_merges = optional_bool(path, model, "model", "ignore_merges", false);
  (void)optional_bool(path, model, "model", "fuse_unk", false);
  const bool byte_fallback = optional_bool(path, model, "model", "byte_fallback", false);
  if (sentencepiece && !byte_fallback)
    reject(path, "model.byte_fallback", "true with the SentencePiece normalizer (characters outside the vocab)",
           model.contains("byte_fallback") ? model["byte_fallback"] : json());

  const json& vocab_json = require_object(path, model, "model", "vocab");
  vocab.reserve(vocab_json.size());
  std::string bytes;
  for (const auto& [spelled, id_json] : vocab_json.items()) {
    const auto key = [&] { return "model.vocab[" + json(spelled).dump() + "]"; };
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() >= (int64_t{1} << 31) - 1) {
      reject(path, key(), "an id in [0, 2^31 - 1)", id_json);
    }
    const auto id = static_cast<int32_t>(id_json.get<int64_t>());
    if (static_cast<size_t>(id) < token_length.size() && token_length[id] >= 0) {
      reject(path, key(), "an id used by no other vocab entry", id_json);
    }
    if (sentencepiece) {  // matched by spelling against the normalized text
      set_token(id, token_text_bytes(spelled, true));
      vocab.insert(spelled, id);
      continue;
    }
    // Entries with characters outside the byte-level alphabet can never come out of the
    // encoder; they still decode (to their own UTF-8, as HF's ByteLevel decoder does).
    const bool byte_level = alphabet().to_bytes(spelled, bytes);
    set_token(id, byte_level ? std::string_view(bytes) : std::string_view(spelled));
    if (byte_level) vocab.insert(bytes, id);
  }
  for (int b = 0; b < 256 && sentencepiece; ++b) {
    byte_id[b] = vocab.find(byte_token(b));
    if (byte_id[b] < 0)
      ST_THROW("`", path, "`: key `model.vocab`: no byte-fallback token ", byte_token(b),
               "; SentencePiece-style vocabularies need all 256");
  }
  for (int b = 0; b < 256 && !sentencepiece; ++b) {
    const char c = static_cast<char>(b);
    byte_id[b] = vocab.find(std::string_view(&c, 1));
    if (byte_id[b] < 0) {
      std::string spelled;
      append_utf8(spelled, alphabet().byte_to_char[b]);
      ST_THROW("`", path, "`: key `model.vocab`: no entry for byte ", b, " (spelled \"", spelled,
               "\"); only byte-level BPE vocabularies, with all 256 byte tokens, are supported");
    }
  }

  const json& merges_json = require_member(path, model, "model", "merges");
  if (!merges_json.is_array()) reject(path, "model.merges", "an array", merges_json);
  merges.reserve(merges_json.size());
  std::string left, right;
  for (size_t rank = 0; rank < merges_json.size(); ++rank) {
    const json& m = merges_json[rank];
    const auto key = [&] { return "model.merges[" + std::to_string(rank) + "]"; };
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        reject(path, key(), "\"left right\" (two tokens and one space)", m);
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      reject(path, key(), "\"left right\" or [\"left\", \"right\"]", m);
    }
    const bool ok = sentencepiece ? (left = a, right = b, true)
                                  : alphabet().to_bytes(a, left) && alphabet().to_bytes(b, right);
    const int32_t left_id = ok ? vocab.find(left) : -1;
    const int32_t right_id = ok ? vocab.find(right) : -1;
    const int32_t merged_id = ok ? vocab.find(left + right) : -1;
    if (left_id < 0 || right_id < 0 || merged_id < 0) {
      reject(path, key(),
             "a merge of two vocab tokens whose concatenation is in the vocab", m);
    }
    merges.insert(left_id, right_id, static_cast<int32_t>(rank), merged_id);
  }
}

// The SentencePiece-style pipeline (Llama 2's tokenizer.json), exactly as written there, or
// with the Metaspace pre-tokenizer instead of the normalizer (transformers' newer conversions):
// any other normalizer or pre-tokenizer, or another decoder, is rejected.
void BpeTokenizer::Impl::load_sentencepiece_parts(const json& root) {
  const json kNormalizer = json::parse(R"({"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "\u2581"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]})");
  const json kDecoder = json::parse(R"({"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})");
  const json* normalizer = find_member(root, "normalizer");
  if (normalizer != nullptr && !normalizer->is_null()) {
    if (*normalizer != kNormalizer)
      reject(path, "normalizer", "null or {\"type\": \"NFC\"} (byte-level BPE) or Llama 2's " + kNormalizer.dump(),
             *normalizer);
    require_null(path, root, "", "pre_tokenizer", "null with the SentencePiece normalizer (Llama 2)");
    prefix = Prefix::kPrependAlways;
  } else {
    const json& pre = root["pre_tokenizer"];
    const std::string scheme = pre.value("prepend_scheme", "always");
    if (pre.value("replacement", "") != "\u2581" || pre.value("split", true) || !pre.value("add_prefix_space", true) ||
        (scheme != "first" && scheme != "always"))
      reject(path, "pre_tokenizer",
             "Metaspace with replacement \"\u2581\", split false and prepend_scheme \"first\" or \"always\"", pre);
    prefix = scheme == "first" ? Prefix::kMetaspaceFirst : Prefix::kMetaspaceAlways;
  }
  const json& decoder = require_member(path, root, "", "decoder");
  if (decoder != kDecoder) reject(path, "decoder", "Llama 2's " + kDecoder.dump(), decoder);
}

void BpeTokenizer::Impl::load_pre_tokenizer(const json& root) {
  const json& pre = require_object(path, root, "", "pre_tokenizer");
  std::vector<std::pair<const json*, std::string>> steps;  // (step, its key)
  const std::string type = require_string(path, pre, "pre_tokenizer", "type");
  if (type == "Sequence") {
    const json& list = require_member(path, pre, "pre_tokenizer", "pretokenizers");
    if (!list.is_array()) reject(path, "pre_tokenizer.pretokenizers", "an array", list);
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string key = "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]";
      if (!list[i].is_object()) reject(path, key, "an object", list[i]);
      steps.emplace_back(&list[i], key);
    }
  } else {
    steps.emplace_back(&pre, "pre_tokenizer");
  }
  bool byte_level_seen = false;
  for (const auto& [step, key] : steps) {
    const std::string step_type = require_string(path, *step, key, "type");
    if (byte_level_seen) {
      reject(path, key_path(key, "type"), "nothing after the ByteLevel step", step_type);
    }
    if (step_type == "ByteLevel") {
      byte_level_seen = true;
      require_bool_value(path, *step, key, "add_prefix_space", false, true);
      require_bool_value(path, *step, key, "use_regex", false, true);
    } else if (step_type == "Split") {
      const std::string behavior = require_string(path, *step, key, "behavior");
      if (behavior != "Isolated") {
        reject(path, key_path(key, "behavior"), "\"Isolated\" (the only behavior implemented)",
               behavior);
      }
      require_bool_value(path, *step, key, "invert", false, false);
      const std::string pattern_key = key_path(key, "pattern");
      const json& pattern = require_object(path, *step, key, "pattern");
      const json* regex = find_member(pattern, "Regex");
      const json* literal = find_member(pattern, "String");
      const json* chosen = regex != nullptr ? regex : literal;
      if (pattern.size() != 1 || chosen == nullptr || !chosen->is_string()) {
        reject(path, pattern_key, "{\"Regex\": \"...\"} or {\"String\": \"...\"}", pattern);
      }
      splits.push_back(std::make_unique<Regex>(chosen->get<std::string>(), chosen == literal,
                                               "`" + path + "`: key `" + pattern_key + "`"));
    } else {
      reject(path, key_path(key, "type"), "\"Split\" or \"ByteLevel\"", step_type);
    }
  }
  if (!byte_level_seen) {
    ST_THROW("`", path,
             "`: key `pre_tokenizer`: expected a ByteLevel step (byte-level BPE), found ",
             describe(pre));
  }
}

void BpeTokenizer::Impl::load_added_tokens(const json& root) {
  const json* list = find_member(root, "added_tokens");
  if (list == nullptr || list->is_null()) return;
  if (!list->is_array()) reject(path, "added_tokens", "an array", *list);
  std::vector<bool> normalized;
  // The token tables are sized by the largest id: an id near 2^31 would take gigabytes, so ids
  // stop at 2^24, well past any published vocabulary (about 2^18).
  constexpr int64_t kIdLimit = int64_t{1} << 24;
  const auto model_tokens = static_cast<int64_t>(token_length.size());
  for (size_t i = 0; i < list->size(); ++i) {
    const json& t = (*list)[i];
    const std::string key = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object()) reject(path, key, "an object", t);
    AddedToken token;
    const json& id = require_member(path, t, key, "id");
    if (!id.is_number_integer()) reject(path, key_path(key, "id"), "an integer id", id);
    token.content = require_string(path, t, key, "content");
    ST_CHECK(id.is_number_unsigned() && id.get<uint64_t>() < static_cast<uint64_t>(kIdLimit), "`", path,
             "`: key `", key_path(key, "id"), "`: added token `", token.content, "` has id ", id.dump(),
             ", outside the valid range [0, ", kIdLimit, ") (the model's vocabulary has ids [0, ", model_tokens,
             "))");
    token.id = static_cast<int32_t>(id.get<int64_t>());
    if (token.content.empty()) reject(path, key_path(key, "content"), "a non-empty string", t);
    token.special = optional_bool(path, t, key, "special", false);
    token.lstrip = optional_bool(path, t, key, "lstrip", false);
    token.rstrip = optional_bool(path, t, key, "rstrip", false);
    require_bool_value(path, t, key, "single_word", false, false);
    if (!added_by_content.emplace(token.content, token.id).second) {
      reject(path, key_path(key, "content"), "content used by no other added token", t);
    }
    set_token(token.id, token_text_bytes(token.content, sentencepiece));
    special[token.id] = token.special;
    normalized.push_back(optional_bool(path, t, key, "normalized", !token.special));
    added.push_back(std::move(token));
  }
  for (size_t i = 0; i < added.size(); ++i) {
    // (the Metaspace prefix is given to the stretches between raw added tokens only)
    if (normalized[i] && sentencepiece && prefix != Prefix::kPrependAlways)
      reject(path, "added_tokens[" + std::to_string(i) + "].normalized",
             "false with the Metaspace pre-tokenizer (not implemented)", (*list)[i]);
    (normalized[i] ? added_normalized : added_raw).add(added, static_cast<int32_t>(i));
  }
  added_raw.finish(added);
  added_normalized.finish(added);
}

int32_t BpeTokenizer::Impl::resolve_token(const std::string& file, const std::string& key,
                                          const json& value) const {
  const json* content = &value;
  if (value.is_object()) content = find_member(value, "content");
  if (content == nullptr || !content->is_string()) {
    reject(file, key, "a token string or {\"content\": \"...\"}", value);
  }
  const auto it = added_by_content.find(content->get<std::string>());
  if (it != added_by_content.end()) return it->second;
  const int32_t id = find_spelled(content->get<std::string>());
  if (id < 0) reject(file, key, "a token of `" + path + "`", value);
  return id;
}

void BpeTokenizer::Impl::load_config(const std::string& config_path) {
  json config;
  if (!config_path.empty()) {
    const std::string text = read_text_file(config_path);
    fingerprint = fmt::format("{}-{:016x}", fingerprint, name_key(text));  // the chat template, BOS and EOS
    config = parse_json_text(text, config_path);
    if (!config.is_object()) reject(config_path, "(root)", "an object", config);
  }
  const auto special_id = [&](const char* key, const char* fallback) -> int32_t {
    const json* v = config.is_object() ? find_member(config, key) : nullptr;
    if (v != nullptr) {
      if (v->is_null()) return -1;
      return resolve_token(config_path, key, *v);
    }
    const auto it = added_by_content.find(fallback);
    return it == added_by_content.end() ? -1 : it->second;
  };
  bos = special_id("bos_token", sentencepiece ? "<s>" : "<|begin_of_text|>");
  eos = special_id("eos_token", sentencepiece ? "</s>" : "<|end_of_text|>");
  if (bos >= 0) bos_text = std::string(token_bytes, token_offset[bos], token_length[bos]);

  const json* chat_json = config.is_object() ? find_member(config, "chat_template") : nullptr;
  if (chat_json == nullptr || chat_json->is_null()) {
    chat_problem = config_path.empty() ? "no tokenizer_config.json was loaded"
                                       : "`" + config_path + "` has no key `chat_template`";
    return;
  }
  std::string tmpl;
  if (chat_json->is_string()) {
    tmpl = chat_json->get<std::string>();
  } else if (chat_json->is_array()) {  // [{"name": ..., "template": ...}]: use "default"
    for (const json& entry : *chat_json) {
      if (entry.is_object() && entry.value("name", json()) == "default" &&
          entry.value("template", json()).is_string()) {
        tmpl = entry["template"].get<std::string>();
      }
    }
    if (tmpl.empty()) reject(config_path, "chat_template", "a template named \"default\"", *chat_json);
  } else {
    reject(config_path, "chat_template", "a string", *chat_json);
  }
  // Rendered by the Jinja interpreter when asked; a template it cannot parse leaves the
  // tokenizer usable without one, and says why where a chat template is needed.
  const std::string eos_text = eos >= 0 ? std::string(token_bytes, token_offset[eos], token_length[eos]) : "";
  try {
    chat = std::make_unique<ChatTemplate>(tmpl, bos_text, eos_text,
                                          "`" + config_path + "` key `chat_template`");
  } catch (const Error& e) {
    chat_problem = e.what();
  }
}

namespace {

// `path` itself, or path/tokenizer.json when `path` is a folder.
std::string tokenizer_json_in(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec)
             ? (std::filesystem::path(path) / "tokenizer.json").string()
             : path;
}

// tokenizer_config.json beside `tokenizer_json`, or "" when there is none.
std::string config_beside(const std::string& tokenizer_json) {
  const auto config =
      std::filesystem::path(tokenizer_json).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  return std::filesystem::is_regular_file(config, ec) ? config.string() : std::string();
}

}  // namespace

BpeTokenizer::BpeTokenizer(const std::string& path)
    : BpeTokenizer(tokenizer_json_in(path), config_beside(tokenizer_json_in(path))) {}

BpeTokenizer::BpeTokenizer(const std::string& tokenizer_json_path,
                           const std::string& tokenizer_config_path)
    : impl_(std::make_unique<Impl>()) {
  Impl& t = *impl_;
  t.path = tokenizer_json_path;
  with_context(
      [&] { return "loading tokenizer `" + tokenizer_json_path + "`"; },
      [&] {
        const std::string text = read_text_file(t.path);
        t.fingerprint = fmt::format("bpe-{:016x}", name_key(text));
        const json root = parse_json_text(text, t.path);
        if (!root.is_object()) reject(t.path, "(root)", "an object", root);
        require_null(t.path, root, "", "truncation", "null (truncation is not implemented)");
        require_null(t.path, root, "", "padding", "null (padding is not implemented)");
        const json* normalizer = find_member(root, "normalizer");
        const json* pre = find_member(root, "pre_tokenizer");
        const bool normalizes = normalizer != nullptr && !normalizer->is_null();
        t.nfc = normalizes && *normalizer == json{{"type", "NFC"}};
        t.sentencepiece = (normalizes && !t.nfc) ||
                          (pre != nullptr && pre->is_object() && pre->value("type", "") == "Metaspace");
        if (t.sentencepiece) {
          t.load_sentencepiece_parts(root);
        } else {
          const json& decoder = require_member(t.path, root, "", "decoder");
          if (!decoder.is_object() || find_member(decoder, "type") == nullptr || decoder["type"] != "ByteLevel") {
            reject(t.path, "decoder", "{\"type\": \"ByteLevel\", ...}", decoder);
          }
        }
        t.load_model(root);
        if (!t.sentencepiece) t.load_pre_tokenizer(root);
        t.load_added_tokens(root);
        t.load_config(tokenizer_config_path);
      });
}

}  // namespace shardtrain::data
