// Offsets and statistics layouts for cuDNN's ragged attention over packed documents.
#include "ops/cuda/attention_documents.h"

#include <utility>

#include "ops/cuda/common.cuh"

namespace shardtrain::ops::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void ragged_offsets_kernel(int64_t* offsets, const int64_t* starts, int64_t rows, int64_t pitch_q,
                                      int64_t pitch_k, int64_t pitch_v, int64_t pitch_o, int64_t pitch_stats) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t s = starts[i];
    offsets[i] = s * pitch_q;
    offsets[rows + i] = s * pitch_k;
    offsets[2 * rows + i] = s * pitch_v;
    offsets[3 * rows + i] = s * pitch_o;
    offsets[4 * rows + i] = s * pitch_stats;
  }
}

// dst[b, n, t] = src[b, t, n] (to_heads) or dst[b, t, n] = src[b, n, t]; one thread per element
// of dst, so the writes are coalesced.
template <bool kToHeads>
__global__ void stats_transpose_kernel(float* dst, const float* src, int64_t B, int64_t T, int64_t N) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < B * T * N;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (kToHeads) {
      const int64_t b = i / (N * T), n = (i / T) % N, t = i % T;
      dst[i] = src[(b * T + t) * N + n];
    } else {
      const int64_t b = i / (T * N), t = (i / N) % T, n = i % N;
      dst[i] = src[(b * N + n) * T + t];
    }
  }
}

template <bool kToHeads>
void transpose(Tensor& dst, const Tensor& src, const char* op, Stream s) {
  for (auto [t, arg] : {std::pair<const Tensor*, const char*>{&dst, "dst"}, {&src, "src"}}) {
    check_cuda_tensor(*t, op, arg);
    check_dtype(*t, DType::kF32, op, arg);
  }
  const Tensor& lse = kToHeads ? dst : src;
  const Tensor& stats = kToHeads ? src : dst;
  ST_CHECK(lse.ndim() == 3, op, ": lse must be [B, N, T], found ", lse.str());
  const int64_t B = lse.size(0), N = lse.size(1), T = lse.size(2);
  check_shape(stats, {B * T, N}, op, "stats_TN");
  if (B * N * T == 0) return;
  stats_transpose_kernel<kToHeads><<<grid_for(B * N * T, kThreads), kThreads, 0, stream_of(s)>>>(
      static_cast<float*>(dst.raw_data()), static_cast<const float*>(src.raw_data()), B, T, N);
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace

void ragged_offsets(Tensor& offsets_5S1, const Tensor& starts_S1, int64_t pitch_q, int64_t pitch_k, int64_t pitch_v,
                    int64_t N, int64_t H, Stream s) {
  const char* op = "ragged_offsets";
  check_cuda_tensor(starts_S1, op, "starts_S1");
  check_dtype(starts_S1, DType::kI64, op, "starts_S1");
  ST_CHECK(starts_S1.ndim() == 1, op, ": `starts_S1` must be 1-D, found ", starts_S1.str());
  const int64_t rows = starts_S1.size(0);
  check_cuda_tensor(offsets_5S1, op, "offsets_5S1");
  check_dtype(offsets_5S1, DType::kI64, op, "offsets_5S1");
  check_shape(offsets_5S1, {5, rows}, op, "offsets_5S1");
  ragged_offsets_kernel<<<grid_for(rows, kThreads), kThreads, 0, stream_of(s)>>>(
      static_cast<int64_t*>(offsets_5S1.raw_data()), static_cast<const int64_t*>(starts_S1.raw_data()), rows,
      pitch_q, pitch_k, pitch_v, N * H, N);
  ST_CUDA_CHECK_LAUNCH();
}

void stats_to_heads(Tensor& lse_BNT, const Tensor& stats_TN, Stream s) {
  transpose<true>(lse_BNT, stats_TN, "stats_to_heads", s);
}

void stats_to_tokens(Tensor& stats_TN, const Tensor& lse_BNT, Stream s) {
  transpose<false>(stats_TN, lse_BNT, "stats_to_tokens", s);
}

}  // namespace shardtrain::ops::cuda
