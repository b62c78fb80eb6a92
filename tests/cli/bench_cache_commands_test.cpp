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
