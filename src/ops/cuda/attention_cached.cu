// Attention forward over a KV cache on CUDA: T new queries against S >= T keys, the queries
// being the last T of the S positions (bottom-right causal: query t sees keys
// j <= t + S - T; with a sliding window of W keys also j > t + S - T - W). For incremental decoding (T = 1 after the prompt), where cuDNN's flash
// kernels, built for as many keys as queries, do not apply. One block of 32 warps per query
// row, so that even one token's 32 heads keep the SMs' memory pipes busy: each warp takes
// every 32nd key with an online softmax (running max, sum and p·v in f32, lanes splitting the
// head dimension, the score a warp reduction), then the warps' partial results are combined.
// f32 math; bf16, f16 or f32 storage; heads of q, k and v may be slices of a stacked tensor
// and k, v rows of a larger cache (strided tokens and sequences).
#include "ops/cuda/attention_cached.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ops/cuda/common.cuh"

namespace shardtrain::ops::cuda {
namespace {

constexpr int kWarps = 32, kThreads = 32 * kWarps;
constexpr int kMaxHeadDim = 256, kPerLane = kMaxHeadDim / 32;

struct Layout {
  int64_t sequence, token;  // element strides; a token's heads are consecutive rows of H
};

struct Dims {
  int64_t T, S, N, M, H;
  float scale;
  bool causal;
  Layout q, k, v, out;
  int64_t window;  // sliding window: query t sees only its last `window` keys (0: none)
  float softcap;   // > 0: the scaled scores soft-capped, s -> softcap · tanh(s / softcap) (0: none)
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Grid (T, N, B): out[b, t, n, :] and lse[b, n, t]. With `position` (device), S is *position + T
// (the keys a KV cache holds once the T new rows are in), not d.S.
template <typename E>
__global__ void __launch_bounds__(kThreads)
    cached_forward_kernel(E* out, float* lse, const E* q, const E* k, const E* v, Dims d, const int32_t* position) {
  if (position != nullptr) d.S = *position + d.T;
  __shared__ float q_row[kMaxHeadDim];
  __shared__ float warp_max[kWarps], warp_sum_exp[kWarps];
  __shared__ float partial[kWarps][kMaxHeadDim];
  const int64_t t = blockIdx.x, n = blockIdx.y, b = blockIdx.z, m = n / (d.N / d.M);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t keys = d.causal ? t + d.S - d.T + 1 : d.S;
  const int64_t first = d.window > 0 ? max(int64_t{0}, keys - d.window) : 0;
  const E* q_at = q + b * d.q.sequence + t * d.q.token + n * d.H;
  for (int64_t h = threadIdx.x; h < d.H; h += kThreads) q_row[h] = to_f32(q_at[h]);
  __syncthreads();
  const E* k_seq = k + b * d.k.sequence + m * d.H;
  const E* v_seq = v + b * d.v.sequence + m * d.H;
  auto score = [&](int64_t j) {
    const E* k_row = k_seq + j * d.k.token;
    float s = 0;
    for (int64_t h = lane; h < d.H; h += 32) s += q_row[h] * to_f32(k_row[h]);
    s = d.scale * warp_sum(s);
    return d.softcap > 0 ? d.softcap * tanhf(s / d.softcap) : s;  // capped after the scale, as on the CPU
  };

  // one pass per warp over its keys: running maximum, sum of exponentials and sum of p·v
  float mx = -INFINITY, sum = 0;
  float acc[kPerLane] = {};
  for (int64_t j = first + warp; j < keys; j += kWarps) {
    const float s = score(j);
    const float top = fmaxf(mx, s);
    const float rescale = expf(mx - top), p = expf(s - top);  // expf(-inf) = 0 on the first key
    sum = sum * rescale + p;
    mx = top;
    const E* v_row = v_seq + j * d.v.token;
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t h = lane + 32 * i;
      if (h < d.H) acc[i] = acc[i] * rescale + p * to_f32(v_row[h]);
    }
  }
  if (lane == 0) {
    warp_max[warp] = mx;
    warp_sum_exp[warp] = sum;
  }
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t h = lane + 32 * i;
    if (h < d.H) partial[warp][h] = acc[i];
  }
  __syncthreads();
  // the warps' results on the row's maximum (a warp without keys has sum 0 and adds nothing)
  float row_max = -INFINITY;
  for (int w = 0; w < kWarps; ++w) row_max = fmaxf(row_max, warp_max[w]);
  float row_sum = 0;
  for (int w = 0; w < kWarps; ++w)
    if (warp_max[w] > -INFINITY) row_sum += warp_sum_exp[w] * expf(warp_max[w] - row_max);
  const float row_lse = row_max + logf(row_sum);
  E* out_at = out + b * d.out.sequence + t * d.out.token + n * d.H;
  for (int64_t h = threadIdx.x; h < d.H; h += kThreads) {
    float s = 0;
    for (int w = 0; w < kWarps; ++w)
      if (warp_max[w] > -INFINITY) s += partial[w][h] * expf(warp_max[w] - row_max);
    out_at[h] = from_f32<E>(s / row_sum);
  }
  if (threadIdx.x == 0) lse[(b * d.N + n) * d.T + t] = row_lse;
}

// rows[b, p + t, m, :] = src[b, t, m, :] for p = *position, both k and v at once; grid-stride
// over B·T·M·H elements. A position that does not fit traps rather than write past the cache.
template <typename E>
__global__ void write_rows_kernel(E* cache_k, E* cache_v, const E* k, const E* v, Layout cache, Layout kl,
                                  Layout vl, int64_t B, int64_t T, int64_t M, int64_t H, int64_t C,
                                  const int32_t* position) {
  const int64_t p = *position;
  if (p < 0 || p + T > C) __trap();
  const int64_t n = B * T * M * H;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t h = i % H, m = i / H % M, t = i / (H * M) % T, b = i / (H * M * T);
    const int64_t at = b * cache.sequence + (p + t) * cache.token + m * H + h;
    cache_k[at] = k[b * kl.sequence + t * kl.token + m * H + h];
    cache_v[at] = v[b * vl.sequence + t * vl.token + m * H + h];
  }
}

// A [B, rows, heads, H] view whose heads are consecutive rows of H (a token's heads may be a
// slice of a wider stacked row, and tokens a slice of a longer cache): its strides.
Layout layout_of(const Tensor& x, const char* op, const char* arg) {
  ST_CHECK(x.ndim() == 4, op, ": `", arg, "` expected [B, T, heads, H], found ", x.str());
  ST_CHECK(x.stride(3) == 1 && x.stride(2) == x.size(3), op, ": `", arg,
           "` needs each head's H values contiguous and a token's heads consecutive, found ", x.str());
  return {x.stride(0), x.stride(1)};
}

// What both launchers check, and the kernel's dims: q and out [B, T, N, H], lse [B, N, T] f32,
// the keys and values it reads [B, S, M, H] with S >= T, all on q's CUDA device in q's dtype.
Dims forward_dims(const Tensor& out_BTNH, const Tensor& lse_BNT, const Tensor& q_BTNH, const Tensor& k_BSMH,
                  const Tensor& v_BSMH, const AttentionOptions& options, const char* op) {
  for (const Tensor* t : {&out_BTNH, &lse_BNT, &q_BTNH, &k_BSMH, &v_BSMH})  // strided views: layout_of checks them
    ST_CHECK(t->device() == q_BTNH.device() && t->device().is_cuda(), op, ": every tensor on q's CUDA device, found ",
             q_BTNH.str(), " and ", t->str());
  ST_CHECK(q_BTNH.ndim() == 4, op, ": `q_BTNH` expected [B, T, N, H], found ", q_BTNH.str());
  const int64_t B = q_BTNH.size(0), T = q_BTNH.size(1), N = q_BTNH.size(2), H = q_BTNH.size(3);
  const int64_t S = k_BSMH.ndim() == 4 ? k_BSMH.size(1) : 0, M = k_BSMH.ndim() == 4 ? k_BSMH.size(2) : 0;
  ST_CHECK(k_BSMH.shape() == Shape({B, S, M, H}) && v_BSMH.shape() == k_BSMH.shape(), op, ": keys and values "
           "expected [", B, ", S, M, ", H, "], found ", k_BSMH.str(), " and ", v_BSMH.str());
  ST_CHECK(S >= T && M > 0 && N % M == 0, op, ": ", T, " queries over ", S, " keys (S >= T) with ", N,
           " query heads over ", M, " kv heads (M divides N)");
  ST_CHECK(H <= kMaxHeadDim, op, ": head dim ", H, " above the kernel's ", kMaxHeadDim);
  ST_CHECK(options.window >= 0 && (options.window == 0 || options.causal), op, ": a sliding window (",
           options.window, " keys) needs the causal mask and a positive size");
  ST_CHECK(options.softcap >= 0, op, ": the soft-cap of the scores must be >= 0 (0: none), found ", options.softcap);
  ST_CHECK(out_BTNH.shape() == q_BTNH.shape() && lse_BNT.shape() == Shape({B, N, T}) &&
               lse_BNT.dtype() == DType::kF32 && lse_BNT.is_contiguous(),
           op, ": expected out ", q_BTNH.shape().str(), " and f32 lse [", B, ", ", N, ", ", T, "], found ",
           out_BTNH.str(), " and ", lse_BNT.str());
  for (const Tensor* t : {&out_BTNH, &k_BSMH, &v_BSMH})
    ST_CHECK(t->dtype() == q_BTNH.dtype(), op, ": q, keys, values and out share one dtype, found ", q_BTNH.str(),
             " and ", t->str());
  return Dims{T, S, N, M, H,
              static_cast<float>(options.scale > 0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(H))),
              options.causal, layout_of(q_BTNH, op, "q_BTNH"), layout_of(k_BSMH, op, "keys"),
              layout_of(v_BSMH, op, "values"), layout_of(out_BTNH, op, "out_BTNH"), options.window,
              static_cast<float>(options.softcap)};
}

// fn<E>() for q's storage dtype (bf16, f16, f32); f64 has no kernel here.
template <typename Fn>
void dispatch_storage(DType dtype, const char* op, Fn&& fn) {
  dispatch_float(dtype, op, [&]<typename E>() {
    if constexpr (std::is_same_v<E, double>) {
      ST_THROW(op, ": no f64 kernel on CUDA");
    } else {
      fn.template operator()<E>();
    }
  });
}

template <typename E>
void launch_forward(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& q_BTNH, const Tensor& k_BSMH,
                    const Tensor& v_BSMH, const Dims& d, int64_t B, const int32_t* position, Stream s) {
  const dim3 grid(static_cast<unsigned>(d.T), static_cast<unsigned>(d.N), static_cast<unsigned>(B));
  cached_forward_kernel<E><<<grid, kThreads, 0, stream_of(s)>>>(
      static_cast<E*>(out_BTNH.raw_data()), lse_BNT.data<float>(), static_cast<const E*>(q_BTNH.raw_data()),
      static_cast<const E*>(k_BSMH.raw_data()), static_cast<const E*>(v_BSMH.raw_data()), d, position);
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_forward_cached(Tensor& out_BTNH, Tensor& lse_BNT, const Tensor& q_BTNH, const Tensor& k_BSMH,
                              const Tensor& v_BSMH, const AttentionOptions& options, Stream s) {
  const char* op = "attention_forward (KV cache)";
  const Dims d = forward_dims(out_BTNH, lse_BNT, q_BTNH, k_BSMH, v_BSMH, options, op);
  const int64_t B = q_BTNH.size(0);
  if (B == 0 || d.T == 0) return;
  dispatch_storage(q_BTNH.dtype(), op, [&]<typename E>() {
    launch_forward<E>(out_BTNH, lse_BNT, q_BTNH, k_BSMH, v_BSMH, d, B, nullptr, s);
  });
}

void attention_forward_kv_cache(Tensor& out_BTNH, Tensor& lse_BNT, Tensor& cache_k_BCMH, Tensor& cache_v_BCMH,
                                const Tensor& q_BTNH, const Tensor& k_BTMH, const Tensor& v_BTMH,
                                const Tensor& position_1, const AttentionOptions& options, Stream s) {
  const char* op = "attention_forward_kv_cache";
  // the caches are the keys and values the attention reads (S = C, of which p + T count)
  const Dims d = forward_dims(out_BTNH, lse_BNT, q_BTNH, cache_k_BCMH, cache_v_BCMH, options, op);
  for (const Tensor* t : {&k_BTMH, &v_BTMH, &position_1})
    ST_CHECK(t->device() == q_BTNH.device(), op, ": every tensor on q's CUDA device, found ", q_BTNH.str(), " and ",
             t->str());
  ST_CHECK(position_1.dtype() == DType::kI32 && position_1.numel() == 1, op, ": `position_1` must be one i32, found ",
           position_1.str());
  const int64_t B = q_BTNH.size(0);
  ST_CHECK(k_BTMH.shape() == Shape({B, d.T, d.M, d.H}) && v_BTMH.shape() == k_BTMH.shape() &&
               k_BTMH.dtype() == q_BTNH.dtype() && v_BTMH.dtype() == q_BTNH.dtype(),
           op, ": new keys and values expected [", B, ", ", d.T, ", ", d.M, ", ", d.H, "] in q's dtype, found ",
           k_BTMH.str(), " and ", v_BTMH.str());
  ST_CHECK(d.v.sequence == d.k.sequence && d.v.token == d.k.token, op, ": the two caches need one layout, found ",
           cache_k_BCMH.str(), " and ", cache_v_BCMH.str());
  if (B == 0 || d.T == 0) return;
  const Layout kl = layout_of(k_BTMH, op, "k_BTMH"), vl = layout_of(v_BTMH, op, "v_BTMH");
  const int32_t* position = position_1.data<int32_t>();
  dispatch_storage(q_BTNH.dtype(), op, [&]<typename E>() {
    const int64_t elems = B * d.T * d.M * d.H;
    const auto blocks = static_cast<unsigned>(std::min<int64_t>((elems + 255) / 256, 1024));
    write_rows_kernel<E><<<blocks, 256, 0, stream_of(s)>>>(
        static_cast<E*>(cache_k_BCMH.raw_data()), static_cast<E*>(cache_v_BCMH.raw_data()),
        static_cast<const E*>(k_BTMH.raw_data()), static_cast<const E*>(v_BTMH.raw_data()), d.k, kl, vl, B, d.T, d.M,
        d.H, d.S, position);
    ST_CUDA_CHECK_LAUNCH();
    launch_forward<E>(out_BTNH, lse_BNT, q_BTNH, cache_k_BCMH, cache_v_BCMH, d, B, position, s);
  });
}

}  // namespace shardtrain::ops::cuda
