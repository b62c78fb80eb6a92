// CUDA attention (cuDNN flash attention) against the CPU twin computed in f64 on the same
// bf16-rounded inputs: causal and not, GQA groups 1/2/4/8, head dims 64 and 128, odd and
// aligned lengths, forward output, log-sum-exp and all three input gradients (the default
// and the deterministic backward), and the deterministic backward's bitwise repetition. The f32
// kernels (f32 check runs) are held to f32 error on the same cases and on odd head dims, and
// the KV-cache kernel (S > T keys) to the CPU twin's S > T forward; each also with soft-capped
// scores (Gemma 2), cuDNN's through its score modifier. Skips without a device.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "ops/attention.h"
#include "ops/elementwise.h"
#include "testing/compare.h"
#include "testing/packed_documents.h"
#include "testing/cuda_util.h"

namespace shardtrain::ops {
namespace {

using testing::all_close;
using testing::rounded_f32;
using testing::to_device;
using testing::to_dtype;
using testing::to_host;

struct Case {
  int64_t B, T, N, M, H;
  bool causal;
  int64_t window = 0;   // a sliding window of this many keys (0: none)
  double softcap = 0;   // scores soft-capped at this value (Gemma 2; 0: none)
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "B" << c.B << "_T" << c.T << "_N" << c.N << "_M" << c.M << "_H" << c.H << (c.causal ? "_causal" : "_full");
  if (c.window > 0) *os << "_window" << c.window;
  if (c.softcap > 0) *os << "_softcap" << c.softcap;
}

// Flash attention's bf16 error follows the size of the terms it sums, not of the result:
// an output element that cancels to near zero still carries the rounding of O(1) terms
// (P is rounded to bf16 before P·V). So each tensor is held to the bf16 relative norm, and
// each element to 1% of the tensor's largest reference magnitude.
::testing::AssertionResult close(const Tensor& device, const Tensor& ref64) {
  double largest = 0;
  for (int64_t i = 0; i < ref64.numel(); ++i) largest = std::max(largest, std::abs(ref64.data<double>()[i]));
  return all_close(to_host(device), ref64, {testing::kCudaBf16.rel_norm, 0.0, 1e-2 * largest});
}

// The CPU twin in f64 on the given (already rounded) inputs.
struct Reference {
  Tensor out, lse, dq, dk, dv;
};

Reference reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const AttentionOptions& o) {
  const Tensor q64 = to_dtype(q, DType::kF64), k64 = to_dtype(k, DType::kF64), v64 = to_dtype(v, DType::kF64),
               dout64 = to_dtype(dout, DType::kF64);
  Reference r;
  r.out = Tensor::empty(q.shape(), DType::kF64);
  r.lse = Tensor::empty({q.size(0), q.size(2), q.size(1)}, DType::kF64);
  cpu::attention_forward(r.out, r.lse, q64, k64, v64, o);
  r.dq = Tensor::empty(q.shape(), DType::kF64);
  r.dk = Tensor::empty(k.shape(), DType::kF64);
  r.dv = Tensor::empty(v.shape(), DType::kF64);
  cpu::attention_backward(r.dq, r.dk, r.dv, dout64, q64, k64, v64, r.out, r.lse, o);
  return r;
}

class AttentionCuda : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { ST_REQUIRE_CUDA(); }
};

TEST_P(AttentionCuda, ForwardAndBackwardMatchCpu) {
  const Case c = GetParam();
  const DType dt = DType::kBF16;
  const uint64_t seed = static_cast<uint64_t>(c.T * 131 + c.N * 7 + c.H);
  const Tensor q = rounded_f32({c.B, c.T, c.N, c.H}, dt, seed, 0.0, 1.0);
  const Tensor k = rounded_f32({c.B, c.T, c.M, c.H}, dt, seed + 1, 0.0, 1.0);
  const Tensor v = rounded_f32({c.B, c.T, c.M, c.H}, dt, seed + 2, 0.0, 1.0);
  const Tensor dout = rounded_f32({c.B, c.T, c.N, c.H}, dt, seed + 3, 0.0, 1.0);
  AttentionOptions o;
  o.causal = c.causal;
  o.window = c.window;
  o.softcap = c.softcap;

  // CPU reference in f64 from exactly the values the device sees.
  const Reference ref = reference(q, k, v, dout, o);

  const Device gpu = Device::cuda(0);
  const Tensor dq_in = to_device(to_dtype(q, dt)), dk_in = to_device(to_dtype(k, dt)),
               dv_in = to_device(to_dtype(v, dt)), ddout = to_device(to_dtype(dout, dt));
  Tensor out = Tensor::empty(q.shape(), dt, gpu), lse = Tensor::empty({c.B, c.N, c.T}, DType::kF32, gpu);
  attention_forward(out, lse, dq_in, dk_in, dv_in, o);
  EXPECT_TRUE(close(out, ref.out)) << "out";
  EXPECT_TRUE(all_close(to_host(lse), ref.lse, {1e-4, 1e-4, 1e-3})) << "lse";

  Tensor dq = Tensor::empty(q.shape(), dt, gpu), dk = Tensor::empty(k.shape(), dt, gpu),
         dv = Tensor::empty(v.shape(), dt, gpu);
  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic backward" : "default backward");
    o.deterministic = deterministic;
    attention_backward(dq, dk, dv, ddout, dq_in, dk_in, dv_in, out, lse, o);
    EXPECT_TRUE(close(dq, ref.dq)) << "dq";
    EXPECT_TRUE(close(dk, ref.dk)) << "dk";
    EXPECT_TRUE(close(dv, ref.dv)) << "dv";
  }
}

// The deterministic backward repeats bit for bit at the 1B shape's size (a batch of 4 x 4096
// tokens, 32 query and 8 kv heads of 64), where cuDNN's default backward was seen to differ
// from run to run in the last bits (training losses of two runs of train_bench, H100).
TEST(AttentionCudaDeterministic, BackwardRepeatsBitForBit) {
  ST_REQUIRE_CUDA();
  const int64_t B = 4, T = 4096, N = 32, M = 8, H = 64;
  const Device gpu = Device::cuda(0);
  auto normal = [&](const Shape& s, uint64_t key) {
    Tensor x = Tensor::empty(s, DType::kBF16, gpu, "test input");
    fill_normal(x, 5, key, 0, 1);
    return x;
  };
  const Tensor q = normal({B, T, N, H}, 1), k = normal({B, T, M, H}, 2), v = normal({B, T, M, H}, 3),
               dout = normal({B, T, N, H}, 4);
  Tensor out = Tensor::empty(q.shape(), DType::kBF16, gpu), lse = Tensor::empty({B, N, T}, DType::kF32, gpu);
  AttentionOptions o;
  o.deterministic = true;
  attention_forward(out, lse, q, k, v, o);
  Tensor first[3];
  for (int run = 0; run < 3; ++run) {
    Tensor dq = Tensor::empty(q.shape(), DType::kBF16, gpu), dk = Tensor::empty(k.shape(), DType::kBF16, gpu),
           dv = Tensor::empty(v.shape(), DType::kBF16, gpu);
    attention_backward(dq, dk, dv, dout, q, k, v, out, lse, o);
    const Tensor got[3] = {to_host(dq), to_host(dk), to_host(dv)};
    for (int t = 0; t < 3; ++t) {
      if (run == 0) {
        first[t] = got[t];
        continue;
      }
      EXPECT_EQ(std::memcmp(first[t].raw_data(), got[t].raw_data(), got[t].nbytes()), 0)
          << "run " << run << ": " << (t == 0 ? "dq" : t == 1 ? "dk" : "dv") << " differs from the first run";
    }
  }
}

// f32 on CUDA goes to exact kernels (no bf16 rounding anywhere), so every tensor matches the
// f64 reference to f32 summation error: each element to 1e-5 of its tensor's largest reference magnitude or of the inputs' unit
// scale, whichever is larger (f32 sums of up to T terms of that size; a result that cancels
// to near zero still carries their rounding), each tensor to 1e-5 relative norm.
::testing::AssertionResult close_f32(const Tensor& device, const Tensor& ref64) {
  double largest = 1.0;
  for (int64_t i = 0; i < ref64.numel(); ++i) largest = std::max(largest, std::abs(ref64.data<double>()[i]));
  return all_close(to_host(device), ref64, {1e-5, 0.0, 1e-5 * largest});
}

class AttentionCudaF32 : public AttentionCuda {};

TEST_P(AttentionCudaF32, MatchesCpuToF32Error) {
  const Case c = GetParam();
  const uint64_t seed = static_cast<uint64_t>(c.T * 17 + c.N * 5 + c.H);
  const Tensor q = rounded_f32({c.B, c.T, c.N, c.H}, DType::kF32, seed, 0.0, 1.0);
  const Tensor k = rounded_f32({c.B, c.T, c.M, c.H}, DType::kF32, seed + 1, 0.0, 1.0);
  const Tensor v = rounded_f32({c.B, c.T, c.M, c.H}, DType::kF32, seed + 2, 0.0, 1.0);
  const Tensor dout = rounded_f32({c.B, c.T, c.N, c.H}, DType::kF32, seed + 3, 0.0, 1.0);
  AttentionOptions o;
  o.causal = c.causal;
  o.window = c.window;
  o.softcap = c.softcap;
  const Reference ref = reference(q, k, v, dout, o);

  const Device gpu = Device::cuda(0);
  const Tensor qd = to_device(q), kd = to_device(k), vd = to_device(v), doutd = to_device(dout);
  Tensor out = Tensor::empty(q.shape(), DType::kF32, gpu), lse = Tensor::empty({c.B, c.N, c.T}, DType::kF32, gpu);
  attention_forward(out, lse, qd, kd, vd, o);
  EXPECT_TRUE(close_f32(out, ref.out)) << "out";
  EXPECT_TRUE(close_f32(lse, ref.lse)) << "lse";
  Tensor dq = Tensor::empty(q.shape(), DType::kF32, gpu), dk = Tensor::empty(k.shape(), DType::kF32, gpu),
         dv = Tensor::empty(v.shape(), DType::kF32, gpu);
  attention_backward(dq, dk, dv, doutd, qd, kd, vd, out, lse, o);
  EXPECT_TRUE(close_f32(dq, ref.dq)) << "dq";
  EXPECT_TRUE(close_f32(dk, ref.dk)) << "dk";
  EXPECT_TRUE(close_f32(dv, ref.dv)) << "dv";
}

// q, k, v as head slices of one stacked [B, T, N + 2M, H] tensor (the model's q|k|v product)
// and dq, dk, dv as slices of another: cuDNN (bf16) reads and writes them where they lie,
// the f32 and one-token kernels through contiguous copies; each matches the CPU twin as the
// contiguous tensors do.
class AttentionCudaStacked : public AttentionCuda {};

TEST_P(AttentionCudaStacked, HeadSlicesMatchCpu) {
  const Case c = GetParam();
  const int64_t E = c.N + 2 * c.M;
  const Device gpu = Device::cuda(0);
  for (DType dt : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(dt));
    const uint64_t seed = static_cast<uint64_t>(c.T * 29 + c.N * 3 + c.H);
    const Tensor stacked = rounded_f32({c.B, c.T, E, c.H}, dt, seed, 0.0, 1.0);
    const Tensor dout = rounded_f32({c.B, c.T, c.N, c.H}, dt, seed + 1, 0.0, 1.0);
    const Tensor q = to_dtype(stacked.slice(2, 0, c.N), DType::kF32),
                 k = to_dtype(stacked.slice(2, c.N, c.N + c.M), DType::kF32),
                 v = to_dtype(stacked.slice(2, c.N + c.M, E), DType::kF32);
    AttentionOptions o;
    o.causal = c.causal;
    o.window = c.window;
    o.softcap = c.softcap;
    const Reference ref = reference(q, k, v, dout, o);
    auto check = [&](const Tensor& device, const Tensor& ref64) {
      return dt == DType::kBF16 ? close(contiguous(device), ref64) : close_f32(contiguous(device), ref64);
    };

    const Tensor qkv = to_device(to_dtype(stacked, dt));
    const Tensor qd = qkv.slice(2, 0, c.N), kd = qkv.slice(2, c.N, c.N + c.M), vd = qkv.slice(2, c.N + c.M, E);
    Tensor out = Tensor::empty(q.shape(), dt, gpu), lse = Tensor::empty({c.B, c.N, c.T}, DType::kF32, gpu);
    attention_forward(out, lse, qd, kd, vd, o);
    EXPECT_TRUE(check(out, ref.out)) << "out";
    Tensor dqkv = Tensor::empty({c.B, c.T, E, c.H}, dt, gpu);
    Tensor dq = dqkv.slice(2, 0, c.N), dk = dqkv.slice(2, c.N, c.N + c.M), dv = dqkv.slice(2, c.N + c.M, E);
    attention_backward(dq, dk, dv, to_device(to_dtype(dout, dt)), qd, kd, vd, out, lse, o);
    EXPECT_TRUE(check(dq, ref.dq)) << "dq";
    EXPECT_TRUE(check(dk, ref.dk)) << "dk";
    EXPECT_TRUE(check(dv, ref.dv)) << "dv";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionCudaStacked,
                         ::testing::Values(Case{1, 1, 2, 1, 64, true}, Case{2, 37, 4, 2, 64, true},
                                           Case{1, 130, 8, 8, 128, true}, Case{1, 2048, 32, 8, 64, true},
                                           Case{2, 37, 4, 2, 64, true, 9},
                                           // soft-capped scores (cuDNN's score modifier for bf16)
                                           Case{2, 37, 4, 2, 64, true, 9, 2.0}, Case{2, 37, 4, 2, 64, true, 0, 2.0}));
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionCuda,
                         ::testing::Values(Case{1, 1, 2, 1, 64, true}, Case{2, 37, 4, 2, 64, true},
                                           Case{1, 130, 8, 8, 128, true}, Case{2, 256, 8, 1, 64, true},
                                           Case{1, 1031, 4, 2, 128, true}, Case{2, 70, 4, 1, 128, false},
                                           Case{1, 2048, 32, 8, 64, true},
                                           // sliding windows: a few keys, a tile's worth, most of the row
                                           Case{2, 37, 4, 2, 64, true, 5}, Case{1, 1031, 4, 2, 128, true, 256},
                                           Case{1, 2048, 32, 8, 64, true, 1500},
                                           // soft-capped scores (Gemma 2; a cap of 2 bends scores of about
                                           // one, so a missing or misplaced cap shows): causal, with a
                                           // sliding window, not causal, GQA and MHA, one token, head dim 256
                                           // (Gemma 2's)
                                           Case{2, 37, 4, 2, 64, true, 0, 2.0}, Case{2, 37, 4, 2, 64, true, 5, 2.0},
                                           Case{1, 1031, 4, 2, 128, true, 256, 2.0}, Case{2, 70, 4, 1, 128, false, 0, 2.0},
                                           Case{1, 130, 8, 8, 128, true, 0, 1.0}, Case{1, 1, 2, 1, 64, true, 0, 2.0},
                                           Case{1, 300, 8, 4, 256, true, 64, 2.0}, Case{1, 300, 8, 4, 256, true, 0, 50.0}));
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionCudaF32,
                         ::testing::Values(Case{1, 1, 2, 1, 64, true}, Case{2, 37, 4, 2, 64, true},
                                           Case{1, 130, 8, 8, 128, true}, Case{1, 1031, 4, 2, 128, true},
                                           Case{2, 70, 4, 1, 128, false}, Case{1, 2048, 32, 8, 64, true},
                                           Case{2, 45, 6, 3, 20, true}, Case{1, 33, 2, 2, 136, false},
                                           Case{1, 9, 1, 1, 300, true}, Case{2, 37, 4, 2, 64, true, 5},
                                           Case{1, 130, 8, 8, 128, true, 64},
                                           // two keys: with one, dq and dk are exactly zero (each query
                                           // sees only itself), and f32 residue has no scale to compare to
                                           Case{2, 45, 6, 3, 20, true, 2},
                                           // soft-capped scores, with and without a window, not causal
                                           Case{2, 37, 4, 2, 64, true, 0, 2.0}, Case{2, 37, 4, 2, 64, true, 5, 2.0},
                                           Case{2, 70, 4, 1, 128, false, 0, 1.0}));

// Packed documents (cuDNN's ragged layout for bf16, the exact kernels for f32): q, k, v as
// head slices of one stacked tensor (the model's layout) and contiguous, documents of one
// token, whole rows, long and short ones, the capacity above the count, the longest document
// shorter than the rows (cuDNN is told shorter sequences); every output and
// gradient against the CPU twin with the same documents, the default and the deterministic
// backward.
struct DocumentsCase {
  int64_t N, M, H;
  std::vector<std::vector<int64_t>> rows;  // each row's document lengths
  int64_t window = 0;                      // a sliding window of this many keys (0: none)
};
void PrintTo(const DocumentsCase& c, std::ostream* os) {
  *os << "N" << c.N << "_M" << c.M << "_H" << c.H << "_rows" << c.rows.size();
  if (c.window > 0) *os << "_window" << c.window;
}
class AttentionCudaDocuments : public ::testing::TestWithParam<DocumentsCase> {
 protected:
  void SetUp() override { ST_REQUIRE_CUDA(); }
};

TEST_P(AttentionCudaDocuments, MatchCpu) {
  const DocumentsCase& c = GetParam();
  const int64_t B = static_cast<int64_t>(c.rows.size()), E = c.N + 2 * c.M;
  int64_t T = 0;
  for (int64_t len : c.rows[0]) T += len;
  const Tensor pos = testing::document_positions(c.rows);
  const Device gpu = Device::cuda(0);
  const PackedDocuments cpu_docs = pack_documents(pos, Device::cpu()), gpu_docs = pack_documents(pos, gpu);
  for (DType dt : {DType::kBF16, DType::kF32})
    for (bool stacked : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (stacked ? ", stacked q|k|v" : ", contiguous q, k, v"));
      const uint64_t seed = static_cast<uint64_t>(T * 7 + c.H + (stacked ? 1 : 0));
      const Tensor qkv = rounded_f32({B, T, E, c.H}, dt, seed, 0.0, 1.0);
      const Tensor dout = rounded_f32({B, T, c.N, c.H}, dt, seed + 1, 0.0, 1.0);
      const Tensor q = contiguous(qkv.slice(2, 0, c.N)), k = contiguous(qkv.slice(2, c.N, c.N + c.M)),
                   v = contiguous(qkv.slice(2, c.N + c.M, E));
      AttentionOptions o;
      o.documents = &cpu_docs;
      o.window = c.window;
      const Reference ref = reference(q, k, v, dout, o);
      auto check = [&](const Tensor& device, const Tensor& ref64) {
        return dt == DType::kBF16 ? close(contiguous(device), ref64) : close_f32(contiguous(device), ref64);
      };
      const Tensor qkv_d = to_device(to_dtype(qkv, dt));
      const Tensor qd = stacked ? qkv_d.slice(2, 0, c.N) : to_device(to_dtype(q, dt)),
                   kd = stacked ? qkv_d.slice(2, c.N, c.N + c.M) : to_device(to_dtype(k, dt)),
                   vd = stacked ? qkv_d.slice(2, c.N + c.M, E) : to_device(to_dtype(v, dt));
      o.documents = &gpu_docs;
      Tensor out = Tensor::empty(q.shape(), dt, gpu), lse = Tensor::empty({B, c.N, T}, DType::kF32, gpu);
      attention_forward(out, lse, qd, kd, vd, o);
      EXPECT_TRUE(check(out, ref.out)) << "out";
      EXPECT_TRUE(all_close(to_host(lse), ref.lse, {1e-4, 1e-4, 1e-3})) << "lse";
      Tensor dqkv = Tensor::empty({B, T, E, c.H}, dt, gpu);
      Tensor dq = stacked ? dqkv.slice(2, 0, c.N) : Tensor::empty(q.shape(), dt, gpu),
             dk = stacked ? dqkv.slice(2, c.N, c.N + c.M) : Tensor::empty(k.shape(), dt, gpu),
             dv = stacked ? dqkv.slice(2, c.N + c.M, E) : Tensor::empty(v.shape(), dt, gpu);
      for (bool deterministic : {false, true}) {
        SCOPED_TRACE(deterministic ? "deterministic backward" : "default backward");
        o.deterministic = deterministic;
        attention_backward(dq, dk, dv, to_device(to_dtype(dout, dt)), qd, kd, vd, out, lse, o);
        EXPECT_TRUE(check(dq, ref.dq)) << "dq";
        EXPECT_TRUE(check(dk, ref.dk)) << "dk";
        EXPECT_TRUE(check(dv, ref.dv)) << "dv";
      }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionCudaDocuments,
    ::testing::Values(DocumentsCase{4, 2, 64, {{100, 1, 199}, {300}, {7, 50, 43, 200}}},
                      DocumentsCase{8, 8, 128, {{1, 1, 126}, {64, 64}}},
                      DocumentsCase{4, 1, 64, {{100, 100, 56}, {64, 64, 64, 64}}},  // segments of 128 tokens
                      DocumentsCase{4, 2, 128, {{40, 40, 40, 40, 40}, {50, 50, 50, 50}}},  // of 64
                      DocumentsCase{4, 2, 64, {{77}, {77}}},  // one per row: plain causal attention
                      DocumentsCase{32, 8, 64, {{1000, 24, 1024}, {1048, 1000}}},
                      // a sliding window inside documents longer and shorter than it
                      DocumentsCase{4, 2, 64, {{100, 1, 199}, {300}, {7, 50, 43, 200}}, 32}));

// Key spans (context parallelism's blocks off the diagonal under packed documents): cuDNN's
// ragged problem with the keys' offsets apart from the queries' in bf16, the exact kernels in
// f32; rows whose first queries see the last keys, all of them, the last two, none (no queries,
// or no keys), against the CPU twin, forward and both backward algorithms; the queries outside
// the spans give output 0, log-sum-exp -inf and no gradient.
TEST(AttentionCudaSpans, MatchCpu) {
  ST_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  for (const auto& [T, H] : {std::pair<int64_t, int64_t>{200, 64}, {1024, 128}}) {
    const int64_t N = 8, M = 2;
    // (the last row's queries see two keys: with one, dk is exactly zero and f32's residue has no
    // scale to compare to)
    const std::vector<int64_t> queries = {T / 3, T, 0, 7, T}, first = {T / 2, 0, 0, T, T - 2};
    const int64_t B = static_cast<int64_t>(queries.size());
    const KeySpans cpu_spans = key_spans(queries, first, T, T, Device::cpu());
    const KeySpans gpu_spans = key_spans(queries, first, T, T, gpu);
    for (DType dt : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + ", T = " + std::to_string(T));
      const uint64_t seed = static_cast<uint64_t>(T + H);
      const Tensor q = rounded_f32({B, T, N, H}, dt, seed, 0.0, 1.0), k = rounded_f32({B, T, M, H}, dt, seed + 1, 0.0, 1.0),
                   v = rounded_f32({B, T, M, H}, dt, seed + 2, 0.0, 1.0),
                   dout = rounded_f32({B, T, N, H}, dt, seed + 3, 0.0, 1.0);
      AttentionOptions o;
      o.causal = false;
      o.spans = &cpu_spans;
      Reference ref = reference(q, k, v, dout, o);
      auto check = [&](const Tensor& device, const Tensor& ref64) {
        return dt == DType::kBF16 ? close(device, ref64) : close_f32(device, ref64);
      };
      o.spans = &gpu_spans;
      const Tensor qd = to_device(to_dtype(q, dt)), kd = to_device(to_dtype(k, dt)), vd = to_device(to_dtype(v, dt));
      Tensor out = Tensor::empty(q.shape(), dt, gpu), lse = Tensor::empty({B, N, T}, DType::kF32, gpu);
      fill(out, 7.0);  // what the spans leave out must be written
      attention_forward(out, lse, qd, kd, vd, o);
      EXPECT_TRUE(check(out, ref.out)) << "out";
      // the rows that see no key: -inf on both sides, then compared as 0
      Tensor got_lse = to_host(lse);
      int64_t unseen = 0;
      for (int64_t i = 0; i < got_lse.numel(); ++i) {
        double& r = ref.lse.data<double>()[i];
        float& g = got_lse.data<float>()[i];
        if (std::isinf(r)) {
          EXPECT_TRUE(std::isinf(g) && g < 0) << "lse element " << i << ": " << g;
          ++unseen;
          r = 0;
          g = 0;
        }
      }
      EXPECT_EQ(unseen, N * (T - T / 3 + T + T));
      EXPECT_TRUE(all_close(got_lse, ref.lse, {1e-4, 1e-4, 1e-3})) << "lse";
      Tensor dq = Tensor::empty(q.shape(), dt, gpu), dk = Tensor::empty(k.shape(), dt, gpu),
             dv = Tensor::empty(v.shape(), dt, gpu);
      for (bool deterministic : {false, true}) {
        SCOPED_TRACE(deterministic ? "deterministic backward" : "default backward");
        o.deterministic = deterministic;
        fill(dq, 7.0);
        fill(dk, 7.0);
        fill(dv, 7.0);
        attention_backward(dq, dk, dv, to_device(to_dtype(dout, dt)), qd, kd, vd, out, lse, o);
        EXPECT_TRUE(check(dq, ref.dq)) << "dq";
        EXPECT_TRUE(check(dk, ref.dk)) << "dk";
        EXPECT_TRUE(check(dv, ref.dv)) << "dv";
      }
    }
  }
}

// Over a KV cache: T new queries (head slices of a stacked q|k|v, as in the model) against S
// keys that are the first S rows of a longer cache [B, capacity, M, H] (their sequences
// capacity rows apart), bottom-right causal. The exact kernel of attention_cached.h against
// the CPU twin's S > T forward in f64, in bf16 and f32; S == T with B > 1 takes it too.
struct CachedCase {
  int64_t B, T, S, N, M, H;
  bool causal;
  int64_t window = 0;  // a sliding window of this many keys (0: none)
  double softcap = 0;  // scores soft-capped at this value (Gemma 2; 0: none)
};
void PrintTo(const CachedCase& c, std::ostream* os) {
  *os << "B" << c.B << "_T" << c.T << "_S" << c.S << "_N" << c.N << "_M" << c.M << "_H" << c.H
      << (c.causal ? "_causal" : "_full");
  if (c.window > 0) *os << "_window" << c.window;
  if (c.softcap > 0) *os << "_softcap" << c.softcap;
}
class AttentionCudaCached : public ::testing::TestWithParam<CachedCase> {
 protected:
  void SetUp() override { ST_REQUIRE_CUDA(); }
};

TEST_P(AttentionCudaCached, MatchesCpu) {
  const CachedCase c = GetParam();
  const int64_t E = c.N + 2 * c.M, capacity = c.S + 5;
  const Device gpu = Device::cuda(0);
  for (DType dt : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(dt));
    const uint64_t seed = static_cast<uint64_t>(c.S * 17 + c.T * 5 + c.H);
    const Tensor stacked = rounded_f32({c.B, c.T, E, c.H}, dt, seed, 0.0, 1.0);
    const Tensor keys = rounded_f32({c.B, capacity, c.M, c.H}, dt, seed + 1, 0.0, 1.0);
    const Tensor values = rounded_f32({c.B, capacity, c.M, c.H}, dt, seed + 2, 0.0, 1.0);
    AttentionOptions o;
    o.causal = c.causal;
    o.window = c.window;
    o.softcap = c.softcap;
    Tensor out64 = Tensor::empty({c.B, c.T, c.N, c.H}, DType::kF64);
    Tensor lse64 = Tensor::empty({c.B, c.N, c.T}, DType::kF64);
    cpu::attention_forward(out64, lse64, to_dtype(stacked.slice(2, 0, c.N), DType::kF64),
                           to_dtype(keys.slice(1, 0, c.S), DType::kF64), to_dtype(values.slice(1, 0, c.S), DType::kF64),
                           o);

    const Tensor qkv = to_device(to_dtype(stacked, dt)), kd = to_device(to_dtype(keys, dt)),
                 vd = to_device(to_dtype(values, dt));
    Tensor out = Tensor::empty({c.B, c.T, c.N, c.H}, dt, gpu), lse = Tensor::empty({c.B, c.N, c.T}, DType::kF32, gpu);
    attention_forward(out, lse, qkv.slice(2, 0, c.N), kd.slice(1, 0, c.S), vd.slice(1, 0, c.S), o);
    EXPECT_TRUE(dt == DType::kBF16 ? close(out, out64) : close_f32(out, out64)) << "out";
    EXPECT_TRUE(close_f32(lse, lse64)) << "lse (f32 math in both dtypes)";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionCudaCached,
                         ::testing::Values(CachedCase{1, 1, 1, 2, 1, 64, true}, CachedCase{1, 1, 37, 4, 2, 64, true},
                                           CachedCase{2, 5, 70, 8, 2, 128, true},
                                           CachedCase{1, 3, 300, 32, 8, 64, true},
                                           CachedCase{2, 1, 129, 4, 4, 8, true},
                                           CachedCase{2, 9, 9, 4, 2, 64, true},  // S == T, cache rows
                                           CachedCase{1, 4, 40, 6, 3, 20, false},
                                           CachedCase{1, 2, 1000, 8, 1, 256, true},
                                           // sliding windows over the cache
                                           CachedCase{2, 5, 70, 8, 2, 128, true, 16},
                                           CachedCase{1, 1, 300, 4, 2, 64, true, 64},
                                           CachedCase{1, 3, 300, 32, 8, 64, true, 100},
                                           // soft-capped scores (Gemma 2's generation), with a window too
                                           CachedCase{2, 5, 70, 8, 2, 128, true, 0, 2.0},
                                           CachedCase{1, 1, 300, 4, 2, 256, true, 64, 2.0}));

// The same cases as one KV cache step with its position in memory (p = S - T): the new k and
// v (head slices of the stacked tensor) written into the cache rows p.., the rest untouched,
// and the output the CPU twin's over those rows; bit for bit the output of the step above
// (same kernel) on a cache that already held the rows.
TEST_P(AttentionCudaCached, KvCacheStepWithThePositionInMemory) {
  const CachedCase c = GetParam();
  if (!c.causal) GTEST_SKIP() << "a decoding step is causal";
  const int64_t E = c.N + 2 * c.M, capacity = c.S + 5, p = c.S - c.T;
  const Device gpu = Device::cuda(0);
  for (DType dt : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(dt));
    const uint64_t seed = static_cast<uint64_t>(c.S * 19 + c.T * 7 + c.H);
    const Tensor stacked = to_dtype(rounded_f32({c.B, c.T, E, c.H}, dt, seed, 0.0, 1.0), dt);
    const Tensor keys = to_dtype(rounded_f32({c.B, capacity, c.M, c.H}, dt, seed + 1, 0.0, 1.0), dt);
    const Tensor values = to_dtype(rounded_f32({c.B, capacity, c.M, c.H}, dt, seed + 2, 0.0, 1.0), dt);
    const Tensor qkv = to_device(stacked);
    Tensor kd = to_device(keys), vd = to_device(values);
    Tensor position = Tensor::empty({1}, DType::kI32), position_d;
    position.data<int32_t>()[0] = static_cast<int32_t>(p);
    position_d = to_device(position);
    Tensor out = Tensor::empty({c.B, c.T, c.N, c.H}, dt, gpu), lse = Tensor::empty({c.B, c.N, c.T}, DType::kF32, gpu);
    AttentionOptions window;
    window.window = c.window;
    window.softcap = c.softcap;
    attention_forward_kv_cache(out, lse, kd, vd, qkv.slice(2, 0, c.N), qkv.slice(2, c.N, c.N + c.M),
                               qkv.slice(2, c.N + c.M, E), position_d, window);
    // the CPU twin on the host copies, in the same dtype
    Tensor hk = contiguous(keys), hv = contiguous(values);
    if (dt == DType::kF32) {
      Tensor want = Tensor::empty({c.B, c.T, c.N, c.H}, dt), want_lse = Tensor::empty({c.B, c.N, c.T}, DType::kF32);
      cpu::attention_forward_kv_cache(want, want_lse, hk, hv, contiguous(stacked.slice(2, 0, c.N)),
                                      contiguous(stacked.slice(2, c.N, c.N + c.M)),
                                      contiguous(stacked.slice(2, c.N + c.M, E)), position, window);
      EXPECT_TRUE(close_f32(out, to_dtype(want, DType::kF64))) << "out";
      EXPECT_TRUE(close_f32(lse, to_dtype(want_lse, DType::kF64))) << "lse";
    } else {  // the CPU has no bf16: write the rows by hand
      for (auto [cache, from] : {std::pair{&hk, c.N}, std::pair{&hv, c.N + c.M}}) {
        const Tensor fresh = contiguous(stacked.slice(2, from, from + c.M));
        for (int64_t b = 0; b < c.B; ++b) {  // one sequence's rows at a time: a plain block each
          Tensor rows = cache->slice(0, b, b + 1).slice(1, p, c.S);
          copy(rows, fresh.slice(0, b, b + 1));
        }
      }
    }
    // the caches now hold the new rows and nothing else changed
    const Tensor gk = to_host(kd), gv = to_host(vd);
    EXPECT_EQ(std::memcmp(gk.raw_data(), hk.raw_data(), gk.nbytes()), 0) << "keys cache";
    EXPECT_EQ(std::memcmp(gv.raw_data(), hv.raw_data(), gv.nbytes()), 0) << "values cache";
    // and the output is the plain step's over the filled cache, bit for bit
    Tensor out2 = Tensor::empty({c.B, c.T, c.N, c.H}, dt, gpu), lse2 = Tensor::empty({c.B, c.N, c.T}, DType::kF32, gpu);
    attention_forward(out2, lse2, qkv.slice(2, 0, c.N), kd.slice(1, 0, c.S), vd.slice(1, 0, c.S), window);
    const Tensor a = to_host(out), b = to_host(out2);
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << "out against attention_forward";
  }
}

// The FP8 forward (cuDNN's e4m3 flash attention) against its CPU twin, q, k and v given as
// head slices of one stacked q|k|v tensor (the model's layout) and contiguous:
// - q, k and v come back rounded to their e4m3 values bit for bit as the twin rounds them, with
//   the same power-of-two scales;
// - the log-sum-exp is within the bound of summing rounded probabilities (below);
// - each output element lies within the bound the format gives: the probabilities' e4m3
//   rounding moves sum_j p_j v_j by at most 2^-4 sum_j p_j |v_j| (and their normaliser by 2^-4
//   of the result), the smallest probabilities' codes are 2^-10 / 256 apart at most, and the
//   output's own rounding to e4m3 is one step of its grid.
struct Fp8Case {
  int64_t B, T, N, M, H;
  bool causal;
};

void PrintTo(const Fp8Case& c, std::ostream* os) {
  *os << "B" << c.B << "_T" << c.T << "_N" << c.N << "_M" << c.M << "_H" << c.H << (c.causal ? "_causal" : "_full");
}

class AttentionCudaFp8 : public ::testing::TestWithParam<Fp8Case> {
 protected:
  void SetUp() override { ST_REQUIRE_CUDA(); }
};

// The spacing of e4m3 values around |x| (x in the format's units).
double e4m3_step(double x) {
  const double a = std::max(std::abs(x), 0x1p-6);  // subnormals: the spacing of the smallest normals
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - 3);
}

// Whether c is an e4m3 value: at most 448, and 4 significant bits (multiples of 2^-9 below 2^-6).
bool is_e4m3_value(double c) {
  c = std::abs(c);
  if (c > 448) return false;
  const int e = c < 0x1p-6 ? -6 : std::ilogb(c);
  const double m = std::ldexp(c, 3 - e);
  return m == std::round(m);
}

TEST_P(AttentionCudaFp8, MatchesTheCpuTwinWithinTheFormatsBound) {
  const Fp8Case c = GetParam();
  const Device gpu = Device::cuda(0);
  const int64_t E = c.N + 2 * c.M;
  const uint64_t seed = static_cast<uint64_t>(c.T * 17 + c.N * 5 + c.H);
  // q and k of different sizes, v offset from zero, so the three scales differ
  const Tensor qs = rounded_f32({c.B, c.T, c.N, c.H}, DType::kBF16, seed, 0.0, 2.0);
  const Tensor ks = rounded_f32({c.B, c.T, c.M, c.H}, DType::kBF16, seed + 1, 0.0, 0.7);
  const Tensor vs = rounded_f32({c.B, c.T, c.M, c.H}, DType::kBF16, seed + 2, 0.3, 1.0);
  AttentionOptions o;
  o.causal = c.causal;

  // the twin in f64: the rounded q, k, v, its output and lse; the exact attention over the rounded
  // values, and the same with |v| (sum_j p_j |v_j|, the probabilities' rounding bound)
  Tensor q = to_dtype(qs, DType::kF64), k = to_dtype(ks, DType::kF64), v = to_dtype(vs, DType::kF64);
  Tensor twin = Tensor::empty(q.shape(), DType::kF64), twin_lse = Tensor::empty({c.B, c.N, c.T}, DType::kF64);
  const Fp8AttentionScales scales = cpu::attention_forward_fp8(twin, twin_lse, q, k, v, o);
  Tensor exact = Tensor::empty(q.shape(), DType::kF64), exact_lse = Tensor::empty({c.B, c.N, c.T}, DType::kF64);
  cpu::attention_forward(exact, exact_lse, q, k, v, o);
  Tensor v_abs = to_dtype(v, DType::kF64);
  double amax_v = 0;
  for (int64_t i = 0; i < v_abs.numel(); ++i) {
    v_abs.data<double>()[i] = std::abs(v_abs.data<double>()[i]);
    amax_v = std::max(amax_v, v_abs.data<double>()[i]);
  }
  Tensor spread = Tensor::empty(q.shape(), DType::kF64), spread_lse = Tensor::empty({c.B, c.N, c.T}, DType::kF64);
  cpu::attention_forward(spread, spread_lse, q, k, v_abs, o);
  EXPECT_EQ(scales.out, 2 * scales.v);

  for (bool stacked : {true, false}) {
    SCOPED_TRACE(stacked ? "q, k, v slices of one stacked tensor" : "contiguous q, k, v");
    Tensor qkv = Tensor::empty({c.B, c.T, E, c.H}, DType::kBF16, gpu);
    Tensor qd = stacked ? qkv.slice(2, 0, c.N) : to_device(to_dtype(qs, DType::kBF16));
    Tensor kd = stacked ? qkv.slice(2, c.N, c.N + c.M) : to_device(to_dtype(ks, DType::kBF16));
    Tensor vd = stacked ? qkv.slice(2, c.N + c.M, E) : to_device(to_dtype(vs, DType::kBF16));
    if (stacked) {
      copy(qd, to_device(to_dtype(qs, DType::kBF16)));
      copy(kd, to_device(to_dtype(ks, DType::kBF16)));
      copy(vd, to_device(to_dtype(vs, DType::kBF16)));
    }
    Tensor out = Tensor::empty(qs.shape(), DType::kBF16, gpu), lse = Tensor::empty({c.B, c.N, c.T}, DType::kF32, gpu);
    Tensor scales4 = Tensor::empty({4}, DType::kF32, gpu);
    cuda::attention_forward_fp8(out, lse, qd, kd, vd, o, {}, &scales4);
    const Tensor got_scales = to_host(scales4);
    EXPECT_EQ(got_scales.data<float>()[0], scales.q);
    EXPECT_EQ(got_scales.data<float>()[1], scales.k);
    EXPECT_EQ(got_scales.data<float>()[2], scales.v);
    EXPECT_EQ(got_scales.data<float>()[3], scales.out);
    // the rounded inputs, bit for bit (f64 holds every bf16 exactly)
    for (auto [dev, host, name] : {std::tuple{&qd, &q, "q"}, std::tuple{&kd, &k, "k"}, std::tuple{&vd, &v, "v"}}) {
      const Tensor got = to_dtype(to_host(contiguous(*dev)), DType::kF64);
      int64_t differ = 0;
      for (int64_t i = 0; i < got.numel(); ++i) differ += got.data<double>()[i] != host->data<double>()[i];
      EXPECT_EQ(differ, 0) << name << ": elements rounded otherwise than the twin rounds them";
    }
    // cuDNN sums the rounded probabilities into the log-sum-exp: each term within 2^-4 of its
    // own, the smallest within the floor, and the largest term is 1, so the sum is within a
    // factor 1 + 2^-4 + T 2^-18 of the exact one, and its log within that much
    const Tensor got_lse = to_host(lse);
    const double lse_bound = 0x1p-4 + static_cast<double>(c.T) * 0x1p-18;
    double lse_worst = 0;
    for (int64_t i = 0; i < got_lse.numel(); ++i)
      lse_worst = std::max(lse_worst, std::abs(got_lse.data<float>()[i] - exact_lse.data<double>()[i]));
    EXPECT_LE(lse_worst, lse_bound) << "lse";
    const Tensor got = to_dtype(to_host(out), DType::kF64);
    const double scale_out = 1.0 / scales.out, floor = static_cast<double>(c.T) * 0x1p-10 / 256.0 * amax_v;
    int64_t outside = 0, on_grid = 0;
    double worst = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      const double g = got.data<double>()[i], x = exact.data<double>()[i];
      const double step = e4m3_step(std::max(std::abs(g), std::abs(x)) * scale_out) / scale_out;
      const double bound = 0x1p-4 * (std::abs(x) + spread.data<double>()[i]) + step + floor;
      worst = std::max(worst, std::abs(g - x) / bound);
      outside += std::abs(g - x) > bound;
      on_grid += is_e4m3_value(g * scale_out);
    }
    EXPECT_EQ(outside, 0) << "output elements outside the format's bound; the largest error is " << worst
                          << " of its bound";
    EXPECT_EQ(on_grid, got.numel()) << "output elements that are not e4m3 values at the output's scale";
    std::printf("FP8 attention %s: the output's largest error is %.3f of its bound, the lse's %.2e (bound %.2e)\n",
                stacked ? "stacked" : "contiguous", worst, lse_worst, lse_bound);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionCudaFp8,
                         ::testing::Values(Fp8Case{1, 128, 8, 2, 128, true}, Fp8Case{2, 256, 8, 8, 64, true},
                                           Fp8Case{1, 1024, 32, 8, 128, true}, Fp8Case{1, 512, 4, 1, 128, false},
                                           Fp8Case{2, 200, 4, 2, 128, true}));

// The FP8 backward against the exact backward (the CPU twin, f64) over the same rounded q, k, v
// and the FP8 forward's out and lse, element by element within the bound e4m3 gives. Each
// rounding moves its value by at most 2^-4 of it (a normal e4m3 number), or by a floor below
// e4m3's normal range: dout, P, dP = dout v^T and the gradients. With A_ij = sum_h |dout_ih|
// |v_jh| (>= |dP_ij|) and Dbar_i = sum_j P_ij A_ij (>= |D_i|, D_i = sum_j P_ij dP_ij), the
// softmax gradient dS_ij = P_ij (dP_ij - D_i) moves by at most
//   e_ij = 2^-4 P_ij (3 A_ij + Dbar_i) + 2^-18 (A_ij + Dbar_i) + 2^-16 P_ij max A
// (dout's rounding in dP, dP's own, P's; the floors of P's codes under scale 256 and of dP's
// under the scales of its history), so
//   |dq_ih - ref| <= scale sum_j e_ij |k_jh| + 2^-4 |ref| + floor, dk alike over queries with
//   |q_ih|, and |dv_jh - ref| <= sum_i (2^-3 P_ij + 2^-18) |dout_ih| + 2^-4 |ref| + floor,
// the floor being the gradients' own (2^-14 of the largest, under two powers of two of headroom).
// With `seed` (a layer's first call) the gradients' scales come from a first pass's amaxes;
// the second call's from the history the first left.
class AttentionCudaFp8Backward : public AttentionCudaFp8 {};

struct Fp8BackwardBounds {
  Tensor dq, dk, dv;  // f64, the bound of each element before the output rounding and floor
};

Fp8BackwardBounds fp8_backward_bounds(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                      bool causal) {
  const int64_t B = q.size(0), T = q.size(1), N = q.size(2), M = k.size(2), H = q.size(3), G = N / M;
  const double scale = 1.0 / std::sqrt(static_cast<double>(H));
  Fp8BackwardBounds e{Tensor::zeros(q.shape(), DType::kF64), Tensor::zeros(k.shape(), DType::kF64),
                      Tensor::zeros(k.shape(), DType::kF64)};
  const double *qd = q.data<double>(), *kd = k.data<double>(), *vd = v.data<double>(), *od = dout.data<double>();
  double *eq = e.dq.data<double>(), *ek = e.dk.data<double>(), *ev = e.dv.data<double>();
  std::vector<double> S(static_cast<size_t>(T)), A(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t m = n / G;
      for (int64_t i = 0; i < T; ++i) {
        const double* qi = qd + ((b * T + i) * N + n) * H;
        const double* oi = od + ((b * T + i) * N + n) * H;
        const int64_t last = causal ? i : T - 1;
        double top = -1e300, amax = 0;
        for (int64_t j = 0; j <= last; ++j) {
          const double* kj = kd + ((b * T + j) * M + m) * H;
          const double* vj = vd + ((b * T + j) * M + m) * H;
          double dot = 0, a = 0;
          for (int64_t h = 0; h < H; ++h) {
            dot += qi[h] * kj[h];
            a += std::abs(oi[h]) * std::abs(vj[h]);
          }
          S[static_cast<size_t>(j)] = scale * dot;
          A[static_cast<size_t>(j)] = a;
          top = std::max(top, scale * dot);
          amax = std::max(amax, a);
        }
        double sum = 0, dbar = 0;
        for (int64_t j = 0; j <= last; ++j) sum += std::exp(S[static_cast<size_t>(j)] - top);
        for (int64_t j = 0; j <= last; ++j) {
          S[static_cast<size_t>(j)] = std::exp(S[static_cast<size_t>(j)] - top) / sum;  // P_ij
          dbar += S[static_cast<size_t>(j)] * A[static_cast<size_t>(j)];
        }
        double* eqi = eq + ((b * T + i) * N + n) * H;
        for (int64_t j = 0; j <= last; ++j) {
          const double p = S[static_cast<size_t>(j)], a = A[static_cast<size_t>(j)];
          const double ds = 0x1p-4 * p * (3 * a + dbar) + 0x1p-18 * (a + dbar) + 0x1p-16 * p * amax;
          const double* kj = kd + ((b * T + j) * M + m) * H;
          double* ekj = ek + ((b * T + j) * M + m) * H;
          double* evj = ev + ((b * T + j) * M + m) * H;
          for (int64_t h = 0; h < H; ++h) {
            eqi[h] += scale * ds * std::abs(kj[h]);
            ekj[h] += scale * ds * std::abs(qi[h]);
            evj[h] += (0x1p-3 * p + 0x1p-18) * std::abs(oi[h]);
          }
        }
      }
    }
  return e;
}

TEST_P(AttentionCudaFp8Backward, FollowsTheExactBackwardWithinTheFormatsBound) {
  const Fp8Case c = GetParam();
  const Device gpu = Device::cuda(0);
  const int64_t E = c.N + 2 * c.M;
  const uint64_t seed = static_cast<uint64_t>(c.T * 13 + c.N * 3 + c.H);
  const Tensor stacked = rounded_f32({c.B, c.T, E, c.H}, DType::kBF16, seed, 0.1, 1.5);
  const Tensor dout_host = rounded_f32({c.B, c.T, c.N, c.H}, DType::kBF16, seed + 1, 0.0, 0.01);
  AttentionOptions o;
  o.causal = c.causal;
  Tensor qkv = to_device(to_dtype(stacked, DType::kBF16));
  Tensor q = qkv.slice(2, 0, c.N), k = qkv.slice(2, c.N, c.N + c.M), v = qkv.slice(2, c.N + c.M, E);
  Tensor out = Tensor::empty({c.B, c.T, c.N, c.H}, DType::kBF16, gpu),
         lse = Tensor::empty({c.B, c.N, c.T}, DType::kF32, gpu);
  attention_forward_fp8(out, lse, q, k, v, o);
  const Tensor dout = to_device(to_dtype(dout_host, DType::kBF16));

  const Tensor q64 = to_dtype(to_host(contiguous(q)), DType::kF64), k64 = to_dtype(to_host(contiguous(k)), DType::kF64),
               v64 = to_dtype(to_host(contiguous(v)), DType::kF64), dout64 = to_dtype(dout_host, DType::kF64);
  Reference ref;
  ref.out = to_dtype(to_host(out), DType::kF64);
  ref.lse = to_dtype(to_host(lse), DType::kF64);
  ref.dq = Tensor::empty(q64.shape(), DType::kF64);
  ref.dk = Tensor::empty(k64.shape(), DType::kF64);
  ref.dv = Tensor::empty(v64.shape(), DType::kF64);
  cpu::attention_backward(ref.dq, ref.dk, ref.dv, dout64, q64, k64, v64, ref.out, ref.lse, o);
  const Fp8BackwardBounds bounds = fp8_backward_bounds(q64, k64, v64, dout64, c.causal);

  Tensor history = Tensor::empty({4}, DType::kF32, gpu);
  fill(history, 0.0);
  Tensor dqkv = Tensor::empty({c.B, c.T, E, c.H}, DType::kBF16, gpu);
  Tensor dq = dqkv.slice(2, 0, c.N), dk = dqkv.slice(2, c.N, c.N + c.M), dv = dqkv.slice(2, c.N + c.M, E);
  for (bool seed : {true, false}) {
    SCOPED_TRACE(seed ? "a layer's first call (seed)" : "a later call (the history's scales)");
    attention_backward_fp8(dq, dk, dv, dout, q, k, v, out, lse, history, seed, o);
    for (auto [got, want, bound, name] :
         {std::tuple{&dq, &ref.dq, &bounds.dq, "dq"}, std::tuple{&dk, &ref.dk, &bounds.dk, "dk"},
          std::tuple{&dv, &ref.dv, &bounds.dv, "dv"}}) {
      const Tensor g = to_dtype(to_host(contiguous(*got)), DType::kF64);
      double largest = 0, diff = 0, norm = 0, worst = 0;
      for (int64_t i = 0; i < g.numel(); ++i) largest = std::max(largest, std::abs(want->data<double>()[i]));
      int64_t outside = 0;
      for (int64_t i = 0; i < g.numel(); ++i) {
        const double r = want->data<double>()[i], d = std::abs(g.data<double>()[i] - r);
        const double allowed = bound->data<double>()[i] + 0x1p-4 * std::abs(r) + 0x1p-14 * largest;
        outside += d > allowed;
        worst = std::max(worst, d / allowed);
        diff += d * d;
        norm += r * r;
      }
      std::printf("FP8 backward, %s: %s relative error %.4f, the largest error %.3f of its bound\n",
                  seed ? "seeded" : "later", name, std::sqrt(diff / norm), worst);
      EXPECT_EQ(outside, 0) << name << ": elements outside the format's bound (the largest error " << worst
                            << " of its bound)";
    }
    const Tensor h = to_host(history);
    for (int i = 0; i < 4; ++i)
      EXPECT_TRUE(std::isfinite(h.data<float>()[i]) && h.data<float>()[i] > 0) << "history " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionCudaFp8Backward,
                         ::testing::Values(Fp8Case{1, 128, 8, 2, 128, true}, Fp8Case{1, 1024, 32, 8, 128, true},
                                           Fp8Case{1, 512, 4, 1, 128, false}, Fp8Case{2, 200, 4, 2, 128, true}));

TEST(AttentionCudaErrors, F64AndOddBf16HeadDimAreNamed) {
  ST_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  Tensor q = Tensor::empty({1, 4, 2, 64}, DType::kF64, gpu), k = Tensor::empty({1, 4, 1, 64}, DType::kF64, gpu);
  Tensor out = Tensor::empty({1, 4, 2, 64}, DType::kF64, gpu), lse = Tensor::empty({1, 2, 4}, DType::kF32, gpu);
  try {
    attention_forward(out, lse, q, k, k);
    FAIL() << "f64 attention on CUDA did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16 or f16"), std::string::npos) << e.what();
  }
  Tensor q2 = Tensor::empty({1, 4, 2, 60}, DType::kBF16, gpu), k2 = Tensor::empty({1, 4, 1, 60}, DType::kBF16, gpu);
  Tensor out2 = Tensor::empty({1, 4, 2, 60}, DType::kBF16, gpu);
  try {
    attention_forward(out2, lse, q2, k2, k2);
    FAIL() << "head dim 60 did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head dim 60"), std::string::npos) << e.what();
  }
}

// Soft-capped scores where the CUDA attention does not take them say so: packed documents of
// several per row (cuDNN's ragged layout) and the FP8 attention.
TEST(AttentionCudaErrors, SoftCapWithRaggedDocumentsOrFp8IsNamed) {
  ST_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  const int64_t B = 1, T = 8, N = 2, M = 1, H = 64;
  // (the checks refuse before anything is read)
  Tensor q = Tensor::empty({B, T, N, H}, DType::kBF16, gpu), k = Tensor::empty({B, T, M, H}, DType::kBF16, gpu);
  Tensor v = Tensor::empty({B, T, M, H}, DType::kBF16, gpu), out = Tensor::empty({B, T, N, H}, DType::kBF16, gpu);
  Tensor lse = Tensor::empty({B, N, T}, DType::kF32, gpu);
  Tensor positions = Tensor::empty({B, T}, DType::kI32);
  for (int64_t t = 0; t < T; ++t) positions.data<int32_t>()[t] = static_cast<int32_t>(t % 4);  // two documents
  const PackedDocuments documents = pack_documents(positions, gpu);
  AttentionOptions o;
  o.softcap = 50.0;
  o.documents = &documents;
  try {
    attention_forward(out, lse, q, k, v, o);
    FAIL() << "packed documents with soft-capped scores did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("packed documents (2 in 1 rows) with attention scores soft-capped at 50"),
              std::string::npos)
        << e.what();
  }
  o.documents = nullptr;
  try {
    attention_forward_fp8(out, lse, q, k, v, o);
    FAIL() << "the FP8 attention with soft-capped scores did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nor soft-capped scores"), std::string::npos) << e.what();
  }
}

// attention_merge against its CPU twin (f64 on the same values): an f32 accumulator taking bf16
// parts (a ring attention's), and bf16 into bf16; with rows whose accumulator is empty (-inf),
// a row whose part is empty, and a row where both are.
TEST(AttentionCudaMerge, MatchesTheCpuTwin) {
  ST_REQUIRE_CUDA();
  const int64_t B = 2, T = 37, N = 6, H = 72;
  for (DType acc : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(acc));
    const Tensor out = rounded_f32({B, T, N, H}, acc, 41, 0.0, 1.0);
    const Tensor part = rounded_f32({B, T, N, H}, DType::kBF16, 42, 0.0, 1.0);
    Tensor lse = rounded_f32({B, N, T}, DType::kF32, 43, 2.0, 3.0);
    Tensor part_lse = rounded_f32({B, N, T}, DType::kF32, 44, 2.0, 3.0);
    lse.data<float>()[0] = lse.data<float>()[T + 3] = -INFINITY;
    part_lse.data<float>()[1] = -INFINITY;
    lse.data<float>()[5] = part_lse.data<float>()[5] = -INFINITY;
    Tensor ref = to_dtype(out, DType::kF64), ref_lse = to_dtype(lse, DType::kF64);
    cpu::attention_merge(ref, ref_lse, to_dtype(part, DType::kF64), to_dtype(part_lse, DType::kF64));
    Tensor out_d = to_device(to_dtype(out, acc)), lse_d = to_device(lse);
    attention_merge(out_d, lse_d, to_device(to_dtype(part, DType::kBF16)), to_device(part_lse));
    // f32 math, rounded once to the accumulator's dtype (bf16: half a unit in the last place)
    const testing::Tolerance tol = acc == DType::kF32 ? testing::Tolerance{1e-6, 1e-5, 1e-6}
                                                      : testing::Tolerance{2e-3, 1.0 / 256, 1e-6};
    EXPECT_TRUE(all_close(to_host(out_d), ref, tol));
    Tensor merged_lse = to_host(lse_d);
    EXPECT_EQ(merged_lse.data<float>()[5], -INFINITY);  // both empty: still empty
    EXPECT_EQ(merged_lse.data<float>()[0], part_lse.data<float>()[0]);  // an empty accumulator takes the part
    merged_lse.data<float>()[5] = 0;  // the comparison below reads finite values
    ref_lse.data<double>()[5] = 0;
    EXPECT_TRUE(all_close(merged_lse, ref_lse, {1e-6, 1e-6, 1e-6}));
  }
  Tensor a = to_device(Tensor::zeros({1, 4, 2, 8}, DType::kF32)), l = to_device(Tensor::zeros({1, 2, 4}, DType::kF32));
  const Tensor wrong = to_device(Tensor::zeros({1, 2, 3}, DType::kF32));
  EXPECT_TRUE(testing::throws_with([&] { attention_merge(a, l, a, wrong); }, "log-sum-exps"));
}

}  // namespace
}  // namespace shardtrain::ops
