// The build's commit (generated header) and its compiled-in backends.
#include "core/build_info.h"

#include "shardtrain_commit.h"

namespace shardtrain {

const char* build_commit() { return SHARDTRAIN_COMMIT; }

std::string build_options() {
  std::string s;
#ifdef SHARDTRAIN_WITH_CUDA
  s += "CUDA kernels for sm_" SHARDTRAIN_CUDA_ARCHS;
#else
  s += "no CUDA backend";
#endif
  return s;
}

}  // namespace shardtrain
