// What this binary is: the commit it was built from and the options it was built with, for
// `shardtrain version`, the trainer's first log line and checkpoints' metadata.
#pragma once

#include <string>

namespace shardtrain {

// `git describe --always --dirty` of the source tree at build time ("unknown ..." outside a
// git checkout), e.g. "a95749f1c2de" or "a95749f1c2de-dirty".
const char* build_commit();

// "CUDA kernels for sm_90a, MPI, NCCL" style: the backends compiled in.
std::string build_options();

}  // namespace shardtrain
