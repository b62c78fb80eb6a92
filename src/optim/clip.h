// Global gradient-norm clipping over all units. Sharded runs pass the data-parallel
// communicator: each rank's squared norm of its shards is summed over it first.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"

namespace shardtrain::optim {

// sqrt(sum over all buffers of sum(g^2)), accumulated in f64.
double global_grad_norm(const std::vector<const Tensor*>& grads, dist::Communicator* comm = nullptr);
// The same from this rank's sum of squares of its gradients, summed already (e.g. on the GPU
// as the gradients were reduced: fsdp::ShardedUnitStore::landed_grad_sum_squares).
double grad_norm_from_sum_squares(double local_sum_squares, dist::Communicator* comm = nullptr);

// The factor clipping applies: max_norm / (norm + 1e-6) when max_norm > 0 and norm >
// max_norm, else 1 (torch.nn.utils.clip_grad_norm_). Pass it to AdamW::step as grad_scale
// to clip inside the update instead of in a pass of its own.
double clip_coefficient(double norm, double max_norm);

// If max_norm > 0 and norm > max_norm, scales every gradient by max_norm / (norm + 1e-6)
// (torch.nn.utils.clip_grad_norm_). Returns the norm before clipping.
double clip_grad_norm(const std::vector<Tensor*>& grads, double max_norm, dist::Communicator* comm = nullptr);

}  // namespace shardtrain::optim
