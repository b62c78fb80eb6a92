// data.eval_source: evaluation reads a separate source whole (a validation split) and training
// reads data.source whole, for documents (in memory, through the token cache, as token files)
// and fine-tuning examples; its errors say it is the evaluation source.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "data/byte_tokenizer.h"
#include "data/tokenize_file.h"
#include "testing/compare.h"
#include "testing/temp_folder.h"
#include "train/training_data.h"

namespace shardtrain::train {
namespace {

namespace fs = std::filesystem;
using testing::throws_with;

using EvalSource = testing::TempFolderTest;

// JSONL documents written with one letter only, so a window shows which source it came from.
std::string documents(int n, char letter) {
  std::string s;
  for (int i = 0; i < n; ++i) s += "{\"text\": \"" + std::string(static_cast<size_t>(5 + i % 17), letter) + "\"}\n";
  return s;
}

// The stream a source of documents(n, letter) becomes: BOS, the letters, EOS, for each document.
std::vector<int32_t> stream_of(int n, char letter) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) {
    ids.push_back(data::ByteTokenizer::kBos);
    ids.insert(ids.end(), static_cast<size_t>(5 + i % 17), letter);
    ids.push_back(data::ByteTokenizer::kEos);
  }
  return ids;
}

JobConfig job(const std::string& source, const std::string& eval_source) {
  JobConfig c;
  c.data.source = source;
  c.data.eval_source = eval_source;
  c.data.token_cache = "off";
  c.data.val_fraction = 0.2;  // does not apply beside an eval_source
  c.training.seq_len = 16;
  c.training.seed = 3;
  return c;
}

// Every training window holds only `train_letter` besides BOS and EOS; the evaluation batches
// are the consecutive windows of `eval_stream`.
void expect_split(const data::TrainingData& data, char train_letter, const std::vector<int32_t>& eval_stream) {
  const int64_t B = 4, T = 16;
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  for (int64_t step = 1; step <= 30; ++step) {
    data.fill_train(ids, targets, step, 0, 0);
    for (int64_t i = 0; i < B * T; ++i) {
      const int32_t id = ids.data<int32_t>()[i];
      ASSERT_TRUE(id == train_letter || id == data::ByteTokenizer::kBos || id == data::ByteTokenizer::kEos) << id;
    }
  }
  const auto eval_stream_size = static_cast<int64_t>(eval_stream.size());
  ASSERT_EQ(data.eval_batches(B, T), (eval_stream_size - 1) / (B * T));
  for (int64_t index = 0; index < data.eval_batches(B, T); ++index) {
    data.fill_eval(ids, targets, index);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        ASSERT_EQ(ids.data<int32_t>()[b * T + t], eval_stream[static_cast<size_t>((index * B + b) * T + t)]);
        ASSERT_EQ(targets.data<int32_t>()[b * T + t], eval_stream[static_cast<size_t>((index * B + b) * T + t + 1)]);
      }
  }
}

TEST_F(EvalSource, DocumentsInMemoryThroughTheCacheAndAsTokenFiles) {
  const std::string train = write("train.jsonl", documents(400, 'a'));
  const std::string eval = write("valid.jsonl", documents(60, 'b'));
  data::ByteTokenizer t;
  const auto memory = open_training_data(job(train, eval), t, t.vocab_size(), 1);
  expect_split(*memory, 'a', stream_of(60, 'b'));
  EXPECT_NE(memory->summary().find("evaluation (data.eval_source)"), std::string::npos) << memory->summary();
  EXPECT_EQ(memory->held_out_size(), std::to_string(stream_of(60, 'b').size()) + " tokens in data.eval_source");

  JobConfig cached = job(train, eval);
  cached.data.token_cache = "on";
  cached.data.cache_dir = (dir_ / "cache").string();
  expect_split(*open_training_data(cached, t, t.vocab_size(), 1), 'a', stream_of(60, 'b'));
  expect_split(*open_training_data(cached, t, t.vocab_size(), 1), 'a', stream_of(60, 'b'));  // reused

  data::TokenizeFileOptions o;
  o.format = data::TextFormat::kJsonl;
  data::tokenize_file(t, train, (dir_ / "train.tok").string(), o);
  data::tokenize_file(t, eval, (dir_ / "valid.tok").string(), o);
  expect_split(*open_training_data(job((dir_ / "train.tok").string(), (dir_ / "valid.tok").string()), t,
                                   t.vocab_size(), 1),
               'a', stream_of(60, 'b'));
  // token files beside JSONL: both are documents
  expect_split(*open_training_data(job((dir_ / "train.tok").string(), eval), t, t.vocab_size(), 1), 'a',
               stream_of(60, 'b'));
}

TEST_F(EvalSource, FineTuningExamples) {
  std::string train_lines, eval_lines;
  for (int i = 0; i < 300; ++i) train_lines += "{\"prompt\": \"aaaa\", \"response\": \"aaaaaa\"}\n";
  for (int i = 0; i < 50; ++i) eval_lines += "{\"prompt\": \"bb\", \"response\": \"bbbbbbbbb\"}\n";
  JobConfig c = job(write("train.jsonl", train_lines), write("valid.jsonl", eval_lines));
  c.data.format = "sft";
  c.data.packing = false;  // one example per sequence: 50 held-out sequences
  data::ByteTokenizer t;
  const auto data = open_training_data(c, t, t.vocab_size(), 1);
  EXPECT_NE(data->summary().find("50 examples in"), std::string::npos) << data->summary();
  EXPECT_NE(data->summary().find("all held out -> 50 sequences"), std::string::npos) << data->summary();
  const int64_t B = 5, T = 16;
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  ASSERT_EQ(data->eval_batches(B, T), 10);
  for (int64_t index = 0; index < 10; ++index) {
    data->fill_eval(ids, targets, index);
    for (int64_t i = 0; i < B * T; ++i) ASSERT_NE(ids.data<int32_t>()[i], 'a');
  }
  for (int64_t step = 1; step <= 10; ++step) {
    data->fill_train(ids, targets, step, 0, 0);
    for (int64_t i = 0; i < B * T; ++i) ASSERT_NE(ids.data<int32_t>()[i], 'b');
  }
}

TEST_F(EvalSource, ErrorsNameTheEvalSource) {
  data::ByteTokenizer t;
  // data.format applies to both sources: a text file is not prompt/response JSONL
  JobConfig c = job(write("pairs.jsonl", "{\"prompt\": \"p\", \"response\": \"r\"}\n"), write("valid.txt", "text\n"));
  c.data.format = "sft";
  EXPECT_TRUE(throws_with([&] { open_training_data(c, t, t.vocab_size(), 1); },
                          "valid.txt` line 1: malformed JSON"));
  EXPECT_TRUE(throws_with([&] { open_training_data(c, t, t.vocab_size(), 1); },
                          "while reading `data.eval_source` = `" + (dir_ / "valid.txt").string() + "`"));
  JobConfig docs = job(write("docs.jsonl", documents(10, 'a')), (dir_ / "missing.jsonl").string());
  EXPECT_TRUE(throws_with([&] { open_training_data(docs, t, t.vocab_size(), 1); }, "no file or folder"));
  // the key named is the one the path came from, not data.source
  const std::string missing = "`data.eval_source` = `" + (dir_ / "missing.jsonl").string() +
                              "`: no file or folder of that name";
  EXPECT_TRUE(throws_with([&] { open_training_data(docs, t, t.vocab_size(), 1); }, missing));
  EXPECT_FALSE(throws_with([&] { open_training_data(docs, t, t.vocab_size(), 1); }, "`data.source`"));
}

// A JSONL line in another encoding than UTF-8 is named as such, with the file and the line,
// not as a line that is no JSON object.
TEST_F(EvalSource, ALineNotInUtf8IsNamed) {
  data::ByteTokenizer t;
  const std::string latin1 = write("latin1.jsonl", documents(10, 'a') + "{\"text\": \"caf\xe9\"}\n");
  JobConfig c = job(write("docs.jsonl", documents(10, 'a')), latin1);
  EXPECT_TRUE(throws_with([&] { open_training_data(c, t, t.vocab_size(), 1); },
                          "latin1.jsonl` line 11: not valid UTF-8 (byte 13 of the line is 0xe9)"));
}

// A device or a FIFO given as a source exists but is no file to read (several times, by
// offset): named as such, not as a missing path.
TEST_F(EvalSource, ADeviceOrAFifoIsNotARegularFile) {
  data::ByteTokenizer t;
  const std::string docs = write("docs.jsonl", documents(10, 'a'));
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  JobConfig c = job("/dev/null", "");
  EXPECT_TRUE(throws_with([&] { open_training_data(c, t, t.vocab_size(), 1); },
                          "`data.source` = `/dev/null` is not a regular file or folder (a character device)"));
  c = job(docs, fifo);
  EXPECT_TRUE(throws_with([&] { open_training_data(c, t, t.vocab_size(), 1); },
                          "`data.eval_source` = `" + fifo + "` is not a regular file or folder (a FIFO)"));
}

}  // namespace
}  // namespace shardtrain::train
