// The default job, shortened: the loss must fall by a clear margin on the built-in corpus,
// metrics must be written, and a run must be reproducible.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "train/trainer.h"

namespace shardtrain::train {
namespace {

JobConfig short_default_job(const std::string& out_dir) {
  // The default job's shape and data, with fewer steps and a smaller width so it runs in
  // seconds on 2 cores.
  LoadedConfig c = load_config("", {"--model.dim=128", "--model.n_layers=2", "--model.ffn_dim=384",
                                    "--training.steps=60", "--training.seq_len=64", "--schedule.warmup_steps=10",
                                    "--eval.interval_steps=0", "--eval.batches=4", "--sample.tokens=40",
                                    "--run.output_dir=" + out_dir, "--logging.progress=off", "--training.device=cpu",
                                    "--logging.interval_steps=20"});
  return c.config;
}

TEST(Trainer, DefaultJobShortenedLearns) {
  const std::string out = (std::filesystem::temp_directory_path() / ("shardtrain_trainer_test_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(out);
  Trainer trainer(short_default_job(out));
  const TrainSummary s = trainer.run();
  ASSERT_EQ(s.steps.size(), 60u);
  const double first = s.steps.front().loss;
  double last10 = 0;
  for (size_t i = 50; i < 60; ++i) last10 += s.steps[i].loss / 10;
  // A byte-level model starts near ln(258) = 5.55 nats and learns byte frequencies and
  // common words within tens of steps; require a drop of over 2 nats.
  EXPECT_NEAR(first, std::log(258.0), 0.3);
  EXPECT_LT(last10, first - 2.0) << "first " << first << " last-10 mean " << last10;
  ASSERT_EQ(s.evals.size(), 1u);
  EXPECT_LT(s.evals.back().second, first - 2.0);
  EXPECT_FALSE(s.sample.empty());

  std::ifstream metrics(out + "/metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) {
    if (++lines == 1) {
      for (const char* k : {"\"loss\"", "\"lr\"", "\"grad_norm\"", "\"tokens_per_second\"", "\"time_forward_s\"",
                            "\"time_backward_s\"", "\"time_optimizer_s\"", "\"peak_host_bytes\""}) {
        EXPECT_NE(line.find(k), std::string::npos) << k << " missing from " << line;
      }
    }
  }
  EXPECT_EQ(lines, 61);  // 60 steps + 1 evaluation
}

TEST(Trainer, RunsAreReproducible) {
  const std::string out = (std::filesystem::temp_directory_path() / ("shardtrain_trainer_repro_" + std::to_string(::getpid()))).string();
  JobConfig c = short_default_job(out);
  c.training.steps = 3;
  c.schedule.warmup_steps = 1;
  c.sample.tokens = 0;
  c.training.grad_accum_steps = 2;
  const TrainSummary a = Trainer(c).run();
  const TrainSummary b = Trainer(c).run();
  for (size_t i = 0; i < a.steps.size(); ++i) EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "step " << i + 1;
}

// Evaluation runs at least at the end: a held-out split smaller than one batch is refused
// before training, not after it (when the last checkpoint would not be written yet).
TEST(Trainer, HeldOutSplitTooSmallForOneBatchIsAnErrorBeforeTraining) {
  const std::string out = (std::filesystem::temp_directory_path() / ("shardtrain_trainer_val_" + std::to_string(::getpid()))).string();
  JobConfig c = short_default_job(out);
  c.training.batch_size = 100000;  // 6.4M tokens per batch: far more than the held-out fortunes
  try {
    Trainer t(c);
    ADD_FAILURE() << "a held-out split smaller than one batch was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the held-out split has"), std::string::npos) << m;
    EXPECT_NE(m.find("fewer than one evaluation batch (1 rank(s) x `training.batch_size` 100000 x `training.seq_len` 64, "
                     "+ 1 = 6400001)"),
              std::string::npos)
        << m;
  }
}


// parallel.offload moves a GPU's shards to host memory; on the CPU it is refused by name.
// A GPU-only setting on a CPU run: the trainer refuses it at construction, naming the key.
void expect_rejected_on_the_cpu(const char* key, void (*set)(JobConfig&)) {
  SCOPED_TRACE(key);
  const std::string out =
      (std::filesystem::temp_directory_path() / ("shardtrain_trainer_gpu_only_" + std::to_string(::getpid()))).string();
  JobConfig c = short_default_job(out);
  c.training.device = "cpu";
  set(c);
  try {
    Trainer t(c);
    ADD_FAILURE() << key << " was accepted on the CPU";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(std::string("`") + key + "` = true"), std::string::npos) << m;
    EXPECT_NE(m.find("trains on the CPU"), std::string::npos) << m;
  }
}

TEST(Trainer, OffloadOnTheCpuIsAnError) {
  expect_rejected_on_the_cpu("parallel.offload", [](JobConfig& c) { c.parallel.offload = true; });
  expect_rejected_on_the_cpu("training.offload_activations",
                             [](JobConfig& c) { c.training.offload_activations = true; });
}

TEST(Trainer, GradientsOnTheGpuNeedOffload) {
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("shardtrain_trainer_offload_grads_" + std::to_string(::getpid()))).string();
  JobConfig c = short_default_job(out);
  c.training.device = "cpu";
  c.parallel.offload_gradients = false;
  try {
    Trainer t(c);
    ADD_FAILURE() << "parallel.offload_gradients = false was accepted without parallel.offload";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("`parallel.offload_gradients` = false"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardtrain::train
