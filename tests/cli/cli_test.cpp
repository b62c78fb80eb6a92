// The `shardtrain` command: exit codes and messages for bad input.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "testing/shared_data.h"
#include "testing/shardtrain_binary.h"

namespace {

using Result = shardtrain::testing::CommandResult;

Result run(const std::string& args, const std::string& env = "") {
  return shardtrain::testing::run_shardtrain(args, env);
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

// `version`: the commit the binary was built from, the same one the git checkout is at (or
// "unknown" outside one), its backends and the host; --version is the same.
TEST(Cli, VersionNamesTheCommitAndTheBuild) {
  const Result v = run("version");
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
  EXPECT_EQ(run("--version").output, v.output);
  EXPECT_EQ(run("version extra").status, 1);
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

#include <fstream>

#include <nlohmann/json.hpp>

#include "testing/shared_data.h"

namespace {

TEST(Cli, TokenizePrintIdsMatchesGoldenIds) {
  ST_REQUIRE_SHARED_DATA(dir);
  // the first 50 golden web lines (single-line verses) through the command line
  std::ifstream golden(dir + "/tokenizer_tests/llama3_golden_web.jsonl");
  const std::string input = std::string(SHARDTRAIN_BINARY_DIR) + "/cli_tokenize_input.txt";
  std::ofstream in(input);
  std::vector<std::string> expected;
  std::string line;
  while (expected.size() < 50 && std::getline(golden, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string text = j["text"];
    if (text.find('\n') != std::string::npos) continue;
    in << text << "\n";
    std::string ids;
    for (const auto& id : j["ids"]) {
      if (!ids.empty()) ids += ' ';
      ids += std::to_string(id.get<int>());
    }
    expected.push_back(ids);
  }
  in.close();
  const Result r = run("tokenize --tokenizer " + dir + "/tokenizers/llama3 --print-ids < " + input);
  ASSERT_EQ(r.status, 0) << r.output;
  std::istringstream out(r.output);
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_TRUE(std::getline(out, line)) << "missing output line " << i;
    EXPECT_EQ(line, expected[i]) << "line " << i;
  }
}

TEST(Cli, TokenizeNeedsATokenizer) {
  const Result r = run("tokenize --print-ids");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("--tokenizer PATH is required"), std::string::npos) << r.output;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A folder of shards tokenizes file by file into OUTPUT/<name>.tok, each as the file alone
// would, its format found per file; the dataset card is skipped.
TEST(Cli, TokenizeAFolderFileByFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_tok_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "in");
  std::ofstream(dir / "in" / "train-00000.jsonl") << "{\"text\": \"first shard\"}\n{\"text\": \"more\"}\n";
  std::ofstream(dir / "in" / "train-00001.jsonl") << "{\"text\": \"second shard\"}\n";
  std::ofstream(dir / "in" / "notes.txt") << "a line\nanother line\n";
  std::ofstream(dir / "in" / "README.md") << "# a dataset card\n";
  const Result r = run("tokenize --tokenizer byte " + (dir / "in").string() + " " + (dir / "out").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[3/3]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("3 files, 5 documents"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "out" / "README.tok")) << "the card is not data";
  EXPECT_FALSE(fs::exists(dir / "out" / "README.md.tok"));
  for (const char* name : {"train-00000", "train-00001", "notes"}) {
    const std::string in = (dir / "in" / name).string() + (std::string(name) == "notes" ? ".txt" : ".jsonl");
    const std::string alone = (dir / (std::string(name) + ".tok")).string();
    ASSERT_EQ(run("tokenize --tokenizer byte " + in + " " + alone).status, 0);
    const std::string a = file_bytes(alone), b = file_bytes((dir / "out" / (std::string(name) + ".tok")).string());
    EXPECT_FALSE(a.empty());
    EXPECT_TRUE(a == b) << name;
  }
  // several files at once (each with its share of the threads): the same token files
  const Result at_once = run("tokenize --tokenizer byte --files 3 --threads 3 " + (dir / "in").string() + " " +
                             (dir / "out3").string());
  ASSERT_EQ(at_once.status, 0) << at_once.output;
  EXPECT_NE(at_once.output.find("tokenize: 3 files at once, 1 thread each"), std::string::npos) << at_once.output;
  EXPECT_NE(at_once.output.find("3 files, 5 documents"), std::string::npos) << at_once.output;
  for (const char* name : {"train-00000.tok", "train-00001.tok", "notes.tok"})
    EXPECT_TRUE(file_bytes((dir / "out" / name).string()) == file_bytes((dir / "out3" / name).string())) << name;
  // again with --skip-existing: the finished files are kept, a missing one is made
  fs::remove(dir / "out" / "notes.tok");
  const Result again = run("tokenize --tokenizer byte --skip-existing " + (dir / "in").string() + " " +
                           (dir / "out").string());
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("3 files (2 already there), 5 documents"), std::string::npos) << again.output;
  EXPECT_TRUE(file_bytes((dir / "out" / "notes.tok").string()) == file_bytes((dir / "notes.tok").string()));
  // a pattern takes only its matches
  const Result p = run("tokenize --tokenizer byte '" + (dir / "in" / "train-*.jsonl").string() + "' " +
                       (dir / "out2").string());
  ASSERT_EQ(p.status, 0) << p.output;
  EXPECT_NE(p.output.find("2 files, 3 documents"), std::string::npos) << p.output;
  fs::remove_all(dir);
}

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
                          "--sample.tokens=0 --run.output_dir=" + dir.string();
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
  const Result resumed = run(job.substr(0, job.find(' ')) + " --training.steps=" + std::to_string(step + 2) +
                             job.substr(job.find(" --logging")) + " --checkpoint.resume=auto");
  EXPECT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("(step {}, written by 1 rank)", step)), std::string::npos) << resumed.output;
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
                    "--sample.tokens=0 --eval.interval_steps=2 --eval.batches=0 --run.output_dir=" + dir.string());
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
      "mpirun -np 2 --oversubscribe " + std::string(SHARDTRAIN_BINARY_DIR) + "/shardtrain train --training.steps=100000 "
      "--logging.interval_steps=1 --logging.progress=off --sample.tokens=0 " + args);
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
                              "--run.output_dir=" + dir.string());
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
  const Result r = run("train --training.steps=100000 --training.time_limit=6s --logging.progress=off "
                       "--sample.tokens=0 --run.output_dir=" + dir.string());
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
  const Result r = run("train --training.steps=2 --sample.tokens=0 --logging.progress=off --run.output_dir=" +
                       dir.string() + " --eval.batches=1", "SHARDTRAIN_PROFILE_TRACE=" + trace);
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
          op.at("ts").get<double>() + op.at("dur").get<double>() <= g.at("ts").get<double>() + g.at("dur").get<double>())
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
TEST(Cli, BenchReportsTheStepAndWritesNothing) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_bench_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "hf");
  fs::copy_file(shardtrain::testing::source_dir() + "/tests/model/hf_reference/gqa4_llama3_rope/config.json",
                dir / "hf" / "config.json");
  const std::string json = (dir / "bench.json").string();
  const Result r = run("bench --steps 3 --warmup 2 --model.n_layers=2 --data.source=/nonexistent/corpus.jsonl "
                       "--checkpoint.interval_steps=1 --export.folder=" + (dir / "export").string() +
                       " --run.output_dir=" + (dir / "run").string() + " --json " + json);
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
  const Result hf = run("bench --steps 1 --warmup 1 --training.seq_len=32 --model.hf=" + (dir / "hf").string());
  ASSERT_EQ(hf.status, 0) << hf.output;
  EXPECT_NE(hf.output.find("its weights random (not read)"), std::string::npos) << hf.output;
  EXPECT_NE(hf.output.find("2 layers, dim 24, 4 heads / 1 kv heads (head dim 6), ffn 40, vocab 67"), std::string::npos)
      << hf.output;
  EXPECT_NE(run("train --training.steps=1 --training.seq_len=32 --model.hf=" + (dir / "hf").string()).status, 0)
      << "training needs the folder's tokenizer and weights";

  // a sweep: every combination in turn, one that fails noted and the rest run, one table
  const std::string sweep_json = (dir / "sweep.json").string();
  const Result sweep = run("bench --steps 1 --warmup 1 --model.n_layers=1 --sweep training.batch_size=2,4 "
                           "--sweep training.offload_activations=false,true --json " + sweep_json);
  ASSERT_EQ(sweep.status, 0) << sweep.output;
  EXPECT_NE(sweep.output.find("bench [4/4]: training.batch_size=4 training.offload_activations=true"),
            std::string::npos) << sweep.output;
  EXPECT_NE(sweep.output.find("| settings | tokens/s | MFU | ms per step |"), std::string::npos) << sweep.output;
  EXPECT_NE(sweep.output.find("| training.batch_size=2 training.offload_activations=false | "), std::string::npos)
      << sweep.output;
  EXPECT_NE(sweep.output.find("| training.batch_size=4 training.offload_activations=true | failed: "),
            std::string::npos) << sweep.output;
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
  const Result bad_sweep = run("bench --steps 1 --sweep model.widht=1,2");
  EXPECT_EQ(bad_sweep.status, 1);
  EXPECT_NE(bad_sweep.output.find("unknown config key `model.widht`"), std::string::npos) << bad_sweep.output;
  EXPECT_EQ(bad_sweep.output.find("bench [1/2]"), std::string::npos) << "settings are checked before any run";

  const Result none = run("bench --steps 0");
  EXPECT_EQ(none.status, 1);
  EXPECT_NE(none.output.find("--steps must be at least 1, found 0"), std::string::npos) << none.output;
  EXPECT_NE(run("bench --warmup 0").output.find("--warmup must be at least 1"), std::string::npos);
  EXPECT_NE(run("bench --steps x").output.find("--steps takes an integer, found `x`"), std::string::npos);
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
  const Result none = run("cache --dir " + cache);
  ASSERT_EQ(none.status, 0) << none.output;
  EXPECT_NE(none.output.find("no token caches in " + cache), std::string::npos) << none.output;
  {
    std::ofstream out(dir / "corpus.txt");
    for (int i = 0; i < 3000; ++i) out << "document " << i << " of the corpus\n\n";
  }
  const Result train = run("train --data.source=" + (dir / "corpus.txt").string() +
                           " --data.token_cache=on --data.cache_dir=" + cache +
                           " --training.steps=0 --eval.batches=1 --sample.tokens=0");
  ASSERT_EQ(train.status, 0) << train.output;
  fs::create_directories(dir / "cache" / ("corpus-0123456789abcdef.tmp-" + std::string("elsewhere.example") + "-42"));
  const Result listed = run("cache list --dir " + cache);
  ASSERT_EQ(listed.status, 0) << listed.output;
  EXPECT_NE(listed.output.find("token caches in " + cache + ": 2 folders"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find("current"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find("used now"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find("3000 documents"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find("on the machine `elsewhere.example`"), std::string::npos) << listed.output;
  EXPECT_EQ(listed.output.find("cache prune` removes"), std::string::npos) << "nothing to prune yet";

  std::ofstream(dir / "corpus.txt", std::ios::app) << "one more\n";
  const Result stale = run("cache --dir " + cache);
  EXPECT_NE(stale.output.find("stale"), std::string::npos) << stale.output;
  EXPECT_NE(stale.output.find("corpus.txt` changed after the build"), std::string::npos) << stale.output;
  EXPECT_NE(stale.output.find("`shardtrain cache prune` removes the 1 folder stale"), std::string::npos) << stale.output;
  const Result dry = run("cache prune --dry-run --dir " + cache);
  ASSERT_EQ(dry.status, 0) << dry.output;
  EXPECT_NE(dry.output.find("would remove 1 of 2 folders"), std::string::npos) << dry.output;
  EXPECT_EQ(run("cache --dir " + cache).output, stale.output);
  const Result pruned = run("cache prune --dir " + cache);
  ASSERT_EQ(pruned.status, 0) << pruned.output;
  EXPECT_NE(pruned.output.find("removed 1 of 2 folders"), std::string::npos) << pruned.output;
  const Result rest = run("cache --dir " + cache);
  EXPECT_NE(rest.output.find(": 1 folder, "), std::string::npos) << rest.output;
  EXPECT_EQ(rest.output.find("stale"), std::string::npos) << rest.output;
  const Result all = run("cache prune --all --dir " + cache);
  EXPECT_NE(all.output.find("removed 1 of 1 folder, "), std::string::npos) << all.output;
  EXPECT_TRUE(fs::is_empty(cache));

  const Result misplaced = run("cache --all --dir " + cache);
  EXPECT_EQ(misplaced.status, 1);
  EXPECT_NE(misplaced.output.find("go with `cache prune`"), std::string::npos) << misplaced.output;
  const Result days = run("cache prune --unused-days soon --dir " + cache);
  EXPECT_EQ(days.status, 1);
  EXPECT_NE(days.output.find("--unused-days takes a number, found `soon`"), std::string::npos) << days.output;
  EXPECT_EQ(run("cache purge").status, 1);
  fs::remove_all(dir);
}

}  // namespace

namespace {

TEST(Cli, InspectListsTensorsAndChecksTheShape) {
  const Result r = run("inspect " + shardtrain::testing::source_dir() + "/tests/model/hf_reference/gqa4_llama3_rope");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("model.layers.1.self_attn.k_proj.weight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[6, 24]"), std::string::npos) << r.output;  // 1 kv head x head dim 6
  EXPECT_NE(r.output.find("with llama3 scaling"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("every parameter present with the expected shape"), std::string::npos) << r.output;
  const Result bad = run("inspect /nonexistent/folder");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("/nonexistent/folder"), std::string::npos) << bad.output;
}

// A Qwen3-style model trained and exported from the command line (model.qk_norm with heads of
// their own): inspect shows the QK-norm in the summary and its weights, and names a missing one.
TEST(Cli, InspectShowsQkNorm) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_inspect_qwen3_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const Result trained = run("train --model.qk_norm=true --model.head_dim=16 --model.dim=40 --model.n_layers=2 "
                             "--model.n_heads=4 --model.n_kv_heads=2 --model.ffn_dim=52 --model.max_seq_len=32 "
                             "--training.seq_len=16 --training.batch_size=2 --training.steps=1 --training.device=cpu "
                             "--eval.batches=1 --sample.tokens=0 --logging.progress=off --logging.level=warn "
                             "--export.dtype=f32 --export.folder=" + (dir / "hf").string() +
                             " --run.output_dir=" + (dir / "run").string());
  ASSERT_EQ(trained.status, 0) << trained.output;
  const Result r = run("inspect " + (dir / "hf").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("4 heads / 2 kv heads (head dim 16, decoupled: attention width 4 x 16 = 64), QK-norm, "
                          "ffn 52"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("QK-norm: self_attn.q_norm.weight and self_attn.k_norm.weight [16] in each block"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("model.layers.1.self_attn.k_norm.weight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("every parameter present with the expected shape"), std::string::npos) << r.output;

  // the weights rewritten without one block's q_norm
  const std::string file = (dir / "hf" / "model.safetensors").string();
  std::vector<std::pair<std::string, shardtrain::Tensor>> tensors;
  {
    const shardtrain::io::SafetensorsFile f(file);
    for (const shardtrain::io::TensorInfo& t : f.tensors())
      if (t.name != "model.layers.1.self_attn.q_norm.weight")
        tensors.emplace_back(t.name, f.read_as(t.name, shardtrain::DType::kF32));
  }
  shardtrain::io::write_safetensors(file, tensors, {});
  const Result missing = run("inspect " + (dir / "hf").string());
  EXPECT_EQ(missing.status, 1) << missing.output;
  EXPECT_NE(missing.output.find("missing: model.layers.1.self_attn.q_norm.weight"), std::string::npos)
      << missing.output;
  fs::remove_all(dir);
}

// `inspect` exits non-zero when what it reports cannot be loaded (a script checks a folder or
// a checkpoint with it before a run): a Hugging Face folder missing tensors, a checkpoint
// missing pieces; 0 for healthy ones.
TEST(Cli, InspectFailsWhenTensorsOrPiecesAreMissing) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_inspect_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "hf");
  const fs::path reference = fs::path(shardtrain::testing::source_dir()) / "tests/model/hf_reference/gqa4_llama3_rope";
  fs::copy_file(reference / "model.safetensors", dir / "hf" / "model.safetensors");
  {
    std::ifstream in(reference / "config.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find("\"num_hidden_layers\": 2");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, 22, "\"num_hidden_layers\": 3");  // the file holds 2 layers
    std::ofstream(dir / "hf" / "config.json") << text;
  }
  const Result hf = run("inspect " + (dir / "hf").string());
  EXPECT_EQ(hf.status, 1) << hf.output;
  EXPECT_NE(hf.output.find("missing: model.layers.2.self_attn.q_proj.weight"), std::string::npos) << hf.output;
  EXPECT_NE(hf.output.find("problems (named above); it cannot be loaded as it is"), std::string::npos) << hf.output;

  const Result trained = run("train --model.dim=40 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2 "
                             "--model.ffn_dim=52 --model.max_seq_len=32 --training.seq_len=16 "
                             "--training.batch_size=2 --training.steps=1 --training.device=cpu "
                             "--eval.batches=1 --sample.tokens=0 --logging.progress=off --logging.level=warn "
                             "--checkpoint.interval_steps=1 --run.output_dir=" + (dir / "run").string());
  ASSERT_EQ(trained.status, 0) << trained.output;
  const fs::path step = dir / "run" / "checkpoints" / "step_00000001";
  const Result healthy = run("inspect " + (dir / "run" / "checkpoints").string());
  EXPECT_EQ(healthy.status, 0) << healthy.output;
  EXPECT_NE(healthy.output.find("complete: master weights"), std::string::npos) << healthy.output;
  // the rank file rewritten without its first piece
  const std::string file = (step / "rank_00000-of-00001.safetensors").string();
  std::vector<std::pair<std::string, shardtrain::Tensor>> pieces;
  {
    const shardtrain::io::SafetensorsFile f(file);
    for (const shardtrain::io::TensorInfo& t : f.tensors())
      pieces.emplace_back(t.name, f.read_as(t.name, shardtrain::DType::kF32));
  }
  pieces.erase(pieces.begin());
  shardtrain::io::write_safetensors(file, pieces, {});
  const Result incomplete = run("inspect " + step.string());
  EXPECT_EQ(incomplete.status, 1) << incomplete.output;
  EXPECT_NE(incomplete.output.find("INCOMPLETE: 1 problem"), std::string::npos) << incomplete.output;
  EXPECT_NE(incomplete.output.find("1 problem (named above)"), std::string::npos) << incomplete.output;
  fs::remove_all(dir);
}

// A requeued job whose run has finished: resuming trains nothing, says so in one line and
// exits 0 (a requeue loop must not see a failure).
TEST(Cli, ResumingAFinishedRunSucceedsAndSaysSo) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_finished_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string job = "train --model.dim=40 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2 "
                          "--model.ffn_dim=52 --model.max_seq_len=32 --training.seq_len=16 --training.batch_size=2 "
                          "--training.steps=2 --training.device=cpu --eval.batches=1 --sample.tokens=0 "
                          "--logging.progress=off --checkpoint.interval_steps=1 --checkpoint.resume=auto "
                          "--run.output_dir=" + dir.string();
  const Result first = run(job);
  ASSERT_EQ(first.status, 0) << first.output;
  const Result again = run(job);
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("the run is already complete at step 2: checkpoint `" +
                              (dir / "checkpoints" / "step_00000002").string() +
                              "` has done all `training.steps` = 2; nothing to train"),
            std::string::npos)
      << again.output;
  EXPECT_EQ(again.output.find("step     "), std::string::npos) << "no step trained: " << again.output;
  fs::remove_all(dir);
}

// A folder without tokenizer.json: auto takes the byte-level tokenizer, whose 258 ids do not fit
// this model's 67; the error says why that tokenizer, and what data.tokenizer takes.
TEST(Cli, FineTuningWithoutTheModelsTokenizerIsNamed) {
  const std::string hf = shardtrain::testing::source_dir() + "/tests/model/hf_reference/mha_tied";
  const Result r = run("train --model.hf=" + hf);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("`model.hf` = `" + hf + "` has a vocabulary of 67, fewer than the 258 tokens of the "
                          "byte-level tokenizer (data.tokenizer = auto, and model.hf `" + hf +
                          "` holds no tokenizer.json; another one: data.tokenizer = the path of a tokenizer.json); "
                          "name the model's own tokenizer with `data.tokenizer`, which takes auto (model.hf's "
                          "tokenizer.json, else the byte-level tokenizer), byte ("),
            std::string::npos)
      << r.output;
}

TEST(Cli, ADataTokenizerThatNamesNothingListsTheValues) {
  const Result r = run("train --data.tokenizer=bytes --training.device=cpu");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("`data.tokenizer` = `bytes`: no such file or folder; it takes auto (model.hf's "
                          "tokenizer.json, else the byte-level tokenizer), byte (the byte-level tokenizer: 256 bytes "
                          "+ BOS/EOS), or the path of a tokenizer.json or of the folder holding one"),
            std::string::npos)
      << r.output;
}

}  // namespace

// The shipped 8B and 405B jobs plan on a machine with nothing downloaded (run from an empty
// folder, where their relative model.hf folders are not), with a step time and a job duration.
TEST(Cli, PlanOfShippedJobsNeedsNoDownloadAndGivesTheTime) {
  const std::string empty = (std::filesystem::temp_directory_path() / ("shardtrain_cli_plan_" + std::to_string(getpid())))
                                .string();
  std::filesystem::create_directories(empty);
  const std::string in_empty = "cd " + empty + " &&";
  const std::string configs = shardtrain::testing::source_dir() + "/configs/";
  const Result r = run("plan " + configs + "llama3.1-8b-finetune.toml --ranks 8", in_empty);
  EXPECT_EQ(r.status, 0) << r.output;
  for (const char* said : {"model shape: preset llama3.1-8b, as meta-llama/Llama-3.1-8B publishes it: `model.hf` = "
                           "`models/Llama-3.1-8B` is not on this machine",
                           "8030261248 parameters", "ranks: 8 (GPUs", "estimated peak",
                           "checkpoints every 250 steps (checkpoint.async)",
                           "time (estimate: FLOPs / (ranks x peak x MFU); communication is not modelled)",
                           "131,072 (2 x 4096 tokens x 2 micro-batches x 8 data-parallel ranks)",
                           "40 % (assumed; --mfu X sets it, `shardtrain bench` measures a job's)", " for 2,000 steps"})
    EXPECT_NE(r.output.find(said), std::string::npos) << said << " in\n" << r.output;
  const Result big = run("plan " + configs + "llama3.1-405b-64gpus.toml --ranks 64 --ranks-per-machine 8 --gpu h200 "
                         "--mfu 0.35", in_empty);
  EXPECT_EQ(big.status, 0) << big.output;
  for (const char* said : {"preset llama3.1-405b", "405853388800 parameters", "989 TFLOP/s dense bf16 per GPU (H200; --gpu), 64 GPUs",
                           "35 % (--mfu)", "host memory per machine of 8 ranks"})
    EXPECT_NE(big.output.find(said), std::string::npos) << said << " in\n" << big.output;
  const Result a100 = run("plan " + configs + "llama3.1-8b-finetune.toml --ranks 8 --gpu a100 --training.fp8=rowwise",
                          in_empty);
  EXPECT_EQ(a100.status, 0) << a100.output;
  EXPECT_NE(a100.output.find("312 TFLOP/s dense bf16 per GPU (A100; --gpu)"), std::string::npos) << a100.output;
  EXPECT_NE(a100.output.find("which the A100 lacks"), std::string::npos) << a100.output;
  const Result bad_gpu = run("plan --gpu v100");
  EXPECT_EQ(bad_gpu.status, 1);
  EXPECT_NE(bad_gpu.output.find("plan: --gpu `v100` is not a GPU plan knows; use one of h100-sxm, h100-pcie, h200, a100"),
            std::string::npos)
      << bad_gpu.output;
  const Result bad_mfu = run("plan --mfu 40");
  EXPECT_EQ(bad_mfu.status, 1);
  EXPECT_NE(bad_mfu.output.find("plan: --mfu must be in (0, 1], found 40 (a fraction of the peak: 0.4 is 40 %)"),
            std::string::npos)
      << bad_mfu.output;
  const Result both = run("plan " + configs + "llama3.1-8b-finetune.toml --model.preset=llama3.1-8b", in_empty);
  EXPECT_EQ(both.status, 1);
  EXPECT_NE(both.output.find("`model.preset` (\"llama3.1-8b\") and `model.hf` (\"models/Llama-3.1-8B\")"),
            std::string::npos)
      << both.output;
  const Result preset = run("plan --model.preset=llama3.2-1b --training.seq_len=4096 --training.device=cpu");
  EXPECT_EQ(preset.status, 0) << preset.output;
  EXPECT_NE(preset.output.find("1235814400 parameters"), std::string::npos) << preset.output;
  EXPECT_NE(preset.output.find("time: not estimated for CPU runs"), std::string::npos) << preset.output;
  std::filesystem::remove_all(empty);
}

TEST(Cli, PlanReadsAHuggingFaceFolderAndTakesRanks) {
  const std::string hf = shardtrain::testing::source_dir() + "/tests/model/hf_reference/gqa4_llama3_rope";
  const Result r = run("plan --model.hf=" + hf + " --training.seq_len=16 --ranks 4");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("ranks: 4 (GPUs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("estimated peak"), std::string::npos) << r.output;
  const Result bad = run("plan --ranks 0");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("plan: --ranks must be in [1, 1048576], found 0"), std::string::npos) << bad.output;
  // with the state in host memory, the host memory of a machine's ranks adds up
  const Result off = run("plan --model.hf=" + hf + " --training.seq_len=16 --training.device=cuda "
                         "--parallel.offload=true --ranks 4 --ranks-per-machine 2");
  EXPECT_EQ(off.status, 0) << off.output;
  EXPECT_NE(off.output.find("host memory per machine of 2 ranks: "), std::string::npos) << off.output;
  EXPECT_NE(off.output.find("needs a GPU of at least "), std::string::npos) << off.output;
  EXPECT_EQ(off.output.find("more than an 80 GB H100 holds"), std::string::npos) << off.output;
  // a job beyond one H100 says so and what lowers it: the 8B shape without checkpointing on 2 ranks
  const Result big = run("plan --training.device=cuda --model.dim=4096 --model.n_layers=32 --model.n_heads=32 "
                         "--model.n_kv_heads=8 --model.ffn_dim=14336 --model.vocab_size=128256 "
                         "--model.tie_embeddings=false --model.max_seq_len=4096 --training.seq_len=4096 "
                         "--training.batch_size=4 --ranks 2");
  EXPECT_EQ(big.status, 0) << big.output;
  EXPECT_NE(big.output.find("; more than an 80 GB H100 holds (79.18 GiB): lower training.batch_size or "
                            "training.seq_len, or add ranks, or training.activation_checkpointing = \"full\" ("),
            std::string::npos)
      << big.output;
  const Result too_many = run("plan --ranks 2 --ranks-per-machine 4");
  EXPECT_EQ(too_many.status, 1);
  EXPECT_NE(too_many.output.find("plan: --ranks-per-machine (4) exceeds the 2 ranks"), std::string::npos)
      << too_many.output;
}

#include <unistd.h>

#include <filesystem>

#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#endif
#include "data/bpe_tokenizer.h"
#include "data/byte_tokenizer.h"
#include "testing/model_folders.h"
#include "train/generate.h"
#include "train/open_model.h"

namespace {

using shardtrain::train::SampleOptions;

struct SplitResult {
  int status;
  std::string out, err;  // standard output, standard error
};

SplitResult run_split(const std::string& args, const std::string& stdin_file = "/dev/null") {
  const std::string err_file = std::string(SHARDTRAIN_BINARY_DIR) + "/cli_test_stderr_" + std::to_string(::getpid());
  const std::string cmd =
      std::string(SHARDTRAIN_BINARY_DIR) + "/shardtrain " + args + " < " + stdin_file + " 2> " + err_file;
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int st = pclose(p);
  std::ifstream e(err_file);
  std::string err((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  std::filesystem::remove(err_file);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out, err};
}

// What `shardtrain generate` prints on standard output for these options: the sample the
// library makes from the same folder, then a newline.
std::string expected_output(const std::string& model, const std::string& tokenizer, SampleOptions o) {
  const shardtrain::train::OpenedModel m = shardtrain::train::open_model(model);
  const auto tok = shardtrain::train::open_tokenizer(tokenizer, m);
  o.context_limit = shardtrain::train::ContextLimit::kStop;
  return shardtrain::train::sample(*m.model, *tok, o).text + "\n";
}

// The commands name --device cpu: on a machine with a GPU, auto would sample from a bf16 model.
class CliGenerate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string base = std::string(SHARDTRAIN_BINARY_DIR) + "/cli_generate_" + std::to_string(::getpid());
    hf_ = new std::string(base + "_hf");
    checkpoints_ = new std::string(base + "_ck");
    shardtrain::testing::TinyStore s(config(), 77);
    shardtrain::testing::write_hf_folder(s, config(), *hf_, "", false);  // without tokenizer files
    shardtrain::testing::write_checkpoint(s, config(), *checkpoints_, 20);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*hf_);
    std::filesystem::remove_all(*checkpoints_);
    delete hf_;
    delete checkpoints_;
  }
  static shardtrain::model::LlamaConfig config() { return shardtrain::testing::tiny_generation_config(); }
  static std::string* hf_;
  static std::string* checkpoints_;
};
std::string* CliGenerate::hf_ = nullptr;
std::string* CliGenerate::checkpoints_ = nullptr;

SampleOptions sample_options(const std::string& prompt, int64_t tokens, double temperature, int64_t top_k,
                             double top_p, uint64_t seed) {
  SampleOptions o;
  o.prompt = prompt;
  o.tokens = tokens;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.seed = seed;
  return o;
}

TEST_F(CliGenerate, HuggingFaceFolderPrintsTheSampleAndItsSpeed) {
  const SplitResult greedy = run_split("generate --device cpu " + *hf_ + " --tokenizer byte --prompt Hello --tokens 12 "
                                       "--temperature 0");
  ASSERT_EQ(greedy.status, 0) << greedy.err;
  EXPECT_EQ(greedy.out, expected_output(*hf_, "byte", sample_options("Hello", 12, 0, 40, 1, 7)));
  EXPECT_NE(greedy.err.find("tokens/s"), std::string::npos) << greedy.err;
  EXPECT_NE(greedy.err.find("KV cache"), std::string::npos) << greedy.err;
  EXPECT_NE(greedy.err.find("from Hugging Face folder " + *hf_), std::string::npos) << greedy.err;

  const SplitResult recomputed = run_split("generate --device cpu " + *hf_ + " --tokenizer byte --prompt Hello --tokens 12 "
                                           "--temperature 0 --recompute");
  ASSERT_EQ(recomputed.status, 0) << recomputed.err;
  EXPECT_EQ(recomputed.out, greedy.out) << "the same ids without the cache";
  EXPECT_NE(recomputed.err.find("recomputed every token"), std::string::npos) << recomputed.err;

  const SplitResult sampled = run_split("generate --device cpu " + *hf_ + " --tokenizer byte --prompt Hello --tokens 20 "
                                        "--temperature 0.9 --top-k 50 --top-p 0.9 --seed 5");
  ASSERT_EQ(sampled.status, 0) << sampled.err;
  EXPECT_EQ(sampled.out, expected_output(*hf_, "byte", sample_options("Hello", 20, 0.9, 50, 0.9, 5)));

  const std::string prompt_file = *hf_ + "_prompt.txt";
  std::ofstream(prompt_file) << "Hello";
  const SplitResult piped = run_split("generate --device cpu " + *hf_ + " --tokenizer byte --prompt - --tokens 12 --temperature 0",
                                      prompt_file);
  ASSERT_EQ(piped.status, 0) << piped.err;
  EXPECT_EQ(piped.out, greedy.out) << "--prompt - reads standard input";
  std::filesystem::remove(prompt_file);
}

TEST_F(CliGenerate, CheckpointUsesTheTokenizerItRecorded) {
  // the folder holding `latest`, and its step directory; no tokenizer recorded: bytes
  for (const std::string& path : {*checkpoints_, *checkpoints_ + "/step_00000020"}) {
    const SplitResult r = run_split("generate --device cpu " + path + " --prompt \"The \" --tokens 15 --seed 3");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, expected_output(path, "", sample_options("The ", 15, 0.8, 40, 1, 3))) << path;
    EXPECT_NE(r.err.find("(step 20)"), std::string::npos) << r.err;
  }
}

TEST_F(CliGenerate, BadInputIsNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"generate --device cpu /nonexistent/model --prompt x", "model `/nonexistent/model` does not exist"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt " + std::string(70, 'x'),
       "the prompt is 71 tokens (with BOS), more than the model's context of max_seq_len = 64 tokens"},
      {"generate --device cpu " + *hf_ + " --prompt x", "holds no tokenizer.json; name one with --tokenizer PATH"},
      {"generate --device cpu " + *hf_ + " --prompt x --tokenizer /nonexistent/tokenizer.json",
       "--tokenizer = `/nonexistent/tokenizer.json`: no such file or folder; it takes a tokenizer.json, the folder "
       "holding one, or `byte`"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte", "--prompt TEXT is required"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt x --top-p 1.5", "top-p must be in (0, 1] (1 is all tokens), found 1.5"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt x --tokens many", "--tokens takes an integer, found `many`"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt x --temperature -1", "temperature must be >= 0"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt x --topk 3", "unknown option `--topk`"},
      {"generate --device cpu --prompt x", "expected one MODEL"},
      {"generate " + *hf_ + " --tokenizer byte --prompt x --device tpu", "--device takes auto, cpu or cuda, found `tpu`"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt x --chat",
       "a chat prompt needs a tokenizer with a chat template"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt x --system y", "--system needs --chat"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --prompt x --conversation c.json",
       "give --prompt or --conversation, not both"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --conversation c.json --system y",
       "a --conversation file holds its own system message"},
      {"generate --device cpu " + *hf_ + " --tokenizer byte --conversation /nonexistent/c.json",
       "cannot open `/nonexistent/c.json` (--conversation)"},
  };
  for (const auto& [args, needle] : cases) {
    const SplitResult r = run_split(args);
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
  }
  // a prompt that fills the context exactly: one token, then the context is full
  const SplitResult full = run_split("generate --device cpu " + *hf_ + " --tokenizer byte --prompt " + std::string(63, 'x'));
  ASSERT_EQ(full.status, 0) << full.err;
  EXPECT_NE(full.err.find("generate: 1 tokens"), std::string::npos) << full.err;
  EXPECT_NE(full.err.find("stopped: the context is full (max_seq_len = 64 tokens)"), std::string::npos) << full.err;
}

// --device cuda where no GPU can serve: the error says why (open_model_cuda_test runs the
// command on a GPU).
TEST_F(CliGenerate, DeviceCudaWithoutAGpuIsNamed) {
#ifdef SHARDTRAIN_WITH_CUDA
  if (shardtrain::cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  const std::string needle = "--device cuda, but no usable CUDA device is visible";
#else
  const std::string needle = "--device cuda, but this build has no CUDA backend";
#endif
  const SplitResult r = run_split("generate " + *hf_ + " --tokenizer byte --prompt x --device cuda");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

// A small CPU job of the built-in data and tokenizer, saving a checkpoint at its last step.
std::string small_job(const std::string& output_dir) {
  return "train --model.dim=40 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2 --model.ffn_dim=52 "
         "--model.max_seq_len=32 --training.seq_len=16 --training.batch_size=2 --training.steps=2 "
         "--training.device=cpu --eval.batches=1 --sample.tokens=0 --logging.progress=off "
         "--checkpoint.interval_steps=2 --run.output_dir=" + output_dir;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A byte-tokenizer model's exports (at the end of training, and `shardtrain export` of its
// checkpoint) carry the byte-level tokenizer and its ids, and `generate` samples from the
// export with no --tokenizer exactly as from the checkpoint.
TEST(CliByteExport, GenerateOnTheExportNeedsNoTokenizerFlag) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_byte_export_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const Result train =
      run(small_job(dir.string()) + " --export.folder=" + (dir / "end").string() + " --export.dtype=f32");
  ASSERT_EQ(train.status, 0) << train.output;
  EXPECT_NE(train.output.find("tokenizer: the byte-level tokenizer (data.tokenizer = auto, and no model.hf)"),
            std::string::npos) << train.output;
  const std::string out = (dir / "hf").string();
  const Result exported = run("export " + (dir / "checkpoints").string() + " " + out + " --dtype f32");
  ASSERT_EQ(exported.status, 0) << exported.output;
  for (const std::string& folder : {(dir / "end").string(), out}) {
    for (const auto& [name, text] : shardtrain::data::byte_tokenizer_files())
      EXPECT_EQ(read_text(folder + "/" + name), text) << folder << "/" << name;
    const nlohmann::json config = nlohmann::json::parse(read_text(folder + "/config.json"));
    EXPECT_EQ(config["bos_token_id"], 256) << folder;
    EXPECT_EQ(config["eos_token_id"], 257) << folder;
  }
  const std::string args = " --prompt \"The \" --tokens 12 --seed 3";
  const SplitResult from_export = run_split("generate --device cpu " + out + args);
  ASSERT_EQ(from_export.status, 0) << from_export.err;
  const SplitResult from_checkpoint = run_split("generate --device cpu " + (dir / "checkpoints").string() + args);
  ASSERT_EQ(from_checkpoint.status, 0) << from_checkpoint.err;
  EXPECT_EQ(from_export.out, from_checkpoint.out);
  EXPECT_EQ(from_export.out.rfind("The ", 0), 0u) << from_export.out;
  fs::remove_all(dir);
}

// data.tokenizer = auto with a model.hf folder that holds no tokenizer.json trains with the
// byte-level tokenizer, logs why, and its export carries that tokenizer.
TEST(CliByteExport, AutoFallsBackToTheByteTokenizerForAFolderWithoutOne) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_cli_auto_byte_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string hf = (dir / "model").string();
  const shardtrain::model::LlamaConfig c = shardtrain::testing::tiny_generation_config();
  shardtrain::testing::TinyStore s(c, 9);
  shardtrain::testing::write_hf_folder(s, c, hf, "", false);
  ASSERT_FALSE(fs::exists(hf + "/tokenizer.json"));
  const Result r = run("train --model.hf=" + hf + " --training.seq_len=16 --training.batch_size=2 --training.steps=1 "
                       "--training.device=cpu --eval.batches=1 --sample.tokens=0 --logging.progress=off "
                       "--run.output_dir=" + (dir / "run").string() + " --export.folder=" + (dir / "out").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("tokenizer: the byte-level tokenizer (data.tokenizer = auto, and model.hf `" + hf +
                          "` holds no tokenizer.json; another one: data.tokenizer = the path of a tokenizer.json)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(read_text((dir / "out" / "tokenizer.json").string()), shardtrain::data::byte_tokenizer_files()[0].second);
  fs::remove_all(dir);
}

TEST(CliGenerateShared, HuggingFaceFolderWithTheLlama3Tokenizer) {
  ST_REQUIRE_SHARED_DATA(dir);
  // a random model with Llama 3's vocabulary, exported with its tokenizer files
  shardtrain::model::LlamaConfig c = shardtrain::testing::tiny_generation_config();
  c.vocab_size = 128256;
  c.dim = 16;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.tie_embeddings = true;
  const std::string hf = std::string(SHARDTRAIN_BINARY_DIR) + "/cli_generate_llama3_" + std::to_string(::getpid());
  shardtrain::testing::TinyStore s(c, 5);
  shardtrain::testing::write_hf_folder(s, c, hf, dir + "/tokenizers/llama3");
  const SplitResult r = run_split("generate --device cpu " + hf + " --prompt \"In the beginning\" --tokens 8 --seed 2");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, expected_output(hf, "", sample_options("In the beginning", 8, 0.8, 40, 1, 2)));
  EXPECT_EQ(r.out.rfind("In the beginning", 0), 0u) << r.out;
  // --chat: the message goes through the template (its BOS, no other) and only the reply is
  // printed, ending at the end of the turn
  const SplitResult chat =
      run_split("generate --device cpu " + hf + " --chat --system \"Be brief.\" --prompt Hello --tokens 6 --seed 4");
  EXPECT_EQ(chat.status, 0) << chat.err;
  {
    const shardtrain::train::OpenedModel m = shardtrain::train::open_model(hf);
    const auto tok = shardtrain::train::open_tokenizer("", m);
    SampleOptions o = sample_options("", 6, 0.8, 40, 1, 4);
    const shardtrain::train::ChatPrompt p = shardtrain::train::chat_prompt(*tok, "Be brief.", "Hello");
    o.prompt = p.text;
    o.stop_ids = p.stop_ids;
    o.add_bos = false;
    o.context_limit = shardtrain::train::ContextLimit::kStop;
    const shardtrain::train::SampleResult expected = shardtrain::train::sample(*m.model, *tok, o);
    EXPECT_EQ(expected.prompt_tokens, static_cast<int64_t>(tok->encode(p.text).size()));
    EXPECT_EQ(chat.out, expected.text.substr(p.text.size()) + "\n");
    EXPECT_NE(chat.err.find("prompt " + std::to_string(expected.prompt_tokens) + " tokens"), std::string::npos)
        << chat.err;
  }
  // --conversation: a whole conversation (as a chat data line) goes through the template
  const std::string file = hf + "/conversation.json";
  std::ofstream(file) << R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye?"}], "tools": null})";
  const SplitResult conv = run_split("generate --device cpu " + hf + " --conversation " + file + " --tokens 6 --seed 4");
  EXPECT_EQ(conv.status, 0) << conv.err;
  {
    const shardtrain::train::OpenedModel m = shardtrain::train::open_model(hf);
    const auto tok = shardtrain::train::open_tokenizer("", m);
    SampleOptions o = sample_options("", 6, 0.8, 40, 1, 4);
    const std::vector<shardtrain::data::ChatMessage> messages = {
        {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye?"}};
    const shardtrain::train::ChatPrompt p =
        shardtrain::train::chat_prompt(*tok, messages, shardtrain::data::jinja::Value::none());
    EXPECT_NE(p.text.find("Hello.<|eot_id|>"), std::string::npos) << p.text;
    o.prompt = p.text;
    o.stop_ids = p.stop_ids;
    o.add_bos = false;
    o.context_limit = shardtrain::train::ContextLimit::kStop;
    const shardtrain::train::SampleResult expected = shardtrain::train::sample(*m.model, *tok, o);
    EXPECT_EQ(conv.out, expected.text.substr(p.text.size()) + "\n");
    EXPECT_NE(conv.err.find("prompt " + std::to_string(expected.prompt_tokens) + " tokens"), std::string::npos)
        << conv.err;
  }
  std::ofstream(file) << R"({"messages": [{"role": "user"}]})";
  const SplitResult bad = run_split("generate --device cpu " + hf + " --conversation " + file);
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("conversation.json` (--conversation): message 0: no field `content`"), std::string::npos)
      << bad.err;
  std::filesystem::remove_all(hf);
}

}  // namespace
