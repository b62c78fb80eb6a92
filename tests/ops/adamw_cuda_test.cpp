// AdamW, one tensor and many in one launch, on the GPU against the CPU twin, on random data in
// f32 and bf16, odd and aligned shapes. Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops/adamw.h"
#include "ops/elementwise.h"
#include "testing/cuda_ops.h"

namespace shardtrain::ops {
namespace {

using namespace testing;  // Input, random_input, matches, to_device, to_host, ...

TEST(AdamWCudaF32, AdamW) {
  ST_REQUIRE_CUDA();
  const int64_t n = 100003;
  Input p = random_input({n}, DType::kF32, 51), g = random_input({n}, DType::kF32, 52);
  Tensor m = Tensor::zeros({n}, DType::kF32), v = Tensor::zeros({n}, DType::kF32);
  Tensor dp = to_device(p.host), dm = to_device(m), dv = to_device(v), dg = to_device(g.host);
  for (int64_t step = 1; step <= 3; ++step) {
    AdamWOptions o;
    o.lr = 1e-2;
    o.beta2 = 0.95;
    o.weight_decay = 0.1;
    o.step = step;
    adamw_step(dp, dm, dv, dg, o);
    cpu::adamw_step(p.f32, m, v, g.f32, o);
  }
  EXPECT_TRUE(all_close(to_host(dp), p.f32, testing::kCudaF32VsCpu));
  EXPECT_TRUE(all_close(to_host(dv), v, testing::kCudaF32VsCpu));
  // The second moment is a sum of positive terms, a few f32 roundings (~1e-7) from the f64
  // twin in norm. Taking 1 - beta2 in f32 (1 - 0.999f) would put all of it 1.3e-5 off.
  for (int64_t step = 1; step <= 3; ++step) {
    AdamWOptions o;
    o.beta2 = 0.999;
    o.step = step;
    adamw_step(dp, dm, dv, dg, o);
    cpu::adamw_step(p.f32, m, v, g.f32, o);
  }
  constexpr testing::Tolerance kSecondMoment{1e-6, testing::kCudaF32VsCpu.rtol, 0.0};
  EXPECT_TRUE(all_close(to_host(dv), v, kSecondMoment)) << "second moment with beta2 = 0.999";
}

TEST(AdamWCudaF32, AdamWMultiTensor) {
  ST_REQUIRE_CUDA();
  // one or several chunks each; the last starts 4 bytes into its buffers (no 16-byte loads)
  const std::vector<int64_t> sizes = {1, 37, 40000, 100003, 50001};
  AdamWOptions o;
  o.lr = 1e-2;
  o.beta2 = 0.95;
  o.weight_decay = 0.1;
  std::vector<AdamWTensors> dev, host;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    Input p = random_input({n}, DType::kF32, 60 + k), g = random_input({n}, DType::kF32, 70 + k);
    Tensor m = Tensor::zeros({n}, DType::kF32), v = Tensor::zeros({n}, DType::kF32);
    // every tensor but the second also writes a bf16 compute copy
    auto placed = [&](const Tensor& host_values) {
      if (k != 4) return to_device(host_values);
      Tensor buffer = Tensor::empty({n + 1}, host_values.dtype(), Device::cuda(0));
      Tensor view = buffer.flat_range(1, n);
      copy(view, host_values);
      return view;
    };
    dev.push_back({placed(p.host), placed(m), placed(v), placed(g.host), k != 2,
                   k == 1 ? Tensor() : placed(Tensor::zeros({n}, DType::kBF16))});
    host.push_back({p.f32, m, v, g.f32, k != 2, Tensor()});
  }
  for (int64_t step = 1; step <= 3; ++step) {
    o.step = step;
    adamw_step_multi(dev, o, 0.6);
    cpu::adamw_step_multi(host, o, 0.6);
  }
  for (size_t k = 0; k < sizes.size(); ++k) {
    EXPECT_TRUE(all_close(to_host(dev[k].param), host[k].param, testing::kCudaF32VsCpu)) << "tensor " << k;
    EXPECT_TRUE(all_close(to_host(dev[k].exp_avg_sq), host[k].exp_avg_sq, testing::kCudaF32VsCpu)) << "tensor " << k;
    if (!dev[k].compute_copy.defined()) continue;
    // the copy is the updated weights rounded as ops::cast rounds them, bitwise
    Tensor cast_after = to_device(Tensor::zeros({sizes[k]}, DType::kBF16));
    cast(cast_after, dev[k].param);
    EXPECT_TRUE(all_close(to_host(dev[k].compute_copy), to_host(cast_after), testing::kExact)) << "tensor " << k;
  }
}


// The host optimizer of parallel.offload runs the kernel's f32 arithmetic: the two agree to
// f32 rounding (contracted multiply-adds on the GPU), compute copies included.
TEST(AdamWCudaF32, HostF32PassFollowsTheKernel) {
  ST_REQUIRE_CUDA();
  const std::vector<int64_t> sizes = {37, 100003};
  AdamWOptions o;
  o.lr = 1e-2;
  o.beta2 = 0.95;
  o.weight_decay = 0.1;
  std::vector<AdamWTensors> dev, host;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    Input p = random_input({n}, DType::kF32, 80 + k), g = random_input({n}, DType::kF32, 90 + k);
    Tensor m = Tensor::zeros({n}, DType::kF32), v = Tensor::zeros({n}, DType::kF32);
    dev.push_back({to_device(p.host), to_device(m), to_device(v), to_device(g.host), k != 0,
                   to_device(Tensor::zeros({n}, DType::kBF16))});
    host.push_back({testing::to_dtype(p.host, DType::kF32), testing::to_dtype(m, DType::kF32),
                    testing::to_dtype(v, DType::kF32), g.f32, k != 0, Tensor::zeros({n}, DType::kBF16)});
  }
  AdamWOptions on_host = o;
  on_host.host_f32 = true;
  for (int64_t step = 1; step <= 3; ++step) {
    o.step = on_host.step = step;
    adamw_step_multi(dev, o, 0.6);
    cpu::adamw_step_multi(host, on_host, 0.6);
  }
  constexpr testing::Tolerance kF32Rounding{1e-6, 1e-5, 1e-7};
  for (size_t k = 0; k < sizes.size(); ++k) {
    EXPECT_TRUE(all_close(to_host(dev[k].param), host[k].param, kF32Rounding)) << "tensor " << k;
    EXPECT_TRUE(all_close(to_host(dev[k].exp_avg_sq), host[k].exp_avg_sq, kF32Rounding)) << "tensor " << k;
    // the host's copy is its own updated weights rounded as a cast rounds them, bit for bit
    Tensor cast_after = Tensor::empty({sizes[k]}, DType::kBF16);
    cpu::cast(cast_after, host[k].param);
    EXPECT_TRUE(all_close(host[k].compute_copy, cast_after, testing::kExact)) << "tensor " << k;
  }
}

// The kernel's nonfinite flags equal the CPU twin's (host_f32, the kernel's arithmetic): a
// tensor of several chunks with one infinite second moment in its last chunk's tail, one with a
// NaN gradient, a clean one and one flagged before.
TEST(AdamWCudaF32, MultiTensorFlagsNonFiniteLikeTheCpu) {
  ST_REQUIRE_CUDA();
  const std::vector<int64_t> sizes = {37, 70001, 41, 5};
  AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  AdamWOptions on_host = o;
  on_host.host_f32 = true;
  std::vector<AdamWTensors> dev, host;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    Input p = random_input({n}, DType::kF32, 80 + k), g = random_input({n}, DType::kF32, 90 + k);
    Tensor m = Tensor::zeros({n}, DType::kF32), v = Tensor::zeros({n}, DType::kF32);
    if (k == 1) v.data<float>()[70000] = std::numeric_limits<float>::infinity();
    if (k == 2) g.f32.data<float>()[40] = std::numeric_limits<float>::quiet_NaN();
    dev.push_back({to_device(p.f32), to_device(m), to_device(v), to_device(g.f32), true, Tensor()});
    host.push_back({p.f32, m, v, g.f32, true, Tensor()});
  }
  Tensor flags = Tensor::zeros({4}, DType::kI32);
  flags.data<int32_t>()[3] = kNonfiniteParam;
  Tensor dflags = to_device(flags);
  adamw_step_multi(dev, o, 0.6, &dflags);
  cpu::adamw_step_multi(host, on_host, 0.6, &flags);
  const Tensor got = to_host(dflags);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(got.data<int32_t>()[k], flags.data<int32_t>()[k]) << "tensor " << k;
  EXPECT_EQ(flags.data<int32_t>()[1], kNonfiniteExpAvgSq);
  EXPECT_EQ(flags.data<int32_t>()[2], kNonfiniteParam | kNonfiniteExpAvg | kNonfiniteExpAvgSq);
}

}  // namespace
}  // namespace shardtrain::ops
