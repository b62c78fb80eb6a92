// `shardtrain train` under signals, hung ranks, a time limit and a trace: a signal saves the step
// and the run resumes, a stuck rank ends the run after parallel.timeout, a time limit saves
// before it, and a trace holds the steps, blocks and ops.
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

// A `shardtrain` process whose output is read line by line while it runs, to signal it.
struct Running {
  pid_t pid = -1;
  FILE* out = nullptr;
  std::string output;
  // Reads until a line holds `text` (true) or the output ends (false).
  bool read_until(const std::string& text) {
    char line[4096];
    while (std::fgets(line, sizeof line, out) != nullptr) {
      output += line;
      if (std::string(line).find(text) != std::string::npos) return true;
    }
    return false;
  }
  // Reads the rest and waits; the raw wait status.
  int finish() {
    char buf[4096];
    while (size_t n = std::fread(buf, 1, sizeof buf, out)) output.append(buf, n);
    std::fclose(out);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
  }
};

// Runs `command` through the shell, its output read by the Running.
Running start_command(const std::string& command) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  Running r;
  r.pid = ::fork();
  if (r.pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  r.out = ::fdopen(fds[0], "r");
  return r;
}

Running start(const std::string& args) {
  return start_command(std::string(SHARDTRAIN_BINARY_DIR) + "/shardtrain " + args);
}

// checkpoint.on_signal: SIGTERM finishes the step, saves it and exits with 128 + 15; the run
// resumes from that checkpoint. Off, the signal ends the process at once; a second Ctrl-C too.
TEST(Cli, ASignalSavesTheStepAndTheRunResumes) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_signal_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string job = "train --training.steps=100000 --logging.interval_steps=1 --logging.progress=off "
                          "--sample.tokens=0 --run.output_dir=" +
                          dir.string();
  Running term = start(job);
  ASSERT_TRUE(term.read_until("step     3/100000")) << term.output;
  ::kill(term.pid, SIGTERM);
  const int status = term.finish();
  ASSERT_TRUE(WIFEXITED(status)) << term.output;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << term.output;
  const size_t at = term.output.find("stopped after step ");
  ASSERT_NE(at, std::string::npos) << term.output;
  const int64_t step = std::stoll(term.output.substr(at + 19));
  EXPECT_GE(step, 3);
  EXPECT_NE(term.output.find("of 100000 by SIGTERM (checkpoint.on_signal)"), std::string::npos) << term.output;
  EXPECT_TRUE(fs::is_directory(dir / "checkpoints" / fmt::format("step_{:08d}", step))) << term.output;
  EXPECT_EQ(term.output.find("eval "), std::string::npos) << "no evaluation after a signal: " << term.output;
  const Result resumed = run_shardtrain(job.substr(0, job.find(' ')) + " --training.steps=" + std::to_string(step + 2) +
                                        job.substr(job.find(" --logging")) + " --checkpoint.resume=auto");
  EXPECT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("(step {}, written by 1 rank)", step)), std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("step {:>5}/{}", step + 2, step + 2)), std::string::npos) << resumed.output;

  Running off = start(job + " --checkpoint.on_signal=false --run.output_dir=" + (dir / "off").string());
  ASSERT_TRUE(off.read_until("step     2/100000")) << off.output;
  ::kill(off.pid, SIGTERM);
  const int off_status = off.finish();
  EXPECT_TRUE(WIFSIGNALED(off_status) && WTERMSIG(off_status) == SIGTERM) << off.output;
  EXPECT_FALSE(fs::exists(dir / "off" / "checkpoints")) << off.output;

  Running twice = start(job + " --run.output_dir=" + (dir / "twice").string());
  ASSERT_TRUE(twice.read_until("step     2/100000")) << twice.output;
  ::kill(twice.pid, SIGINT);
  // a moment for the first to be handled (two pending ones would be delivered as one), well
  // within the step of ~170 ms at which the first would stop the run
  ::usleep(20000);
  ::kill(twice.pid, SIGINT);
  const int twice_status = twice.finish();
  EXPECT_TRUE(WIFSIGNALED(twice_status) && WTERMSIG(twice_status) == SIGINT) << twice.output;
  fs::remove_all(dir);
}

// A signal during an evaluation stops it at the next batch (a long one must not outlast a
// scheduler's grace period): the step is saved and no held-out loss is reported for it.
TEST(Cli, ASignalDuringAnEvaluationStopsItAndSavesTheStep) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_eval_signal_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  // every held-out batch (a few seconds) after every second step
  Running r = start("train --training.steps=100000 --logging.interval_steps=1 --logging.progress=off "
                    "--sample.tokens=0 --eval.interval_steps=2 --eval.batches=0 --run.output_dir=" +
                    dir.string());
  ASSERT_TRUE(r.read_until("step     2/100000")) << r.output;
  ::kill(r.pid, SIGTERM);
  const int status = r.finish();
  ASSERT_TRUE(WIFEXITED(status)) << r.output;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << r.output;
  EXPECT_NE(r.output.find("evaluation after step 2 stopped before batch "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" by SIGTERM\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stopped after step 2 of 100000 by SIGTERM (checkpoint.on_signal)"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("eval  step"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::is_directory(dir / "checkpoints" / "step_00000002")) << r.output;
  fs::remove_all(dir);
}

// The processes whose parent is `parent` and whose name is `name`.
std::vector<pid_t> children(pid_t parent, const std::string& name) {
  std::vector<pid_t> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream in(entry.path() / "stat");
    std::string stat;
    if (!std::getline(in, stat)) continue;
    // pid (comm) state ppid ...
    const size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && stat.substr(open + 1, close - open - 1) == name) found.push_back(std::stoi(stat));
  }
  return found;
}

// `shardtrain train` on 2 MPI ranks of this machine, a line per step, for 100,000 steps.
Running start_two_ranks(const std::string& args) {
  return start_command(
      "env OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader "
      "mpirun -np 2 --oversubscribe " +
      std::string(SHARDTRAIN_BINARY_DIR) +
      "/shardtrain train --training.steps=100000 "
      "--logging.interval_steps=1 --logging.progress=off --sample.tokens=0 " +
      args);
}

// Kills `pids` after `seconds` unless disarmed first: a watchdog that fails to end a run must
// fail the test, not hang it. disarm() also kills them, gone already unless the test failed.
class KillAfter {
 public:
  KillAfter(std::vector<pid_t> pids, int seconds)
      : pids_(std::move(pids)), thread_([this, seconds] {
          for (int i = 0; i < 10 * seconds && !done_; ++i) ::usleep(100000);
          if (!done_) kill_all();
        }) {}
  void disarm() {
    done_ = true;
    kill_all();
  }

 private:
  void kill_all() {
    for (pid_t p : pids_) ::kill(p, SIGKILL);
  }
  std::vector<pid_t> pids_;
  std::atomic<bool> done_{false};
  std::jthread thread_;  // last: starts once the rest is built
};

// parallel.timeout_s: a rank that stops (SIGSTOP, as a hung one) leaves the other waiting in
// a collective; its watchdog ends the run after the limit, naming the step, the limit and the
// collectives it issued, and mpirun ends the rest.
TEST(Cli, AHungRankEndsTheRunAfterParallelTimeout) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun on this machine";
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_watchdog_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Running r = start_two_ranks("--parallel.timeout_s=3 --run.output_dir=" + dir.string());
  ASSERT_TRUE(r.read_until("step     3/100000")) << r.output;
  const std::vector<pid_t> ranks = children(r.pid, "shardtrain");
  ASSERT_EQ(ranks.size(), 2u) << "the ranks, children of mpirun";
  const auto stopped_at = std::chrono::steady_clock::now();
  ::kill(ranks[1], SIGSTOP);
  KillAfter guard(ranks, 60);
  const int status = r.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  guard.disarm();
  ASSERT_TRUE(WIFEXITED(status)) << r.output;
  EXPECT_NE(WEXITSTATUS(status), 0) << r.output;
  EXPECT_GE(seconds, 2.0) << r.output;  // the limit counts from the rank's last collective, within a step before
  EXPECT_LT(seconds, 50.0) << "not ended by the watchdog: " << r.output;
  EXPECT_NE(r.output.find("] error: watchdog: step "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" s (parallel.timeout_s = 3): this rank issued "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("which has probably failed, hung or been stopped"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Ending the run with exit status 124"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

// A save is watched too: rank 0 stuck in its checkpoint's commit (opening `latest`'s temporary
// file, made a FIFO that nobody reads) leaves rank 1 in the commit's last barrier; the watchdog
// ends the run after parallel.timeout_s, naming the checkpoint, and `latest` is never written.
TEST(Cli, ARankStuckInASaveEndsTheRunAfterParallelTimeout) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun on this machine";
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_save_watchdog_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Running r = start_two_ranks("--parallel.timeout_s=2 --checkpoint.interval_steps=20 --checkpoint.async=false "
                              "--run.output_dir=" +
                              dir.string());
  ASSERT_TRUE(r.read_until("step     1/100000")) << r.output;
  const std::vector<pid_t> ranks = children(r.pid, "shardtrain");
  ASSERT_EQ(ranks.size(), 2u) << "the ranks, children of mpirun";
  fs::create_directories(dir / "checkpoints");
  for (pid_t p : ranks)  // rank 0 writes `latest`, through a temporary file named by its pid
    ASSERT_EQ(::mkfifo((dir / "checkpoints" / ("latest.tmp." + std::to_string(p))).c_str(), 0644), 0);
  KillAfter guard(ranks, 60);
  ASSERT_TRUE(r.read_until("watchdog: the checkpoint of step 20 has made no progress for ")) << r.output;
  const auto fired_at = std::chrono::steady_clock::now();
  const int status = r.finish();
  guard.disarm();
  ASSERT_TRUE(WIFEXITED(status)) << r.output;
  EXPECT_NE(WEXITSTATUS(status), 0) << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - fired_at, std::chrono::seconds(50)) << r.output;
  EXPECT_NE(r.output.find("step    20/100000"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step    21/100000"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" s (parallel.timeout_s = 2): this rank issued "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Ending the run with exit status 124"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::is_regular_file(dir / "checkpoints" / "latest")) << "the stuck commit never named the step";

  fs::remove_all(dir);
}

// training.time_limit: the run stops before the limit, saved, with status 75.
TEST(Cli, ATimeLimitStopsBeforeItAndSaves) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_time_limit_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run_shardtrain("train --training.steps=100000 --training.time_limit=6s --logging.progress=off "
                                  "--sample.tokens=0 --run.output_dir=" +
                                  dir.string());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, 75) << r.output;
  const size_t at = r.output.find("stopped after step ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const int64_t step = std::stoll(r.output.substr(at + 19));
  EXPECT_NE(r.output.find(" s into training.time_limit = 6s: another step and a save would not fit"), std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::is_directory(dir / "checkpoints" / fmt::format("step_{:08d}", step))) << r.output;
  // ended before the limit, but for the process's exit (a loaded machine's steps vary; 1 s of slack)
  EXPECT_LT(seconds, 7.0) << r.output;
  EXPECT_GT(seconds, 2.0) << "stopped long before the limit: " << r.output;
  fs::remove_all(dir);
}

// SHARDTRAIN_PROFILE_TRACE: a run's timeline, its ops inside the step, block, head and
// optimizer regions around them.
TEST(Cli, ATraceHoldsTheStepsBlocksAndOps) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_trace_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string trace = (dir / "trace.json").string();
  fs::create_directories(dir);
  const Result r = run_shardtrain(
      "train --training.steps=2 --sample.tokens=0 --logging.progress=off --run.output_dir=" + dir.string() +
          " --eval.batches=1",
      "SHARDTRAIN_PROFILE_TRACE=" + trace);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("SHARDTRAIN_PROFILE_TRACE: the run's ops and regions"), std::string::npos) << r.output;
  std::ifstream in(trace);
  const nlohmann::json t = nlohmann::json::parse(in);
  std::map<std::string, std::vector<nlohmann::json>> by_name;
  for (const nlohmann::json& e : t.at("traceEvents"))
    if (e.value("ph", "") == "X") by_name[e.at("name").get<std::string>()].push_back(e);
  for (const char* region : {"step 1", "step 2", "block forward 0", "block forward 3", "block backward 3",
                             "block backward 0", "head and loss", "optimizer", "evaluation"})
    EXPECT_TRUE(by_name.count(region)) << region;
  EXPECT_EQ(by_name["step 1"].size(), 1u);
  EXPECT_EQ(by_name["block backward 2"].size(), 2u);  // one per step
  auto inside_one = [&](const nlohmann::json& op, const std::string& region) {
    for (const nlohmann::json& g : by_name[region])
      if (op.at("ts").get<double>() >= g.at("ts").get<double>() &&
          op.at("ts").get<double>() + op.at("dur").get<double>() <=
              g.at("ts").get<double>() + g.at("dur").get<double>())
        return true;
    return false;
  };
  ASSERT_EQ(by_name["linear_cross_entropy"].size(), 3u) << "2 steps and the evaluation";
  EXPECT_TRUE(inside_one(by_name["linear_cross_entropy"][0], "head and loss"));
  EXPECT_TRUE(inside_one(by_name["linear_cross_entropy"][0], "step 1"));
  EXPECT_FALSE(inside_one(by_name["linear_cross_entropy"][2], "step 2")) << "the evaluation comes after the step";
  EXPECT_TRUE(inside_one(by_name["linear_cross_entropy"][2], "evaluation"));
  bool adamw = false;
  for (const auto& [name, events] : by_name)
    if (name.rfind("adamw", 0) == 0) {
      adamw = true;
      EXPECT_TRUE(inside_one(events[0], "optimizer")) << name;
    }
  EXPECT_TRUE(adamw);
  fs::remove_all(dir);
}

// `bench` runs the job's step on random tokens and reports it; it reads no corpus and, with
// model.hf, only config.json (no weights, no tokenizer), and writes nothing: no metrics,
// checkpoints or output folder, whatever the job asks for.

}  // namespace
