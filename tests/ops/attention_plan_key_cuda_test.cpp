// The cuDNN attention's plan key (ops/cuda/attention_cudnn.h's Problem): problems that differ in
// the soft-cap of their scores (Gemma 2) or its value, in the window or in neither are told
// apart as the graph cache needs, so that a capped layer never runs an uncapped layer's graph or
// the other way round. Host-only: needs the CUDA build's headers, not a device.
#include <gtest/gtest.h>

#include "ops/cuda/attention_cudnn.h"

namespace shardtrain::ops::cuda::cudnn_attention {
namespace {

Problem problem(double softcap, int64_t window) {
  Problem p{false, 2, 128, 8, 4, 256, DType::kBF16, true, 0.0625, false};
  p.pitch_q = 8 * 256;
  p.pitch_k = p.pitch_v = 4 * 256;
  p.window = window;
  p.softcap = softcap;
  return p;
}

bool same_key(const Problem& a, const Problem& b) { return !(a < b) && !(b < a); }

TEST(AttentionPlanKey, TheSoftCapIsPartOfTheKey) {
  EXPECT_FALSE(same_key(problem(0.0, 0), problem(50.0, 0))) << "capped and uncapped scores share a graph";
  EXPECT_FALSE(same_key(problem(50.0, 0), problem(30.0, 0))) << "two caps share a graph";
  EXPECT_FALSE(same_key(problem(50.0, 0), problem(50.0, 4096))) << "a sliding and a global capped layer share a graph";
  EXPECT_TRUE(same_key(problem(50.0, 4096), problem(50.0, 4096)));
  Problem backward = problem(50.0, 0);
  backward.backward = true;
  EXPECT_FALSE(same_key(problem(50.0, 0), backward));
}

}  // namespace
}  // namespace shardtrain::ops::cuda::cudnn_attention
