// The communicator of a launch, chosen from how the process was started: NCCL between GPUs
// (bootstrapped by MPI or a torchrun-style or Slurm environment), MPI between CPU ranks, or a
// single rank. The one place that decides; callers never test the build's backends themselves.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace shardtrain::dist {

// True when this launch started more than one rank: mpirun/srun (in a build with MPI), or a
// torchrun-style or Slurm environment with a world size above 1.
bool launched_with_several_ranks();

struct WorldOptions {
  // false: the run trains on the CPU (training.device = cpu), so several ranks talk through MPI
  // even where GPUs are visible
  bool use_gpus = true;
  double init_timeout_s = 300;  // NCCL: how long the ranks wait for each other at start
};

struct World {
  std::unique_ptr<Communicator> comm;
  int gpu_index = -1;  // NCCL: the GPU this rank selected; -1 for MPI and a single rank
};

// Several ranks on GPUs (with CUDA and at least one visible GPU): NCCL. Else, under mpirun/srun:
// MPI. Else a single rank. Several ranks that can have neither (a torchrun-style launch of CPU
// ranks, or a build without MPI) throw, saying how to launch instead.
World make_world(const WorldOptions& options);

}  // namespace shardtrain::dist
