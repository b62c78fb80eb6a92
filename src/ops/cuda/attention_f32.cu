// Attention in f32 on CUDA, for runs that compute in f32 on a GPU (`model.dtype = f32`, used
// to check the bf16 engine against the CPU engine like for like). cuDNN's flash kernels take
// only bf16/f16, so these are plain, exact kernels rather than fast ones: one block per
// query row (forward, dq) or per key row (dk, dv), scores recomputed from q and k on every
// pass, f32 throughout, no atomics, so results are bitwise reproducible. O(T^2 H) work per
// head and O(T) memory: fine for check-sized runs, far too slow for long sequences. Soft-capped
// scores (Gemma 2) are capped after the scale and before the masks' softmax, as on the CPU.
#include "ops/cuda/attention_f32.h"

#include <cmath>

#include "ops/cuda/common.cuh"

namespace shardtrain::ops::cuda {
namespace {

constexpr int kThreads = 128;  // one row per block; also the tile of keys (or queries) per pass

__device__ __forceinline__ float dot(const float* a, const float* b, int64_t H) {
  float s = 0;
  for (int64_t h = 0; h < H; ++h) s += a[h] * b[h];
  return s;
}

struct Dims {
  int64_t B, T, N, M, H;
  float scale;
  bool causal;
  const int32_t* pos;  // packed documents: each token's position in its document (null: none)
  int64_t window;      // sliding window: a query sees its last `window` keys (0: none)
  float softcap;       // > 0: the scaled scores soft-capped, s -> softcap · tanh(s / softcap) (0: none)
  __host__ __device__ int64_t group() const { return N / M; }
  // The score of query row q and key row k: scaled, then soft-capped (the CPU twin's order).
  __device__ float score(const float* q_row, const float* k_row) const {
    const float s = scale * dot(q_row, k_row, H);
    return softcap > 0 ? softcap * tanhf(s / softcap) : s;
  }
  // d(score) / d(scaled product) at a score s: the cap's derivative 1 - tanh^2 = 1 - (s / softcap)^2.
  __device__ float slope(float s) const { return softcap > 0 ? 1.0f - (s / softcap) * (s / softcap) : 1.0f; }
  // The first key query t of row b sees: its document's first token, and within the window.
  __device__ int64_t first_key(int64_t b, int64_t t) const {
    const int64_t doc = pos != nullptr ? t - pos[b * T + t] : 0;
    return window > 0 ? max(doc, t - window + 1) : doc;
  }
};

// The row offset of [b, t, head] in a [B, T, heads, H] tensor.
__device__ __forceinline__ int64_t row(int64_t b, int64_t t, int64_t heads, int64_t head, int64_t T, int64_t H) {
  return ((b * T + t) * heads + head) * H;
}

// A thread's share of a row of H values: h = threadIdx.x + i * kThreads for i < 4.
// acc[i] += sum over the tile's rows r of w[r] * x[r * stride + h] (x at the tile's first row).
__device__ __forceinline__ void add_weighted_rows(float (&acc)[4], const float* w, int64_t tile, const float* x,
                                                  int64_t stride, int64_t H) {
  for (int i = 0; i < 4; ++i) {
    const int64_t h = threadIdx.x + i * int64_t{kThreads};
    if (h >= H) break;
    for (int64_t r = 0; r < tile; ++r) acc[i] += w[r] * x[r * stride + h];
  }
}

// dst[h] = scale * acc[i] for the thread's share of the row.
__device__ __forceinline__ void store_row(float* dst, const float (&acc)[4], float scale, int64_t H) {
  for (int i = 0; i < 4; ++i) {
    const int64_t h = threadIdx.x + i * int64_t{kThreads};
    if (h < H) dst[h] = scale * acc[i];
  }
}

// Block-wide reduction of one value per thread (max or sum); every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float v, float* scratch) {
  for (int off = 16; off > 0; off /= 2) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) r = kMax ? fmaxf(r, scratch[w]) : r + scratch[w];
  return r;
}

// Grid (T, N, B). Writes out[b, t, n, :] and lse[b, n, t].
__global__ void forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v, Dims d) {
  extern __shared__ float smem[];  // q row [H], probabilities of a key tile [kThreads], scratch [32]
  float* q_row = smem;
  float* p_tile = smem + d.H;
  float* scratch = p_tile + kThreads;
  const int64_t t = blockIdx.x, n = blockIdx.y, b = blockIdx.z, m = n / d.group();
  const int64_t keys = d.causal ? t + 1 : d.T, first = d.first_key(b, t);
  for (int64_t h = threadIdx.x; h < d.H; h += kThreads) q_row[h] = q[row(b, t, d.N, n, d.T, d.H) + h];
  __syncthreads();

  float local_max = -INFINITY;
  for (int64_t j = first + threadIdx.x; j < keys; j += kThreads)
    local_max = fmaxf(local_max, d.score(q_row, k + row(b, j, d.M, m, d.T, d.H)));
  const float row_max = block_reduce<true>(local_max, scratch);
  float local_sum = 0;
  for (int64_t j = first + threadIdx.x; j < keys; j += kThreads)
    local_sum += expf(d.score(q_row, k + row(b, j, d.M, m, d.T, d.H)) - row_max);
  const float row_lse = row_max + logf(block_reduce<false>(local_sum, scratch));

  // out[h] = sum_j p_j v[j, h], a tile of keys at a time: threads compute p for the tile,
  // then each thread sums its own h over the tile (h strided by the block).
  float acc[4] = {0, 0, 0, 0};  // H <= 4 * kThreads
  for (int64_t j0 = first; j0 < keys; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    __syncthreads();
    p_tile[threadIdx.x] = j < keys ? expf(d.score(q_row, k + row(b, j, d.M, m, d.T, d.H)) - row_lse) : 0.0f;
    __syncthreads();
    const int64_t tile = min(static_cast<int64_t>(kThreads), keys - j0);
    add_weighted_rows(acc, p_tile, tile, v + row(b, j0, d.M, m, d.T, d.H), d.M * d.H, d.H);
  }
  store_row(out + row(b, t, d.N, n, d.T, d.H), acc, 1.0f, d.H);
  if (threadIdx.x == 0) lse[(b * d.N + n) * d.T + t] = row_lse;
}

// delta[b, n, t] = sum_h dout * out (the softmax backward's row term). Grid (T, N, B).
__global__ void delta_kernel(float* delta, const float* dout, const float* out, Dims d) {
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x, n = blockIdx.y, b = blockIdx.z, r = row(b, t, d.N, n, d.T, d.H);
  float s = 0;
  for (int64_t h = threadIdx.x; h < d.H; h += kThreads) s += dout[r + h] * out[r + h];
  s = block_reduce<false>(s, scratch);
  if (threadIdx.x == 0) delta[(b * d.N + n) * d.T + t] = s;
}

// dq[b, t, n, :] = scale * sum_j ds_tj k_j with ds = p (dout_t . v_j - delta_t). Grid (T, N, B).
__global__ void dq_kernel(float* dq, const float* q, const float* k, const float* v, const float* dout,
                          const float* lse, const float* delta, Dims d) {
  extern __shared__ float smem[];  // q row [H], dout row [H], ds of a key tile [kThreads]
  float* q_row = smem;
  float* do_row = smem + d.H;
  float* ds_tile = do_row + d.H;
  const int64_t t = blockIdx.x, n = blockIdx.y, b = blockIdx.z, m = n / d.group();
  const int64_t keys = d.causal ? t + 1 : d.T, stat = (b * d.N + n) * d.T + t, first = d.first_key(b, t);
  const float row_lse = lse[stat], row_delta = delta[stat];
  for (int64_t h = threadIdx.x; h < d.H; h += kThreads) {
    q_row[h] = q[row(b, t, d.N, n, d.T, d.H) + h];
    do_row[h] = dout[row(b, t, d.N, n, d.T, d.H) + h];
  }
  float acc[4] = {0, 0, 0, 0};
  for (int64_t j0 = first; j0 < keys; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    __syncthreads();
    float ds = 0;
    if (j < keys) {
      const float s = d.score(q_row, k + row(b, j, d.M, m, d.T, d.H));
      ds = expf(s - row_lse) * (dot(do_row, v + row(b, j, d.M, m, d.T, d.H), d.H) - row_delta) * d.slope(s);
    }
    ds_tile[threadIdx.x] = ds;
    __syncthreads();
    const int64_t tile = min(static_cast<int64_t>(kThreads), keys - j0);
    add_weighted_rows(acc, ds_tile, tile, k + row(b, j0, d.M, m, d.T, d.H), d.M * d.H, d.H);
  }
  store_row(dq + row(b, t, d.N, n, d.T, d.H), acc, d.scale, d.H);
}

// For key row j of kv head m: dv_j = sum over the group's query heads and the queries that
// see j of p_ij dout_i; dk_j = scale * sum of ds_ij q_i. Grid (T, M, B).
__global__ void dkv_kernel(float* dk, float* dv, const float* q, const float* k, const float* v, const float* dout,
                           const float* lse, const float* delta, Dims d) {
  extern __shared__ float smem[];  // k row [H], v row [H], p and ds of a query tile [2 kThreads]
  float* k_row = smem;
  float* v_row = smem + d.H;
  float* p_tile = v_row + d.H;
  float* ds_tile = p_tile + kThreads;
  const int64_t j = blockIdx.x, m = blockIdx.y, b = blockIdx.z;
  const int64_t first = d.causal ? j : 0;  // queries before j do not see key j
  for (int64_t h = threadIdx.x; h < d.H; h += kThreads) {
    k_row[h] = k[row(b, j, d.M, m, d.T, d.H) + h];
    v_row[h] = v[row(b, j, d.M, m, d.T, d.H) + h];
  }
  float acc_k[4] = {0, 0, 0, 0}, acc_v[4] = {0, 0, 0, 0};
  for (int64_t g = 0; g < d.group(); ++g) {
    const int64_t n = m * d.group() + g;
    for (int64_t i0 = first; i0 < d.T; i0 += kThreads) {
      const int64_t i = i0 + threadIdx.x;
      __syncthreads();
      float p = 0, ds = 0;
      if (i < d.T && d.first_key(b, i) <= j) {  // query i sees key j
        const int64_t stat = (b * d.N + n) * d.T + i;
        const float s = d.score(q + row(b, i, d.N, n, d.T, d.H), k_row);
        p = expf(s - lse[stat]);
        ds = p * (dot(dout + row(b, i, d.N, n, d.T, d.H), v_row, d.H) - delta[stat]) * d.slope(s);
      }
      p_tile[threadIdx.x] = p;
      ds_tile[threadIdx.x] = ds;
      __syncthreads();
      const int64_t tile = min(static_cast<int64_t>(kThreads), d.T - i0);
      add_weighted_rows(acc_v, p_tile, tile, dout + row(b, i0, d.N, n, d.T, d.H), d.N * d.H, d.H);
      add_weighted_rows(acc_k, ds_tile, tile, q + row(b, i0, d.N, n, d.T, d.H), d.N * d.H, d.H);
    }
  }
  store_row(dk + row(b, j, d.M, m, d.T, d.H), acc_k, d.scale, d.H);
  store_row(dv + row(b, j, d.M, m, d.T, d.H), acc_v, 1.0f, d.H);
}

Dims dims_of(const Tensor& q, const Tensor& k, const AttentionOptions& o) {
  Dims d{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), 0.0f, o.causal, nullptr, o.window,
         static_cast<float>(o.softcap)};
  ST_CHECK(o.window == 0 || o.causal, "attention (f32 on CUDA): a sliding window needs the causal mask");
  ST_CHECK(o.softcap >= 0, "attention (f32 on CUDA): the soft-cap of the scores must be >= 0 (0: none), found ",
           o.softcap);
  if (o.documents != nullptr) d.pos = static_cast<const int32_t*>(o.documents->positions_BT.raw_data());
  // key spans in the same form: t minus the first key query t sees (T for none), not causal
  if (o.spans != nullptr) d.pos = static_cast<const int32_t*>(o.spans->positions_BT.raw_data());
  d.scale = static_cast<float>(o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(d.H)));
  ST_CHECK(d.H <= 4 * kThreads, "attention (f32 on CUDA): head dim ", d.H, " above ", 4 * kThreads);
  // rows run on grid x (up to 2^31 - 1); heads and batch on grid y and z (up to 65535)
  ST_CHECK(d.N <= 65535 && d.B <= 65535, "attention (f32 on CUDA): batch and heads must be at most 65535, found ",
           q.str());
  return d;
}

}  // namespace

void attention_forward_f32(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& q_BTNH, const Tensor& k_BTMH,
                           const Tensor& v_BTMH, const AttentionOptions& options, Stream s) {
  const Dims d = dims_of(q_BTNH, k_BTMH, options);
  const dim3 grid(static_cast<unsigned>(d.T), static_cast<unsigned>(d.N), static_cast<unsigned>(d.B));
  const size_t smem = (d.H + kThreads + 32) * sizeof(float);
  forward_kernel<<<grid, kThreads, smem, stream_of(s)>>>(out_BTNH.data<float>(), lse_BNT.data<float>(),
                                                         q_BTNH.data<float>(), k_BTMH.data<float>(),
                                                         v_BTMH.data<float>(), d);
  ST_CUDA_CHECK_LAUNCH();
}

void attention_backward_f32(Tensor& dq_BTNH, Tensor& dk_BTMH, Tensor& dv_BTMH, const Tensor& dout_BTNH,
                            const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH, const Tensor& out_BTNH,
                            const Tensor& lse_BNT, const AttentionOptions& options, Stream s) {
  const Dims d = dims_of(q_BTNH, k_BTMH, options);
  Tensor delta = Tensor::empty({d.B, d.N, d.T}, DType::kF32, q_BTNH.device(), "attention backward row terms", s);
  const dim3 q_grid(static_cast<unsigned>(d.T), static_cast<unsigned>(d.N), static_cast<unsigned>(d.B));
  const dim3 kv_grid(static_cast<unsigned>(d.T), static_cast<unsigned>(d.M), static_cast<unsigned>(d.B));
  const cudaStream_t st = stream_of(s);
  delta_kernel<<<q_grid, kThreads, 0, st>>>(delta.data<float>(), dout_BTNH.data<float>(), out_BTNH.data<float>(), d);
  ST_CUDA_CHECK_LAUNCH();
  dq_kernel<<<q_grid, kThreads, (2 * d.H + kThreads) * sizeof(float), st>>>(
      dq_BTNH.data<float>(), q_BTNH.data<float>(), k_BTMH.data<float>(), v_BTMH.data<float>(),
      dout_BTNH.data<float>(), lse_BNT.data<float>(), delta.data<float>(), d);
  ST_CUDA_CHECK_LAUNCH();
  dkv_kernel<<<kv_grid, kThreads, (2 * d.H + 2 * kThreads) * sizeof(float), st>>>(
      dk_BTMH.data<float>(), dv_BTMH.data<float>(), q_BTNH.data<float>(), k_BTMH.data<float>(),
      v_BTMH.data<float>(), dout_BTNH.data<float>(), lse_BNT.data<float>(), delta.data<float>(), d);
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace shardtrain::ops::cuda
