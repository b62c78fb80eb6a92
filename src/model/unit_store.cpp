// The resident unit store.
#include "model/unit_store.h"

#include "ops/elementwise.h"

namespace shardtrain::model {

ResidentUnitStore::ResidentUnitStore(const ModelLayout& layout, DType dtype, Device device, bool with_grads) {
  for (const UnitLayout& u : layout.units()) {
    params_.push_back(Tensor::empty({u.numel}, dtype, device, "parameters"));
    ops::fill(params_.back(), 0.0);
    if (!with_grads) continue;
    grads_.push_back(Tensor::empty({u.numel}, dtype, device, "gradients"));
    ops::fill(grads_.back(), 0.0);
  }
}

}  // namespace shardtrain::model
