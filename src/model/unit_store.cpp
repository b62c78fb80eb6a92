// The resident unit store.
#include "model/unit_store.h"

#include "ops/elementwise.h"

namespace shardtrain::model {

ResidentUnitStore::ResidentUnitStore(const ModelLayout& layout, DType dtype, Device device) {
  for (const UnitLayout& u : layout.units()) {
    params_.push_back(Tensor::empty({u.numel}, dtype, device, "parameters"));
    grads_.push_back(Tensor::empty({u.numel}, dtype, device, "gradients"));
    ops::fill(params_.back(), 0.0);
    ops::fill(grads_.back(), 0.0);
  }
}

}  // namespace shardtrain::model
