// attention_merge (ops/attention.h) on the GPU: one warp per (query row, head), the weights from
// the two log-sum-exps in f32, the output's H values read and written by the warp's lanes.
#include <cmath>
#include <initializer_list>

#include "core/cuda/cuda_check.h"
#include "ops/attention.h"
#include "ops/cuda/common.cuh"

namespace shardtrain::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;

template <typename O, typename P>
__global__ void merge_kernel(O* out, float* lse, const P* part, const float* part_lse, int64_t B, int64_t T, int64_t N,
                             int64_t H) {
  const int64_t rows = B * T * N;
  const int lane = threadIdx.x % 32;
  for (int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32; row < rows;
       row += int64_t{gridDim.x} * kRowsPerBlock) {
    const int64_t b = row / (T * N), t = (row / N) % T, n = row % N;  // out's row order: [B, T, N]
    const int64_t s = (b * N + n) * T + t;                            // lse's: [B, N, T]
    const float a = lse[s], p = part_lse[s];
    if (p == -INFINITY) continue;  // the part saw no key
    const float m = fmaxf(a, p);
    const float merged = m + logf(expf(a - m) + expf(p - m));
    const float wa = expf(a - merged), wp = expf(p - merged);  // a = -inf: wa = 0, the part as it is
    O* o = out + row * H;
    const P* po = part + row * H;
    for (int64_t h = lane; h < H; h += 32) o[h] = from_f32<O>(wa * to_f32(o[h]) + wp * to_f32(po[h]));
    __syncwarp();
    if (lane == 0) lse[s] = merged;
  }
}

}  // namespace

void attention_merge(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& part_out_BTNH, const Tensor& part_lse_BNT,
                     Stream stream) {
  const char* op = "attention_merge";
  ST_CHECK(out_BTNH.ndim() == 4 && out_BTNH.is_contiguous(), op, ": `out_BTNH` must be contiguous [B, T, N, H], found ",
           out_BTNH.str());
  const int64_t B = out_BTNH.size(0), T = out_BTNH.size(1), N = out_BTNH.size(2), H = out_BTNH.size(3);
  ST_CHECK(part_out_BTNH.shape() == out_BTNH.shape() && part_out_BTNH.is_contiguous(), op,
           ": `part_out_BTNH` must be contiguous ", out_BTNH.shape().str(), ", found ", part_out_BTNH.str());
  const Shape lse_shape{B, N, T};
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out_BTNH, &part_out_BTNH})
    ST_CHECK(t->dtype() == DType::kF32 || t->dtype() == DType::kBF16 || t->dtype() == DType::kF16, op,
             ": the outputs must be f32, bf16 or f16, found ", t->str());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&lse_BNT, &part_lse_BNT})
    ST_CHECK(t->dtype() == DType::kF32 && t->is_contiguous() && t->shape() == lse_shape, op,
             ": the log-sum-exps must be contiguous f32 [", B, ", ", N, ", ", T, "], found ", t->str());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out_BTNH, &part_out_BTNH, &lse_BNT, &part_lse_BNT})
    check_cuda_tensor(*t, op, "tensor");
  if (B * T * N == 0) return;
  const int grid = grid_for(B * T * N, kRowsPerBlock);
  dispatch_float(out_BTNH.dtype(), op, [&]<typename O>() {
    dispatch_float(part_out_BTNH.dtype(), op, [&]<typename P>() {
      merge_kernel<O, P><<<grid, kThreads, 0, stream_of(stream)>>>(
          static_cast<O*>(out_BTNH.raw_data()), lse_BNT.data<float>(), static_cast<const P*>(part_out_BTNH.raw_data()),
          part_lse_BNT.data<float>(), B, T, N, H);
    });
  });
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace shardtrain::ops::cuda
