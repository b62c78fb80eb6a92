// Causal GQA attention forward and backward throughput on the GPU (cuDNN flash attention
// through ops::attention_*), on the Llama 3.2 1B and 3.1 8B head shapes. Validates first
// against the CPU twin (f64 on the same bf16 inputs), then times each shape. FLOPs:
// forward 4·B·N·T²·H / 2 (causal half), backward 2.5× the forward — the convention of the
// PyTorch figures in ENVIRONMENT.md. Then packed documents (cuDNN's ragged layout) on the 1B
// shape: documents of one length filling each row, FLOPs counted over each document's own
// causal half. The peer: bench/ops/attention_peer.py (FlexAttention's document mask).
//   attention_bench [iterations=20]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "core/cuda/device.h"
#include "core/error.h"
#include "core/random.h"
#include "ops/attention.h"
#include "ops/elementwise.h"

namespace {

using namespace shardtrain;
using Clock = std::chrono::steady_clock;

Tensor random_host(const Shape& s, uint64_t seed) {
  Tensor t = Tensor::empty(s, DType::kF64);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = normal_at(seed, 1, static_cast<uint64_t>(i));
  return t;
}

// bf16 device copy of a host f64 tensor, and the f64 values it really holds.
std::pair<Tensor, Tensor> device_bf16(const Tensor& h) {
  Tensor d = Tensor::empty(h.shape(), DType::kBF16, Device::cuda(0));
  ops::cast(d, h);
  Tensor back = Tensor::empty(h.shape(), DType::kF64);
  ops::cast(back, d);
  return {d, back};
}

double rel_err(const Tensor& dev, const Tensor& ref) {
  Tensor h = Tensor::empty(dev.shape(), DType::kF64);
  ops::cast(h, dev);
  double num = 0, den = 0;
  for (int64_t i = 0; i < h.numel(); ++i) {
    const double d = h.data<double>()[i] - ref.data<double>()[i];
    num += d * d;
    den += ref.data<double>()[i] * ref.data<double>()[i];
  }
  return std::sqrt(num / den);
}

void validate() {
  const int64_t B = 1, T = 300, N = 8, M = 2, H = 128;
  auto [q, q64] = device_bf16(random_host({B, T, N, H}, 1));
  auto [k, k64] = device_bf16(random_host({B, T, M, H}, 2));
  auto [v, v64] = device_bf16(random_host({B, T, M, H}, 3));
  auto [dout, dout64] = device_bf16(random_host({B, T, N, H}, 4));
  Tensor out_ref = Tensor::empty({B, T, N, H}, DType::kF64), lse_ref = Tensor::empty({B, N, T}, DType::kF64);
  ops::attention_forward(out_ref, lse_ref, q64, k64, v64);
  Tensor dq_ref = Tensor::empty(q64.shape(), DType::kF64), dk_ref = Tensor::empty(k64.shape(), DType::kF64),
         dv_ref = Tensor::empty(v64.shape(), DType::kF64);
  ops::attention_backward(dq_ref, dk_ref, dv_ref, dout64, q64, k64, v64, out_ref, lse_ref);
  const Device g = Device::cuda(0);
  Tensor out = Tensor::empty(q.shape(), DType::kBF16, g), lse = Tensor::empty({B, N, T}, DType::kF32, g);
  ops::attention_forward(out, lse, q, k, v);
  Tensor dq = Tensor::empty(q.shape(), DType::kBF16, g), dk = Tensor::empty(k.shape(), DType::kBF16, g),
         dv = Tensor::empty(v.shape(), DType::kBF16, g);
  ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
  const double e[] = {rel_err(out, out_ref), rel_err(dq, dq_ref), rel_err(dk, dk_ref), rel_err(dv, dv_ref)};
  std::printf("# validation against the CPU twin (relative norm error): out %.2e dq %.2e dk %.2e dv %.2e\n", e[0], e[1],
              e[2], e[3]);
  for (double x : e) ST_CHECK(x < 2e-2, "attention_bench: the GPU attention disagrees with the CPU twin");
}

// Seconds per forward and per backward (after 3 untimed pairs) of B x T tokens, N / M heads
// of H, with `o` (its documents, if any, shaped for B x T).
std::pair<double, double> time_attention(int64_t B, int64_t T, int64_t N, int64_t M, int64_t H,
                                         const ops::AttentionOptions& o, int iters) {
  const Device g = Device::cuda(0);
  Tensor q = Tensor::empty({B, T, N, H}, DType::kBF16, g), k = Tensor::empty({B, T, M, H}, DType::kBF16, g),
         v = Tensor::empty({B, T, M, H}, DType::kBF16, g), out = Tensor::empty({B, T, N, H}, DType::kBF16, g),
         lse = Tensor::empty({B, N, T}, DType::kF32, g), dq = Tensor::empty({B, T, N, H}, DType::kBF16, g),
         dk = Tensor::empty({B, T, M, H}, DType::kBF16, g), dv = Tensor::empty({B, T, M, H}, DType::kBF16, g);
  for (Tensor* t : {&q, &k, &v, &out}) ops::fill(*t, 0.01);
  for (int i = 0; i < 3; ++i) {
    ops::attention_forward(out, lse, q, k, v, o);
    ops::attention_backward(dq, dk, dv, out, q, k, v, out, lse, o);
  }
  synchronize(g);
  Clock::time_point t0 = Clock::now();
  for (int i = 0; i < iters; ++i) ops::attention_forward(out, lse, q, k, v, o);
  synchronize(g);
  const double fwd = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
  t0 = Clock::now();
  for (int i = 0; i < iters; ++i) ops::attention_backward(dq, dk, dv, out, q, k, v, out, lse, o);
  synchronize(g);
  return {fwd, std::chrono::duration<double>(Clock::now() - t0).count() / iters};
}

void run(int64_t B, int64_t T, int64_t N, int64_t M, int64_t H, int iters) {
  const auto [fwd, bwd] = time_attention(B, T, N, M, H, {}, iters);
  const double flops = 4.0 * B * N * T * T * H / 2;
  std::printf("| shardtrain (cuDNN) | B%lld T%lld N%lld M%lld H%lld | %.3f ms | %.0f | %.3f ms | %.0f |\n",
              static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(N),
              static_cast<long long>(M), static_cast<long long>(H), 1e3 * fwd, flops / fwd / 1e12, 1e3 * bwd,
              2.5 * flops / bwd / 1e12);
}

// Rows of T tokens packed with documents of `length` tokens (the last one shorter when
// length does not divide T).
void run_documents(int64_t B, int64_t T, int64_t N, int64_t M, int64_t H, int64_t length, int iters) {
  Tensor pos = Tensor::empty({B, T}, DType::kI32);
  double flops = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) pos.data<int32_t>()[b * T + t] = static_cast<int32_t>(t % length);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t0 = 0; t0 < T; t0 += length) {
      const double len = static_cast<double>(std::min(length, T - t0));
      flops += 4.0 * N * len * len * H / 2;
    }
  const ops::PackedDocuments docs = ops::pack_documents(pos, Device::cuda(0));
  ops::AttentionOptions o;
  o.documents = &docs;
  const auto [fwd, bwd] = time_attention(B, T, N, M, H, o, iters);
  std::printf("| shardtrain (cuDNN ragged) | B%lld T%lld N%lld M%lld H%lld, documents of %lld (%lld) "
              "| %.3f ms | %.0f | %.3f ms | %.0f |\n",
              static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(N),
              static_cast<long long>(M), static_cast<long long>(H), static_cast<long long>(length),
              static_cast<long long>(docs.count), 1e3 * fwd, flops / fwd / 1e12, 1e3 * bwd, 2.5 * flops / bwd / 1e12);
}

}  // namespace

int main(int argc, char** argv) try {
  const int iters = argc > 1 ? std::stoi(argv[1]) : 20;
  ST_CHECK(cuda::device_count() > 0, "attention_bench: no CUDA device");
  cuda::init_device(0);
  std::printf("# %s\n", cuda::device_name(0).c_str());
  validate();
  std::printf("| engine | shape | fwd | fwd TFLOP/s | bwd | bwd TFLOP/s |\n|---|---|---|---|---|---|\n");
  run(8, 4096, 32, 8, 64, iters);
  run(8, 4096, 32, 8, 128, iters);
  run(4, 8192, 32, 8, 128, iters);
  run(2, 16384, 32, 8, 128, iters);
  std::printf("\n| engine | shape | fwd | fwd TFLOP/s | bwd | bwd TFLOP/s |\n|---|---|---|---|---|---|\n");
  for (int64_t length : {4096, 2048, 1024, 512, 256, 100}) run_documents(8, 4096, 32, 8, 64, length, iters);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "attention_bench: %s\n", e.what());
  return 1;
}
