// Attention backward for sequences of one token (cuDNN's flash kernels need two or more).
#pragma once

#include "core/tensor.h"

namespace shardtrain::ops::cuda {

// dq_BTNH = dk_BTMH = 0, dv_BTMH = dout summed over each kv head's query heads (T = 1).
void attention_backward_single_token(Tensor& dq_BTNH, Tensor& dk_BTMH, Tensor& dv_BTMH, const Tensor& dout_BTNH,
                                     Stream stream);

}  // namespace shardtrain::ops::cuda
