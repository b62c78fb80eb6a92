// AdamW over units: one ops::adamw_step per parameter range (padding is never touched).
#include "optim/adamw.h"

#include "ops/adamw.h"
#include "ops/elementwise.h"

#include <algorithm>

namespace shardtrain::optim {

AdamW::AdamW(const model::ModelLayout& layout, int rank, const AdamWConfig& config, DType dtype, Device device)
    : config_(config) {
  int64_t segments = 0;
  for (size_t i = 0; i < layout.units().size(); ++i) {
    const model::UnitLayout& u = layout.units()[i];
    const int64_t s = u.shard_numel();
    std::vector<Segment> segs;
    for (const model::ShardRange& r : model::shard_ranges(u, layout.shard_index(i, rank)))
      segs.push_back({r.shard_offset, r.count, r.spec->is_matrix || config.decay_1d, r.spec->name});
    first_segment_.push_back(segments);
    segments += static_cast<int64_t>(segs.size());
    segments_.push_back(std::move(segs));
    exp_avg_.push_back(Tensor::empty({s}, dtype, device, "adamw exp_avg"));
    exp_avg_sq_.push_back(Tensor::empty({s}, dtype, device, "adamw exp_avg_sq"));
    ops::fill(exp_avg_.back(), 0.0);
    ops::fill(exp_avg_sq_.back(), 0.0);
  }
  nonfinite_ = Tensor::empty({segments}, DType::kI32, device, "adamw nonfinite flags");
  const Tensor clear = Tensor::zeros({segments}, DType::kI32, Device::cpu(), "adamw nonfinite flags");
  copy(nonfinite_, clear);
}

std::vector<std::string> AdamW::nonfinite_parameters() const {
  std::vector<std::string> found;
  if (nonfinite_.numel() == 0) return found;
  Tensor host = Tensor::empty(nonfinite_.shape(), DType::kI32, Device::cpu(), "adamw nonfinite flags");
  copy(host, nonfinite_);
  const int32_t* flags = host.data<int32_t>();
  for (size_t u = 0; u < segments_.size(); ++u)
    for (size_t k = 0; k < segments_[u].size(); ++k) {
      const int32_t bits = flags[first_segment_[u] + static_cast<int64_t>(k)];
      if (bits == 0) continue;
      std::string which;
      for (const auto& [bit, what] : {std::pair{ops::kNonfiniteParam, "weights"}, std::pair{ops::kNonfiniteExpAvg, "exp_avg"},
                                      std::pair{ops::kNonfiniteExpAvgSq, "exp_avg_sq"}})
        if ((bits & bit) != 0) which += (which.empty() ? "" : ", ") + std::string(what);
      found.push_back("`" + segments_[u][k].name + "` (" + which + ")");
    }
  return found;
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
  ops::adamw_step_multi(tensors, o, grad_scale, &nonfinite_);
}

void AdamW::step_units(std::vector<Tensor*> params, const std::vector<const Tensor*>& grads, double lr,
                       double grad_scale, const std::vector<Tensor*>& compute_copies,
                       const std::function<void(size_t unit)>& after_unit) {
  const ops::AdamWOptions o = begin_step(params, grads, lr, compute_copies);
  for (size_t u = 0; u < segments_.size(); ++u) {
    std::vector<ops::AdamWTensors> tensors;
    append_unit(tensors, u, params, grads, compute_copies);
    Tensor flags = nonfinite_.flat_range(first_segment_[u], static_cast<int64_t>(segments_[u].size()));
    ops::adamw_step_multi(tensors, o, grad_scale, &flags);
    after_unit(u);
  }
}

}  // namespace shardtrain::optim
