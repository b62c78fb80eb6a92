// CPU embedding lookup and its backward (rows added in token order: deterministic).
#include <cstring>

#include "ops/cpu/common.h"
#include "ops/embedding.h"

namespace shardtrain::ops::cpu {
namespace {

void check_ids(const Tensor& ids_T, int64_t V, const char* op) {
  const int32_t* ids = ids_T.data<int32_t>();
  for (int64_t t = 0; t < ids_T.numel(); ++t)
    ST_CHECK(ids[t] >= 0 && ids[t] < V, op, ": token id ", ids[t], " at position ", t,
             " outside the vocabulary [0, ", V, ")");
}

}  // namespace

void embedding_forward(Tensor& out_TD, const Tensor& ids_T, const Tensor& table_VD) {
  check_arg(table_VD, "embedding_forward", "table_VD");
  ST_CHECK(table_VD.ndim() == 2, "embedding_forward: `table_VD` must be 2-D, found ", table_VD.str());
  const int64_t V = table_VD.size(0), D = table_VD.size(1), T = ids_T.numel();
  check_arg(ids_T, "embedding_forward", "ids_T", DType::kI32, ids_T.shape());
  check_arg(out_TD, "embedding_forward", "out_TD", table_VD.dtype(), {T, D});
  check_ids(ids_T, V, "embedding_forward");
  const int32_t* ids = ids_T.data<int32_t>();
  const size_t row = static_cast<size_t>(D) * dtype_size(table_VD.dtype());
  const char* src = static_cast<const char*>(table_VD.raw_data());
  char* dst = static_cast<char*>(out_TD.raw_data());
  for (int64_t t = 0; t < T; ++t) std::memcpy(dst + t * row, src + ids[t] * row, row);
}

void embedding_backward(Tensor& dtable_VD, const Tensor& dout_TD, const Tensor& ids_T) {
  check_arg(dtable_VD, "embedding_backward", "dtable_VD");
  ST_CHECK(dtable_VD.ndim() == 2, "embedding_backward: `dtable_VD` must be 2-D, found ", dtable_VD.str());
  const int64_t V = dtable_VD.size(0), D = dtable_VD.size(1), T = ids_T.numel();
  check_arg(ids_T, "embedding_backward", "ids_T", DType::kI32, ids_T.shape());
  check_arg(dout_TD, "embedding_backward", "dout_TD", dtable_VD.dtype(), {T, D});
  check_ids(ids_T, V, "embedding_backward");
  const int32_t* ids = ids_T.data<int32_t>();
  dispatch_real(dtable_VD, "embedding_backward", "dtable_VD", [&]<typename F>() {
    F* dt = dtable_VD.data<F>();
    const F* d = dout_TD.data<F>();
    // parallel over columns: each thread adds its columns in token order
#pragma omp parallel for if (T * D > 65536)
    for (int64_t c = 0; c < D; ++c)
      for (int64_t t = 0; t < T; ++t) dt[ids[t] * D + c] += d[t * D + c];
  });
}

}  // namespace shardtrain::ops::cpu
