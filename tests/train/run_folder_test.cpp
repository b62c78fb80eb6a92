// Run folders remember their run: config.toml, train.log, metrics and sample.txt beside the
// checkpoints, each of which holds its config; `checkpoint.resume = auto` goes on with that
// config and no retyping (the same losses as a straight run), names what a command changes and
// refuses changes to the model or the data; a folder holding another run is refused unless the
// run resumes it or starts over.
#include "train/run_folder.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>

#include "train/config.h"
#include "train/trainer.h"

namespace shardtrain::train {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("shardtrain_runfolder_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string corpus(const std::string& dir) {
  const std::string path = dir + "/corpus.txt";
  std::ofstream out(path);
  for (int i = 0; i < 200; ++i) out << "A run folder keeps run " << i << " and its settings " << i % 5 << ".\n\n";
  return path;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A job with settings far from the defaults, so that a resume that fell back to a default
// would show.
std::vector<std::string> job_args(const std::string& dir, int steps) {
  return {"--model.dim=40", "--model.n_layers=2", "--model.n_heads=4", "--model.n_kv_heads=2", "--model.ffn_dim=52",
          "--model.max_seq_len=32", "--training.seq_len=24", "--training.batch_size=3",
          "--training.steps=" + std::to_string(steps), "--training.device=cpu", "--schedule.warmup_steps=2",
          "--optimizer.lr=3e-3", "--eval.interval_steps=0", "--eval.batches=1", "--sample.tokens=8",
          "--logging.progress=off", "--logging.interval_steps=1", "--checkpoint.interval_steps=2",
          "--data.source=" + corpus(dir), "--data.val_fraction=0.1", "--run.output_dir=" + dir + "/run"};
}

// The config a run writes reads back as the same config, quotes, backslashes and the last bits
// of a float included.
TEST(RunFolder, ConfigTomlReadsBackAsTheSameConfig) {
  const std::string dir = fresh_dir("toml");
  const LoadedConfig a = load_config("", {"--optimizer.lr=0.000123456789012345", "--sample.prompt=say \"hi\" \\ now",
                                          "--training.time_limit=1h", "--model.norm_eps=1e-06"});
  std::ofstream(dir + "/config.toml") << config_toml(a.config);
  const LoadedConfig b = load_config(dir + "/config.toml", {});
  EXPECT_TRUE(changed_keys(a.config, b.config).empty());
  EXPECT_EQ(b.config.sample.prompt, "say \"hi\" \\ now");
  EXPECT_EQ(b.config.optimizer.lr, 0.000123456789012345);
}

TEST(RunFolder, ARunKeepsItsConfigLogMetricsAndSampleAndEachCheckpointItsConfig) {
  const std::string dir = fresh_dir("keeps");
  const LoadedConfig c = load_config("", job_args(dir, 4));
  Trainer(c.config).run();
  const std::string run = dir + "/run";
  for (const char* f : {"config.toml", "train.log", "metrics.jsonl", "sample.txt"})
    EXPECT_TRUE(fs::is_regular_file(run + "/" + f)) << f;
  EXPECT_TRUE(changed_keys(c.config, load_config(run + "/config.toml", {}).config).empty());
  EXPECT_TRUE(changed_keys(c.config, load_config(run + "/checkpoints/step_00000004/config.toml", {}).config).empty());
  EXPECT_NE(read(run + "/train.log").find("step     4"), std::string::npos) << read(run + "/train.log");
  EXPECT_FALSE(read(run + "/sample.txt").empty());
}

// Resumed with only its folder and a checkpoint, the run goes on with its own settings, not the
// defaults: the same losses as the straight run. A command's changes are listed.
TEST(RunFolder, ResumeNeedsNoRetyping) {
  const std::string dir = fresh_dir("retype");
  const TrainSummary straight = Trainer(load_config("", job_args(dir, 6)).config).run();
  ASSERT_EQ(straight.steps.size(), 6u);
  const std::string step4 = dir + "/run/checkpoints/step_00000004";
  const ResumedConfig r = resolve_resume(load_config("", {"--run.output_dir=" + dir + "/run",
                                                          "--checkpoint.resume=" + step4}));
  EXPECT_EQ(r.checkpoint, step4);
  EXPECT_EQ(r.loaded.config.model.dim, 40);
  EXPECT_EQ(r.loaded.config.optimizer.lr, 3e-3);
  EXPECT_EQ(r.loaded.config.training.steps, 6);
  EXPECT_EQ(r.loaded.config.data.source, dir + "/corpus.txt");
  EXPECT_TRUE(r.changes.empty());
  const TrainSummary resumed = Trainer(r.loaded.config).run();
  ASSERT_EQ(resumed.steps.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(resumed.steps[i].step, straight.steps[4 + i].step);
    EXPECT_EQ(resumed.steps[i].loss, straight.steps[4 + i].loss) << "step " << resumed.steps[i].step;
  }
  // `auto` finds the newest; a longer run and another learning rate are changes it names
  const ResumedConfig longer = resolve_resume(load_config(
      "", {"--run.output_dir=" + dir + "/run", "--checkpoint.resume=auto", "--training.steps=8", "--optimizer.lr=1e-3"}));
  EXPECT_EQ(longer.checkpoint, dir + "/run/checkpoints/step_00000006");
  ASSERT_EQ(longer.changes.size(), 2u);
  EXPECT_EQ(longer.changes[0].key, "training.steps");
  EXPECT_EQ(longer.changes[0].before, "6");
  EXPECT_EQ(longer.changes[0].after, "8");
  EXPECT_EQ(longer.changes[1].key, "optimizer.lr");
}

// A resume that would change the model or the data is refused, naming the key and both values.
TEST(RunFolder, AResumeMayNotChangeTheModelOrTheData) {
  const std::string dir = fresh_dir("fixed");
  Trainer(load_config("", job_args(dir, 2)).config).run();
  const std::string other = corpus(fresh_dir("fixed_other"));
  const std::string e = error_of([&] {
    resolve_resume(load_config("", {"--run.output_dir=" + dir + "/run", "--checkpoint.resume=auto",
                                    "--data.source=" + other, "--model.n_layers=3", "--optimizer.lr=1e-3"}));
  });
  EXPECT_NE(e.find("`model.n_layers` = 3 (the checkpoint's: 2)"), std::string::npos) << e;
  EXPECT_NE(e.find("`data.source` = \"" + other + "\" (the checkpoint's: \"" + dir + "/corpus.txt\")"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("optimizer.lr"), std::string::npos) << e;  // a learning rate may change
  EXPECT_TRUE(fixed_on_resume("model.rope_theta"));
  EXPECT_TRUE(fixed_on_resume("model.qk_norm"));
  EXPECT_FALSE(fixed_on_resume("optimizer.lr"));
  EXPECT_FALSE(fixed_on_resume("training.batch_size"));
}

// A new run in a folder that holds another run's checkpoints and metrics is refused, with the
// flags that resume it or start over; run.overwrite removes that run first.
TEST(RunFolder, AFolderHoldingAnotherRunIsRefusedUnlessResumedOrStartedOver) {
  const std::string dir = fresh_dir("another");
  const JobConfig c = load_config("", job_args(dir, 2)).config;
  Trainer(c).run();
  const std::string e = error_of([&] { Trainer t(c); });
  EXPECT_NE(e.find("`run.output_dir` = \"" + dir + "/run\" holds another run (checkpoints up to step_00000002"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--checkpoint.resume=auto"), std::string::npos) << e;
  EXPECT_NE(e.find("--run.overwrite=true"), std::string::npos) << e;
  EXPECT_TRUE(fs::exists(dir + "/run/checkpoints/step_00000002"));  // nothing touched

  JobConfig over = c;
  over.run.overwrite = true;
  over.training.steps = 1;
  over.checkpoint.interval_steps = 1;
  Trainer(over).run();
  EXPECT_FALSE(fs::exists(dir + "/run/checkpoints/step_00000002"));
  EXPECT_TRUE(fs::exists(dir + "/run/checkpoints/step_00000001"));
  EXPECT_NE(read(dir + "/run/train.log").find("run.overwrite: removed the earlier run"), std::string::npos);
  EXPECT_EQ(resume_command(over), "shardtrain train --run.output_dir=" + dir + "/run --checkpoint.resume=auto");
  JobConfig spaced = over;
  spaced.run.output_dir = "my runs/a";
  spaced.checkpoint.dir = "/ckpt";
  EXPECT_EQ(resume_command(spaced),
            "shardtrain train --run.output_dir='my runs/a' --checkpoint.dir=/ckpt --checkpoint.resume=auto");
}

}  // namespace
}  // namespace shardtrain::train
