// data.mix: each training sequence comes from one source, drawn by weight from (seed, step,
// micro-batch, sequence), so the shares follow the weights and a global batch split over ranks
// reads the same rows; evaluation takes each source's held-out batches in turn and the trainer
// reports each source's loss. Bad entries are named.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/byte_tokenizer.h"
#include "data/corpus.h"
#include "data/tokenize_file.h"
#include "testing/compare.h"
#include "testing/temp_folder.h"
#include "train/trainer.h"
#include "train/training_data.h"

namespace shardtrain::train {
namespace {

namespace fs = std::filesystem;
using testing::throws_with;

class DataMix : public testing::TempFolderTest {
 protected:
  // JSONL documents of one letter, so a window shows its source
  std::string letters(const std::string& name, char letter, int n) const {
    std::string s;
    for (int i = 0; i < n; ++i) s += "{\"text\": \"" + std::string(static_cast<size_t>(20 + i % 30), letter) + "\"}\n";
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << s;
    return path;
  }
};

JobConfig job(const std::string& mix) {
  JobConfig c;
  c.data.mix = mix;
  c.data.token_cache = "off";
  c.data.val_fraction = 0.2;
  c.training.seq_len = 8;
  c.training.seed = 11;
  return c;
}

// The letter a row is made of (BOS and EOS aside).
char source_of(const Tensor& ids, int64_t row) {
  const int64_t T = ids.size(1);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t id = ids.data<int32_t>()[row * T + t];
    if (id != data::ByteTokenizer::kBos && id != data::ByteTokenizer::kEos) return static_cast<char>(id);
  }
  return '?';
}

TEST(DataMixParse, EntriesWeightsAndNames) {
  const std::vector<MixEntry> e = parse_data_mix(" web/c4-*.parquet = 6, code.tok=3 ,books/part.jsonl.zst=1, ");
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].source, "web/c4-*.parquet");
  EXPECT_EQ(e[0].name, "web");
  EXPECT_EQ(e[1].name, "code");
  EXPECT_EQ(e[2].source, "books/part.jsonl.zst");
  EXPECT_EQ(e[2].name, "part");
  EXPECT_DOUBLE_EQ(e[0].weight, 0.6);
  EXPECT_DOUBLE_EQ(e[2].weight, 0.1);
  const std::vector<MixEntry> same = parse_data_mix("a/x.tok=1, b/x.tok=1");
  EXPECT_EQ(same[0].name, "x_0");
  EXPECT_EQ(same[1].name, "x_1");
  EXPECT_TRUE(throws_with([] { parse_data_mix("a.tok"); }, "entry `a.tok` is not `path=weight`"));
  EXPECT_TRUE(throws_with([] { parse_data_mix("a.tok=0"); }, "the weight of `a.tok` is `0`"));
  EXPECT_TRUE(throws_with([] { parse_data_mix("a.tok=2x"); }, "the weight of `a.tok` is `2x`"));
  EXPECT_TRUE(throws_with([] { parse_data_mix("a.tok=1,,b.tok=1"); }, "an empty entry"));
  EXPECT_TRUE(throws_with([] { parse_data_mix(""); }, "an empty entry"));
}

TEST_F(DataMix, SharesFollowTheWeightsAndRanksReadTheSameRows) {
  const std::string a = letters("a.jsonl", 'a', 300), b = letters("b.jsonl", 'b', 300), c = letters("c.jsonl", 'c', 300);
  data::ByteTokenizer t;
  const auto data = open_training_data(job(a + "=6, " + b + "=3, " + c + "=1"), t, t.vocab_size(), 1);
  const int64_t B = 50, T = 8;
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  std::map<char, int> count;
  for (int64_t step = 1; step <= 60; ++step) {
    data->fill_train(ids, targets, step, 0, 0);
    for (int64_t r = 0; r < B; ++r) ++count[source_of(ids, r)];
  }
  // 3000 draws: each share within 5 standard deviations of its weight
  const double n = 3000;
  for (const auto& [letter, w] : std::map<char, double>{{'a', 0.6}, {'b', 0.3}, {'c', 0.1}})
    EXPECT_NEAR(count[letter] / n, w, 5 * std::sqrt(w * (1 - w) / n)) << letter << ": " << count[letter];
  EXPECT_EQ(count['?'], 0);

  // two ranks of 25 sequences each read the global batch's rows
  Tensor half = Tensor::empty({25, T}, DType::kI32), half_targets = Tensor::empty({25, T}, DType::kI32);
  data->fill_train(ids, targets, 7, 1, 0);
  for (int64_t first : {0, 25}) {
    data->fill_train(half, half_targets, 7, 1, first);
    for (int64_t i = 0; i < 25 * T; ++i) {
      ASSERT_EQ(half.data<int32_t>()[i], ids.data<int32_t>()[first * T + i]);
      ASSERT_EQ(half_targets.data<int32_t>()[i], targets.data<int32_t>()[first * T + i]);
    }
  }
}

TEST_F(DataMix, EvaluationTakesEachSourceInTurn) {
  const std::string a = letters("a.jsonl", 'a', 300), b = letters("b.jsonl", 'b', 900);
  data::ByteTokenizer t;
  const JobConfig c = job(a + "=1, " + b + "=1");
  const auto data = open_training_data(c, t, t.vocab_size(), 1);
  JobConfig only_a = c;
  only_a.data.mix.clear();
  only_a.data.source = a;
  const auto alone = open_training_data(only_a, t, t.vocab_size(), 1);
  const int64_t B = 4, T = 8;
  // as many batches from each as the smaller held-out split has
  ASSERT_EQ(data->eval_batches(B, T), 2 * alone->eval_batches(B, T));
  EXPECT_EQ(data->eval_part_names(), (std::vector<std::string>{"a", "b"}));
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  Tensor want = Tensor::empty({B, T}, DType::kI32);
  for (int64_t i = 0; i < data->eval_batches(B, T); ++i) {
    EXPECT_EQ(data->eval_part(i), i % 2);
    data->fill_eval(ids, targets, i);
    EXPECT_EQ(source_of(ids, 0), i % 2 == 0 ? 'a' : 'b');
    if (i % 2 == 0) {
      alone->fill_eval(want, targets, i / 2);
      for (int64_t k = 0; k < B * T; ++k) ASSERT_EQ(ids.data<int32_t>()[k], want.data<int32_t>()[k]);
    }
  }
}

TEST_F(DataMix, TheTrainerReportsEachSourcesLossAndTheErrorsNameTheSource) {
  // a token file beside a JSONL file; the trainer's evaluation gives each its own loss
  data::TokenizeFileOptions o;
  o.format = data::TextFormat::kJsonl;
  data::tokenize_file(data::ByteTokenizer(), letters("a.jsonl", 'a', 400), (dir_ / "a.tok").string(), o);
  LoadedConfig loaded = load_config("", {"--model.dim=32", "--model.n_layers=1", "--model.n_heads=2",
                                         "--model.n_kv_heads=1", "--model.ffn_dim=64", "--training.steps=6",
                                         "--training.seq_len=16", "--training.batch_size=4", "--training.device=cpu",
                                         "--eval.batches=4", "--sample.tokens=0", "--logging.progress=off",
                                         "--run.output_dir=" + (dir_ / "out").string()});
  JobConfig c = loaded.config;
  c.data.mix = (dir_ / "a.tok").string() + "=1, " + letters("b.jsonl", 'b', 400) + "=1";
  const TrainSummary s = Trainer(c).run();
  ASSERT_EQ(s.last_eval_parts.size(), 2u);
  EXPECT_EQ(s.last_eval_parts[0].first, "a");
  EXPECT_EQ(s.last_eval_parts[1].first, "b");
  // two batches each: the whole's loss is the token-weighted mean of the two
  EXPECT_NEAR(s.evals.back().second, (s.last_eval_parts[0].second + s.last_eval_parts[1].second) / 2, 1e-9);
  EXPECT_NE(s.last_eval_parts[0].second, s.last_eval_parts[1].second);
  std::ifstream metrics(dir_ / "out" / "metrics.jsonl");
  bool found = false;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("eval_loss/a") && j.contains("eval_loss/b")) found = true;
  }
  EXPECT_TRUE(found);

  data::ByteTokenizer t;
  EXPECT_TRUE(throws_with([&] { open_training_data(job((dir_ / "none.jsonl").string() + "=1"), t, 258, 1); },
                          "`data.mix` source `" + (dir_ / "none.jsonl").string() + "`"));
  JobConfig sft = job((dir_ / "a.tok").string() + "=1");
  sft.data.format = "sft";
  EXPECT_TRUE(throws_with([&] { open_training_data(sft, t, 258, 1); }, "`data.mix` mixes documents"));
}

}  // namespace
}  // namespace shardtrain::train
