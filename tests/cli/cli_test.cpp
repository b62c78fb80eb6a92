// The `shardtrain` command: exit codes and messages for bad input.
#include <array>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

namespace {

struct Result {
  int status;
  std::string output;
};

Result run(const std::string& args) {
  const std::string cmd = std::string(SHARDTRAIN_BINARY_DIR) + "/shardtrain " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

TEST(Cli, UnknownKeyFailsNamingIt) {
  const Result r = run("train --model.widht=3");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("error: override `--model.widht=3`: unknown config key `model.widht`"), std::string::npos)
      << r.output;
}

TEST(Cli, ImpossibleShapeFails) {
  const Result r = run("train --model.n_heads=7");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("`model.n_heads` (7) must divide `model.dim` (256)"), std::string::npos) << r.output;
}

TEST(Cli, MissingConfigFileFails) {
  const Result r = run("train /nonexistent/job.toml");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("/nonexistent/job.toml"), std::string::npos) << r.output;
}

TEST(Cli, UnknownCommandAndHelp) {
  EXPECT_EQ(run("trian").status, 2);
  const Result h = run("help");
  EXPECT_EQ(h.status, 0);
  EXPECT_NE(h.output.find("print-config"), std::string::npos);
  const Result p = run("print-config --training.steps=5");
  EXPECT_EQ(p.status, 0);
  EXPECT_NE(p.output.find("steps = 5  # override"), std::string::npos) << p.output;
}

}  // namespace
