// CPU tiled attention: forward and log-sum-exp against the naive full softmax in f64 for
// GQA ratios 1/2/4, lengths that straddle tiles, causal and not; tile sizes change nothing
// beyond rounding; the backward equals finite differences for q, k and v; the last T queries
// over S > T keys (a KV cache) are the rows of the full S-query call, bit for bit. Packed
// documents attend as separate sequences would; their positions and segments are checked.
// Sliding windows (smaller than, equal to and larger than T; with documents; over a KV cache)
// against a brute-force masked softmax, and their backward against finite differences. Key
// spans (context parallelism's blocks under documents) against the masked softmax too.
#include <cmath>
#include <functional>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/fp8.h"
#include "ops/op_testing.h"
#include "testing/packed_documents.h"

namespace shardtrain::ops {
namespace {

// Brute-force softmax attention of the T queries at the last T of the S key positions, over
// the keys `sees(b, query position, key)` allows (f64).
using Mask = std::function<bool(int64_t, int64_t, int64_t)>;
using testing::to_dtype;
void naive_masked(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, const Mask& sees,
                  double softcap = 0) {
  const int64_t B = q.size(0), T = q.size(1), N = q.size(2), H = q.size(3), S = k.size(1), M = k.size(2), G = N / M;
  const Tensor q64 = testing::to_f64(q), k64 = testing::to_f64(k), v64 = testing::to_f64(v);
  out = Tensor::empty(q.shape(), DType::kF64);
  lse = Tensor::empty({B, N, T}, DType::kF64);
  const double scale = 1 / std::sqrt(static_cast<double>(H));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(static_cast<size_t>(S), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < S; ++j) {
          if (!sees(b, i + S - T, j)) continue;
          double d = 0;
          for (int64_t h = 0; h < H; ++h)
            d += q64.data<double>()[((b * T + i) * N + n) * H + h] *
                 k64.data<double>()[((b * S + j) * M + n / G) * H + h];
          const double sj = softcap > 0 ? softcap * std::tanh(d * scale / softcap) : d * scale;
          s[static_cast<size_t>(j)] = sj;
          mx = std::max(mx, sj);
        }
        double sum = 0;
        for (int64_t j = 0; j < S; ++j) sum += std::exp(s[static_cast<size_t>(j)] - mx);
        lse.data<double>()[(b * N + n) * T + i] = mx + std::log(sum);
        for (int64_t h = 0; h < H; ++h) {
          double acc = 0;
          for (int64_t j = 0; j < S; ++j)
            acc += std::exp(s[static_cast<size_t>(j)] - mx) / sum *
                   v64.data<double>()[((b * S + j) * M + n / G) * H + h];
          out.data<double>()[((b * T + i) * N + n) * H + h] = acc;
        }
      }
}

// Causal (or full) attention over as many keys as queries, brute force (f64).
void naive(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  naive_masked(out, lse, q, k, v, [causal](int64_t, int64_t position, int64_t j) { return !causal || j <= position; });
}

struct Case {
  int64_t B, T, N, M, H, block;
  bool causal;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << "B" << c.B << "_T" << c.T << "_N" << c.N << "_M" << c.M << "_H" << c.H << "_tile" << c.block
      << (c.causal ? "_causal" : "_full");
}

class AttentionForward : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionForward, MatchesNaiveSoftmax) {
  const Case c = GetParam();
  const Tensor q64 = random_f64({c.B, c.T, c.N, c.H}, 1, 0.1, 0.8), k64 = random_f64({c.B, c.T, c.M, c.H}, 2, -0.1, 0.8),
               v64 = random_f64({c.B, c.T, c.M, c.H}, 3, 0.2, 1.5);
  Tensor ref, ref_lse;
  naive(ref, ref_lse, q64, k64, v64, c.causal);
  AttentionOptions o;
  o.causal = c.causal;
  o.block_queries = c.block;
  o.block_keys = c.block / 2 + 3;  // different query and key tiles, neither dividing T
  for (DType dt : {DType::kF32, DType::kF64}) {
    const Tensor q = testing::to_dtype(q64, dt), k = testing::to_dtype(k64, dt), v = testing::to_dtype(v64, dt);
    Tensor out = Tensor::empty(q.shape(), dt), lse = Tensor::empty({c.B, c.N, c.T}, stats_dtype(dt));
    cpu::attention_forward(out, lse, q, k, v, o);
    EXPECT_TRUE(testing::all_close(out, ref, testing::kCpuF32VsF64)) << dtype_name(dt) << " out";
    EXPECT_TRUE(testing::all_close(lse, ref_lse, testing::kCpuF32VsF64)) << dtype_name(dt) << " lse";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionForward,
                         ::testing::Values(Case{2, 37, 4, 4, 16, 16, true}, Case{2, 37, 4, 2, 16, 32, true},
                                           Case{1, 70, 8, 2, 8, 64, true}, Case{1, 1, 4, 1, 16, 64, true},
                                           Case{2, 37, 4, 1, 12, 16, false}, Case{1, 130, 2, 1, 32, 64, true}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::ostringstream s;
                           PrintTo(i.param, &s);
                           return s.str();
                         });

// Queries that are the last T of S positions, over all S keys (incremental decoding): against
// the naive softmax over the whole sequence, and bit for bit the same rows as one call with
// every query (each query row visits the same key tiles in both). T = 1 (a decoded token),
// T = 5 (several new tokens), T = S; keys straddling tiles; GQA.
TEST(Attention, LastQueriesOverLongerKeys) {
  const int64_t B = 2, S = 41, N = 4, M = 2, H = 8;
  const Tensor q64 = random_f64({B, S, N, H}, 21, 0.1, 0.8), k64 = random_f64({B, S, M, H}, 22, -0.1, 0.8),
               v64 = random_f64({B, S, M, H}, 23, 0.2, 1.5);
  Tensor ref, ref_lse;
  naive(ref, ref_lse, q64, k64, v64, true);
  AttentionOptions o;
  o.block_queries = 16;
  o.block_keys = 11;
  for (DType dt : {DType::kF32, DType::kF64}) {
    const Tensor q_all = testing::to_dtype(q64, dt), k = testing::to_dtype(k64, dt), v = testing::to_dtype(v64, dt);
    Tensor all = Tensor::empty(q_all.shape(), dt), all_lse = Tensor::empty({B, N, S}, stats_dtype(dt));
    cpu::attention_forward(all, all_lse, q_all, k, v, o);
    for (int64_t T : {int64_t{1}, int64_t{5}, S}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " T=" + std::to_string(T) + " S=" + std::to_string(S));
      const Tensor q = contiguous(q_all.slice(1, S - T, S));
      Tensor out = Tensor::empty(q.shape(), dt), lse = Tensor::empty({B, N, T}, stats_dtype(dt));
      cpu::attention_forward(out, lse, q, k, v, o);
      EXPECT_TRUE(testing::all_close(out, contiguous(ref.slice(1, S - T, S)), testing::kCpuF32VsF64));
      const Tensor rows = contiguous(all.slice(1, S - T, S));
      EXPECT_EQ(std::memcmp(out.raw_data(), rows.raw_data(), out.nbytes()), 0) << "rows of the full call";
      for (int64_t b = 0; b < B; ++b)
        for (int64_t n = 0; n < N; ++n) {
          const Tensor want = contiguous(all_lse.slice(0, b, b + 1).slice(1, n, n + 1).slice(2, S - T, S));
          const Tensor got = contiguous(lse.slice(0, b, b + 1).slice(1, n, n + 1));
          EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()), 0) << "lse b" << b << " n" << n;
        }
    }
  }
  Tensor q = Tensor::zeros({1, 4, 2, 8}, DType::kF32), k = Tensor::zeros({1, 3, 2, 8}, DType::kF32);
  Tensor out = Tensor::zeros({1, 4, 2, 8}, DType::kF32), lse = Tensor::zeros({1, 2, 4}, DType::kF32);
  EXPECT_TRUE(throws_with([&] { cpu::attention_forward(out, lse, q, k, k, {}); }, "3 key positions for 4 queries"));
}

// attention_merge: the attentions of the same queries over two disjoint sets of keys (here the
// first S1 and the last S - S1 of S keys, no mask), merged by their log-sum-exp, are the
// attention over all S keys against the naive f64 softmax; a row with lse -inf (no keys yet)
// takes the part as it is, so merging into (0, -inf) copies. Ring attention's step.
TEST(Attention, MergeOfDisjointKeysIsTheAttentionOverAll) {
  const int64_t B = 2, T = 5, S = 19, N = 4, M = 2, H = 8;
  const Tensor q64 = random_f64({B, T, N, H}, 31, 0.1, 0.8), k64 = random_f64({B, S, M, H}, 32, -0.1, 0.8),
               v64 = random_f64({B, S, M, H}, 33, 0.2, 1.5);
  Tensor ref, ref_lse;
  naive_masked(ref, ref_lse, q64, k64, v64, [](int64_t, int64_t, int64_t) { return true; });
  AttentionOptions o;
  o.causal = false;
  for (DType dt : {DType::kF32, DType::kF64}) {
    for (int64_t S1 : {T, int64_t{9}, S - T}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " S1=" + std::to_string(S1));
      const Tensor q = to_dtype(q64, dt), k = to_dtype(k64, dt), v = to_dtype(v64, dt);
      // the parts: keys [0, S1) and [S1, S), each as its own key set (at least T keys each)
      auto part = [&](int64_t k0, int64_t k1, Tensor& out, Tensor& lse) {
        out = Tensor::empty(q.shape(), dt);
        lse = Tensor::empty({B, N, T}, stats_dtype(dt));
        attention_forward(out, lse, q, contiguous(k.slice(1, k0, k1)), contiguous(v.slice(1, k0, k1)), o);
      };
      Tensor out, lse, out2, lse2;
      part(0, S1, out, lse);
      part(S1, S, out2, lse2);
      // into an empty accumulator: a copy
      Tensor acc = Tensor::zeros(q.shape(), dt), acc_lse = Tensor::empty({B, N, T}, stats_dtype(dt));
      fill(acc_lse, -INFINITY);
      attention_merge(acc, acc_lse, out, lse);
      EXPECT_EQ(std::memcmp(acc.raw_data(), out.raw_data(), out.nbytes()), 0);
      EXPECT_EQ(std::memcmp(acc_lse.raw_data(), lse.raw_data(), lse.nbytes()), 0);
      attention_merge(acc, acc_lse, out2, lse2);
      EXPECT_TRUE(testing::all_close(acc, ref, testing::kCpuF32VsF64));
      EXPECT_TRUE(testing::all_close(acc_lse, ref_lse, testing::kCpuF32VsF64));
    }
  }
  Tensor a = Tensor::zeros({1, 4, 2, 8}, DType::kF32), l = Tensor::zeros({1, 2, 4}, DType::kF32);
  const Tensor wrong = Tensor::zeros({1, 2, 3}, DType::kF32);
  EXPECT_TRUE(throws_with([&] { attention_merge(a, l, a, wrong); }, "part_lse_BNT"));
}

// The KV cache step with its position in memory: the new rows land in the cache at the
// position, the rows around them are untouched, and the output is the forward over the
// cache's first p + T rows, bit for bit.
TEST(Attention, KvCacheStepWritesTheRowsAndAttendsOverThem) {
  const int64_t B = 2, C = 20, N = 4, M = 2, H = 8;
  for (const auto& [p, T] : {std::pair<int64_t, int64_t>{0, 1}, {7, 1}, {12, 3}, {19, 1}}) {
    SCOPED_TRACE("p=" + std::to_string(p) + " T=" + std::to_string(T));
    Tensor cache_k = random_f64({B, C, M, H}, 31, 0.0, 1.0), cache_v = random_f64({B, C, M, H}, 32, 0.0, 1.0);
    const Tensor before_k = contiguous(cache_k), before_v = contiguous(cache_v);
    const Tensor q = random_f64({B, T, N, H}, 33, 0.0, 1.0), k = random_f64({B, T, M, H}, 34, 0.0, 1.0),
                 v = random_f64({B, T, M, H}, 35, 0.0, 1.0);
    Tensor position = Tensor::empty({1}, DType::kI32);
    position.data<int32_t>()[0] = static_cast<int32_t>(p);
    Tensor out = Tensor::empty({B, T, N, H}, DType::kF64), lse = Tensor::empty({B, N, T}, DType::kF64);
    cpu::attention_forward_kv_cache(out, lse, cache_k, cache_v, q, k, v, position, {});
    // the expected keys: the old cache's first p rows, then the new ones
    Tensor keys = Tensor::empty({B, p + T, M, H}, DType::kF64), values = Tensor::empty({B, p + T, M, H}, DType::kF64);
    for (auto [dst, old, add] : {std::tuple{&keys, &before_k, &k}, std::tuple{&values, &before_v, &v}}) {
      Tensor head = dst->slice(1, 0, p), tail = dst->slice(1, p, p + T);
      copy(head, old->slice(1, 0, p));
      copy(tail, *add);
    }
    Tensor want = Tensor::empty({B, T, N, H}, DType::kF64), want_lse = Tensor::empty({B, N, T}, DType::kF64);
    cpu::attention_forward(want, want_lse, q, keys, values, {});
    EXPECT_EQ(std::memcmp(out.raw_data(), want.raw_data(), out.nbytes()), 0);
    EXPECT_EQ(std::memcmp(lse.raw_data(), want_lse.raw_data(), lse.nbytes()), 0);
    const Tensor rows = contiguous(cache_k.slice(1, 0, p + T)), rest = contiguous(cache_v.slice(1, p + T, C)),
                 old_rest = contiguous(before_v.slice(1, p + T, C));
    EXPECT_EQ(std::memcmp(rows.raw_data(), keys.raw_data(), rows.nbytes()), 0) << "rows 0 .. p + T of the keys";
    if (rest.nbytes() > 0) {  // none past the cache's end
      EXPECT_EQ(std::memcmp(rest.raw_data(), old_rest.raw_data(), rest.nbytes()), 0) << "values past p + T";
    }
  }
  Tensor q = Tensor::zeros({1, 2, 2, 8}, DType::kF32), k = Tensor::zeros({1, 2, 1, 8}, DType::kF32);
  Tensor cache = Tensor::zeros({1, 5, 1, 8}, DType::kF32), cache_v = Tensor::zeros({1, 5, 1, 8}, DType::kF32);
  Tensor out = Tensor::zeros({1, 2, 2, 8}, DType::kF32), lse = Tensor::zeros({1, 2, 2}, DType::kF32);
  Tensor position = Tensor::empty({1}, DType::kI32);
  position.data<int32_t>()[0] = 4;
  EXPECT_TRUE(throws_with([&] { cpu::attention_forward_kv_cache(out, lse, cache, cache_v, q, k, k, position, {}); },
                          "2 new positions after 4 exceed the cache's 5"));
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  for (const Case& c : {Case{1, 7, 4, 2, 6, 4, true}, Case{2, 5, 4, 1, 4, 2, true}, Case{1, 6, 2, 2, 4, 4, false}}) {
    Tensor q = random_f64({c.B, c.T, c.N, c.H}, 4, 0.1, 0.8), k = random_f64({c.B, c.T, c.M, c.H}, 5, -0.1, 0.8),
           v = random_f64({c.B, c.T, c.M, c.H}, 6, 0.2, 1.5);
    const Tensor dout = random_f64(q.shape(), 7);
    AttentionOptions o;
    o.causal = c.causal;
    o.block_queries = c.block;
    o.block_keys = c.block - 1;
    Tensor out = Tensor::empty(q.shape(), DType::kF64), lse = Tensor::empty({c.B, c.N, c.T}, DType::kF64);
    cpu::attention_forward(out, lse, q, k, v, o);
    Tensor dq = random_f64(q.shape(), 8), dk = random_f64(k.shape(), 9), dv = random_f64(v.shape(), 10);  // overwritten
    cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, o);
    std::ostringstream name;
    PrintTo(c, &name);
    SCOPED_TRACE(name.str());
    expect_gradients({{"q", &q, dq}, {"k", &k, dk}, {"v", &v, dv}}, [&] {
      cpu::attention_forward(out, lse, q, k, v, o);
      return testing::dot(dout, out);
    });
  }
}

// Gemma 2's soft-capped scores (softcap · tanh(s / softcap) before the softmax): the forward
// against the brute force with the cap, over as many keys as queries and over a longer cache,
// and the backward against finite differences.
TEST(Attention, SoftcappedScores) {
  const int64_t B = 2, T = 6, N = 4, M = 2, H = 4;
  // scores up to ~10 before the cap of 2: far into tanh's curve
  Tensor q = random_f64({B, T, N, H}, 31, 0.5, 3.0), k = random_f64({B, T, M, H}, 32, -0.3, 3.0),
         v = random_f64({B, T, M, H}, 33, 0.2, 1.5);
  AttentionOptions o;
  o.softcap = 2.0;
  o.block_queries = 4;
  o.block_keys = 3;
  Tensor out = Tensor::empty(q.shape(), DType::kF64), lse = Tensor::empty({B, N, T}, DType::kF64);
  cpu::attention_forward(out, lse, q, k, v, o);
  Tensor want, want_lse;
  naive_masked(want, want_lse, q, k, v, [](int64_t, int64_t position, int64_t j) { return j <= position; }, 2.0);
  EXPECT_TRUE(testing::all_close(out, want, testing::kCpuF32VsF64));
  EXPECT_TRUE(testing::all_close(lse, want_lse, testing::kCpuF32VsF64));
  Tensor uncapped, uncapped_lse;
  naive(uncapped, uncapped_lse, q, k, v, true);
  EXPECT_FALSE(testing::all_close(out, uncapped, {1e-3, 1e-3, 1e-3})) << "the cap changes the output";
  // the last 2 queries over all 6 keys (a KV cache's step)
  Tensor out2 = Tensor::empty({B, 2, N, H}, DType::kF64), lse2 = Tensor::empty({B, N, 2}, DType::kF64);
  cpu::attention_forward(out2, lse2, contiguous(q.slice(1, T - 2, T)), k, v, o);
  EXPECT_TRUE(testing::all_close(out2, contiguous(want.slice(1, T - 2, T)), testing::kCpuF32VsF64));
  const Tensor dout = random_f64(q.shape(), 34);
  Tensor dq = random_f64(q.shape(), 35), dk = random_f64(k.shape(), 36), dv = random_f64(v.shape(), 37);
  cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, o);
  expect_gradients({{"q", &q, dq}, {"k", &k, dk}, {"v", &v, dv}}, [&] {
    cpu::attention_forward(out, lse, q, k, v, o);
    return testing::dot(dout, out);
  });
}

// q, k, v as head slices of one stacked [B, T, N + 2M, H] tensor (the model's q|k|v product),
// dq, dk, dv as slices of another: the same bits as on contiguous copies.
TEST(Attention, HeadSlicesOfStackedTensors) {
  const int64_t B = 2, T = 9, N = 4, M = 2, H = 6, E = N + 2 * M;
  const Tensor qkv = random_f64({B, T, E, H}, 11);
  const Tensor q = qkv.slice(2, 0, N), k = qkv.slice(2, N, N + M), v = qkv.slice(2, N + M, E);
  const Tensor dout = random_f64({B, T, N, H}, 12);
  Tensor out = Tensor::empty({B, T, N, H}, DType::kF64), lse = Tensor::empty({B, N, T}, DType::kF64);
  Tensor out_ref = Tensor::empty(out.shape(), DType::kF64), lse_ref = Tensor::empty(lse.shape(), DType::kF64);
  cpu::attention_forward(out, lse, q, k, v, {});
  cpu::attention_forward(out_ref, lse_ref, contiguous(q), contiguous(k), contiguous(v), {});
  EXPECT_EQ(std::memcmp(out.raw_data(), out_ref.raw_data(), out.nbytes()), 0);
  Tensor dqkv = Tensor::zeros({B, T, E, H}, DType::kF64);
  Tensor dq = dqkv.slice(2, 0, N), dk = dqkv.slice(2, N, N + M), dv = dqkv.slice(2, N + M, E);
  Tensor dq_ref = Tensor::empty(q.shape(), DType::kF64), dk_ref = Tensor::empty(k.shape(), DType::kF64),
         dv_ref = Tensor::empty(v.shape(), DType::kF64);
  cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, {});
  cpu::attention_backward(dq_ref, dk_ref, dv_ref, dout, contiguous(q), contiguous(k), contiguous(v), out, lse, {});
  for (auto [got, want] : {std::pair<Tensor*, Tensor*>{&dq, &dq_ref}, {&dk, &dk_ref}, {&dv, &dv_ref}})
    EXPECT_EQ(std::memcmp(contiguous(*got).raw_data(), want->raw_data(), want->nbytes()), 0);
}

struct Outputs {
  Tensor out, lse, dq, dk, dv;
};
// The f64 CPU forward and backward of q, k, v with `dout`.
Outputs forward_and_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                             const AttentionOptions& o) {
  Outputs r{Tensor::empty(q.shape(), DType::kF64), Tensor::empty({q.size(0), q.size(2), q.size(1)}, DType::kF64),
            Tensor::empty(q.shape(), DType::kF64), Tensor::empty(k.shape(), DType::kF64),
            Tensor::empty(v.shape(), DType::kF64)};
  cpu::attention_forward(r.out, r.lse, q, k, v, o);
  cpu::attention_backward(r.dq, r.dk, r.dv, dout, q, k, v, r.out, r.lse, o);
  return r;
}

// Packed documents: each document's rows of out, lse, dq, dk and dv are those of the document
// run alone as a sequence of its own (f64; tiles fall elsewhere, so equal up to rounding).
TEST(Attention, PackedDocumentsAttendAsSeparateSequences) {
  const std::vector<std::vector<int64_t>> rows = {{4, 1, 6}, {11}, {2, 9}};
  const int64_t B = 3, T = 11, N = 4, M = 2, H = 6;
  const Tensor q = random_f64({B, T, N, H}, 21, 0.1, 0.8), k = random_f64({B, T, M, H}, 22, -0.1, 0.8),
               v = random_f64({B, T, M, H}, 23, 0.2, 1.5), dout = random_f64({B, T, N, H}, 24);
  const PackedDocuments docs = pack_documents(testing::document_positions(rows), Device::cpu());
  EXPECT_EQ(docs.count, 6);
  EXPECT_EQ(docs.capacity, 8);
  EXPECT_EQ(docs.longest, 11);  // the longest document (11) rounded up to a power of two, at most T
  AttentionOptions o;
  o.block_queries = 4;
  o.block_keys = 3;
  o.documents = &docs;
  auto [out, lse, dq, dk, dv] = forward_and_backward(q, k, v, dout, o);
  Tensor whole_out = Tensor::empty(q.shape(), DType::kF64), whole_lse = Tensor::empty({B, N, T}, DType::kF64);
  AttentionOptions plain = o;
  plain.documents = nullptr;
  cpu::attention_forward(whole_out, whole_lse, q, k, v, plain);
  double differs = 0;  // the mask must matter: later documents' rows differ from plain causal ones
  for (int64_t b = 0; b < B; ++b) {
    int64_t t0 = 0;
    for (int64_t len : rows[static_cast<size_t>(b)]) {
      SCOPED_TRACE("row " + std::to_string(b) + ", document at " + std::to_string(t0));
      auto part = [&](const Tensor& x) { return contiguous(x.slice(0, b, b + 1).slice(1, t0, t0 + len)); };
      const Outputs alone = forward_and_backward(part(q), part(k), part(v), part(dout), plain);
      const testing::Tolerance tight{1e-12, 1e-12, 1e-12};
      EXPECT_TRUE(testing::all_close(part(out), alone.out, tight)) << "out";
      EXPECT_TRUE(testing::all_close(contiguous(lse.slice(0, b, b + 1).slice(2, t0, t0 + len)), alone.lse, tight))
          << "lse";
      EXPECT_TRUE(testing::all_close(part(dq), alone.dq, tight)) << "dq";
      EXPECT_TRUE(testing::all_close(part(dk), alone.dk, tight)) << "dk";
      EXPECT_TRUE(testing::all_close(part(dv), alone.dv, tight)) << "dv";
      const Tensor wo = part(whole_out);
      for (int64_t i = 0; i < wo.numel(); ++i)
        differs = std::max(differs, std::abs(wo.data<double>()[i] - alone.out.data<double>()[i]));
      t0 += len;
    }
  }
  EXPECT_GT(differs, 1e-3);
}

TEST(Attention, PackedDocumentsBackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 7, N = 4, M = 2, H = 4;
  Tensor q = random_f64({B, T, N, H}, 31, 0.1, 0.8), k = random_f64({B, T, M, H}, 32, -0.1, 0.8),
         v = random_f64({B, T, M, H}, 33, 0.2, 1.5);
  const Tensor dout = random_f64(q.shape(), 34);
  const PackedDocuments docs = pack_documents(testing::document_positions({{3, 4}, {1, 2, 4}}), Device::cpu());
  AttentionOptions o;
  o.block_queries = 3;
  o.block_keys = 2;
  o.documents = &docs;
  auto [out, lse, dq, dk, dv] = forward_and_backward(q, k, v, dout, o);
  expect_gradients({{"q", &q, dq}, {"k", &k, dk}, {"v", &v, dv}}, [&] {
    cpu::attention_forward(out, lse, q, k, v, o);
    return testing::dot(dout, out);
  });
}

// Key spans: row b's first queries[b] queries see the keys from first_key[b] on, against the
// masked softmax; the other queries give output 0 and log-sum-exp -inf, and no gradient; the
// backward against finite differences.
TEST(Attention, KeySpansSeeTheirKeysOnly) {
  const int64_t B = 4, T = 9, N = 4, M = 2, H = 6;
  const std::vector<int64_t> queries = {5, 0, T, 3}, first = {3, 0, 0, T};  // rows 1 and 3 see nothing
  Tensor q = random_f64({B, T, N, H}, 41, 0.1, 0.8), k = random_f64({B, T, M, H}, 42, -0.1, 0.8),
         v = random_f64({B, T, M, H}, 43, 0.2, 1.5);
  const Tensor dout = random_f64(q.shape(), 44);
  const KeySpans spans = key_spans(queries, first, T, T, Device::cpu());
  AttentionOptions o;
  o.causal = false;
  o.block_queries = 4;
  o.block_keys = 2;
  o.spans = &spans;
  auto [out, lse, dq, dk, dv] = forward_and_backward(q, k, v, dout, o);
  const auto sees = [&](int64_t b, int64_t i) { return i < queries[static_cast<size_t>(b)] && first[static_cast<size_t>(b)] < T; };
  Tensor ref, ref_lse;
  naive_masked(ref, ref_lse, q, k, v, [&](int64_t b, int64_t i, int64_t j) {
    return sees(b, i) && j >= first[static_cast<size_t>(b)];
  });
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < T; ++i) {
        SCOPED_TRACE("row " + std::to_string(b) + ", head " + std::to_string(n) + ", query " + std::to_string(i));
        const double l = lse.data<double>()[(b * N + n) * T + i];
        if (!sees(b, i)) {
          EXPECT_EQ(l, -INFINITY);
        } else {
          EXPECT_NEAR(l, ref_lse.data<double>()[(b * N + n) * T + i], 1e-12);
        }
        for (int64_t h = 0; h < H; ++h) {
          const int64_t e = ((b * T + i) * N + n) * H + h;
          EXPECT_NEAR(out.data<double>()[e], sees(b, i) ? ref.data<double>()[e] : 0.0, 1e-12);
          if (!sees(b, i)) {
            EXPECT_EQ(dq.data<double>()[e], 0.0);
          }
        }
      }
  expect_gradients({{"q", &q, dq}, {"k", &k, dk}, {"v", &v, dv}}, [&] {
    cpu::attention_forward(out, lse, q, k, v, o);
    return testing::dot(dout, out);
  });
  // refused: with the causal mask, and bounds outside the block
  o.causal = true;
  EXPECT_TRUE(throws_with([&] { cpu::attention_forward(out, lse, q, k, v, o); }, "key spans take no causal mask"));
  EXPECT_TRUE(throws_with([&] { (void)key_spans({T + 1}, {0}, T, T, Device::cpu()); }, "row 0 has 10 queries"));
  EXPECT_TRUE(throws_with([&] { (void)key_spans({1}, {T + 1}, T, T, Device::cpu()); }, "row 0 sees keys from 10"));
}

// transformers' sliding-window mask: causal, and key j > position - window
Mask window_mask(int64_t window) {
  return [window](int64_t, int64_t i, int64_t j) { return j <= i && j > i - window; };
}

// Sliding windows smaller than, equal to and larger than T, with tiles that straddle the
// window's edge, against the masked softmax; a window of T or more is plain causal attention
// bit for bit, a smaller one is not.
TEST(Attention, SlidingWindowMatchesMaskedSoftmax) {
  const int64_t B = 2, T = 37, N = 4, M = 2, H = 8;
  const Tensor q64 = random_f64({B, T, N, H}, 51, 0.1, 0.8), k64 = random_f64({B, T, M, H}, 52, -0.1, 0.8),
               v64 = random_f64({B, T, M, H}, 53, 0.2, 1.5);
  for (const int64_t window : {int64_t{1}, int64_t{5}, int64_t{16}, int64_t{36}, T, int64_t{50}}) {
    Tensor ref, ref_lse;
    naive_masked(ref, ref_lse, q64, k64, v64, window_mask(window));
    for (const auto& [bq, bk] : {std::pair<int64_t, int64_t>{16, 11}, {4, 3}, {64, 64}}) {
      for (DType dt : {DType::kF32, DType::kF64}) {
        SCOPED_TRACE("window " + std::to_string(window) + ", tiles " + std::to_string(bq) + "x" + std::to_string(bk) +
                     ", " + std::string(dtype_name(dt)));
        const Tensor q = testing::to_dtype(q64, dt), k = testing::to_dtype(k64, dt), v = testing::to_dtype(v64, dt);
        AttentionOptions o;
        o.block_queries = bq;
        o.block_keys = bk;
        o.window = window;
        Tensor out = Tensor::empty(q.shape(), dt), lse = Tensor::empty({B, N, T}, stats_dtype(dt));
        cpu::attention_forward(out, lse, q, k, v, o);
        EXPECT_TRUE(testing::all_close(out, ref, testing::kCpuF32VsF64)) << "out";
        EXPECT_TRUE(testing::all_close(lse, ref_lse, testing::kCpuF32VsF64)) << "lse";
        AttentionOptions causal = o;
        causal.window = 0;
        Tensor plain = Tensor::empty(q.shape(), dt), plain_lse = Tensor::empty({B, N, T}, stats_dtype(dt));
        cpu::attention_forward(plain, plain_lse, q, k, v, causal);
        const bool same = std::memcmp(out.raw_data(), plain.raw_data(), out.nbytes()) == 0;
        EXPECT_EQ(same, window >= T) << "a window of T or more keys is plain causal attention, a smaller one not";
      }
    }
  }
}

// With packed documents the window cuts inside a document and the document's start cuts the
// window: both masks at once, forward against the masked softmax.
TEST(Attention, SlidingWindowWithPackedDocuments) {
  const std::vector<std::vector<int64_t>> rows = {{4, 1, 9}, {14}, {2, 12}};
  const int64_t B = 3, T = 14, N = 4, M = 1, H = 6;
  const Tensor q = random_f64({B, T, N, H}, 61, 0.1, 0.8), k = random_f64({B, T, M, H}, 62, -0.1, 0.8),
               v = random_f64({B, T, M, H}, 63, 0.2, 1.5);
  const Tensor positions = testing::document_positions(rows);
  const PackedDocuments docs = pack_documents(positions, Device::cpu());
  for (const int64_t window : {int64_t{1}, int64_t{3}, int64_t{6}, T}) {
    SCOPED_TRACE("window " + std::to_string(window));
    Tensor ref, ref_lse;
    naive_masked(ref, ref_lse, q, k, v, [&](int64_t b, int64_t i, int64_t j) {
      const int64_t doc_start = i - positions.data<int32_t>()[b * T + i];
      return j <= i && j > i - window && j >= doc_start;
    });
    AttentionOptions o;
    o.block_queries = 4;
    o.block_keys = 3;
    o.documents = &docs;
    o.window = window;
    Tensor out = Tensor::empty(q.shape(), DType::kF64), lse = Tensor::empty({B, N, T}, DType::kF64);
    cpu::attention_forward(out, lse, q, k, v, o);
    EXPECT_TRUE(testing::all_close(out, ref, {1e-12, 1e-12, 1e-12})) << "out";
    EXPECT_TRUE(testing::all_close(lse, ref_lse, {1e-12, 1e-12, 1e-12})) << "lse";
  }
}

// The backward of a sliding window (with and without documents, window below, at and above T)
// against finite differences.
TEST(Attention, SlidingWindowBackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 7, N = 4, M = 2, H = 4;
  const PackedDocuments docs = pack_documents(testing::document_positions({{3, 4}, {1, 6}}), Device::cpu());
  for (const bool with_docs : {false, true})
    for (const int64_t window : {int64_t{1}, int64_t{2}, int64_t{4}, T, int64_t{9}}) {
      SCOPED_TRACE("window " + std::to_string(window) + (with_docs ? " with documents" : ""));
      Tensor q = random_f64({B, T, N, H}, 71, 0.1, 0.8), k = random_f64({B, T, M, H}, 72, -0.1, 0.8),
             v = random_f64({B, T, M, H}, 73, 0.2, 1.5);
      const Tensor dout = random_f64(q.shape(), 74);
      AttentionOptions o;
      o.block_queries = 3;
      o.block_keys = 2;
      o.window = window;
      o.documents = with_docs ? &docs : nullptr;
      auto [out, lse, dq, dk, dv] = forward_and_backward(q, k, v, dout, o);
      expect_gradients({{"q", &q, dq}, {"k", &k, dk}, {"v", &v, dv}}, [&] {
        cpu::attention_forward(out, lse, q, k, v, o);
        return testing::dot(dout, out);
      });
    }
}

// The last T queries over S keys (incremental decoding) with a window: the masked softmax, and
// bit for bit the rows of the full call; the KV cache step gives the same rows.
TEST(Attention, SlidingWindowOverLongerKeysAndKvCache) {
  const int64_t B = 2, S = 41, N = 4, M = 2, H = 8, window = 9;
  const Tensor q_all = random_f64({B, S, N, H}, 81, 0.1, 0.8), k = random_f64({B, S, M, H}, 82, -0.1, 0.8),
               v = random_f64({B, S, M, H}, 83, 0.2, 1.5);
  AttentionOptions o;
  o.block_queries = 16;
  o.block_keys = 5;
  o.window = window;
  Tensor all = Tensor::empty(q_all.shape(), DType::kF64), all_lse = Tensor::empty({B, N, S}, DType::kF64);
  cpu::attention_forward(all, all_lse, q_all, k, v, o);
  for (int64_t T : {int64_t{1}, int64_t{3}, int64_t{12}}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    const Tensor q = contiguous(q_all.slice(1, S - T, S));
    Tensor ref, ref_lse;
    naive_masked(ref, ref_lse, q, k, v, window_mask(window));
    Tensor out = Tensor::empty(q.shape(), DType::kF64), lse = Tensor::empty({B, N, T}, DType::kF64);
    cpu::attention_forward(out, lse, q, k, v, o);
    EXPECT_TRUE(testing::all_close(out, ref, {1e-12, 1e-12, 1e-12}));
    const Tensor rows = contiguous(all.slice(1, S - T, S));
    EXPECT_EQ(std::memcmp(out.raw_data(), rows.raw_data(), out.nbytes()), 0) << "rows of the full call";
    // the cache holds the first S - T positions' keys and values; the step adds the last T
    Tensor cache_k = Tensor::zeros({B, S + 4, M, H}, DType::kF64);
    Tensor cache_v = Tensor::zeros({B, S + 4, M, H}, DType::kF64);
    Tensor head_k = cache_k.slice(1, 0, S - T), head_v = cache_v.slice(1, 0, S - T);
    copy(head_k, k.slice(1, 0, S - T));
    copy(head_v, v.slice(1, 0, S - T));
    Tensor position = Tensor::empty({1}, DType::kI32);
    position.data<int32_t>()[0] = static_cast<int32_t>(S - T);
    Tensor step = Tensor::empty(q.shape(), DType::kF64), step_lse = Tensor::empty({B, N, T}, DType::kF64);
    cpu::attention_forward_kv_cache(step, step_lse, cache_k, cache_v, q, contiguous(k.slice(1, S - T, S)),
                                    contiguous(v.slice(1, S - T, S)), position, o);
    EXPECT_EQ(std::memcmp(step.raw_data(), rows.raw_data(), step.nbytes()), 0) << "the KV cache step";
  }
}

TEST(Attention, SlidingWindowPairsAndFlops) {
  for (const auto& [T, S] : {std::pair<int64_t, int64_t>{1, 1}, {7, 7}, {3, 10}, {1, 12}, {16, 16}})
    for (const int64_t window : {int64_t{0}, int64_t{1}, int64_t{4}, int64_t{7}, int64_t{20}}) {
      double pairs = 0;
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < S; ++j) pairs += window_mask(window > 0 ? window : S + 1)(0, i + S - T, j) ? 1 : 0;
      EXPECT_EQ(causal_attention_pairs(T, S, window), pairs) << "T " << T << " S " << S << " window " << window;
    }
  const Tensor q = Tensor::zeros({2, 16, 4, 8}, DType::kF32), k = Tensor::zeros({2, 16, 2, 8}, DType::kF32);
  AttentionOptions o;
  o.window = 4;  // 1 + 2 + 3 + 4 + 12·4 = 58 of the 256 pairs
  EXPECT_DOUBLE_EQ(attention_forward_flops(q, k, o), 4.0 * 2 * 4 * 8 * 58);
}

TEST(Attention, SlidingWindowErrors) {
  const Tensor q = random_f64({1, 4, 2, 4}, 91), kv = random_f64({1, 4, 1, 4}, 92);
  Tensor out = Tensor::empty(q.shape(), DType::kF64), lse = Tensor::empty({1, 2, 4}, DType::kF64);
  AttentionOptions o;
  o.window = -1;
  EXPECT_TRUE(throws_with([&] { cpu::attention_forward(out, lse, q, kv, kv, o); },
                          "sliding window must be >= 0 keys (0: none), found -1"));
  o.window = 2;
  o.causal = false;
  EXPECT_TRUE(throws_with([&] { cpu::attention_forward(out, lse, q, kv, kv, o); },
                          "a sliding window of 2 keys needs a causal mask"));
}

// The CPU twin of the FP8 forward: q, k and v rounded in place to the values ops/fp8.h's
// per-tensor quantisation gives them (its codes, dequantised), the output the exact attention
// over the rounded values rounded once to e4m3 at twice v's dequantisation factor.
TEST(Attention, Fp8TwinRoundsAsTheFp8QuantisationAndRoundsTheOutputOnce) {
  const int64_t B = 2, T = 40, N = 4, M = 2, H = 16;
  const Tensor q0 = random_f64({B, T, N, H}, 31, 0.0, 3.0), k0 = random_f64({B, T, M, H}, 32, 0.0, 0.5),
               v0 = random_f64({B, T, M, H}, 33, 0.2, 1.0);
  Tensor q = to_dtype(q0, DType::kF32), k = to_dtype(k0, DType::kF32), v = to_dtype(v0, DType::kF32);
  const Tensor q_in = to_dtype(q0, DType::kF32), k_in = to_dtype(k0, DType::kF32), v_in = to_dtype(v0, DType::kF32);
  Tensor out = Tensor::empty({B, T, N, H}, DType::kF32), lse = Tensor::empty({B, N, T}, DType::kF32);
  const Fp8AttentionScales s = cpu::attention_forward_fp8(out, lse, q, k, v, {});
  for (auto [rounded, input, scale, name] : {std::tuple{&q, &q_in, s.q, "q"}, std::tuple{&k, &k_in, s.k, "k"},
                                             std::tuple{&v, &v_in, s.v, "v"}}) {
    Fp8Operand op;
    cpu::fp8_quantize(&op, nullptr, input->view(Shape{input->numel() / H, H}), {});
    EXPECT_EQ(op.scale.data<float>()[0], scale) << name;
    Tensor values = Tensor::empty({input->numel() / H, H}, DType::kF32);
    cpu::fp8_dequantize(values, op);
    EXPECT_EQ(std::memcmp(values.raw_data(), rounded->raw_data(), values.nbytes()), 0) << name;
  }
  EXPECT_EQ(s.out, 2 * s.v);
  Tensor exact = Tensor::empty(out.shape(), DType::kF32), exact_lse = Tensor::empty(lse.shape(), DType::kF32);
  cpu::attention_forward(exact, exact_lse, q, k, v, {});
  EXPECT_EQ(std::memcmp(lse.raw_data(), exact_lse.raw_data(), lse.nbytes()), 0);
  int64_t rounded_once = 0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    const float x = exact.data<float>()[i], factor = 1.0f / s.out;
    rounded_once += out.data<float>()[i] == fp8_to_float(float_to_fp8(x * factor, DType::kF8E4M3), DType::kF8E4M3) / factor;
  }
  EXPECT_EQ(rounded_once, out.numel());
  // the rounding is real: some q values moved, and the output is not the exact one
  EXPECT_NE(std::memcmp(q.raw_data(), q_in.raw_data(), q.nbytes()), 0);
  EXPECT_NE(std::memcmp(out.raw_data(), exact.raw_data(), out.nbytes()), 0);
  Tensor documents_out = Tensor::empty(out.shape(), DType::kF32);
  AttentionOptions windowed;
  windowed.window = 4;
  EXPECT_THROW(cpu::attention_forward_fp8(documents_out, lse, q, k, v, windowed), Error);
}

TEST(Attention, DocumentPositionsRestartAtBosAndAreChecked) {
  Tensor ids = Tensor::empty({2, 6}, DType::kI32);
  const int32_t values[] = {5, 1, 7, 1, 1, 3,  /**/ 1, 4, 4, 4, 1, 2};  // BOS = 1
  std::memcpy(ids.raw_data(), values, sizeof(values));
  const Tensor pos = document_positions(ids, 1);
  const int32_t want[] = {0, 0, 1, 0, 0, 1, /**/ 0, 1, 2, 3, 0, 1};
  EXPECT_EQ(std::memcmp(pos.raw_data(), want, sizeof(want)), 0);
  const PackedDocuments d = pack_documents(pos, Device::cpu());
  EXPECT_EQ(d.count, 6);  // the first row's first token starts a document though it is no BOS
  EXPECT_EQ(d.capacity, 8);
  EXPECT_EQ(d.longest, 6);  // 4 tokens: at least 64, at most T
  EXPECT_FALSE(d.segment_starts_S1.defined());  // only CUDA reads segments
  Tensor bad = pos;
  bad.data<int32_t>()[9] = 5;
  EXPECT_TRUE(throws_with([&] { pack_documents(bad, Device::cpu()); },
                          "position 5 at row 1, token 3 neither starts a document (0) nor follows the one before it"));
  bad.data<int32_t>()[9] = 3;
  bad.data<int32_t>()[6] = 2;
  EXPECT_TRUE(throws_with([&] { pack_documents(bad, Device::cpu()); }, "(a row starts at 0)"));
  // documents need the causal mask and as many keys as queries
  const Tensor q = random_f64({2, 6, 2, 4}, 41), kv = random_f64({2, 6, 1, 4}, 42);
  Tensor out = Tensor::empty(q.shape(), DType::kF64), lse = Tensor::empty({2, 2, 6}, DType::kF64);
  AttentionOptions o;
  o.documents = &d;
  o.causal = false;
  EXPECT_TRUE(throws_with([&] { cpu::attention_forward(out, lse, q, kv, kv, o); }, "need a causal mask"));
}

TEST(Attention, ErrorsNameTheArgument) {
  Tensor q = Tensor::zeros({1, 4, 6, 8}, DType::kF32), k = Tensor::zeros({1, 4, 4, 8}, DType::kF32);
  Tensor out = Tensor::zeros({1, 4, 6, 8}, DType::kF32), lse = Tensor::zeros({1, 6, 4}, DType::kF32);
  EXPECT_TRUE(throws_with([&] { cpu::attention_forward(out, lse, q, k, k, {}); }, "must divide query heads (6)"));
}

}  // namespace
}  // namespace shardtrain::ops
