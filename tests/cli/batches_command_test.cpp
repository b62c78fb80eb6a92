// `shardtrain batches`: the rows it writes are the ones the trainer draws (a global batch is the
// same however many ranks share it), targets are the next tokens, lr is the schedule's, the
// held-out batches are those evaluation reads, and the metadata says how to train alike.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "optim/schedule.h"
#include "testing/shardtrain_binary.h"

namespace {

namespace fs = std::filesystem;
using shardtrain::DType;
using shardtrain::Tensor;

using Result = shardtrain::testing::CommandResult;

Result run(const std::string& args) { return shardtrain::testing::run_shardtrain(args); }

class BatchesCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardtrain_batches_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// The built-in corpus, 7 steps of 2 micro-batches, cosine with warm-up, 3 held-out batches.
const std::string kJob =
    "--training.steps 7 --training.grad_accum_steps 2 --training.seq_len 32 --schedule.warmup_steps 2 "
    "--optimizer.lr 3e-3 --eval.batches 3 --eval.interval_steps 3 --eval.at_start true";

std::vector<int32_t> values(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return {p, p + t.numel()};
}

TEST_F(BatchesCommand, AGlobalBatchIsTheSameForAnyNumberOfRanks) {
  const Result one = run("batches " + kJob + " --training.batch_size 4 --out " + path("one.safetensors"));
  ASSERT_EQ(one.status, 0) << one.output;
  const Result two = run("batches " + kJob + " --training.batch_size 2 --ranks 2 --out " + path("two.safetensors"));
  ASSERT_EQ(two.status, 0) << two.output;
  EXPECT_NE(one.output.find("7 steps x 2 micro-batches x 4 sequences x 32 tokens, 3 held-out batches"),
            std::string::npos)
      << one.output;
  shardtrain::io::SafetensorsFile a(path("one.safetensors")), b(path("two.safetensors"));
  for (const char* name : {"train.ids", "train.targets", "eval.ids", "eval.targets"}) {
    const Tensor x = a.read_as(name, DType::kI32), y = b.read_as(name, DType::kI32);
    EXPECT_EQ(x.shape().str(), y.shape().str()) << name;
    EXPECT_EQ(values(x), values(y)) << name;
  }
  const Tensor ids = a.read_as("train.ids", DType::kI32);
  EXPECT_EQ(ids.shape().str(), "[7, 2, 4, 32]");
  EXPECT_EQ(a.read_as("eval.ids", DType::kI32).shape().str(), "[3, 4, 32]");
  for (const auto& t : a.tensors()) EXPECT_NE(t.name, "train.positions");  // no document mask here
}

TEST_F(BatchesCommand, TargetsAreTheNextTokensAndStepsDiffer) {
  ASSERT_EQ(run("batches " + kJob + " --training.batch_size 2 --out " + path("b.safetensors")).status, 0);
  shardtrain::io::SafetensorsFile f(path("b.safetensors"));
  const std::vector<int32_t> ids = values(f.read_as("train.ids", DType::kI32));
  const std::vector<int32_t> targets = values(f.read_as("train.targets", DType::kI32));
  const int T = 32;
  for (size_t row = 0; row < ids.size() / T; ++row)
    for (int t = 0; t + 1 < T; ++t) ASSERT_EQ(targets[row * T + t], ids[row * T + t + 1]) << "row " << row;
  // step 1's first sequence and step 2's are different windows
  EXPECT_NE(std::vector<int32_t>(ids.begin(), ids.begin() + T),
            std::vector<int32_t>(ids.begin() + 4 * T, ids.begin() + 5 * T));
}

TEST_F(BatchesCommand, TheScheduleAndTheRecipeAreWritten) {
  ASSERT_EQ(run("batches " + kJob + " --training.batch_size 2 --optimizer.weight_decay 0.05 --training.max_grad_norm "
                "0.5 --out " + path("b.safetensors")).status,
            0);
  shardtrain::io::SafetensorsFile f(path("b.safetensors"));
  const Tensor lr = f.read_as("lr", DType::kF64);
  ASSERT_EQ(lr.numel(), 7);
  shardtrain::optim::ScheduleConfig sc;
  sc.peak_lr = 3e-3;
  sc.warmup_steps = 2;
  sc.total_steps = 7;
  for (int s = 0; s < 7; ++s) EXPECT_DOUBLE_EQ(lr.data<double>()[s], shardtrain::optim::learning_rate(sc, s + 1));
  EXPECT_DOUBLE_EQ(lr.data<double>()[0], 1.5e-3);  // warm-up: step 1 of 2
  const nlohmann::json r = nlohmann::json::parse(f.metadata().at("recipe"));
  EXPECT_EQ(r["grad_accum_steps"], 2);
  EXPECT_EQ(r["ignore_index"], -100);
  EXPECT_EQ(r["eval_steps"], (std::vector<int>{0, 3, 6, 7}));
  EXPECT_DOUBLE_EQ(r["weight_decay"].get<double>(), 0.05);
  EXPECT_DOUBLE_EQ(r["max_grad_norm"].get<double>(), 0.5);
  EXPECT_NE(f.metadata().at("config").find("steps = 7"), std::string::npos);
}

TEST_F(BatchesCommand, FineTuningExamplesKeepTheirMaskAndPositions) {
  {
    std::FILE* f = std::fopen(path("sft.jsonl").c_str(), "w");
    for (int i = 0; i < 40; ++i)
      std::fprintf(f, "{\"prompt\": \"question %d?\", \"response\": \"answer number %d.\"}\n", i, i);
    std::fclose(f);
  }
  const Result r = run("batches --data.source " + path("sft.jsonl") +
                       " --data.format sft --training.steps 3 --training.batch_size 2 --training.seq_len 64 "
                       "--data.val_fraction 0.2 --out " + path("b.safetensors"));
  ASSERT_EQ(r.status, 0) << r.output;
  shardtrain::io::SafetensorsFile f(path("b.safetensors"));
  const std::vector<int32_t> targets = values(f.read_as("train.targets", DType::kI32));
  const std::vector<int32_t> positions = values(f.read_as("train.positions", DType::kI32));
  int masked = 0, counted = 0, starts = 0;
  for (int32_t t : targets) (t == -100 ? masked : counted) += 1;
  for (int32_t p : positions) starts += p == 0;
  EXPECT_GT(masked, 0);   // the prompts count no loss
  EXPECT_GT(counted, 0);  // the responses do
  EXPECT_GT(starts, 6);   // several examples packed in each of the 6 rows, positions from 0 in each
  EXPECT_TRUE(nlohmann::json::parse(f.metadata().at("recipe"))["document_mask"].get<bool>());
}

TEST_F(BatchesCommand, ErrorsNameWhatIsMissing) {
  const Result no_out = run("batches --training.steps 2");
  EXPECT_NE(no_out.status, 0);
  EXPECT_NE(no_out.output.find("--out FILE.safetensors is required"), std::string::npos) << no_out.output;
  const Result bad_ranks = run("batches --ranks 0 --out " + path("b.safetensors"));
  EXPECT_NE(bad_ranks.status, 0);
  EXPECT_NE(bad_ranks.output.find("--ranks must be in [1, 65536], found 0"), std::string::npos) << bad_ranks.output;
}

}  // namespace
