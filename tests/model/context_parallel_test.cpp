// Context parallelism's chunks on one process: a rank's local tokens are chunks r and
// 2N - 1 - r of each sequence (head-tail), context_unshard inverts context_shard exactly for
// any dimension, the true positions are the shard of 0 .. T - 1, lengths that do not cut into
// 2N chunks are refused naming the key, packed documents give the ring each chunk's first
// document and its spans, and the model refuses what the ring does not support.
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "model/context_parallel.h"
#include "model/llama.h"
#include "model/tensor_parallel.h"
#include "testing/compare.h"
#include "testing/packed_documents.h"

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

// Documents of 4, 10 and 10 tokens over 2 ranks (chunks of 6): each local chunk's first
// document, where it starts in the whole sequence, the chunk's own documents cut at its first
// token, and the spans of every earlier key chunk its first document reaches back into.
TEST(ContextDocuments, LeadStartAndSpans) {
  const Tensor positions = testing::document_positions({{4, 10, 10}});
  const model::ContextDocuments r0 =
      model::context_documents(model::context_shard(positions, 2, 0), 2, 0, Device::cpu());
  const model::ContextDocuments r1 =
      model::context_documents(model::context_shard(positions, 2, 1), 2, 1, Device::cpu());
  // rank 0: chunks 0 (tokens 0-5: documents at 0 and 4) and 3 (18-23: inside the one from 14)
  EXPECT_EQ(r0.lead[0], std::vector<int64_t>{4});
  EXPECT_EQ(r0.start[0], std::vector<int64_t>{0});
  EXPECT_EQ(r0.lead[1], std::vector<int64_t>{6});
  EXPECT_EQ(r0.start[1], std::vector<int64_t>{14});
  // rank 1: chunks 1 (6-11, inside the one from 4) and 2 (12-17: its end, then the one from 14)
  EXPECT_EQ(r1.lead[0], std::vector<int64_t>{6});
  EXPECT_EQ(r1.start[0], std::vector<int64_t>{4});
  EXPECT_EQ(r1.lead[1], std::vector<int64_t>{2});
  EXPECT_EQ(r1.start[1], std::vector<int64_t>{4});
  // the diagonal: chunk 2's positions cut at its first token
  const int32_t* cut = r1.chunks[1].positions_BT.data<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(cut, cut + 6), (std::vector<int32_t>{0, 1, 0, 1, 2, 3}));
  EXPECT_EQ(r1.chunks[1].count, 2);
  auto spans = [](const model::ContextDocuments& d, int qi, int64_t gk) {
    const ops::KeySpans* s = d.spans(qi, gk);
    return s != nullptr ? std::vector<int64_t>{s->queries[0], s->first_key[0]} : std::vector<int64_t>{};
  };
  EXPECT_EQ(spans(r0, 1, 2), (std::vector<int64_t>{6, 2}));  // chunk 3 against chunk 2: keys 14-17
  EXPECT_EQ(spans(r0, 1, 1), std::vector<int64_t>{});        // nothing of chunk 1
  EXPECT_EQ(spans(r0, 1, 0), std::vector<int64_t>{});
  EXPECT_EQ(spans(r1, 0, 0), (std::vector<int64_t>{6, 4}));  // chunk 1 against chunk 0: keys 4-5
  EXPECT_EQ(spans(r1, 1, 1), (std::vector<int64_t>{2, 0}));  // chunk 2's first 2 against all of chunk 1
  EXPECT_EQ(spans(r1, 1, 0), (std::vector<int64_t>{2, 4}));
  // positions that do not step as documents do, and a document before the sequence
  Tensor bad = model::context_shard(positions, 2, 1);
  bad.data<int32_t>()[2] = 7;
  EXPECT_TRUE(throws_with([&] { (void)model::context_documents(bad, 2, 1, Device::cpu()); },
                          "position 7 at token 8 of the sequence neither starts a document"));
  Tensor early = model::context_shard(positions, 2, 1);
  early.data<int32_t>()[0] = 9;
  EXPECT_TRUE(throws_with([&] { (void)model::context_documents(early, 2, 1, Device::cpu()); },
                          "the token at 6 of the sequence has position 9"));
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
  // packed documents are checked before any exchange: rank 0's first token opens the sequence
  Tensor positions = Tensor::zeros({1, 8}, DType::kI32);
  positions.data<int32_t>()[0] = 1;
  EXPECT_TRUE(throws_with([&] { (void)m.forward_backward(ids, targets, {}, positions); },
                          "the token at 0 of the sequence has position 1 in its document, which would start before "
                          "the sequence"));
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
