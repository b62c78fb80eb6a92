// The `shardtrain` command: exit codes and messages for bad input, `version` and `help`. The
// commands' own tests are in tests/cli/*_command_test.cpp and train_signals_test.cpp.
#include <string>

#include <gtest/gtest.h>

#include "testing/shardtrain_binary.h"
#include "testing/shared_data.h"

namespace {

using Result = shardtrain::testing::CommandResult;
using shardtrain::testing::run_shardtrain;

TEST(Cli, UnknownKeyFailsNamingIt) {
  const Result r = run_shardtrain("train --model.widht=3");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("error: override `--model.widht=3`: unknown config key `model.widht`"), std::string::npos)
      << r.output;
}

TEST(Cli, ImpossibleShapeFails) {
  const Result r = run_shardtrain("train --model.n_heads=7");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("`model.n_heads` (7) must divide `model.dim` (256)"), std::string::npos) << r.output;
}

TEST(Cli, MissingConfigFileFails) {
  const Result r = run_shardtrain("train /nonexistent/job.toml");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("/nonexistent/job.toml"), std::string::npos) << r.output;
}

// `version`: the commit the binary was built from, the same one the git checkout is at (or
// "unknown" outside one), its backends and the host; --version is the same.
TEST(Cli, VersionNamesTheCommitAndTheBuild) {
  const Result v = run_shardtrain("version");
  ASSERT_EQ(v.status, 0) << v.output;
  ASSERT_EQ(v.output.rfind("shardtrain ", 0), 0u) << v.output;
  const std::string commit = v.output.substr(11, v.output.find('\n') - 11);
  const Result head = shardtrain::testing::run_command("git -C " + shardtrain::testing::source_dir() +
                                                       " rev-parse --short=12 HEAD 2>/dev/null");
  if (head.status == 0 && !head.output.empty())
    EXPECT_EQ(commit.substr(0, 12), head.output.substr(0, 12)) << "built from another commit than the checkout's?";
  else
    EXPECT_EQ(commit.rfind("unknown", 0), 0u) << commit;
  EXPECT_NE(v.output.find("\n  build: "), std::string::npos) << v.output;
  EXPECT_NE(v.output.find("\n  host: "), std::string::npos) << v.output;
  EXPECT_NE(v.output.find(" cores, "), std::string::npos) << v.output;
  EXPECT_EQ(run_shardtrain("--version").output, v.output);
  EXPECT_EQ(run_shardtrain("version extra").status, 1);
}

TEST(Cli, UnknownCommandAndHelp) {
  EXPECT_EQ(run_shardtrain("trian").status, 2);
  const Result h = run_shardtrain("help");
  EXPECT_EQ(h.status, 0);
  EXPECT_NE(h.output.find("print-config"), std::string::npos);
  const Result p = run_shardtrain("print-config --training.steps=5");
  EXPECT_EQ(p.status, 0);
  EXPECT_NE(p.output.find("steps = 5  # override"), std::string::npos) << p.output;
}

}  // namespace
