// The launch's communicator from the environment: a single rank without a launcher, and a
// torchrun-style launch of several CPU ranks refused with what to do instead.
#include "dist/world.h"

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"

namespace shardtrain::dist {
namespace {

// Clears every variable a launcher sets (torchrun, Slurm, mpirun) for the test, and again after.
class LaunchEnvGuard {
 public:
  LaunchEnvGuard() { clear(); }
  ~LaunchEnvGuard() { clear(); }

 private:
  static void clear() {
    for (const char* v :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS",
          "SLURM_LOCALID", "TORCHELASTIC_USE_AGENT_STORE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
      unsetenv(v);
  }
};

WorldOptions cpu_options() {
  WorldOptions options;
  options.use_gpus = false;
  options.init_timeout_s = 5;
  return options;
}

TEST(World, SingleRankWithoutALauncher) {
  LaunchEnvGuard guard;
  EXPECT_FALSE(launched_with_several_ranks());
  const World world = make_world(cpu_options());
  ASSERT_NE(world.comm, nullptr);
  EXPECT_EQ(world.comm->world_size(), 1);
  EXPECT_EQ(world.comm->rank(), 0);
  EXPECT_EQ(world.gpu_index, -1);
}

TEST(World, TorchrunStyleLaunchOfOneRankIsASingleRank) {
  LaunchEnvGuard guard;
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  EXPECT_FALSE(launched_with_several_ranks());
  const World world = make_world(cpu_options());
  EXPECT_EQ(world.comm->world_size(), 1);
  EXPECT_EQ(world.gpu_index, -1);
}

TEST(World, TorchrunStyleCpuRanksAreRefusedWithWhatToDo) {
  LaunchEnvGuard guard;
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  EXPECT_TRUE(launched_with_several_ranks());
  std::string message;
  try {
    (void)make_world(cpu_options());
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("started as rank 1 of 2 (torchrun-style launch)"), std::string::npos) << message;
  EXPECT_NE(message.find("launch CPU runs with mpirun"), std::string::npos) << message;
}

TEST(World, MpiLauncherCountsAsSeveralRanks) {
#ifdef SHARDTRAIN_WITH_MPI
  LaunchEnvGuard guard;
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_TRUE(launched_with_several_ranks());
#else
  GTEST_SKIP() << "this build has no MPI";
#endif
}

}  // namespace
}  // namespace shardtrain::dist
