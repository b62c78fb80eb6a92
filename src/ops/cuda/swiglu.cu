// CUDA SwiGLU (and GeGLU: the tanh-approximated GELU on the gate) forward and backward,
// elementwise in f32; 16-byte packs when aligned. kAct: the GluActivation as an int.
#include "ops/cuda/common.cuh"
#include "ops/swiglu.h"

#include <algorithm>
#include <vector>

namespace shardtrain::ops::cuda {
namespace {

constexpr int kThreads = 256;

constexpr int kSilu = static_cast<int>(GluActivation::kSilu);
constexpr int kGeluTanh = static_cast<int>(GluActivation::kGeluTanh);
constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluKappa = 0.044715f;

// (1 + tanh(z)) / 2 of gelu_tanh's z = sqrt(2/pi) (g + 0.044715 g^3), as the sigmoid of 2z: the
// same value, without 1 + tanh(z) cancelling to 0 in f32 for a negative gate (below about -4),
// where the f64 twin keeps its e^(2z).
__device__ __forceinline__ float gelu_tanh_half(float g) {
  return 1.0f / (1.0f + expf(-2.0f * kGeluBeta * (g + kGeluKappa * g * g * g)));
}

// act(g) * u in f32; the forward and the backward's recompute of h share it (bitwise equal).
// silu(g) = g sigmoid(g); gelu_tanh(g) = g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) / 2.
template <int kAct>
__device__ __forceinline__ float act_times(float g, float u) {
  if constexpr (kAct == kGeluTanh) {
    return g * gelu_tanh_half(g) * u;
  } else {
    return g / (1.0f + __expf(-g)) * u;
  }
}

// dgate and dup of h = act(g) u from dh = d: dgate = d u act'(g), dup = d act(g).
template <int kAct>
__device__ __forceinline__ void act_backward(float g, float u, float d, float& dg, float& du) {
  if constexpr (kAct == kGeluTanh) {
    // with s = (1 + t) / 2: (1 - t^2) / 2 = 2 s (1 - s)
    const float half = gelu_tanh_half(g);
    const float a = g * half;
    const float da = half + 2.0f * g * half * (1.0f - half) * kGeluBeta * (1.0f + 3.0f * kGeluKappa * g * g);
    dg = d * u * da;
    du = d * a;
  } else {  // d/dg [g s(g)] = s(g) (1 + g (1 - s(g)))
    const float sig = 1.0f / (1.0f + __expf(-g));
    dg = d * u * sig * (1.0f + g * (1.0f - sig));
    du = d * g * sig;
  }
}

template <typename T, int kAct>
__global__ void swiglu_forward_kernel(T* h, const T* gate, const T* up, int64_t n, uint32_t* amax) {
  uint32_t m = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    h[i] = from_f32<T>(act_times<kAct>(to_f32(gate[i]), to_f32(up[i])));
    m = max(m, magnitude_bits(to_f32(h[i])));
  }
  if (amax != nullptr) block_amax(amax, m);
}

// act_backward's gradients; h (when not null) recomputed.
template <typename T, int kAct>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, T* h, const T* dh, const T* gate, const T* up, int64_t n,
                                       uint32_t* amax) {
  uint32_t m = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float g = to_f32(gate[i]), u = to_f32(up[i]), d = to_f32(dh[i]);
    float dg, du;
    act_backward<kAct>(g, u, d, dg, du);
    if (h) h[i] = from_f32<T>(act_times<kAct>(g, u));
    dgate[i] = from_f32<T>(dg);
    dup[i] = from_f32<T>(du);
    m = max(m, max(magnitude_bits(to_f32(dgate[i])), magnitude_bits(to_f32(dup[i]))));
  }
  if (amax != nullptr) block_amax(amax, m);
}

// h = act(g) * u for one pack.
template <typename T, int kAct>
__device__ __forceinline__ Pack<T> act_times_pack(const Pack<T>& g, const Pack<T>& u) {
  Pack<T> out;
#pragma unroll
  for (int k = 0; k < Pack<T>::kSize; ++k) out.v[k] = from_f32<T>(act_times<kAct>(to_f32(g.v[k]), to_f32(u.v[k])));
  return out;
}

// The largest |v| of a pack's values (as magnitude_bits).
template <typename T>
__device__ __forceinline__ uint32_t pack_max(const Pack<T>& p) {
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < Pack<T>::kSize; ++k) m = max(m, magnitude_bits(to_f32(p.v[k])));
  return m;
}

// One pack of the backward: dgate, dup and (kWithH) h from dh, gate and up. No __restrict__:
// dgate and dup may alias gate and up (every pack is loaded before its results are stored).
template <typename T, bool kWithH, int kAct>
__device__ __forceinline__ uint32_t swiglu_backward_pack(Pack<T>* dgate, Pack<T>* dup, Pack<T>* h, int64_t i,
                                                         const Pack<T>& gp, const Pack<T>& upk, const Pack<T>& dp) {
  Pack<T> dg, du, hp;
#pragma unroll
  for (int k = 0; k < Pack<T>::kSize; ++k) {
    const float g = to_f32(gp.v[k]), u = to_f32(upk.v[k]), d = to_f32(dp.v[k]);
    float dgf, duf;
    act_backward<kAct>(g, u, d, dgf, duf);
    dg.v[k] = from_f32<T>(dgf);
    du.v[k] = from_f32<T>(duf);
    if constexpr (kWithH) hp.v[k] = from_f32<T>(act_times<kAct>(g, u));
  }
  dgate[i] = dg;
  dup[i] = du;
  if constexpr (kWithH) h[i] = hp;
  return max(pack_max(dg), pack_max(du));  // what an amax of the gradients needs
}

// [rows, cols] tensors with rows `pitch` packs apart (cols / 8 for a contiguous bf16 tensor;
// 2F / 8 for gate and up as the two halves of one stacked [tokens, 2F] product). A 2-D grid,
// no index division: x covers a row's packs, y strides over rows, each thread taking two rows
// per iteration with all their loads issued first.
struct Pitches {
  int64_t h, gate, up, dh, dgate, dup;  // in packs
};

template <typename T, int kAct>
__global__ void swiglu_forward_rows(Pack<T>* __restrict__ h, const Pack<T>* __restrict__ gate,
                                    const Pack<T>* __restrict__ up, int64_t rows, int64_t row_packs, Pitches p,
                                    uint32_t* amax) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  uint32_t m = 0;
  if (c < row_packs) {
    int64_t r = blockIdx.y;
    for (; r + gridDim.y < rows; r += 2 * int64_t{gridDim.y}) {
      const int64_t r1 = r + gridDim.y;
      const Pack<T> g0 = gate[r * p.gate + c], u0 = up[r * p.up + c], g1 = gate[r1 * p.gate + c],
                    u1 = up[r1 * p.up + c];
      const Pack<T> h0 = act_times_pack<T, kAct>(g0, u0), h1 = act_times_pack<T, kAct>(g1, u1);
      h[r * p.h + c] = h0;
      h[r1 * p.h + c] = h1;
      if (amax != nullptr) m = max(m, max(pack_max(h0), pack_max(h1)));
    }
    if (r < rows) {
      const Pack<T> h0 = act_times_pack<T, kAct>(gate[r * p.gate + c], up[r * p.up + c]);
      h[r * p.h + c] = h0;
      if (amax != nullptr) m = max(m, pack_max(h0));
    }
  }
  if (amax != nullptr) block_amax(amax, m);
}

template <typename T, bool kWithH, int kAct>
__global__ void swiglu_backward_rows(Pack<T>* dgate, Pack<T>* dup, Pack<T>* h, const Pack<T>* dh, const Pack<T>* gate,
                                     const Pack<T>* up, int64_t rows, int64_t row_packs, Pitches p, uint32_t* amax) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  uint32_t m = 0;
  // swiglu_backward_pack writes pack i of dgate, dup and h: point them at row r's start
  auto one = [&](int64_t r, const Pack<T>& g, const Pack<T>& u, const Pack<T>& d) {
    m = max(m, swiglu_backward_pack<T, kWithH, kAct>(dgate + r * p.dgate, dup + r * p.dup, kWithH ? h + r * p.h : h, c, g,
                                               u, d));
  };
  if (c < row_packs) {
    int64_t r = blockIdx.y;
    for (; r + gridDim.y < rows; r += 2 * int64_t{gridDim.y}) {
      const int64_t r1 = r + gridDim.y;
      const Pack<T> g0 = gate[r * p.gate + c], u0 = up[r * p.up + c], d0 = dh[r * p.dh + c];
      const Pack<T> g1 = gate[r1 * p.gate + c], u1 = up[r1 * p.up + c], d1 = dh[r1 * p.dh + c];
      one(r, g0, u0, d0);
      one(r1, g1, u1, d1);
    }
    if (r < rows) one(r, gate[r * p.gate + c], up[r * p.up + c], dh[r * p.dh + c]);
  }
  if (amax != nullptr) block_amax(amax, m);
}

// Half as many y blocks as rows, so each thread takes two rows at once.
dim3 rows_grid(int64_t rows, int64_t row_packs) {
  return dim3(static_cast<unsigned>((row_packs + kThreads - 1) / kThreads),
              static_cast<unsigned>(std::clamp<int64_t>((rows + 1) / 2, 1, 65535)));
}

// Device, shape and dtype of each tensor; their row layouts ([T, F]: tokens as rows) into
// `layouts` (nullptr entries skipped). True when all are contiguous.
bool check_all(std::initializer_list<const Tensor*> ts, const Tensor& ref, const char* op,
               std::vector<RowLayout>* layouts = nullptr) {
  bool contiguous = true;
  for (const Tensor* t : ts) {
    ST_CHECK(t->device().is_cuda(), op, ": expected tensors on a CUDA device, found ", t->str());
    check_shape(*t, ref.shape(), op, "tensor");
    check_dtype(*t, ref.dtype(), op, "tensor");
    RowLayout l;
    ST_CHECK(t->ndim() == 2 && row_layout(*t, 1, l), op, ": expected [T, F] tensors whose rows are contiguous, found ",
             t->str());
    if (layouts) layouts->push_back(l);
    contiguous = contiguous && t->is_contiguous();
  }
  return contiguous;
}

// Row pitches in packs when every tensor's rows and base are 16-byte aligned.
bool pitches_in_packs(const std::vector<RowLayout>& l, const std::vector<const Tensor*>& ts, int64_t cols,
                      size_t element_bytes, std::vector<int64_t>& out) {
  const int64_t P = static_cast<int64_t>(16 / element_bytes);
  if (cols % P != 0) return false;
  for (size_t i = 0; i < l.size(); ++i) {
    if (l[i].pitch % P != 0 || reinterpret_cast<uintptr_t>(ts[i]->raw_data()) % 16 != 0) return false;
    out.push_back(l[i].pitch / P);
  }
  return true;
}

// The amax slot's pointer (u32 bits), after checking it: one i32 on h's device; null when undefined.
uint32_t* amax_slot(const Tensor& amax_1, const Tensor& ref, const char* op) {
  if (!amax_1.defined()) return nullptr;
  ST_CHECK(amax_1.device() == ref.device() && amax_1.dtype() == DType::kI32 && amax_1.numel() == 1, op,
           ": the amax must be one i32 on ", ref.device().str(), ", found ", amax_1.str());
  return static_cast<uint32_t*>(amax_1.raw_data());
}

}  // namespace

void swiglu_forward(Tensor& h_TF, const Tensor& gate_TF, const Tensor& up_TF, const Tensor& amax_h_1,
                    GluActivation act, Stream s) {
  uint32_t* amax = amax_slot(amax_h_1, h_TF, "swiglu_forward");
  std::vector<RowLayout> l;
  const bool contiguous = check_all({&h_TF, &gate_TF, &up_TF}, gate_TF, "swiglu_forward", &l);
  const int64_t n = h_TF.numel();
  if (n == 0) return;
  const bool gelu = act == GluActivation::kGeluTanh;
  dispatch_float(h_TF.dtype(), "swiglu_forward", [&]<typename T>() {
    std::vector<int64_t> pp;
    // 16-byte rows, contiguous or not: the row kernel (its grid of row pairs moves ~10 % more
    // bytes per second than a grid-stride loop over the flat tensor, stream_energy_bench)
    if (pitches_in_packs(l, {&h_TF, &gate_TF, &up_TF}, gate_TF.size(1), sizeof(T), pp)) {
      const int64_t rows = gate_TF.size(0), row_packs = gate_TF.size(1) / Pack<T>::kSize;
      auto* kernel = gelu ? swiglu_forward_rows<T, kGeluTanh> : swiglu_forward_rows<T, kSilu>;
      kernel<<<rows_grid(rows, row_packs), kThreads, 0, stream_of(s)>>>(
          static_cast<Pack<T>*>(h_TF.raw_data()), static_cast<const Pack<T>*>(gate_TF.raw_data()),
          static_cast<const Pack<T>*>(up_TF.raw_data()), rows, row_packs, Pitches{pp[0], pp[1], pp[2], 0, 0, 0},
          amax);
      return;
    }
    ST_CHECK(contiguous, "swiglu_forward: strided tensors need 16-byte aligned rows, found ", gate_TF.str());
    auto* kernel = gelu ? swiglu_forward_kernel<T, kGeluTanh> : swiglu_forward_kernel<T, kSilu>;
    kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(s)>>>(
        static_cast<T*>(h_TF.raw_data()), static_cast<const T*>(gate_TF.raw_data()),
        static_cast<const T*>(up_TF.raw_data()), n, amax);
  });
  ST_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(Tensor& dgate_TF, Tensor& dup_TF, Tensor& h_TF, const Tensor& dh_TF, const Tensor& gate_TF,
                     const Tensor& up_TF, const Tensor& amax_grads_1, GluActivation act, Stream s) {
  uint32_t* amax = amax_slot(amax_grads_1, dh_TF, "swiglu_backward");
  std::vector<RowLayout> l;
  bool contiguous = check_all({&dgate_TF, &dup_TF, &dh_TF, &gate_TF, &up_TF}, gate_TF, "swiglu_backward", &l);
  const bool with_h = h_TF.defined();
  if (with_h) contiguous = check_all({&h_TF}, gate_TF, "swiglu_backward", &l) && contiguous;
  const int64_t n = dh_TF.numel();
  if (n == 0) return;
  const bool gelu = act == GluActivation::kGeluTanh;
  dispatch_float(dh_TF.dtype(), "swiglu_backward", [&]<typename T>() {
    std::vector<int64_t> pp;
    std::vector<const Tensor*> ts = {&dgate_TF, &dup_TF, &dh_TF, &gate_TF, &up_TF};
    if (with_h) ts.push_back(&h_TF);
    if (pitches_in_packs(l, ts, gate_TF.size(1), sizeof(T), pp)) {  // as in the forward
      const int64_t rows = gate_TF.size(0), row_packs = gate_TF.size(1) / Pack<T>::kSize;
      const Pitches p{with_h ? pp[5] : 0, pp[3], pp[4], pp[2], pp[0], pp[1]};
      auto* kernel = gelu ? (with_h ? swiglu_backward_rows<T, true, kGeluTanh> : swiglu_backward_rows<T, false, kGeluTanh>)
                          : (with_h ? swiglu_backward_rows<T, true, kSilu> : swiglu_backward_rows<T, false, kSilu>);
      kernel<<<rows_grid(rows, row_packs), kThreads, 0, stream_of(s)>>>(
          static_cast<Pack<T>*>(dgate_TF.raw_data()), static_cast<Pack<T>*>(dup_TF.raw_data()),
          static_cast<Pack<T>*>(with_h ? h_TF.raw_data() : nullptr), static_cast<const Pack<T>*>(dh_TF.raw_data()),
          static_cast<const Pack<T>*>(gate_TF.raw_data()), static_cast<const Pack<T>*>(up_TF.raw_data()), rows,
          row_packs, p, amax);
      return;
    }
    ST_CHECK(contiguous, "swiglu_backward: strided tensors need 16-byte aligned rows, found ", gate_TF.str());
    auto* kernel = gelu ? swiglu_backward_kernel<T, kGeluTanh> : swiglu_backward_kernel<T, kSilu>;
    kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(s)>>>(
        static_cast<T*>(dgate_TF.raw_data()), static_cast<T*>(dup_TF.raw_data()),
        static_cast<T*>(with_h ? h_TF.raw_data() : nullptr), static_cast<const T*>(dh_TF.raw_data()),
        static_cast<const T*>(gate_TF.raw_data()), static_cast<const T*>(up_TF.raw_data()), n, amax);
  });
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace shardtrain::ops::cuda
