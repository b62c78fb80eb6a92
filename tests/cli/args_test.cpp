// The command line's shared arguments: a job's config file and overrides in both forms
// (--key=value, --key value), and the rank a launcher gives, which the log follows from the
// first line.
#include "cli/args.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "testing/shardtrain_binary.h"

namespace {

using shardtrain::cli::JobArgs;
using shardtrain::cli::parse_job_args;
using Args = std::vector<std::string>;

using Result = shardtrain::testing::CommandResult;

Result run(const std::string& command_line) { return shardtrain::testing::run_command(command_line + " 2>&1"); }

using shardtrain::testing::shardtrain_binary;

// The error parse_job_args throws for `args`, or "(none)".
std::string parse_error(const Args& args) {
  try {
    parse_job_args(args, "train");
  } catch (const shardtrain::Error& e) {
    return e.what();
  }
  return "(none)";
}

TEST(JobArgs, BothOverrideFormsGiveTheSameOverride) {
  const JobArgs spaced = parse_job_args({"--training.steps", "2", "--model.dim", "64"}, "train");
  EXPECT_EQ(spaced.config_file, "");
  EXPECT_EQ(spaced.overrides, (Args{"--training.steps=2", "--model.dim=64"}));
  const JobArgs joined = parse_job_args({"--training.steps=2", "--model.dim=64"}, "train");
  EXPECT_EQ(joined.overrides, spaced.overrides);
  const JobArgs mixed = parse_job_args({"job.toml", "--training.steps", "2", "--model.dim=64"}, "train");
  EXPECT_EQ(mixed.config_file, "job.toml");
  EXPECT_EQ(mixed.overrides, spaced.overrides);
  // a negative number is a value, not an option
  EXPECT_EQ(parse_job_args({"--schedule.warmup_steps", "-1"}, "train").overrides, (Args{"--schedule.warmup_steps=-1"}));
}

// A file path after a key that takes a value is the value, even when the file exists; the
// config file comes before or after.
TEST(JobArgs, AFilePathAfterAKeyIsItsValue) {
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("shardtrain_args_test_" + std::to_string(::getpid()) + ".txt");
  std::ofstream(file) << "some text\n";
  const JobArgs j = parse_job_args({"--data.source", file.string(), "job.toml"}, "train");
  EXPECT_EQ(j.config_file, "job.toml");
  EXPECT_EQ(j.overrides, (Args{"--data.source=" + file.string()}));
  const JobArgs k = parse_job_args({"job.toml", "--data.source", file.string()}, "train");
  EXPECT_EQ(k.config_file, "job.toml");
  EXPECT_EQ(k.overrides, j.overrides);

  // and through the binary: the override's value, shown by print-config
  const Result r = run(shardtrain_binary() + " print-config --data.source " + file.string() + " --training.steps 7");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("source = \"" + file.string() + "\"  # override"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("steps = 7  # override"), std::string::npos) << r.output;
  std::filesystem::remove(file);
}

// A boolean key alone is true; it takes the next argument only if that is true or false, so a
// config file after it stays the config file.
TEST(JobArgs, ABooleanKeyMayStandAlone) {
  const JobArgs alone = parse_job_args({"--training.deterministic", "job.toml"}, "train");
  EXPECT_EQ(alone.config_file, "job.toml");
  EXPECT_EQ(alone.overrides, (Args{"--training.deterministic=true"}));
  EXPECT_EQ(parse_job_args({"--training.deterministic", "false"}, "train").overrides,
            (Args{"--training.deterministic=false"}));
  EXPECT_EQ(parse_job_args({"--training.deterministic", "--training.steps", "3"}, "train").overrides,
            (Args{"--training.deterministic=true", "--training.steps=3"}));
  EXPECT_EQ(parse_job_args({"--training.deterministic"}, "train").overrides, (Args{"--training.deterministic=true"}));
}

TEST(JobArgs, AKeyWithoutItsValueIsNamed) {
  EXPECT_EQ(parse_error({"--training.steps"}),
            "train: `--training.steps` needs a value (--training.steps=VALUE or --training.steps VALUE), found "
            "nothing after it; a value that starts with `--` needs the `=` form");
  EXPECT_EQ(parse_error({"job.toml", "--training.steps", "--model.dim=64"}),
            "train: `--training.steps` needs a value (--training.steps=VALUE or --training.steps VALUE), found the "
            "option `--model.dim=64` after it; a value that starts with `--` needs the `=` form");
  EXPECT_EQ(parse_error({"-c"}), "train: -c needs a file name");
  EXPECT_EQ(parse_error({"a.toml", "b.toml"}),
            "train: unexpected argument `b.toml`: the config file is `a.toml` already (overrides look like "
            "--section.key=value or --section.key value)");
  // an unknown key fails at once, with the nearest one, rather than taking its value as the file
  const std::string unknown = parse_error({"--training.stesp", "2"});
  EXPECT_NE(unknown.find("train: `--training.stesp`: unknown config key `training.stesp`; did you mean "
                         "`training.steps`?"),
            std::string::npos)
      << unknown;

  const Result r = run(shardtrain_binary() + " train --training.steps");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("error: train: `--training.steps` needs a value"), std::string::npos) << r.output;
}

// launched_rank: the launcher's environment, read before any communicator exists.
class LaunchedRank : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars)
      if (const char* s = std::getenv(v)) saved_.emplace_back(v, s);
    for (const char* v : kVars) ::unsetenv(v);
  }
  void TearDown() override {
    for (const char* v : kVars) ::unsetenv(v);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  static constexpr const char* kVars[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                                          "RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"};
  std::vector<std::pair<std::string, std::string>> saved_;
};

TEST_F(LaunchedRank, FromEachLauncher) {
  EXPECT_EQ(shardtrain::cli::launched_rank().world, 1);
  const char* pairs[][2] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                            {"PMI_RANK", "PMI_SIZE"},
                            {"RANK", "WORLD_SIZE"},
                            {"SLURM_PROCID", "SLURM_NTASKS"}};
  for (const auto& [rank, world] : pairs) {
    ::setenv(rank, "3", 1);
    ::setenv(world, "4", 1);
    const shardtrain::cli::LaunchedRank r = shardtrain::cli::launched_rank();
    EXPECT_EQ(r.rank, 3) << rank;
    EXPECT_EQ(r.world, 4) << world;
    ::setenv(rank, "4", 1);  // out of range: not a launch to follow
    EXPECT_EQ(shardtrain::cli::launched_rank().world, 1) << rank;
    ::setenv(rank, "x", 1);
    EXPECT_EQ(shardtrain::cli::launched_rank().world, 1) << rank;
    ::unsetenv(rank);
    ::unsetenv(world);
  }
}

bool have_mpirun() { return std::system("command -v mpirun > /dev/null 2>&1") == 0; }

std::string mpirun(int ranks) {
  return "env OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader "
         "mpirun -np " + std::to_string(ranks) + " --oversubscribe " + shardtrain_binary();
}

int count(const std::string& text, const std::string& piece) {
  int n = 0;
  for (size_t at = text.find(piece); at != std::string::npos; at = text.find(piece, at + 1)) ++n;
  return n;
}

// Under mpirun a rank's error carries its rank. (mpirun may end the other rank before it
// prints its own, so one such line is enough.)
TEST(LaunchedRankLog, ErrorsCarryTheRank) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  const Result r = run(mpirun(2) + " train --model.widht=3");
  EXPECT_NE(r.status, 0);
  const std::string error = "error: override `--model.widht=3`: unknown config key";
  EXPECT_GE(count(r.output, "[rank 0] " + error) + count(r.output, "[rank 1] " + error), 1) << r.output;
  EXPECT_EQ(count(r.output, error), count(r.output, "] " + error)) << "no error without its rank:\n" << r.output;
}

// The startup lines (the banner, the config line) come once, from rank 0, even those logged
// before the communicator exists; another rank's info lines are not shown.
TEST(LaunchedRankLog, StartupLinesComeOnceFromRankZero) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  const std::string dir = (std::filesystem::temp_directory_path() / ("shardtrain_args_ranks_" + std::to_string(::getpid()))).string();
  const Result r = run(mpirun(2) +
                       " train --model.dim=40 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2 "
                       "--model.ffn_dim=52 --model.max_seq_len=32 --training.seq_len=16 --training.batch_size=2 "
                       "--training.steps=3 --training.device=cpu --eval.batches=1 --sample.tokens=0 "
                       "--logging.progress=off --checkpoint.interval_steps=0 --run.output_dir=" + dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "] shardtrain "), 1) << r.output;
  EXPECT_EQ(count(r.output, "[rank 0] shardtrain "), 1) << r.output;
  EXPECT_EQ(count(r.output, "config: built-in default job"), 1) << r.output;
  EXPECT_EQ(count(r.output, "[rank 0] config: built-in default job"), 1) << r.output;
  EXPECT_EQ(count(r.output, "[rank 0] done: 3 steps"), 1) << r.output;
  EXPECT_EQ(count(r.output, "loss by step"), 1) << r.output;
  EXPECT_EQ(count(r.output, "[rank 1] "), count(r.output, "[rank 1] warn: ") + count(r.output, "[rank 1] error: "))
      << "rank 1's info lines are not shown:\n" << r.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
