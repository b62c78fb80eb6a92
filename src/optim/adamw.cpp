// AdamW over units: one ops::adamw_step per parameter range (padding is never touched).
#include "optim/adamw.h"

#include "ops/adamw.h"

namespace shardtrain::optim {

AdamW::AdamW(const model::ModelLayout& layout, const AdamWConfig& config, DType dtype, Device device)
    : layout_(&layout), config_(config) {
  for (const model::UnitLayout& u : layout.units()) {
    exp_avg_.push_back(Tensor::zeros({u.numel}, dtype, device, "adamw exp_avg"));
    exp_avg_sq_.push_back(Tensor::zeros({u.numel}, dtype, device, "adamw exp_avg_sq"));
  }
}

void AdamW::step(std::vector<Tensor*> params, const std::vector<const Tensor*>& grads, double lr) {
  const auto& units = layout_->units();
  ST_ASSERT(params.size() == units.size() && grads.size() == units.size());
  ++steps_;
  for (size_t u = 0; u < units.size(); ++u) {
    for (const model::ParamSpec& p : units[u].params) {
      ops::AdamWOptions o;
      o.lr = lr;
      o.beta1 = config_.beta1;
      o.beta2 = config_.beta2;
      o.eps = config_.eps;
      o.weight_decay = (p.is_matrix || config_.decay_1d) ? config_.weight_decay : 0.0;
      o.step = steps_;
      Tensor w = params[u]->flat_range(p.offset, p.numel());
      Tensor m = exp_avg_[u].flat_range(p.offset, p.numel());
      Tensor v = exp_avg_sq_[u].flat_range(p.offset, p.numel());
      const Tensor g = grads[u]->flat_range(p.offset, p.numel());
      ops::adamw_step(w, m, v, g, o);
    }
  }
}

}  // namespace shardtrain::optim
