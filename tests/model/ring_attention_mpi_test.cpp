// Ring attention under mpirun (2, 3 and 4 ranks; at 4 also two groups of 2): each rank's
// queries against the key/value blocks passing around its context group give, at its tokens,
// the output and log-sum-exp of one rank's attention over the whole sequence, and the ring's
// backward the same dq, dk and dv (f32, relative 1e-5), with grouped kv heads, from the
// shortest sequence the degree allows (one token per chunk, T = 2N) to chunks longer than a
// tile, and on q, k, v given as head slices of one stacked tensor (as the model holds them).
// Packed documents spanning chunks and ranks give what one rank's attention with them gives.
// Exchanges left in flight until finish() (as a GPU's are) give the same results bit for bit:
// the forward starts its key/value exchanges, the backward those and the gradient's too.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dist/mpi_communicator.h"
#include "fsdp/context_parallel.h"
#include "model/context_parallel.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "testing/compare.h"
#include "testing/packed_documents.h"

namespace shardtrain {
namespace {

Tensor random_tensor(const Shape& shape, uint64_t seed, double mean, double scale) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  testing::fill_random(t, seed, mean, scale);
  return t;
}

// The context degrees this run tests: the whole run as one group, and groups of 2 at 4 ranks.
std::vector<int> degrees(int world) {
  std::vector<int> d{world};
  if (world == 4) d.push_back(2);
  return d;
}

TEST(RingAttention, MatchesOneRankOverTheWholeSequence) {
  auto comm = dist::make_mpi_world();
  for (int degree : degrees(comm->world_size())) {
    fsdp::ContextGroups groups = fsdp::split_context_groups(*comm, degree);
    auto cp = fsdp::make_context_parallel(groups.group.get());
    const int r = cp->rank();
    ASSERT_EQ(cp->size(), degree);
    for (int64_t C : {int64_t{1}, int64_t{3}, int64_t{70}}) {
      for (bool stacked : {false, true}) {
        const int64_t B = 2, N = 6, M = 2, H = 8, T = 2 * degree * C, L = 2 * C;
        SCOPED_TRACE("degree " + std::to_string(degree) + ", T = " + std::to_string(T) +
                     (stacked ? ", stacked q|k|v" : "") + ", rank " + std::to_string(r));
        // the whole sequence, the same on every rank (another one in each group)
        const uint64_t seed = static_cast<uint64_t>(100 * C + 10 * groups.data_rank());
        const Tensor q = random_tensor({B, T, N, H}, seed + 1, 0.1, 0.8);
        const Tensor k = random_tensor({B, T, M, H}, seed + 2, -0.1, 0.8);
        const Tensor v = random_tensor({B, T, M, H}, seed + 3, 0.2, 1.5);
        const Tensor dout = random_tensor({B, T, N, H}, seed + 4, 0.05, 1.0);
        ops::AttentionOptions o;
        o.block_queries = 16;
        o.block_keys = 16;
        Tensor out = Tensor::empty(q.shape(), DType::kF32), lse = Tensor::empty({B, N, T}, DType::kF32);
        ops::attention_forward(out, lse, q, k, v, o);
        Tensor dq = Tensor::empty(q.shape(), DType::kF32), dk = Tensor::empty(k.shape(), DType::kF32),
               dv = Tensor::empty(v.shape(), DType::kF32);
        ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, o);

        // this rank's tokens; stacked: head slices of one [B, L, N + 2M, H] tensor
        Tensor lq = model::context_shard(q, degree, r), lk = model::context_shard(k, degree, r),
               lv = model::context_shard(v, degree, r);
        Tensor qkv, dqkv;
        Tensor ldq = Tensor::empty(lq.shape(), DType::kF32), ldk = Tensor::empty(lk.shape(), DType::kF32),
               ldv = Tensor::empty(lv.shape(), DType::kF32);
        if (stacked) {
          qkv = Tensor::empty({B, L, N + 2 * M, H}, DType::kF32);
          dqkv = Tensor::empty({B, L, N + 2 * M, H}, DType::kF32);
          Tensor sq = qkv.slice(2, 0, N), sk = qkv.slice(2, N, N + M), sv = qkv.slice(2, N + M, N + 2 * M);
          copy(sq, lq);
          copy(sk, lk);
          copy(sv, lv);
          lq = sq, lk = sk, lv = sv;
          ldq = dqkv.slice(2, 0, N), ldk = dqkv.slice(2, N, N + M), ldv = dqkv.slice(2, N + M, N + 2 * M);
        }
        Tensor lout = Tensor::empty({B, L, N, H}, DType::kF32), llse = Tensor::empty({B, N, L}, DType::kF32);
        model::ring_attention_forward(lout, llse, lq, lk, lv, o, *cp);
        EXPECT_TRUE(testing::all_close(lout, model::context_shard(out, degree, r), testing::kRanksF32)) << "out";
        EXPECT_TRUE(testing::all_close(llse, model::context_shard(lse, degree, r, 2), testing::kRanksF32)) << "lse";

        const Tensor ldout = model::context_shard(dout, degree, r);
        model::ring_attention_backward(ldq, ldk, ldv, ldout, lq, lk, lv, lout, llse, o, *cp);
        EXPECT_TRUE(testing::all_close(contiguous(ldq), model::context_shard(dq, degree, r), testing::kRanksF32))
            << "dq";
        EXPECT_TRUE(testing::all_close(contiguous(ldk), model::context_shard(dk, degree, r), testing::kRanksF32))
            << "dk";
        EXPECT_TRUE(testing::all_close(contiguous(ldv), model::context_shard(dv, degree, r), testing::kRanksF32))
            << "dv";
      }
    }
  }
}

// Rows of documents of the given lengths, repeated until the row is full (the last cut short).
std::vector<int64_t> repeated_lengths(const std::vector<int64_t>& pattern, int64_t T) {
  std::vector<int64_t> lengths;
  for (int64_t t = 0, i = 0; t < T; ++i) {
    const int64_t len = std::min(pattern[static_cast<size_t>(i) % pattern.size()], T - t);
    lengths.push_back(len);
    t += len;
  }
  return lengths;
}

// Packed documents through the ring: documents that span chunks and ranks, that start exactly
// at a chunk's first token, of one token, and one over a whole row, give each rank's tokens
// what one rank's attention with the same documents over the whole sequence gives (f32,
// relative 1e-5), forward and backward, from one token a chunk up.
TEST(RingAttention, PackedDocumentsMatchOneRank) {
  auto comm = dist::make_mpi_world();
  for (int degree : degrees(comm->world_size())) {
    fsdp::ContextGroups groups = fsdp::split_context_groups(*comm, degree);
    auto cp = fsdp::make_context_parallel(groups.group.get());
    const int r = cp->rank();
    for (int64_t C : {int64_t{1}, int64_t{3}, int64_t{70}}) {
      const int64_t N = 4, M = 2, H = 8, T = 2 * degree * C;
      const std::vector<std::vector<int64_t>> rows = {
          repeated_lengths({C + 1, 1, 2 * C + 3}, T),  // across chunks, and of one token
          repeated_lengths({C}, T),                    // each starting at a chunk's first token
          repeated_lengths({T}, T),                    // one over the whole row
          repeated_lengths({3 * C - 1, 2}, T)};
      const int64_t B = static_cast<int64_t>(rows.size());
      SCOPED_TRACE("degree " + std::to_string(degree) + ", T = " + std::to_string(T) + ", rank " + std::to_string(r));
      const uint64_t seed = static_cast<uint64_t>(500 + 100 * C + 10 * groups.data_rank());
      const Tensor q = random_tensor({B, T, N, H}, seed + 1, 0.1, 0.8);
      const Tensor k = random_tensor({B, T, M, H}, seed + 2, -0.1, 0.8);
      const Tensor v = random_tensor({B, T, M, H}, seed + 3, 0.2, 1.5);
      const Tensor dout = random_tensor({B, T, N, H}, seed + 4, 0.05, 1.0);
      const Tensor positions = testing::document_positions(rows);
      const ops::PackedDocuments whole = ops::pack_documents(positions, Device::cpu());
      ops::AttentionOptions o;
      o.block_queries = 16;
      o.block_keys = 16;
      ops::AttentionOptions with_documents = o;
      with_documents.documents = &whole;
      Tensor out = Tensor::empty(q.shape(), DType::kF32), lse = Tensor::empty({B, N, T}, DType::kF32);
      ops::attention_forward(out, lse, q, k, v, with_documents);
      Tensor dq = Tensor::empty(q.shape(), DType::kF32), dk = Tensor::empty(k.shape(), DType::kF32),
             dv = Tensor::empty(v.shape(), DType::kF32);
      ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, with_documents);

      const model::ContextDocuments docs =
          model::context_documents(model::context_shard(positions, degree, r), degree, r, Device::cpu());
      const Tensor lq = model::context_shard(q, degree, r), lk = model::context_shard(k, degree, r),
                   lv = model::context_shard(v, degree, r), ldout = model::context_shard(dout, degree, r);
      Tensor lout = Tensor::empty(lq.shape(), DType::kF32), llse = Tensor::empty({B, N, 2 * C}, DType::kF32);
      model::ring_attention_forward(lout, llse, lq, lk, lv, o, *cp, &docs);
      EXPECT_TRUE(testing::all_close(lout, model::context_shard(out, degree, r), testing::kRanksF32)) << "out";
      EXPECT_TRUE(testing::all_close(llse, model::context_shard(lse, degree, r, 2), testing::kRanksF32)) << "lse";
      Tensor ldq = Tensor::empty(lq.shape(), DType::kF32), ldk = Tensor::empty(lk.shape(), DType::kF32),
             ldv = Tensor::empty(lv.shape(), DType::kF32);
      model::ring_attention_backward(ldq, ldk, ldv, ldout, lq, lk, lv, lout, llse, o, *cp, &docs);
      EXPECT_TRUE(testing::all_close(ldq, model::context_shard(dq, degree, r), testing::kRanksF32)) << "dq";
      EXPECT_TRUE(testing::all_close(ldk, model::context_shard(dk, degree, r), testing::kRanksF32)) << "dk";
      EXPECT_TRUE(testing::all_close(ldv, model::context_shard(dv, degree, r), testing::kRanksF32)) << "dv";
      // the documents matter: without them the same ring gives another output
      Tensor plain = Tensor::empty(lq.shape(), DType::kF32), plain_lse = Tensor::empty({B, N, 2 * C}, DType::kF32);
      model::ring_attention_forward(plain, plain_lse, lq, lk, lv, o, *cp);
      EXPECT_FALSE(testing::all_close(plain, lout, testing::kRanksF32));
    }
  }
}

// A group whose started exchanges move nothing until finish(): each `recv` is filled with NaN
// at once and the exchange itself runs in finish(), reading `send` only then. A ring that read
// a `recv` before finish(), or wrote a `send`, would see NaN or send what it wrote; the counts
// say which exchanges were started rather than run at once.
class DeferredExchanges final : public model::ContextParallel {
 public:
  explicit DeferredExchanges(model::ContextParallel& group) : group_(group) {}
  int size() const override { return group_.size(); }
  int rank() const override { return group_.rank(); }
  void send_recv(const Tensor& send, int to, Tensor& recv, int from) override {
    EXPECT_TRUE(pending_.empty()) << "an exchange run at once while started ones are in flight";
    ++immediate;
    group_.send_recv(send, to, recv, from);
  }
  void start_send_recv(const Tensor& send, int to, Tensor& recv, int from) override {
    ops::fill(recv, std::numeric_limits<double>::quiet_NaN());
    pending_.push_back({send, recv, to, from});
    ++started;
    most_in_flight = std::max(most_in_flight, static_cast<int>(pending_.size()));
  }
  void finish() override {
    for (Pending& p : pending_) group_.send_recv(p.send, p.to, p.recv, p.from);
    pending_.clear();
  }
  int immediate = 0, started = 0, most_in_flight = 0;

 private:
  struct Pending {
    Tensor send, recv;
    int to, from;
  };
  model::ContextParallel& group_;
  std::vector<Pending> pending_;
};

TEST(RingAttention, ExchangesInFlightUntilFinishGiveTheSameResults) {
  auto comm = dist::make_mpi_world();
  for (int degree : degrees(comm->world_size())) {
    fsdp::ContextGroups groups = fsdp::split_context_groups(*comm, degree);
    auto cp = fsdp::make_context_parallel(groups.group.get());
    const int r = cp->rank();
    for (int64_t C : {int64_t{1}, int64_t{20}}) {
      const int64_t B = 2, N = 4, M = 2, H = 8, L = 2 * C;
      SCOPED_TRACE("degree " + std::to_string(degree) + ", C = " + std::to_string(C) + ", rank " + std::to_string(r));
      const uint64_t seed = static_cast<uint64_t>(1000 + 100 * C + 10 * groups.data_rank() + r);
      const Tensor q = random_tensor({B, L, N, H}, seed + 1, 0.1, 0.8);
      const Tensor k = random_tensor({B, L, M, H}, seed + 2, -0.1, 0.8);
      const Tensor v = random_tensor({B, L, M, H}, seed + 3, 0.2, 1.5);
      const Tensor dout = random_tensor({B, L, N, H}, seed + 4, 0.05, 1.0);
      ops::AttentionOptions o;
      o.block_queries = 16;
      o.block_keys = 16;
      struct Result {
        Tensor out, lse, dq, dk, dv;
      };
      const auto ring = [&](model::ContextParallel& group) {
        Result x{Tensor::empty(q.shape(), DType::kF32), Tensor::empty({B, N, L}, DType::kF32),
                 Tensor::empty(q.shape(), DType::kF32), Tensor::empty(k.shape(), DType::kF32),
                 Tensor::empty(v.shape(), DType::kF32)};
        model::ring_attention_forward(x.out, x.lse, q, k, v, o, group);
        model::ring_attention_backward(x.dq, x.dk, x.dv, dout, q, k, v, x.out, x.lse, o, group);
        return x;
      };
      const Result want = ring(*cp);
      DeferredExchanges deferred(*cp);
      const Result got = ring(deferred);
      EXPECT_TRUE(testing::all_close(got.out, want.out, testing::kExact)) << "out";
      EXPECT_TRUE(testing::all_close(got.lse, want.lse, testing::kExact)) << "lse";
      EXPECT_TRUE(testing::all_close(got.dq, want.dq, testing::kExact)) << "dq";
      EXPECT_TRUE(testing::all_close(got.dk, want.dk, testing::kExact)) << "dk";
      EXPECT_TRUE(testing::all_close(got.dv, want.dv, testing::kExact)) << "dv";
      // forward: degree - 1 key/value exchanges started; backward: as many again, and the
      // gradient's degree - 1 one step behind them (two in flight at the steps between the
      // first and the last), then its way home at once
      EXPECT_EQ(deferred.started, 3 * (degree - 1));
      EXPECT_EQ(deferred.immediate, 1);
      EXPECT_EQ(deferred.most_in_flight, degree > 2 ? 2 : 1);
    }
  }
}

TEST(RingAttention, RefusesWhatItDoesNotCompute) {
  auto comm = dist::make_mpi_world();
  auto cp = fsdp::make_context_parallel(comm.get());
  Tensor q = Tensor::zeros({1, 4, 2, 8}, DType::kF32), k = Tensor::zeros({1, 4, 1, 8}, DType::kF32);
  Tensor out = Tensor::zeros({1, 4, 2, 8}, DType::kF32), lse = Tensor::zeros({1, 2, 4}, DType::kF32);
  ops::AttentionOptions o;
  o.window = 3;
  EXPECT_TRUE(testing::throws_with([&] { model::ring_attention_forward(out, lse, q, k, k, o, *cp); },
                                   "a sliding window (3 keys) is not supported with context parallelism"));
  o = {};
  o.causal = false;
  EXPECT_TRUE(
      testing::throws_with([&] { model::ring_attention_forward(out, lse, q, k, k, o, *cp); }, "causal attention only"));
  EXPECT_TRUE(testing::throws_with([&] { (void)fsdp::split_context_groups(*comm, comm->world_size() + 1); },
                                   "must divide the"));
}

}  // namespace
}  // namespace shardtrain
