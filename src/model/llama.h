// The whole Llama model on one rank's full (gathered) parameters: embedding, blocks,
// final norm and the fused head + loss. Parameters and gradients live in one flat buffer
// per sharding unit (model/layout.h); everything else is views.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/block.h"
#include "model/config.h"
#include "model/layout.h"

namespace shardtrain::model {

enum class ActivationCheckpointing { kNone, kFull };

struct StepOptions {
  double grad_scale = 1.0;  // multiplies all gradients: 1 / tokens counted in the global batch
  ActivationCheckpointing checkpointing = ActivationCheckpointing::kNone;
  int64_t loss_chunk_tokens = 256;
  int32_t ignore_index = -100;
};

struct LossSum {
  double loss_sum = 0;  // summed over counted tokens
  int64_t tokens = 0;   // tokens whose target is not ignore_index
};

class Llama {
 public:
  // Allocates the unit buffers (params and grads, zeroed) in `dtype` on `device`.
  Llama(const LlamaConfig& config, DType dtype, Device device = Device::cpu());

  const LlamaConfig& config() const { return config_; }
  const ModelLayout& layout() const { return layout_; }
  DType dtype() const { return dtype_; }

  // Unit u's flat parameter / gradient buffer [layout().units()[u].numel].
  Tensor& unit_params(size_t u) { return params_[u]; }
  Tensor& unit_grads(size_t u) { return grads_[u]; }
  // A parameter (or its gradient) by HF name, as a shaped view.
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;

  // Counter-based init: element i of parameter p is a function of (seed, p's name, i) only.
  void init_random(uint64_t seed);
  void zero_grads();

  // One micro-batch: forward, loss and backward; gradients accumulate (scaled by
  // options.grad_scale). ids_BT and targets_BT are i32 host tensors; T <= max_seq_len.
  LossSum forward_backward(const Tensor& ids_BT, const Tensor& targets_BT, const StepOptions& options);
  // Forward and loss only.
  LossSum evaluate(const Tensor& ids_BT, const Tensor& targets_BT, const StepOptions& options);
  // Logits [B, V] of the last position of each sequence (for sampling).
  Tensor last_logits(const Tensor& ids_BT);

 private:
  Tensor forward_hidden(const Tensor& ids_BT, std::vector<BlockActivations>& acts, Tensor& final_rstd_T,
                        Tensor& final_in_TD, ActivationCheckpointing checkpointing);
  BlockContext context(int64_t batch, int64_t seq) const;
  const Tensor& head_weight() const;
  Tensor& head_weight_grad();

  LlamaConfig config_;
  ModelLayout layout_;
  DType dtype_;
  Device device_;
  std::vector<Tensor> params_;
  std::vector<Tensor> grads_;
  std::vector<BlockWeights> block_params_, block_grads_;
  Tensor embed_, dembed_, final_norm_, dfinal_norm_, head_, dhead_;
  Tensor cos_TK_, sin_TK_;
};

}  // namespace shardtrain::model
