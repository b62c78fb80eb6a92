// CUDA rotary embedding in place (HF rotate_half pairing i <-> i + K among each head's first 2K
// elements, the rest passed through: partial rotary), f32 math.
#include "ops/cuda/common.cuh"
#include "ops/rope.h"

namespace shardtrain::ops::cuda {
namespace {

constexpr int kThreads = 256;

// One thread per (b, t, head, k) pair; sign = +1 rotates by the angle, -1 by its negative.
// Heads are H elements apart, H >= 2K (H > 2K: partial rotary, elements 2K..H-1 untouched).
// Token b·S + t's heads start `pitch` elements after token b·S + t - 1's (heads · H when x
// is contiguous; more for heads sliced out of a stacked q|k|v tensor). pos (null: t) holds
// each token's table row (its position in its packed document).
template <typename T>
__global__ void rope_kernel(T* x, const T* cos_tab, const T* sin_tab, const int32_t* pos, int64_t B, int64_t S,
                            int64_t heads, int64_t K, int64_t H, int64_t pitch, float sign) {
  const int64_t n = B * S * heads * K;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t k = i % K;
    const int64_t token = i / (K * heads);
    const int64_t t = pos != nullptr ? int64_t{pos[token]} : token % S;
    T* row = x + token * pitch + (i / K) % heads * H;
    const float c = to_f32(cos_tab[t * K + k]), sn = sign * to_f32(sin_tab[t * K + k]);
    const float a = to_f32(row[k]), b = to_f32(row[k + K]);
    row[k] = from_f32<T>(a * c - b * sn);
    row[k + K] = from_f32<T>(b * c + a * sn);
  }
}

// The same with 16-byte packs: one thread per (b, t, head, pack of k), when K is a
// multiple of the pack and x and the tables are 16-byte aligned. I: the index type, 32-bit
// when every element offset fits (its divisions cost a fraction of 64-bit ones).
template <typename T, typename I>
__global__ void rope_kernel_packed(T* x, const T* cos_tab, const T* sin_tab, const int32_t* pos, I B, I S, I heads,
                                   I K, I H, I pitch, float sign) {
  constexpr int P = Pack<T>::kSize;
  const I packs_per_half = K / P;
  const I n = B * S * heads * packs_per_half;
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < n; i += I(gridDim.x) * I(blockDim.x)) {
    const I k = (i % packs_per_half) * P;
    const I head_row = i / packs_per_half;  // token * heads + head
    const I token = head_row / heads;
    const I t = pos != nullptr ? I(pos[token]) : token % S;
    T* row = x + token * pitch + (head_row - token * heads) * H;
    Pack<T>* lo = reinterpret_cast<Pack<T>*>(row + k);
    Pack<T>* hi = reinterpret_cast<Pack<T>*>(row + K + k);
    const Pack<T> c = *reinterpret_cast<const Pack<T>*>(cos_tab + t * K + k);
    const Pack<T> sn = *reinterpret_cast<const Pack<T>*>(sin_tab + t * K + k);
    Pack<T> a = *lo, b = *hi;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const float cj = to_f32(c.v[j]), sj = sign * to_f32(sn.v[j]);
      const float aj = to_f32(a.v[j]), bj = to_f32(b.v[j]);
      a.v[j] = from_f32<T>(aj * cj - bj * sj);
      b.v[j] = from_f32<T>(bj * cj + aj * sj);
    }
    *lo = a;
    *hi = b;
  }
}

void apply(Tensor& x, const Tensor& cos_TK, const Tensor& sin_TK, const Tensor& positions_BT, float sign,
           const char* op, Stream s) {
  ST_CHECK(x.device().is_cuda(), op, ": `x_BTNH` expected on a CUDA device, found ", x.str());
  check_cuda_tensor(cos_TK, op, "cos_TK");
  check_cuda_tensor(sin_TK, op, "sin_TK");
  ST_CHECK(x.ndim() == 4 && x.size(3) % 2 == 0, op, ": `x_BTNH` must be [B, T, heads, H] with even H, found ", x.str());
  const int64_t B = x.size(0), S = x.size(1), heads = x.size(2), H = x.size(3);
  const int64_t pitch = token_pitch(x, op, "x_BTNH");  // more than heads·H for heads of a stacked tensor
  // K frequencies rotate each head's first 2K elements (all H, or a partial rotary's share)
  const int64_t K = cos_TK.ndim() == 2 ? cos_TK.size(1) : 0;
  ST_CHECK(cos_TK.ndim() == 2 && K >= 1 && 2 * K <= H && cos_TK.size(0) >= S, op, ": `cos_TK` must be [>= ", S,
           ", K] with 1 <= K <= ", H / 2, " (heads of ", H, "), found ", cos_TK.str());
  check_shape(sin_TK, cos_TK.shape(), op, "sin_TK");
  check_dtype(cos_TK, x.dtype(), op, "cos_TK");
  check_dtype(sin_TK, x.dtype(), op, "sin_TK");
  const int32_t* pos = nullptr;
  if (positions_BT.defined()) {
    check_cuda_tensor(positions_BT, op, "positions_BT");
    check_dtype(positions_BT, DType::kI32, op, "positions_BT");
    check_shape(positions_BT, {B, S}, op, "positions_BT");
    check_contiguous(positions_BT, op, "positions_BT");
    pos = static_cast<const int32_t*>(positions_BT.raw_data());
  }
  const int64_t n = B * S * heads * K;
  if (n == 0) return;
  dispatch_float(x.dtype(), op, [&]<typename T>() {
    if (packable({&x, &cos_TK, &sin_TK}, K, sizeof(T)) && pitch % Pack<T>::kSize == 0 && H % Pack<T>::kSize == 0) {
      const int64_t packs = n / Pack<T>::kSize;
      const int grid = grid_for(packs, kThreads);
      T* xp = static_cast<T*>(x.raw_data());
      const T* cp = static_cast<const T*>(cos_TK.raw_data());
      const T* sp = static_cast<const T*>(sin_TK.raw_data());
      // 32-bit indices while x's offsets and the loop's last stride stay below 2^31
      if (B * S * pitch + int64_t{grid} * kThreads < INT32_MAX && cos_TK.numel() < INT32_MAX) {
        rope_kernel_packed<T, int32_t><<<grid, kThreads, 0, stream_of(s)>>>(
            xp, cp, sp, pos, static_cast<int32_t>(B), static_cast<int32_t>(S), static_cast<int32_t>(heads),
            static_cast<int32_t>(K), static_cast<int32_t>(H), static_cast<int32_t>(pitch), sign);
      } else {
        rope_kernel_packed<T, int64_t><<<grid, kThreads, 0, stream_of(s)>>>(xp, cp, sp, pos, B, S, heads, K, H,
                                                                           pitch, sign);
      }
      return;
    }
    rope_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream_of(s)>>>(
        static_cast<T*>(x.raw_data()), static_cast<const T*>(cos_TK.raw_data()),
        static_cast<const T*>(sin_TK.raw_data()), pos, B, S, heads, K, H, pitch, sign);
  });
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(Tensor& x_BTNH, const Tensor& cos_TK, const Tensor& sin_TK, const Tensor& positions_BT, Stream s) {
  apply(x_BTNH, cos_TK, sin_TK, positions_BT, 1.0f, "rope_forward", s);
}

void rope_backward(Tensor& dx_BTNH, const Tensor& cos_TK, const Tensor& sin_TK, const Tensor& positions_BT,
                   Stream s) {
  apply(dx_BTNH, cos_TK, sin_TK, positions_BT, -1.0f, "rope_backward", s);
}

}  // namespace shardtrain::ops::cuda
