// One micro-batch's forward, loss and backward on a GPU, captured once into a CUDA graph and
// replayed, so the host issues one launch per micro-batch instead of ~50 per block.
// The first call runs eagerly (it fills the GEMM, attention and allocator caches); the
// second captures the same work on a stream of its own and replays it; later calls replay.
// Shapes and options are fixed at construction; before each replay the batch and the
// gradient scale are copied into the graph's own device buffers. The graph's temporaries
// come from its stream's free lists in the caching allocator, which no eager work draws
// from: a private pool (the eager step's cached blocks are returned to the driver before
// the capture, so the pool does not double the memory). One rank only: collectives are not
// captured yet.
#pragma once

#include <cstdint>
#include <memory>

#include "model/llama.h"

namespace shardtrain::model {

class CapturedStep {
 public:
  // `model` must outlive this and run on a GPU over a one-rank store.
  CapturedStep(Llama& model, int64_t batch, int64_t seq, const StepOptions& options);
  ~CapturedStep();
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  // Llama::forward_backward for ids_BT and targets_BT (i32 host tensors of the constructed
  // shape) with the options given at construction but this call's grad_scale (it reaches
  // the graph through a device scalar): eager on the first call, a graph replay from the
  // second on.
  LossSum run(const Tensor& ids_BT, const Tensor& targets_BT, double grad_scale);
  bool captured() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace shardtrain::model
