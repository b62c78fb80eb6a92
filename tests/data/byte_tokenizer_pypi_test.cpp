// The byte-level tokenizer's Hugging Face files (what an export of a byte model carries)
// against PyPI's `tokenizers`: ids equal to ByteTokenizer's on sample text (non-ASCII, both
// special tokens), every byte's token where it can stand in valid UTF-8, BOS first with
// add_special_tokens, decode giving the text back; and, where python3 has transformers,
// AutoTokenizer.from_pretrained on the folder. Each part reports SKIPPED when python3 cannot
// import the package (scripts/setup.sh --tests installs `tokenizers`).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <gtest/gtest.h>

#include "data/byte_tokenizer.h"
#include "testing/temp_folder.h"

namespace shardtrain::data {
namespace {

bool python_imports(const std::string& module) {
  return std::system(("python3 -c 'import " + module + "' > /dev/null 2>&1").c_str()) == 0;
}

const std::vector<std::string> kSamples = {
    "Hello, world!",
    "  two spaces\tand a tab\nand lines\r\n",
    "caf\xc3\xa9 na\xc3\xafve \xc3\x9f \xe2\x82\xac 5 \xc2\xa0 \xc3\xbf",
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87 "
    "\xf0\x9f\x98\x80\xf0\x9f\x8e\x89 \xd0\x9f\xd1\x80\xd0\xb8",
    "<|begin_of_text|>a document<|end_of_text|><|begin_of_text|>next",
    "<|begin_of_text <|end_of_text| <| |> <|begin_of_text|x",
    "\x01\x02\x1f\x7f control bytes",
    "It's 3.14 , isn't it ? Yes !",  // spaces before punctuation stay on decode
};

// The folder with the byte tokenizer's files, and cases.json: each sample with ByteTokenizer's ids.
class ByteTokenizerPypi : public testing::TempFolderTest {
 protected:
  void SetUp() override {
    TempFolderTest::SetUp();
    for (const auto& [name, text] : byte_tokenizer_files()) write(name, text);
    nlohmann::json cases = nlohmann::json::array();
    const ByteTokenizer bytes;
    for (const std::string& text : kSamples) cases.push_back({{"text", text}, {"ids", bytes.encode(text)}});
    write("cases.json", cases.dump());
  }
  int run_python(const std::string& script) {
    const std::string path = write("check.py", script);
    return std::system(("python3 '" + path + "' '" + dir_.string() + "'").c_str());
  }
};

TEST_F(ByteTokenizerPypi, TokenizersGivesTheSameIds) {
  if (!python_imports("tokenizers")) GTEST_SKIP() << "python3 cannot import `tokenizers` (pip install tokenizers)";
  const int status = run_python(R"(
import json, sys
from tokenizers import Tokenizer
folder = sys.argv[1]
tok = Tokenizer.from_file(folder + "/tokenizer.json")
bad = 0
def fail(*what):
    global bad
    bad += 1
    print("MISMATCH:", *what)
# GPT-2's bytes_to_unicode, the ByteLevel alphabet: a byte's token spells it so
printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
spelled, extra = {}, 0
for b in range(256):
    if b in printable:
        spelled[b] = chr(b)
    else:
        spelled[b] = chr(256 + extra)
        extra += 1
for b in range(256):
    if tok.id_to_token(b) != spelled[b]:
        fail("id", b, "is", repr(tok.id_to_token(b)), "not", repr(spelled[b]))
# every byte that valid UTF-8 holds, through encode and decode
def utf8_with(b):
    if b < 0x80: return [b]
    if b < 0xC0: return [0xC2, b]
    if 0xC2 <= b <= 0xDF: return [b, 0x80]
    if b == 0xE0: return [0xE0, 0xA0, 0x80]
    if 0xE1 <= b <= 0xEF: return [b, 0x80, 0x80]
    if b == 0xF0: return [0xF0, 0x90, 0x80, 0x80]
    if 0xF1 <= b <= 0xF4: return [b, 0x80, 0x80, 0x80]
    return None  # 0xC0, 0xC1, 0xF5..0xFF never occur in UTF-8
for b in range(256):
    seq = utf8_with(b)
    if seq is None:
        continue
    text = bytes(seq).decode("utf-8")
    if tok.encode(text, add_special_tokens=False).ids != seq:
        fail("byte", b, tok.encode(text, add_special_tokens=False).ids, seq)
    if tok.decode(seq) != text:
        fail("decode of byte", b)
for case in json.load(open(folder + "/cases.json", encoding="utf-8")):
    text, ids = case["text"], case["ids"]
    got = tok.encode(text, add_special_tokens=False).ids
    if got != ids:
        fail(repr(text), got, ids)
    if tok.encode(text).ids != [256] + ids:
        fail("add_special_tokens: BOS first", repr(text), tok.encode(text).ids)
    if tok.decode(ids, skip_special_tokens=False) != text:
        fail("decode", repr(text), repr(tok.decode(ids, skip_special_tokens=False)))
if tok.token_to_id("<|begin_of_text|>") != 256 or tok.token_to_id("<|end_of_text|>") != 257:
    fail("special ids", tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|end_of_text|>"))
if tok.get_vocab_size() != 258:
    fail("vocab size", tok.get_vocab_size())
sys.exit(1 if bad else 0)
)");
  EXPECT_EQ(status, 0) << "python's `tokenizers` disagrees with ByteTokenizer (MISMATCH lines above)";
}

TEST_F(ByteTokenizerPypi, TransformersAutoTokenizerLoadsTheFolder) {
  if (!python_imports("transformers"))
    GTEST_SKIP() << "python3 cannot import `transformers` (pip install transformers): AutoTokenizer not checked";
  const int status = run_python(R"(
import json, sys
from transformers import AutoTokenizer
folder = sys.argv[1]
tok = AutoTokenizer.from_pretrained(folder)
bad = 0
def fail(*what):
    global bad
    bad += 1
    print("MISMATCH:", *what)
if tok.bos_token_id != 256 or tok.eos_token_id != 257:
    fail("bos/eos", tok.bos_token_id, tok.eos_token_id)
for case in json.load(open(folder + "/cases.json", encoding="utf-8")):
    text, ids = case["text"], case["ids"]
    got = tok(text, add_special_tokens=False)["input_ids"]
    if got != ids:
        fail(repr(text), got, ids)
    if tok(text)["input_ids"] != [256] + ids:
        fail("BOS first", repr(text))
    if tok.decode(ids) != text:
        fail("decode", repr(text), repr(tok.decode(ids)))
sys.exit(1 if bad else 0)
)");
  EXPECT_EQ(status, 0) << "transformers' AutoTokenizer disagrees with ByteTokenizer (MISMATCH lines above)";
}

}  // namespace
}  // namespace shardtrain::data
