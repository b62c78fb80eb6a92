// MPI over host memory (OpenMPI from Debian is not CUDA-aware). Starts MPI on first use
// and finalises it at exit. Under mpirun/srun every rank learns its rank and size here.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace shardtrain::dist {

// True when the process was started by an MPI launcher (mpirun, srun with PMI/PMIx).
bool launched_by_mpi();
// MPI_COMM_WORLD as a communicator. Collectives support f32, f64, i32, i64 (sum/avg) and
// any dtype for all_gather/broadcast.
std::unique_ptr<Communicator> make_mpi_world();

}  // namespace shardtrain::dist
