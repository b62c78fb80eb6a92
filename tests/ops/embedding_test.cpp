// CPU embedding: forward equals a direct lookup; the backward (accumulating) equals
// finite differences; bad ids are named.
#include "ops/embedding.h"
#include "ops/op_testing.h"

namespace shardtrain::ops {
namespace {

TEST(Embedding, ForwardAndBackward_f64_V37_D67_T41) {
  const int64_t V = 37, D = 67, T = 41;
  Tensor table = random_f64({V, D}, 1, 0.2, 0.7);
  Tensor ids = Tensor::empty({T}, DType::kI32);
  testing::fill_random_ints(ids, 2, 0, V);
  ids.data<int32_t>()[3] = ids.data<int32_t>()[9];  // a repeated id accumulates twice
  Tensor out = Tensor::empty({T, D}, DType::kF64);
  cpu::embedding_forward(out, ids, table);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d)
      ASSERT_EQ(out.data<double>()[t * D + d], table.data<double>()[ids.data<int32_t>()[t] * D + d]);

  const Tensor dout = random_f64({T, D}, 3);
  const Tensor start = random_f64({V, D}, 4);
  Tensor dtable = testing::to_f64(start);
  cpu::embedding_backward(dtable, dout, ids);
  Tensor grad = Tensor::empty({V, D}, DType::kF64);
  for (int64_t i = 0; i < V * D; ++i) grad.data<double>()[i] = dtable.data<double>()[i] - start.data<double>()[i];
  expect_gradients({{"table", &table, grad}}, [&] {
    cpu::embedding_forward(out, ids, table);
    return testing::dot(dout, out);
  });
}

TEST(Embedding, F32AndBadIds) {
  Tensor table = testing::to_dtype(random_f64({5, 3}, 1), DType::kF32);
  Tensor ids = Tensor::zeros({4}, DType::kI32);
  ids.data<int32_t>()[2] = 5;
  Tensor out = Tensor::empty({4, 3}, DType::kF32);
  EXPECT_TRUE(throws_with([&] { cpu::embedding_forward(out, ids, table); }, "token id 5 at position 2"));
  ids.data<int32_t>()[2] = 4;
  cpu::embedding_forward(out, ids, table);
  EXPECT_EQ(out.data<float>()[6], table.data<float>()[12]);
}

}  // namespace
}  // namespace shardtrain::ops
