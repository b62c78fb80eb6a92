// The cuBLASLt linear layer in bf16 at the Llama 3.2 1B and 3.1 8B projection shapes:
// forward (y = x W^T) and backward (dx, and dW accumulated in f32) in TFLOP/s against the
// device's dense bf16 peak. Validated against the CPU twin first. Peer: kernels_peer.py.
//   linear_bench [iterations=20]
#include <cstdio>
#include <string>

#include "bench_util.h"
#include "core/cuda/device.h"
#include "ops/linear.h"

namespace {

using namespace shardtrain;
using namespace shardtrain::bench;

void validate() {
  const int64_t T = 200, I = 320, O = 264;
  Tensor x = dev_normal({T, I}, DType::kBF16, 1), w = dev_normal({O, I}, DType::kBF16, 2, 0.05);
  Tensor y = Tensor::empty({T, O}, DType::kBF16, Device::cuda(0)), none;
  ops::linear_forward(y, x, w, none);
  Tensor xh = host_of(x, DType::kF32), wh = host_of(w, DType::kF32), yh = Tensor::empty({T, O}, DType::kF32);
  ops::linear_forward(yh, xh, wh, none);
  expect_close("linear_bench", "linear forward", y, yh, 1e-2);
  Tensor dy = dev_normal({T, O}, DType::kBF16, 3), dx = Tensor::empty({T, I}, DType::kBF16, Device::cuda(0));
  Tensor dw = dev_zeros({O, I});
  ops::linear_backward(dx, dw, none, dy, x, w);
  Tensor dyh = host_of(dy, DType::kF32), dxh = Tensor::empty({T, I}, DType::kF32), dwh = Tensor::zeros({O, I}, DType::kF32);
  ops::linear_backward(dxh, dwh, none, dyh, xh, wh);
  expect_close("linear_bench", "linear backward dx", dx, dxh, 1e-2);
  expect_close("linear_bench", "linear backward dW (f32)", dw, dwh, 1e-2);
}

void bench_gemm(const char* what, int64_t T, int64_t I, int64_t O, double peak, int iterations) {
  Tensor x = dev_normal({T, I}, DType::kBF16, 11), w = dev_normal({O, I}, DType::kBF16, 12, 0.02);
  Tensor y = Tensor::empty({T, O}, DType::kBF16, Device::cuda(0)), none;
  Tensor dy = dev_normal({T, O}, DType::kBF16, 13), dx = Tensor::empty({T, I}, DType::kBF16, Device::cuda(0));
  Tensor dw = dev_zeros({O, I});
  const double flops = 2.0 * static_cast<double>(T) * static_cast<double>(I) * static_cast<double>(O);
  const double fwd = time_ms([&] { ops::linear_forward(y, x, w, none); }, iterations);
  const double bwd = time_ms([&] { ops::linear_backward(dx, dw, none, dy, x, w); }, iterations);
  const double f_tf = flops / fwd / 1e9, b_tf = 2 * flops / bwd / 1e9;
  std::printf("| %s %lld x %lld -> %lld | %.3f ms, %.0f TFLOP/s (%.0f %% of peak) | %.3f ms, %.0f TFLOP/s (%.0f %%) |\n",
              what, static_cast<long long>(T), static_cast<long long>(I), static_cast<long long>(O), fwd, f_tf,
              100 * f_tf / (peak / 1e12), bwd, b_tf, 100 * b_tf / (peak / 1e12));
}

}  // namespace

int main(int argc, char** argv) try {
  const int iterations = argc > 1 ? std::stoi(argv[1]) : 20;
  ST_CHECK(cuda::device_count() > 0, "linear_bench: no CUDA device");
  cuda::init_device(0);
  const double peak = cuda::dense_bf16_peak_flops(0);
  std::printf("# %s, bf16 in, f32 accumulation, %d iterations per timing, L2 flushed before each\n",
              cuda::device_name(0).c_str(), iterations);
  validate();
  std::printf("| GEMM | forward | backward (dx + f32 dW) |\n|---|---|---|\n");
  bench_gemm("square", 8192, 8192, 8192, peak, iterations);
  bench_gemm("1B gate/up, bs 4", 16384, 2048, 8192, peak, iterations);
  bench_gemm("1B down, bs 4", 16384, 8192, 2048, peak, iterations);
  bench_gemm("8B gate/up, bs 2", 8192, 4096, 14336, peak, iterations);
  bench_gemm("8B q/o, bs 2", 8192, 4096, 4096, peak, iterations);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "linear_bench: %s\n", e.what());
  return 1;
}
