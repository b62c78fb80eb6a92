// The pieces of cuDNN's ragged (packed documents) attention that are ours: the per-segment
// element offsets of each tensor, and the statistics between cuDNN's token-major layout and
// lse_BNT. All run on the device from device data, so a CUDA graph can replay them.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace shardtrain::ops::cuda {

// The element offsets cuDNN reads, one row of S + 1 per tensor (overwrites offsets_5S1, i64
// [5, S + 1]), from the segments' first tokens starts_S1 (i64 [S + 1]): rows q, k, v (tokens
// `pitch_*` elements apart), out (N·H apart) and statistics (N apart).
void ragged_offsets(Tensor& offsets_5S1, const Tensor& starts_S1, int64_t pitch_q, int64_t pitch_k, int64_t pitch_v,
                    int64_t N, int64_t H, Stream stream);

// lse_BNT[b, n, t] = stats_TN[b·T + t, n] (to_heads) or the reverse; f32, contiguous.
void stats_to_heads(Tensor& lse_BNT, const Tensor& stats_TN, Stream stream);
void stats_to_tokens(Tensor& stats_TN, const Tensor& lse_BNT, Stream stream);

}  // namespace shardtrain::ops::cuda
