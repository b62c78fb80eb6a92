// parallel.timeout_s under mpirun (2, 3 and 4 ranks) with data parallelism without sharding
// (parallel.replicate = the ranks: DDP). No collective across ranks comes before a step's last
// micro-batch; each micro-batch's units still go through their one-rank groups' collectives,
// and those count as progress. A step of many micro-batches that outlasts the limit must not
// be taken for a hang. (A rank that does hang: cli_test's Cli.AHungRankEndsTheRunAfterParallelTimeout.)
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "dist/mpi_communicator.h"
#include "train/trainer.h"

namespace shardtrain {
namespace {

namespace fs = std::filesystem;

TEST(WatchdogRanks, ManyMicroBatchesWithoutACollectiveAreNotAHang) {
  auto comm = dist::make_mpi_world();
  const int w = comm->world_size();
  Tensor pid = Tensor::empty({1}, DType::kI64);
  pid.data<int64_t>()[0] = ::getpid();
  comm->broadcast(pid, 0);
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_watchdog_mpi_" + std::to_string(pid.data<int64_t>()[0]));
  train::JobConfig c;
  c.training.steps = 2;  // the first step has parallel.init_timeout_s more: the second is the one timed
  c.training.batch_size = 8;
  c.training.seq_len = 128;
  c.training.grad_accum_steps = 12;  // ~0.2-0.6 s each on a CI core: a step of 2.4 s and more
  c.model.n_layers = 4;
  c.model.dim = 256;
  c.model.ffn_dim = 768;
  c.parallel.replicate = w;  // DDP: each rank the whole model, gradients summed once per step
  c.parallel.timeout_s = 2.0;
  c.eval.interval_steps = 0;
  c.eval.batches = 1;
  c.sample.tokens = 0;
  c.logging.progress = "off";
  c.run.output_dir = dir.string();
  train::Trainer trainer(c, comm.get());
  const train::TrainSummary s = trainer.run();  // a hang taken would end the process (status 124)
  ASSERT_EQ(s.steps.size(), 2u);
  const double second = 8.0 * 128 * 12 * w / s.steps[1].tokens_per_second;  // the second step's seconds
  EXPECT_GT(second, c.parallel.timeout_s) << "the step must outlast the limit for the test to mean anything";
  comm->barrier();
  if (comm->rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace shardtrain
