// The watchdog: fires once when watched work goes without progress (its start, a collective
// issued) for its limit, or a communicator reports an error, naming the work, the limit and the
// collectives issued; never while idle, in time, or while collectives keep coming.
#include "train/watchdog.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "dist/communicator.h"
#include "io/safetensors_writer.h"

namespace shardtrain::train {
namespace {

using namespace std::chrono_literals;

// What the watchdog fired with, recorded instead of ending the process.
struct Fired {
  std::mutex mutex;
  int count = 0;
  std::string message;
  int status = -1;
  Watchdog::Fire fire() {
    return [this](const std::string& m, int s) {
      const std::lock_guard lock(mutex);
      ++count;
      message = m;
      status = s;
    };
  }
  int times() {
    const std::lock_guard lock(mutex);
    return count;
  }
};

bool wait_for(Watchdog& w, std::chrono::milliseconds most) {
  const auto end = std::chrono::steady_clock::now() + most;
  while (!w.fired() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(5ms);
  return w.fired();
}

TEST(Watchdog, WorkWithoutProgressPastItsLimitFiresOnceNamingItAndTheCollectives) {
  Fired f;
  Watchdog w({}, f.fire(), 0.01);
  dist::note_collective("all_reduce", 40, 2, "mpi");  // before the step: not counted
  w.watch("step 7", 0.2, "parallel.timeout_s = 0.2");
  dist::note_collective("all_gather", 2048, 2, "mpi");
  dist::note_collective("reduce_scatter", 3 << 20, 4, "nccl");
  const auto last = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_for(w, 10s));
  EXPECT_GE(std::chrono::steady_clock::now() - last, 200ms) << "fired before the limit";
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(f.times(), 1);
  EXPECT_EQ(f.status, Watchdog::kTimeoutExit);
  EXPECT_NE(f.message.find("watchdog: step 7 has made no progress for 0."), std::string::npos) << f.message;
  EXPECT_NE(f.message.find(" s (parallel.timeout_s = 0.2): this rank issued 2 collectives in it, the last "
                           "(reduce_scatter of 3.00 MiB over 4 ranks (nccl)) 0."),
            std::string::npos)
      << f.message;
  EXPECT_NE(f.message.find(" s ago, and waits for another rank, which has probably failed, hung or been stopped."),
            std::string::npos)
      << f.message;
  EXPECT_NE(f.message.find("exit status 124"), std::string::npos) << f.message;
}

// Sharded work issues collectives block by block: a step longer than the limit whose rank keeps
// issuing them is not a hang; once they stop, the limit counts from the last.
TEST(Watchdog, CollectivesIssuedKeepALongStepAlive) {
  Fired f;
  Watchdog w({}, f.fire(), 0.01);
  w.watch("step 1", 0.5, "limit");
  for (int block = 0; block < 20; ++block) {  // 1 s of work, twice the limit
    std::this_thread::sleep_for(50ms);
    dist::note_collective("all_gather", 1024, 2, "mpi");
  }
  EXPECT_EQ(f.times(), 0) << f.message;
  const auto last = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_for(w, 10s));
  EXPECT_GE(std::chrono::steady_clock::now() - last, 500ms);
  EXPECT_NE(f.message.find("this rank issued 20 collectives in it"), std::string::npos) << f.message;
}

// A save writes for a long time between its collectives: watched with `writes`, bytes written
// to files are progress; without, the same writing is not.
TEST(Watchdog, WritesKeepAWatchedSaveAliveOnlyWhenTheyCount) {
  const std::string file = (std::filesystem::temp_directory_path() /
                            ("shardtrain_watchdog_writes_" + std::to_string(::getpid()))).string();
  const std::string piece(1 << 16, 'x');
  for (const bool writes : {true, false}) {
    Fired f;
    Watchdog w({}, f.fire(), 0.01);
    w.watch("the checkpoint of step 4", 0.5, "limit", writes);
    for (int i = 0; i < 20 && f.times() == 0; ++i) {  // 1 s of writing, twice the limit
      std::this_thread::sleep_for(50ms);
      io::write_file_atomic(file, piece);
    }
    if (!writes) {
      EXPECT_EQ(f.times(), 1) << "writes do not count unless asked";
      continue;
    }
    EXPECT_EQ(f.times(), 0) << f.message;
    const auto last = std::chrono::steady_clock::now();
    ASSERT_TRUE(wait_for(w, 10s));
    EXPECT_GE(std::chrono::steady_clock::now() - last, 450ms) << "the limit counts from the last write";
    EXPECT_NE(f.message.find("watchdog: the checkpoint of step 4 has made no progress"), std::string::npos)
        << f.message;
    EXPECT_NE(f.message.find("this rank issued no collective in it, and wrote 1310720 bytes to files, the last 0."),
              std::string::npos)
        << f.message;
    EXPECT_NE(f.message.find(" s ago, since when it may be stuck in its filesystem itself, or wait for another rank"),
              std::string::npos)
        << f.message;
  }
  // a collective after the last write: this rank waits for the others
  Fired f;
  Watchdog w({}, f.fire(), 0.01);
  w.watch("the checkpoint of step 8", 0.3, "limit", true);
  io::write_file_atomic(file, piece);
  std::this_thread::sleep_for(50ms);
  dist::note_collective("barrier", 0, 2, "mpi");
  ASSERT_TRUE(wait_for(w, 10s));
  EXPECT_NE(f.message.find("(barrier of 0 B over 2 ranks (mpi)) 0."), std::string::npos) << f.message;
  EXPECT_NE(f.message.find(" s ago, and waits for another rank, which has probably failed, hung or been stopped (it "
                           "wrote 65536 bytes to files in it)."),
            std::string::npos)
      << f.message;
  std::filesystem::remove(file);
}

TEST(Watchdog, WorkThatEndsInTimeOrIsReplacedNeverFires) {
  Fired f;
  Watchdog w({}, f.fire(), 0.01);
  for (int step = 1; step <= 10; ++step) {
    w.watch("step " + std::to_string(step), 1.0, "limit");  // each restarts the clock
    std::this_thread::sleep_for(50ms);
  }
  w.idle();
  std::this_thread::sleep_for(1200ms);  // idle past the limit
  EXPECT_EQ(f.times(), 0) << f.message;
  w.watch("evaluation batch 1 of 2", 0.1, "limit");
  ASSERT_TRUE(wait_for(w, 10s));
  EXPECT_NE(f.message.find("evaluation batch 1 of 2 has made no progress"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("this rank issued no collective in it: it may be stuck itself, or wait for another rank"),
            std::string::npos)
      << f.message;
}

TEST(Watchdog, ACommunicatorsErrorFiresAtOnceEvenWhenIdle) {
  Fired f;
  std::atomic<bool> broken{false};
  Watchdog w([&] { return broken ? std::string("NCCL: remote process exited") : std::string(); }, f.fire(), 0.01);
  w.watch("step 3", 1000, "limit");
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(f.times(), 0);
  broken = true;
  ASSERT_TRUE(wait_for(w, 10s));
  EXPECT_EQ(f.status, Watchdog::kErrorExit);
  EXPECT_NE(f.message.find("a communicator reports an error during step 3: NCCL: remote process exited"),
            std::string::npos)
      << f.message;

  Fired g;
  Watchdog idle([] { return std::string("NCCL: unhandled system error"); }, g.fire(), 0.01);
  ASSERT_TRUE(wait_for(idle, 10s));
  EXPECT_NE(g.message.find("a communicator reports an error: NCCL: unhandled system error"), std::string::npos)
      << g.message;
}

TEST(Watchdog, DestroyedPromptlyWhileWatching) {
  Fired f;
  const auto t0 = std::chrono::steady_clock::now();
  {
    Watchdog w({}, f.fire(), 60);  // a poll interval far beyond the test: the destructor must not wait it out
    w.watch("step 1", 1000, "limit");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(f.times(), 0);
}

}  // namespace
}  // namespace shardtrain::train
