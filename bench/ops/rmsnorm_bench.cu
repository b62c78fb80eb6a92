// RMSNorm forward and backward (with the residual stream's gradient added, as the model
// calls it) on 32,768 x 4,096 and x 2,048 bf16 rows, in GB/s against a device copy. Validated against
// the CPU twin first. Peer (F.rms_norm and its autograd backward): kernels_peer.py.
//   rmsnorm_bench [iterations=20]
#include <cstdio>
#include <string>

#include "bench_util.h"
#include "core/cuda/device.h"
#include "ops/rmsnorm.h"

namespace {

using namespace shardtrain;
using namespace shardtrain::bench;

void validate() {
  const int64_t T = 200, D = 1024;
  Tensor x = dev_normal({T, D}, DType::kBF16, 6), w = dev_normal({D}, DType::kBF16, 7, 0.2);
  Tensor y = Tensor::empty({T, D}, DType::kBF16, Device::cuda(0)), rstd = Tensor::empty({T}, DType::kF32, Device::cuda(0));
  ops::rmsnorm_forward(y, rstd, x, w, {1e-5});
  Tensor xh = host_of(x, DType::kF32), wh = host_of(w, DType::kF32), yh = Tensor::empty({T, D}, DType::kF32),
         rstdh = Tensor::empty({T}, DType::kF32);
  ops::rmsnorm_forward(yh, rstdh, xh, wh, {1e-5});
  expect_close("rmsnorm_bench", "rmsnorm forward", y, yh, 1e-2);
  Tensor dy = dev_normal({T, D}, DType::kBF16, 8), dx = Tensor::empty({T, D}, DType::kBF16, Device::cuda(0));
  Tensor dw = dev_zeros({D});
  ops::rmsnorm_backward(dx, dw, dy, x, w, rstd);
  Tensor dyh = host_of(dy, DType::kF32), dxh = Tensor::empty({T, D}, DType::kF32), dwh = Tensor::zeros({D}, DType::kF32);
  ops::rmsnorm_backward(dxh, dwh, dyh, xh, wh, rstdh);
  expect_close("rmsnorm_bench", "rmsnorm backward dx", dx, dxh, 1e-2);
  expect_close("rmsnorm_bench", "rmsnorm backward dweight", dw, dwh, 1e-2);
}

}  // namespace

int main(int argc, char** argv) try {
  const int iterations = argc > 1 ? std::stoi(argv[1]) : 20;
  ST_CHECK(cuda::device_count() > 0, "rmsnorm_bench: no CUDA device");
  cuda::init_device(0);
  std::printf("# %s, bf16 rows, f32 statistics, %d iterations per timing\n", cuda::device_name(0).c_str(), iterations);
  validate();
  const double copy_gbs = copy_ceiling_gbs(iterations);
  std::printf("| op | time and bandwidth |\n|---|---|\n| device copy (read + write) | %.0f GB/s: the ceiling |\n",
              copy_gbs);
  for (const int64_t D : {int64_t{4096}, int64_t{2048}}) {  // the 8B and 1B widths
    const int64_t T = 32768;
    Tensor x = dev_normal({T, D}, DType::kBF16, 41), w = dev_normal({D}, DType::kBF16, 42, 0.2);
    Tensor y = Tensor::empty({T, D}, DType::kBF16, Device::cuda(0)),
           rstd = Tensor::empty({T}, DType::kF32, Device::cuda(0));
    Tensor dy = dev_normal({T, D}, DType::kBF16, 43), dx = Tensor::empty({T, D}, DType::kBF16, Device::cuda(0));
    Tensor dres = dev_normal({T, D}, DType::kBF16, 44), dw = dev_zeros({D});
    const double f_ms = time_ms([&] { ops::rmsnorm_forward(y, rstd, x, w, {1e-5}); }, iterations);
    const double b_ms = time_ms([&] { ops::rmsnorm_backward(dx, dw, dy, x, w, rstd, dres); }, iterations);
    const double elems = static_cast<double>(T) * static_cast<double>(D);
    const double f_gbs = 4.0 * elems / f_ms / 1e6, b_gbs = 8.0 * elems / b_ms / 1e6;  // bf16: x, y | dy, x, dres, dx
    std::printf("| RMSNorm forward, %lld x %lld bf16 | %.3f ms, %.0f GB/s (%.0f %% of copy) |\n",
                static_cast<long long>(T), static_cast<long long>(D), f_ms, f_gbs, 100 * f_gbs / copy_gbs);
    std::printf("| RMSNorm backward + residual gradient, %lld x %lld | %.3f ms, %.0f GB/s (%.0f %% of copy) |\n",
                static_cast<long long>(T), static_cast<long long>(D), b_ms, b_gbs, 100 * b_gbs / copy_gbs);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "rmsnorm_bench: %s\n", e.what());
  return 1;
}
