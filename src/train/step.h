// One optimizer step of a sharded model: each micro-batch's forward and backward (a CUDA
// graph's replay where one was captured), the global gradient norm, and the clipped AdamW
// update (on the host's cores beside the next step's forward when the shards are offloaded).
// Trainer::run and the benchmark programs run the same step through OptimizerStep.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "fsdp/sharded_store.h"
#include "fsdp/tensor_parallel.h"
#include "model/captured_step.h"
#include "model/llama.h"
#include "optim/adamw.h"

namespace shardtrain::train {

struct OptimizerStepOptions {
  int64_t batch_size = 1;     // B: sequences of a micro-batch on this rank
  int64_t seq_len = 1;        // T: tokens of a sequence
  int64_t micro_batches = 1;  // per optimizer step (training.grad_accum_steps)
  // One GPU: each micro-batch's forward and backward is a CUDA graph's replay after the first
  // step (model/captured_step.h). The caller decides whether the run allows one.
  bool cuda_graph = false;
  // The gradient shards are cleared before each step and every micro-batch adds to them (a
  // benchmark's comparison; by default the first micro-batch writes over the last step's).
  bool zero_fill = false;
  // The forward and backward's options; grad_scale and overwrite_grads are set at each step.
  model::StepOptions model;
};

// A step's forward and backward over its micro-batches.
struct ForwardBackward {
  double loss_sum = 0;  // over this rank's token rows of every micro-batch (not reduced)
  double forward_s = 0, backward_s = 0, host_issue_s = 0;  // model::PhaseTimes summed over the micro-batches
};

class OptimizerStep {
 public:
  // `model`, `store`, `optimizer` and `mesh` must outlive this. With options.cuda_graph, the
  // graph is made here (captured at the first step).
  OptimizerStep(model::Llama& model, fsdp::ShardedUnitStore& store, optim::AdamW& optimizer,
                const fsdp::DeviceMesh& mesh, const OptimizerStepOptions& options);
  // An offloaded host update still in flight reads the optimizer targets: waits for it (an
  // error of it is dropped here, where another error is already leaving; wait for the update
  // before the end to see it).
  ~OptimizerStep();
  OptimizerStep(const OptimizerStep&) = delete;
  OptimizerStep& operator=(const OptimizerStep&) = delete;

  bool graphed() const { return captured_ != nullptr; }
  const model::StepOptions& model_options() const { return model_options_; }
  // The first micro-batch's gradient writes (model::gradient_writes).
  const model::GradientWrites& gradient_writes() const { return writes_; }

  // Forward and backward of every micro-batch (ids[m], targets[m]: i32 host tensors of B x T),
  // the gradients scaled by `grad_scale` (1 / the tokens counted in the global batch) and
  // reduced into the gradient shards; the replicas exchange theirs after the last micro-batch.
  // positions[m] (data.document_mask; empty: none): each token's position in its document, as
  // model::Llama::forward_backward takes them.
  ForwardBackward forward_backward(const std::vector<Tensor>& ids, const std::vector<Tensor>& targets,
                                   double grad_scale, const std::vector<Tensor>& positions = {});
  // The global L2 norm of the step's gradients, before clipping (collective over the mesh's
  // world). Copies of a gradient (a tensor-parallel group's replicated parameters, the
  // replicas' shards) count once; offloaded with one micro-batch, from the sums of squares the
  // GPU took as the gradients went down.
  double gradient_norm();
  // The AdamW update at `lr` with the clip coefficient `clip` (optim::clip_coefficient), or
  // with `skip` none. Offloaded, the update runs on the host's threads beside the next step's
  // forward (a skipped one only marks every unit done), unless `finish_now` waits for it here.
  // Then waits for the device: step times are host-clock times of finished device work.
  void update(double lr, double clip, bool skip, bool finish_now);

 private:
  model::Llama& model_;
  fsdp::ShardedUnitStore& store_;
  optim::AdamW& optimizer_;
  const fsdp::DeviceMesh& mesh_;
  int64_t micro_batches_;
  model::StepOptions model_options_;
  model::GradientWrites writes_;
  std::unique_ptr<model::CapturedStep> captured_;
  fsdp::ShardedUnitStore::OptimizerTargets targets_;  // the shards AdamW reads and writes
};

}  // namespace shardtrain::train
