// Llama forward/backward over units acquired from a UnitStore; the output head and loss
// are fused (no [T x V] logits). Unit order: 0 embedding, 1..L blocks, L+1 final norm + head.
#include "model/llama.h"

#include <chrono>
#include <cmath>

#include "core/profile.h"
#include "core/random.h"
#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/stream.h"
#endif
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"

namespace shardtrain::model {
namespace {

constexpr size_t kEmbedUnit = 0;

Tensor view_of(const Tensor& flat, const ParamSpec& p) {
  return flat.flat_range(p.offset, p.numel()).view(p.shape);
}

void check_batch(const Tensor& ids_BT, const LlamaConfig& c, const char* what) {
  ST_CHECK(ids_BT.ndim() == 2, what, ": expected ids of shape [B, T], found ", ids_BT.str());
  ST_CHECK(ids_BT.size(1) <= c.max_seq_len, what, ": sequence length ", ids_BT.size(1),
           " exceeds the model's max_seq_len ", c.max_seq_len);
}

// Counts the targets that are not ignore_index, checking each lies in [0, V): the device
// loss then needs no check of its own (which would read back to the host mid-step).
int64_t count_targets(const Tensor& targets_BT, int32_t ignore_index, int64_t V, const char* what) {
  ST_CHECK(targets_BT.device().is_cpu() && targets_BT.dtype() == DType::kI32, what,
           ": targets must be an i32 host tensor, found ", targets_BT.str());
  int64_t n = 0;
  const int32_t* t = targets_BT.data<int32_t>();
  for (int64_t i = 0; i < targets_BT.numel(); ++i) {
    if (t[i] == ignore_index) continue;
    ST_CHECK(t[i] >= 0 && t[i] < V, what, ": target ", t[i], " at position ", i, " outside [0, ", V,
             ") and not the ignore index ", ignore_index);
    ++n;
  }
  return n;
}

}  // namespace

void init_param_range(Tensor& out, const ParamSpec& spec, int64_t first, uint64_t seed, double init_std) {
  ST_ASSERT(first >= 0 && first + out.numel() <= spec.numel());
  Tensor flat = out.view({out.numel()});
  switch (spec.init) {  // computed where `out` lives: a GPU initialises its own shards
    case ParamInit::kOnes: ops::fill(flat, 1.0); return;
    case ParamInit::kZeros: ops::fill(flat, 0.0); return;
    case ParamInit::kNormal:
      // keyed by the element's index in the whole parameter: a tensor-parallel part gets the
      // values the whole parameter has there
      for_each_run(spec, first, out.numel(), [&](int64_t full_first, int64_t local_first, int64_t n) {
        Tensor run = flat.flat_range(local_first - first, n);
        ops::fill_normal(run, seed, name_key(spec.name), full_first, init_std);
      });
      return;
  }
}

Llama::Llama(const LlamaConfig& config, DType dtype, Device device)
    : config_(config), layout_(ModelLayout::llama(config, 1)), dtype_(dtype), device_(device) {
  config_.validate("model.");
  resident_ = std::make_unique<ResidentUnitStore>(layout_, dtype, device);
  store_ = resident_.get();
  make_rope_tables();
}

Llama::Llama(const LlamaConfig& config, const ModelLayout& layout, UnitStore* store, DType dtype, Device device)
    : config_(config), layout_(layout), dtype_(dtype), device_(device), store_(store) {
  config_.validate("model.");
  make_rope_tables();
}

void Llama::make_rope_tables() {
  // computed in f64 on the host, then rounded once to the model's dtype on its device
  // K: the frequencies of each head's rotated dimensions (all, or a partial rotary's share)
  const int64_t K = config_.rotary_dim() / 2;
  auto make = [&](Tensor& cos_TK, Tensor& sin_TK, const ops::RopeOptions& rope, bool long_factors = false) {
    Tensor cos = Tensor::empty({config_.max_seq_len, K}, DType::kF64, Device::cpu(), "rope cos");
    Tensor sin = Tensor::empty({config_.max_seq_len, K}, DType::kF64, Device::cpu(), "rope sin");
    ops::rope_table(cos, sin, config_.head_dim(), rope, long_factors);
    cos_TK = Tensor::empty({config_.max_seq_len, K}, dtype_, device_, "rope cos");
    sin_TK = Tensor::empty({config_.max_seq_len, K}, dtype_, device_, "rope sin");
    ops::cast(cos_TK, cos);
    ops::cast(sin_TK, sin);
  };
  make(cos_TK_, sin_TK_, config_.rope);
  // LongRoPE: its long factors for sequences past original_max_positions
  if (config_.rope.scaling.type == ops::RopeScalingType::kLongRope)
    make(long_cos_TK_, long_sin_TK_, config_.rope, true);
  // Gemma 3: the sliding layers' own base, unscaled
  for (int64_t l = 0; l < config_.n_layers && config_.has_local_rope(); ++l)
    if (config_.window_of(l) > 0) {
      make(local_cos_TK_, local_sin_TK_, config_.rope_of(l));
      break;
    }
}

double Llama::embedding_scale() const {
  double s = config_.embedding_multiplier;
  if (config_.scale_embeddings) {
    // transformers' normalizer: sqrt(D) as an f32 value, cast to the activations' dtype
    const float root = static_cast<float>(std::sqrt(static_cast<double>(config_.dim)));
    s *= dtype_ == DType::kBF16  ? static_cast<double>(bf16_to_float(float_to_bf16(root)))
         : dtype_ == DType::kF16 ? static_cast<double>(f16_to_float(float_to_f16(root)))
                                 : static_cast<double>(root);
  }
  return s;
}

Tensor Llama::on_device(const Tensor& host) const {
  if (host.device() == device_) return host;
  Tensor t = Tensor::empty(host.shape(), host.dtype(), device_, "model input");
  copy(t, host);
  return t;
}

Tensor Llama::new_loss() const {
  // the CPU loss sums in f64; the CUDA one in f32 on the device
  Tensor loss = Tensor::empty({1}, device_.is_cpu() ? DType::kF64 : DType::kF32, device_, "loss");
  ops::fill(loss, 0.0);
  return loss;
}

double Llama::read_loss(const Tensor& loss) {
  Tensor host = Tensor::empty({1}, DType::kF64, Device::cpu(), "loss");
  ops::cast(host, loss);
  return host.data<double>()[0];
}

Tensor& Llama::unit_params(size_t u) {
  ST_ASSERT(resident_ != nullptr, "unit_params of a model over an external store");
  return resident_->params()[u];
}

Tensor& Llama::unit_grads(size_t u) {
  ST_ASSERT(resident_ != nullptr, "unit_grads of a model over an external store");
  return resident_->grads()[u];
}

Tensor Llama::param(const std::string& name) const {
  ST_ASSERT(resident_ != nullptr, "param() of a model over an external store");
  const ModelLayout::Location loc = layout_.locate(name);
  return view_of(resident_->params()[static_cast<size_t>(loc.unit)], *loc.spec);
}

Tensor Llama::grad(const std::string& name) const {
  ST_ASSERT(resident_ != nullptr, "grad() of a model over an external store");
  const ModelLayout::Location loc = layout_.locate(name);
  return view_of(resident_->grads()[static_cast<size_t>(loc.unit)], *loc.spec);
}

void Llama::init_random(uint64_t seed) {
  for (size_t u = 0; u < layout_.units().size(); ++u)
    for (const ParamSpec& p : layout_.units()[u].params) {
      Tensor v = param(p.name);
      init_param_range(v, p, 0, seed, config_.init_std);
    }
}

void Llama::zero_grads() {
  ST_ASSERT(resident_ != nullptr, "zero_grads of a model over an external store");
  for (Tensor& g : resident_->grads()) ops::fill(g, 0.0);
}

Tensor Llama::view(const Tensor& unit_buffer, size_t unit, const char* name) const {
  const ParamSpec* p = layout_.units()[unit].find(name);
  ST_ASSERT(p != nullptr, "unit ", layout_.units()[unit].name, " has no ", name);
  return view_of(unit_buffer, *p);
}

Tensor Llama::head_weight(const Tensor& embed_params, const Tensor& head_params) const {
  return config_.tie_embeddings ? view(embed_params, kEmbedUnit, kEmbeddingName)
                                : view(head_params, head_unit(), kHeadName);
}

void Llama::release_head(Pass pass) {
  store_->release_params(head_unit(), pass);
  if (config_.tie_embeddings) store_->release_params(kEmbedUnit, pass);
}

ActivationCheckpointing parse_checkpointing(const std::string& name, const std::string& what) {
  if (name == "none") return ActivationCheckpointing::kNone;
  if (name == "pointwise") return ActivationCheckpointing::kPointwise;
  if (name == "selective") return ActivationCheckpointing::kSelective;
  if (name == "full") return ActivationCheckpointing::kFull;
  ST_THROW(what, ": expected none, pointwise, selective or full, found \"", name, "\"");
}

const char* checkpointing_name(ActivationCheckpointing c) {
  switch (c) {
    case ActivationCheckpointing::kNone: return "none";
    case ActivationCheckpointing::kPointwise: return "pointwise";
    case ActivationCheckpointing::kSelective: return "selective";
    case ActivationCheckpointing::kFull: return "full";
  }
  return "?";
}

void Llama::set_tensor_parallel(TensorParallel* tp) {
  const int parts = tp != nullptr ? tp->size() : 1;
  ST_CHECK(parts == 1 || cp_ == nullptr, "parallel.tensor_parallel = ", parts, " with parallel.context_parallel = ",
           cp_ ? cp_->size() : 1, ": context parallelism does not combine with tensor parallelism yet; set one of "
           "them to 1");
  ST_CHECK(layout_.mesh().tensor_parallel == parts, "tensor parallelism over ", parts,
           " ranks for a layout of parts for ", layout_.mesh().tensor_parallel);
  ST_CHECK(tp == nullptr || tp->rank() == layout_.tp_rank(), "tensor-parallel rank ", tp ? tp->rank() : 0,
           " for a layout of part ", layout_.tp_rank());
  tp_ = parts > 1 ? tp : nullptr;
}

std::pair<int64_t, int64_t> Llama::residual_rows(int64_t batch, int64_t seq, ResidualSplit split) const {
  const int64_t rows = batch * seq;
  if (tp_ == nullptr || split == ResidualSplit::kReplicated) return {0, rows};
  ST_CHECK(rows % tp_->size() == 0, "sequence parallelism splits a batch's ", batch, " x ", seq, " = ", rows,
           " token rows over the ", tp_->size(), " ranks of the tensor-parallel group, which does not divide them; ",
           "make training.batch_size x training.seq_len a multiple of parallel.tensor_parallel");
  const int64_t count = rows / tp_->size();
  return {tp_->rank() * count, count};
}

void Llama::set_context_parallel(ContextParallel* cp) {
  if (cp == nullptr || cp->size() == 1) {
    cp_ = nullptr;
    return;
  }
  const char* key = "parallel.context_parallel";
  ST_CHECK(tp_ == nullptr, key, " = ", cp->size(), " with parallel.tensor_parallel = ", tp_ ? tp_->size() : 1,
           ": context parallelism does not combine with tensor parallelism yet; set one of them to 1");
  for (int64_t l = 0; l < config_.n_layers; ++l)
    ST_CHECK(config_.window_of(l) == 0, key, " = ", cp->size(), ": layer ", l, " has a sliding window of ",
             config_.window_of(l), " tokens, which the ring attention does not support yet; set ", key, " to 1");
  ST_CHECK(config_.attn_logit_softcapping == 0, key, " = ", cp->size(), " with attention scores soft-capped at ",
           config_.attn_logit_softcapping, " (Gemma 2): the ring attention does not soft-cap yet; set ", key, " to 1");
  ST_CHECK(!fp8_attention_history_L4_.defined(), key, " = ", cp->size(),
           " with training.fp8_attention on: the ring attention runs in the compute dtype; turn one of them off");
  cp_ = cp;
}

void Llama::refuse_context_parallel(const char* what) const {
  ST_CHECK(cp_ == nullptr, what, " is not supported with context parallelism (parallel.context_parallel = ",
           cp_ ? cp_->size() : 1, "): a rank holds only its chunks of each sequence; use a model without it");
}

void Llama::set_fp8_attention(bool on) {
  ST_CHECK(!on || cp_ == nullptr, "training.fp8_attention with parallel.context_parallel = ", cp_ ? cp_->size() : 1,
           ": the ring attention runs in the compute dtype; turn one of them off");
  ST_CHECK(!on || config_.attn_logit_softcapping == 0, "training.fp8_attention with attention scores soft-capped at ",
           config_.attn_logit_softcapping, " (model.attn_logit_softcapping, Gemma 2): the FP8 attention does not "
           "soft-cap; turn training.fp8_attention off");
  fp8_attention_history_L4_ = Tensor();
  if (!on) return;
  fp8_attention_history_L4_ =
      Tensor::empty({config_.n_layers, 4}, DType::kF32, device_, "FP8 attention gradients' history");
  ops::fill(fp8_attention_history_L4_, 0.0);
  fp8_attention_seeded_.assign(static_cast<size_t>(config_.n_layers), false);
}

void Llama::set_mlp_chunk_tokens(int64_t tokens) {
  ST_CHECK(tokens >= 0, "MLP chunk: expected 0 (every token at once) or a positive number of tokens, found ", tokens);
  mlp_chunk_tokens_ = tokens;
}

BlockContext Llama::context(int64_t batch, int64_t seq, ActivationCheckpointing checkpointing,
                            const ops::PackedDocuments* documents, ResidualSplit split) const {
  BlockContext ctx;
  ctx.documents = documents;
  ctx.tp = tp_;
  ctx.residual = split;
  if (mlp_recomputed(checkpointing)) ctx.mlp_chunk_tokens = mlp_chunk_tokens_;
  ctx.config = &config_;
  ctx.batch = batch;
  ctx.seq = seq;
  // LongRoPE's factors follow the whole sequence's length (every context-parallel rank's share)
  const int64_t length = cp_ != nullptr ? seq * cp_->size() : seq;
  ctx.cos_TK = rope_cos(length);
  ctx.sin_TK = rope_sin(length);
  ctx.separate_projections = separate_projections_;
  ctx.fp8 = fp8_;
  ctx.fp8_attention = fp8_attention_history_L4_.defined();
  if (cp_ != nullptr) {
    ST_ASSERT(documents == nullptr, "packed documents under context parallelism come as ContextDocuments");
    ST_CHECK(seq % 2 == 0 && seq * cp_->size() <= config_.max_seq_len, "context parallelism over ", cp_->size(),
             " ranks: a rank's ", seq, " tokens must be its two chunks of a sequence of at most max_seq_len = ",
             config_.max_seq_len, " tokens (", seq, " x ", cp_->size(), ")");
    ctx.cp = cp_;
    if (context_documents_) {  // each local token's rope position in its document
      ST_CHECK(context_documents_->positions_BL.size(0) == batch && context_documents_->positions_BL.size(1) == seq,
               "packed documents of ", context_documents_->positions_BL.str(), " for a batch of ", batch, " x ", seq);
      ctx.context_documents = &*context_documents_;
      ctx.context_positions_BT = context_documents_->positions_BL;
    } else {  // each local token's rope position in the whole sequence
      ctx.context_positions_BT = on_device(context_positions(batch, seq, cp_->size(), cp_->rank()));
    }
  }
  return ctx;
}

Tensor Llama::forward_hidden(const Tensor& ids_BT, std::vector<BlockActivations>& acts, Tensor& final_rstd_T,
                             Tensor& final_in_TD, ActivationCheckpointing checkpointing, Pass pass,
                             bool ids_checked_on_host, ActivationOffload* offload, KvCache* cache,
                             const ops::PackedDocuments* documents, ResidualSplit split) {
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1), D = config_.dim;
  BlockContext ctx = context(B, T, checkpointing, documents, split);
  // the residual stream's rows on this rank: all B·T, or with sequence parallelism its share
  const auto [row0, R] = residual_rows(B, T, split);
  ST_ASSERT(cache == nullptr || documents == nullptr, "packed documents are not for a KV cache");
  if (cache != nullptr) refuse_context_parallel("decoding over a KV cache");
  Tensor local_cos = local_cos_TK_, local_sin = local_sin_TK_;  // the sliding layers' rope (Gemma 3)
  if (cache != nullptr) {
    ctx.fp8 = {};  // a decoding step's few rows gain nothing from FP8 products
    ctx.fp8_attention = false;
    // the new tokens are positions p..p+T-1: rope from the tables' row p on
    ST_ASSERT(pass == Pass::kEval, "a KV cache is for the forward of evaluation only");
    const int64_t p = cache->length();
    ctx.kv_position = p;
    if (T == 1) {  // the position and its rope rows as staged in memory (KvCache::stage)
      ctx.kv_position_1 = cache->position_1();
      ctx.cos_TK = cache->rope_cos_1K();
      ctx.sin_TK = cache->rope_sin_1K();
      local_cos = cache->rope_local_cos_1K();
      local_sin = cache->rope_local_sin_1K();
    } else {
      // LongRoPE: the long factors once the sequence, p + T positions, passes original_max_positions
      ctx.cos_TK = rope_cos(p + T).slice(0, p, p + T);
      ctx.sin_TK = rope_sin(p + T).slice(0, p, p + T);
      if (local_cos_TK_.defined()) {
        local_cos = local_cos_TK_.slice(0, p, p + T);
        local_sin = local_sin_TK_.slice(0, p, p + T);
      }
    }
  }
  const Tensor global_cos = ctx.cos_TK, global_sin = ctx.sin_TK;
  Tensor x_BTD = Tensor::empty(R == B * T ? Shape{B, T, D} : Shape{R, D}, dtype_, device_, "embeddings");
  {
    const Tensor embed = store_->acquire_params(kEmbedUnit, pass);
    Tensor x_TD = x_BTD.view({R, D});
    // ids are checked on the host (check_inputs) where the caller gave host ids
    ops::embedding_forward(x_TD, ids_BT.view({B * T}).slice(0, row0, row0 + R),
                           view(embed, kEmbedUnit, kEmbeddingName), {}, !ids_checked_on_host);
    // Granite, Gemma: the embeddings scaled after the lookup, in the compute dtype (as transformers)
    if (embedding_scale() != 1.0) ops::scale(x_TD, embedding_scale());
    // a tied head needs the embedding again at the end of the forward
    if (!config_.tie_embeddings) store_->release_params(kEmbedUnit, pass);
  }
  acts.assign(static_cast<size_t>(config_.n_layers), BlockActivations());
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    const size_t u = static_cast<size_t>(l) + 1;
    BlockActivations& a = acts[static_cast<size_t>(l)];
    const Tensor params = store_->acquire_params(u, pass);
    if (cache != nullptr) {
      ctx.kv_keys_BSMH = cache->keys(l);
      ctx.kv_values_BSMH = cache->values(l);
    }
    ctx.window = config_.window_of(l);
    ctx.rope = config_.uses_rope(l);
    const bool local = local_cos.defined() && ctx.window > 0;
    ctx.cos_TK = local ? local_cos : global_cos;
    ctx.sin_TK = local ? local_sin : global_sin;
    {
      const profile::Region region("block forward", l);
      block_forward(a, BlockWeights::view(params, layout_.units()[u], config_), x_BTD, ctx);
    }
    store_->release_params(u, pass);
    x_BTD = a.y_BTD;
    if (pass == Pass::kEval)
      a = BlockActivations();  // no backward follows: not even the block's input is kept
    else
      a.release_for(checkpointing);
    if (offload) offload->after_forward(l, config_.n_layers, a);
  }
  if (offload) offload->finish_forward();
  const Tensor head = store_->acquire_params(head_unit(), pass);
  final_in_TD = x_BTD.view({R, D});
  Tensor h_TD = Tensor::empty({R, D}, dtype_, device_, "final norm");
  final_rstd_T = Tensor::empty({R}, ops::stats_dtype(dtype_), device_, "final rstd");
  ops::rmsnorm_forward(h_TD, final_rstd_T, final_in_TD, view(head, head_unit(), kFinalNormName),
                       {.eps = config_.norm_eps, .weight_offset = config_.norm_weight_offset});
  // Granite's logits / logits_scaling, as the head's input scaled by its inverse (exact for a
  // power of two, as Granite 3's 8 and 16; otherwise equal up to rounding)
  if (config_.logits_scaling != 1.0) ops::scale(h_TD, 1.0 / config_.logits_scaling);
  return h_TD;
}

#ifdef SHARDTRAIN_WITH_CUDA
struct Llama::PhaseEvents {
  cuda::Event start, forward_done, backward_done;
};
#else
struct Llama::PhaseEvents {};
#endif

GradientWrites gradient_writes(bool graph, int64_t micro_batches, bool grads_in_shards) {
  GradientWrites w;
  if (graph && micro_batches > 1) return w;  // one graph for all: every micro-batch adds
  w.first_overwrites = true;
  w.later_overwrite = !grads_in_shards;
  w.zero_shards = !grads_in_shards;
  return w;
}

int64_t Llama::check_inputs(const Tensor& ids_BT, const Tensor& targets_BT, const StepOptions& o,
                            const char* what) const {
  check_batch(ids_BT, config_, what);
  check_shape(targets_BT, ids_BT.shape(), what, "targets_BT");
  ST_CHECK(ids_BT.device().is_cpu() && ids_BT.dtype() == DType::kI32, what, ": ids must be an i32 host tensor, found ",
           ids_BT.str());
  const int32_t* ids = ids_BT.data<int32_t>();
  for (int64_t i = 0; i < ids_BT.numel(); ++i)
    ST_CHECK(ids[i] >= 0 && ids[i] < config_.vocab_size, what, ": token id ", ids[i], " at position ", i,
             " outside the vocabulary [0, ", config_.vocab_size, ")");
  return count_targets(targets_BT, o.ignore_index, config_.vocab_size, what);
}

std::optional<ops::PackedDocuments> Llama::documents_of(const Tensor& ids_BT, const Tensor& positions_BT) {
  context_documents_.reset();
  if (!positions_BT.defined()) return std::nullopt;
  check_shape(positions_BT, ids_BT.shape(), "packed documents", "positions_BT");
  if (cp_ != nullptr) {  // the ring's documents; the blocks find them in context_documents_
    context_documents_ = context_documents(positions_BT, cp_->size(), cp_->rank(), device_);
    return std::nullopt;
  }
  return ops::pack_documents(positions_BT, device_);
}

LossSum Llama::forward_backward(const Tensor& ids_BT, const Tensor& targets_BT, const StepOptions& o,
                                const Tensor& positions_BT) {
  check_inputs(ids_BT, targets_BT, o, "forward_backward");
  const auto [row0, rows] = residual_rows(ids_BT.size(0), ids_BT.size(1), ResidualSplit::kSequence);
  const int64_t counted = count_targets(targets_BT.view({targets_BT.numel()}).slice(0, row0, row0 + rows),
                                        o.ignore_index, config_.vocab_size, "forward_backward");
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  const Tensor ids = on_device(ids_BT), targets = on_device(targets_BT);
  const std::optional<ops::PackedDocuments> documents = documents_of(ids_BT, positions_BT);
  Tensor loss = new_loss();
  issue_forward_backward(ids, targets, loss, o, documents ? &*documents : nullptr);
  phase_times_.host_issue_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double loss_sum = read_loss(loss);  // waits for the device
  if (device_.is_cpu()) {
    phase_times_.backward_s = std::chrono::duration<double>(Clock::now() - t0).count() - phase_times_.forward_s;
  } else {
    read_phase_times();
  }
  return {loss_sum, counted};
}

void Llama::read_phase_times() {
#ifdef SHARDTRAIN_WITH_CUDA
  phase_events_->backward_done.synchronize();
  phase_times_.forward_s = 1e-3 * phase_events_->forward_done.elapsed_ms_since(phase_events_->start);
  phase_times_.backward_s = 1e-3 * phase_events_->backward_done.elapsed_ms_since(phase_events_->forward_done);
#endif
}

void Llama::issue_forward_backward(const Tensor& ids, const Tensor& targets, Tensor& loss, const StepOptions& o,
                                   const ops::PackedDocuments* documents) {
  const int64_t B = ids.size(0), T = ids.size(1), D = config_.dim;
  // with tensor parallelism each rank of the group takes its share of the token rows
  constexpr ResidualSplit split = ResidualSplit::kSequence;
  const auto [row0, R] = residual_rows(B, T, split);
  const Tensor ids_R = ids.view({B * T}).slice(0, row0, row0 + R);
  const Tensor targets_R = targets.view({B * T}).slice(0, row0, row0 + R);
  using Clock = std::chrono::steady_clock;
  [[maybe_unused]] const bool on_gpu = !device_.is_cpu();
#ifdef SHARDTRAIN_WITH_CUDA
  if (on_gpu && !phase_events_) phase_events_ = std::make_shared<PhaseEvents>();
  if (on_gpu) phase_events_->start.record_timing(Stream{});
#endif
  const Clock::time_point t0 = Clock::now();
  std::vector<BlockActivations> acts;
  Tensor final_rstd_T, final_in_TD;
  ActivationOffload* offload = nullptr;
  if (o.offload_activations) {
    if (!offload_) offload_ = std::make_unique<ActivationOffload>(device_);
    offload_->set_max_blocks(o.offload_activation_blocks);
    offload = offload_.get();
  }
  Tensor h_TD = forward_hidden(ids, acts, final_rstd_T, final_in_TD, o.checkpointing, Pass::kForward, true, offload,
                               nullptr, documents, split);
#ifdef SHARDTRAIN_WITH_CUDA
  if (on_gpu) phase_events_->forward_done.record_timing(Stream{});
#endif
  if (!on_gpu) phase_times_.forward_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // Head and loss: the fused op computes the head's gradient during the forward.
  const Shape residual_shape = R == B * T ? Shape{B, T, D} : Shape{R, D};
  Tensor dx_BTD = Tensor::empty(residual_shape, dtype_, device_, "dx");
  {
    const Tensor head = store_->acquire_params(head_unit(), Pass::kBackward);
    const Tensor embed = config_.tie_embeddings ? store_->acquire_params(kEmbedUnit, Pass::kBackward) : Tensor();
    Tensor dhead = store_->acquire_grads(head_unit(), o.overwrite_grads);
    Tensor dembed = config_.tie_embeddings ? store_->acquire_grads(kEmbedUnit, o.overwrite_grads) : Tensor();
    Tensor dweight = config_.tie_embeddings ? view(dembed, kEmbedUnit, kEmbeddingName)
                                            : view(dhead, head_unit(), kHeadName);
    Tensor dh_TD = Tensor::empty({R, D}, dtype_, device_, "dh");
    ops::CrossEntropyOptions ce;
    ce.ignore_index = o.ignore_index;
    ce.grad_scale = o.grad_scale;
    ce.grad_scale_device = o.grad_scale_device;
    ce.chunk_tokens = o.loss_chunk_tokens;
    ce.check_targets = false;  // checked on the host above
    ce.overwrite_dweight = o.overwrite_grads;  // the head's (tied: the table's) first gradient
    ce.fp8 = head_fp8_;
    ce.logit_softcap = config_.final_logit_softcapping;  // Gemma 2's; 0: none
    {
      const profile::Region region("head and loss");
      ops::linear_cross_entropy(loss, dh_TD, dweight, h_TD, head_weight(embed, head), targets_R, ce);
    }
    h_TD = Tensor();
    if (config_.logits_scaling != 1.0) ops::scale(dh_TD, 1.0 / config_.logits_scaling);  // the head input's scale
    Tensor dx_TD = dx_BTD.view({R, D});
    Tensor dnorm = view(dhead, head_unit(), kFinalNormName);
    ops::rmsnorm_backward(dx_TD, dnorm, dh_TD, final_in_TD, view(head, head_unit(), kFinalNormName),
                          final_rstd_T, Tensor(),
                          {.weight_offset = config_.norm_weight_offset, .overwrite_dweight = o.overwrite_grads});
    store_->release_grads(head_unit());
    release_head(Pass::kBackward);  // the backward acquisition
    release_head(Pass::kForward);   // held since forward_hidden
  }

  BlockContext ctx = context(B, T, o.checkpointing, documents, split);
  ctx.deterministic = o.deterministic;
  const Tensor global_cos = ctx.cos_TK, global_sin = ctx.sin_TK;  // the sequence's (LongRoPE: by its length)
  Tensor dprev_BTD = Tensor::empty(residual_shape, dtype_, device_, "dx");
  for (int64_t l = config_.n_layers - 1; l >= 0; --l) {
    const size_t u = static_cast<size_t>(l) + 1;
    BlockActivations& a = acts[static_cast<size_t>(l)];
    if (offload) offload->before_backward(l, acts);
    const Tensor params = store_->acquire_params(u, Pass::kBackward);
    const profile::Region region("block backward", l);
    const BlockWeights w = BlockWeights::view(params, layout_.units()[u], config_);
    ctx.window = config_.window_of(l);
    ctx.rope = config_.uses_rope(l);
    const bool local = local_cos_TK_.defined() && ctx.window > 0;  // the sliding layers' rope (Gemma 3)
    ctx.cos_TK = local ? local_cos_TK_ : global_cos;
    ctx.sin_TK = local ? local_sin_TK_ : global_sin;
    if (fp8_attention_history_L4_.defined()) {
      ctx.fp8_attention_history_4 = fp8_attention_history_L4_.select(l);
      ctx.fp8_attention_seed = !fp8_attention_seeded_[static_cast<size_t>(l)];
      fp8_attention_seeded_[static_cast<size_t>(l)] = true;
    }
    if (o.checkpointing != ActivationCheckpointing::kNone) {
      const Tensor input = a.x_BTD;
      block_forward(a, w, input, ctx, recompute_part(o.checkpointing));
    }
    Tensor grads = store_->acquire_grads(u, o.overwrite_grads);
    BlockWeights g = BlockWeights::view(grads, layout_.units()[u], config_);
    block_backward(dprev_BTD, g, dx_BTD, a, w, ctx, o.overwrite_grads);
    store_->release_grads(u);
    store_->release_params(u, Pass::kBackward);
    a = BlockActivations();
    std::swap(dx_BTD, dprev_BTD);
  }
  Tensor dembed = store_->acquire_grads(kEmbedUnit, o.overwrite_grads);
  Tensor dtable = view(dembed, kEmbedUnit, kEmbeddingName);
  // tied: the head wrote the table's first gradient above; untied, the scatter adds to rows
  // a batch touches, so an overwritten table starts from zero
  if (o.overwrite_grads && !config_.tie_embeddings) ops::fill(dtable, 0.0);
  if (embedding_scale() != 1.0) ops::scale(dx_BTD, embedding_scale());
  ops::embedding_backward(dtable, dx_BTD.view({R, D}), ids_R);
  store_->release_grads(kEmbedUnit);
  if (config_.tie_embeddings) store_->release_grads(kEmbedUnit);  // also acquired for the head
  store_->finish_backward();
#ifdef SHARDTRAIN_WITH_CUDA
  if (on_gpu) phase_events_->backward_done.record_timing(Stream{});
#endif
}

LossSum Llama::evaluate(const Tensor& ids_BT, const Tensor& targets_BT, const StepOptions& o,
                        const Tensor& positions_BT) {
  check_inputs(ids_BT, targets_BT, o, "evaluate");
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1);
  // with tensor parallelism the rows split over the group where they divide; otherwise every
  // rank computes them all and the group's rank 0 alone reports them
  const ResidualSplit split = tp_ != nullptr && (B * T) % tp_->size() == 0 ? ResidualSplit::kSequence
                                                                          : ResidualSplit::kReplicated;
  const auto [row0, R] = residual_rows(B, T, split);
  const bool reports = split == ResidualSplit::kSequence || tp_ == nullptr || tp_->rank() == 0;
  const int64_t counted = reports ? count_targets(targets_BT.view({B * T}).slice(0, row0, row0 + R), o.ignore_index,
                                                  config_.vocab_size, "evaluate")
                                  : 0;
  std::vector<BlockActivations> acts;
  Tensor final_rstd_T, final_in_TD;
  // Activations are dropped block by block: evaluation keeps only the block in flight.
  const Tensor targets = on_device(targets_BT);
  const std::optional<ops::PackedDocuments> documents = documents_of(ids_BT, positions_BT);
  const Tensor h_TD = forward_hidden(on_device(ids_BT), acts, final_rstd_T, final_in_TD,
                                     ActivationCheckpointing::kFull, Pass::kEval, true, nullptr, nullptr,
                                     documents ? &*documents : nullptr, split);
  const Tensor head = store_->acquire_params(head_unit(), Pass::kEval);
  const Tensor embed = config_.tie_embeddings ? store_->acquire_params(kEmbedUnit, Pass::kEval) : Tensor();
  Tensor loss = new_loss();
  Tensor none_dh, none_dw;
  ops::CrossEntropyOptions ce;
  ce.ignore_index = o.ignore_index;
  ce.chunk_tokens = o.loss_chunk_tokens;
  ce.compute_grad = false;
  ce.check_targets = false;  // checked on the host above
  ce.fp8 = head_fp8_;
  ce.logit_softcap = config_.final_logit_softcapping;
  ops::linear_cross_entropy(loss, none_dh, none_dw, h_TD, head_weight(embed, head),
                            targets.view({B * T}).slice(0, row0, row0 + R), ce);
  release_head(Pass::kEval);
  release_head(Pass::kEval);
  return {reports ? read_loss(loss) : 0.0, counted};
}

Tensor Llama::logits(const Tensor& ids_BT, const Tensor& positions_BT) {
  check_batch(ids_BT, config_, "logits");
  refuse_context_parallel("logits()");
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1);
  std::vector<BlockActivations> acts;
  Tensor final_rstd_T, final_in_TD;
  const std::optional<ops::PackedDocuments> documents = documents_of(ids_BT, positions_BT);
  const Tensor h_TD = forward_hidden(on_device(ids_BT), acts, final_rstd_T, final_in_TD,
                                     ActivationCheckpointing::kFull, Pass::kEval, false, nullptr, nullptr,
                                     documents ? &*documents : nullptr);
  const Tensor head = store_->acquire_params(head_unit(), Pass::kEval);
  const Tensor embed = config_.tie_embeddings ? store_->acquire_params(kEmbedUnit, Pass::kEval) : Tensor();
  Tensor logits_TV = Tensor::empty({B * T, config_.vocab_size}, dtype_, device_, "logits");
  ops::linear_forward(logits_TV, h_TD, head_weight(embed, head));
  if (config_.final_logit_softcapping > 0) ops::softcap(logits_TV, config_.final_logit_softcapping);
  release_head(Pass::kEval);
  release_head(Pass::kEval);
  return logits_TV;
}

Tensor Llama::last_logits(const Tensor& ids_BT) {
  check_batch(ids_BT, config_, "last_logits");
  return last_position_logits(ids_BT, nullptr);
}

Tensor Llama::last_logits_cached(const Tensor& ids_BT, KvCache& cache) {
  const char* what = "last_logits_cached";
  check_batch(ids_BT, config_, what);
  ST_CHECK(cache.device() == device_ && cache.dtype() == dtype_ && cache.layers() == config_.n_layers &&
               cache.keys(0).size(2) == kv_heads_per_rank() && cache.keys(0).size(3) == config_.head_dim(),
           what, ": a KV cache of ", cache.layers(), " blocks of ", cache.keys(0).str(), " for a model of ",
           config_.n_layers, " blocks with ", kv_heads_per_rank(), " kv heads of ", config_.head_dim(), " in ",
           dtype_name(dtype_));
  ST_CHECK(ids_BT.size(0) == cache.batch(), what, ": ", ids_BT.size(0), " sequences for a KV cache of ", cache.batch());
  cache.check_room(ids_BT.size(1), what);
  Tensor logits_BV = last_position_logits(ids_BT, &cache);
  cache.advance(ids_BT.size(1));
  return logits_BV;
}

Tensor Llama::last_position_logits(const Tensor& ids_BT, KvCache* cache) {
  if (cache != nullptr && ids_BT.size(1) == 1) stage_decode(*cache);
  Tensor logits_BV = Tensor::empty({ids_BT.size(0), config_.vocab_size}, dtype_, device_, "logits");
  issue_last_logits(on_device(ids_BT), cache, logits_BV, false);
  return logits_BV;
}

void Llama::stage_decode(KvCache& cache, Stream stream) {
  // the new token makes the sequence length() + 1 positions long (LongRoPE's choice of factors)
  const int64_t length = cache.length() + 1;
  cache.stage(rope_cos(length), rope_sin(length), local_cos_TK_, local_sin_TK_, stream);
}

void Llama::issue_decode(const Tensor& ids_B1, KvCache& cache, Tensor& logits_BV) {
  ST_CHECK(ids_B1.ndim() == 2 && ids_B1.size(1) == 1 && ids_B1.size(0) == cache.batch() &&
               ids_B1.device() == device_ && ids_B1.dtype() == DType::kI32,
           "issue_decode: expected i32 ids [", cache.batch(), ", 1] on ", device_.str(), ", found ", ids_B1.str());
  cache.check_room(1, "issue_decode");
  issue_last_logits(ids_B1, &cache, logits_BV, true);
}

void Llama::issue_last_logits(const Tensor& ids_BT, KvCache* cache, Tensor& logits_BV, bool ids_checked_on_host) {
  refuse_context_parallel("sampling (the last position's logits)");
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1), D = config_.dim;
  ST_ASSERT(logits_BV.shape() == Shape({B, config_.vocab_size}) && logits_BV.dtype() == dtype_);
  std::vector<BlockActivations> acts;
  Tensor final_rstd_T, final_in_TD;
  const Tensor h_TD = forward_hidden(ids_BT, acts, final_rstd_T, final_in_TD, ActivationCheckpointing::kFull,
                                     Pass::kEval, ids_checked_on_host, nullptr, cache);
  const Tensor head = store_->acquire_params(head_unit(), Pass::kEval);
  const Tensor embed = config_.tie_embeddings ? store_->acquire_params(kEmbedUnit, Pass::kEval) : Tensor();
  Tensor last_BD = Tensor::empty({B, D}, dtype_, device_, "last hidden");
  for (int64_t b = 0; b < B; ++b) {
    Tensor dst = last_BD.slice(0, b, b + 1);
    ops::cast(dst, h_TD.slice(0, b * T + T - 1, b * T + T));
  }
  ops::linear_forward(logits_BV, last_BD, head_weight(embed, head));
  if (config_.final_logit_softcapping > 0) ops::softcap(logits_BV, config_.final_logit_softcapping);
  release_head(Pass::kEval);
  release_head(Pass::kEval);
}

}  // namespace shardtrain::model
