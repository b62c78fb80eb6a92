// CPU rotary embedding: llama3 and LongRoPE frequencies against the formulas evaluated here,
// the rotate_half pairing (whole heads, and a partial rotary's first dimensions) against a
// direct computation, and the backward against finite differences (it is the inverse rotation).
#include <cmath>
#include <cstring>
#include <numbers>

#include "ops/op_testing.h"
#include "ops/rope.h"

namespace shardtrain::ops {
namespace {

TEST(Rope, Llama3FrequenciesFollowTheFormula) {
  RopeOptions o;
  o.theta = 500000.0;
  o.scaling.type = RopeScalingType::kLlama3;
  o.scaling.factor = 8.0;
  o.scaling.low_freq_factor = 1.0;
  o.scaling.high_freq_factor = 4.0;
  o.scaling.original_max_positions = 8192;
  const int64_t H = 128;
  const std::vector<double> inv = rope_inv_frequencies(H, o);
  int low = 0, mid = 0, high = 0;
  for (int64_t k = 0; k < H / 2; ++k) {
    const double base = std::pow(500000.0, -2.0 * static_cast<double>(k) / H);
    const double wavelen = 2 * std::numbers::pi / base;
    double expect;
    if (wavelen < 8192.0 / 4.0) {
      expect = base;
      ++high;
    } else if (wavelen > 8192.0 / 1.0) {
      expect = base / 8.0;
      ++low;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      expect = (1 - smooth) * base / 8.0 + smooth * base;
      ++mid;
    }
    EXPECT_NEAR(inv[static_cast<size_t>(k)], expect, 1e-15 * expect) << "k=" << k;
  }
  EXPECT_GT(low, 0);  // all three bands are exercised
  EXPECT_GT(mid, 0);
  EXPECT_GT(high, 0);
}

TEST(Rope, ForwardPairsIWithIPlusHalfAndBackwardIsItsGradient) {
  const int64_t B = 2, T = 37, heads = 3, H = 10, K = H / 2;
  RopeOptions o;
  o.theta = 10000.0;
  Tensor cos_t = Tensor::empty({T + 3, K}, DType::kF64), sin_t = Tensor::empty({T + 3, K}, DType::kF64);
  rope_table(cos_t, sin_t, H, o);
  Tensor x = random_f64({B, T, heads, H}, 1);
  const Tensor x0 = testing::to_f64(x);
  Tensor y = testing::to_f64(x);
  cpu::rope_forward(y, cos_t, sin_t, {});
  const std::vector<double> inv = rope_inv_frequencies(H, o);
  Tensor ref = Tensor::empty(x.shape(), DType::kF64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t k = 0; k < K; ++k) {
          const double a = t * inv[static_cast<size_t>(k)];
          const int64_t base = ((b * T + t) * heads + h) * H;
          const double u = x0.data<double>()[base + k], v = x0.data<double>()[base + k + K];
          ref.data<double>()[base + k] = u * std::cos(a) - v * std::sin(a);
          ref.data<double>()[base + k + K] = v * std::cos(a) + u * std::sin(a);
        }
  EXPECT_TRUE(testing::all_close(y, ref, {1e-14, 1e-12, 1e-14}));
  const Tensor y32 = testing::to_dtype(x0, DType::kF32);
  Tensor y32r = testing::to_dtype(x0, DType::kF32);
  Tensor c32 = testing::to_dtype(cos_t, DType::kF32), s32 = testing::to_dtype(sin_t, DType::kF32);
  cpu::rope_forward(y32r, c32, s32, {});
  EXPECT_TRUE(testing::all_close(y32r, ref, testing::kCpuF32VsF64)) << "f32";

  const Tensor dy = random_f64(x.shape(), 2);
  Tensor dx = testing::to_f64(dy);
  cpu::rope_backward(dx, cos_t, sin_t, {});
  Tensor out = Tensor::empty(x.shape(), DType::kF64);
  expect_gradients({{"x", &x, dx}}, [&] {
    std::memcpy(out.raw_data(), x.raw_data(), x.nbytes());
    cpu::rope_forward(out, cos_t, sin_t, {});
    return testing::dot(dy, out);
  });
}

// q's and k's heads sliced out of one stacked [B, T, N + 2M, H] tensor (the model's q|k|v
// product): rotated as a contiguous copy would be, the v heads left alone.
TEST(Rope, HeadsOfAStackedTensor) {
  const int64_t B = 2, T = 9, N = 4, M = 2, H = 8, K = H / 2;
  Tensor cos_t = Tensor::empty({T, K}, DType::kF64), sin_t = Tensor::empty({T, K}, DType::kF64);
  rope_table(cos_t, sin_t, H, RopeOptions{});
  const Tensor qkv0 = random_f64({B, T, N + 2 * M, H}, 3);
  for (bool forward : {true, false}) {
    Tensor qkv = testing::to_f64(qkv0);
    Tensor qk = qkv.slice(2, 0, N + M);
    Tensor ref = contiguous(qk);
    if (forward) {
      cpu::rope_forward(qk, cos_t, sin_t, {});
      cpu::rope_forward(ref, cos_t, sin_t, {});
    } else {
      cpu::rope_backward(qk, cos_t, sin_t, {});
      cpu::rope_backward(ref, cos_t, sin_t, {});
    }
    EXPECT_EQ(std::memcmp(contiguous(qk).raw_data(), ref.raw_data(), ref.nbytes()), 0) << forward;
    const Tensor v = contiguous(qkv.slice(2, N + M, N + 2 * M)), v0 = contiguous(qkv0.slice(2, N + M, N + 2 * M));
    EXPECT_EQ(std::memcmp(v.raw_data(), v0.raw_data(), v.nbytes()), 0) << forward;
  }
  Tensor half_heads = testing::to_f64(qkv0).slice(3, 0, K);  // not whole heads: named
  EXPECT_TRUE(throws_with([&] { cpu::rope_forward(half_heads, cos_t, sin_t, {}); }, "each token's heads contiguous"));
}

// Per-token positions (documents packed into a row): each token rotated by its own table row,
// as that token alone at that position would be; a position past the tables is named.
TEST(Rope, PositionsPickEachTokensTableRow) {
  const int64_t B = 2, T = 6, heads = 3, H = 8, K = H / 2;
  Tensor cos_t = Tensor::empty({T, K}, DType::kF64), sin_t = Tensor::empty({T, K}, DType::kF64);
  rope_table(cos_t, sin_t, H, {});
  const Tensor x = random_f64({B, T, heads, H}, 5);
  Tensor pos = Tensor::empty({B, T}, DType::kI32);
  const int32_t p[] = {0, 1, 0, 1, 2, 3, /**/ 0, 1, 2, 3, 4, 0};
  std::memcpy(pos.raw_data(), p, sizeof(p));
  Tensor y = testing::to_f64(x);
  cpu::rope_forward(y, cos_t, sin_t, pos);
  for (int64_t i = 0; i < B * T; ++i) {
    const int64_t r = p[i];
    Tensor one = Tensor::empty({1, 1, heads, H}, DType::kF64);  // a copy: x stays as it is
    copy(one, x.view({B * T, 1, heads, H}).slice(0, i, i + 1));
    Tensor c = contiguous(cos_t.slice(0, r, r + 1)), s = contiguous(sin_t.slice(0, r, r + 1));
    cpu::rope_forward(one, c, s, {});
    EXPECT_TRUE(testing::all_close(contiguous(y.view({B * T, 1, heads, H}).slice(0, i, i + 1)), one, testing::kExact))
        << "token " << i;
  }
  cpu::rope_backward(y, cos_t, sin_t, pos);
  EXPECT_TRUE(testing::all_close(y, x, {1e-14, 1e-13, 1e-14})) << "the backward undoes the rotation";
  pos.data<int32_t>()[3] = 6;
  EXPECT_TRUE(throws_with([&] { cpu::rope_forward(y, cos_t, sin_t, pos); }, "position 6 of token 3 outside"));
}

TEST(Rope, TableTooShortIsNamed) {
  Tensor c = Tensor::zeros({4, 2}, DType::kF32), s = Tensor::zeros({4, 2}, DType::kF32), x = Tensor::zeros({1, 5, 1, 4}, DType::kF32);
  EXPECT_TRUE(throws_with([&] { cpu::rope_forward(x, c, s, {}); }, "`cos_TK` must be [>= 5, K] with 1 <= K <= 2"));
  Tensor wide_c = Tensor::zeros({8, 3}, DType::kF32), wide_s = Tensor::zeros({8, 3}, DType::kF32);
  EXPECT_TRUE(throws_with([&] { cpu::rope_forward(x, wide_c, wide_s, {}); }, "found f32[8, 3]"))
      << "more frequencies than half a head";
}

// LongRoPE (Phi-3): inv_freq[k] = 1 / (factor[k] · theta^(2k/R)), the short factors up to
// original_max_positions positions and the long ones past them; the tables' cos and sin times
// the attention factor. Over a partial rotary's R = int(H · fraction) dimensions.
TEST(Rope, LongRopeFrequenciesAndAttentionFactorFollowTheFormula) {
  RopeOptions o;
  o.theta = 10000.0;
  o.partial_rotary = 0.75;
  o.scaling.type = RopeScalingType::kLongRope;
  o.scaling.original_max_positions = 16;
  o.scaling.short_factor = {1.0, 1.2, 1.5, 2.0, 2.7, 3.5};
  o.scaling.long_factor = {1.0, 2.0, 3.0, 5.0, 8.0, 13.0};
  o.scaling.attention_factor = 1.4;
  const int64_t H = 16, R = 12, K = R / 2;
  EXPECT_EQ(rope_rotary_dim(H, o), R);
  EXPECT_FALSE(rope_long_factors(o, 16));
  EXPECT_TRUE(rope_long_factors(o, 17));
  for (const bool long_factors : {false, true}) {
    const std::vector<double> inv = rope_inv_frequencies(H, o, long_factors);
    ASSERT_EQ(static_cast<int64_t>(inv.size()), K);
    for (int64_t k = 0; k < K; ++k) {
      const double ext = (long_factors ? o.scaling.long_factor : o.scaling.short_factor)[static_cast<size_t>(k)];
      const double expect = 1.0 / (ext * std::pow(10000.0, 2.0 * static_cast<double>(k) / R));
      EXPECT_NEAR(inv[static_cast<size_t>(k)], expect, 1e-15 * expect) << "k=" << k << " long " << long_factors;
    }
    const int64_t T = 20;
    Tensor c = Tensor::empty({T, K}, DType::kF64), s = Tensor::empty({T, K}, DType::kF64);
    rope_table(c, s, H, o, long_factors);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) {
        const double a = static_cast<double>(t) * inv[static_cast<size_t>(k)];
        EXPECT_NEAR(c.data<double>()[t * K + k], 1.4 * std::cos(a), 1e-14) << t << " " << k;
        EXPECT_NEAR(s.data<double>()[t * K + k], 1.4 * std::sin(a), 1e-14) << t << " " << k;
      }
  }
  o.scaling.long_factor.pop_back();
  EXPECT_TRUE(throws_with([&] { rope_inv_frequencies(H, o, true); }, "long_factor has 5 entries"));
  EXPECT_TRUE(throws_with([&] { rope_inv_frequencies(H, o, true); }, "need 6"));
  o.partial_rotary = 0.7;  // int(16 x 0.7) = 11: odd
  EXPECT_TRUE(throws_with([&] { rope_rotary_dim(H, o); }, "= 11 dimensions, which must be even"));
}

// Partial rotary (Phi-4-mini): the first R = 2K elements of each head rotate as a head of R
// would, pairing i with i + K; elements R..H-1 pass through untouched; the backward is the
// forward's gradient (finite differences), heads of a stacked tensor included.
TEST(Rope, PartialRotaryRotatesTheFirstDimensionsOnly) {
  const int64_t B = 2, T = 11, heads = 3, H = 16, R = 12, K = R / 2;
  RopeOptions o;
  o.theta = 10000.0;
  o.partial_rotary = 0.75;
  Tensor cos_t = Tensor::empty({T, K}, DType::kF64), sin_t = Tensor::empty({T, K}, DType::kF64);
  rope_table(cos_t, sin_t, H, o);
  Tensor x = random_f64({B, T, heads, H}, 7);
  const Tensor x0 = testing::to_f64(x);
  Tensor y = testing::to_f64(x);
  cpu::rope_forward(y, cos_t, sin_t, {});
  const std::vector<double> inv = rope_inv_frequencies(H, o);
  Tensor ref = testing::to_f64(x0);  // the pass-through elements as they are
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t k = 0; k < K; ++k) {
          const double a = static_cast<double>(t) / std::pow(10000.0, 2.0 * static_cast<double>(k) / R);
          EXPECT_NEAR(inv[static_cast<size_t>(k)] * static_cast<double>(t), a, 1e-12);
          const int64_t base = ((b * T + t) * heads + h) * H;
          const double u = x0.data<double>()[base + k], v = x0.data<double>()[base + k + K];
          ref.data<double>()[base + k] = u * std::cos(a) - v * std::sin(a);
          ref.data<double>()[base + k + K] = v * std::cos(a) + u * std::sin(a);
        }
  EXPECT_TRUE(testing::all_close(y, ref, {1e-14, 1e-12, 1e-14}));
  for (int64_t i = 0; i < B * T * heads; ++i)
    for (int64_t e = R; e < H; ++e)
      ASSERT_EQ(y.data<double>()[i * H + e], x0.data<double>()[i * H + e]) << "pass-through element " << e;

  const Tensor dy = random_f64(x.shape(), 8);
  Tensor dx = testing::to_f64(dy);
  cpu::rope_backward(dx, cos_t, sin_t, {});
  Tensor out = Tensor::empty(x.shape(), DType::kF64);
  expect_gradients({{"x", &x, dx}}, [&] {
    std::memcpy(out.raw_data(), x.raw_data(), x.nbytes());
    cpu::rope_forward(out, cos_t, sin_t, {});
    return testing::dot(dy, out);
  });

  // q's and k's heads of a stacked [B, T, N + 2M, H] tensor: as a contiguous copy, v untouched
  const Tensor qkv0 = random_f64({B, T, 4, H}, 9);
  Tensor qkv = testing::to_f64(qkv0);
  Tensor qk = qkv.slice(2, 0, 3);
  Tensor qk_ref = contiguous(qk);
  cpu::rope_forward(qk, cos_t, sin_t, {});
  cpu::rope_forward(qk_ref, cos_t, sin_t, {});
  EXPECT_EQ(std::memcmp(contiguous(qk).raw_data(), qk_ref.raw_data(), qk_ref.nbytes()), 0);
  const Tensor v = contiguous(qkv.slice(2, 3, 4)), v0 = contiguous(qkv0.slice(2, 3, 4));
  EXPECT_EQ(std::memcmp(v.raw_data(), v0.raw_data(), v.nbytes()), 0);
}

}  // namespace
}  // namespace shardtrain::ops
