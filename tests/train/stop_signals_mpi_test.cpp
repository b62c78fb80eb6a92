// checkpoint.on_signal under mpirun (2, 3 and 4 ranks): a signal that reaches one rank only
// stops every rank after the same step, which is saved; the run resumes from it.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "dist/mpi_communicator.h"
#include "train/stop_signals.h"
#include "train/trainer.h"

namespace shardtrain {
namespace {

namespace fs = std::filesystem;

// A folder every rank names alike (rank 0's pid, broadcast), made empty by rank 0.
fs::path shared_folder(dist::Communicator& comm) {
  Tensor pid = Tensor::empty({1}, DType::kI64);
  pid.data<int64_t>()[0] = ::getpid();
  comm.broadcast(pid, 0);
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_stop_signals_mpi_" + std::to_string(pid.data<int64_t>()[0]));
  if (comm.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  comm.barrier();
  return dir;
}

train::JobConfig job(const fs::path& dir, int64_t steps) {
  train::JobConfig c;
  c.training.steps = steps;
  c.training.batch_size = 4;
  c.training.seq_len = 32;
  c.model.n_layers = 2;
  c.model.dim = 64;
  c.model.ffn_dim = 128;
  c.eval.interval_steps = 0;
  c.sample.tokens = 0;
  c.logging.progress = "off";
  c.logging.interval_steps = 1000;
  c.run.output_dir = dir.string();
  return c;
}

TEST(StopSignalsRanks, ASignalAtTheLastRankStopsEveryRankAfterOneStepAndSavesIt) {
  auto comm = dist::make_mpi_world();
  const int w = comm->world_size();
  const fs::path dir = shared_folder(*comm);
  train::TrainSummary s;
  {
    train::Trainer trainer(job(dir, 1000000), comm.get());
    std::jthread signaller;
    if (comm->rank() == w - 1)  // once the handlers are in place and a few steps have run
      signaller = std::jthread([] {
        while (!train::StopSignals::installed()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        ::kill(::getpid(), SIGUSR1);
      });
    s = trainer.run();
  }
  EXPECT_FALSE(train::StopSignals::installed());
  EXPECT_EQ(s.stopped_by_signal, SIGUSR1);
  ASSERT_FALSE(s.steps.empty());
  const int64_t last = s.steps.back().step;
  EXPECT_LT(last, 1000000);
  Tensor steps = Tensor::empty({2}, DType::kF64);
  steps.data<double>()[0] = static_cast<double>(last);
  steps.data<double>()[1] = static_cast<double>(last) * static_cast<double>(last);
  comm->all_reduce(steps, dist::ReduceOp::kSum);
  EXPECT_EQ(steps.data<double>()[0], static_cast<double>(last) * w) << "every rank stops after the same step";
  EXPECT_EQ(steps.data<double>()[1], static_cast<double>(last) * static_cast<double>(last) * w);
  const fs::path saved = dir / "checkpoints" / fmt::format("step_{:08d}", last);
  EXPECT_TRUE(fs::is_directory(saved)) << saved;

  // resumed: the steps after it, to the end, with no signal
  train::JobConfig again = job(dir, last + 2);
  again.checkpoint.resume = "auto";
  train::Trainer resumed(again, comm.get());
  const train::TrainSummary r = resumed.run();
  EXPECT_EQ(r.stopped_by_signal, 0);
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(r.steps.front().step, last + 1);
  comm->barrier();
  if (comm->rank() == 0) fs::remove_all(dir);
}

// A signal at one rank during an evaluation: every rank stops it before the same batch, saves
// the step it follows and reports no held-out loss for it.
TEST(StopSignalsRanks, ASignalDuringAnEvaluationStopsItAtEveryRank) {
  auto comm = dist::make_mpi_world();
  const int w = comm->world_size();
  const fs::path dir = shared_folder(*comm);
  train::JobConfig c = job(dir, 1000000);
  c.eval.interval_steps = 2;
  c.eval.batches = 0;              // the whole held-out split: many batches
  c.data.val_fraction = 0.3;
  c.logging.metrics_file = "metrics.jsonl";
  train::TrainSummary s;
  {
    train::Trainer trainer(c, comm.get());
    std::jthread signaller;
    if (comm->rank() == w - 1)  // once step 2's metrics are written, its evaluation follows
      signaller = std::jthread([file = dir / "metrics.jsonl"] {
        for (;;) {
          std::ifstream in(file);
          std::string all((std::istreambuf_iterator<char>(in)), {});
          if (all.find("\"step\":2,\"time_") != std::string::npos) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        ::kill(::getpid(), SIGUSR1);
      });
    s = trainer.run();
  }
  EXPECT_EQ(s.stopped_by_signal, SIGUSR1);
  ASSERT_FALSE(s.steps.empty());
  EXPECT_EQ(s.steps.back().step, 2);
  EXPECT_TRUE(s.evals.empty()) << "no held-out loss for a stopped evaluation";
  EXPECT_TRUE(fs::is_directory(dir / "checkpoints" / "step_00000002"));
  comm->barrier();
  if (comm->rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace shardtrain
