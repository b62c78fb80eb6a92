// The launch's communicator: NCCL, MPI or a single rank, by the environment and the build.
#include "dist/world.h"

#include <optional>

#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#endif
#include "core/error.h"
#include "dist/bootstrap.h"
#ifdef SHARDTRAIN_WITH_MPI
#include "dist/mpi_communicator.h"
#endif
#ifdef SHARDTRAIN_WITH_CUDA
#include "dist/nccl_communicator.h"
#endif

namespace shardtrain::dist {
namespace {

bool launched_by_mpi_if_built() {
#ifdef SHARDTRAIN_WITH_MPI
  return launched_by_mpi();
#else
  return false;
#endif
}

}  // namespace

bool launched_with_several_ranks() {
  const std::optional<LaunchEnv> env = launch_from_env();
  return (env && env->world_size > 1) || launched_by_mpi_if_built();
}

World make_world(const WorldOptions& options) {
  // Several GPUs talk through NCCL (bootstrapped by MPI or a torchrun-style environment);
  // CPU ranks through MPI.
  World world;
  const std::optional<LaunchEnv> env = launch_from_env();
  const bool by_mpi = launched_by_mpi_if_built();
  const bool distributed = by_mpi || (env && env->world_size > 1);
#ifdef SHARDTRAIN_WITH_CUDA
  if (distributed && options.use_gpus && cuda::device_count() > 0) {
    int gpu = 0;
    world.comm = make_nccl_world(options.init_timeout_s, &gpu);
    world.gpu_index = gpu;
  }
#else
  (void)options;
#endif
  if (!world.comm) {
#ifdef SHARDTRAIN_WITH_MPI
    if (by_mpi) world.comm = make_mpi_world();
#endif
    ST_CHECK(world.comm || !distributed, "this process was started as rank ", env ? env->rank : 0, " of ",
             env ? env->world_size : 1, " (", env ? env->launcher : "", "-style launch), but CPU ranks ",
             "communicate through MPI: launch CPU runs with mpirun, or train on GPUs");
    if (!world.comm) world.comm = make_single_rank();
  }
  return world;
}

}  // namespace shardtrain::dist
