// The multi-tensor AdamW over the f32 master weights of the Llama-3.2-1B shape (1.236e9
// elements, 28 bytes each: read p, g, m, v; write p, m, v) in GB/s against a device copy.
// Validated against the CPU twin first. Peer (torch fused AdamW): kernels_peer.py.
//   adamw_bench [iterations=20]
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/cuda/device.h"
#include "ops/adamw.h"
#include "ops/elementwise.h"

namespace {

using namespace shardtrain;
using namespace shardtrain::bench;

void validate() {
  const int64_t n = 100003;
  std::vector<ops::AdamWTensors> dts(1), hts(1);
  dts[0] = {dev_normal({n}, DType::kF32, 9), dev_zeros({n}), dev_zeros({n}), dev_normal({n}, DType::kF32, 10), true,
            Tensor()};
  hts[0] = {host_of(dts[0].param, DType::kF32), Tensor::zeros({n}, DType::kF32), Tensor::zeros({n}, DType::kF32),
            host_of(dts[0].grad, DType::kF32), true, Tensor()};
  ops::AdamWOptions ao;
  ao.weight_decay = 0.1;
  ops::adamw_step_multi(dts, ao, 0.5);
  ops::adamw_step_multi(hts, ao, 0.5);
  expect_close("adamw_bench", "adamw param", dts[0].param, hts[0].param, 1e-6);
  expect_close("adamw_bench", "adamw exp_avg_sq", dts[0].exp_avg_sq, hts[0].exp_avg_sq, 1e-6);
}

}  // namespace

int main(int argc, char** argv) try {
  const int iterations = argc > 1 ? std::stoi(argv[1]) : 20;
  ST_CHECK(cuda::device_count() > 0, "adamw_bench: no CUDA device");
  cuda::init_device(0);
  std::printf("# %s, f32 state, %d iterations per timing\n", cuda::device_name(0).c_str(), iterations);
  validate();
  const double copy_gbs = copy_ceiling_gbs(iterations);
  std::printf("| op | time and bandwidth |\n|---|---|\n| device copy (read + write) | %.0f GB/s: the ceiling |\n",
              copy_gbs);
  const int64_t n = 1235814400;
  std::vector<ops::AdamWTensors> ts(1);
  ts[0] = {dev_normal({n}, DType::kF32, 31, 0.02), dev_zeros({n}), dev_zeros({n}),
           dev_normal({n}, DType::kF32, 32, 1e-3), true, Tensor()};
  ops::AdamWOptions ao;
  ao.weight_decay = 0.1;
  const double ms = time_ms([&] { ops::adamw_step_multi(ts, ao, 1.0); }, iterations);
  const double gbs = 28.0 * static_cast<double>(n) / ms / 1e6;
  std::printf("| AdamW, %lld f32 elements | %.2f ms, %.0f GB/s (%.0f %% of copy) |\n", static_cast<long long>(n), ms,
              gbs, 100 * gbs / copy_gbs);
  // as the trainer calls it: flagging NaN and inf in the same pass (one vote per chunk)
  Tensor flags = Tensor::empty({1}, DType::kI32, Device::cuda(0), "nonfinite flags");
  ops::fill(flags, 0.0);
  const double ms_flags = time_ms([&] { ops::adamw_step_multi(ts, ao, 1.0, &flags); }, iterations);
  const double gbs_flags = 28.0 * static_cast<double>(n) / ms_flags / 1e6;
  std::printf("| AdamW flagging NaN and inf | %.2f ms, %.0f GB/s (%.0f %% of copy) |\n", ms_flags, gbs_flags,
              100 * gbs_flags / copy_gbs);
  // the same update also writing the bf16 compute copy (parallel.compute_shards): 30 bytes
  ts[0].compute_copy = Tensor::empty({n}, DType::kBF16, Device::cuda(0), "compute copy");
  const double ms_copy = time_ms([&] { ops::adamw_step_multi(ts, ao, 1.0); }, iterations);
  const double gbs_copy = 30.0 * static_cast<double>(n) / ms_copy / 1e6;
  std::printf("| AdamW writing a bf16 compute copy | %.2f ms, %.0f GB/s (%.0f %% of copy) |\n", ms_copy, gbs_copy,
              100 * gbs_copy / copy_gbs);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "adamw_bench: %s\n", e.what());
  return 1;
}
