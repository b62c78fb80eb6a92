// Context parallelism's chunks on one process: a rank's local tokens are chunks r and
// 2N - 1 - r of each sequence (head-tail), context_unshard inverts context_shard exactly for
// any dimension, the true positions are the shard of 0 .. T - 1, lengths that do not cut into
// 2N chunks are refused naming the key, and the model refuses what the ring does not support.
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "model/context_parallel.h"
#include "model/llama.h"
#include "model/tensor_parallel.h"
#include "testing/compare.h"

namespace shardtrain {
namespace {

using testing::throws_with;

// A group that is only ever asked its size and rank (the model's checks), never to exchange.
class SilentGroup final : public model::ContextParallel {
 public:
  explicit SilentGroup(int size) : size_(size) {}
  int size() const override { return size_; }
  int rank() const override { return 0; }
  void send_recv(const Tensor&, int, Tensor&, int) override { ADD_FAILURE() << "no exchange expected"; }

 private:
  int size_;
};

Tensor iota_BT(int64_t B, int64_t T) {
  Tensor t = Tensor::empty({B, T}, DType::kI32);
  std::iota(t.data<int32_t>(), t.data<int32_t>() + t.numel(), 0);
  return t;
}

TEST(ContextShard, HeadTailChunks) {
  // T = 24 over 2 ranks: chunks of 6; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
  const Tensor ids = iota_BT(2, 24);
  const Tensor r0 = model::context_shard(ids, 2, 0), r1 = model::context_shard(ids, 2, 1);
  ASSERT_EQ(r0.shape(), Shape({2, 12}));
  std::vector<int32_t> want0, want1;
  for (int64_t b = 0; b < 2; ++b) {
    for (int32_t t : {0, 1, 2, 3, 4, 5, 18, 19, 20, 21, 22, 23}) want0.push_back(static_cast<int32_t>(b * 24) + t);
    for (int32_t t = 6; t < 18; ++t) want1.push_back(static_cast<int32_t>(b * 24) + t);
  }
  EXPECT_EQ(std::vector<int32_t>(r0.data<int32_t>(), r0.data<int32_t>() + 24), want0);
  EXPECT_EQ(std::vector<int32_t>(r1.data<int32_t>(), r1.data<int32_t>() + 24), want1);
}

TEST(ContextShard, UnshardInvertsShardAndPositionsAreTheTrueOnes) {
  const int64_t B = 3, T = 24;
  for (int degree : {1, 2, 3, 4, 6, 12}) {
    SCOPED_TRACE("degree " + std::to_string(degree));
    const Tensor ids = iota_BT(B, T);
    Tensor x = Tensor::empty({B, T, 2, 3}, DType::kF32), lse = Tensor::empty({B, 2, T}, DType::kF64);
    testing::fill_random(x, 1);
    testing::fill_random(lse, 2);
    std::vector<Tensor> ids_parts, x_parts, lse_parts;
    Tensor rows = iota_BT(1, T);  // each row's positions 0 .. T - 1
    for (int r = 0; r < degree; ++r) {
      ids_parts.push_back(model::context_shard(ids, degree, r));
      x_parts.push_back(model::context_shard(x, degree, r));
      lse_parts.push_back(model::context_shard(lse, degree, r, 2));
      EXPECT_EQ(x_parts.back().shape(), Shape({B, T / degree, 2, 3}));
      // the positions are the shard of 0 .. T - 1 in every row
      const Tensor pos = model::context_positions(B, T / degree, degree, r);
      const Tensor want = model::context_shard(rows, degree, r);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T / degree; ++t)
          EXPECT_EQ(pos.data<int32_t>()[b * (T / degree) + t], want.data<int32_t>()[t]) << "rank " << r;
    }
    EXPECT_TRUE(testing::all_close(model::context_unshard(ids_parts), ids, testing::kExact));
    EXPECT_TRUE(testing::all_close(model::context_unshard(x_parts), x, testing::kExact));
    EXPECT_TRUE(testing::all_close(model::context_unshard(lse_parts, 2), lse, testing::kExact));
  }
}

TEST(ContextShard, LengthsThatDoNotCutAreRefused) {
  EXPECT_TRUE(throws_with([] { (void)model::context_shard(iota_BT(1, 10), 3, 0); },
                          "make training.seq_len a multiple of 2 x parallel.context_parallel = 6"));
  EXPECT_TRUE(throws_with([] { (void)model::context_shard(iota_BT(1, 12), 2, 2); }, "rank 2 outside"));
  EXPECT_EQ(model::context_chunk_tokens(8, 4), 1);  // the shortest sequence: one token per chunk
}

model::LlamaConfig small_config() {
  model::LlamaConfig c;
  c.vocab_size = 31;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 24;
  c.max_seq_len = 16;
  return c;
}

TEST(ContextParallelModel, RefusesWhatTheRingDoesNotSupport) {
  SilentGroup two(2);
  {
    model::LlamaConfig c = small_config();
    c.sliding_window = 4;
    c.sliding_layers = {true, false};
    model::Llama m(c, DType::kF32);
    EXPECT_TRUE(throws_with([&] { m.set_context_parallel(&two); }, "layer 0 has a sliding window of 4"));
  }
  model::Llama m(small_config(), DType::kF32);
  m.init_random(1);
  m.set_fp8_attention(true);
  EXPECT_TRUE(throws_with([&] { m.set_context_parallel(&two); }, "training.fp8_attention on"));
  m.set_fp8_attention(false);
  m.set_context_parallel(&two);
  EXPECT_EQ(m.context_parallel(), &two);
  EXPECT_TRUE(throws_with([&] { m.set_fp8_attention(true); }, "training.fp8_attention with parallel.context_parallel"));

  Tensor ids = Tensor::empty({1, 8}, DType::kI32), targets = Tensor::empty({1, 8}, DType::kI32);
  testing::fill_random_ints(ids, 3, 1, 31);
  testing::fill_random_ints(targets, 4, 0, 31);
  // 8 local tokens x 2 ranks = 16 = max_seq_len fits; 10 x 2 does not, nor an odd count
  Tensor long_ids = Tensor::empty({1, 10}, DType::kI32), long_targets = Tensor::empty({1, 10}, DType::kI32);
  testing::fill_random_ints(long_ids, 5, 1, 31);
  testing::fill_random_ints(long_targets, 6, 0, 31);
  EXPECT_TRUE(
      throws_with([&] { (void)m.forward_backward(long_ids, long_targets, {}); }, "max_seq_len = 16 tokens (10 x 2)"));
  Tensor positions = Tensor::zeros({1, 8}, DType::kI32);
  EXPECT_TRUE(throws_with([&] { (void)m.forward_backward(ids, targets, {}, positions); },
                          "packed documents (a document mask) are not supported with context parallelism"));
  EXPECT_TRUE(throws_with([&] { (void)m.logits(ids); }, "logits() is not supported with context parallelism"));
  EXPECT_TRUE(throws_with([&] { (void)m.last_logits(ids); }, "sampling (the last position's logits)"));
  // a group of one is no context parallelism: the model runs as before
  SilentGroup one(1);
  m.set_context_parallel(&one);
  EXPECT_EQ(m.context_parallel(), nullptr);
  EXPECT_EQ(m.logits(ids).size(0), 8);
}

}  // namespace
}  // namespace shardtrain
