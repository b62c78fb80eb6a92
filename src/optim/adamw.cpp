// AdamW over units: one ops::adamw_step per parameter range (padding is never touched).
#include "optim/adamw.h"

#include "ops/adamw.h"
#include "ops/elementwise.h"

#include <algorithm>

namespace shardtrain::optim {

AdamW::AdamW(const model::ModelLayout& layout, int rank, const AdamWConfig& config, DType dtype, Device device)
    : config_(config) {
  for (size_t i = 0; i < layout.units().size(); ++i) {
    const model::UnitLayout& u = layout.units()[i];
    const int64_t s = u.shard_numel();
    std::vector<Segment> segs;
    for (const model::ShardRange& r : model::shard_ranges(u, layout.shard_index(i, rank)))
      segs.push_back({r.shard_offset, r.count, r.spec->is_matrix || config.decay_1d});
    segments_.push_back(std::move(segs));
    exp_avg_.push_back(Tensor::empty({s}, dtype, device, "adamw exp_avg"));
    exp_avg_sq_.push_back(Tensor::empty({s}, dtype, device, "adamw exp_avg_sq"));
    ops::fill(exp_avg_.back(), 0.0);
    ops::fill(exp_avg_sq_.back(), 0.0);
  }
}

ops::AdamWOptions AdamW::begin_step(const std::vector<Tensor*>& params, const std::vector<const Tensor*>& grads,
                                    double lr, const std::vector<Tensor*>& compute_copies) {
  ST_ASSERT(params.size() == segments_.size() && grads.size() == segments_.size());
  ST_ASSERT(compute_copies.empty() || compute_copies.size() == segments_.size());
  ++steps_;
  ops::AdamWOptions o;
  o.lr = lr;
  o.beta1 = config_.beta1;
  o.beta2 = config_.beta2;
  o.eps = config_.eps;
  o.weight_decay = config_.weight_decay;
  o.step = steps_;
  o.host_f32 = config_.host_f32;
  return o;
}

void AdamW::append_unit(std::vector<ops::AdamWTensors>& tensors, size_t u, const std::vector<Tensor*>& params,
                        const std::vector<const Tensor*>& grads, const std::vector<Tensor*>& compute_copies) {
  for (const Segment& seg : segments_[u])
    tensors.push_back({params[u]->flat_range(seg.begin, seg.count), exp_avg_[u].flat_range(seg.begin, seg.count),
                       exp_avg_sq_[u].flat_range(seg.begin, seg.count), grads[u]->flat_range(seg.begin, seg.count),
                       seg.decay,
                       compute_copies.empty() ? Tensor() : compute_copies[u]->flat_range(seg.begin, seg.count)});
}

void AdamW::step(std::vector<Tensor*> params, const std::vector<const Tensor*>& grads, double lr, double grad_scale,
                 const std::vector<Tensor*>& compute_copies) {
  const ops::AdamWOptions o = begin_step(params, grads, lr, compute_copies);
  std::vector<ops::AdamWTensors> tensors;
  for (size_t u = 0; u < segments_.size(); ++u) append_unit(tensors, u, params, grads, compute_copies);
  ops::adamw_step_multi(tensors, o, grad_scale);
}

void AdamW::step_units(std::vector<Tensor*> params, const std::vector<const Tensor*>& grads, double lr,
                       double grad_scale, const std::vector<Tensor*>& compute_copies,
                       const std::function<void(size_t unit)>& after_unit) {
  const ops::AdamWOptions o = begin_step(params, grads, lr, compute_copies);
  for (size_t u = 0; u < segments_.size(); ++u) {
    std::vector<ops::AdamWTensors> tensors;
    append_unit(tensors, u, params, grads, compute_copies);
    ops::adamw_step_multi(tensors, o, grad_scale);
    after_unit(u);
  }
}

}  // namespace shardtrain::optim
