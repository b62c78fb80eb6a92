// `shardtrain bench` (the step timed on random tokens, no files written) and `shardtrain cache`
// (the token caches listed and pruned).
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "testing/shardtrain_binary.h"
#include "testing/shared_data.h"

using Result = shardtrain::testing::CommandResult;
using shardtrain::testing::run_shardtrain;

namespace {

TEST(Cli, BenchReportsTheStepAndWritesNothing) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_bench_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "hf");
  fs::copy_file(shardtrain::testing::source_dir() + "/tests/model/hf_reference/gqa4_llama3_rope/config.json",
                dir / "hf" / "config.json");
  const std::string json = (dir / "bench.json").string();
  const Result r =
      run_shardtrain("bench --steps 3 --warmup 2 --model.n_layers=2 --data.source=/nonexistent/corpus.jsonl "
                     "--checkpoint.interval_steps=1 --export.folder=" +
                     (dir / "export").string() + " --run.output_dir=" + (dir / "run").string() + " --json " + json);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("random tokens, uniform over a vocabulary of 258"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step     5/5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\nready in "), std::string::npos) << "the launch's time: " << r.output;
  EXPECT_NE(r.output.find("(after 2 warm-up steps)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mean of 3 steps after 2 warm-up"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  batch        1024 tokens per step (8 x 128 tokens x 1 micro-batch)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("forward"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("eval "), std::string::npos) << "a bench evaluates nothing: " << r.output;
  EXPECT_EQ(r.output.find("checkpoint "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("--- sample ---"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "run"));
  EXPECT_FALSE(fs::exists(dir / "export"));
  std::ifstream in(json);
  std::stringstream text;
  text << in.rdbuf();
  const std::string j = text.str();
  EXPECT_NE(j.find("\"timed_steps\": 3"), std::string::npos) << j;
  EXPECT_NE(j.find("\"tokens_per_step\": 1024"), std::string::npos) << j;
  EXPECT_NE(j.find("\"tokens_per_second\": "), std::string::npos) << j;

  // a Hugging Face folder with only its config.json: the shape, random weights
  const Result hf =
      run_shardtrain("bench --steps 1 --warmup 1 --training.seq_len=32 --model.hf=" + (dir / "hf").string());
  ASSERT_EQ(hf.status, 0) << hf.output;
  EXPECT_NE(hf.output.find("its weights random (not read)"), std::string::npos) << hf.output;
  EXPECT_NE(hf.output.find("2 layers, dim 24, 4 heads / 1 kv heads (head dim 6), ffn 40, vocab 67"), std::string::npos)
      << hf.output;
  EXPECT_NE(run_shardtrain("train --training.steps=1 --training.seq_len=32 --model.hf=" + (dir / "hf").string()).status,
            0)
      << "training needs the folder's tokenizer and weights";

  // a sweep: every combination in turn, one that fails noted and the rest run, one table
  const std::string sweep_json = (dir / "sweep.json").string();
  const Result sweep = run_shardtrain("bench --steps 1 --warmup 1 --model.n_layers=1 --sweep training.batch_size=2,4 "
                                      "--sweep training.offload_activations=false,true --json " +
                                      sweep_json);
  ASSERT_EQ(sweep.status, 0) << sweep.output;
  EXPECT_NE(sweep.output.find("bench [4/4]: training.batch_size=4 training.offload_activations=true"),
            std::string::npos)
      << sweep.output;
  EXPECT_NE(sweep.output.find("| settings | tokens/s | MFU | ms per step |"), std::string::npos) << sweep.output;
  EXPECT_NE(sweep.output.find("| training.batch_size=2 training.offload_activations=false | "), std::string::npos)
      << sweep.output;
  EXPECT_NE(sweep.output.find("| training.batch_size=4 training.offload_activations=true | failed: "),
            std::string::npos)
      << sweep.output;
  {
    std::ifstream sin(sweep_json);
    const nlohmann::json rows = nlohmann::json::parse(sin);
    ASSERT_EQ(rows.size(), 4u);
    EXPECT_EQ(rows[0].at("settings"), "training.batch_size=2 training.offload_activations=false");
    EXPECT_EQ(rows[0].at("tokens_per_step"), 256.0);
    EXPECT_EQ(rows[2].at("tokens_per_step"), 512.0);
    EXPECT_NE(rows[1].at("error").get<std::string>().find("training.offload_activations"), std::string::npos);
    EXPECT_FALSE(rows[2].contains("error"));
  }
  const Result bad_sweep = run_shardtrain("bench --steps 1 --sweep model.widht=1,2");
  EXPECT_EQ(bad_sweep.status, 1);
  EXPECT_NE(bad_sweep.output.find("unknown config key `model.widht`"), std::string::npos) << bad_sweep.output;
  EXPECT_EQ(bad_sweep.output.find("bench [1/2]"), std::string::npos) << "settings are checked before any run";

  const Result none = run_shardtrain("bench --steps 0");
  EXPECT_EQ(none.status, 1);
  EXPECT_NE(none.output.find("--steps must be at least 1, found 0"), std::string::npos) << none.output;
  EXPECT_NE(run_shardtrain("bench --warmup 0").output.find("--warmup must be at least 1"), std::string::npos);
  EXPECT_NE(run_shardtrain("bench --steps x").output.find("--steps takes an integer, found `x`"), std::string::npos);
  fs::remove_all(dir);
}

// bench --calibration profiles the timed steps and writes the rates plan --calibration reads:
// a CPU run's figures (no "gpu", since the CPU is not a GPU of plan's table) move plan's time.
TEST(Cli, BenchWritesACalibrationThatPlanReads) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_calibration_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string file = (dir / "rates.json").string();
  const Result r = run_shardtrain("bench --steps 2 --warmup 1 --model.n_layers=1 --training.seq_len=64 --calibration " +
                                  file);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("bench: wrote the profiled rates to " + file), std::string::npos) << r.output;
  std::ifstream in(file);
  const nlohmann::json rates = nlohmann::json::parse(in);
  EXPECT_FALSE(rates.contains("gpu")) << rates.dump();
  for (const char* field : {"matmul_bf16_tflops", "attention_forward_tflops", "attention_backward_tflops",
                            "memory_gbps"})
    EXPECT_GT(rates.value(field, 0.0), 0.0) << field << " in " << rates.dump();
  EXPECT_EQ(rates.at("attention_seq_len"), 64);
  // a CPU's products are far slower than an H100's: the predicted step grows
  const std::string plan = "plan --gpu h100-sxm --model.n_layers=2 --training.device=cuda --training.seq_len=256";
  const Result by_default = run_shardtrain(plan);
  const Result calibrated = run_shardtrain(plan + " --calibration " + file);
  ASSERT_EQ(by_default.status, 0) << by_default.output;
  ASSERT_EQ(calibrated.status, 0) << calibrated.output;
  EXPECT_NE(calibrated.output.find("--calibration " + file + " over the defaults of the h100-sxm"), std::string::npos)
      << calibrated.output;
  // "  step    0.000108 s per step" or "18 min 34 s per step": the seconds
  auto step_s = [](const std::string& out) {
    const size_t at = out.find("\n  step ");
    const size_t per = out.find(" per step", at);
    if (at == std::string::npos || per == std::string::npos) return -1.0;
    std::istringstream parts(out.substr(at + 8, per - at - 8));
    const std::map<std::string, double> units = {{"ms", 1e-3}, {"s", 1}, {"min", 60}, {"h", 3600}, {"d", 86400}};
    double seconds = 0, amount = 0;
    std::string unit;
    while (parts >> amount >> unit) {
      if (!units.count(unit)) return -1.0;
      seconds += amount * units.at(unit);
    }
    return seconds;
  };
  EXPECT_GT(step_s(by_default.output), 0.0) << by_default.output;
  EXPECT_GT(step_s(calibrated.output), 10 * step_s(by_default.output)) << calibrated.output;
  const Result sweep = run_shardtrain("bench --steps 1 --calibration " + file + " --sweep training.batch_size=1,2");
  EXPECT_EQ(sweep.status, 1);
  EXPECT_NE(sweep.output.find("--calibration profiles one job; give it without --sweep"), std::string::npos)
      << sweep.output;
  fs::remove_all(dir);
}

// `cache` lists a token cache a launch made, calls it stale once its source changes, and
// prune removes it (after a dry run that removes nothing); a running build stays.
TEST(Cli, CacheListsAndPrunesTheTokenCaches) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_cache_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string cache = (dir / "cache").string();
  const Result none = run_shardtrain("cache --dir " + cache);
  ASSERT_EQ(none.status, 0) << none.output;
  EXPECT_NE(none.output.find("no token caches in " + cache), std::string::npos) << none.output;
  {
    std::ofstream out(dir / "corpus.txt");
    for (int i = 0; i < 3000; ++i) out << "document " << i << " of the corpus\n\n";
  }
  const Result train = run_shardtrain("train --data.source=" + (dir / "corpus.txt").string() +
                                      " --data.token_cache=on --data.cache_dir=" + cache +
                                      " --training.steps=0 --eval.batches=1 --sample.tokens=0");
  ASSERT_EQ(train.status, 0) << train.output;
  fs::create_directories(dir / "cache" / ("corpus-0123456789abcdef.tmp-" + std::string("elsewhere.example") + "-42"));
  const Result listed = run_shardtrain("cache list --dir " + cache);
  ASSERT_EQ(listed.status, 0) << listed.output;
  EXPECT_NE(listed.output.find("token caches in " + cache + ": 2 folders"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find("current"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find("used now"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find("3000 documents"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find("on the machine `elsewhere.example`"), std::string::npos) << listed.output;
  EXPECT_EQ(listed.output.find("cache prune` removes"), std::string::npos) << "nothing to prune yet";

  std::ofstream(dir / "corpus.txt", std::ios::app) << "one more\n";
  const Result stale = run_shardtrain("cache --dir " + cache);
  EXPECT_NE(stale.output.find("stale"), std::string::npos) << stale.output;
  EXPECT_NE(stale.output.find("corpus.txt` changed after the build"), std::string::npos) << stale.output;
  EXPECT_NE(stale.output.find("`shardtrain cache prune` removes the 1 folder stale"), std::string::npos)
      << stale.output;
  const Result dry = run_shardtrain("cache prune --dry-run --dir " + cache);
  ASSERT_EQ(dry.status, 0) << dry.output;
  EXPECT_NE(dry.output.find("would remove 1 of 2 folders"), std::string::npos) << dry.output;
  EXPECT_EQ(run_shardtrain("cache --dir " + cache).output, stale.output);
  const Result pruned = run_shardtrain("cache prune --dir " + cache);
  ASSERT_EQ(pruned.status, 0) << pruned.output;
  EXPECT_NE(pruned.output.find("removed 1 of 2 folders"), std::string::npos) << pruned.output;
  const Result rest = run_shardtrain("cache --dir " + cache);
  EXPECT_NE(rest.output.find(": 1 folder, "), std::string::npos) << rest.output;
  EXPECT_EQ(rest.output.find("stale"), std::string::npos) << rest.output;
  const Result all = run_shardtrain("cache prune --all --dir " + cache);
  EXPECT_NE(all.output.find("removed 1 of 1 folder, "), std::string::npos) << all.output;
  EXPECT_TRUE(fs::is_empty(cache));

  const Result misplaced = run_shardtrain("cache --all --dir " + cache);
  EXPECT_EQ(misplaced.status, 1);
  EXPECT_NE(misplaced.output.find("go with `cache prune`"), std::string::npos) << misplaced.output;
  const Result days = run_shardtrain("cache prune --unused-days soon --dir " + cache);
  EXPECT_EQ(days.status, 1);
  EXPECT_NE(days.output.find("--unused-days takes a number, found `soon`"), std::string::npos) << days.output;
  EXPECT_EQ(run_shardtrain("cache purge").status, 1);
  fs::remove_all(dir);
}

}  // namespace
