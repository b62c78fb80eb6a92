// FP8 quantisation and products at the Llama 3.2 1B block's shapes (32,768 tokens: batch 8 of
// 4,096): quantisation in GB/s against the device's bandwidth, cuBLASLt's FP8 products in
// TFLOP/s against the FP8 dense peak (with and without fast accumulation), and each linear's
// whole FP8 forward + backward (quantisation included) against the bf16 linear on the same
// shape. Validated against the CPU twin first.
//   fp8_bench [iterations=10] [tokens=32768]
#include <cstdio>
#include <string>

#include "bench_util.h"
#include "core/cuda/device.h"
#include "ops/fp8.h"
#include "ops/linear.h"

namespace {

using namespace shardtrain;
using namespace shardtrain::bench;

void validate() {
  const int64_t T = 200, I = 384, O = 256;
  Tensor x = dev_normal({T, I}, DType::kBF16, 1), w = dev_normal({O, I}, DType::kBF16, 2, 0.05);
  Tensor xh = host_of(x, DType::kF32), wh = host_of(w, DType::kF32), none;
  for (ops::Fp8Recipe r : {ops::Fp8Recipe::kTensorwise, ops::Fp8Recipe::kRowwise, ops::Fp8Recipe::kBlockwise}) {
    const ops::LinearFp8 fp8{r, DType::kF8E4M3};
    Tensor y = Tensor::empty({T, O}, DType::kBF16, Device::cuda(0)), yh = Tensor::empty({T, O}, DType::kF32);
    ops::linear_forward(y, x, w, none, fp8);
    ops::linear_forward(yh, xh, wh, none, fp8);
    expect_close("fp8_bench", (std::string(ops::fp8_recipe_name(r)) + " forward").c_str(), y, yh, 1e-2);
  }
}

void bench_quantize(int64_t R, int64_t C, double bandwidth, int iterations) {
  Tensor x = dev_normal({R, C}, DType::kBF16, 5);
  for (ops::Fp8Scaling s : {ops::Fp8Scaling::kTensor, ops::Fp8Scaling::kRow, ops::Fp8Scaling::kBlock1x128,
                            ops::Fp8Scaling::kBlock128x128}) {
    for (int mode = 0; mode < 3; ++mode) {
      const bool rows = mode != 1, cols = mode != 0;
      ops::Fp8Operand q, qt;
      const double ms = time_ms(
          [&] { ops::fp8_quantize(rows ? &q : nullptr, cols ? &qt : nullptr, x, {s, DType::kF8E4M3}); }, iterations);
      // the floor: x read once, each operand written once
      const double bytes = static_cast<double>(x.nbytes()) + static_cast<double>(R * C) * (rows + cols);
      std::printf("| quantize %lld x %lld | %s | %s | %.3f ms | %.0f GB/s (%.0f %% of %.0f) |\n",
                  static_cast<long long>(R), static_cast<long long>(C), std::string(ops::fp8_scaling_name(s)).c_str(),
                  mode == 0 ? "rows" : mode == 1 ? "columns" : "both", ms, bytes / ms / 1e6,
                  100 * bytes / ms / 1e6 / (bandwidth / 1e9), bandwidth / 1e9);
    }
  }
}

void bench_linear(const char* what, int64_t T, int64_t I, int64_t O, double bf16_peak, double fp8_peak,
                  int iterations) {
  Tensor x = dev_normal({T, I}, DType::kBF16, 11), w = dev_normal({O, I}, DType::kBF16, 12, 0.02);
  Tensor y = Tensor::empty({T, O}, DType::kBF16, Device::cuda(0)), none;
  Tensor dy = dev_normal({T, O}, DType::kBF16, 13), dx = Tensor::empty({T, I}, DType::kBF16, Device::cuda(0));
  Tensor dw = dev_zeros({O, I});
  const double flops = 2.0 * static_cast<double>(T) * static_cast<double>(I) * static_cast<double>(O);
  const double fwd = time_ms([&] { ops::linear_forward(y, x, w, none); }, iterations);
  const double bwd = time_ms([&] { ops::linear_backward(dx, dw, none, dy, x, w); }, iterations);
  std::printf("| %s %lldx%lld->%lld | bf16 | fwd %.3f ms %.0f TFLOP/s | bwd %.3f ms %.0f TFLOP/s | %.0f %% of bf16 peak |\n",
              what, static_cast<long long>(T), static_cast<long long>(I), static_cast<long long>(O), fwd,
              flops / fwd / 1e9, bwd, 2 * flops / bwd / 1e9, 100 * 3 * flops / (fwd + bwd) / 1e9 / (bf16_peak / 1e12));
  for (ops::Fp8Recipe r : {ops::Fp8Recipe::kTensorwise, ops::Fp8Recipe::kRowwise, ops::Fp8Recipe::kBlockwise}) {
    const ops::LinearFp8 fp8{r, r == ops::Fp8Recipe::kTensorwise ? DType::kF8E5M2 : DType::kF8E4M3};
    // the products alone, on operands quantised beforehand
    ops::Fp8Operand xq, xt, wq, wt, dyq, dyt;
    const ops::Fp8QuantizeOptions act{ops::fp8_scaling(r, ops::Fp8Role::kActivation), DType::kF8E4M3},
        wgt{ops::fp8_scaling(r, ops::Fp8Role::kWeight), DType::kF8E4M3},
        grad{ops::fp8_scaling(r, ops::Fp8Role::kGradient), fp8.gradient_format};
    ops::fp8_quantize(&xq, &xt, x, act);
    ops::fp8_quantize(&wq, &wt, w, wgt);
    ops::fp8_quantize(&dyq, &dyt, dy, grad);
    for (bool fast : {false, true}) {
      if (fast && r == ops::Fp8Recipe::kBlockwise) continue;  // cuBLASLt has no fast accumulation with block scales
      const ops::Fp8ProductOptions po{.accumulate = false, .fast_accumulation = fast};
      const ops::Fp8ProductOptions acc{.accumulate = true, .fast_accumulation = fast};
      const double pf = time_ms([&] { ops::fp8_product(y, wq, xq, none, none, po); }, iterations);
      const double pdx = time_ms([&] { ops::fp8_product(dx, wt, dyq, none, none, po); }, iterations);
      const double pdw = time_ms([&] { ops::fp8_product(dw, xt, dyt, none, none, acc); }, iterations);
      std::printf("| %s | %s products%s | fwd %.3f ms %.0f TFLOP/s | dx %.3f ms %.0f | dW %.3f ms %.0f | %.0f %% of "
                  "FP8 peak |\n",
                  what, std::string(ops::fp8_recipe_name(r)).c_str(), fast ? ", fast accumulation" : "", pf,
                  flops / pf / 1e9, pdx, flops / pdx / 1e9, pdw, flops / pdw / 1e9,
                  100 * 3 * flops / (pf + pdx + pdw) / 1e9 / (fp8_peak / 1e12));
    }
    const double lf = time_ms([&] { ops::linear_forward(y, x, w, none, fp8); }, iterations);
    const double lb = time_ms([&] { ops::linear_backward(dx, dw, none, dy, x, w, {.fp8 = fp8}); }, iterations);
    std::printf("| %s | %s linear (quantisation included) | fwd %.3f ms | bwd %.3f ms | %.2fx the bf16 linear |\n",
                what, std::string(ops::fp8_recipe_name(r)).c_str(), lf, lb, (fwd + bwd) / (lf + lb));
  }
}

// Which problem sizes cuBLASLt's FP8 products take: each scale pairing, output dtype and
// (M, N, K), tried once (`fp8_bench probe`).
void probe() {
  const std::pair<ops::Fp8Scaling, ops::Fp8Scaling> pairs[] = {
      {ops::Fp8Scaling::kTensor, ops::Fp8Scaling::kTensor}, {ops::Fp8Scaling::kRow, ops::Fp8Scaling::kRow},
      {ops::Fp8Scaling::kBlock128x128, ops::Fp8Scaling::kBlock1x128},
      {ops::Fp8Scaling::kBlock1x128, ops::Fp8Scaling::kBlock1x128}};
  for (auto [sa, sb] : pairs)
    for (DType out_dt : {DType::kBF16, DType::kF32})
      for (int64_t M : {80, 96, 128, 144})
        for (int64_t N : {1, 8, 16, 37, 48, 128})
          for (int64_t K : {144, 208, 256}) {
            ops::Fp8Operand a, b;
            ops::fp8_quantize(&a, nullptr, dev_normal({M, K}, DType::kBF16, 1), {sa, DType::kF8E4M3});
            ops::fp8_quantize(&b, nullptr, dev_normal({N, K}, DType::kBF16, 2), {sb, DType::kF8E4M3});
            Tensor out = Tensor::empty({N, M}, out_dt, Device::cuda(0)), none;
            std::string status = "ok";
            try {
              ops::fp8_product(out, a, b, none, none, {});
              synchronize(Device::cuda(0));
            } catch (const std::exception& e) {
              status = std::string(e.what()).find("NOT_SUPPORTED") != std::string::npos ? "not supported" : e.what();
            }
            if (status != "ok")
              std::printf("probe %s x %s -> %s M%lld N%lld K%lld (padded %lld): %s\n",
                          std::string(ops::fp8_scaling_name(sa)).c_str(), std::string(ops::fp8_scaling_name(sb)).c_str(),
                          std::string(dtype_name(out_dt)).c_str(), static_cast<long long>(M), static_cast<long long>(N),
                          static_cast<long long>(K), static_cast<long long>(a.padded_cols()), status.c_str());
          }
  std::printf("probe done\n");
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc > 1 && std::string(argv[1]) == "probe") {
    cuda::init_device(0);
    probe();
    return 0;
  }
  const int iterations = argc > 1 ? std::stoi(argv[1]) : 10;
  const int64_t T = argc > 2 ? std::stoll(argv[2]) : 32768;
  ST_CHECK(cuda::device_count() > 0, "fp8_bench: no CUDA device");
  cuda::init_device(0);
  const double bf16_peak = cuda::dense_bf16_peak_flops(0), fp8_peak = cuda::dense_fp8_peak_flops(0);
  const double bandwidth = cuda::memory_bandwidth(0);
  std::printf("# %s, %d iterations per timing, L2 flushed before each; %lld tokens\n", cuda::device_name(0).c_str(),
              iterations, static_cast<long long>(T));
  validate();
  bench_quantize(T, 2048, bandwidth, iterations);
  bench_quantize(T, 8192, bandwidth, iterations);
  bench_linear("qkv", T, 2048, 3072, bf16_peak, fp8_peak, iterations);
  bench_linear("o", T, 2048, 2048, bf16_peak, fp8_peak, iterations);
  bench_linear("gate|up", T, 2048, 16384, bf16_peak, fp8_peak, iterations);
  bench_linear("down", T, 8192, 2048, bf16_peak, fp8_peak, iterations);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fp8_bench: %s\n", e.what());
  return 1;
}
