// Shared entry checks of the op dispatchers.
#include "ops/dispatch.h"

namespace shardtrain::ops {

void no_kernel(const char* op, const Tensor& t) {
  ST_THROW(op, ": no kernel for ", t.str(), " in this build");
}

void check_cpu_float(const Tensor& t, const char* op, const char* arg) {
  ST_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kF64, op, ": `", arg,
           "` on the CPU must be f32 or f64, found ", dtype_name(t.dtype()),
           " (convert bf16/f16 storage with ops::cast)");
}

int64_t token_pitch(const Tensor& x, const char* op, const char* arg) {
  RowLayout rows;
  ST_CHECK(x.ndim() == 4 && row_layout(x, 2, rows) && rows.rows == x.size(0) * x.size(1) &&
               rows.cols == x.size(2) * x.size(3),
           op, ": `", arg, "` must be [B, T, heads, H] with each token's heads contiguous (contiguous, or heads "
           "sliced from a stacked tensor), found ", x.is_contiguous() ? "" : "strided ", x.str());
  return rows.pitch;
}

}  // namespace shardtrain::ops
