// AdamW over this rank's shards of the sharding units: state (exp_avg, exp_avg_sq) has the
// shape of each unit's local shard; updates run on the pieces of the shard that belong to a
// parameter (padding is never touched); weight decay applies to matrices, and to norms and
// biases only when asked (decay_1d).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/layout.h"
#include "ops/adamw.h"

namespace shardtrain::optim {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  bool decay_1d = false;  // also decay norm weights and biases
  // State on the host for a GPU run (parallel.offload): f32 arithmetic in one fused, threaded
  // pass that also writes the compute copies (ops::AdamWOptions::host_f32).
  bool host_f32 = false;
};

class AdamW {
 public:
  // State for the slices of `layout`'s units that world rank `rank` owns
  // (ModelLayout::shard_index).
  AdamW(const model::ModelLayout& layout, int rank, const AdamWConfig& config, DType dtype, Device device);

  // One update of every unit with learning rate `lr`, all in one multi-tensor pass.
  // params[u] and grads[u] are this rank's shard of unit u [shard_numel] (same dtype as the
  // state); each gradient is first multiplied by grad_scale (a clipping coefficient).
  // compute_copies, when not empty, holds one compute-dtype tensor per unit shaped as params[u]:
  // each parameter range is overwritten with its updated weights rounded to that dtype.
  void step(std::vector<Tensor*> params, const std::vector<const Tensor*>& grads, double lr, double grad_scale = 1.0,
            const std::vector<Tensor*>& compute_copies = {});
  // The same update unit by unit in unit order, calling after_unit(u) once unit u's weights
  // (and compute copy) are written: for the host update of parallel.offload, which overlaps
  // the next forward (fsdp::ShardedUnitStore::run_host_update). Every element's update is
  // independent of the others, so the results are step()'s bit for bit.
  void step_units(std::vector<Tensor*> params, const std::vector<const Tensor*>& grads, double lr, double grad_scale,
                  const std::vector<Tensor*>& compute_copies, const std::function<void(size_t unit)>& after_unit);

  // The parameters whose updated weights or state held NaN or inf after any update so far
  // (flagged in the update's own pass: ops::adamw_step_multi's nonfinite_flags), e.g.
  // "`model.layers.0.mlp.up_proj.weight` (weights, exp_avg_sq)"; empty while all are finite.
  // Reads a few bytes from the state's device: call once the update is done (the stream
  // synchronised, parallel.offload's host update waited for).
  std::vector<std::string> nonfinite_parameters() const;

  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t steps) { steps_ = steps; }  // when resuming from a checkpoint
  const AdamWConfig& config() const { return config_; }
  std::vector<Tensor>& exp_avg() { return exp_avg_; }
  std::vector<Tensor>& exp_avg_sq() { return exp_avg_sq_; }

 private:
  struct Segment {
    int64_t begin, count;  // within the shard
    bool decay;
    std::string name;  // the parameter's (model::ParamSpec::name)
  };
  // Checks the arguments and counts the step; the options of its update.
  ops::AdamWOptions begin_step(const std::vector<Tensor*>& params, const std::vector<const Tensor*>& grads, double lr,
                               const std::vector<Tensor*>& compute_copies);
  void append_unit(std::vector<ops::AdamWTensors>& tensors, size_t u, const std::vector<Tensor*>& params,
                   const std::vector<const Tensor*>& grads, const std::vector<Tensor*>& compute_copies);
  AdamWConfig config_;
  std::vector<std::vector<Segment>> segments_;  // per unit
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  // i32 [segments of all units], on the state's device: unit u's segments from
  // first_segment_[u]; ops::kNonfinite* bits, never cleared
  Tensor nonfinite_;
  std::vector<int64_t> first_segment_;
  int64_t steps_ = 0;
};

}  // namespace shardtrain::optim
