// Helpers for the op headers: dtype groups and the error for a device with no kernel yet.
#pragma once

#include "core/tensor.h"

namespace shardtrain::ops {

// Statistics (RMSNorm's rstd, attention's log-sum-exp, loss sums) are f64 for f64 data
// and f32 for every other floating dtype.
inline DType stats_dtype(DType data) { return data == DType::kF64 ? DType::kF64 : DType::kF32; }

[[noreturn]] void no_kernel(const char* op, const Tensor& t);

// CPU kernels take f32 or f64; bf16/f16 tensors are converted with ops::cast first.
void check_cpu_float(const Tensor& t, const char* op, const char* arg);

// The elements between one token's heads and the next's in a [B, T, heads, H] tensor whose
// every token holds its heads contiguously: heads·H for a contiguous tensor, more for heads
// sliced from a stacked q|k|v product. An error naming op and arg for any other layout.
int64_t token_pitch(const Tensor& x_BTXH, const char* op, const char* arg);

}  // namespace shardtrain::ops
