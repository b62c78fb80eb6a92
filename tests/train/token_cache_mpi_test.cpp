// Token caches under mpirun (2, 3 and 4 ranks): rank 0 builds the cache once and every rank
// reads from it the batches the in-memory path gives; ranks that do not see rank 0's folder
// build their own, one per machine; a failed build fails every rank, naming the rank that failed.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "data/byte_tokenizer.h"
#include "data/token_cache.h"
#include "dist/mpi_communicator.h"
#include "testing/compare.h"
#include "train/training_data.h"

namespace shardtrain {
namespace {

namespace fs = std::filesystem;
using testing::throws_with;

// A folder every rank names alike (rank 0's pid, broadcast), created by rank 0.
fs::path shared_folder(dist::Communicator& comm, const std::string& name) {
  Tensor pid = Tensor::empty({1}, DType::kI64);
  pid.data<int64_t>()[0] = ::getpid();
  comm.broadcast(pid, 0);
  const fs::path dir = fs::temp_directory_path() /
                       ("shardtrain_token_cache_mpi_" + std::to_string(pid.data<int64_t>()[0]) + "_" + name);
  if (comm.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::string text;
    for (int i = 0; i < 4000; ++i) text += "{\"text\": \"document " + std::to_string(i) + " of the corpus\"}\n";
    std::ofstream(dir / "corpus.jsonl") << text;
    std::ofstream(dir / "bad.jsonl") << text << "{\"text\": [1]}\n";
    std::string pairs;
    for (int i = 0; i < 2000; ++i)
      pairs += "{\"prompt\": \"q" + std::to_string(i) + "\", \"response\": \"a" + std::to_string(i * 7) + "\"}\n";
    std::ofstream(dir / "pairs.jsonl") << pairs;
  }
  comm.barrier();
  return dir;
}

train::JobConfig job(const fs::path& source, const std::string& cache, const fs::path& cache_dir) {
  train::JobConfig c;
  c.data.source = source.string();
  c.data.token_cache = cache;
  c.data.cache_dir = cache_dir.string();
  c.data.val_fraction = 0.1;
  c.training.seq_len = 24;
  c.training.seed = 9;
  return c;
}

void expect_same_batches(const data::TrainingData& a, const data::TrainingData& b) {
  const int64_t B = 2, T = 24;
  ASSERT_EQ(a.eval_batches(B, T), b.eval_batches(B, T));
  Tensor x = Tensor::empty({B, T}, DType::kI32), tx = Tensor::empty({B, T}, DType::kI32);
  Tensor y = Tensor::empty({B, T}, DType::kI32), ty = Tensor::empty({B, T}, DType::kI32);
  for (int64_t step = 1; step <= 10; ++step) {
    a.fill_train(x, tx, step, 0, 2 * step);
    b.fill_train(y, ty, step, 0, 2 * step);
    ASSERT_TRUE(std::equal(x.data<int32_t>(), x.data<int32_t>() + B * T, y.data<int32_t>())) << "step " << step;
  }
}

size_t entries(const fs::path& dir) {
  if (!fs::exists(dir)) return 0;
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

TEST(TokenCacheRanks, RankZeroBuildsOnceAndEveryRankReadsTheSameBatches) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  const fs::path dir = shared_folder(*comm, "shared");
  data::ByteTokenizer t;
  const auto memory = train::open_training_data(job(dir / "corpus.jsonl", "off", dir / "cache"), t, 258, w);
  // one machine: local ranks are the ranks
  const auto cached = train::open_training_data(job(dir / "corpus.jsonl", "on", dir / "cache"), t, 258, w,
                                                comm.get(), r);
  EXPECT_NE(cached->summary().find("token cache"), std::string::npos) << cached->summary();
  expect_same_batches(*memory, *cached);
  comm->barrier();
  EXPECT_EQ(entries(dir / "cache"), 1u);  // one folder, no temporary left

  // machines that share nothing: each rank's own cache folder, each rank its machine's first
  const fs::path own = dir / ("cache-rank" + std::to_string(r));
  const auto apart = train::open_training_data(job(dir / "corpus.jsonl", "on", own), t, 258, w, comm.get(), 0);
  expect_same_batches(*memory, *apart);
  EXPECT_EQ(entries(own), 1u);
  comm->barrier();
  if (r == 0) fs::remove_all(dir);
}

TEST(TokenCacheRanks, RanksThatArriveAfterTheBuildStillJoinIt) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  const fs::path dir = shared_folder(*comm, "late");
  data::ByteTokenizer t;
  // the other ranks come once rank 0 has built the folder and waits for them: they see it
  // complete, and must still take part in what rank 0 is waiting on
  if (r != 0) std::this_thread::sleep_for(std::chrono::milliseconds(800));
  const auto cached = train::open_training_data(job(dir / "corpus.jsonl", "on", dir / "cache"), t, 258, w,
                                                comm.get(), r);
  const auto memory = train::open_training_data(job(dir / "corpus.jsonl", "off", dir / "cache"), t, 258, w);
  expect_same_batches(*memory, *cached);
  comm->barrier();
  if (r == 0) fs::remove_all(dir);
}

TEST(TokenCacheRanks, FineTuningExamplesToo) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  const fs::path dir = shared_folder(*comm, "examples");
  data::ByteTokenizer t;
  train::JobConfig memory = job(dir / "pairs.jsonl", "off", dir / "cache");
  memory.data.format = "sft";
  train::JobConfig cached = memory;
  cached.data.token_cache = "on";
  const auto a = train::open_training_data(memory, t, 258, w);
  const auto b = train::open_training_data(cached, t, 258, w, comm.get(), r);
  EXPECT_NE(b->summary().find("token cache"), std::string::npos) << b->summary();
  expect_same_batches(*a, *b);
  comm->barrier();
  EXPECT_EQ(entries(dir / "cache"), 1u);
  comm->barrier();
  if (r == 0) fs::remove_all(dir);
}

TEST(TokenCacheRanks, AFolderOnlyRankZeroSeesFailsTheOthersByName) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  const fs::path dir = shared_folder(*comm, "unshared");
  data::ByteTokenizer t;
  // each rank its own folder, all on one machine (local ranks 0..w-1): only local rank 0 builds
  const fs::path own = dir / ("cache-rank" + std::to_string(r));
  auto open = [&] { train::open_training_data(job(dir / "corpus.jsonl", "on", own), t, 258, w, comm.get(), r); };
  if (r == 0) {
    EXPECT_NO_THROW(open());
  } else {
    EXPECT_TRUE(throws_with(open, "is not visible to this rank after its machine's first rank (LOCAL_RANK 0) built "
                                  "it; set data.cache_dir to a folder every rank of a machine shares"));
  }
  comm->barrier();
  if (r == 0) fs::remove_all(dir);
}

TEST(TokenCacheRanks, AFailedBuildFailsEveryRank) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  const fs::path dir = shared_folder(*comm, "failed");
  data::ByteTokenizer t;
  auto open = [&] { train::open_training_data(job(dir / "bad.jsonl", "on", dir / "cache"), t, 258, w, comm.get(), r); };
  if (r == 0) {
    EXPECT_TRUE(throws_with(open, "line 4001: field `text` is not a string"));
  } else {
    EXPECT_TRUE(throws_with(open, "could not be built (1 rank(s) failed; see rank 0's error)"));
  }
  comm->barrier();
  EXPECT_EQ(entries(dir / "cache"), 0u);
  comm->barrier();
  if (r == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace shardtrain
