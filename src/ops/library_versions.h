// The GPU libraries the ops run on, as loaded at run time (which may differ from the headers
// the build saw): for `shardtrain version`.
#pragma once

#include <string>

namespace shardtrain::ops::cuda {

// "CUDA runtime 13.0, driver 13.0, cuBLASLt 13.1.0, cuDNN 9.14.0"
std::string library_versions();

}  // namespace shardtrain::ops::cuda
