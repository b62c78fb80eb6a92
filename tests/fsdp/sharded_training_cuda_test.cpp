// Sharded training on several GPUs (NCCL, overlapped gathers and reduce-scatters) follows
// one GPU with the same global batch: `shardtrain train` is started as 2 ranks with a
// torchrun-style environment and as 1 rank, and their loss curves are compared step by step
// (bf16 compute: the two differ only in GEMM shapes and reduction order); so does a 2-rank run
// with ZeRO-3 CPU offload and activation offload; a stopped or killed rank ends the other
// through its watchdog (parallel.timeout_s). Skips with fewer than 2 GPUs.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/cuda/device.h"
#include "core/random.h"
#include "testing/free_port.h"
#include "testing/shardtrain_binary.h"

extern char** environ;

namespace shardtrain {
namespace {

namespace fs = std::filesystem;

using testing::shardtrain_binary;

using testing::free_port;

fs::path scratch() {
  const fs::path d = fs::temp_directory_path() / ("shardtrain_fsdp_cuda_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

std::string write_corpus() {
  const std::string path = (scratch() / "corpus.txt").string();
  const char* subjects[] = {"the cat", "a dog", "my friend", "the old man", "every child", "our teacher"};
  const char* verbs[] = {"sees", "likes", "finds", "paints", "follows", "remembers"};
  const char* objects[] = {"the river", "a red ball", "the moon", "some bread", "the quiet house", "a letter"};
  std::ofstream f(path);
  CounterRng rng(7);
  for (int doc = 0; doc < 600; ++doc) {
    for (int s = 0; s < 4; ++s)
      f << subjects[rng.next_below(6)] << ' ' << verbs[rng.next_below(6)] << ' ' << objects[rng.next_below(6)] << ". ";
    f << "\n\n";
  }
  return path;
}

// This process's environment without the variables that name a torchrun-style rank.
std::vector<std::string> environment_without_launch_variables() {
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    bool launcher = false;
    for (const char* v : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "MASTER_ADDR=", "MASTER_PORT="})
      launcher = launcher || kv.rfind(v, 0) == 0;
    if (!launcher) out.push_back(kv);
  }
  return out;
}

// Starts argv[0] with `env`, stdout and stderr to `log`.
pid_t spawn(std::vector<std::string> argv_strings, std::vector<std::string> env_strings, const fs::path& log) {
  std::vector<char*> argv, envp;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data()), 0) << argv[0];
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

// Waits for every process, killing those still running after 5 minutes; exit statuses.
std::vector<int> wait_all(const std::vector<pid_t>& pids) {
  std::vector<int> status(pids.size(), -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  size_t left = pids.size();
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (status[i] != -1) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        status[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i)
        if (status[i] == -1) ::kill(pids[i], SIGKILL);
      ADD_FAILURE() << "the processes did not finish within 5 minutes";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return status;
}

// Starts `ranks` processes of `shardtrain train args...` (rank r on GPU r); output goes to
// <out>/rank<r>.log.
std::vector<pid_t> start_ranks(int ranks, const std::vector<std::string>& args, const fs::path& out) {
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> env = environment_without_launch_variables();
    if (ranks > 1) {
      env.push_back("RANK=" + std::to_string(r));
      env.push_back("WORLD_SIZE=" + std::to_string(ranks));
      env.push_back("LOCAL_RANK=" + std::to_string(r));
      env.push_back("MASTER_ADDR=127.0.0.1");
      env.push_back("MASTER_PORT=" + std::to_string(port));
    }
    std::vector<std::string> argv = {shardtrain_binary(), "train"};
    argv.insert(argv.end(), args.begin(), args.end());
    pids.push_back(spawn(argv, env, out / ("rank" + std::to_string(r) + ".log")));
  }
  return pids;
}

// start_ranks, then waits for all: each one's exit status.
std::vector<int> launch(int ranks, const std::vector<std::string>& args, const fs::path& out) {
  return wait_all(start_ranks(ranks, args, out));
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct Curve {
  std::vector<double> loss, grad_norm;
  double eval = NAN;
  double peak_device_bytes = 0;  // the largest any step reports
};

Curve read_metrics(const fs::path& file) {
  Curve c;
  std::ifstream f(file);
  std::string line;
  while (std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss")) {
      c.loss.push_back(j["loss"].get<double>());
      c.grad_norm.push_back(j["grad_norm"].get<double>());
    }
    if (j.contains("eval_loss")) c.eval = j["eval_loss"].get<double>();
    if (j.contains("peak_device_bytes"))
      c.peak_device_bytes = std::max(c.peak_device_bytes, j["peak_device_bytes"].get<double>());
  }
  return c;
}

std::vector<std::string> job(const std::string& corpus, int64_t batch, const fs::path& out) {
  return {"--model.dim=256", "--model.n_layers=3", "--model.n_heads=4", "--model.n_kv_heads=2",
          "--model.ffn_dim=640", "--model.tie_embeddings=false", "--training.seq_len=128",
          "--training.batch_size=" + std::to_string(batch), "--training.grad_accum_steps=2", "--training.steps=30",
          "--training.max_grad_norm=0.5", "--schedule.warmup_steps=5", "--optimizer.lr=2e-3",
          "--eval.interval_steps=0", "--eval.batches=2", "--sample.tokens=0", "--logging.progress=off",
          "--data.source=" + corpus, "--training.device=cuda", "--run.output_dir=" + out.string(),
          // the launch test compares runs step for step: the same algorithms in both
          "--training.gemm_selection=heuristic"};
}

TEST(ShardedTrainingCuda, TwoGpusFollowOneGpu) {
  const int gpus = cuda::device_count();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
  const std::string corpus = write_corpus();
  const int64_t B = 4;

  const fs::path one = scratch() / "one", two = scratch() / "two", two_bf16 = scratch() / "two_bf16";
  for (const fs::path& d : {one, two, two_bf16}) fs::create_directories(d);
  std::vector<int> st = launch(1, job(corpus, 2 * B, one), one);
  ASSERT_EQ(st[0], 0) << read_file(one / "rank0.log");
  st = launch(2, job(corpus, B, two), two);
  ASSERT_EQ(st[0], 0) << read_file(two / "rank0.log");
  ASSERT_EQ(st[1], 0) << read_file(two / "rank1.log");
  std::vector<std::string> bf16 = job(corpus, B, two_bf16);
  bf16.push_back("--parallel.reduce_dtype=bf16");
  st = launch(2, bf16, two_bf16);
  ASSERT_EQ(st[0], 0) << read_file(two_bf16 / "rank0.log");
  // ZeRO-3 with CPU offload on both ranks (host AdamW beside the next forward, gradients
  // accumulated on the host over the two micro-batches) and the checkpointed block inputs in
  // host memory too: the same curve
  const fs::path two_offload = scratch() / "two_offload";
  fs::create_directories(two_offload);
  std::vector<std::string> offload = job(corpus, B, two_offload);
  offload.insert(offload.end(), {"--parallel.offload=true", "--training.offload_activations=true",
                                 "--training.offload_activations_blocks=64",  // all but two (auto: none)
                                 "--training.activation_checkpointing=full"});
  st = launch(2, offload, two_offload);
  ASSERT_EQ(st[0], 0) << read_file(two_offload / "rank0.log");
  ASSERT_EQ(st[1], 0) << read_file(two_offload / "rank1.log");
  EXPECT_NE(read_file(two_offload / "rank0.log").find("training.offload_activations:"), std::string::npos);
  // two replicas of one GPU each (DDP through parallel.replicate: whole units in place, the
  // gradients all-reduced), resident and with ZeRO-3 CPU offload: the same curve
  const fs::path ddp = scratch() / "ddp", ddp_offload = scratch() / "ddp_offload";
  for (const fs::path& d : {ddp, ddp_offload}) fs::create_directories(d);
  std::vector<std::string> args_ddp = job(corpus, B, ddp), args_ddp_offload = job(corpus, B, ddp_offload);
  args_ddp.push_back("--parallel.replicate=2");
  args_ddp_offload.insert(args_ddp_offload.end(), {"--parallel.replicate=2", "--parallel.offload=true"});
  for (const auto& [args, out] : {std::pair{&args_ddp, ddp}, std::pair{&args_ddp_offload, ddp_offload}}) {
    st = launch(2, *args, out);
    ASSERT_EQ(st[0], 0) << read_file(out / "rank0.log");
    ASSERT_EQ(st[1], 0) << read_file(out / "rank1.log");
  }
  EXPECT_NE(read_file(ddp / "rank0.log").find("as 2 replicas of 1 rank"), std::string::npos)
      << read_file(ddp / "rank0.log");

  const std::string log = read_file(two / "rank0.log");
  EXPECT_NE(log.find("sharded over 2 ranks (nccl)"), std::string::npos) << log;
  EXPECT_NE(log.find("comm wait"), std::string::npos) << log;

  const Curve a = read_metrics(one / "metrics.jsonl"), b = read_metrics(two / "metrics.jsonl"),
              c = read_metrics(two_bf16 / "metrics.jsonl"), d = read_metrics(two_offload / "metrics.jsonl"),
              e = read_metrics(ddp / "metrics.jsonl"), f = read_metrics(ddp_offload / "metrics.jsonl");
  ASSERT_EQ(a.loss.size(), 30u);
  ASSERT_EQ(b.loss.size(), 30u);
  ASSERT_EQ(c.loss.size(), 30u);
  ASSERT_EQ(d.loss.size(), 30u);
  ASSERT_EQ(e.loss.size(), 30u);
  ASSERT_EQ(f.loss.size(), 30u);
  // Step 1 sees identical weights and tokens: only the forward's GEMM shapes differ.
  EXPECT_NEAR(b.loss[0], a.loss[0], 2e-3 * a.loss[0]);
  EXPECT_NEAR(b.grad_norm[0], a.grad_norm[0], 1e-2 * a.grad_norm[0]);
  double worst = 0, worst_bf16 = 0, worst_offload = 0, worst_ddp = 0, worst_ddp_offload = 0;
  for (size_t i = 0; i < a.loss.size(); ++i) {
    worst_ddp = std::max(worst_ddp, std::abs(e.loss[i] - a.loss[i]) / a.loss[i]);
    worst_ddp_offload = std::max(worst_ddp_offload, std::abs(f.loss[i] - a.loss[i]) / a.loss[i]);
    worst = std::max(worst, std::abs(b.loss[i] - a.loss[i]) / a.loss[i]);
    worst_bf16 = std::max(worst_bf16, std::abs(c.loss[i] - a.loss[i]) / a.loss[i]);
    worst_offload = std::max(worst_offload, std::abs(d.loss[i] - a.loss[i]) / a.loss[i]);
  }
  std::printf("worst relative loss gap over 30 steps: f32 reduce %.2e, bf16 reduce %.2e, offloaded %.2e; eval %.4f "
              "vs %.4f\n", worst, worst_bf16, worst_offload, b.eval, a.eval);
  EXPECT_LT(worst, 1e-2);
  EXPECT_LT(worst_bf16, 2e-2);
  EXPECT_LT(worst_offload, 1e-2);  // as the f32 reduce: offload moves only where AdamW runs and micro-batches add
  std::printf("2 replicas (DDP): worst relative loss gap %.2e, offloaded %.2e; eval %.4f\n", worst_ddp,
              worst_ddp_offload, e.eval);
  EXPECT_LT(worst_ddp, 1e-2);
  EXPECT_LT(worst_ddp_offload, 1e-2);
  EXPECT_NEAR(e.eval, a.eval, 1e-2 * a.eval);
  EXPECT_NEAR(b.eval, a.eval, 1e-2 * a.eval);
  EXPECT_LT(a.loss.back(), a.loss.front() - 1.0) << "the run should learn";
}

// parallel.reductions_in_flight changes only when the backward waits for a reduce-scatter, not
// what is computed: with the deterministic attention backward, runs that wait for every
// reduction (0), double-buffer (1, the default) and keep two in flight give the same losses
// and gradient norms bit for bit, and waiting for each reduction never needs more memory.
TEST(ShardedTrainingCuda, ReductionsInFlightChangeNoBit) {
  const int gpus = cuda::device_count();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
  const std::string corpus = write_corpus();
  std::vector<Curve> curves;
  for (const char* n : {"2", "1", "0"}) {
    const fs::path out = scratch() / (std::string("in_flight_") + n);
    fs::create_directories(out);
    std::vector<std::string> args = job(corpus, 4, out);
    args.insert(args.end(), {"--training.deterministic=true", "--training.activation_checkpointing=full",
                             "--training.steps=12", std::string("--parallel.reductions_in_flight=") + n});
    const std::vector<int> st = launch(2, args, out);
    ASSERT_EQ(st[0], 0) << read_file(out / "rank0.log");
    ASSERT_EQ(st[1], 0) << read_file(out / "rank1.log");
    curves.push_back(read_metrics(out / "metrics.jsonl"));
  }
  const double peaks[] = {curves[0].peak_device_bytes, curves[1].peak_device_bytes, curves[2].peak_device_bytes};
  std::printf("peak device bytes with 2, 1, 0 reductions in flight: %.0f, %.0f, %.0f\n", peaks[0], peaks[1], peaks[2]);
  ASSERT_EQ(curves[0].loss.size(), 12u);
  for (size_t k = 1; k < curves.size(); ++k) {
    ASSERT_EQ(curves[k].loss.size(), curves[0].loss.size());
    for (size_t i = 0; i < curves[0].loss.size(); ++i) {
      EXPECT_EQ(curves[k].loss[i], curves[0].loss[i]) << "run " << k << " step " << i + 1;
      EXPECT_EQ(curves[k].grad_norm[i], curves[0].grad_norm[i]) << "run " << k << " step " << i + 1;
    }
  }
  EXPECT_GT(peaks[2], 0);
  EXPECT_LE(peaks[2], peaks[0]);
  EXPECT_LE(peaks[1], peaks[0]);
}

// A tensor-parallel group of 2 GPUs (each holding half of every block's heads and FFN columns
// and half of each batch's token rows) follows one GPU with the same batch; it exports a
// Hugging Face folder of whole tensors and samples over the KV cache of its half of the heads.
// So does the group with ZeRO-3 CPU offload and its checkpointed block inputs in host memory,
// its rows moved by NCCL's kernels instead of the copy engines.
TEST(ShardedTrainingCuda, TensorParallelGroupFollowsOneGpu) {
  const int gpus = cuda::device_count();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
  const std::string corpus = write_corpus();
  const int64_t B = 8;
  const fs::path one = scratch() / "tp_one", two = scratch() / "tp_two", offloaded = scratch() / "tp_offloaded";
  for (const fs::path& d : {one, two, offloaded}) fs::create_directories(d);
  std::vector<std::string> args_one = job(corpus, B, one), args_two = job(corpus, B, two);
  for (auto* args : {&args_one, &args_two})
    args->insert(args->end(), {"--sample.tokens=24", "--sample.prompt=the cat", "--sample.temperature=0"});
  args_two.insert(args_two.end(), {"--parallel.tensor_parallel=2", "--export.folder=" + (two / "hf").string()});
  std::vector<int> st = launch(1, args_one, one);
  ASSERT_EQ(st[0], 0) << read_file(one / "rank0.log");
  st = launch(2, args_two, two);
  ASSERT_EQ(st[0], 0) << read_file(two / "rank0.log");
  ASSERT_EQ(st[1], 0) << read_file(two / "rank1.log");
  std::vector<std::string> args_offloaded = job(corpus, B, offloaded);
  args_offloaded.insert(args_offloaded.end(),
                        {"--parallel.tensor_parallel=2", "--parallel.offload=true", "--training.offload_activations=true",
                         "--training.offload_activations_blocks=64", "--training.activation_checkpointing=full"});
  ::setenv("SHARDTRAIN_TP_COPY_ENGINES", "0", 1);  // this group's exchanges through NCCL's send/recv
  st = launch(2, args_offloaded, offloaded);
  ::unsetenv("SHARDTRAIN_TP_COPY_ENGINES");
  ASSERT_EQ(st[0], 0) << read_file(offloaded / "rank0.log");
  ASSERT_EQ(st[1], 0) << read_file(offloaded / "rank1.log");
  EXPECT_NE(read_file(offloaded / "rank0.log").find("training.offload_activations:"), std::string::npos);
  EXPECT_NE(read_file(offloaded / "rank0.log").find("tensor-parallel (the group's rows moved by nccl)"),
            std::string::npos);
  const std::string log = read_file(two / "rank0.log");
  // GPUs of one host: the group's exchanges beside its products go through the copy engines
  EXPECT_NE(log.find("sharded over 2 ranks (nccl) as 1 data-parallel x 2 tensor-parallel (the group's rows moved by "
                     "copy engines)"),
            std::string::npos)
      << log;
  EXPECT_TRUE(fs::exists(two / "hf" / "model.safetensors")) << log;

  const Curve a = read_metrics(one / "metrics.jsonl"), b = read_metrics(two / "metrics.jsonl"),
              c = read_metrics(offloaded / "metrics.jsonl");
  ASSERT_EQ(a.loss.size(), 30u);
  ASSERT_EQ(b.loss.size(), 30u);
  ASSERT_EQ(c.loss.size(), 30u);
  EXPECT_NEAR(b.loss[0], a.loss[0], 2e-3 * a.loss[0]);  // identical weights and tokens: only the products split
  EXPECT_NEAR(b.grad_norm[0], a.grad_norm[0], 1e-2 * a.grad_norm[0]);
  double worst = 0, worst_offloaded = 0;
  for (size_t i = 0; i < a.loss.size(); ++i) {
    worst = std::max(worst, std::abs(b.loss[i] - a.loss[i]) / a.loss[i]);
    worst_offloaded = std::max(worst_offloaded, std::abs(c.loss[i] - a.loss[i]) / a.loss[i]);
  }
  std::printf("tensor-parallel group of 2: worst relative loss gap over 30 steps %.2e, offloaded %.2e; eval %.4f "
              "vs %.4f\n", worst, worst_offloaded, b.eval, a.eval);
  EXPECT_LT(worst, 1e-2);  // the bound of the data-parallel runs above
  EXPECT_LT(worst_offloaded, 1e-2);
  EXPECT_NEAR(b.eval, a.eval, 1e-2 * a.eval);
  EXPECT_NEAR(c.eval, a.eval, 1e-2 * a.eval);
}

// The path of `name` in PATH, or "" when there is none.
std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  std::string dirs = path;
  for (size_t pos = 0; pos <= dirs.size();) {
    size_t end = dirs.find(':', pos);
    if (end == std::string::npos) end = dirs.size();
    const fs::path candidate = fs::path(dirs.substr(pos, end - pos)) / name;
    if (!candidate.parent_path().empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    pos = end + 1;
  }
  return "";
}

// Under mpirun the ranks learn who they are from MPI, which also hands out NCCL's id: the
// run must equal the torchrun-style one step for step.
TEST(ShardedTrainingCuda, MpirunLaunchEqualsTorchrunStyleLaunch) {
  const int gpus = cuda::device_count();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
  const std::string mpirun = find_in_path("mpirun");
  if (mpirun.empty()) GTEST_SKIP() << "no mpirun in PATH";
  const std::string corpus = write_corpus();
  const fs::path env_run = scratch() / "env_launch", mpi_run = scratch() / "mpi_launch";
  for (const fs::path& d : {env_run, mpi_run}) fs::create_directories(d);
  std::vector<int> st = launch(2, job(corpus, 4, env_run), env_run);
  ASSERT_EQ(st[0], 0) << read_file(env_run / "rank0.log");
  ASSERT_EQ(st[1], 0) << read_file(env_run / "rank1.log");

  std::vector<std::string> argv_strings = {mpirun, "-np", "2"};
  if (::geteuid() == 0) argv_strings.push_back("--allow-run-as-root");
  for (const char* v : {"LD_LIBRARY_PATH", "NCCL_NVLS_ENABLE", "SHARDTRAIN_SOURCE_DIR"})
    if (std::getenv(v) != nullptr) argv_strings.insert(argv_strings.end(), {"-x", v});
  argv_strings.insert(argv_strings.end(), {shardtrain_binary(), "train"});
  const std::vector<std::string> args = job(corpus, 4, mpi_run);
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  // no torchrun-style variables: MPI alone must tell each rank who it is
  const fs::path log = mpi_run / "mpirun.log";
  const std::vector<int> st_mpi = wait_all({spawn(argv_strings, environment_without_launch_variables(), log)});
  ASSERT_EQ(st_mpi[0], 0) << read_file(log);
  EXPECT_NE(read_file(log).find("sharded over 2 ranks (nccl)"), std::string::npos) << read_file(log);

  const Curve a = read_metrics(env_run / "metrics.jsonl"), b = read_metrics(mpi_run / "metrics.jsonl");
  ASSERT_EQ(a.loss.size(), 30u);
  ASSERT_EQ(b.loss.size(), 30u);
  for (size_t i = 0; i < a.loss.size(); ++i)
    EXPECT_NEAR(b.loss[i], a.loss[i], 1e-5 * a.loss[i]) << "step " << i + 1;
}

// parallel.timeout_s over NCCL: rank 1 stopped (SIGSTOP, as a hung rank) or killed mid-run
// leaves rank 0 waiting on the GPU for a collective; its watchdog ends it (124 after the
// limit, or 1 at once where NCCL reports the peer gone), naming the step.
TEST(ShardedTrainingCuda, AStoppedOrKilledRankEndsTheOtherThroughTheWatchdog) {
  const int gpus = cuda::device_count();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
  const std::string corpus = write_corpus();
  for (const int signal : {SIGSTOP, SIGKILL}) {
    const fs::path out = scratch() / (signal == SIGSTOP ? "watchdog_stop" : "watchdog_kill");
    fs::create_directories(out);
    std::vector<std::string> args = job(corpus, 4, out);
    args.insert(args.end(), {"--training.steps=100000", "--logging.interval_steps=1", "--parallel.timeout_s=5"});
    const std::vector<pid_t> pids = start_ranks(2, args, out);
    const auto begun = std::chrono::steady_clock::now();
    while (read_file(out / "rank0.log").find("step     3/100000") == std::string::npos &&
           std::chrono::steady_clock::now() - begun < std::chrono::minutes(3))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_NE(read_file(out / "rank0.log").find("step     3/100000"), std::string::npos) << read_file(out / "rank0.log");
    const auto signalled = std::chrono::steady_clock::now();
    ::kill(pids[1], signal);
    const std::vector<int> status = wait_all({pids[0]});
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
    ::kill(pids[1], SIGKILL);
    wait_all({pids[1]});
    const std::string log = read_file(out / "rank0.log");
    std::printf("rank 1 %s: rank 0 ended after %.1f s with status %d\n", signal == SIGSTOP ? "stopped" : "killed",
                seconds, status[0]);
    EXPECT_LT(seconds, 60.0) << log;
    EXPECT_NE(log.find("[rank 0] error: watchdog: "), std::string::npos) << log;
    if (status[0] == 124) {
      EXPECT_GE(seconds, 4.0) << log;  // the limit counts from rank 0's last collective, issued up to a step ahead
      EXPECT_NE(log.find(" has made no progress for "), std::string::npos) << log;
      EXPECT_NE(log.find("(parallel.timeout_s = 5): this rank issued "), std::string::npos) << log;
      EXPECT_NE(log.find(" ranks (nccl)) "), std::string::npos) << log;
    } else {
      EXPECT_EQ(signal, SIGKILL) << "a stopped rank raises no error: only the limit ends the other\n" << log;
      EXPECT_EQ(status[0], 1) << log;
      EXPECT_NE(log.find("a communicator reports an error"), std::string::npos) << log;
    }
  }
}

}  // namespace
}  // namespace shardtrain
