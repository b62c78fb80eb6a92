// Embedding forward and its deterministic backward on the GPU against the CPU twin, on random
// data in f32 and bf16, odd and aligned shapes. Skips without a device.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/embedding.h"
#include "testing/cuda_ops.h"

namespace shardtrain::ops {
namespace {

using namespace testing;  // Input, random_input, matches, to_device, to_host, ...

class EmbeddingCuda : public testing::CudaDtypeTest {};

TEST_P(EmbeddingCuda, EmbeddingDeterministicBackward) {
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

INSTANTIATE_TEST_SUITE_P(Dtypes, EmbeddingCuda, ::testing::Values(DType::kF32, DType::kBF16), testing::dtype_param_name);

}  // namespace
}  // namespace shardtrain::ops
