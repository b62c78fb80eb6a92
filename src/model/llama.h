// The whole Llama model: embedding, blocks, final norm and the fused head + loss. Each
// sharding unit's full parameters and gradients come from a UnitStore (model/unit_store.h),
// acquired just before use and released right after, so the same code runs resident on
// one rank or gathered unit by unit under FSDP.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/activation_offload.h"
#include "model/block.h"
#include "model/config.h"
#include "model/context_parallel.h"
#include "model/kv_cache.h"
#include "model/layout.h"
#include "model/tensor_parallel.h"
#include "model/unit_store.h"

namespace shardtrain::model {

// "none" | "pointwise" | "selective" | "full"; an error naming `what` otherwise.
ActivationCheckpointing parse_checkpointing(const std::string& name, const std::string& what);
const char* checkpointing_name(ActivationCheckpointing c);

struct StepOptions {
  double grad_scale = 1.0;  // multiplies all gradients: 1 / tokens counted in the global batch
  Tensor grad_scale_device;  // GPU: when defined, grad_scale is read from it (f32) as the step runs
  ActivationCheckpointing checkpointing = ActivationCheckpointing::kNone;
  int64_t loss_chunk_tokens = 256;
  int32_t ignore_index = -100;
  // true: every parameter's first gradient of this micro-batch replaces what its buffer held
  // (UnitStore::acquire_grads's overwrite): the first micro-batch of a step, with no
  // zero-fill of the gradients before it. false: the gradients add to the buffers.
  bool overwrite_grads = false;
  // GPU: the attention backward takes cuDNN's deterministic algorithm (no atomic adds), so
  // with the heuristic's GEMM algorithms a step repeats bit for bit (slower: see docs/training-and-data.md).
  bool deterministic = false;
  // GPU: what each block keeps between its forward and backward (with full checkpointing: its
  // input) waits in page-locked host memory, all but the last two blocks' (model/activation_offload.h).
  bool offload_activations = false;
  // With offload_activations: only blocks [0, n) offload (0: all but the last two).
  int64_t offload_activation_blocks = 0;
};

// How the micro-batches of a step write the gradients. The first replaces what the buffers
// hold (StepOptions::overwrite_grads), so nothing clears them before it; where the store
// hands out the gradient shards themselves (one rank), the later micro-batches add to them;
// elsewhere every micro-batch gets fresh buffers and overwrites them, and the shards, which
// the reductions add into, are cleared first. A CUDA graph's kernels are fixed, so one graph
// replayed for several micro-batches has them all add, onto cleared shards (a captured step
// is built with overwrites(0)).
struct GradientWrites {
  bool zero_shards = true;        // clear the gradient shards before the first micro-batch
  bool first_overwrites = false;  // micro-batch 0
  bool later_overwrite = false;   // micro-batches 1, 2, ...
  bool overwrites(int64_t micro_batch) const { return micro_batch == 0 ? first_overwrites : later_overwrite; }
};
GradientWrites gradient_writes(bool graph, int64_t micro_batches, bool grads_in_shards);

// Time of the last forward_backward's phases: the host clock on the CPU; on a GPU, events
// recorded on the compute stream at the phase boundaries (no synchronisation between the
// phases, so the backward's launches queue behind the forward's work).
struct PhaseTimes {
  double forward_s = 0;   // embedding, blocks, final norm
  double backward_s = 0;  // fused head + loss (forward and backward of the head), blocks, embedding
  // Host time spent issuing the forward and backward (up to the loss read-back). On a GPU,
  // close to forward_s + backward_s means the host's launches, not the device, set the pace.
  double host_issue_s = 0;
};

struct LossSum {
  double loss_sum = 0;  // summed over counted tokens
  int64_t tokens = 0;   // tokens whose target is not ignore_index
};

class Llama {
 public:
  // A resident model: allocates every unit's parameters and gradients (zeroed).
  Llama(const LlamaConfig& config, DType dtype, Device device = Device::cpu());
  // A model over `store` (not owned), whose buffers follow `layout` in `dtype`.
  Llama(const LlamaConfig& config, const ModelLayout& layout, UnitStore* store, DType dtype, Device device);

  const LlamaConfig& config() const { return config_; }
  const ModelLayout& layout() const { return layout_; }
  DType dtype() const { return dtype_; }

  // Resident models only: unit u's flat parameter / gradient buffer [layout().units()[u].numel].
  Tensor& unit_params(size_t u);
  Tensor& unit_grads(size_t u);
  // Resident models only: a parameter (or its gradient) by HF name, as a shaped view.
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;

  // Resident models only. Counter-based init: element i of parameter p is a function of
  // (seed, p's name, i) only (see init_param_range for any sub-range).
  void init_random(uint64_t seed);
  void zero_grads();

  // One micro-batch: forward, loss and backward; gradients accumulate (scaled by
  // options.grad_scale). ids_BT and targets_BT are i32 host tensors; T <= max_seq_len.
  // They are copied to the model's device. positions_BT (i32 [B, T] on the host; undefined:
  // none) packs documents into the rows: each token's position in its document, 0 where one
  // starts (ops::document_positions makes them from BOS tokens); every document then attends
  // only to itself, with rope positions from its first token, as if it were a row of its own.
  LossSum forward_backward(const Tensor& ids_BT, const Tensor& targets_BT, const StepOptions& options,
                           const Tensor& positions_BT = {});
  const PhaseTimes& last_phase_times() const { return phase_times_; }

  // The parts of forward_backward, for callers that keep inputs on the device (a captured
  // step, model/captured_step.h):
  // Checks ids and targets on the host (shapes, every id in [0, V), every target in [0, V)
  // or ignored), so the device work needs no check that reads back; returns the number of
  // counted targets.
  int64_t check_inputs(const Tensor& ids_BT, const Tensor& targets_BT, const StepOptions& options,
                        const char* what) const;
  // Queues the forward, loss and backward on ids and targets already on the model's device;
  // the loss sum accumulates into `loss` (1 element; f32 on a GPU). Reads nothing back, so
  // it can be captured into a CUDA graph. On a GPU, read_phase_times() after it completes.
  void issue_forward_backward(const Tensor& ids_BT, const Tensor& targets_BT, Tensor& loss,
                              const StepOptions& options, const ops::PackedDocuments* documents = nullptr);
  void read_phase_times();  // GPU: waits for the last step's end and reads its phase events
  Tensor new_loss() const;  // a zeroed loss accumulator for this device
  static double read_loss(const Tensor& loss);  // waits for the device
  void set_host_issue_seconds(double s) { phase_times_.host_issue_s = s; }
  UnitStore& store() { return *store_; }
  // The activation offload of the last step that asked for it (null before any).
  const ActivationOffload* activation_offload() const { return offload_.get(); }
  ActivationOffload* activation_offload() { return offload_.get(); }
  Device device() const { return device_; }
  // One product per projection instead of the stacked q|k|v and gate|up ones
  // (BlockContext): for comparison (train_bench --separate-projections).
  void set_separate_projections(bool separate) { separate_projections_ = separate; }
  // FP8 products for the blocks' linears (BlockContext::fp8) in training and evaluation, and
  // with `head` on for the head's (CrossEntropyOptions::fp8; its recipe and gradient format,
  // no amax slots); the decoding steps over a KV cache keep the activations' dtype.
  void set_fp8(const ops::LinearFp8& fp8, const ops::LinearFp8& head = {}) {
    fp8_ = fp8;
    head_fp8_ = {.recipe = head.recipe, .gradient_format = head.gradient_format};
  }
  const ops::LinearFp8& fp8() const { return fp8_; }
  // The attention forward in FP8 (BlockContext::fp8_attention) in training and evaluation; the
  // decoding steps over a KV cache keep the activations' dtype.
  // With it each layer keeps the largest gradients its FP8 attention backward has seen, from
  // which the next backward scales its e4m3 gradients (ops::attention_backward_fp8).
  void set_fp8_attention(bool on);
  bool fp8_head() const { return head_fp8_.on(); }
  // Tensor parallelism (not owned; null: none): the store's block units are this rank's parts
  // (ModelLayout with a tensor-parallel mesh), and every rank of `tp`'s group runs the same
  // calls with the same batches. Training and evaluate() split the batch's B·T token rows
  // over the group (sequence parallelism: B·T must divide by its size): each rank embeds its
  // rows, computes the loss of its rows and returns their LossSum; logits(), last_logits()
  // and the KV cache's steps give every rank all the logits.
  void set_tensor_parallel(TensorParallel* tp);
  TensorParallel* tensor_parallel() const { return tp_; }
  // Context parallelism (not owned; null or a group of one: none; model/context_parallel.h):
  // forward_backward and evaluate take this rank's local tokens, [B, 2C] of each sequence of
  // T = 2C · cp->size() tokens (context_shard of ids and targets), and every rank of the group
  // calls them together with the same shapes. Rope uses the tokens' true positions in the
  // whole sequence and the attention is the group's ring, so each rank gets the exact loss sum
  // of its tokens (LossSum: the caller sums it and the token counts over the group) and its
  // tokens' share of every parameter gradient (the store sums them: shard the units over the
  // context group too). Throws, naming parallel.context_parallel, with tensor parallelism,
  // sliding-window layers or FP8 attention; logits(), last_logits() and the KV cache are
  // refused while it is set. Packed documents (positions_BT) are this rank's local tokens of the
  // whole sequences' document positions (context_shard of ops::document_positions): a document
  // may span chunks and ranks.
  void set_context_parallel(ContextParallel* cp);
  ContextParallel* context_parallel() const { return cp_; }
  // The key/value heads this rank computes and caches (n_kv_heads / tensor-parallel size).
  int64_t kv_heads_per_rank() const { return config_.n_kv_heads / (tp_ != nullptr ? tp_->size() : 1); }
  // Token rows per piece of the MLP in blocks whose MLP keeps nothing for the backward
  // (selective and full checkpointing, and evaluation): BlockContext::mlp_chunk_tokens.
  // 0 (the default) runs every token at once.
  void set_mlp_chunk_tokens(int64_t tokens);
  int64_t mlp_chunk_tokens() const { return mlp_chunk_tokens_; }
  // Forward and loss only (positions_BT: as forward_backward's).
  LossSum evaluate(const Tensor& ids_BT, const Tensor& targets_BT, const StepOptions& options,
                   const Tensor& positions_BT = {});
  // Logits [B, V] of the last position of each sequence (for sampling).
  Tensor last_logits(const Tensor& ids_BT);
  // Incremental decoding: the logits [B, V] of the last of the T new tokens ids_BT (i32, on
  // the host), which sit at positions cache.length() .. cache.length() + T - 1 (rope at those
  // positions) and attend to the cached keys and values of every earlier position and to the
  // new tokens before them; their keys and values are appended to `cache`. The first call on
  // an empty cache runs the prompt (the prefill), then one token per call. The same as
  // last_logits of all the ids so far, up to the rounding of the matrix products over fewer
  // rows (on a GPU the attention over the cache is an exact kernel of its own, the prefill
  // cuDNN's, so the bf16 results differ by rounding). Throws, naming
  // the lengths, when the new tokens do not fit in the cache; the cache is then unchanged.
  Tensor last_logits_cached(const Tensor& ids_BT, KvCache& cache);
  // last_logits_cached's one-token step in two parts, for a CUDA graph of the second
  // (model/captured_decode.h): stage_decode writes the cache's position and rope rows
  // (KvCache::stage); issue_decode queues the forward of ids_B1 (i32 on the model's device,
  // checked by the caller to lie in [0, V)) at that position, reading both from memory, and
  // writes its logits into logits_BV (the model's dtype and device). Neither reads back from
  // the device nor advances the cache.
  void stage_decode(KvCache& cache, Stream stream = {});
  void issue_decode(const Tensor& ids_B1, KvCache& cache, Tensor& logits_BV);
  // All logits [B*T, V] (for checks against other implementations; builds the full matrix);
  // positions_BT as forward_backward's.
  Tensor logits(const Tensor& ids_BT, const Tensor& positions_BT = {});

 private:
  // Runs embedding and blocks; returns the final norm's output and leaves the head unit's
  // parameters (and the embedding's, when tied) acquired for the caller to release.
  // With `cache` (evaluation only) the tokens continue the cached positions, whose keys and
  // values the blocks read and extend (BlockContext::kv_keys_BSMH); its length is left to the
  // caller to advance. With tensor parallelism `split` says which token rows the final norm's
  // output (and final_in_TD, final_rstd_T) holds: this rank's share, or all of them.
  Tensor forward_hidden(const Tensor& ids_BT, std::vector<BlockActivations>& acts, Tensor& final_rstd_T,
                        Tensor& final_in_TD, ActivationCheckpointing checkpointing, Pass pass,
                        bool ids_checked_on_host, ActivationOffload* offload = nullptr, KvCache* cache = nullptr,
                        const ops::PackedDocuments* documents = nullptr,
                        ResidualSplit split = ResidualSplit::kReplicated);
  // last_logits, and last_logits_cached with `cache`.
  Tensor last_position_logits(const Tensor& ids_BT, KvCache* cache);
  // The last position's logits of ids_BT (on the model's device) into logits_BV. With `cache`
  // and one token per sequence the position and rope rows come from its staged buffers.
  void issue_last_logits(const Tensor& ids_BT, KvCache* cache, Tensor& logits_BV, bool ids_checked_on_host);
  // The blocks' context; the MLP runs by pieces where `checkpointing` drops its inner tensors.
  BlockContext context(int64_t batch, int64_t seq, ActivationCheckpointing checkpointing,
                       const ops::PackedDocuments* documents = nullptr,
                       ResidualSplit split = ResidualSplit::kReplicated) const;
  // This rank's token rows [first, first + count) of a batch's B·T under `split`.
  std::pair<int64_t, int64_t> residual_rows(int64_t batch, int64_t seq, ResidualSplit split) const;
  // The documents of positions_BT (checked against ids_BT) on this device; none when undefined.
  // Under context parallelism they are the ring's (context_documents_, which the blocks' context
  // reads until the next call), and none is returned.
  std::optional<ops::PackedDocuments> documents_of(const Tensor& ids_BT, const Tensor& positions_BT);
  void make_rope_tables();
  Tensor on_device(const Tensor& host) const;  // a copy on the model's device (or host itself)
  Tensor view(const Tensor& unit_buffer, size_t unit, const char* name) const;
  size_t head_unit() const { return layout_.units().size() - 1; }
  // The head matrix: lm_head.weight, or the embedding when tied.
  Tensor head_weight(const Tensor& embed_params, const Tensor& head_params) const;
  void release_head(Pass pass);

  LlamaConfig config_;
  ModelLayout layout_;
  DType dtype_;
  Device device_;
  std::unique_ptr<ResidentUnitStore> resident_;
  UnitStore* store_;
  TensorParallel* tp_ = nullptr;
  ContextParallel* cp_ = nullptr;
  std::optional<ContextDocuments> context_documents_;  // packed documents under cp_ (documents_of)
  void refuse_context_parallel(const char* what) const;  // throws, naming `what`, while cp_ is set
  Tensor cos_TK_, sin_TK_;
  // LongRoPE's tables with its long factors, for sequences past its original_max_positions
  // (cos_TK_ and sin_TK_ hold its short ones); undefined without LongRoPE.
  Tensor long_cos_TK_, long_sin_TK_;
  // The rope tables (every layer's but a local rope's) of a sequence of `length` positions:
  // LongRoPE's long ones past its original_max_positions, else cos_TK_ and sin_TK_.
  const Tensor& rope_cos(int64_t length) const { return config_.rope_long(length) ? long_cos_TK_ : cos_TK_; }
  const Tensor& rope_sin(int64_t length) const { return config_.rope_long(length) ? long_sin_TK_ : sin_TK_; }
  // The sliding layers' rope tables (LlamaConfig::has_local_rope; undefined without).
  Tensor local_cos_TK_, local_sin_TK_;
  // What the embeddings are multiplied by after the lookup (Granite's embedding_multiplier,
  // Gemma's sqrt(D) as transformers rounds it), 1 for neither.
  double embedding_scale() const;
  bool separate_projections_ = false;
  ops::LinearFp8 fp8_;
  ops::LinearFp8 head_fp8_;
  // defined with FP8 attention: f32 [L, 4] on the device (ops::attention_backward_fp8)
  Tensor fp8_attention_history_L4_;
  std::vector<bool> fp8_attention_seeded_;  // per layer: its history holds a backward's amaxes
  int64_t mlp_chunk_tokens_ = 0;
  PhaseTimes phase_times_;
  struct PhaseEvents;  // GPU: start, end of forward, end of backward
  std::shared_ptr<PhaseEvents> phase_events_;
  std::unique_ptr<ActivationOffload> offload_;  // made on the first step that offloads
};

// Writes elements [first, first + count) of parameter `spec`'s initial values into `out`
// (count elements, any float dtype, on the host or a GPU): the counter-based init any rank
// can compute for its own shard. For a tensor-parallel part, the elements are the part's, and
// their values those of the whole parameter at the same places.
void init_param_range(Tensor& out, const ParamSpec& spec, int64_t first, uint64_t seed, double init_std);

}  // namespace shardtrain::model
