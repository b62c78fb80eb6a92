// Positions of documents packed into rows, for tests of document masking: each row's document
// lengths (summing to the row's length) give i32 [B, T] positions restarting at 0 per document.
#pragma once

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "core/tensor.h"

namespace shardtrain::testing {

inline Tensor document_positions(const std::vector<std::vector<int64_t>>& rows) {
  const int64_t B = static_cast<int64_t>(rows.size());
  int64_t T = 0;
  for (int64_t len : rows[0]) T += len;
  Tensor pos = Tensor::empty({B, T}, DType::kI32);
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = 0;
    for (int64_t len : rows[static_cast<size_t>(b)]) {
      EXPECT_LE(t + len, T) << "row " << b << " is longer than the first";
      for (int64_t i = 0; i < len && t < T; ++i) pos.data<int32_t>()[b * T + t++] = static_cast<int32_t>(i);
    }
    EXPECT_EQ(t, T) << "row " << b << " is shorter than the first";
  }
  return pos;
}

}  // namespace shardtrain::testing
