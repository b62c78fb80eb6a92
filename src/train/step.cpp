// One optimizer step: micro-batches, gradient norm, clipped AdamW update.
#include "train/step.h"

#include <utility>

#include "optim/clip.h"

namespace shardtrain::train {

OptimizerStep::OptimizerStep(model::Llama& model, fsdp::ShardedUnitStore& store, optim::AdamW& optimizer,
                             const fsdp::DeviceMesh& mesh, const OptimizerStepOptions& options)
    : model_(model),
      store_(store),
      optimizer_(optimizer),
      mesh_(mesh),
      micro_batches_(options.micro_batches),
      model_options_(options.model) {
  // The first micro-batch of a step writes the gradients over the last step's (no zero-fill),
  // unless one graph replays every micro-batch of several: then all of them add.
  writes_ = options.zero_fill ? model::GradientWrites{}
                              : model::gradient_writes(options.cuda_graph, micro_batches_, store_.grads_in_shards());
  model_options_.overwrite_grads = writes_.overwrites(0);
  if (options.cuda_graph)
    captured_ = std::make_unique<model::CapturedStep>(model_, options.batch_size, options.seq_len, model_options_);
  targets_ = store_.optimizer_targets();
}

OptimizerStep::~OptimizerStep() {
  try {
    store_.wait_for_host_update();
  } catch (...) {  // only when leaving by another error; the normal end waits and rethrows
  }
}

ForwardBackward OptimizerStep::forward_backward(const std::vector<Tensor>& ids, const std::vector<Tensor>& targets,
                                                double grad_scale, const std::vector<Tensor>& positions) {
  if (writes_.zero_shards) store_.zero_grad_shards();
  model_options_.grad_scale = grad_scale;
  ForwardBackward result;
  for (int64_t m = 0; m < micro_batches_; ++m) {
    const size_t micro_batch = static_cast<size_t>(m);
    model_options_.overwrite_grads = writes_.overwrites(m);
    store_.set_sync_replicas(m + 1 == micro_batches_);  // replicas exchange the step's gradients once
    result.loss_sum += captured_ ? captured_->run(ids[micro_batch], targets[micro_batch], grad_scale).loss_sum
                                 : model_
                                       .forward_backward(ids[micro_batch], targets[micro_batch], model_options_,
                                                         positions.empty() ? Tensor() : positions[micro_batch])
                                       .loss_sum;
    result.forward_s += model_.last_phase_times().forward_s;
    result.backward_s += model_.last_phase_times().backward_s;
    result.host_issue_s += model_.last_phase_times().host_issue_s;
  }
  return result;
}

double OptimizerStep::gradient_norm() {
  dist::Communicator* world = &mesh_.world();
  // offloaded with one micro-batch, the GPU summed the squares as the gradients went down
  if (const std::optional<double> landed = store_.landed_grad_sum_squares())
    return optim::grad_norm_from_sum_squares(*landed, world);
  if (mesh_.shape().tensor_parallel > 1 || mesh_.shape().replicate > 1) {
    // a group's copies of its replicated parameters (the blocks' norms), and the replicas'
    // copies of every gradient, count once
    const std::vector<Tensor> parts = store_.grad_norm_parts();
    std::vector<const Tensor*> views;
    for (const Tensor& part : parts) views.push_back(&part);
    return optim::global_grad_norm(views, world);
  }
  return optim::global_grad_norm(targets_.grads, world);
}

void OptimizerStep::update(double lr, double clip, bool skip, bool finish_now) {
  if (skip && store_.offloaded()) {
    // no update, but the next forward takes each unit from this step's host update as ever
    const size_t units = targets_.params.size();
    store_.run_host_update([units](const fsdp::ShardedUnitStore::UnitDone& done) {
      for (size_t u = 0; u < units; ++u) done(u);
    });
    if (finish_now) store_.wait_for_host_update();
  } else if (store_.offloaded()) {
    // on the host's cores beside the next step's forward, which takes each unit as it is
    // written; complete within this step where the caller reads the state next
    store_.run_host_update([this, lr, clip](const fsdp::ShardedUnitStore::UnitDone& done) {
      optimizer_.step_units(targets_.params, targets_.grads, lr, clip, targets_.compute_copies, done);
    });
    if (finish_now) store_.wait_for_host_update();
  } else if (!skip) {
    optimizer_.step(targets_.params, targets_.grads, lr, clip, targets_.compute_copies);  // writes the compute shards
  }
  synchronize(model_.device());  // step times are host-clock times of finished device work
}

}  // namespace shardtrain::train
