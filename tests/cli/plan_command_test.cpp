// `shardtrain plan` for the shipped jobs with nothing downloaded, and for a Hugging Face folder
// over ranks.
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

#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "testing/shardtrain_binary.h"
#include "testing/shared_data.h"

using Result = shardtrain::testing::CommandResult;
using shardtrain::testing::run_shardtrain;

// The shipped 8B and 405B jobs plan on a machine with nothing downloaded (run from an empty
// folder, where their relative model.hf folders are not), with a step time and a job duration.
TEST(Cli, PlanOfShippedJobsNeedsNoDownloadAndGivesTheTime) {
  const std::string empty =
      (std::filesystem::temp_directory_path() / ("shardtrain_cli_plan_" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(empty);
  const std::string in_empty = "cd " + empty + " &&";
  const std::string configs = shardtrain::testing::source_dir() + "/configs/";
  const Result r = run_shardtrain("plan " + configs + "llama3.1-8b-finetune.toml --ranks 8", in_empty);
  EXPECT_EQ(r.status, 0) << r.output;
  for (const char* said :
       {"model shape: preset llama3.1-8b, as meta-llama/Llama-3.1-8B publishes it: `model.hf` = "
        "`models/Llama-3.1-8B` is not on this machine",
        "8030261248 parameters", "ranks: 8 (GPUs", "estimated peak", "checkpoints every 250 steps (checkpoint.async)",
        "time (model: each op family at its measured rate, communication and offload overlapped as the engine "
        "does; `--mfu X` gives the FLOPs / (ranks x peak x MFU) estimate instead)",
        "131,072 (2 x 4096 tokens x 2 micro-batches x 8 data-parallel ranks)", "tokens/s per GPU, MFU ",
        "matmul bf16", "at 712 TFLOP/s", "attention", "communication", " exposed", " for 2,000 steps"})
    EXPECT_NE(r.output.find(said), std::string::npos) << said << " in\n" << r.output;
  // --mfu X: the FLOPs-over-peak estimate, as before the model
  const Result old = run_shardtrain("plan " + configs + "llama3.1-8b-finetune.toml --ranks 8 --mfu 0.4", in_empty);
  EXPECT_EQ(old.status, 0) << old.output;
  for (const char* said : {"time (estimate: FLOPs / (ranks x peak x MFU); communication is not modelled)",
                           "40 % (--mfu)", "(without --mfu, plan predicts the step from its op families"})
    EXPECT_NE(old.output.find(said), std::string::npos) << said << " in\n" << old.output;
  EXPECT_EQ(old.output.find("time (model:"), std::string::npos) << old.output;
  // the machine's links and host: a slower network across 2 nodes of 4 GPUs makes the step longer
  auto step_of = [&](const std::string& flags) {
    const Result p = run_shardtrain("plan " + configs + "llama3.1-8b-finetune.toml --ranks 8 --gpu h100-sxm " + flags,
                                    in_empty);
    EXPECT_EQ(p.status, 0) << p.output;
    const size_t at = p.output.find("  step  ");
    EXPECT_NE(at, std::string::npos) << p.output;
    return at == std::string::npos ? std::string() : p.output.substr(at, p.output.find('\n', at) - at);
  };
  const std::string one_node = step_of("");
  const std::string slow_network = step_of("--gpus-per-node 4 --inter-node-gbps 100");
  EXPECT_NE(one_node, slow_network);
  const Result bad_rate = run_shardtrain("plan --host-gbps -5");
  EXPECT_EQ(bad_rate.status, 1);
  EXPECT_NE(bad_rate.output.find("plan: --host-gbps must be a positive number of GB/s per node, found -5"),
            std::string::npos)
      << bad_rate.output;
  const Result bad_calibration = run_shardtrain("plan --calibration /nonexistent/rates.json", in_empty);
  EXPECT_EQ(bad_calibration.status, 1);
  EXPECT_NE(bad_calibration.output.find("plan: cannot read --calibration `/nonexistent/rates.json`"),
            std::string::npos)
      << bad_calibration.output;
  const Result big = run_shardtrain("plan " + configs +
                                        "llama3.1-405b-64gpus.toml --ranks 64 --ranks-per-machine 8 --gpu h200 "
                                        "--mfu 0.35",
                                    in_empty);
  EXPECT_EQ(big.status, 0) << big.output;
  for (const char* said :
       {"preset llama3.1-405b", "405853388800 parameters", "989 TFLOP/s dense bf16 per GPU (H200; --gpu), 64 GPUs",
        "35 % (--mfu)", "host memory per machine of 8 ranks"})
    EXPECT_NE(big.output.find(said), std::string::npos) << said << " in\n" << big.output;
  const Result a100 = run_shardtrain(
      "plan " + configs + "llama3.1-8b-finetune.toml --ranks 8 --gpu a100 --training.fp8=rowwise --mfu 0.4", in_empty);
  EXPECT_EQ(a100.status, 0) << a100.output;
  EXPECT_NE(a100.output.find("312 TFLOP/s dense bf16 per GPU (A100; --gpu)"), std::string::npos) << a100.output;
  EXPECT_NE(a100.output.find("which the A100 lacks"), std::string::npos) << a100.output;
  const Result a100_model = run_shardtrain(
      "plan " + configs + "llama3.1-8b-finetune.toml --ranks 8 --gpu a100 --training.fp8=rowwise", in_empty);
  EXPECT_EQ(a100_model.status, 0) << a100_model.output;
  EXPECT_NE(a100_model.output.find("training.fp8 needs FP8 tensor cores (H100, H200), which the a100 lacks: planned at "
                                   "its bf16 rate"),
            std::string::npos)
      << a100_model.output;
  const Result bad_gpu = run_shardtrain("plan --gpu v100");
  EXPECT_EQ(bad_gpu.status, 1);
  EXPECT_NE(
      bad_gpu.output.find("plan: --gpu `v100` is not a GPU plan knows; use one of h100-sxm, h100-pcie, h200, a100"),
      std::string::npos)
      << bad_gpu.output;
  const Result bad_mfu = run_shardtrain("plan --mfu 40");
  EXPECT_EQ(bad_mfu.status, 1);
  EXPECT_NE(bad_mfu.output.find("plan: --mfu must be in (0, 1], found 40 (a fraction of the peak: 0.4 is 40 %)"),
            std::string::npos)
      << bad_mfu.output;
  const Result both =
      run_shardtrain("plan " + configs + "llama3.1-8b-finetune.toml --model.preset=llama3.1-8b", in_empty);
  EXPECT_EQ(both.status, 1);
  EXPECT_NE(both.output.find("`model.preset` (\"llama3.1-8b\") and `model.hf` (\"models/Llama-3.1-8B\")"),
            std::string::npos)
      << both.output;
  const Result preset = run_shardtrain("plan --model.preset=llama3.2-1b --training.seq_len=4096 --training.device=cpu");
  EXPECT_EQ(preset.status, 0) << preset.output;
  EXPECT_NE(preset.output.find("1235814400 parameters"), std::string::npos) << preset.output;
  EXPECT_NE(preset.output.find("time: not estimated for CPU runs"), std::string::npos) << preset.output;
  std::filesystem::remove_all(empty);
}

// A sequence one 80 GB GPU cannot hold: plan names the context-parallel degree that splits it
// enough, with the offload it takes, for a given checkpointing policy and for "auto"; a job that
// fits is offered none.
TEST(Cli, PlanNamesTheContextParallelismALongSequenceNeeds) {
  const std::string job = "plan " + shardtrain::testing::source_dir() +
                          "/configs/llama3.1-8b-finetune.toml --ranks 1 --training.batch_size=1 ";
  const std::string advice = "on 80 GB H100s (79.18 GiB) the job fits with parallel.context_parallel = ";
  for (const char* checkpointing : {"full", "auto"}) {
    const Result r =
        run_shardtrain(job + "--training.seq_len=524288 --training.activation_checkpointing=" + checkpointing);
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(advice), std::string::npos) << checkpointing << ":\n" << r.output;
    EXPECT_NE(r.output.find("tokens of each sequence's 524,288; peak "), std::string::npos) << r.output;
  }
  const Result fits = run_shardtrain(job + "--training.seq_len=4096");
  EXPECT_EQ(fits.status, 0) << fits.output;
  EXPECT_EQ(fits.output.find("parallel.context_parallel = "), std::string::npos) << fits.output;
}

TEST(Cli, PlanReadsAHuggingFaceFolderAndTakesRanks) {
  const std::string hf = shardtrain::testing::source_dir() + "/tests/model/hf_reference/gqa4_llama3_rope";
  const Result r = run_shardtrain("plan --model.hf=" + hf + " --training.seq_len=16 --ranks 4");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("ranks: 4 (GPUs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("estimated peak"), std::string::npos) << r.output;
  const Result bad = run_shardtrain("plan --ranks 0");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("plan: --ranks must be in [1, 1048576], found 0"), std::string::npos) << bad.output;
  // with the state in host memory, the host memory of a machine's ranks adds up
  const Result off = run_shardtrain("plan --model.hf=" + hf +
                                    " --training.seq_len=16 --training.device=cuda "
                                    "--parallel.offload=true --ranks 4 --ranks-per-machine 2");
  EXPECT_EQ(off.status, 0) << off.output;
  EXPECT_NE(off.output.find("host memory per machine of 2 ranks: "), std::string::npos) << off.output;
  EXPECT_NE(off.output.find("needs a GPU of at least "), std::string::npos) << off.output;
  EXPECT_EQ(off.output.find("more than an 80 GB H100 holds"), std::string::npos) << off.output;
  // a job beyond one H100 says so and what lowers it: the 8B shape without checkpointing on 2 ranks
  const Result big =
      run_shardtrain("plan --training.device=cuda --model.dim=4096 --model.n_layers=32 --model.n_heads=32 "
                     "--model.n_kv_heads=8 --model.ffn_dim=14336 --model.vocab_size=128256 "
                     "--model.tie_embeddings=false --model.max_seq_len=4096 --training.seq_len=4096 "
                     "--training.batch_size=4 --ranks 2");
  EXPECT_EQ(big.status, 0) << big.output;
  EXPECT_NE(big.output.find("; more than an 80 GB H100 holds (79.18 GiB): lower training.batch_size or "
                            "training.seq_len, or add ranks, or training.activation_checkpointing = \"full\" ("),
            std::string::npos)
      << big.output;
  const Result too_many = run_shardtrain("plan --ranks 2 --ranks-per-machine 4");
  EXPECT_EQ(too_many.status, 1);
  EXPECT_NE(too_many.output.find("plan: --ranks-per-machine (4) exceeds the 2 ranks"), std::string::npos)
      << too_many.output;
}
