// AdamW over sharding units: state (exp_avg, exp_avg_sq) has the shape of each unit's
// (local shard of the) flat parameter buffer; weight decay applies to matrices, and to
// norms and biases only when asked (decay_1d).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/layout.h"

namespace shardtrain::optim {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  bool decay_1d = false;  // also decay norm weights and biases
};

class AdamW {
 public:
  AdamW(const model::ModelLayout& layout, const AdamWConfig& config, DType dtype, Device device);

  // One update of every unit with learning rate `lr`. params[u] and grads[u] are unit u's
  // flat buffers (same dtype as the state).
  void step(std::vector<Tensor*> params, const std::vector<const Tensor*>& grads, double lr);

  int64_t steps_taken() const { return steps_; }
  const AdamWConfig& config() const { return config_; }
  std::vector<Tensor>& exp_avg() { return exp_avg_; }
  std::vector<Tensor>& exp_avg_sq() { return exp_avg_sq_; }

 private:
  const model::ModelLayout* layout_;
  AdamWConfig config_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  int64_t steps_ = 0;
};

}  // namespace shardtrain::optim
