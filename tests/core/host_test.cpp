// How many host threads a rank takes: its own CPUs when a launcher bound it, else its share
// of the machine's among the ranks that run there.
#include "core/host.h"

#include <gtest/gtest.h>

namespace shardtrain {
namespace {

TEST(Host, ThreadsPerRankShareAnUnboundMachine) {
  EXPECT_EQ(host_threads_per_rank(64, 64, 4), 16);  // torchrun, 4 GPUs of a 64-core host
  EXPECT_EQ(host_threads_per_rank(64, 64, 0), 64) << "unknown: one rank";
  EXPECT_EQ(host_threads_per_rank(64, 64, 1), 64);
  EXPECT_EQ(host_threads_per_rank(16, 16, 3), 5);
  EXPECT_EQ(host_threads_per_rank(2, 2, 8), 1) << "more ranks than cores: one thread each";
}

TEST(Host, ThreadsPerRankKeepALaunchersBinding) {
  EXPECT_EQ(host_threads_per_rank(16, 128, 8), 16) << "srun --cpus-per-task=16: the rank's own CPUs";
  EXPECT_EQ(host_threads_per_rank(1, 128, 8), 1);
}

TEST(Host, ThisMachinesCpus) {
  EXPECT_GE(machine_cpus(), 1);
  EXPECT_GE(affinity_cpus(), 1);
  EXPECT_LE(affinity_cpus(), machine_cpus());
}

}  // namespace
}  // namespace shardtrain
