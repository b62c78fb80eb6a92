// Metrics sinks: a resumed run's JSONL file keeps what its checkpoint covers; TensorBoard event
// files read back through TensorBoard's own reader (PyPI `tensorboard`, installed by
// scripts/setup.sh --tests) with every scalar at its step, and a resumed run's file replaces
// the steps the earlier one repeated.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "train/metrics.h"

namespace shardtrain::train {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("shardtrain_metrics_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<nlohmann::json> read_lines(const fs::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(Metrics, Crc32cOfTheStandardCheckString) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(Metrics, AResumedRunKeepsTheStepsItsCheckpointCovers) {
  const fs::path dir = fresh_dir("jsonl");
  const std::string path = (dir / "metrics.jsonl").string();
  {
    JsonlSink first(path);
    for (int step = 1; step <= 9; ++step) first.write({{"step", step}, {"loss", 10.0 - step}});
    first.write({{"step", 5}, {"eval_loss", 4.5}});
  }
  {
    JsonlSink resumed(path, 7);  // resumed from the checkpoint of step 6
    resumed.write({{"step", 7}, {"loss", 0.5}});
  }
  const std::vector<nlohmann::json> lines = read_lines(path);
  ASSERT_EQ(lines.size(), 8u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(lines[static_cast<size_t>(i)]["step"], i + 1);
  EXPECT_EQ(lines[6]["eval_loss"], 4.5);
  EXPECT_EQ(lines[7]["loss"], 0.5);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  {
    JsonlSink fresh(path);  // a run from step 1 starts the file over
    fresh.write({{"step", 1}, {"loss", 3.0}});
  }
  EXPECT_EQ(read_lines(path).size(), 1u);
  fs::remove_all(dir);
}

bool have_tensorboard() {
  return std::system("python3 -c 'import tensorboard' > /dev/null 2>&1") == 0;
}

// The scalars TensorBoard reads from `dir`: {tag: [[step, value], ...]}.
nlohmann::json read_scalars(const fs::path& dir) {
  const fs::path script = dir.parent_path() / (dir.filename().string() + "_read.py");
  const fs::path out = dir.parent_path() / (dir.filename().string() + "_scalars.json");
  std::ofstream(script) << "import json, sys\n"
                           "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
                           "acc = EventAccumulator(sys.argv[1])\n"
                           "acc.Reload()\n"
                           "json.dump({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()['scalars']},\n"
                           "          open(sys.argv[2], 'w'))\n";
  const std::string command = "python3 " + script.string() + " " + dir.string() + " " + out.string();
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream in(out);
  return nlohmann::json::parse(in);
}

TEST(Metrics, TensorBoardReadsEveryScalarAtItsStep) {
  if (!have_tensorboard()) GTEST_SKIP() << "python3 cannot import tensorboard (scripts/setup.sh --tests installs it)";
  const fs::path dir = fresh_dir("tb");
  {
    TensorBoardSink sink(dir.string(), 1);
    ASSERT_NE(sink.path().find("events.out.tfevents."), std::string::npos) << sink.path();
    for (int step = 1; step <= 300; ++step)
      sink.write({{"step", step}, {"loss", 11.0 / step}, {"lr", 2e-3 * step / 300}, {"peak_device_bytes", 123456789}});
    sink.write({{"step", 300}, {"eval_loss", 2.25}});
    sink.write({{"step", 300}, {"note", "strings are left out"}});
  }
  const nlohmann::json scalars = read_scalars(dir);
  ASSERT_TRUE(scalars.contains("loss")) << scalars.dump();
  EXPECT_EQ(scalars.size(), 4u) << scalars.dump();
  ASSERT_EQ(scalars["loss"].size(), 300u);
  for (int step = 1; step <= 300; ++step) {
    const nlohmann::json& e = scalars["loss"][static_cast<size_t>(step - 1)];
    EXPECT_EQ(e[0], step);
    EXPECT_FLOAT_EQ(e[1].get<float>(), static_cast<float>(11.0 / step));
  }
  EXPECT_FLOAT_EQ(scalars["lr"][299][1].get<float>(), 2e-3f);
  EXPECT_FLOAT_EQ(scalars["peak_device_bytes"][0][1].get<float>(), 123456789.0f);
  EXPECT_EQ(scalars["eval_loss"], nlohmann::json::parse("[[300, 2.25]]"));
  fs::remove_all(dir);
}

TEST(Metrics, AResumedRunReplacesTheStepsTheEarlierFileRepeated) {
  if (!have_tensorboard()) GTEST_SKIP() << "python3 cannot import tensorboard (scripts/setup.sh --tests installs it)";
  const fs::path dir = fresh_dir("tb_resume");
  {
    TensorBoardSink first(dir.string(), 1);
    for (int step = 1; step <= 10; ++step) first.write({{"step", step}, {"loss", 1.0 * step}});
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // file names order by their second
  {
    TensorBoardSink resumed(dir.string(), 7);  // from the checkpoint of step 6
    for (int step = 7; step <= 8; ++step) resumed.write({{"step", step}, {"loss", 100.0 * step}});
  }
  const nlohmann::json loss = read_scalars(dir)["loss"];
  EXPECT_EQ(loss, nlohmann::json::parse("[[1, 1.0], [2, 2.0], [3, 3.0], [4, 4.0], [5, 5.0], [6, 6.0], "
                                        "[7, 700.0], [8, 800.0]]"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardtrain::train
