// CUDA embedding. The backward is deterministic: token positions are sorted by id (stable
// radix sort), and each (id, column) sums its tokens' rows in token order.
#include <cub/device/device_radix_sort.cuh>

#include "ops/cuda/common.cuh"
#include "ops/elementwise.h"
#include "ops/embedding.h"

namespace shardtrain::ops::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* ids, const T* table, int64_t tokens, int64_t D,
                                         int64_t V, int* bad) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < tokens * D; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / D;
    const int32_t id = ids[t];
    if (id < 0 || id >= V) {  // recorded for the check; the row becomes NaN for an unchecked call
      atomicMin(bad, static_cast<int>(t));
      out[i] = from_f32<T>(NAN);
      continue;
    }
    out[i] = table[id * D + i % D];
  }
}

// Run starts: starts[r] = first sorted position of run r. One block per run; threads walk
// the columns, summing the run's rows in sorted (= token) order.
template <typename T, typename G>
__global__ void embedding_backward_kernel(T* dtable, const G* dout, const int32_t* sorted_ids,
                                          const int32_t* sorted_pos, int64_t tokens, int64_t D) {
  const int64_t start = blockIdx.x;
  if (start >= tokens) return;
  if (start > 0 && sorted_ids[start] == sorted_ids[start - 1]) return;  // not the first of its run
  const int32_t id = sorted_ids[start];
  int64_t end = start + 1;
  while (end < tokens && sorted_ids[end] == id) ++end;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = to_f32(dtable[id * D + d]);
    for (int64_t j = start; j < end; ++j) acc += to_f32(dout[sorted_pos[j] * D + d]);
    dtable[id * D + d] = from_f32<T>(acc);
  }
}

__global__ void iota_kernel(int32_t* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = static_cast<int32_t>(i);
}

}  // namespace

void embedding_forward(Tensor& out_TD, const Tensor& ids_T, const Tensor& table_VD, Stream s, bool check_ids) {
  check_cuda_tensor(out_TD, "embedding_forward", "out_TD");
  check_cuda_tensor(ids_T, "embedding_forward", "ids_T");
  check_cuda_tensor(table_VD, "embedding_forward", "table_VD");
  check_dtype(ids_T, DType::kI32, "embedding_forward", "ids_T");
  ST_CHECK(table_VD.ndim() == 2, "embedding_forward: `table_VD` must be 2-D, found ", table_VD.str());
  const int64_t T = ids_T.numel(), D = table_VD.size(1), V = table_VD.size(0);
  check_shape(out_TD, {T, D}, "embedding_forward", "out_TD");
  check_dtype(out_TD, table_VD.dtype(), "embedding_forward", "out_TD");
  if (T == 0) return;
  Tensor bad = Tensor::empty({1}, DType::kI32, out_TD.device(), "embedding id check", s);
  fill(bad, static_cast<double>(INT32_MAX), s);
  dispatch_float(table_VD.dtype(), "embedding_forward", [&]<typename T_>() {
    embedding_forward_kernel<T_><<<grid_for(T * D, kThreads), kThreads, 0, stream_of(s)>>>(
        static_cast<T_*>(out_TD.raw_data()), ids_T.data<int32_t>(), static_cast<const T_*>(table_VD.raw_data()), T, D,
        V, bad.data<int32_t>());
  });
  ST_CUDA_CHECK_LAUNCH();
  if (!check_ids) return;
  // The id check costs one small copy; a bad id is a data bug worth stopping for.
  int32_t first_bad = 0;
  ST_CUDA_CHECK(cudaMemcpyAsync(&first_bad, bad.raw_data(), 4, cudaMemcpyDeviceToHost, stream_of(s)));
  ST_CUDA_CHECK(cudaStreamSynchronize(stream_of(s)));
  if (first_bad != INT32_MAX) {
    int32_t id = 0;
    ST_CUDA_CHECK(cudaMemcpy(&id, ids_T.data<int32_t>() + first_bad, 4, cudaMemcpyDeviceToHost));
    ST_THROW("embedding_forward: token id ", id, " at position ", first_bad, " outside the vocabulary [0, ", V, ")");
  }
}

void embedding_backward(Tensor& dtable_VD, const Tensor& dout_TD, const Tensor& ids_T, Stream s) {
  check_cuda_tensor(dtable_VD, "embedding_backward", "dtable_VD");
  check_cuda_tensor(dout_TD, "embedding_backward", "dout_TD");
  check_cuda_tensor(ids_T, "embedding_backward", "ids_T");
  check_dtype(ids_T, DType::kI32, "embedding_backward", "ids_T");
  const int64_t T = ids_T.numel(), D = dtable_VD.size(1);
  check_shape(dout_TD, {T, D}, "embedding_backward", "dout_TD");
  ST_CHECK(dout_TD.dtype() == dtable_VD.dtype() || dtable_VD.dtype() == DType::kF32,
           "embedding_backward: `dout_TD` ", dout_TD.str(), " must match `dtable_VD` ", dtable_VD.str(),
           " unless the table gradient is f32");
  if (T == 0) return;
  ST_CHECK(T < INT32_MAX, "embedding_backward: ", T, " tokens exceed the 32-bit sort");
  const Device dev = ids_T.device();
  Tensor pos = Tensor::empty({T}, DType::kI32, dev, "embedding positions", s);
  Tensor sorted_ids = Tensor::empty({T}, DType::kI32, dev, "sorted ids", s);
  Tensor sorted_pos = Tensor::empty({T}, DType::kI32, dev, "sorted positions", s);
  iota_kernel<<<grid_for(T, kThreads), kThreads, 0, stream_of(s)>>>(pos.data<int32_t>(), T);
  ST_CUDA_CHECK_LAUNCH();
  size_t temp_bytes = 0;
  ST_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ids_T.data<int32_t>(), sorted_ids.data<int32_t>(),
                                                pos.data<int32_t>(), sorted_pos.data<int32_t>(), static_cast<int>(T), 0,
                                                32, stream_of(s)));
  Tensor temp = Tensor::empty({static_cast<int64_t>(temp_bytes) + 1}, DType::kU8, dev, "embedding sort scratch", s);
  ST_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, ids_T.data<int32_t>(),
                                                sorted_ids.data<int32_t>(), pos.data<int32_t>(),
                                                sorted_pos.data<int32_t>(), static_cast<int>(T), 0, 32, stream_of(s)));
  dispatch_float(dtable_VD.dtype(), "embedding_backward", [&]<typename T_>() {
    dispatch_float(dout_TD.dtype(), "embedding_backward", [&]<typename G>() {
      embedding_backward_kernel<T_, G><<<static_cast<unsigned>(T), 128, 0, stream_of(s)>>>(
          static_cast<T_*>(dtable_VD.raw_data()), static_cast<const G*>(dout_TD.raw_data()),
          sorted_ids.data<int32_t>(), sorted_pos.data<int32_t>(), T, D);
    });
  });
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace shardtrain::ops::cuda
