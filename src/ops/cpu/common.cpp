// Entry checks of the CPU kernels.
#include "ops/cpu/common.h"

namespace shardtrain::ops::cpu {

void check_arg(const Tensor& t, const char* op, const char* arg) {
  ST_CHECK(t.defined(), op, ": `", arg, "` is undefined");
  ST_CHECK(t.device().is_cpu(), op, ": `", arg, "` expected on the CPU, found ", t.str());
  check_contiguous(t, op, arg);
}

void check_arg(const Tensor& t, const char* op, const char* arg, DType dtype, const Shape& shape) {
  check_arg(t, op, arg);
  check_dtype(t, dtype, op, arg);
  check_shape(t, shape, op, arg);
}

}  // namespace shardtrain::ops::cpu
