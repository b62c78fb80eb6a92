// The command table: every command's help (three ways to ask, one text), the overview made
// from the same rows, and the suggestion for a mistyped command.
#include "cli/command_table.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

namespace {

using shardtrain::cli::Command;

struct Result {
  int status;
  std::string out;  // standard output
  std::string err;  // standard error
};

Result run(const std::string& args) {
  const std::string err_file = std::string(SHARDTRAIN_BINARY_DIR) + "/command_table_test_stderr." + std::to_string(::getpid());
  const std::string cmd = std::string(SHARDTRAIN_BINARY_DIR) + "/shardtrain " + args + " 2>" + err_file;
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int st = pclose(p);
  std::string err;
  if (FILE* e = std::fopen(err_file.c_str(), "r")) {
    while (size_t n = fread(buf.data(), 1, buf.size(), e)) err.append(buf.data(), n);
    std::fclose(e);
  }
  std::remove(err_file.c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out, err};
}

const char* const kExpected[] = {"train", "print-config", "plan",    "bench", "inspect", "export",
                                 "generate", "tokenize",  "cache", "version", "plot",    "batches", "help"};

TEST(CommandTable, HoldsEveryCommandWithItsHelp) {
  ASSERT_EQ(shardtrain::cli::commands().size(), std::size(kExpected));
  for (const char* name : kExpected) {
    const Command* c = shardtrain::cli::find_command(name);
    ASSERT_NE(c, nullptr) << name;
    EXPECT_NE(c->run, nullptr) << name;
    EXPECT_EQ(std::string(c->usage).rfind(name, 0), 0u) << name << ": the usage starts with the command";
    EXPECT_EQ(std::string(c->example).rfind(std::string("shardtrain ") + name, 0), 0u) << name << ": " << c->example;
    EXPECT_GT(std::string(c->summary).size(), 10u) << name;
    EXPECT_GT(std::string(c->details).size(), 10u) << name;
  }
  EXPECT_EQ(shardtrain::cli::find_command("trian"), nullptr);
}

// `COMMAND --help`, `COMMAND -h` and `help COMMAND`: the same text, on standard output, exit 0,
// and no work done (export would need two paths, train would train).
TEST(CommandTable, EveryCommandPrintsItsHelp) {
  for (const Command& c : shardtrain::cli::commands()) {
    const std::string expected = shardtrain::cli::command_help(c);
    EXPECT_NE(expected.find(std::string("usage:\n  shardtrain ") + c.name), std::string::npos) << expected;
    EXPECT_NE(expected.find(std::string("\nexample:\n  shardtrain ") + c.name), std::string::npos) << expected;
    EXPECT_NE(expected.find(c.summary), std::string::npos) << expected;
    for (const std::string& ask : {std::string(c.name) + " --help", std::string(c.name) + " -h",
                                   std::string("help ") + c.name}) {
      const Result r = run(ask);
      EXPECT_EQ(r.status, 0) << ask << "\n" << r.out << r.err;
      EXPECT_EQ(r.out, expected) << ask;
      EXPECT_EQ(r.err, "") << ask;
    }
  }
  // after other arguments too
  EXPECT_EQ(run("export a b --help").out, shardtrain::cli::command_help(*shardtrain::cli::find_command("export")));
  EXPECT_EQ(run("train --training.steps 3 -h").out,
            shardtrain::cli::command_help(*shardtrain::cli::find_command("train")));
}

// A command's options with their defaults, and the job options of the commands that read a job.
TEST(CommandTable, HelpShowsOptionsAndDefaults) {
  const std::string bench = run("bench --help").out;
  EXPECT_NE(bench.find("--steps N             timed steps (default 10)"), std::string::npos) << bench;
  EXPECT_NE(bench.find("--section.key=value, --section.key value"), std::string::npos) << bench;
  const std::string generate = run("generate --help").out;
  EXPECT_NE(generate.find("--tokens N            tokens to generate (default 200)"), std::string::npos) << generate;
  const std::string plot = run("plot --help").out;
  EXPECT_NE(plot.find("default RUN_DIR/loss.svg"), std::string::npos) << plot;
  EXPECT_NE(plot.find("default loss,eval_loss,lr,tokens_per_second"), std::string::npos) << plot;
  const std::string train = run("train --help").out;
  EXPECT_NE(train.find("job options:"), std::string::npos) << train;
  EXPECT_EQ(run("inspect --help").out.find("job options:"), std::string::npos);
}

// `shardtrain help` (and no arguments, and --help): every command of the table with its summary.
TEST(CommandTable, OverviewListsEveryCommand) {
  const std::string overview = shardtrain::cli::overview();
  for (const Command& c : shardtrain::cli::commands()) {
    const std::string row = std::string(c.name) + std::string(14 - std::string(c.name).size(), ' ') + c.summary;
    EXPECT_NE(overview.find("\n  " + row + "\n"), std::string::npos) << row << "\n" << overview;
  }
  for (const char* ask : {"help", "", "--help", "-h"}) {
    const Result r = run(ask);
    EXPECT_EQ(r.status, 0) << ask;
    EXPECT_EQ(r.out, overview) << ask;
  }
  const Result config = run("help config");
  EXPECT_EQ(config.status, 0);
  EXPECT_NE(config.out.find("training.steps"), std::string::npos);
}

TEST(CommandTable, SuggestsTheCommandATypoMeant) {
  const auto nearest = [](const char* typo) {
    const Command* c = shardtrain::cli::nearest_command(typo);
    return c == nullptr ? std::string("(none)") : std::string(c->name);
  };
  EXPECT_EQ(nearest("trian"), "train");
  EXPECT_EQ(nearest("tarin"), "train");
  EXPECT_EQ(nearest("trains"), "train");
  EXPECT_EQ(nearest("plto"), "plot");
  EXPECT_EQ(nearest("print-conifg"), "print-config");
  EXPECT_EQ(nearest("exprot"), "export");
  EXPECT_EQ(nearest("genrate"), "generate");
  EXPECT_EQ(nearest("xyzzyq"), "(none)");
  EXPECT_EQ(nearest("frobnicate"), "(none)");

  const Result r = run("trian --training.steps=2");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "error: unknown command `trian`; did you mean `train`? (`shardtrain help` lists the commands)\n");
  EXPECT_EQ(r.out, "");
  const Result far = run("xyzzyq");
  EXPECT_EQ(far.status, 2);
  EXPECT_EQ(far.err, "error: unknown command `xyzzyq` (`shardtrain help` lists the commands)\n");
  const Result help = run("help genrate");
  EXPECT_EQ(help.status, 2);
  EXPECT_NE(help.err.find("did you mean `generate`?"), std::string::npos) << help.err;
}

// A mistyped option gets the nearest of the command's own options (read from its help, so the
// two cannot disagree), or the one another tool's name stands for, and where the options are.
TEST(CommandTable, SuggestsTheOptionATypoMeant) {
  const Command* generate = shardtrain::cli::find_command("generate");
  ASSERT_NE(generate, nullptr);
  const std::vector<std::string> options = shardtrain::cli::command_options(*generate);
  for (const char* o : {"--prompt", "--tokens", "--temperature", "--top-k", "--top-p", "--seed", "--chat", "--system"})
    EXPECT_NE(std::find(options.begin(), options.end(), o), options.end()) << o;
  const auto message = [](const char* command, const char* option) {
    return shardtrain::cli::unknown_option_message(command, option);
  };
  EXPECT_NE(message("generate", "--max-new-tokens")
                .find("generate: unknown option `--max-new-tokens`; did you mean `--tokens`? (`shardtrain generate "
                      "--help` lists its options)"),
            std::string::npos);
  EXPECT_NE(message("generate", "--temprature=0").find("did you mean `--temperature`?"), std::string::npos);
  EXPECT_NE(message("export", "--dtpye").find("did you mean `--dtype`?"), std::string::npos);
  const std::string far = message("export", "--frobnicate");
  EXPECT_EQ(far.find("did you mean"), std::string::npos) << far;
  EXPECT_NE(far.find("`shardtrain export --help` lists its options"), std::string::npos) << far;

  const Result r = run("generate somewhere --max-new-tokens 40");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("did you mean `--tokens`?"), std::string::npos) << r.err;
}

}  // namespace
