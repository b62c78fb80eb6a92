// Token embedding lookup and its (deterministic) backward.
#pragma once

#include "core/profile.h"
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace shardtrain::ops {

namespace cpu {
void embedding_forward(Tensor& out_TD, const Tensor& ids_T, const Tensor& table_VD);
void embedding_backward(Tensor& dtable_VD, const Tensor& dout_TD, const Tensor& ids_T);
}  // namespace cpu

namespace cuda {
void embedding_forward(Tensor& out_TD, const Tensor& ids_T, const Tensor& table_VD, Stream stream, bool check_ids);
void embedding_backward(Tensor& dtable_VD, const Tensor& dout_TD, const Tensor& ids_T, Stream stream);
}  // namespace cuda

// out_TD = table_VD[ids_T] (overwrites). ids_T: i32, every id in [0, V) (checked, naming the
// position and the id). table and out: same float dtype (f32/f64 on the CPU). T = all tokens
// of the batch (B*T flattened). CUDA: check_ids = false skips the check's read-back to the
// host (for a caller that checked the ids itself, and inside a CUDA graph); a bad id then
// gives a NaN row.
inline void embedding_forward(Tensor& out_TD, const Tensor& ids_T, const Tensor& table_VD,
                              [[maybe_unused]] Stream stream = {}, [[maybe_unused]] bool check_ids = true) {
  // the gathered rows read, the output written
  profile::ScopedTimer profile_timer("embedding_forward", out_TD.device(),
                                     {0, 2 * profile::bytes_of({&out_TD}) + profile::bytes_of({&ids_T})});
  if (table_VD.device().is_cpu()) return cpu::embedding_forward(out_TD, ids_T, table_VD);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::embedding_forward(out_TD, ids_T, table_VD, stream, check_ids);
#else
  no_kernel("embedding_forward", table_VD);
#endif
}

// dtable_VD += dout_TD scattered by ids_T (accumulates: parameter gradient). Deterministic:
// rows are added in token order. CUDA: dtable may be f32 under a bf16/f16 dout.
inline void embedding_backward(Tensor& dtable_VD, const Tensor& dout_TD, const Tensor& ids_T, [[maybe_unused]] Stream stream = {}) {
  // the rows' gradient read, the touched table rows read and written
  const double touched = static_cast<double>(dout_TD.numel()) * static_cast<double>(dtype_size(dtable_VD.dtype()));
  profile::ScopedTimer profile_timer("embedding_backward", dtable_VD.device(),
                                     {0, profile::bytes_of({&dout_TD, &ids_T}) + 2 * touched});
  if (dtable_VD.device().is_cpu()) return cpu::embedding_backward(dtable_VD, dout_TD, ids_T);
#ifdef SHARDTRAIN_WITH_CUDA
  return cuda::embedding_backward(dtable_VD, dout_TD, ids_T, stream);
#else
  no_kernel("embedding_backward", dtable_VD);
#endif
}

}  // namespace shardtrain::ops
