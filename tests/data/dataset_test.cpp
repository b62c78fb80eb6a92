// Byte tokenizer, document loaders, the validation split and deterministic sampling.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <omp.h>

#include "testing/compare.h"
#include "testing/shared_data.h"

#include "data/bpe_tokenizer.h"
#include "data/byte_tokenizer.h"
#include "data/corpus.h"
#include "data/dataset.h"
#include "data/tokenize_file.h"

namespace shardtrain::data {
namespace {

using testing::throws_with;

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

  const VectorTokenSource train(a.train);
  WindowSampler s(&train, 16, 9);
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


std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("shardtrain_dataset_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::vector<int32_t> rows(const Tensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

// builtin:random: rows a pure function of (seed, step, micro-batch, sequence), split over ranks
// like every source, targets the next token, every id of the vocabulary about equally often.
TEST(RandomTokenData, RowsFollowTheirPlaceAndCoverTheVocabulary) {
  const int64_t V = 50;
  const RandomTokenData data(V, 11);
  Tensor ids = Tensor::empty({4, 300}, DType::kI32), targets = Tensor::empty({4, 300}, DType::kI32);
  data.fill_train(ids, targets, 3, 1, 0);
  std::vector<int64_t> counts(V, 0);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int32_t id = ids.data<int32_t>()[i], target = targets.data<int32_t>()[i];
    ASSERT_GE(id, 0);
    ASSERT_LT(id, V);
    ASSERT_GE(target, 0);
    ASSERT_LT(target, V);
    ++counts[id];
    if (i % 300 != 299) {
      EXPECT_EQ(target, ids.data<int32_t>()[i + 1]) << i;
    }
  }
  const double mean = 1200.0 / V, sigma = std::sqrt(mean * (1 - 1.0 / V));
  for (int64_t v = 0; v < V; ++v) EXPECT_NEAR(counts[v], mean, 5 * sigma) << "id " << v;
  // the same place gives the same rows; a second rank's half is the same sequences
  Tensor again = Tensor::empty({4, 300}, DType::kI32), half = Tensor::empty({2, 300}, DType::kI32);
  Tensor t2 = Tensor::empty({4, 300}, DType::kI32), th = Tensor::empty({2, 300}, DType::kI32);
  RandomTokenData(V, 11).fill_train(again, t2, 3, 1, 0);
  EXPECT_EQ(rows(again), rows(ids));
  EXPECT_EQ(rows(t2), rows(targets));
  data.fill_train(half, th, 3, 1, 2);
  EXPECT_EQ(rows(half), std::vector<int32_t>(ids.data<int32_t>() + 600, ids.data<int32_t>() + 1200));
  // another step, micro-batch or seed, and the held-out batches, are other rows
  auto differs = [&](const Tensor& t) { return rows(t) != rows(ids); };
  data.fill_train(again, t2, 4, 1, 0);
  EXPECT_TRUE(differs(again));
  data.fill_train(again, t2, 3, 0, 0);
  EXPECT_TRUE(differs(again));
  RandomTokenData(V, 12).fill_train(again, t2, 3, 1, 0);
  EXPECT_TRUE(differs(again));
  data.fill_eval(again, t2, 0);
  EXPECT_TRUE(differs(again));
  Tensor other = Tensor::empty({4, 300}, DType::kI32);
  data.fill_eval(other, t2, 1);
  EXPECT_NE(rows(other), rows(again));
  EXPECT_GE(data.eval_batches(4, 300), 64);
  EXPECT_TRUE(throws_with([&] { data.fill_eval(other, t2, data.eval_batches(4, 300)); }, "past the"));
  EXPECT_TRUE(throws_with([] { RandomTokenData(0, 1); }, "vocabulary of at least 1 token"));
}

// Encoding on several threads and in blocks gives the one-thread streams, with the Llama 3
// tokenizer over the bible's verses (more documents than one block).
TEST(Dataset, StreamsDoNotDependOnTheNumberOfThreads) {
  ST_REQUIRE_SHARED_DATA(dir);
  const BpeTokenizer t(dir + "/tokenizers/llama3");
  std::vector<std::string> docs;
  std::ifstream in(dir + "/corpus/world_english_bible.txt");
  for (std::string line; std::getline(in, line) && docs.size() < 9000;) docs.push_back(line);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const TokenStreams one = build_token_streams(docs, t, 0.1, 4);
  omp_set_num_threads(4);
  const TokenStreams four = build_token_streams(docs, t, 0.1, 4);
  omp_set_num_threads(threads);
  EXPECT_EQ(one.train, four.train);
  EXPECT_EQ(one.val, four.val);
  EXPECT_EQ(one.bytes, four.bytes);
  EXPECT_EQ(one.documents, 9000);
  docs[5000] = "bad \xff byte";
  EXPECT_TRUE(throws_with([&] { (void)build_token_streams(docs, t, 0.1, 4); }, "tokenizing document 5000"));
}

// A token file holds documents as the in-memory stream does ([BOS] ids [EOS]), and training
// from it draws the very windows training from the same stream in memory draws.
TEST(TokenFileData, TrainsOnTheStreamTheTextPathBuilds) {
  std::vector<std::string> docs;
  std::string text;
  for (int i = 0; i < 300; ++i) {
    docs.push_back("line number " + std::to_string(i) + " of the corpus");
    text += docs.back() + "\n";
  }
  ByteTokenizer t;
  const std::string in = temp_path("docs.txt"), tok = temp_path("docs.sttok");
  std::ofstream(in) << text;
  (void)tokenize_file(t, in, tok);
  const TokenStreams memory = build_token_streams(docs, t, 0.0, 1);
  EXPECT_EQ(TokenFile(tok).read_all(), memory.train);
  EXPECT_EQ(TokenFile(tok).header().bos_id, ByteTokenizer::kBos);

  const std::unique_ptr<TrainingData> file = open_token_file_data(tok, t, 258, 0.1, 32, 5);
  const PackedStreamData vec(std::make_unique<VectorTokenSource>(memory.train),
                             std::make_unique<VectorTokenSource>(memory.val), 32, 5, "");
  // The file's training part is a prefix of the stream, so windows differ only by where they
  // may start; compare against a stream cut at the same place.
  const int64_t val_tokens = std::stoll(file->held_out_size());
  const int64_t cut = static_cast<int64_t>(memory.train.size()) - val_tokens;
  EXPECT_GT(val_tokens, 0.09 * static_cast<double>(memory.train.size()));
  EXPECT_LT(val_tokens, 0.11 * static_cast<double>(memory.train.size()));
  EXPECT_EQ(memory.train[static_cast<size_t>(cut)], ByteTokenizer::kBos);  // held out from a document's start
  const PackedStreamData same(
      std::make_unique<VectorTokenSource>(std::vector<int32_t>(memory.train.begin(), memory.train.begin() + cut)),
      std::make_unique<VectorTokenSource>(std::vector<int32_t>(memory.train.begin() + cut, memory.train.end())), 32, 5,
      "");
  Tensor a = Tensor::empty({3, 32}, DType::kI32), at = Tensor::empty({3, 32}, DType::kI32);
  Tensor b = Tensor::empty({3, 32}, DType::kI32), bt = Tensor::empty({3, 32}, DType::kI32);
  for (int64_t step = 1; step <= 3; ++step) {
    file->fill_train(a, at, step, 1, 4);
    same.fill_train(b, bt, step, 1, 4);
    EXPECT_EQ(rows(a), rows(b));
    EXPECT_EQ(rows(at), rows(bt));
  }
  ASSERT_EQ(file->eval_batches(3, 32), same.eval_batches(3, 32));
  ASSERT_GT(file->eval_batches(3, 32), 0);
  file->fill_eval(a, at, 0);
  same.fill_eval(b, bt, 0);
  EXPECT_EQ(rows(a), rows(b));
  EXPECT_EQ(a.data<int32_t>()[0], ByteTokenizer::kBos);
  std::filesystem::remove(in);
  std::filesystem::remove(tok);
}

// A folder of token files reads as the one file of the same documents: the same stream, split
// at the same place, so the same windows.
TEST(TokenFileData, AFolderOfFilesReadsAsOneStream) {
  std::string first, second;
  for (int i = 0; i < 200; ++i) (i < 70 ? first : second) += "document " + std::to_string(i) + " of two files\n";
  ByteTokenizer t;
  const std::string dir = temp_path("folder");
  std::filesystem::create_directories(dir);
  const std::string a = temp_path("a.txt"), b = temp_path("b.txt"), both = temp_path("both.txt");
  std::ofstream(a) << first;
  std::ofstream(b) << second;
  std::ofstream(both) << first + second;
  (void)tokenize_file(t, a, dir + "/part-000.tok");
  (void)tokenize_file(t, b, dir + "/part-001.tok");
  std::ofstream(dir + "/README") << "not a token file";
  (void)tokenize_file(t, both, temp_path("both.tok"));
  const std::unique_ptr<TrainingData> folder = open_token_file_data(dir, t, 258, 0.1, 16, 3);
  const std::unique_ptr<TrainingData> one = open_token_file_data(temp_path("both.tok"), t, 258, 0.1, 16, 3);
  EXPECT_NE(folder->summary().find("2 token files in"), std::string::npos) << folder->summary();
  EXPECT_EQ(folder->held_out_size(), one->held_out_size());
  Tensor x = Tensor::empty({4, 16}, DType::kI32), xt = Tensor::empty({4, 16}, DType::kI32);
  Tensor y = Tensor::empty({4, 16}, DType::kI32), yt = Tensor::empty({4, 16}, DType::kI32);
  for (int64_t step = 1; step <= 20; ++step) {  // windows across the files' boundary among them
    folder->fill_train(x, xt, step, 0, 0);
    one->fill_train(y, yt, step, 0, 0);
    EXPECT_EQ(rows(x), rows(y));
    EXPECT_EQ(rows(xt), rows(yt));
  }
  const std::string empty = temp_path("empty_folder");
  std::filesystem::create_directories(empty);
  EXPECT_TRUE(throws_with([&] { (void)open_token_file_data(empty, t, 258, 0.1, 16, 3); }, "folder without token files"));
  for (const std::string& p : {dir, empty, a, b, both, temp_path("both.tok")}) std::filesystem::remove_all(p);
}

// A tokenizer that is the byte tokenizer but for its special ids.
class OtherSpecials final : public Tokenizer {
 public:
  OtherSpecials(int32_t bos, int32_t eos) : bos_(bos), eos_(eos) {}
  std::vector<int32_t> encode(std::string_view text) const override { return ByteTokenizer().encode(text); }
  std::string decode(std::span<const int32_t> ids) const override { return ByteTokenizer().decode(ids); }
  int64_t vocab_size() const override { return 258; }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }

 private:
  int32_t bos_, eos_;
};

TEST(TokenFileData, FilesOfAnotherTokenizerOrModelAreRefused) {
  const std::string tok = temp_path("refused.sttok");
  {
    TokenFileWriter w(tok, 258, ByteTokenizer::kEos, ByteTokenizer::kBos);
    for (int d = 0; d < 50; ++d) w.append_document(ByteTokenizer().encode("some document text " + std::to_string(d)));
    w.finish();
  }
  ByteTokenizer t;
  const auto open = [](const std::string& path, const Tokenizer& tokenizer, int64_t vocab, int64_t seq_len) {
    return [&path, &tokenizer, vocab, seq_len] { (void)open_token_file_data(path, tokenizer, vocab, 0.1, seq_len, 1); };
  };
  EXPECT_NO_THROW(open(tok, t, 258, 16)());
  EXPECT_TRUE(throws_with(open(tok, t, 200, 16), "more than the model's vocabulary of 200"));
  EXPECT_TRUE(throws_with(open(tok, OtherSpecials(256, 5), 258, 16),
                          "ends documents with id 257 but the run's tokenizer has EOS 5"));
  EXPECT_TRUE(throws_with(open(tok, OtherSpecials(7, 257), 258, 16),
                          "begins documents with id 256 but the run's tokenizer has BOS 7"));
  EXPECT_TRUE(throws_with(open(tok, t, 258, 4096), "fewer than one sequence"));
  // Version 1 files stored no BOS: refused where the tokenizer has one, read where it has none.
  std::string bytes;
  {
    std::ifstream in(tok, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  bytes[8] = 1;
  bytes[44] = bytes[45] = bytes[46] = bytes[47] = 0;
  const std::string v1 = temp_path("v1.sttok");
  std::ofstream(v1, std::ios::binary) << bytes;
  EXPECT_EQ(TokenFile(v1).header().bos_id, -1);
  EXPECT_TRUE(throws_with(open(v1, t, 258, 16), "version 1 file, which stores no BOS"));
  EXPECT_NO_THROW(open(v1, OtherSpecials(-1, 257), 258, 16)());
  std::filesystem::remove(tok);
  std::filesystem::remove(v1);
}

}  // namespace
}  // namespace shardtrain::data
