// CUDA RMSNorm: one warp per row, f32 statistics. The weight gradient is deterministic:
// each block writes f32 column partials for its rows, and a second kernel sums the
// partials of every column in block order.
#include "ops/cuda/common.cuh"
#include "ops/rmsnorm.h"

namespace shardtrain::ops::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A warp's largest magnitude max-ed into *amax (FP8's amax, ops/fp8.h): one atomic a warp (a
// row's warp may end early, so no block-wide step). Every lane of the warp calls it.
__device__ __forceinline__ void warp_amax(uint32_t* amax, uint32_t m) {
  m = warp_max(m);
  if (threadIdx.x % 32 == 0) atomic_amax(amax, m);
}

template <typename T>
__global__ void rmsnorm_forward_kernel(T* y, float* rstd, const T* x, const T* w, float off, int64_t rows, int64_t D,
                                       float eps, uint32_t* amax) {
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // a whole warp: a row is a warp's
  const T* xr = x + row * D;
  float ss = 0;
  for (int64_t i = lane; i < D; i += 32) {
    const float v = to_f32(xr[i]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / static_cast<float>(D) + eps);
  if (lane == 0) rstd[row] = r;
  T* yr = y + row * D;
  // as HF: normalise in f32, round to the storage dtype, then scale by the weight; with a
  // weight offset (Gemma's 1 + w) scaled in f32 and rounded once, as transformers' Gemma norm
  uint32_t m = 0;
  for (int64_t i = lane; i < D; i += 32) {
    const float xn = to_f32(xr[i]) * r;
    yr[i] = off != 0.0f ? from_f32<T>(xn * (to_f32(w[i]) + off)) : from_f32<T>(to_f32(w[i]) * to_f32(from_f32<T>(xn)));
    m = max(m, magnitude_bits(to_f32(yr[i])));
  }
  if (amax != nullptr) warp_amax(amax, m);
}

// The same over 16-byte packs: lane l holds packs l, l + 32, ... of its row in registers
// (kPacks per lane at most), so x is read from memory once.
template <typename T, int kPacks>
__global__ void rmsnorm_forward_packed_kernel(T* y, float* rstd, const T* x, const T* w, float off, int64_t rows,
                                              int64_t D, float eps, uint32_t* amax) {
  constexpr int K = Pack<T>::kSize;
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t P = D / K;
  const Pack<T>* xr = reinterpret_cast<const Pack<T>*>(x + row * D);
  Pack<T> xv[kPacks];
  float ss = 0;
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int64_t p = lane + 32 * j;
    if (p < P) {
      xv[j] = xr[p];
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float v = to_f32(xv[j].v[k]);
        ss += v * v;
      }
    }
  }
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / static_cast<float>(D) + eps);
  if (lane == 0) rstd[row] = r;
  const Pack<T>* wp = reinterpret_cast<const Pack<T>*>(w);
  Pack<T>* yr = reinterpret_cast<Pack<T>*>(y + row * D);
  uint32_t m = 0;
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int64_t p = lane + 32 * j;
    if (p < P) {
      const Pack<T> wv = wp[p];
      Pack<T> out;
#pragma unroll
      for (int k = 0; k < K; ++k) {  // as above: normalise, round, then scale
        const float xn = to_f32(xv[j].v[k]) * r;
        out.v[k] = off != 0.0f ? from_f32<T>(xn * (to_f32(wv.v[k]) + off))
                               : from_f32<T>(to_f32(wv.v[k]) * to_f32(from_f32<T>(xn)));
        m = max(m, magnitude_bits(to_f32(out.v[k])));
      }
      yr[p] = out;
    }
  }
  if (amax != nullptr) warp_amax(amax, m);
}

// dx = r (g - xhat mean(g xhat)), g = dy (w + off); partial_dw[block, :] = sum over the block's rows of dy xhat.
// Each warp accumulates its own rows' dy·xhat into a private shared-memory row (a lane
// always owns the same columns, so no synchronisation), in the same pass that writes dx;
// the block then adds its warps' rows in warp order. Deterministic.
template <typename T>
__global__ void rmsnorm_backward_kernel(T* dx, float* partial_dw, const T* dy, const T* x, const T* w, float off,
                                        const float* rstd, const T* dres, int64_t rows, int64_t D) {
  extern __shared__ float dw_shared[];  // [warps, D]
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* mine = dw_shared + warp * D;
  for (int64_t i = lane; i < D; i += 32) mine[i] = 0;
  for (int64_t row = blockIdx.x * int64_t{warps} + warp; row < rows; row += int64_t{gridDim.x} * warps) {
    const T* xr = x + row * D;
    const T* dyr = dy + row * D;
    const float r = rstd[row];
    float dot = 0;
    for (int64_t i = lane; i < D; i += 32) dot += to_f32(dyr[i]) * (to_f32(w[i]) + off) * to_f32(xr[i]);
    dot = warp_sum(dot) * r / static_cast<float>(D);
    T* dxr = dx + row * D;
    for (int64_t i = lane; i < D; i += 32) {
      const float d = to_f32(dyr[i]);
      const float xhat = to_f32(xr[i]) * r;
      dxr[i] = from_f32<T>(r * (d * (to_f32(w[i]) + off) - xhat * dot) + (dres ? to_f32(dres[row * D + i]) : 0.0f));
      mine[i] += d * xhat;
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float acc = 0;
    for (int k = 0; k < warps; ++k) acc += dw_shared[k * D + i];
    partial_dw[blockIdx.x * D + i] = acc;
  }
}

// The same over 16-byte packs with the residual gradient added before rounding. A lane owns
// packs lane, lane + 32, ...; its private accumulators sit at [k * P + p] (P packs per row),
// so the lanes of a warp write consecutive words.
template <typename T>
__global__ void rmsnorm_backward_packed_kernel(T* dx, float* partial_dw, const T* dy, const T* x, const T* w,
                                               float off, const float* rstd, const T* dres, int64_t rows,
                                               int64_t D) {
  extern __shared__ float dw_shared[];  // [warps, D]
  constexpr int K = Pack<T>::kSize;
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t P = D / K;
  float* mine = dw_shared + warp * D;
  for (int64_t i = lane; i < D; i += 32) mine[i] = 0;
  const Pack<T>* wp = reinterpret_cast<const Pack<T>*>(w);
  for (int64_t row = blockIdx.x * int64_t{warps} + warp; row < rows; row += int64_t{gridDim.x} * warps) {
    const Pack<T>* xr = reinterpret_cast<const Pack<T>*>(x + row * D);
    const Pack<T>* dyr = reinterpret_cast<const Pack<T>*>(dy + row * D);
    const float r = rstd[row];
    float dot = 0;
    for (int64_t p = lane; p < P; p += 32) {
      const Pack<T> xv = xr[p], dv = dyr[p], wv = wp[p];
#pragma unroll
      for (int k = 0; k < K; ++k) dot += to_f32(dv.v[k]) * (to_f32(wv.v[k]) + off) * to_f32(xv.v[k]);
    }
    dot = warp_sum(dot) * r / static_cast<float>(D);
    Pack<T>* dxr = reinterpret_cast<Pack<T>*>(dx + row * D);
    const Pack<T>* rr = dres ? reinterpret_cast<const Pack<T>*>(dres + row * D) : nullptr;
    for (int64_t p = lane; p < P; p += 32) {
      const Pack<T> xv = xr[p], dv = dyr[p], wv = wp[p];
      Pack<T> rv;
      if (rr) rv = rr[p];
      Pack<T> out;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float d = to_f32(dv.v[k]);
        const float xhat = to_f32(xv.v[k]) * r;
        const float add = rr ? to_f32(rv.v[k]) : 0.0f;
        out.v[k] = from_f32<T>(r * (d * (to_f32(wv.v[k]) + off) - xhat * dot) + add);
        mine[k * P + p] += d * xhat;
      }
      dxr[p] = out;
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const int64_t at = (i % K) * P + i / K;  // column i = pack i / K, element i % K
    float acc = 0;
    for (int k = 0; k < warps; ++k) acc += dw_shared[k * D + at];
    partial_dw[blockIdx.x * D + i] = acc;
  }
}

// The packed path for rows of up to 1024 packs: a block takes one row at a time, thread t
// owns pack t of every row (its weight values and its dweight accumulators stay in
// registers), and the row's dot product is a block reduction. Full occupancy, no shared
// row buffers. Two reduction buffers alternate between rows, so one barrier per row
// suffices: a buffer is rewritten only after every thread passed the next row's barrier.
// The loop is software-pipelined: the next row's x, dy, residual gradient and rstd are
// loaded before this row's barrier, so their latency overlaps the reduction and the stores
// (without it every row paid two dependent memory round trips: 74 % of copy bandwidth).
template <typename T>
__global__ void rmsnorm_backward_rows_kernel(T* dx, float* partial_dw, const T* dy, const T* x, const T* w,
                                             float off, const float* rstd, const T* dres, int64_t rows,
                                             int64_t D) {
  constexpr int K = Pack<T>::kSize;
  __shared__ float red[2][32];
  const int64_t P = D / K;
  const int t = threadIdx.x, lane = t % 32, warp = t / 32, warps = blockDim.x / 32;
  const bool active = t < P;
  float wf[K], acc[K];
  if (active) {
    const Pack<T> wv = reinterpret_cast<const Pack<T>*>(w)[t];
#pragma unroll
    for (int k = 0; k < K; ++k) wf[k] = to_f32(wv.v[k]) + off;
  }
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = 0;
  struct Row {
    Pack<T> x, dy, dres;
    float rstd;
  };
  auto load = [&](int64_t row, Row& r) {
    if (row >= rows) return;
    r.rstd = rstd[row];
    if (!active) return;
    r.x = reinterpret_cast<const Pack<T>*>(x + row * D)[t];
    r.dy = reinterpret_cast<const Pack<T>*>(dy + row * D)[t];
    if (dres) r.dres = reinterpret_cast<const Pack<T>*>(dres + row * D)[t];
  };
  Row cur, next;
  load(blockIdx.x, cur);
  int parity = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x, parity ^= 1) {
    float dot = 0;
    if (active) {
#pragma unroll
      for (int k = 0; k < K; ++k) dot += to_f32(cur.dy.v[k]) * wf[k] * to_f32(cur.x.v[k]);
    }
    load(row + gridDim.x, next);  // in flight across the barrier and this row's stores
    dot = warp_sum(dot);
    if (lane == 0) red[parity][warp] = dot;
    __syncthreads();
    float total = 0;
    for (int i = 0; i < warps; ++i) total += red[parity][i];  // the same order in every thread
    const float r = cur.rstd;
    total = total * r / static_cast<float>(D);
    if (active) {
      Pack<T> out;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float d = to_f32(cur.dy.v[k]);
        const float xhat = to_f32(cur.x.v[k]) * r;
        out.v[k] = from_f32<T>(r * (d * wf[k] - xhat * total) + (dres ? to_f32(cur.dres.v[k]) : 0.0f));
        acc[k] += d * xhat;
      }
      reinterpret_cast<Pack<T>*>(dx + row * D)[t] = out;
    }
    cur = next;
  }
  if (active) {
#pragma unroll
    for (int k = 0; k < K; ++k) partial_dw[blockIdx.x * D + t * K + k] = acc[k];
  }
}

// dw[i] += sum over blocks b of partial[b, i] (= with overwrite). A block owns 32 columns;
// its 32 x 32 threads each sum every 32nd partial row of one column (many loads in flight
// instead of one long chain per column), then thread row 0 adds the 32 sums in a fixed
// order: deterministic.
constexpr int kSumCols = 32, kSumGroups = 32;

template <typename T>
__global__ void __launch_bounds__(kSumCols* kSumGroups) sum_columns_kernel(T* dw, const float* partial, int blocks,
                                                                            int64_t D, bool overwrite) {
  __shared__ float sums[kSumGroups][kSumCols + 1];
  const int c = threadIdx.x, g = threadIdx.y;
  const int64_t i = blockIdx.x * int64_t{kSumCols} + c;
  float acc = 0;
  if (i < D)
    for (int b = g; b < blocks; b += kSumGroups) acc += partial[b * D + i];
  sums[g][c] = acc;
  __syncthreads();
  if (g == 0 && i < D) {
    float total = 0;
    for (int k = 0; k < kSumGroups; ++k) total += sums[k][c];
    dw[i] = from_f32<T>(overwrite ? total : to_f32(dw[i]) + total);
  }
}

void check(const Tensor& x, const Tensor& w, const Tensor& stats, const char* op) {
  check_cuda_tensor(x, op, "x_TD");
  check_cuda_tensor(w, op, "weight_D");
  check_cuda_tensor(stats, op, "rstd_T");
  ST_CHECK(x.ndim() == 2, op, ": `x_TD` must be 2-D, found ", x.str());
  check_shape(w, {x.size(1)}, op, "weight_D");
  check_dtype(w, x.dtype(), op, "weight_D");
  check_shape(stats, {x.size(0)}, op, "rstd_T");
  check_dtype(stats, DType::kF32, op, "rstd_T");
}

}  // namespace

void rmsnorm_forward(Tensor& y_TD, Tensor& rstd_T, const Tensor& x_TD, const Tensor& weight_D,
                     const RmsNormOptions& options, Stream s) {
  check(x_TD, weight_D, rstd_T, "rmsnorm_forward");
  check_cuda_tensor(y_TD, "rmsnorm_forward", "y_TD");
  check_shape(y_TD, x_TD.shape(), "rmsnorm_forward", "y_TD");
  check_dtype(y_TD, x_TD.dtype(), "rmsnorm_forward", "y_TD");
  const int64_t rows = x_TD.size(0), D = x_TD.size(1);
  if (rows == 0) return;
  uint32_t* amax = nullptr;
  if (options.amax_y_1.defined()) {
    const Tensor& a = options.amax_y_1;
    ST_CHECK(a.device() == y_TD.device() && a.dtype() == DType::kI32 && a.numel() == 1, "rmsnorm_forward: the amax "
             "must be one i32 on ", y_TD.device().str(), ", found ", a.str());
    amax = static_cast<uint32_t*>(a.raw_data());
  }
  const int grid = static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const float off = static_cast<float>(options.weight_offset);
  dispatch_float(x_TD.dtype(), "rmsnorm_forward", [&]<typename T>() {
    const int64_t lane_packs = (D / Pack<T>::kSize + 31) / 32;
    if (packable({&y_TD, &x_TD, &weight_D}, D, sizeof(T)) && lane_packs <= 16) {
      auto launch = [&]<int kPacks>() {
        rmsnorm_forward_packed_kernel<T, kPacks><<<grid, kWarpsPerBlock * 32, 0, stream_of(s)>>>(
            static_cast<T*>(y_TD.raw_data()), rstd_T.data<float>(), static_cast<const T*>(x_TD.raw_data()),
            static_cast<const T*>(weight_D.raw_data()), off, rows, D, static_cast<float>(options.eps), amax);
      };
      if (lane_packs <= 2) launch.template operator()<2>();
      else if (lane_packs <= 4) launch.template operator()<4>();
      else if (lane_packs <= 8) launch.template operator()<8>();
      else launch.template operator()<16>();
      ST_CUDA_CHECK_LAUNCH();
      return;
    }
    rmsnorm_forward_kernel<T><<<grid, kWarpsPerBlock * 32, 0, stream_of(s)>>>(
        static_cast<T*>(y_TD.raw_data()), rstd_T.data<float>(), static_cast<const T*>(x_TD.raw_data()),
        static_cast<const T*>(weight_D.raw_data()), off, rows, D, static_cast<float>(options.eps), amax);
  });
  ST_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(Tensor& dx_TD, Tensor& dweight_D, const Tensor& dy_TD, const Tensor& x_TD,
                      const Tensor& weight_D, const Tensor& rstd_T, const Tensor& dresidual_TD,
                      const RmsNormBackwardOptions& options, Stream s) {
  check(x_TD, weight_D, rstd_T, "rmsnorm_backward");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dx_TD, &dy_TD}) {
    check_cuda_tensor(*t, "rmsnorm_backward", "dx_TD/dy_TD");
    check_shape(*t, x_TD.shape(), "rmsnorm_backward", "dx_TD/dy_TD");
    check_dtype(*t, x_TD.dtype(), "rmsnorm_backward", "dx_TD/dy_TD");
  }
  check_cuda_tensor(dweight_D, "rmsnorm_backward", "dweight_D");
  check_shape(dweight_D, weight_D.shape(), "rmsnorm_backward", "dweight_D");
  const int64_t rows = x_TD.size(0), D = x_TD.size(1);
  if (rows == 0) {
    if (options.overwrite_dweight) fill(dweight_D, 0.0, s);  // no rows: the gradient is zero
    return;
  }
  const bool residual = dresidual_TD.defined();
  if (residual) {
    check_cuda_tensor(dresidual_TD, "rmsnorm_backward", "dresidual_TD");
    check_shape(dresidual_TD, x_TD.shape(), "rmsnorm_backward", "dresidual_TD");
    check_dtype(dresidual_TD, x_TD.dtype(), "rmsnorm_backward", "dresidual_TD");
  }
  Tensor partial;  // [grid, D] f32 column partials, one row per block
  int grid = 0;
  const float off = static_cast<float>(options.weight_offset);
  dispatch_float(x_TD.dtype(), "rmsnorm_backward", [&]<typename T>() {
    std::initializer_list<const Tensor*> all = {&dx_TD, &dy_TD, &x_TD, &weight_D};
    const bool packed = packable(all, D, sizeof(T)) && (!residual || packable({&dresidual_TD}, D, sizeof(T)));
    const int64_t packs = D / Pack<T>::kSize;
    if (packed && packs <= 1024) {
      const int threads = static_cast<int>((packs + 31) / 32 * 32);
      grid = static_cast<int>(std::min<int64_t>(rows, grid_for(rows * threads, threads)));
      partial = Tensor::empty({grid, D}, DType::kF32, x_TD.device(), "rmsnorm dweight partials", s);
      rmsnorm_backward_rows_kernel<T><<<grid, threads, 0, stream_of(s)>>>(
          static_cast<T*>(dx_TD.raw_data()), partial.data<float>(), static_cast<const T*>(dy_TD.raw_data()),
          static_cast<const T*>(x_TD.raw_data()), static_cast<const T*>(weight_D.raw_data()), off, rstd_T.data<float>(),
          residual ? static_cast<const T*>(dresidual_TD.raw_data()) : nullptr, rows, D);
      return;
    }
    // as many warps per block as fit a private f32 row each in 200 KiB of shared memory
    const int warps = static_cast<int>(std::min<int64_t>(kWarpsPerBlock, (200 * 1024) / (D * 4)));
    ST_CHECK(warps >= 1, "rmsnorm_backward: width ", D, " exceeds the shared-memory column buffer");
    const size_t smem = static_cast<size_t>(warps) * static_cast<size_t>(D) * sizeof(float);
    grid = std::min(grid_for(rows * 32, warps * 32), 1024);
    partial = Tensor::empty({grid, D}, DType::kF32, x_TD.device(), "rmsnorm dweight partials", s);
    auto kernel = packed ? rmsnorm_backward_packed_kernel<T> : rmsnorm_backward_kernel<T>;
    if (smem > 48 * 1024) ST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                             static_cast<int>(smem)));
    kernel<<<grid, warps * 32, smem, stream_of(s)>>>(
        static_cast<T*>(dx_TD.raw_data()), partial.data<float>(), static_cast<const T*>(dy_TD.raw_data()),
        static_cast<const T*>(x_TD.raw_data()), static_cast<const T*>(weight_D.raw_data()), off, rstd_T.data<float>(),
        residual ? static_cast<const T*>(dresidual_TD.raw_data()) : nullptr, rows, D);
  });
  ST_CUDA_CHECK_LAUNCH();
  // dweight may be f32 under bf16 data (f32 gradient accumulation)
  dispatch_float(dweight_D.dtype(), "rmsnorm_backward", [&]<typename W>() {
    const unsigned blocks = static_cast<unsigned>((D + kSumCols - 1) / kSumCols);
    sum_columns_kernel<W><<<blocks, dim3(kSumCols, kSumGroups), 0, stream_of(s)>>>(
        static_cast<W*>(dweight_D.raw_data()), partial.data<float>(), grid, D, options.overwrite_dweight);
  });
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace shardtrain::ops::cuda
