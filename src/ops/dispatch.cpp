// Shared entry checks of the op dispatchers.
#include "ops/dispatch.h"

#include <atomic>

#include "ops/linear.h"

namespace shardtrain::ops {

void no_kernel(const char* op, const Tensor& t) {
  ST_THROW(op, ": no kernel for ", t.str(), " in this build");
}

namespace {
std::atomic<GemmSelection> g_gemm_selection{GemmSelection::kHeuristic};
}  // namespace

void set_gemm_selection(GemmSelection selection) { g_gemm_selection = selection; }
GemmSelection gemm_selection() { return g_gemm_selection; }

void check_cpu_float(const Tensor& t, const char* op, const char* arg) {
  ST_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kF64, op, ": `", arg,
           "` on the CPU must be f32 or f64, found ", dtype_name(t.dtype()),
           " (convert bf16/f16 storage with ops::cast)");
}

}  // namespace shardtrain::ops
