// Where the model gets each sharding unit's full parameters and gradient buffer, with hooks
// around their use: the resident store of a 1-rank run keeps everything allocated; a
// sharded store (fsdp/) gathers a unit before use, and reduce-scatters and frees after.
#pragma once

#include <cstddef>
#include <vector>

#include "core/tensor.h"
#include "model/layout.h"

namespace shardtrain::model {

// kForward: training forward (a store may keep a unit gathered for the backward);
// kBackward: backward and recompute; kEval: forward only (evaluation, sampling).
enum class Pass { kForward, kBackward, kEval };

class UnitStore {
 public:
  virtual ~UnitStore() = default;
  // The full parameter buffer [unit.numel] of `unit`, valid until release_params(unit, pass).
  virtual Tensor acquire_params(size_t unit, Pass pass) = 0;
  virtual void release_params(size_t unit, Pass pass) = 0;
  // The full gradient buffer [unit.numel]; parameter gradients accumulate into it. With
  // `overwrite`, the caller's backward replaces every parameter's gradient with its first
  // write (the first micro-batch of a step): the store need not clear a buffer it hands out
  // (it keeps the padding between parameters zero). A store that hands out the gradient
  // shards themselves (one rank) then loses what they held, so ask for it only where that
  // is wanted.
  virtual Tensor acquire_grads(size_t unit, bool overwrite) = 0;
  // The unit's gradient for this micro-batch is complete.
  virtual void release_grads(size_t unit) = 0;
  // The backward of a micro-batch is over: every gradient released so far must be in the
  // shards before the caller reads them (a store that reduces asynchronously waits here).
  virtual void finish_backward() {}
  // Before each replay of a captured step (model/captured_step.h): a replay repeats the
  // kernels, not this host code, so a store whose parameters can go out of date outside the
  // step (compute copies after an outside write of the masters) refreshes them here.
  virtual void before_replay() {}
};

// Every unit's parameters and gradients stay allocated: the store of a single rank. Without
// `with_grads` there are no gradient buffers (a model for evaluation and sampling only).
class ResidentUnitStore final : public UnitStore {
 public:
  ResidentUnitStore(const ModelLayout& layout, DType dtype, Device device, bool with_grads = true);

  Tensor acquire_params(size_t unit, Pass) override { return params_[unit]; }
  void release_params(size_t, Pass) override {}
  Tensor acquire_grads(size_t unit, bool) override {
    ST_ASSERT(unit < grads_.size(), "gradients of a store made without them");
    return grads_[unit];
  }
  void release_grads(size_t) override {}

  std::vector<Tensor>& params() { return params_; }
  std::vector<Tensor>& grads() { return grads_; }

 private:
  std::vector<Tensor> params_;  // [unit.numel] each
  std::vector<Tensor> grads_;
};

}  // namespace shardtrain::model
