// CUDA elementwise, RMSNorm, RoPE, SwiGLU, embedding and AdamW kernels against their CPU
// twins on random data, f32 and bf16, odd and aligned shapes. Skips without a device.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/adamw.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"
#include "testing/compare.h"
#include "testing/cuda_util.h"

namespace shardtrain::ops {
namespace {

using testing::all_close;
using testing::fill_random;
using testing::to_device;
using testing::to_dtype;
using testing::to_host;

// A random host tensor of `dtype`, and the f32 copy of exactly the same (rounded) values.
struct Input {
  Tensor host;  // dtype
  Tensor f32;   // the values as f32, for the CPU reference
};
Input random_input(const Shape& shape, DType dtype, uint64_t seed, double mean = 0.1, double scale = 1.0) {
  Tensor h = Tensor::empty(shape, DType::kF64);
  fill_random(h, seed, mean, scale);
  Input in;
  in.host = to_dtype(h, dtype);
  in.f32 = to_dtype(in.host, DType::kF32);
  return in;
}

const testing::Tolerance& tolerance(DType t) { return t == DType::kBF16 ? testing::kCudaBf16 : testing::kCudaF32VsCpu; }

// Compares a device result with an f32 CPU reference rounded to the device result's dtype.
::testing::AssertionResult matches(const Tensor& device, const Tensor& ref_f32) {
  return all_close(to_host(device), to_dtype(ref_f32, device.dtype()), tolerance(device.dtype()));
}

class FusedCuda : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { ST_REQUIRE_CUDA(); }
};

TEST_P(FusedCuda, ElementwiseAndCast) {
  const DType dt = GetParam();
  for (int64_t n : {1, 37, 4096, 300001}) {
    Input a = random_input({n}, dt, 1 + n), b = random_input({n}, dt, 2 + n);
    Tensor da = to_device(a.host), db = to_device(b.host);
    Tensor out = Tensor::empty({n}, dt, Device::cuda(0));
    add(out, da, db);
    Tensor ref = Tensor::empty({n}, DType::kF32);
    cpu::add(ref, a.f32, b.f32);
    EXPECT_TRUE(matches(out, ref)) << "add n=" << n;
    scale(out, -0.37);
    cpu::scale(ref, -0.37);
    EXPECT_TRUE(matches(out, ref)) << "scale n=" << n;
    Tensor sq = Tensor::empty({1}, DType::kF64, Device::cuda(0));
    fill(sq, 0.5);
    sum_squares(sq, da);
    Tensor sq_ref = Tensor::zeros({1}, DType::kF64);
    sq_ref.data<double>()[0] = 0.5;
    cpu::sum_squares(sq_ref, a.f32);
    EXPECT_TRUE(all_close(to_host(sq), sq_ref, {1e-6, 1e-6, 0})) << "sum_squares n=" << n;
    for (DType to : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
      Tensor c = Tensor::empty({n}, to, Device::cuda(0));
      cast(c, da);
      Tensor c_ref = Tensor::empty({n}, to);
      cpu::cast(c_ref, a.host.dtype() == DType::kBF16 ? a.f32 : a.host);
      EXPECT_TRUE(all_close(to_host(c), c_ref, testing::kExact)) << "cast to " << dtype_name(to) << " n=" << n;
    }
  }
}

// The GPU initialises parameters from the same counters as the host: f64 values agree to an
// ulp or two (log and cos may round differently), so f32/bf16 values agree to one ulp at most
// and almost always exactly.
TEST(FusedCudaInit, FillNormalMatchesHost) {
  ST_REQUIRE_CUDA();
  const int64_t n = (int64_t{1} << 20) + 7, first = 123456789;
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
    Tensor dev = Tensor::empty({n}, dt, Device::cuda(0)), host = Tensor::empty({n}, dt);
    fill_normal(dev, 42, 0xabcdef, first, 0.02);
    cpu::fill_normal(host, 42, 0xabcdef, first, 0.02);
    const Tensor got = to_host(dev);
    int64_t differing = 0;
    double sum_sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      double a = 0, b = 0, ulp = 0;
      if (dt == DType::kF64) {
        a = got.data<double>()[i], b = host.data<double>()[i];
        ulp = std::nextafter(std::abs(b), 1.0) - std::abs(b);
      } else if (dt == DType::kF32) {
        a = got.data<float>()[i], b = host.data<float>()[i];
        ulp = std::nextafterf(static_cast<float>(std::abs(b)), 1.0f) - std::abs(b);
      } else {
        a = bf16_to_float(got.data<BFloat16>()[i]), b = bf16_to_float(host.data<BFloat16>()[i]);
        ulp = std::abs(b) * 0x1p-7 + 1e-30;  // bf16 keeps 8 significant bits
      }
      sum_sq += b * b;
      if (a != b) {
        ++differing;
        ASSERT_LE(std::abs(a - b), (dt == DType::kF64 ? 4 : 1) * ulp)
            << dtype_name(dt) << " element " << i << ": device " << a << ", host " << b;
      }
    }
    if (dt != DType::kF64) {
      EXPECT_LE(differing, n / 10000) << dtype_name(dt) << ": too many one-ulp differences";
    }
    EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(n)), 0.02, 2e-4) << dtype_name(dt) << ": not N(0, 0.02^2)";
  }
}

TEST_P(FusedCuda, RmsNorm) {
  const DType dt = GetParam();
  // odd width: element loops; 2048, 4096: 16-byte packs, a block per row in the backward;
  // 8200: rows too wide for that (more than 1024 packs), the shared-memory backward
  for (auto [T, D] : {std::pair<int64_t, int64_t>{37, 67}, {256, 2048}, {1031, 4096}, {19, 8200}}) {
    Input x = random_input({T, D}, dt, 11, 0.3, 2.0), w = random_input({D}, dt, 12, 1.0, 0.2),
          dy = random_input({T, D}, dt, 13);
    Tensor y = Tensor::empty({T, D}, dt, Device::cuda(0)), rstd = Tensor::empty({T}, DType::kF32, Device::cuda(0));
    rmsnorm_forward(y, rstd, to_device(x.host), to_device(w.host), {1e-5});
    Tensor y_ref = Tensor::empty({T, D}, DType::kF32), rstd_ref = Tensor::empty({T}, DType::kF32);
    cpu::rmsnorm_forward(y_ref, rstd_ref, x.f32, w.f32, {1e-5});
    EXPECT_TRUE(matches(y, y_ref)) << "forward T=" << T << " D=" << D;
    EXPECT_TRUE(all_close(to_host(rstd), rstd_ref, testing::kCudaF32VsCpu)) << "rstd";

    Input dw0 = random_input({D}, dt, 14);
    Tensor dx = Tensor::empty({T, D}, dt, Device::cuda(0)), dw = to_device(dw0.host);
    rmsnorm_backward(dx, dw, to_device(dy.host), to_device(x.host), to_device(w.host), rstd);
    Tensor dx_ref = Tensor::empty({T, D}, DType::kF32), dw_ref = dw0.f32;
    cpu::rmsnorm_backward(dx_ref, dw_ref, dy.f32, x.f32, w.f32, rstd_ref);
    EXPECT_TRUE(matches(dx, dx_ref)) << "dx T=" << T << " D=" << D;
    // dweight sums T products of order 1 that largely cancel: summation order alone moves a
    // column by up to ~T * 2^-24 * max|term|, so the elementwise bound scales with T here.
    testing::Tolerance column_sum = tolerance(dt);
    column_sum.atol = std::max(column_sum.atol, static_cast<double>(T) * 6e-8 * 16);
    EXPECT_TRUE(all_close(to_host(dw), to_dtype(dw_ref, dt), column_sum)) << "dweight (accumulated) T=" << T << " D=" << D;

    // with the residual's gradient added to dx, and an f32 weight gradient (mixed precision)
    Input res = random_input({T, D}, dt, 15);
    Tensor dx2 = Tensor::empty({T, D}, dt, Device::cuda(0)), dw32 = to_device(to_dtype(dw0.host, DType::kF32));
    rmsnorm_backward(dx2, dw32, to_device(dy.host), to_device(x.host), to_device(w.host), rstd, to_device(res.host));
    Tensor dx2_ref = Tensor::empty({T, D}, DType::kF32);
    cpu::add(dx2_ref, dx_ref, res.f32);
    EXPECT_TRUE(matches(dx2, dx2_ref)) << "dx + residual T=" << T << " D=" << D;
    EXPECT_TRUE(all_close(to_host(dw32), dw_ref, column_sum)) << "f32 dweight T=" << T << " D=" << D;
  }
}

TEST_P(FusedCuda, RopeAndInverse) {
  const DType dt = GetParam();
  RopeOptions o;
  o.theta = 500000;
  o.scaling.type = RopeScalingType::kLlama3;
  for (auto [B, T, heads, H] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 37, 3, 16}, {1, 1024, 8, 128}}) {
    Tensor cos64 = Tensor::empty({T + 5, H / 2}, DType::kF32), sin64 = Tensor::empty({T + 5, H / 2}, DType::kF32);
    rope_table(cos64, sin64, H, o);
    const Tensor cos_t = to_dtype(cos64, dt), sin_t = to_dtype(sin64, dt);
    Input x = random_input({B, T, heads, H}, dt, 21);
    Tensor dx = to_device(x.host);
    rope_forward(dx, to_device(cos_t), to_device(sin_t));
    Tensor ref = x.f32;
    Tensor cf = to_dtype(cos_t, DType::kF32), sf = to_dtype(sin_t, DType::kF32);
    cpu::rope_forward(ref, cf, sf);
    EXPECT_TRUE(matches(dx, ref)) << "forward T=" << T << " H=" << H;
    Tensor back = to_device(to_dtype(ref, dt));
    Tensor back_ref = to_dtype(to_dtype(ref, dt), DType::kF32);
    rope_backward(back, to_device(cos_t), to_device(sin_t));
    cpu::rope_backward(back_ref, cf, sf);
    EXPECT_TRUE(matches(back, back_ref)) << "backward T=" << T << " H=" << H;
  }
}

TEST_P(FusedCuda, SwiGlu) {
  const DType dt = GetParam();
  for (auto [T, F] : {std::pair<int64_t, int64_t>{37, 67}, {512, 8192}}) {
    Input g = random_input({T, F}, dt, 31, 0.2, 2.0), u = random_input({T, F}, dt, 32), dh = random_input({T, F}, dt, 33);
    Tensor h = Tensor::empty({T, F}, dt, Device::cuda(0));
    swiglu_forward(h, to_device(g.host), to_device(u.host));
    Tensor h_ref = Tensor::empty({T, F}, DType::kF32);
    cpu::swiglu_forward(h_ref, g.f32, u.f32);
    EXPECT_TRUE(matches(h, h_ref)) << "forward";
    Tensor dg = Tensor::empty({T, F}, dt, Device::cuda(0)), du = Tensor::empty({T, F}, dt, Device::cuda(0));
    swiglu_backward(dg, du, to_device(dh.host), to_device(g.host), to_device(u.host));
    Tensor dg_ref = Tensor::empty({T, F}, DType::kF32), du_ref = Tensor::empty({T, F}, DType::kF32);
    cpu::swiglu_backward(dg_ref, du_ref, dh.f32, g.f32, u.f32);
    EXPECT_TRUE(matches(dg, dg_ref)) << "dgate";
    EXPECT_TRUE(matches(du, du_ref)) << "dup";
  }
}

TEST_P(FusedCuda, EmbeddingDeterministicBackward) {
  const DType dt = GetParam();
  const int64_t V = 1001, D = 96, T = 4099;
  Input table = random_input({V, D}, dt, 41);
  Tensor ids = Tensor::empty({T}, DType::kI32);
  testing::fill_random_ints(ids, 42, 0, 50);  // many repeats: stresses the accumulation order
  Tensor out = Tensor::empty({T, D}, dt, Device::cuda(0));
  embedding_forward(out, to_device(ids), to_device(table.host));
  Tensor out_ref = Tensor::empty({T, D}, DType::kF32);
  cpu::embedding_forward(out_ref, ids, table.f32);
  EXPECT_TRUE(matches(out, out_ref));
  Input dout = random_input({T, D}, dt, 43);
  Tensor d1 = to_device(to_dtype(table.f32, dt)), d2 = to_device(to_dtype(table.f32, dt));
  embedding_backward(d1, to_device(dout.host), to_device(ids));
  embedding_backward(d2, to_device(dout.host), to_device(ids));
  EXPECT_TRUE(all_close(to_host(d1), to_host(d2), testing::kExact)) << "reruns must be bitwise equal";
  Tensor d_ref = table.f32;
  cpu::embedding_backward(d_ref, dout.f32, ids);
  EXPECT_TRUE(matches(d1, d_ref));
  Tensor bad = ids;
  bad.data<int32_t>()[17] = static_cast<int32_t>(V);
  try {
    embedding_forward(out, to_device(bad), to_device(table.host));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 17"), std::string::npos) << e.what();
  }
}

TEST(FusedCudaF32, AdamW) {
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
}

TEST(FusedCudaF32, AdamWMultiTensor) {
  ST_REQUIRE_CUDA();
  const std::vector<int64_t> sizes = {1, 37, 40000, 100003};  // one or several chunks each
  AdamWOptions o;
  o.lr = 1e-2;
  o.beta2 = 0.95;
  o.weight_decay = 0.1;
  std::vector<AdamWTensors> dev, host;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    Input p = random_input({n}, DType::kF32, 60 + k), g = random_input({n}, DType::kF32, 70 + k);
    Tensor m = Tensor::zeros({n}, DType::kF32), v = Tensor::zeros({n}, DType::kF32);
    dev.push_back({to_device(p.host), to_device(m), to_device(v), to_device(g.host), k != 2});
    host.push_back({p.f32, m, v, g.f32, k != 2});
  }
  for (int64_t step = 1; step <= 3; ++step) {
    o.step = step;
    adamw_step_multi(dev, o, 0.6);
    cpu::adamw_step_multi(host, o, 0.6);
  }
  for (size_t k = 0; k < sizes.size(); ++k) {
    EXPECT_TRUE(all_close(to_host(dev[k].param), host[k].param, testing::kCudaF32VsCpu)) << "tensor " << k;
    EXPECT_TRUE(all_close(to_host(dev[k].exp_avg_sq), host[k].exp_avg_sq, testing::kCudaF32VsCpu)) << "tensor " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedCuda, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

}  // namespace
}  // namespace shardtrain::ops
