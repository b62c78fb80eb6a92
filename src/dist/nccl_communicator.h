// NCCL over device memory: the communicator of multi-GPU runs. Collectives run on the
// stream given (the caller orders them with events); host tensors (loss totals, norms, eval
// sums) are staged through device memory on an internal stream and return synchronously.
// Only with the CUDA backend and NCCL; no CUDA headers here.
#pragma once

#include <memory>
#include <string>

#include "dist/communicator.h"

namespace shardtrain::dist {

// Every rank of a multi-GPU run: finds its rank, world size and GPU (from mpirun/srun's
// MPI, or else a torchrun-style or Slurm environment), selects the GPU
// (local rank mod visible GPUs), shares NCCL's unique id from rank 0 (MPI broadcast, or the
// TCP exchange of dist/bootstrap.h, failing after `timeout_s` with the address) and makes
// the NCCL communicator. `gpu_index` receives the GPU chosen.
std::unique_ptr<Communicator> make_nccl_world(double timeout_s, int* gpu_index);

// "NCCL 2.28.9" as the loaded library reports it, or "no NCCL (one GPU at most)" in a build without it.
std::string nccl_version();

}  // namespace shardtrain::dist
