// Kernel throughput on the GPU against the hardware limits: the cuBLASLt linear layer
// (forward, and backward with f32 weight-gradient accumulation) at the model's shapes, the
// fused linear + cross-entropy (time and the memory it adds) at 32k tokens x 128256 vocab,
// the multi-tensor AdamW and RMSNorm forward/backward in GB/s against a device-to-device
// copy. Every op is first checked against its CPU twin on a small shape. The peer, with
// PyTorch's ops on the same shapes: bench/ops/kernels_peer.py.
//   kernels_bench [iterations=20]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/error.h"
#include "ops/adamw.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"

namespace {

using namespace shardtrain;

int g_iters = 20;

Tensor dev_normal(const Shape& s, DType t, uint64_t key, double std = 1.0) {
  Tensor x = Tensor::empty(s, t, Device::cuda(0), "bench input");
  ops::fill_normal(x, 99, key, 0, std);
  return x;
}

Tensor dev_zeros(const Shape& s) {
  Tensor x = Tensor::empty(s, DType::kF32, Device::cuda(0), "bench zeros");
  ops::fill(x, 0.0);
  return x;
}

Tensor host_of(const Tensor& d, DType t = DType::kF64) {
  Tensor h = Tensor::empty(d.shape(), t);
  ops::cast(h, d);
  return h;
}

double rel_err(const Tensor& dev, const Tensor& ref) {
  const Tensor h = host_of(dev), r = host_of(ref);
  double num = 0, den = 0;
  for (int64_t i = 0; i < h.numel(); ++i) {
    const double d = h.data<double>()[i] - r.data<double>()[i];
    num += d * d;
    den += r.data<double>()[i] * r.data<double>()[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

void expect_close(const char* what, const Tensor& dev, const Tensor& ref, double tol) {
  const double e = rel_err(dev, ref);
  ST_CHECK(e < tol, "kernels_bench: ", what, " differs from the CPU twin: relative error ", e, " (tolerance ", tol,
           ")");
  std::printf("# check %-28s relative error %.2e\n", what, e);
}

// Milliseconds per call of fn, after two untimed calls.
double time_ms(const std::function<void()>& fn) {
  fn();
  fn();
  cuda::Event start, stop;
  start.record(Stream{});
  for (int i = 0; i < g_iters; ++i) fn();
  stop.record(Stream{});
  stop.synchronize();
  return stop.elapsed_ms_since(start) / g_iters;
}

// --- checks against the CPU twins (f32 on the host, same bf16-rounded inputs) -----------

void validate() {
  const int64_t T = 200, I = 320, O = 264, V = 1000;
  Tensor x = dev_normal({T, I}, DType::kBF16, 1), w = dev_normal({O, I}, DType::kBF16, 2, 0.05);
  Tensor y = Tensor::empty({T, O}, DType::kBF16, Device::cuda(0)), none;
  ops::linear_forward(y, x, w, none);
  Tensor xh = host_of(x, DType::kF32), wh = host_of(w, DType::kF32), yh = Tensor::empty({T, O}, DType::kF32);
  ops::linear_forward(yh, xh, wh, none);
  expect_close("linear forward", y, yh, 1e-2);

  Tensor dy = dev_normal({T, O}, DType::kBF16, 3), dx = Tensor::empty({T, I}, DType::kBF16, Device::cuda(0));
  Tensor dw = dev_zeros({O, I});
  ops::linear_backward(dx, dw, none, dy, x, w);
  Tensor dyh = host_of(dy, DType::kF32), dxh = Tensor::empty({T, I}, DType::kF32), dwh = Tensor::zeros({O, I}, DType::kF32);
  ops::linear_backward(dxh, dwh, none, dyh, xh, wh);
  expect_close("linear backward dx", dx, dxh, 1e-2);
  expect_close("linear backward dW (f32)", dw, dwh, 1e-2);

  Tensor h = dev_normal({T, I}, DType::kBF16, 4), hw = dev_normal({V, I}, DType::kBF16, 5, 0.05);
  Tensor targets = Tensor::empty({T}, DType::kI32);
  for (int64_t t = 0; t < T; ++t) targets.data<int32_t>()[t] = static_cast<int32_t>((t * 7919) % V);
  Tensor dtargets = Tensor::empty({T}, DType::kI32, Device::cuda(0));
  copy(dtargets, targets);
  Tensor loss = dev_zeros({1}), dh = Tensor::empty({T, I}, DType::kBF16, Device::cuda(0));
  Tensor dhw = dev_zeros({V, I});
  ops::CrossEntropyOptions co;
  co.grad_scale = 1.0 / T;
  co.chunk_tokens = 64;
  ops::linear_cross_entropy(loss, dh, dhw, h, hw, dtargets, co);
  Tensor hh = host_of(h, DType::kF32), hwh = host_of(hw, DType::kF32);
  Tensor lossh = Tensor::zeros({1}, DType::kF32), dhh = Tensor::empty({T, I}, DType::kF32),
         dhwh = Tensor::zeros({V, I}, DType::kF32);
  ops::linear_cross_entropy(lossh, dhh, dhwh, hh, hwh, targets, co);
  expect_close("cross-entropy loss", loss, lossh, 1e-3);
  expect_close("cross-entropy dh", dh, dhh, 2e-2);
  expect_close("cross-entropy dW (f32)", dhw, dhwh, 2e-2);

  const int64_t D = 1024;
  Tensor xn = dev_normal({T, D}, DType::kBF16, 6), wn = dev_normal({D}, DType::kBF16, 7, 0.2);
  Tensor yn = Tensor::empty({T, D}, DType::kBF16, Device::cuda(0)), rstd = Tensor::empty({T}, DType::kF32, Device::cuda(0));
  ops::rmsnorm_forward(yn, rstd, xn, wn, {1e-5});
  Tensor xnh = host_of(xn, DType::kF32), wnh = host_of(wn, DType::kF32), ynh = Tensor::empty({T, D}, DType::kF32),
         rstdh = Tensor::empty({T}, DType::kF32);
  ops::rmsnorm_forward(ynh, rstdh, xnh, wnh, {1e-5});
  expect_close("rmsnorm forward", yn, ynh, 1e-2);
  Tensor dyn = dev_normal({T, D}, DType::kBF16, 8), dxn = Tensor::empty({T, D}, DType::kBF16, Device::cuda(0));
  Tensor dwn = dev_zeros({D});
  ops::rmsnorm_backward(dxn, dwn, dyn, xn, wn, rstd);
  Tensor dynh = host_of(dyn, DType::kF32), dxnh = Tensor::empty({T, D}, DType::kF32), dwnh = Tensor::zeros({D}, DType::kF32);
  ops::rmsnorm_backward(dxnh, dwnh, dynh, xnh, wnh, rstdh);
  expect_close("rmsnorm backward dx", dxn, dxnh, 1e-2);
  expect_close("rmsnorm backward dweight", dwn, dwnh, 1e-2);

  const int64_t n = 100003;
  std::vector<ops::AdamWTensors> dts(1), hts(1);
  dts[0] = {dev_normal({n}, DType::kF32, 9), dev_zeros({n}),
            dev_zeros({n}), dev_normal({n}, DType::kF32, 10), true};
  hts[0] = {host_of(dts[0].param, DType::kF32), Tensor::zeros({n}, DType::kF32), Tensor::zeros({n}, DType::kF32),
            host_of(dts[0].grad, DType::kF32), true};
  ops::AdamWOptions ao;
  ao.weight_decay = 0.1;
  ops::adamw_step_multi(dts, ao, 0.5);
  ops::adamw_step_multi(hts, ao, 0.5);
  expect_close("adamw param", dts[0].param, hts[0].param, 1e-6);
}

// --- timings -------------------------------------------------------------------------

void bench_gemm(int64_t T, int64_t I, int64_t O, double peak) {
  Tensor x = dev_normal({T, I}, DType::kBF16, 11), w = dev_normal({O, I}, DType::kBF16, 12, 0.02);
  Tensor y = Tensor::empty({T, O}, DType::kBF16, Device::cuda(0)), none;
  Tensor dy = dev_normal({T, O}, DType::kBF16, 13), dx = Tensor::empty({T, I}, DType::kBF16, Device::cuda(0));
  Tensor dw = dev_zeros({O, I});
  const double flops = 2.0 * T * I * O;
  const double fwd = time_ms([&] { ops::linear_forward(y, x, w, none); });
  const double bwd = time_ms([&] { ops::linear_backward(dx, dw, none, dy, x, w); });
  std::printf("| linear %lld x %lld -> %lld | %.3f ms, %.0f TFLOP/s (%.0f %% of peak) | %.3f ms, %.0f TFLOP/s |\n",
              static_cast<long long>(T), static_cast<long long>(I), static_cast<long long>(O), fwd,
              flops / fwd / 1e9, 100 * flops / fwd / 1e9 / (peak / 1e12), bwd, 2 * flops / bwd / 1e9);
}

void bench_cross_entropy(int64_t T, int64_t D, int64_t V) {
  Tensor h = dev_normal({T, D}, DType::kBF16, 21), w = dev_normal({V, D}, DType::kBF16, 22, 0.02);
  Tensor targets = Tensor::empty({T}, DType::kI32);
  for (int64_t t = 0; t < T; ++t) targets.data<int32_t>()[t] = static_cast<int32_t>((t * 104729) % V);
  Tensor dt = Tensor::empty({T}, DType::kI32, Device::cuda(0));
  copy(dt, targets);
  Tensor loss = dev_zeros({1}), dh = Tensor::empty({T, D}, DType::kBF16, Device::cuda(0));
  Tensor dw = dev_zeros({V, D});
  ops::CrossEntropyOptions co;
  co.grad_scale = 1.0 / T;
  co.chunk_tokens = 4096;  // what the trainer picks for this vocabulary (2 GiB of f32 logits at most)
  Allocator& a = allocator_for(Device::cuda(0));
  synchronize(Device::cuda(0));
  const int64_t before = a.stats().allocated_bytes;
  a.reset_peak();
  ops::linear_cross_entropy(loss, dh, dw, h, w, dt, co);
  synchronize(Device::cuda(0));
  const double extra_gib = static_cast<double>(a.stats().peak_allocated_bytes - before) / (1 << 30);
  Tensor lh = host_of(loss);
  const double mean = lh.data<double>()[0] / T;
  ST_CHECK(std::abs(mean - std::log(static_cast<double>(V))) < 0.5, "kernels_bench: mean loss ", mean,
           " is not near ln V");
  const double ms = time_ms([&] { ops::linear_cross_entropy(loss, dh, dw, h, w, dt, co); });
  const double flops = 6.0 * T * D * V;  // logits, dh, dW
  std::printf("| linear + cross-entropy, fwd + bwd, %lld tokens x %lld vocab, D %lld | %.2f ms, %.0f TFLOP/s | "
              "%.2f GiB beyond inputs and gradients |\n",
              static_cast<long long>(T), static_cast<long long>(V), static_cast<long long>(D), ms,
              flops / ms / 1e9, extra_gib);
}

void bench_bandwidth(int64_t adam_n, int64_t T, int64_t D) {
  // the copy ceiling: read + write of a 2 GiB buffer
  const int64_t cn = int64_t{1} << 29;
  Tensor src = dev_zeros({cn}), dst = Tensor::empty({cn}, DType::kF32, Device::cuda(0));
  const double copy_ms = time_ms([&] { copy(dst, src); });
  const double copy_gbs = 2.0 * 4 * cn / copy_ms / 1e6;
  std::printf("| device copy (read + write) | %.0f GB/s | the ceiling below |\n", copy_gbs);

  std::vector<ops::AdamWTensors> ts(1);
  ts[0] = {dev_normal({adam_n}, DType::kF32, 31, 0.02), dev_zeros({adam_n}),
           dev_zeros({adam_n}), dev_normal({adam_n}, DType::kF32, 32, 1e-3), true};
  ops::AdamWOptions ao;
  ao.weight_decay = 0.1;
  const double adam_ms = time_ms([&] { ops::adamw_step_multi(ts, ao, 1.0); });
  const double adam_bytes = 28.0 * adam_n;  // read p, g, m, v; write p, m, v (f32)
  std::printf("| AdamW, %lld f32 elements | %.2f ms, %.0f GB/s (%.0f %% of copy) | |\n",
              static_cast<long long>(adam_n), adam_ms, adam_bytes / adam_ms / 1e6,
              100 * adam_bytes / adam_ms / 1e6 / copy_gbs);

  Tensor x = dev_normal({T, D}, DType::kBF16, 41), w = dev_normal({D}, DType::kBF16, 42, 0.2);
  Tensor y = Tensor::empty({T, D}, DType::kBF16, Device::cuda(0)), rstd = Tensor::empty({T}, DType::kF32, Device::cuda(0));
  Tensor dy = dev_normal({T, D}, DType::kBF16, 43), dx = Tensor::empty({T, D}, DType::kBF16, Device::cuda(0));
  Tensor dres = dev_normal({T, D}, DType::kBF16, 44), dw = dev_zeros({D});
  const double f_ms = time_ms([&] { ops::rmsnorm_forward(y, rstd, x, w, {1e-5}); });
  const double b_ms = time_ms([&] { ops::rmsnorm_backward(dx, dw, dy, x, w, rstd, dres); });
  const double f_bytes = 4.0 * T * D, b_bytes = 8.0 * T * D;  // bf16: x, y | dy, x, dresidual, dx
  std::printf("| RMSNorm forward, %lld x %lld bf16 | %.3f ms, %.0f GB/s (%.0f %% of copy) | |\n",
              static_cast<long long>(T), static_cast<long long>(D), f_ms, f_bytes / f_ms / 1e6,
              100 * f_bytes / f_ms / 1e6 / copy_gbs);
  std::printf("| RMSNorm backward (+ residual gradient) | %.3f ms, %.0f GB/s (%.0f %% of copy) | |\n", b_ms,
              b_bytes / b_ms / 1e6, 100 * b_bytes / b_ms / 1e6 / copy_gbs);
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc > 1) g_iters = std::stoi(argv[1]);
  ST_CHECK(cuda::device_count() > 0, "kernels_bench: no CUDA device");
  cuda::init_device(0);
  const double peak = cuda::dense_bf16_peak_flops(0);
  std::printf("# %s, %d iterations per timing\n", cuda::device_name(0).c_str(), g_iters);
  validate();
  std::printf("| op | forward | backward / note |\n|---|---|---|\n");
  bench_gemm(8192, 8192, 8192, peak);
  bench_gemm(16384, 2048, 8192, peak);   // Llama 3.2 1B gate/up, bs 4 x 4096
  bench_gemm(16384, 8192, 2048, peak);   // 1B down
  bench_gemm(8192, 4096, 14336, peak);   // Llama 3.1 8B gate/up, bs 2 x 4096
  bench_gemm(8192, 4096, 4096, peak);    // 8B q/o
  bench_cross_entropy(32768, 2048, 128256);
  bench_bandwidth(1235814400, 32768, 4096);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "kernels_bench: %s\n", e.what());
  return 1;
}
