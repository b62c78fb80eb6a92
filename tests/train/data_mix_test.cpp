// data.mix: each training sequence comes from one source, drawn by weight from (seed, step,
// micro-batch, sequence), so the shares follow the weights and a global batch split over ranks
// reads the same rows; fine-tuning examples come in each source's own order; evaluation takes
// each source's held-out batches in turn and the trainer reports each source's loss. Bad
// entries are named.
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

// Ranks of `rows` sequences each, filling step `step` micro-batch `micro` of `split`, read the
// rows (and targets) that one fill of the whole global batch of `whole` gives.
void expect_ranks_read_the_global_batch(const data::TrainingData& whole, const data::TrainingData& split,
                                        int64_t global, int64_t rows, int64_t T, int64_t step, int64_t micro) {
  Tensor ids = Tensor::empty({global, T}, DType::kI32), targets = Tensor::empty({global, T}, DType::kI32);
  Tensor part = Tensor::empty({rows, T}, DType::kI32), part_targets = Tensor::empty({rows, T}, DType::kI32);
  whole.fill_train(ids, targets, step, micro, 0);
  for (int64_t first = global - rows; first >= 0; first -= rows) {  // the last rank first
    split.fill_train(part, part_targets, step, micro, first);
    for (int64_t i = 0; i < rows * T; ++i) {
      ASSERT_EQ(part.data<int32_t>()[i], ids.data<int32_t>()[first * T + i]) << "sequences from " << first;
      ASSERT_EQ(part_targets.data<int32_t>()[i], targets.data<int32_t>()[first * T + i]);
    }
  }
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
  expect_ranks_read_the_global_batch(*data, *data, B, 25, T, 7, 1);
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
  // the entry is named by its own key, not as data.source
  EXPECT_TRUE(throws_with([&] { open_training_data(job((dir_ / "none.jsonl").string() + "=1"), t, 258, 1); },
                          "`data.mix` entry `" + (dir_ / "none.jsonl").string() + "`: no file or folder of that name"));
  EXPECT_FALSE(throws_with([&] { open_training_data(job((dir_ / "none.jsonl").string() + "=1"), t, 258, 1); },
                           "`data.source`"));
  JobConfig sft = job((dir_ / "a.tok").string() + "=1");
  sft.data.format = "sft";  // data.format applies to every source: a token file is no JSONL of examples
  EXPECT_TRUE(throws_with([&] { open_training_data(sft, t, 258, 1); }, "`data.mix` source `" + (dir_ / "a.tok").string()));
}

// Fine-tuning examples are read in order, epoch after epoch: in a mix each source's k-th draw
// (in the global order of steps, micro-batches and sequences) is its own training sequence k,
// so every source goes through its epochs whole. Ranks still read the global batch's rows, and
// a run that starts at a later step (a resume) reads what a run from step 1 reads there.
TEST_F(DataMix, FineTuningExamplesComeEachInTheirOwnOrder) {
  auto examples = [&](const std::string& name, char letter, int n) {
    std::string s;
    for (int i = 0; i < n; ++i)
      s += "{\"prompt\": \"" + std::string(1, letter) + std::to_string(i) + "\", \"response\": \"" +
           std::string(static_cast<size_t>(3 + i % 5), letter) + "\"}\n";
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << s;
    return path;
  };
  const std::string a = examples("a.jsonl", 'a', 40), b = examples("b.jsonl", 'b', 40);
  JobConfig c = job(a + "=3, " + b + "=1");
  c.data.format = "sft";
  c.data.packing = false;  // one example a sequence
  c.training.seq_len = 16;
  c.training.batch_size = 10;
  c.training.grad_accum_steps = 2;
  data::ByteTokenizer t;
  const auto mixed = open_training_data(c, t, t.vocab_size(), 1);
  c.data.packing = true;  // packed examples attend only to themselves, whatever data.source says
  EXPECT_TRUE(resolve_document_mask(c.data));
  c.data.packing = false;
  EXPECT_FALSE(resolve_document_mask(job(a + "=1").data));
  std::map<char, std::unique_ptr<data::TrainingData>> alone;
  for (const auto& [letter, path] : std::map<char, std::string>{{'a', a}, {'b', b}}) {
    JobConfig one = c;
    one.data.mix.clear();
    one.data.source = path;
    alone[letter] = open_training_data(one, t, t.vocab_size(), 1);
    ASSERT_TRUE(alone[letter]->in_order());
  }
  const int64_t B = 10, T = 16;
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  Tensor want = Tensor::empty({1, T}, DType::kI32), want_targets = Tensor::empty({1, T}, DType::kI32);
  std::map<char, int64_t> next;  // each source's sequence that its next draw must read
  int64_t ignored = 0;
  for (int64_t step = 1; step <= 20; ++step)
    for (int64_t micro = 0; micro < 2; ++micro) {
      mixed->fill_train(ids, targets, step, micro, 0);
      for (int64_t r = 0; r < B; ++r) {
        const char s = source_of(ids, r);
        ASSERT_TRUE(s == 'a' || s == 'b') << "step " << step << " row " << r;
        alone[s]->fill_sequence(want, want_targets, next[s]++);
        for (int64_t k = 0; k < T; ++k) {
          ASSERT_EQ(ids.data<int32_t>()[r * T + k], want.data<int32_t>()[k]) << s << " draw " << next[s] - 1;
          ASSERT_EQ(targets.data<int32_t>()[r * T + k], want_targets.data<int32_t>()[k]);
          ignored += targets.data<int32_t>()[r * T + k] == -100;
        }
      }
    }
  // 400 draws at 3:1 over 32 training examples each: several epochs of both
  EXPECT_NEAR(next['a'] / 400.0, 0.75, 5 * std::sqrt(0.75 * 0.25 / 400));
  EXPECT_GT(next['b'], 64);
  EXPECT_GT(ignored, 0);  // prompts and padding do not count

  // two ranks of 5 sequences read the global batch's rows, in a run that starts at step 15 (a
  // resume) as in one that came from step 1
  const auto resumed = open_training_data(c, t, t.vocab_size(), 1);
  expect_ranks_read_the_global_batch(*mixed, *resumed, B, 5, T, 15, 1);
}

}  // namespace
}  // namespace shardtrain::train
