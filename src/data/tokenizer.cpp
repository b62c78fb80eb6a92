// Opening the tokenizer a config key or an option names.
#include "data/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/byte_tokenizer.h"

namespace shardtrain::data {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec, std::string_view option,
                                          std::string_view accepted) {
  namespace fs = std::filesystem;
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  std::error_code ec;
  ST_CHECK(!spec.empty(), option, " is empty; it takes ", accepted);
  ST_CHECK(fs::exists(spec, ec), option, " = `", spec, "`: no such file or folder; it takes ", accepted);
  const bool folder = fs::is_directory(spec, ec);
  const fs::path json = folder ? fs::path(spec) / "tokenizer.json" : fs::path(spec);
  ST_CHECK(!folder || fs::exists(json, ec), option, " = `", spec, "`: the folder holds no tokenizer.json; ",
           option, " takes ", accepted);
  auto bpe = with_context([&] { return "loading the tokenizer `" + spec + "` (" + std::string(option) + ")"; },
                          [&] { return std::make_unique<BpeTokenizer>(spec); });
  if (bpe->vocab_size() == ByteTokenizer().vocab_size() && bpe->bos_id() == ByteTokenizer::kBos &&
      bpe->eos_id() == ByteTokenizer::kEos && !bpe->has_chat_template()) {
    std::ifstream in(json, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (is_byte_tokenizer_json(text.str())) return std::make_unique<ByteTokenizer>();
  }
  return bpe;
}

}  // namespace shardtrain::data
