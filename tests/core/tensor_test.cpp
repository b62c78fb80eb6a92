// Tensor views, shapes, dtype conversions and the counter-based generator.
#include <cmath>

#include <gtest/gtest.h>

#include "core/random.h"
#include "core/tensor.h"

namespace shardtrain {
namespace {

TEST(Tensor, ViewSliceSelectShareStorage) {
  Tensor t = Tensor::zeros({4, 6}, DType::kF32);
  for (int64_t i = 0; i < 24; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor row = t.select(2);
  EXPECT_EQ(row.shape(), Shape({6}));
  EXPECT_EQ(row.data<float>()[0], 12.0f);
  Tensor cols = t.slice(1, 2, 5);
  EXPECT_FALSE(cols.is_contiguous());
  EXPECT_EQ(cols.size(1), 3);
  Tensor v = t.view({2, -1});
  EXPECT_EQ(v.shape(), Shape({2, 12}));
  Tensor r = t.flat_range(5, 7);
  EXPECT_EQ(r.data<float>()[0], 5.0f);
  r.data<float>()[0] = -1.0f;
  EXPECT_EQ(t.data<float>()[5], -1.0f);
}

TEST(Tensor, BadViewsNameTheShapes) {
  Tensor t = Tensor::zeros({4, 6}, DType::kF32);
  try {
    (void)t.view({5, 5});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[5, 5]"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)t.slice(0, 2, 5), Error);
  EXPECT_THROW((void)t.select(4), Error);
  EXPECT_THROW((void)t.data<double>(), Error);
}

TEST(Tensor, AllocatorTracksPeak) {
  Allocator& a = allocator_for(Device::cpu());
  a.reset_peak();
  const int64_t before = a.stats().allocated_bytes;
  {
    Tensor t = Tensor::empty({1024, 1024}, DType::kF32);
    EXPECT_EQ(a.stats().allocated_bytes, before + 4 * 1024 * 1024);
  }
  EXPECT_EQ(a.stats().allocated_bytes, before);
  EXPECT_GE(a.stats().peak_allocated_bytes, before + 4 * 1024 * 1024);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down)
  EXPECT_EQ(float_to_bf16(1.00390625f).bits, 0x3f80);
  EXPECT_EQ(float_to_bf16(1.01171875f).bits, 0x3f82);  // 1 + 3*2^-8: tie, to even (up)
  EXPECT_EQ(bf16_to_float(float_to_bf16(-3.5f)), -3.5f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(DType, F16RoundTripsEveryValue) {
  // every finite f16 value converts to f32 and back unchanged
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const Float16 h{static_cast<uint16_t>(b)};
    const float f = f16_to_float(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_f16(f).bits, h.bits) << "bits " << b;
  }
  EXPECT_EQ(float_to_f16(65520.0f).bits, 0x7c00);  // rounds up to infinity
  EXPECT_EQ(float_to_f16(1e-8f).bits, 0x0000);     // below half the smallest subnormal
  EXPECT_EQ(f16_to_float(float_to_f16(0.1f)), 0.0999755859375f);
}

TEST(Random, CounterBasedIsOrderFreeAndNormal) {
  const uint64_t key = name_key("model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(normal_at(7, key, 12345), normal_at(7, key, 12345));
  EXPECT_NE(normal_at(7, key, 12345), normal_at(8, key, 12345));
  double sum = 0, sum2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = normal_at(1, key, static_cast<uint64_t>(i));
    sum += x;
    sum2 += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum2 / n, 1.0, 0.02);
  CounterRng rng(3);
  for (int i = 0; i < 1000; ++i) EXPECT_LT(rng.next_below(37), 37u);
}

}  // namespace
}  // namespace shardtrain
