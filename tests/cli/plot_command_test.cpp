// `shardtrain plot` on a run's folder or metrics file, its errors, and the loss curve a
// training run prints at its end.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "testing/shardtrain_binary.h"

namespace {

namespace fs = std::filesystem;

using Result = shardtrain::testing::CommandResult;

Result run(const std::string& args) { return shardtrain::testing::run_shardtrain(args); }

int count(const std::string& text, const std::string& piece) {
  int n = 0;
  for (size_t at = text.find(piece); at != std::string::npos; at = text.find(piece, at + 1)) ++n;
  return n;
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class PlotCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardtrain_plot_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "run");
    std::ofstream m(dir_ / "run" / "metrics.jsonl");
    for (int step = 1; step <= 5; ++step)
      m << "{\"step\":" << step << ",\"loss\":" << 4.0 - 0.5 * step << ",\"lr\":" << 1e-3
        << ",\"grad_norm\":" << 0.5 * step << ",\"tokens_per_second\":" << 900 + step << "}\n";
    m << "{\"step\":5,\"eval_loss\":2.0}\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(PlotCommand, WritesLossSvgBesideTheMetrics) {
  const Result r = run("plot " + (dir_ / "run").string());
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path svg = dir_ / "run" / "loss.svg";
  EXPECT_EQ(r.output, "plot: wrote " + svg.string() + " (16 points from " + (dir_ / "run" / "metrics.jsonl").string() +
                          ")\n");
  const std::string text = read(svg);
  EXPECT_EQ(count(text, "<polyline "), 4) << text;
  EXPECT_NE(text.find(">" + (dir_ / "run").string() + "</text>"), std::string::npos) << "titled with the run's folder";
  EXPECT_EQ(text.substr(text.size() - 7), "</svg>\n");
}

TEST_F(PlotCommand, TakesTheFileAnOutputAndMetrics) {
  const fs::path out = dir_ / "chart.svg";
  const Result r = run("plot " + (dir_ / "run" / "metrics.jsonl").string() + " --out " + out.string() +
                       " --metrics loss,grad_norm,tokens_per_s");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.rfind("plot: wrote " + out.string() + " (15 points", 0), 0u) << r.output;
  const std::string text = read(out);
  EXPECT_EQ(count(text, "<polyline "), 3) << text;
  EXPECT_NE(text.find("data-series=\"grad_norm\""), std::string::npos);
  EXPECT_NE(text.find("data-series=\"tokens_per_second\""), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "run" / "loss.svg"));
}

TEST_F(PlotCommand, ErrorsNameTheFileLineOrOption) {
  const fs::path empty_run = dir_ / "empty_run";
  fs::create_directories(empty_run);
  Result r = run("plot " + empty_run.string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("error: metrics file `" + (empty_run / "metrics.jsonl").string() +
                          "`: cannot be opened (not found)"),
            std::string::npos)
      << r.output;

  std::ofstream(empty_run / "metrics.jsonl") << "";
  r = run("plot " + empty_run.string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("` is empty: it holds no records yet"), std::string::npos) << r.output;


  r = run("plot " + (dir_ / "run").string() + " --metrics loss,grad_nrom");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("error: metrics file `" + (dir_ / "run" / "metrics.jsonl").string() +
                          "` has no metric `grad_nrom`; it has eval_loss, grad_norm, loss, lr, tokens_per_second"),
            std::string::npos)
      << r.output;
  r = run("plot");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("plot: expected one RUN_DIR"), std::string::npos) << r.output;
  r = run("plot a b");
  EXPECT_NE(r.output.find("(`b` is extra)"), std::string::npos) << r.output;
  r = run("plot a --colour red");
  EXPECT_NE(r.output.find("plot: unknown option `--colour`"), std::string::npos) << r.output;
  r = run("plot a --out");
  EXPECT_NE(r.output.find("plot: --out needs a value"), std::string::npos) << r.output;
  r = run("plot " + (dir_ / "run").string() + " --out " + (dir_ / "no_folder" / "x.svg").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("plot: cannot create `" + (dir_ / "no_folder" / "x.svg").string() + "` (--out)"),
            std::string::npos)
      << r.output;

  std::ofstream(dir_ / "run" / "metrics.jsonl", std::ios::app) << "{\"step\":6,\"loss\":1.0,\n";
  r = run("plot " + (dir_ / "run").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("error: metrics file `" + (dir_ / "run" / "metrics.jsonl").string() +
                          "` line 7: expected a JSON object, found `{\"step\":6,\"loss\":1.0,`"),
            std::string::npos)
      << r.output;
}

// The metrics a real run writes plot, and the run ends its log with the curve of its loss
// (not for fewer than 3 steps).
TEST_F(PlotCommand, ATrainingRunEndsWithItsCurveAndPlots) {
  const std::string job = "train --model.dim=40 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2 "
                          "--model.ffn_dim=52 --model.max_seq_len=32 --training.seq_len=16 --training.batch_size=2 "
                          "--training.device=cpu --eval.batches=1 --sample.tokens=0 --logging.progress=off "
                          "--checkpoint.interval_steps=0 --run.output_dir " + (dir_ / "trained").string();
  const Result r = run(job + " --training.steps 6");
  ASSERT_EQ(r.status, 0) << r.output;
  const size_t done = r.output.find("done: 6 steps");
  const size_t curve = r.output.find("loss by step\n");
  ASSERT_NE(curve, std::string::npos) << r.output;
  EXPECT_GT(curve, done) << "after the summary line";
  EXPECT_NE(r.output.find("\xE2\xA0", curve), std::string::npos) << "braille dots";
  EXPECT_NE(r.output.find("1" + std::string(60 - 2, ' ') + "6\n", curve), std::string::npos) << r.output;

  const Result p = run("plot " + (dir_ / "trained").string());
  ASSERT_EQ(p.status, 0) << p.output;
  const std::string text = read(dir_ / "trained" / "loss.svg");
  EXPECT_NE(text.find("data-series=\"loss\""), std::string::npos);

  const Result two = run(job + " --training.steps 2 --run.output_dir " + (dir_ / "two").string());
  ASSERT_EQ(two.status, 0) << two.output;
  EXPECT_EQ(two.output.find("loss by step"), std::string::npos) << two.output;
}

}  // namespace
