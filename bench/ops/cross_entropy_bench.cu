// The fused output projection + cross-entropy (forward and backward in one call, logits in
// chunks) at 32,768 tokens x the Llama 3 vocabulary: time, TFLOP/s of its three GEMMs, and
// the device memory it adds beyond inputs and gradients. Validated against the CPU twin
// first. Peer (the unfused f32-logits loss): kernels_peer.py.
//   cross_entropy_bench [iterations=10]
#include <cmath>
#include <cstdio>
#include <string>

#include "bench_util.h"
#include "core/allocator.h"
#include "core/cuda/device.h"
#include "ops/cross_entropy.h"
#include "train/plan.h"

namespace {

using namespace shardtrain;
using namespace shardtrain::bench;

Tensor targets_on_device(int64_t T, int64_t V, int64_t stride, Tensor* host) {
  *host = Tensor::empty({T}, DType::kI32);
  for (int64_t t = 0; t < T; ++t) host->data<int32_t>()[t] = static_cast<int32_t>((t * stride) % V);
  Tensor d = Tensor::empty({T}, DType::kI32, Device::cuda(0));
  copy(d, *host);
  return d;
}

void validate() {
  const int64_t T = 200, D = 320, V = 1000;
  Tensor h = dev_normal({T, D}, DType::kBF16, 4), w = dev_normal({V, D}, DType::kBF16, 5, 0.05), th;
  Tensor targets = targets_on_device(T, V, 7919, &th);
  Tensor loss = dev_zeros({1}), dh = Tensor::empty({T, D}, DType::kBF16, Device::cuda(0)), dw = dev_zeros({V, D});
  ops::CrossEntropyOptions co;
  co.grad_scale = 1.0 / T;
  co.chunk_tokens = 64;
  ops::linear_cross_entropy(loss, dh, dw, h, w, targets, co);
  Tensor hh = host_of(h, DType::kF32), wh = host_of(w, DType::kF32);
  Tensor lossh = Tensor::zeros({1}, DType::kF32), dhh = Tensor::empty({T, D}, DType::kF32),
         dwh = Tensor::zeros({V, D}, DType::kF32);
  ops::linear_cross_entropy(lossh, dhh, dwh, hh, wh, th, co);
  expect_close("cross_entropy_bench", "cross-entropy loss", loss, lossh, 1e-3);
  expect_close("cross_entropy_bench", "cross-entropy dh", dh, dhh, 2e-2);
  expect_close("cross_entropy_bench", "cross-entropy dW (f32)", dw, dwh, 2e-2);
}

}  // namespace

int main(int argc, char** argv) try {
  const int iterations = argc > 1 ? std::stoi(argv[1]) : 10;
  ST_CHECK(cuda::device_count() > 0, "cross_entropy_bench: no CUDA device");
  cuda::init_device(0);
  const double peak = cuda::dense_bf16_peak_flops(0);
  std::printf("# %s, bf16 h, W and logits, f32 loss math, %d iterations per timing\n", cuda::device_name(0).c_str(),
              iterations);
  validate();
  const int64_t T = 32768, D = 2048, V = 128256;
  Tensor h = dev_normal({T, D}, DType::kBF16, 21), w = dev_normal({V, D}, DType::kBF16, 22, 0.02), th;
  Tensor targets = targets_on_device(T, V, 104729, &th);
  Tensor loss = dev_zeros({1}), dh = Tensor::empty({T, D}, DType::kBF16, Device::cuda(0)), dw = dev_zeros({V, D});
  ops::CrossEntropyOptions co;
  co.grad_scale = 1.0 / T;
  co.chunk_tokens = train::auto_loss_chunk_tokens(true, V);  // what the trainer picks (8192: 2 GiB of bf16 logits)
  co.check_targets = false;  // as the model calls it: targets checked on the host
  Allocator& a = allocator_for(Device::cuda(0));
  synchronize(Device::cuda(0));
  const int64_t before = a.stats().allocated_bytes;
  a.reset_peak();
  ops::linear_cross_entropy(loss, dh, dw, h, w, targets, co);
  synchronize(Device::cuda(0));
  const double extra_gib = static_cast<double>(a.stats().peak_allocated_bytes - before) / (1 << 30);
  const double mean = host_of(loss).data<double>()[0] / T;
  ST_CHECK(std::abs(mean - std::log(static_cast<double>(V))) < 0.5, "cross_entropy_bench: mean loss ", mean,
           " is not near ln V");
  const double ms = time_ms([&] { ops::linear_cross_entropy(loss, dh, dw, h, w, targets, co); }, iterations);
  const double flops = 6.0 * static_cast<double>(T) * static_cast<double>(D) * static_cast<double>(V);
  std::printf("| linear + cross-entropy, fwd + bwd, %lld tokens x %lld vocab, D %lld | %.2f ms, %.0f TFLOP/s "
              "(%.0f %% of peak) | %.2f GiB beyond inputs and gradients |\n",
              static_cast<long long>(T), static_cast<long long>(V), static_cast<long long>(D), ms, flops / ms / 1e9,
              100 * flops / ms / 1e9 / (peak / 1e12), extra_gib);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "cross_entropy_bench: %s\n", e.what());
  return 1;
}
