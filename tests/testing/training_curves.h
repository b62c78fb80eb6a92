// Comparing two training runs step by step (N ranks against one with the same global batch).
#pragma once

#include <cmath>

#include <gtest/gtest.h>

#include "train/trainer.h"

namespace shardtrain::testing {

// `got`'s loss and gradient norm at every step, and its last held-out loss, within relative
// `rel` of `ref`'s; returns whether some step's gradient norm in `ref` exceeded `clip` (so
// that the runs exercised clipping).
inline bool expect_same_curves(const train::TrainSummary& ref, const train::TrainSummary& got, double rel, double clip) {
  EXPECT_EQ(got.steps.size(), ref.steps.size());
  bool clipped = false;
  for (size_t i = 0; i < ref.steps.size() && i < got.steps.size(); ++i) {
    EXPECT_NEAR(got.steps[i].loss, ref.steps[i].loss, rel * std::abs(ref.steps[i].loss)) << "step " << i + 1;
    EXPECT_NEAR(got.steps[i].grad_norm, ref.steps[i].grad_norm, rel * ref.steps[i].grad_norm) << "step " << i + 1;
    clipped |= ref.steps[i].grad_norm > clip;
  }
  EXPECT_FALSE(ref.evals.empty() || got.evals.empty()) << "both runs evaluate at their end";
  if (!ref.evals.empty() && !got.evals.empty()) {
    EXPECT_NEAR(got.evals.back().second, ref.evals.back().second, rel * ref.evals.back().second);
  }
  return clipped;
}

}  // namespace shardtrain::testing
