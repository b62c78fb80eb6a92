// Byte-level tokenizer: bytes map to themselves; the two special tokens are matched in text.
#include "data/byte_tokenizer.h"

#include "core/error.h"

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

}  // namespace shardtrain::data
