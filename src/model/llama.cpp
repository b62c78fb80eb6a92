// Llama forward/backward over units; the output head and loss are fused (no [T x V] logits).
#include "model/llama.h"

#include "core/random.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"

namespace shardtrain::model {
namespace {

Tensor view_of(const Tensor& flat, const ParamSpec& p) {
  return flat.flat_range(p.offset, p.numel()).view(p.shape);
}

void check_batch(const Tensor& ids_BT, const LlamaConfig& c, const char* what) {
  ST_CHECK(ids_BT.ndim() == 2, what, ": expected ids of shape [B, T], found ", ids_BT.str());
  ST_CHECK(ids_BT.size(1) <= c.max_seq_len, what, ": sequence length ", ids_BT.size(1),
           " exceeds the model's max_seq_len ", c.max_seq_len);
}

}  // namespace

Llama::Llama(const LlamaConfig& config, DType dtype, Device device)
    : config_(config), layout_(ModelLayout::llama(config, 1)), dtype_(dtype), device_(device) {
  config_.validate("model.");
  for (const UnitLayout& u : layout_.units()) {
    params_.push_back(Tensor::zeros({u.numel}, dtype, device, "parameters"));
    grads_.push_back(Tensor::zeros({u.numel}, dtype, device, "gradients"));
  }
  for (size_t i = 0; i < layout_.units().size(); ++i) {
    const UnitLayout& u = layout_.units()[i];
    if (u.kind == UnitKind::kBlock) {
      block_params_.push_back(BlockWeights::view(params_[i], u, config_));
      block_grads_.push_back(BlockWeights::view(grads_[i], u, config_));
    }
  }
  embed_ = param("model.embed_tokens.weight");
  dembed_ = grad("model.embed_tokens.weight");
  final_norm_ = param("model.norm.weight");
  dfinal_norm_ = grad("model.norm.weight");
  if (!config_.tie_embeddings) {
    head_ = param("lm_head.weight");
    dhead_ = grad("lm_head.weight");
  }
  const int64_t K = config_.head_dim() / 2;
  cos_TK_ = Tensor::empty({config_.max_seq_len, K}, dtype, device, "rope cos");
  sin_TK_ = Tensor::empty({config_.max_seq_len, K}, dtype, device, "rope sin");
  ops::rope_table(cos_TK_, sin_TK_, config_.head_dim(), config_.rope);
}

Tensor Llama::param(const std::string& name) const {
  const ModelLayout::Location loc = layout_.locate(name);
  return view_of(params_[static_cast<size_t>(loc.unit)], *loc.spec);
}

Tensor Llama::grad(const std::string& name) const {
  const ModelLayout::Location loc = layout_.locate(name);
  return view_of(grads_[static_cast<size_t>(loc.unit)], *loc.spec);
}

void Llama::init_random(uint64_t seed) {
  for (size_t u = 0; u < layout_.units().size(); ++u) {
    for (const ParamSpec& p : layout_.units()[u].params) {
      Tensor v = view_of(params_[u], p);
      switch (p.init) {
        case ParamInit::kOnes: ops::fill(v, 1.0); break;
        case ParamInit::kZeros: ops::fill(v, 0.0); break;
        case ParamInit::kNormal: {
          // generated in f64 on the host, then converted to the parameter dtype
          Tensor host = Tensor::empty({p.numel()}, DType::kF64, Device::cpu(), "init");
          double* h = host.data<double>();
          const uint64_t key = name_key(p.name);
          for (int64_t i = 0; i < p.numel(); ++i)
            h[i] = config_.init_std * normal_at(seed, key, static_cast<uint64_t>(i));
          Tensor flat = v.view({p.numel()});
          ops::cast(flat, host);
          break;
        }
      }
    }
  }
}

void Llama::zero_grads() {
  for (Tensor& g : grads_) ops::fill(g, 0.0);
}

const Tensor& Llama::head_weight() const { return config_.tie_embeddings ? embed_ : head_; }
Tensor& Llama::head_weight_grad() { return config_.tie_embeddings ? dembed_ : dhead_; }

BlockContext Llama::context(int64_t batch, int64_t seq) const {
  BlockContext ctx;
  ctx.config = &config_;
  ctx.batch = batch;
  ctx.seq = seq;
  ctx.cos_TK = cos_TK_;
  ctx.sin_TK = sin_TK_;
  return ctx;
}

Tensor Llama::forward_hidden(const Tensor& ids_BT, std::vector<BlockActivations>& acts, Tensor& final_rstd_T,
                             Tensor& final_in_TD, ActivationCheckpointing checkpointing) {
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1), D = config_.dim;
  const BlockContext ctx = context(B, T);
  Tensor x_BTD = Tensor::empty({B, T, D}, dtype_, device_, "embeddings");
  Tensor x_TD = x_BTD.view({B * T, D});
  ops::embedding_forward(x_TD, ids_BT.view({B * T}), embed_);
  acts.assign(static_cast<size_t>(config_.n_layers), BlockActivations());
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    BlockActivations& a = acts[static_cast<size_t>(l)];
    block_forward(a, block_params_[static_cast<size_t>(l)], x_BTD, ctx);
    x_BTD = a.y_BTD;
    if (checkpointing == ActivationCheckpointing::kFull) a.release_all_but_input();
  }
  final_in_TD = x_BTD.view({B * T, D});
  Tensor h_TD = Tensor::empty({B * T, D}, dtype_, device_, "final norm");
  final_rstd_T = Tensor::empty({B * T}, ops::stats_dtype(dtype_), device_, "final rstd");
  ops::rmsnorm_forward(h_TD, final_rstd_T, final_in_TD, final_norm_, {config_.norm_eps});
  return h_TD;
}

LossSum Llama::forward_backward(const Tensor& ids_BT, const Tensor& targets_BT, const StepOptions& o) {
  check_batch(ids_BT, config_, "forward_backward");
  check_shape(targets_BT, ids_BT.shape(), "forward_backward", "targets_BT");
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1), D = config_.dim;
  std::vector<BlockActivations> acts;
  Tensor final_rstd_T, final_in_TD;
  Tensor h_TD = forward_hidden(ids_BT, acts, final_rstd_T, final_in_TD, o.checkpointing);

  Tensor loss = Tensor::zeros({1}, DType::kF64, Device::cpu(), "loss");
  Tensor dh_TD = Tensor::empty({B * T, D}, dtype_, device_, "dh");
  ops::CrossEntropyOptions ce;
  ce.ignore_index = o.ignore_index;
  ce.grad_scale = o.grad_scale;
  ce.chunk_tokens = o.loss_chunk_tokens;
  ops::linear_cross_entropy(loss, dh_TD, head_weight_grad(), h_TD, head_weight(), targets_BT.view({B * T}), ce);
  h_TD = Tensor();

  Tensor dx_BTD = Tensor::empty({B, T, D}, dtype_, device_, "dx");
  Tensor dx_TD = dx_BTD.view({B * T, D});
  ops::rmsnorm_backward(dx_TD, dfinal_norm_, dh_TD, final_in_TD, final_norm_, final_rstd_T);
  dh_TD = Tensor();

  const BlockContext ctx = context(B, T);
  Tensor dprev_BTD = Tensor::empty({B, T, D}, dtype_, device_, "dx");
  for (int64_t l = config_.n_layers - 1; l >= 0; --l) {
    BlockActivations& a = acts[static_cast<size_t>(l)];
    if (o.checkpointing == ActivationCheckpointing::kFull) {
      const Tensor input = a.x_BTD;
      block_forward(a, block_params_[static_cast<size_t>(l)], input, ctx);
    }
    block_backward(dprev_BTD, block_grads_[static_cast<size_t>(l)], dx_BTD, a, block_params_[static_cast<size_t>(l)],
                   ctx);
    a = BlockActivations();
    std::swap(dx_BTD, dprev_BTD);
  }
  ops::embedding_backward(dembed_, dx_BTD.view({B * T, D}), ids_BT.view({B * T}));

  LossSum r;
  r.loss_sum = loss.data<double>()[0];
  const int32_t* t = targets_BT.data<int32_t>();
  for (int64_t i = 0; i < B * T; ++i) r.tokens += t[i] != o.ignore_index;
  return r;
}

LossSum Llama::evaluate(const Tensor& ids_BT, const Tensor& targets_BT, const StepOptions& o) {
  check_batch(ids_BT, config_, "evaluate");
  check_shape(targets_BT, ids_BT.shape(), "evaluate", "targets_BT");
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1);
  std::vector<BlockActivations> acts;
  Tensor final_rstd_T, final_in_TD;
  // Activations are dropped block by block: evaluation keeps only block inputs.
  const Tensor h_TD = forward_hidden(ids_BT, acts, final_rstd_T, final_in_TD, ActivationCheckpointing::kFull);
  Tensor loss = Tensor::zeros({1}, DType::kF64, Device::cpu(), "loss");
  Tensor none_dh, none_dw;
  ops::CrossEntropyOptions ce;
  ce.ignore_index = o.ignore_index;
  ce.chunk_tokens = o.loss_chunk_tokens;
  ce.compute_grad = false;
  ops::linear_cross_entropy(loss, none_dh, none_dw, h_TD, head_weight(), targets_BT.view({B * T}), ce);
  LossSum r;
  r.loss_sum = loss.data<double>()[0];
  const int32_t* t = targets_BT.data<int32_t>();
  for (int64_t i = 0; i < B * T; ++i) r.tokens += t[i] != o.ignore_index;
  return r;
}

Tensor Llama::last_logits(const Tensor& ids_BT) {
  check_batch(ids_BT, config_, "last_logits");
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1), D = config_.dim;
  std::vector<BlockActivations> acts;
  Tensor final_rstd_T, final_in_TD;
  const Tensor h_TD = forward_hidden(ids_BT, acts, final_rstd_T, final_in_TD, ActivationCheckpointing::kFull);
  Tensor last_BD = Tensor::empty({B, D}, dtype_, device_, "last hidden");
  for (int64_t b = 0; b < B; ++b) {
    Tensor dst = last_BD.slice(0, b, b + 1);
    ops::cast(dst, h_TD.slice(0, b * T + T - 1, b * T + T));
  }
  Tensor logits_BV = Tensor::empty({B, config_.vocab_size}, dtype_, device_, "logits");
  ops::linear_forward(logits_BV, last_BD, head_weight());
  return logits_BV;
}

}  // namespace shardtrain::model
