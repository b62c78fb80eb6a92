// Tensor views, shapes, dtype conversions and the counter-based generator.
#include <cmath>
#include <cstring>

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

TEST(Tensor, RebasedViewsKeepTheirPlaceInTheNewStorage) {
  // a stacked tensor and two strided head views of it, moved to another block in one copy
  Tensor t = Tensor::zeros({2, 3, 6, 4}, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i);
  const Tensor q = t.slice(2, 0, 3), v = t.slice(2, 5, 6).select(1);
  const Tensor b = t.base();
  EXPECT_EQ(b.dtype(), DType::kU8);
  EXPECT_EQ(b.numel(), static_cast<int64_t>(t.nbytes()));
  EXPECT_EQ(q.base().raw_data(), b.raw_data());
  Tensor moved = Tensor::empty({b.numel() + 64}, DType::kU8);
  Tensor dst = moved.flat_range(64, b.numel());  // an offset block: offsets add up
  copy(dst, b);
  std::memset(t.raw_data(), 0, t.nbytes());  // the old storage no longer holds the values
  const Tensor q2 = q.rebased(dst), v2 = v.rebased(dst);
  EXPECT_EQ(q2.shape(), q.shape());
  EXPECT_FALSE(q2.is_contiguous());
  Tensor qf = Tensor::empty(q2.shape(), DType::kF32), vf = Tensor::empty(v2.shape(), DType::kF32);
  copy(qf, q2);
  copy(vf, v2);
  for (int64_t bt = 0; bt < 6; ++bt)
    for (int64_t j = 0; j < 3 * 4; ++j) ASSERT_EQ(qf.data<float>()[bt * 12 + j], static_cast<float>(bt * 24 + j));
  ASSERT_EQ(vf.shape(), Shape({3, 1, 4}));  // batch 1's value head
  for (int64_t tt = 0; tt < 3; ++tt)
    for (int64_t h = 0; h < 4; ++h)
      ASSERT_EQ(vf.data<float>()[tt * 4 + h], static_cast<float>((3 + tt) * 24 + 20 + h));
  EXPECT_THROW((void)q.rebased(moved.flat_range(0, 100)), Error);  // smaller than the storage
  EXPECT_THROW((void)q.rebased(t), Error);                          // not a u8 block
}

TEST(Tensor, RowLayoutsAndStridedCopies) {
  // [B=2, T=3, 6 heads, H=4] as a stacked q|k|v tensor: 3 query heads, 2 key, 1 value head
  Tensor t = Tensor::zeros({2, 3, 6, 4}, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i);
  RowLayout r;
  ASSERT_TRUE(row_layout(t, r));
  EXPECT_EQ(r.rows, 1);
  EXPECT_EQ(r.cols, 144);
  ASSERT_TRUE(row_layout(t, 2, r));  // tokens as rows
  EXPECT_EQ(r.rows, 6);
  EXPECT_EQ(r.cols, 24);
  EXPECT_EQ(r.pitch, 24);
  const Tensor k = t.slice(2, 3, 5);
  ASSERT_TRUE(row_layout(k, r));
  EXPECT_EQ(r.rows, 6);
  EXPECT_EQ(r.cols, 8);
  EXPECT_EQ(r.pitch, 24);
  EXPECT_FALSE(row_layout(k, 1, r));  // a token's heads are not one run with the next token's
  EXPECT_FALSE(row_layout(t.slice(3, 0, 2), 2, r));  // half of each head: not packed
  EXPECT_FALSE(row_layout(t.slice(1, 0, 2).slice(2, 0, 3), r));  // two pitches: tokens, then sequences

  // strided -> contiguous -> strided round trip, element for element
  const Tensor c = contiguous(k);
  EXPECT_TRUE(c.is_contiguous());
  for (int64_t row = 0; row < 6; ++row)
    for (int64_t j = 0; j < 8; ++j)
      ASSERT_EQ(c.data<float>()[row * 8 + j], static_cast<float>(row * 24 + 12 + j)) << row << ", " << j;
  Tensor dst = Tensor::zeros({2, 3, 6, 4}, DType::kF32);
  Tensor dst_k = dst.slice(2, 3, 5);
  copy(dst_k, c);
  for (int64_t i = 0; i < dst.numel(); ++i) {
    const bool in_k = i % 24 >= 12 && i % 24 < 20;
    ASSERT_EQ(dst.data<float>()[i], in_k ? static_cast<float>(i) : 0.0f) << i;  // nothing else touched
  }
  Tensor q_into_k = t.slice(2, 0, 3);
  EXPECT_THROW(copy(dst_k, q_into_k), Error);  // other element counts
  Tensor other = Tensor::zeros({2, 3, 2, 4}, DType::kF32);
  copy(other, k);  // strided to contiguous
  EXPECT_EQ(other.data<float>()[8], 36.0f);
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
