// Byte tokenizer, document loaders, the validation split and deterministic sampling.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "data/byte_tokenizer.h"
#include "data/corpus.h"
#include "data/dataset.h"

namespace shardtrain::data {
namespace {

TEST(ByteTokenizer, RoundTripsBytesAndSpecials) {
  ByteTokenizer t;
  const std::string text = "<|begin_of_text|>caf\xc3\xa9 <|end_of_text|><|x|>";
  const std::vector<int32_t> ids = t.encode(text);
  EXPECT_EQ(ids.front(), ByteTokenizer::kBos);
  EXPECT_EQ(ids[1], 'c');
  EXPECT_EQ(ids[4], 0xc3);
  EXPECT_EQ(t.decode(ids), text);
  const std::vector<int32_t> bad = {65, 300};
  EXPECT_THROW((void)t.decode(bad), Error);
}

TEST(Corpus, TextAndJsonlDocuments) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string txt = (dir / "shardtrain_docs.txt").string();
  std::ofstream(txt) << "first line\nsecond line\n\n\nsecond doc\n";
  const std::vector<std::string> d = load_text_documents(txt);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0], "first line\nsecond line");
  const std::string jl = (dir / "shardtrain_docs.jsonl").string();
  std::ofstream(jl) << "{\"text\": \"a\"}\n{\"body\": \"b\"}\n";
  try {
    (void)load_jsonl_documents(jl, "text");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2: no field `text`"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)load_fortunes("/nonexistent/fortunes"), Error);
}

TEST(Dataset, SplitAndSamplingAreDeterministic) {
  std::vector<std::string> docs;
  for (int i = 0; i < 400; ++i) docs.push_back("document number " + std::to_string(i));
  ByteTokenizer t;
  const TokenStreams a = build_token_streams(docs, t, 0.1, 3);
  const TokenStreams b = build_token_streams(docs, t, 0.1, 3);
  EXPECT_EQ(a.train, b.train);
  EXPECT_GT(a.val.size(), 0u);
  const double frac = static_cast<double>(a.val.size()) / static_cast<double>(a.val.size() + a.train.size());
  EXPECT_GT(frac, 0.04);
  EXPECT_LT(frac, 0.2);
  EXPECT_EQ(a.train.front(), ByteTokenizer::kBos);

  WindowSampler s(&a.train, 16, 9);
  Tensor ids1 = Tensor::empty({4, 16}, DType::kI32), tg1 = Tensor::empty({4, 16}, DType::kI32);
  Tensor ids2 = Tensor::empty({2, 16}, DType::kI32), tg2 = Tensor::empty({2, 16}, DType::kI32);
  s.fill(ids1, tg1, 5, 0, 0);
  s.fill(ids2, tg2, 5, 0, 2);  // sequences 2..3 of the same batch, as a second rank would draw them
  for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(ids2.data<int32_t>()[i], ids1.data<int32_t>()[32 + i]);
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t i = 0; i + 1 < 16; ++i) EXPECT_EQ(tg1.data<int32_t>()[b * 16 + i], ids1.data<int32_t>()[b * 16 + i + 1]);
  Tensor ids3 = Tensor::empty({4, 16}, DType::kI32);
  s.fill(ids3, tg1, 6, 0, 0);
  EXPECT_NE(std::vector<int32_t>(ids3.data<int32_t>(), ids3.data<int32_t>() + 64),
            std::vector<int32_t>(ids1.data<int32_t>(), ids1.data<int32_t>() + 64));
}

}  // namespace
}  // namespace shardtrain::data
