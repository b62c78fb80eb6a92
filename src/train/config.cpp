// The table of every config key, TOML and command-line loading, and validation.
#include "train/config.h"
#include "train/config_keys.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <variant>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "core/error.h"
#include "core/nearest_name.h"
#include "model/context_parallel.h"
#include "model/presets.h"

namespace shardtrain::train {
namespace {

using Value = std::variant<int64_t, double, bool, std::string>;
enum class Type { kInt, kFloat, kBool, kString };

const char* type_name(Type t) {
  switch (t) {
    case Type::kInt: return "an integer";
    case Type::kFloat: return "a float";
    case Type::kBool: return "a boolean";
    case Type::kString: return "a string";
  }
  return "?";
}

template <typename F> constexpr Type type_of();
template <> constexpr Type type_of<int64_t>() { return Type::kInt; }
template <> constexpr Type type_of<uint64_t>() { return Type::kInt; }
template <> constexpr Type type_of<double>() { return Type::kFloat; }
template <> constexpr Type type_of<bool>() { return Type::kBool; }
template <> constexpr Type type_of<std::string>() { return Type::kString; }

// A validator throws Error with a message about `key`.
using Check = std::function<void(const std::string& key, const Value&)>;

struct KeyDef {
  std::string name;
  Type type;
  std::string doc;
  std::function<Value(const JobConfig&)> get;
  std::function<void(JobConfig&, const Value&)> set;
  Check check;
};

template <typename S, typename F>
KeyDef key(const char* name, S JobConfig::*section, F S::*field, const char* doc, Check check = nullptr) {
  KeyDef k;
  k.name = name;
  k.type = type_of<F>();
  k.doc = doc;
  k.get = [=](const JobConfig& c) -> Value {
    if constexpr (std::is_same_v<F, uint64_t>) return static_cast<int64_t>(c.*section.*field);
    else return c.*section.*field;
  };
  k.set = [=](JobConfig& c, const Value& v) {
    if constexpr (std::is_same_v<F, uint64_t>) c.*section.*field = static_cast<uint64_t>(std::get<int64_t>(v));
    else c.*section.*field = std::get<F>(v);
  };
  k.check = std::move(check);
  return k;
}

double as_number(const Value& v) {
  return std::holds_alternative<int64_t>(v) ? static_cast<double>(std::get<int64_t>(v)) : std::get<double>(v);
}

Check positive() {
  return [](const std::string& k, const Value& v) {
    ST_CHECK(as_number(v) > 0, "`", k, "` must be > 0, found ", as_number(v));
  };
}
Check non_negative() {
  return [](const std::string& k, const Value& v) {
    ST_CHECK(as_number(v) >= 0, "`", k, "` must be >= 0, found ", as_number(v));
  };
}
Check in_range(double lo, double hi) {
  return [=](const std::string& k, const Value& v) {
    const double x = as_number(v);
    ST_CHECK(x >= lo && x <= hi, "`", k, "` must be in [", lo, ", ", hi, "], found ", x);
  };
}
Check in_range_above(double lo, double hi) {  // (lo, hi]
  return [=](const std::string& k, const Value& v) {
    const double x = as_number(v);
    ST_CHECK(x > lo && x <= hi, "`", k, "` must be in (", lo, ", ", hi, "], found ", x);
  };
}
Check one_of(std::initializer_list<const char*> options) {
  std::vector<std::string> opts(options.begin(), options.end());
  return [=](const std::string& k, const Value& v) {
    const std::string& s = std::get<std::string>(v);
    if (std::find(opts.begin(), opts.end(), s) != opts.end()) return;
    std::string list;
    for (const std::string& o : opts) list += (list.empty() ? "" : ", ") + o;
    ST_THROW("`", k, "` must be one of ", list, "; found `", s, "`");
  };
}

const std::vector<KeyDef>& keys() {
  using C = JobConfig;
  static const std::vector<KeyDef> table = {
      key("model.hf", &C::model, &ModelSection::hf,
          "Hugging Face folder to fine-tune (config.json, *.safetensors, tokenizer.json); its shape replaces "
          "the model.* shape keys"),
      key("model.preset", &C::model, &ModelSection::preset,
          "a published model's shape, as its Hugging Face config.json gives it: llama3.2-1b, llama3.2-3b, "
          "llama3.1-8b, llama3.1-70b, llama3.1-405b, llama2-7b, llama2-13b, llama2-70b, qwen3-1.7b or gemma3-1b. It "
          "replaces the model.* "
          "shape keys as model.hf's config.json would, without weights: train and bench start from random weights "
          "of that shape, plan needs nothing downloaded. Not together with model.hf (whose config.json gives the "
          "shape); empty: the shape keys, or model.hf",
          [](const std::string& k, const Value& v) {
            if (!std::get<std::string>(v).empty()) model::preset_config(std::get<std::string>(v), k);
          }),
      key("model.vocab_size", &C::model, &ModelSection::vocab_size,
          "vocabulary size V; 0 takes the tokenizer's", non_negative()),
      key("model.dim", &C::model, &ModelSection::dim, "width D of the residual stream", positive()),
      key("model.n_layers", &C::model, &ModelSection::n_layers, "number of transformer blocks L", positive()),
      key("model.n_heads", &C::model, &ModelSection::n_heads,
          "query heads N (must divide model.dim unless model.head_dim is set)", positive()),
      key("model.n_kv_heads", &C::model, &ModelSection::n_kv_heads,
          "key/value heads M (must divide model.n_heads; < N is grouped-query attention)", positive()),
      key("model.head_dim", &C::model, &ModelSection::head_dim,
          "width H of each attention head, even (rotary embeddings); 0: model.dim / model.n_heads. Set, q_proj is "
          "[N x H, dim], k_proj and v_proj [M x H, dim] and o_proj [dim, N x H] whatever model.dim is "
          "(Mistral-Nemo: dim 5120, 32 heads of 128)",
          non_negative()),
      key("model.ffn_dim", &C::model, &ModelSection::ffn_dim, "hidden width F of the SwiGLU MLP", positive()),
      key("model.max_seq_len", &C::model, &ModelSection::max_seq_len,
          "longest sequence the model supports (rotary table length)", positive()),
      key("model.norm_eps", &C::model, &ModelSection::norm_eps, "RMSNorm epsilon", positive()),
      key("model.rope_theta", &C::model, &ModelSection::rope_theta, "rotary base frequency", positive()),
      key("model.rope_scaling", &C::model, &ModelSection::rope_scaling,
          "rotary frequency scaling: none, llama3 (Llama 3.1), or linear (every frequency divided by "
          "model.rope_scaling_factor, as Gemma 3's global layers)",
          one_of({"none", "llama3", "linear"})),
      key("model.rope_scaling_factor", &C::model, &ModelSection::rope_scaling_factor,
          "llama3 scaling: factor", positive()),
      key("model.rope_low_freq_factor", &C::model, &ModelSection::rope_low_freq_factor,
          "llama3 scaling: low_freq_factor", positive()),
      key("model.rope_high_freq_factor", &C::model, &ModelSection::rope_high_freq_factor,
          "llama3 scaling: high_freq_factor", positive()),
      key("model.rope_original_max_positions", &C::model, &ModelSection::rope_original_max_positions,
          "llama3 scaling: original_max_position_embeddings", positive()),
      key("model.tie_embeddings", &C::model, &ModelSection::tie_embeddings,
          "output head shares the input embedding matrix"),
      key("model.attention_bias", &C::model, &ModelSection::attention_bias,
          "q/k/v projections have biases (Qwen2-style)"),
      key("model.qk_norm", &C::model, &ModelSection::qk_norm,
          "QK-norm (Qwen3-style): an RMSNorm over each head's q and k after their projections, before rope, with "
          "learned weights self_attn.q_norm.weight and self_attn.k_norm.weight of H values (the head dimension: "
          "model.head_dim, or model.dim / model.n_heads) shared by the heads, and model.norm_eps as its epsilon. "
          "Composes with model.head_dim (Qwen3: heads of 128 whatever model.dim is) and model.attention_bias; "
          "exports as a Hugging Face qwen3 model"),
      key("model.sliding_window", &C::model, &ModelSection::sliding_window,
          "sliding-window attention (Mistral, Qwen2, Gemma): on a sliding layer each token attends to the last W "
          "positions only, itself included (with packed documents, those of its own document); 0: none. With "
          "model.preset too; model.hf's config.json gives its own",
          non_negative()),
      key("model.full_attention_every", &C::model, &ModelSection::full_attention_every,
          "with model.sliding_window: which layers attend to every earlier position instead: 0, none (every layer "
          "slides, as Mistral); N >= 2, layers N-1, 2N-1, ... (counting from 0), the others sliding (Gemma 2: 2, "
          "Gemma 3: 6)",
          non_negative()),
      key("model.no_rope_every", &C::model, &ModelSection::no_rope_every,
          "NoPE layers (SmolLM3-style): 0, none (every layer rotates q and k); N >= 1, layers N-1, 2N-1, ... "
          "(counting from 0) attend without rotary embeddings, the others with them (SmolLM3: 4). Exports as a "
          "Hugging Face smollm3 model (its no_rope_layers)",
          non_negative()),
      key("model.embedding_multiplier", &C::model, &ModelSection::embedding_multiplier,
          "Granite-style: the embeddings are multiplied by this after the lookup (Granite 3: 12); 1: none. Any of "
          "the four Granite scalings set exports as a Hugging Face granite model",
          positive()),
      key("model.residual_multiplier", &C::model, &ModelSection::residual_multiplier,
          "Granite-style: each sublayer's output (attention's o_proj, the MLP's down_proj) is multiplied by this "
          "before it is added to the residual stream (Granite 3: 0.22); 1: none",
          positive()),
      key("model.attention_multiplier", &C::model, &ModelSection::attention_multiplier,
          "Granite-style: the attention's softmax scale, in place of 1 / sqrt(head dim) (Granite 3: 0.015625); "
          "0: 1 / sqrt(head dim)",
          non_negative()),
      key("model.logits_scaling", &C::model, &ModelSection::logits_scaling,
          "Granite-style: the logits are divided by this (Granite 3 2B: 8); 1: none", positive()),
      key("model.post_norms", &C::model, &ModelSection::post_norms,
          "OLMo 2-style norms: each sublayer's RMSNorm on its output before the residual add (weights "
          "post_attention_layernorm and post_feedforward_layernorm) instead of on its input (no input_layernorm). "
          "With model.qk_norm_whole, exports as a Hugging Face olmo2 model"),
      key("model.qk_norm_whole", &C::model, &ModelSection::qk_norm_whole,
          "OLMo 2-style QK-norm: an RMSNorm over all of q's N x H values and all of k's M x H after their "
          "projections, before rope, with weights self_attn.q_norm.weight [N x H] and self_attn.k_norm.weight "
          "[M x H] and model.norm_eps as its epsilon (model.qk_norm is Qwen3's, per head: not both). Not with "
          "tensor parallelism"),
      key("model.norm_weight_offset", &C::model, &ModelSection::norm_weight_offset,
          "Gemma-style norms: every RMSNorm (the blocks', the QK-norm's, the final one) scales by weight + this, "
          "the weights initialised to 0 when it is not 0 (Gemma: 1, the (1 + weight) norm); 0: plain weights",
          non_negative()),
      key("model.sandwich_norms", &C::model, &ModelSection::sandwich_norms,
          "Gemma-style norms: an RMSNorm before and one after each sublayer, the latter on its output before the "
          "residual add (weights input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, "
          "post_feedforward_layernorm); not with model.post_norms"),
      key("model.mlp_activation", &C::model, &ModelSection::mlp_activation,
          "the MLP gate's activation: silu (SwiGLU, Llama) or gelu_tanh (GeGLU with the tanh-approximated GELU, "
          "transformers' gelu_pytorch_tanh, Gemma)",
          one_of({"silu", "gelu_tanh"})),
      key("model.scale_embeddings", &C::model, &ModelSection::scale_embeddings,
          "Gemma-style: the embeddings are multiplied by sqrt(model.dim) after the lookup, rounded to the compute "
          "dtype as transformers does. With model.norm_weight_offset = 1, model.sandwich_norms, model.mlp_activation "
          "= gelu_tanh and model.qk_norm, exports as a Hugging Face gemma3_text model (the softmax scale, "
          "model.attention_multiplier, as its query_pre_attn_scalar)"),
      key("model.rope_local_theta", &C::model, &ModelSection::rope_local_theta,
          "Gemma 3-style: the sliding layers' rope base, without model.rope_scaling (the full layers keep "
          "model.rope_theta and its scaling; Gemma 3: 10000); 0: every layer uses model.rope_theta",
          non_negative()),
      key("model.attn_logit_softcapping", &C::model, &ModelSection::attn_logit_softcapping,
          "Gemma 2-style: the attention's scaled scores s become c x tanh(s / c) before the softmax for this c "
          "(Gemma 2: 50); 0: none. On a GPU in bf16 the backward of capped attention runs the exact f32 kernels "
          "(slower than flash attention). Not with training.fp8_attention, nor with data.document_mask in bf16 or "
          "f16 on a GPU. With Gemma's norms, GeGLU and scaled embeddings and without model.qk_norm, exports as "
          "a Hugging Face gemma2 model",
          non_negative()),
      key("model.final_logit_softcapping", &C::model, &ModelSection::final_logit_softcapping,
          "Gemma 2-style: the logits z become c x tanh(z / c) for this c, in the loss and in generation (Gemma 2: "
          "30); 0: none",
          non_negative()),
      key("model.rotary_fraction", &C::model, &ModelSection::rotary_fraction,
          "Phi-4-mini-style partial rotary: rope rotates the first int(H x this) dimensions of each head (an even "
          "number; H the head dimension), the others pass through unrotated (Phi-4-mini: 0.75); 1: all of them. "
          "Below 1, exports as a Hugging Face phi3 model (its partial_rotary_factor, q/k/v fused in qkv_proj and "
          "gate/up in gate_up_proj)",
          in_range_above(0.0, 1.0)),
      key("model.extend_context", &C::model, &ModelSection::extend_context,
          "with model.hf or model.preset: train past the model's own context (its max_position_embeddings) on "
          "sequences of up to this many tokens. The rotary table grows to this length, training.seq_len may reach "
          "it, and checkpoints and the export's config.json give it as max_position_embeddings. The rotary "
          "frequencies stay the model's unless model.rope_theta_scale changes them. Not for LongRoPE models "
          "(Phi-3), whose factors depend on the context; 0: the model's own context",
          non_negative()),
      key("model.rope_theta_scale", &C::model, &ModelSection::rope_theta_scale,
          "with model.hf or model.preset: the model's rotary base (rope_theta) multiplied by this factor, the "
          "usual companion of model.extend_context (a larger base turns every rotary frequency slower, so that "
          "positions past the trained context stay apart); llama3 scaling, when the model has it, applies on "
          "top. Gemma 3's sliding layers keep their own base. The export's config.json gives the new "
          "rope_theta; 1: the model's own",
          positive()),
      key("model.init_std", &C::model, &ModelSection::init_std,
          "standard deviation of the normal init of weight matrices", positive()),
      key("model.dtype", &C::model, &ModelSection::dtype,
          "compute dtype: auto (bf16 on a GPU, f32 on the CPU), bf16 (GPU), f32 (on a GPU for checks: exact but slow "
          "attention), or f64 (CPU, for checks); master weights, gradients and optimizer state are f32 (f64 with f64)",
          one_of({"auto", "bf16", "f32", "f64"})),

      key("data.source", &C::data, &DataSection::source,
          "builtin:fortunes (Debian's fortunes package), builtin:random (random tokens, uniform over the model's "
          "vocabulary: for speed and memory measurements), a .txt, .jsonl or .parquet file (text and JSONL also "
          "gzip- or zstd-compressed: .jsonl.gz, .json.zst, ...), a token file written by "
          "`shardtrain tokenize`, or a folder or file-name pattern (\"data/train-*.parquet\") of token, Parquet, "
          "JSONL or text files, read in name order as one source"),
      key("data.format", &C::data, &DataSection::format,
          "auto (a token file by its header, a Parquet file by its PAR1 marks, else jsonl for .jsonl / .json, else "
          "text), text (blank-line separated documents), jsonl (a text field per line), parquet (a text column, a "
          "document per row), tokens (a token file), sft (prompt/response JSONL or Parquet, the loss on the "
          "responses) or chat (JSONL or Parquet of message lists in the tokenizer's chat template, the loss on the "
          "assistant's turns)",
          one_of({"auto", "text", "jsonl", "parquet", "tokens", "sft", "chat"})),
      key("data.text_field", &C::data, &DataSection::text_field,
          "JSONL field or Parquet column holding each document's text"),
      key("data.prompt_field", &C::data, &DataSection::prompt_field, "sft: JSONL or Parquet field holding each prompt"),
      key("data.response_field", &C::data, &DataSection::response_field,
          "sft: JSONL or Parquet field holding each response"),
      key("data.messages_field", &C::data, &DataSection::messages_field,
          "chat: JSONL or Parquet field holding each conversation, a list of {\"role\", \"content\", ...} objects "
          "(tool calls and other fields pass to the template; a line's or row's `tools` field too)"),
      key("data.train_on_prompt", &C::data, &DataSection::train_on_prompt,
          "sft and chat: count the loss on every token (prompts, system and user turns, chat headers), not only "
          "on the responses and the assistant's turns"),
      key("data.packing", &C::data, &DataSection::packing,
          "sft and chat: several whole examples per sequence (true) or one each, padded (false); an example "
          "longer than training.seq_len + 1 tokens keeps its first training.seq_len + 1"),
      key("data.document_mask", &C::data, &DataSection::document_mask,
          "documents packed into a sequence (each starts at a BOS token) attend only to themselves, with rope "
          "positions from their first token, as if each were a sequence of its own: on, off (causal over the whole "
          "sequence), or auto (on for sft and chat with data.packing, off for text and token streams)",
          one_of({"auto", "on", "off"})),
      key("data.tokenizer", &C::data, &DataSection::tokenizer,
          "auto (model.hf's tokenizer.json; the byte-level tokenizer without model.hf or when its folder holds no "
          "tokenizer.json; the run's log says which), byte (the byte-level tokenizer: 256 bytes + BOS/EOS), or the "
          "path of a tokenizer.json or of its folder"),
      key("data.val_fraction", &C::data, &DataSection::val_fraction,
          "fraction held out for evaluation: of the documents (text, jsonl) or examples (sft, chat) by a seeded "
          "hash, or the tail of a token file from the first document after that fraction", in_range(0.0, 0.5)),
      key("data.mix", &C::data, &DataSection::mix,
          "documents or fine-tuning examples mixed from several sources instead of data.source: `path=weight, "
          "path=weight, ...` (each read as data.source would be, in data.format; weights > 0, normalised); each "
          "training sequence comes from one source, drawn by weight (examples: each source's next sequence in its "
          "own order), and evaluation reports each source's held-out loss"),
      key("data.eval_source", &C::data, &DataSection::eval_source,
          "a separate held-out source (a validation split: the same kind of data as data.source, read with the "
          "same fields) that evaluation reads whole; data.source is then trained on whole and data.val_fraction "
          "does not apply; empty: evaluation reads data.val_fraction of data.source"),
      key("data.token_cache", &C::data, &DataSection::token_cache,
          "a source tokenized once into data.cache_dir (documents as token files, sft and chat examples with their "
          "loss masks), which later launches and every rank read (the same batches as tokenizing in memory): on, off "
          "(tokenize in memory at every launch), or auto (on for sources of 64 MiB and more)",
          one_of({"auto", "on", "off"})),
      key("data.cache_dir", &C::data, &DataSection::cache_dir,
          "folder of token caches; empty: $XDG_CACHE_HOME/shardtrain/tokens, else ~/.cache/shardtrain/tokens"),

      key("training.steps", &C::training, &TrainingSection::steps,
          "optimizer steps to run (0: load, evaluate and export only); not to be given beside training.epochs",
          non_negative()),
      key("training.epochs", &C::training, &TrainingSection::epochs,
          "passes over the training data (fractions allowed), in place of training.steps: the steps are "
          "ceil(epochs x the training split's size / one step's share of it), computed once the data is read "
          "and logged. Fine-tuning examples (sft, chat) count in packed training sequences, a step taking "
          "training.batch_size x training.grad_accum_steps x data-parallel ranks of them, and a last step that "
          "would be partial is filled from the start of the next epoch's order; token streams (text, JSONL, "
          "Parquet, token files) count in training tokens, a step taking that many sequences x training.seq_len "
          "tokens, drawn as random windows, so an epoch is that many tokens seen, not each token once. Not for "
          "data.mix or builtin:random. 0: unset (training.steps applies); 1 when fine-tuning (model.hf) with "
          "neither key given",
          non_negative()),
      key("training.batch_size", &C::training, &TrainingSection::batch_size,
          "sequences per micro-batch", positive()),
      key("training.seq_len", &C::training, &TrainingSection::seq_len,
          "tokens per sequence (<= model.max_seq_len); 0: auto, chosen at launch as the model's context "
          "(model.max_seq_len, or model.hf's max_position_embeddings) capped at 4096, and for fine-tuning "
          "examples (sft, chat) no longer than the longest example rounded up to a multiple of 64 (the examples "
          "are read once anyway; documents are not measured, which would take a pass over the data). 0 when "
          "fine-tuning (model.hf) and not given",
          non_negative()),
      key("training.grad_accum_steps", &C::training, &TrainingSection::grad_accum_steps,
          "micro-batches accumulated per optimizer step", positive()),
      key("training.seed", &C::training, &TrainingSection::seed,
          "seed of the initialisation and of the data order", non_negative()),
      key("training.max_grad_norm", &C::training, &TrainingSection::max_grad_norm,
          "clip the global gradient norm to this; 0 disables clipping", non_negative()),
      key("training.nonfinite_skips", &C::training, &TrainingSection::nonfinite_skips,
          "steps in a row whose gradient norm or loss is NaN or inf that are skipped (no optimizer update; the "
          "step's batches are used up, a warning is logged and the metrics record skipped_nonfinite) before the "
          "run stops with an error; 0: the first such step is an error. 3 by default: one bad batch does not end "
          "a long run, while a diverged one stops within a few steps (a skipped step leaves the weights as they "
          "were, so no checkpoint takes NaN or inf from it)",
          non_negative()),
      key("training.activation_checkpointing", &C::training, &TrainingSection::activation_checkpointing,
          "none (keep every activation); pointwise (keep every matrix product's output and recompute only the "
          "pointwise ops in the backward: both norms and SwiGLU's product; a third less activation memory, no "
          "extra GEMM); selective (keep each block's input and attention half, about a quarter of none's "
          "activation memory, and recompute its norms, SwiGLU and the MLP's gate/up products in the backward); "
          "full (keep only block inputs and recompute each block, all but its output product); or auto (on a GPU, "
          "the first of none, pointwise, selective, full whose planned peak fits the GPU's memory with 2 GiB and "
          "3 % to spare, as `shardtrain plan` estimates it; none on the CPU)",
          one_of({"none", "pointwise", "selective", "full", "auto"})),
      key("training.offload_activations", &C::training, &TrainingSection::offload_activations,
          "on GPUs, move what each block keeps between its forward and its backward to page-locked host memory "
          "after its forward and bring it back one block ahead of its backward, on a copy stream beside the "
          "compute (all but the last two blocks; activation checkpointing with CPU offload). With full "
          "checkpointing only block inputs travel: [batch_size x seq_len x dim] bf16 per block each way; with "
          "auto checkpointing it takes full"),
      key("training.offload_activations_blocks", &C::training, &TrainingSection::offload_activations_blocks,
          "with training.offload_activations: offload only the first n blocks (whose backward comes last), "
          "keeping the others on the GPU (n x one block's kept activations in host memory; n at or above "
          "model.n_layers - 2: every block but the last two); 0: auto, the fewest blocks whose offload brings "
          "the planned peak within the GPU's memory less 2 GiB and 3 % (none when everything fits: the offload "
          "is then off), as `shardtrain plan` estimates it",
          non_negative()),
      key("training.device", &C::training, &TrainingSection::device,
          "where to train: auto (a GPU when one is visible, else the CPU), cpu, or cuda (the GPU numbered "
          "LOCAL_RANK modulo the visible GPUs)",
          one_of({"auto", "cpu", "cuda"})),
      key("training.threads", &C::training, &TrainingSection::threads,
          "host threads per rank (data, the host AdamW of parallel.offload, CPU kernels); 0: on GPUs, this machine's CPUs "
          "shared among its ranks (those the launcher bound the rank to, if it did; torchrun's OMP_NUM_THREADS = 1 is not "
          "followed), on the CPU OpenMP's default (OMP_NUM_THREADS, else every core)", non_negative()),
      key("training.loss_chunk_tokens", &C::training, &TrainingSection::loss_chunk_tokens,
          "tokens per chunk of the fused head + cross-entropy (bounds logits memory); 0: auto (256 on the CPU; on "
          "a GPU as many as keep a chunk's bf16 logits within 2 GiB, at most 8192)",
          non_negative()),
      key("training.mlp_chunk_tokens", &C::training, &TrainingSection::mlp_chunk_tokens,
          "tokens per piece of each block's MLP where selective or full checkpointing keeps none of its [tokens, "
          "ffn_dim] tensors: the forward and the backward's recomputation run that many token rows at a time, so "
          "long sequences need a piece's gate, up and h instead of every token's; 0: auto (on a GPU, pieces of "
          "equal size whose gate, up, h and dh stay within 2 GiB in bf16, when a micro-batch has more tokens than "
          "that; otherwise, and on the CPU, every token at once)",
          non_negative()),
      key("training.gemm_selection", &C::training, &TrainingSection::gemm_selection,
          "how a GPU picks each matrix-product shape's cuBLASLt algorithm: heuristic (cuBLASLt's first choice, the "
          "same in every run) or timed (the fastest of 8 candidates, timed back to back under load on the first "
          "call, about half a second per shape; a small gain at best, see docs/performance.md; the pick, and with it "
          "the last bits of the results, can differ between runs)",
          one_of({"timed", "heuristic"})),
      key("training.fp8", &C::training, &TrainingSection::fp8,
          "FP8 matrix products for every linear of each block (q/k/v, o, gate/up, down; forward, input and weight "
          "gradients), with f32 accumulation; the embedding, the head and loss, the norms and attention stay in the "
          "compute dtype, and master weights, optimizer state, gradients and checkpoints are unchanged: off; "
          "tensorwise (one scale per tensor from its current amax); rowwise (one scale per row of each product's "
          "operands); blockwise (1x128 groups for activations and gradients, 128x128 blocks for weights, as "
          "DeepSeek-V3). Needs a Hopper GPU (compute capability 9.0); on the CPU the products are emulated exactly "
          "(for tests, no faster). See docs/performance.md, FP8, for which recipe to use",
          one_of({"off", "tensorwise", "rowwise", "blockwise"})),
      key("training.fp8_gradients", &C::training, &TrainingSection::fp8_gradients,
          "with training.fp8: the format of the output gradients in the backward's products: e5m2 (more range), "
          "e4m3 (more precision), or auto (e5m2 for tensorwise, whose one scale spans the whole tensor; e4m3 for "
          "rowwise and blockwise); activations and weights are always e4m3",
          one_of({"auto", "e4m3", "e5m2"})),
      key("training.fp8_head", &C::training, &TrainingSection::fp8_head,
          "with training.fp8: the output head's three products (the logits, the final norm's gradient and the "
          "head's weight gradient) in FP8 too, with the recipe's scales; the softmax and the loss stay f32. The "
          "logits' gradient is e5m2 unless blockwise (with training.fp8_gradients = auto; a chosen format applies "
          "here too): one of its rows spans the whole vocabulary, from the target's -1 down to probabilities below "
          "e4m3's range under one scale. Off by default: the head is the product most sensitive to precision (see "
          "docs/performance.md, FP8, for the loss curves and the speed)"),
      key("training.fp8_attention", &C::training, &TrainingSection::fp8_attention,
          "attention's products in FP8 e4m3 with f32 accumulation, forward and backward, through cuDNN's FP8 "
          "flash attention: q, k and v take one power-of-two scale each from their amax and are rounded to their "
          "e4m3 values; the probabilities, the output, its gradient, dP and the q/k/v gradients are e4m3 too "
          "(the gradients under scales from the largest values each layer saw before). With or without "
          "training.fp8. Off by default: on the loss curves measured so far it ends 1.9 % (bf16 linears) and "
          "3.4 % (FP8 linears) above bf16's held-out loss, where the FP8 linears stay within 0.5 % (see "
          "docs/performance.md, FP8 attention). Needs a GPU of compute capability 9.0 or more, bf16 compute and "
          "a head dim of 128; layers with a sliding window and batches of packed documents attend in bf16; a "
          "resumed run learns the gradients' scales again"),
      key("training.deterministic", &C::training, &TrainingSection::deterministic,
          "on GPUs, repeat a run bit for bit: the attention backward takes cuDNN's deterministic algorithm instead "
          "of its default, which does not promise the same bits from run to run (somewhat slower, and more memory "
          "than `shardtrain plan` estimates: docs/training-and-data.md, Reproducible batches); needs "
          "training.gemm_selection = heuristic. The other ops are deterministic already; the CPU always is"),
      key("training.cuda_graph", &C::training, &TrainingSection::cuda_graph,
          "on one GPU, capture a micro-batch's forward and backward into a CUDA graph after the first step and "
          "replay it (one launch instead of ~50 per block; several GPUs run eagerly)"),
      key("training.time_limit", &C::training, &TrainingSection::time_limit,
          "stop before this much time has passed since the process started (a job's wall-clock limit): once what "
          "is left would not hold another step and a save (the mean step, and the last save's time or else one more "
          "step), every rank stops after the step, a checkpoint is saved and the run exits with status 75 "
          "(EX_TEMPFAIL: resume with --checkpoint.resume=auto); a duration such as 3h50m, 90m, 1.5h or 600s; "
          "empty: none",
          [](const std::string& k, const Value& v) { parse_duration_seconds(std::get<std::string>(v), k); }),

      key("optimizer.lr", &C::optimizer, &OptimizerSection::lr,
          "peak learning rate; 2e-5 when fine-tuning (model.hf) and not given: full fine-tuning moves every "
          "weight of a pretrained model, and steps near pre-training's (2e-3 here) would erase what it learned "
          "within a few steps; 1e-5 to 5e-5 is the usual range for AdamW over all weights",
          positive()),
      key("optimizer.beta1", &C::optimizer, &OptimizerSection::beta1, "AdamW beta1", in_range(0.0, 0.999999)),
      key("optimizer.beta2", &C::optimizer, &OptimizerSection::beta2, "AdamW beta2", in_range(0.0, 0.999999)),
      key("optimizer.eps", &C::optimizer, &OptimizerSection::eps, "AdamW epsilon", positive()),
      key("optimizer.weight_decay", &C::optimizer, &OptimizerSection::weight_decay,
          "decoupled weight decay (applied to weight matrices)", non_negative()),
      key("optimizer.decay_1d", &C::optimizer, &OptimizerSection::decay_1d,
          "also decay norm weights and biases"),

      key("schedule.type", &C::schedule, &ScheduleSection::type,
          "learning-rate decay after warmup: cosine, linear, sqrt (1 - sqrt of the decay's progress) or constant",
          one_of({"cosine", "linear", "sqrt", "constant"})),
      key("schedule.warmup_steps", &C::schedule, &ScheduleSection::warmup_steps,
          "linear warmup steps from 0 to optimizer.lr; not to be given beside schedule.warmup_fraction",
          non_negative()),
      key("schedule.warmup_fraction", &C::schedule, &ScheduleSection::warmup_fraction,
          "the warm-up as a share of training.steps, in place of schedule.warmup_steps: ceil(fraction x steps) "
          "steps, computed at launch (after training.epochs) and logged; 0: unset (schedule.warmup_steps "
          "applies); 0.03 when fine-tuning (model.hf) with neither key given",
          in_range(0.0, 0.5)),
      key("schedule.min_lr_ratio", &C::schedule, &ScheduleSection::min_lr_ratio,
          "final learning rate as a fraction of optimizer.lr", in_range(0.0, 1.0)),
      key("schedule.decay_fraction", &C::schedule, &ScheduleSection::decay_fraction,
          "share of training.steps the decay takes, at the end (warmup-stable-decay: the steps between "
          "warmup and decay stay at optimizer.lr); 1: the decay starts right after warmup",
          in_range(0.0, 1.0)),

      key("eval.enabled", &C::eval, &EvalSection::enabled,
          "evaluate on the held-out split (or data.eval_source); false: no evaluation at all, neither at "
          "eval.interval_steps nor at the end, and no held-out data is needed (the split of data.val_fraction is "
          "still set aside: set data.val_fraction = 0 to train on all of data.source)"),
      key("eval.interval_steps", &C::eval, &EvalSection::interval_steps,
          "evaluate on the held-out split every this many steps (and at the end); 0 only at the end",
          non_negative()),
      key("eval.batches", &C::eval, &EvalSection::batches,
          "global held-out batches per evaluation (each training.batch_size sequences per data-parallel rank), "
          "from the split's start; 0: all of them (the whole held-out split or data.eval_source). Fine-tuning "
          "examples evaluate their last, partial batch too (and a held-out split smaller than one batch): the "
          "missing rows count no token, and the loss is the mean over the counted tokens evaluated",
          non_negative()),
      key("eval.at_start", &C::eval, &EvalSection::at_start,
          "also evaluate before the first step (logged as step 0, or as the step a resumed run starts after): "
          "the held-out loss the run starts from, such as a pretrained model's before fine-tuning"),

      key("logging.interval_steps", &C::logging, &LoggingSection::interval_steps,
          "write a log line every this many steps", positive()),
      key("logging.metrics_file", &C::logging, &LoggingSection::metrics_file,
          "JSONL metrics file, relative to run.output_dir; empty disables (a resumed run keeps the steps its "
          "checkpoint covers and appends)"),
      key("logging.tensorboard_dir", &C::logging, &LoggingSection::tensorboard_dir,
          "folder for TensorBoard event files (`tensorboard --logdir`), relative to run.output_dir: every metric "
          "of the JSONL file as a scalar; empty disables"),
      key("logging.level", &C::logging, &LoggingSection::level, "debug, info, warn or error",
          one_of({"debug", "info", "warn", "error"})),
      key("logging.progress", &C::logging, &LoggingSection::progress,
          "progress bar: auto (when stderr is a terminal), on or off", one_of({"auto", "on", "off"})),
      key("logging.gpu_power", &C::logging, &LoggingSection::gpu_power,
          "on a GPU, add the board's mean power, SM clock and the share of time its power cap held the clock "
          "down to each log line, and the energy per token to the run's summary (read through the driver's NVML "
          "20 times a second by a background thread; each rank reads its own GPU, the log shows rank 0's)"),

      key("run.output_dir", &C::run, &RunSection::output_dir,
          "folder of the run: its resolved config (config.toml), log (train.log), metrics, final sample "
          "(sample.txt) and, by default, checkpoints; a folder that holds another run's checkpoints (or TensorBoard "
          "events) is refused unless the run resumes it (checkpoint.resume) or starts over (run.overwrite); a run "
          "that saved no checkpoint cannot be resumed, and its metrics are started anew"),
      key("run.overwrite", &C::run, &RunSection::overwrite,
          "start over in a run.output_dir that holds another run: its checkpoints (under checkpoint.dir), metrics, "
          "TensorBoard events, log, config.toml and sample.txt are removed first (logged); false refuses such a "
          "folder, naming what it holds"),

      key("parallel.tensor_parallel", &C::parallel, &ParallelSection::tensor_parallel,
          "ranks per tensor-parallel group (2-D parallelism: FSDP across groups, Megatron-style tensor "
          "parallelism with sequence parallelism inside one): each of a group's consecutive ranks holds 1/n of "
          "every block's heads and FFN columns and 1/n of each batch's token rows between the products; it must "
          "divide the ranks, the heads, the kv heads, the FFN width and training.batch_size x "
          "training.seq_len. 1: FSDP alone",
          positive()),
      key("parallel.replicate", &C::parallel, &ParallelSection::replicate,
          "data-parallel replicas (hybrid sharding, HSDP): the ranks form this many replicas of consecutive "
          "ranks (one per node, say), each sharding a whole copy of the model over its own ranks, so that "
          "gathers and reduce-scatters stay inside a replica and only the reduced gradient shards are summed "
          "between replicas (an all-reduce). It must divide the data-parallel groups (the ranks / "
          "parallel.tensor_parallel); that many is plain data parallelism (DDP: every rank holds the whole "
          "model). 1: FSDP over every rank",
          positive()),
      key("parallel.context_parallel", &C::parallel, &ParallelSection::context_parallel,
          "ranks that split each sequence (context parallelism, ring attention): consecutive ranks form groups of "
          "this many, each holding 2 of a sequence's 2n chunks (head and tail, so the causal work is even) and "
          "passing keys and values around the group in the attention; the groups draw different sequences, and "
          "every rank shards the model (FSDP over all of them, or inside each replica with parallel.replicate). It "
          "must divide the ranks, and 2n must divide "
          "training.seq_len. With data.document_mask a packed document may span the chunks and ranks. Not with "
          "parallel.tensor_parallel, training.fp8_attention, sliding-window layers or soft-capped attention. 1: off",
          positive()),
      key("parallel.reshard_after_forward", &C::parallel, &ParallelSection::reshard_after_forward,
          "free each unit's gathered parameters after its forward (FSDP); false keeps them until the backward "
          "(ZeRO-2-like: fewer gathers, more memory)"),
      key("parallel.keep_last_block_gathered", &C::parallel, &ParallelSection::keep_last_block_gathered,
          "keep the last block gathered between its forward and backward (its backward comes first)"),
      key("parallel.compute_shards", &C::parallel, &ParallelSection::compute_shards,
          "keep a bf16 copy of each rank's master-weight shards, written by AdamW as it updates them: units are "
          "then gathered without a cast, and on one GPU (or replicas of one GPU each) used in place without any "
          "gather (2 bytes per parameter and rank); auto: on for a single GPU, or replicas of one GPU each, whose "
          "memory plan fits with them (on: also with several GPUs; "
          "ignored on the CPU, which computes in f32)",
          one_of({"auto", "on", "off"})),
      key("parallel.offload", &C::parallel, &ParallelSection::offload,
          "ZeRO-3 with CPU offload (GPUs only): each rank's f32 master weights, gradient shards, bf16 weight "
          "copies and AdamW state live in host memory (page-locked but for AdamW's) and AdamW runs on the host's "
          "cores in one fused f32 pass, unit by unit beside the next step's forward, which takes each unit as it "
          "is updated; the GPU holds only the units in use, their gradients until reduced, and the activations. "
          "Each unit's weights come up for every gather and each gradient shard goes down, overlapped with the "
          "compute; the step runs without a CUDA graph"),
      key("parallel.offload_gradients", &C::parallel, &ParallelSection::offload_gradients,
          "with parallel.offload: false keeps the f32 gradient shards on the GPU (4 bytes per parameter and rank "
          "there) and the bf16 weight copies off the host unless parallel.compute_shards = on, so the host holds "
          "only the f32 master weights and AdamW's m and v (12 bytes per parameter instead of 18: an 8B model "
          "needs 90 GiB of host memory, not 135); each gather then copies the f32 master shard up and casts it on "
          "the GPU, and the host update copies each unit's gradient shard down just before updating that unit"),
      key("parallel.reduce_dtype", &C::parallel, &ParallelSection::reduce_dtype,
          "dtype gradients travel in for the reduce-scatter: f32, or bf16 (half the traffic, rounded sums)",
          one_of({"f32", "bf16"})),
      key("parallel.reductions_in_flight", &C::parallel, &ParallelSection::reductions_in_flight,
          "GPUs with several ranks (or parallel.offload): how many blocks' whole f32 gradients may still be in "
          "their reduce-scatter while the backward goes on with the next block, each holding a block's gradient "
          "on the GPU (4 bytes per parameter of a block: 12 GiB at Llama 3.1 405B's width). Before one more would "
          "be in flight the backward waits for the oldest: 1 is a double buffer (one block reducing while the next "
          "is written, a block less memory than 2), 2 rides out a single reduction slower than a block's backward, "
          "0 waits for each reduction before the next block's backward (no overlap: slower, a block less memory "
          "again; docs/multi-gpu.md has the measurements)",
          in_range(0.0, 8.0)),
      key("parallel.hf_load", &C::parallel, &ParallelSection::hf_load,
          "how ranks load model.hf: ranges (each rank reads its own byte ranges) or rank0 (rank 0 alone reads, "
          "and sends each unit to the others: for files only rank 0 can see)",
          one_of({"ranges", "rank0"})),
      key("parallel.init_timeout_s", &C::parallel, &ParallelSection::init_timeout_s,
          "seconds a rank waits for the others to start (torchrun-style launches) before failing", positive()),
      key("parallel.timeout_s", &C::parallel, &ParallelSection::timeout_s,
          "with several ranks, end the run (exit status 124) when a training step or an evaluation batch makes no "
          "progress for this many seconds: no collective issued by the rank since it began or since the last one "
          "(sharded work issues them block by block; the first step gets parallel.init_timeout_s more), naming the "
          "step and the last collective; a rank that failed, hung or was stopped otherwise leaves the others "
          "waiting in a collective forever. Checkpoint saves, their commits and the export are watched too, bytes "
          "written to files also counting as progress. An error a communicator reports on its own (NCCL: a peer or "
          "the network gone) ends the run at once (status 1). 0: no limit",
          non_negative()),

      key("export.folder", &C::export_, &ExportSection::folder,
          "write a Hugging Face folder here at the end of training (config.json, safetensors, the tokenizer's files: "
          "the byte-level tokenizer's written as tokenizer.json, or copied from the tokenizer's folder); "
          "empty: no export"),
      key("export.dtype", &C::export_, &ExportSection::dtype, "dtype of the exported weights: bf16, f16 or f32",
          one_of({"bf16", "f16", "f32"})),
      key("export.max_shard_mb", &C::export_, &ExportSection::max_shard_mb,
          "largest safetensors shard in MB (as save_pretrained's max_shard_size)", positive()),

      key("checkpoint.interval_steps", &C::checkpoint, &CheckpointSection::interval_steps,
          "save a checkpoint every this many steps and at the end; 0 saves none", non_negative()),
      key("checkpoint.keep", &C::checkpoint, &CheckpointSection::keep,
          "checkpoints kept (older ones are deleted once a newer one is complete); 0 keeps all", non_negative()),
      key("checkpoint.dir", &C::checkpoint, &CheckpointSection::dir,
          "folder of the step_* checkpoint directories; empty: run.output_dir/checkpoints"),
      key("checkpoint.resume", &C::checkpoint, &CheckpointSection::resume,
          "resume from a checkpoint: a step directory, or auto (the latest under checkpoint.dir, if any); "
          "empty starts fresh"),
      key("checkpoint.async", &C::checkpoint, &CheckpointSection::async,
          "copy the state to host memory and write the files on a thread while training goes on; the checkpoint "
          "becomes `latest` at the first step after it at which every rank has written its file (at the latest at "
          "the next save or the end, which wait for the writing)"),
      key("checkpoint.on_signal", &C::checkpoint, &CheckpointSection::on_signal,
          "on SIGTERM (a scheduler's preemption), SIGUSR1 (Slurm's --signal=USR1@SECONDS) or SIGINT (Ctrl-C) at any "
          "rank, every rank finishes its step (an evaluation stops before its next batch), a checkpoint is saved to "
          "the checkpoint folder (also with "
          "checkpoint.interval_steps = 0) and the run exits with status 128 + the signal's number; a second Ctrl-C "
          "stops at once. false: the signals end the process at once"),

      key("sample.prompt", &C::sample, &SampleSection::prompt, "text the final sample continues"),
      key("sample.tokens", &C::sample, &SampleSection::tokens,
          "tokens to generate at the end of training; 0 disables", non_negative()),
      key("sample.temperature", &C::sample, &SampleSection::temperature,
          "sampling temperature; 0 is greedy", non_negative()),
      key("sample.top_k", &C::sample, &SampleSection::top_k,
          "sample among the k most likely tokens; 0 is all", non_negative()),
      key("sample.top_p", &C::sample, &SampleSection::top_p,
          "nucleus sampling: among those, the fewest most likely tokens whose probabilities sum to at least p; "
          "1 is all", in_range_above(0.0, 1.0)),
      key("sample.seed", &C::sample, &SampleSection::seed, "seed of the sampler", non_negative()),
  };
  return table;
}

const KeyDef& find_key(const std::string& name, const std::string& where) {
  const std::vector<KeyDef>& table = keys();
  for (const KeyDef& k : table)
    if (k.name == name) return k;
  const KeyDef* best = &table.front();
  size_t best_d = SIZE_MAX;
  for (const KeyDef& k : table) {
    const size_t d = edit_distance(name, k.name);
    if (d < best_d) {
      best_d = d;
      best = &k;
    }
  }
  ST_THROW(where, "unknown config key `", name, "`; did you mean `", best->name, "`? (`shardtrain print-config` lists all keys)");
}

// A value as TOML text that reads back as the same value: floats in their shortest exact form,
// strings quoted with TOML's escapes.
std::string value_str(const Value& v) {
  if (std::holds_alternative<int64_t>(v)) return std::to_string(std::get<int64_t>(v));
  if (std::holds_alternative<bool>(v)) return std::get<bool>(v) ? "true" : "false";
  if (std::holds_alternative<double>(v)) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, std::get<double>(v));
    return std::string(buf, r.ptr);
  }
  std::string out = "\"";
  for (const char c : std::get<std::string>(v)) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += fmt::format("\\u{:04X}", static_cast<unsigned>(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

Value parse_text(const KeyDef& k, const std::string& text) {
  auto fail = [&]() -> Value {
    ST_THROW("`", k.name, "` expects ", type_name(k.type), ", found `", text, "`");
  };
  switch (k.type) {
    case Type::kInt: {
      size_t used = 0;
      int64_t v = 0;
      try {
        v = std::stoll(text, &used);
      } catch (const std::exception&) {
        return fail();
      }
      if (used != text.size()) return fail();
      return v;
    }
    case Type::kFloat: {
      size_t used = 0;
      double v = 0;
      try {
        v = std::stod(text, &used);
      } catch (const std::exception&) {
        return fail();
      }
      if (used != text.size() || !std::isfinite(v)) return fail();
      return v;
    }
    case Type::kBool:
      if (text == "true" || text == "1") return true;
      if (text == "false" || text == "0") return false;
      return fail();
    case Type::kString:
      return text;
  }
  return fail();
}

Value from_toml(const KeyDef& k, const toml::node& node, const std::string& where) {
  switch (k.type) {
    case Type::kInt:
      if (auto v = node.as_integer()) return v->get();
      break;
    case Type::kFloat:
      if (auto v = node.as_floating_point()) return v->get();
      if (auto v = node.as_integer()) return static_cast<double>(v->get());
      break;
    case Type::kBool:
      if (auto v = node.as_boolean()) return v->get();
      break;
    case Type::kString:
      if (auto v = node.as_string()) return v->get();
      break;
  }
  std::ostringstream found;
  found << node.type();
  ST_THROW(where, "`", k.name, "` expects ", type_name(k.type), ", found a ", found.str());
}

void set_checked(LoadedConfig& out, const KeyDef& k, const Value& v, ValueSource source) {
  if (k.check) k.check(k.name, v);
  k.set(out.config, v);
  out.sources[k.name] = source;
}

void walk_table(LoadedConfig& out, const toml::table& table, const std::string& prefix, const std::string& where) {
  for (const auto& [name, node] : table) {
    const std::string full = prefix.empty() ? std::string(name.str()) : prefix + "." + std::string(name.str());
    if (const toml::table* sub = node.as_table()) {
      walk_table(out, *sub, full, where);
      continue;
    }
    const KeyDef& k = find_key(full, where);
    set_checked(out, k, from_toml(k, node, where), ValueSource::kFile);
  }
}

}  // namespace

LoadedConfig load_config(const std::string& toml_path, const std::vector<std::string>& overrides) {
  LoadedConfig out;
  for (const KeyDef& k : keys()) out.sources[k.name] = ValueSource::kDefault;
  if (!toml_path.empty()) {
    out.file = toml_path;
    toml::table table;
    try {
      table = toml::parse_file(toml_path);
    } catch (const toml::parse_error& e) {
      std::ostringstream s;
      s << e.source().begin;
      ST_THROW("config `", toml_path, "`: ", e.description(), " at ", s.str());
    }
    walk_table(out, table, "", "config `" + toml_path + "`: ");
  }
  for (const std::string& raw : overrides) {
    std::string o = raw.rfind("--", 0) == 0 ? raw.substr(2) : raw;
    const size_t eq = o.find('=');
    ST_CHECK(eq != std::string::npos && eq > 0, "override `", raw, "` must look like --section.key=value");
    const KeyDef& k = find_key(o.substr(0, eq), "override `" + raw + "`: ");
    set_checked(out, k, parse_text(k, o.substr(eq + 1)), ValueSource::kOverride);
  }
  const auto given = [&](const char* key) { return out.sources.at(key) != ValueSource::kDefault; };
  const auto where = [&](const char* key) {
    return std::string(out.sources.at(key) == ValueSource::kFile ? "in `" + out.file + "`" : "on the command line");
  };
  // 0 is "unset" for epochs and the warm-up fraction: a full config (print-config's) gives both keys
  ST_CHECK(!given("training.steps") || !given("training.epochs") || out.config.training.epochs == 0,
           "`training.steps` (", out.config.training.steps,
           ", ", where("training.steps"), ") and `training.epochs` (", out.config.training.epochs, ", ",
           where("training.epochs"), ") both set the run's length; give one of them");
  ST_CHECK(!given("schedule.warmup_steps") || !given("schedule.warmup_fraction") ||
               out.config.schedule.warmup_fraction == 0,
           "`schedule.warmup_steps` (",
           out.config.schedule.warmup_steps, ", ", where("schedule.warmup_steps"), ") and `schedule.warmup_fraction` (",
           out.config.schedule.warmup_fraction, ", ", where("schedule.warmup_fraction"),
           ") both set the warm-up; give one of them");
  apply_fine_tuning_defaults(out);
  validate(out.config);
  return out;
}

bool is_boolean_key(const std::string& name, const std::string& where) {
  return find_key(name, where).type == Type::kBool;
}

void apply_fine_tuning_defaults(LoadedConfig& loaded) {
  JobConfig& c = loaded.config;
  if (c.model.hf.empty()) return;
  const auto unset = [&](std::initializer_list<const char*> names) {
    return std::all_of(names.begin(), names.end(), [&](const char* n) {
      const auto it = loaded.sources.find(n);
      return it == loaded.sources.end() || it->second == ValueSource::kDefault;
    });
  };
  const auto take = [&](const char* name) {
    loaded.sources[name] = ValueSource::kFineTuning;
    c.fine_tuning_defaults.emplace_back(name);
  };
  if (unset({"optimizer.lr"})) {
    c.optimizer.lr = kFineTuningLr;
    take("optimizer.lr");
  }
  if (unset({"schedule.warmup_steps", "schedule.warmup_fraction"})) {
    c.schedule.warmup_fraction = kFineTuningWarmupFraction;
    take("schedule.warmup_fraction");
  }
  if (unset({"training.seq_len"})) {
    c.training.seq_len = 0;
    take("training.seq_len");
  }
  if (unset({"training.steps", "training.epochs"})) {
    c.training.epochs = kFineTuningEpochs;
    take("training.epochs");
  }
  // stays true; the launch turns evaluation off (and says so) only where the held-out split
  // has nothing to evaluate, as a small fine-tuning set's may not
  if (unset({"eval.enabled"})) c.fine_tuning_defaults.emplace_back("eval.enabled");
}

namespace {

// model.sliding_window and model.full_attention_every: a pattern that has sliding layers.
void validate_sliding_window(const ModelSection& m) {
  ST_CHECK(m.sliding_window == 0 || m.hf.empty(), "`model.sliding_window` = ", m.sliding_window,
           " with `model.hf` = \"", m.hf, "\": the folder's config.json decides the sliding window (`sliding_window`, "
           "`layer_types`); drop model.sliding_window");
  ST_CHECK(m.full_attention_every == 0 || m.sliding_window > 0, "`model.full_attention_every` = ",
           m.full_attention_every, " chooses the full-attention layers among sliding ones, but `model.sliding_window` "
           "is 0 (no sliding layers); set a window or drop model.full_attention_every");
  ST_CHECK(m.full_attention_every != 1 || m.sliding_window == 0, "`model.full_attention_every` = 1 makes every layer "
           "attend fully, leaving `model.sliding_window` = ", m.sliding_window, " unused; use 0 (every layer slides), "
           "N >= 2, or set model.sliding_window = 0");
}

// The family keys (NoPE layers, Granite's scalings, OLMo 2's and Gemma's norms) shape a model built from
// the shape keys; a preset's or a folder's shape has its own.
void validate_family_keys(const ModelSection& m) {
  if (m.preset.empty() && m.hf.empty()) return;
  const char* from = m.preset.empty() ? "`model.hf`" : "`model.preset`";
  const ModelSection plain;
  auto unset = [&](bool same, const char* key) {
    ST_CHECK(same, "`", key, "` is set, but ", from, " gives the model's shape (its config.json or preset decides "
             "it); drop ", key);
  };
  unset(m.no_rope_every == plain.no_rope_every, "model.no_rope_every");
  unset(m.embedding_multiplier == plain.embedding_multiplier, "model.embedding_multiplier");
  unset(m.residual_multiplier == plain.residual_multiplier, "model.residual_multiplier");
  unset(m.attention_multiplier == plain.attention_multiplier, "model.attention_multiplier");
  unset(m.logits_scaling == plain.logits_scaling, "model.logits_scaling");
  unset(m.post_norms == plain.post_norms, "model.post_norms");
  unset(m.qk_norm_whole == plain.qk_norm_whole, "model.qk_norm_whole");
  unset(m.norm_weight_offset == plain.norm_weight_offset, "model.norm_weight_offset");
  unset(m.sandwich_norms == plain.sandwich_norms, "model.sandwich_norms");
  unset(m.mlp_activation == plain.mlp_activation, "model.mlp_activation");
  unset(m.scale_embeddings == plain.scale_embeddings, "model.scale_embeddings");
  unset(m.rope_local_theta == plain.rope_local_theta, "model.rope_local_theta");
  unset(m.attn_logit_softcapping == plain.attn_logit_softcapping, "model.attn_logit_softcapping");
  unset(m.final_logit_softcapping == plain.final_logit_softcapping, "model.final_logit_softcapping");
  unset(m.rotary_fraction == plain.rotary_fraction, "model.rotary_fraction");
}

}  // namespace

void validate(const JobConfig& c) {
  const ModelSection& m = c.model;
  ST_CHECK(m.preset.empty() || m.hf.empty(), "`model.preset` (\"", m.preset, "\") and `model.hf` (\"", m.hf,
           "\") both give the model's shape; set one: model.hf to fine-tune that folder's weights (its config.json "
           "gives the shape), or model.preset for the shape alone with random weights");
  if (m.head_dim == 0) {
    ST_CHECK(m.dim % m.n_heads == 0, "`model.n_heads` (", m.n_heads, ") must divide `model.dim` (", m.dim,
             "); change one of them, or set `model.head_dim` for heads of a width of their own");
    ST_CHECK((m.dim / m.n_heads) % 2 == 0, "head dimension `model.dim` / `model.n_heads` = ", m.dim / m.n_heads,
             " must be even for rotary embeddings");
  } else {
    ST_CHECK(m.head_dim % 2 == 0, "`model.head_dim` = ", m.head_dim, " must be even for rotary embeddings");
  }
  ST_CHECK(m.n_heads % m.n_kv_heads == 0, "`model.n_kv_heads` (", m.n_kv_heads, ") must divide `model.n_heads` (",
           m.n_heads, ")");
  validate_sliding_window(m);
  validate_family_keys(m);
  ST_CHECK(!m.qk_norm || !m.qk_norm_whole, "`model.qk_norm` (per head, Qwen3) and `model.qk_norm_whole` (over all "
           "heads, OLMo 2) both set; choose one");
  ST_CHECK(!m.post_norms || !m.sandwich_norms, "`model.post_norms` (norms after each sublayer only, OLMo 2) and "
           "`model.sandwich_norms` (before and after, Gemma) both set; choose one");
  // with model.hf the shape comes from its config.json (checked when loaded)
  const std::optional<model::LlamaConfig> preset =
      m.preset.empty() ? std::nullopt : std::optional(model::preset_config(m.preset));
  ST_CHECK(!m.preset.empty() || !m.hf.empty() || (m.extend_context == 0 && m.rope_theta_scale == 1.0),
           "`model.extend_context` and `model.rope_theta_scale` change the context of `model.hf` or `model.preset`; "
           "a model made by the shape keys has its context in `model.max_seq_len` and its rotary base in "
           "`model.rope_theta`: set those instead");
  if (preset)
    ST_CHECK(c.training.seq_len <= std::max(preset->max_seq_len, m.extend_context), "`training.seq_len` (",
             c.training.seq_len, ") exceeds the max_position_embeddings (", preset->max_seq_len,
             ") of `model.preset` = \"", m.preset, "\"; shorten sequences, or train past the model's context with "
             "`model.extend_context` (usually with `model.rope_theta_scale`)");
  else if (m.hf.empty())
    ST_CHECK(c.training.seq_len <= m.max_seq_len, "`training.seq_len` (", c.training.seq_len,
             ") exceeds `model.max_seq_len` (", m.max_seq_len, "); raise model.max_seq_len or shorten sequences");
  ST_CHECK(c.eval.enabled || !c.eval.at_start, "`eval.at_start` = true asks for an evaluation before the first "
           "step, but `eval.enabled` = false turns evaluation off; drop one of them");
  ST_CHECK(c.eval.enabled || c.data.eval_source.empty(), "`data.eval_source` = `", c.data.eval_source,
           "` is read only for evaluation, but `eval.enabled` = false turns evaluation off; drop one of them");
  ST_CHECK(!c.training.deterministic || c.training.gemm_selection == "heuristic",
           "`training.deterministic` needs `training.gemm_selection` = \"heuristic\" (found \"",
           c.training.gemm_selection, "\"): timed picks can differ between runs");
  ST_CHECK(m.rope_high_freq_factor > m.rope_low_freq_factor, "`model.rope_high_freq_factor` (",
           m.rope_high_freq_factor, ") must exceed `model.rope_low_freq_factor` (", m.rope_low_freq_factor, ")");
  if (const int64_t cp = c.parallel.context_parallel; cp > 1) {
    ST_CHECK(c.parallel.tensor_parallel == 1, "`parallel.context_parallel` (", cp, ") with `parallel.tensor_parallel` (",
             c.parallel.tensor_parallel, "): context parallelism does not combine with tensor parallelism yet; set "
             "one of them to 1");
    // training.seq_len = 0 is chosen once the data is read, and checked again then
    if (c.training.seq_len > 0) model::context_chunk_tokens(c.training.seq_len, static_cast<int>(cp));
    ST_CHECK(!c.training.fp8_attention, "`parallel.context_parallel` (", cp,
             ") with `training.fp8_attention` = true: the ring attention runs in the compute dtype; turn one of "
             "them off");
  }
  const int64_t tp = c.parallel.tensor_parallel;
  if (tp > 1) {
    ST_CHECK((c.training.batch_size * c.training.seq_len) % tp == 0, "`parallel.tensor_parallel` (", tp,
             ") must divide `training.batch_size` x `training.seq_len` (", c.training.batch_size, " x ",
             c.training.seq_len, "): each rank of a group holds that share of a batch's token rows");
    if (preset)
      ST_CHECK(preset->n_heads % tp == 0 && preset->n_kv_heads % tp == 0 && preset->ffn_dim % tp == 0,
               "`parallel.tensor_parallel` (", tp, ") must divide the heads (", preset->n_heads, "), kv heads (",
               preset->n_kv_heads, ") and FFN width (", preset->ffn_dim, ") of `model.preset` = \"", m.preset, "\"");
    else if (m.hf.empty())  // with model.hf the shape comes from its config.json (checked by the layout)
      ST_CHECK(m.n_heads % tp == 0 && m.n_kv_heads % tp == 0 && m.ffn_dim % tp == 0, "`parallel.tensor_parallel` (",
               tp, ") must divide `model.n_heads` (", m.n_heads, "), `model.n_kv_heads` (", m.n_kv_heads,
               ") and `model.ffn_dim` (", m.ffn_dim, ")");
  }
}

double parse_duration_seconds(const std::string& text, const std::string& key) {
  if (text.empty()) return 0;
  double total = 0;
  size_t pos = 0;
  const std::string units = "hms";
  size_t next_unit = 0;  // units come in the order h, m, s, each at most once
  while (pos < text.size()) {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(text.substr(pos), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    const bool digits = used > 0 && (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.');
    const size_t unit = digits && pos + used < text.size() ? units.find(text[pos + used], next_unit) : std::string::npos;
    ST_CHECK(unit != std::string::npos && std::isfinite(v), "`", key, "` = \"", text, "\": expected a duration such as "
             "3h50m, 90m, 1.5h, 600s or 2h5m30s (numbers with units h, m, s in that order)");
    total += v * (unit == 0 ? 3600.0 : unit == 1 ? 60.0 : 1.0);
    next_unit = unit + 1;
    pos += used + 1;
  }
  ST_CHECK(total > 0, "`", key, "` = \"", text, "\" is no time at all; leave it empty for no limit");
  return total;
}

namespace {

// Every key as TOML, in declaration order under [section] headers; `sources` (print-config)
// adds each value's source to its comment. A key computed at launch from another one is a
// comment, so that the text read back as a config does not give both keys.
std::string config_text(const JobConfig& c, const std::map<std::string, ValueSource>* sources) {
  std::ostringstream s;
  std::string section;
  for (const KeyDef& k : keys()) {
    const std::string sec = k.name.substr(0, k.name.find('.'));
    if (sec != section) {
      s << (section.empty() ? "" : "\n") << "[" << sec << "]\n";
      section = sec;
    }
    const std::string name = k.name.substr(sec.size() + 1);
    const char* from_key = k.name == "training.steps" && c.training.epochs > 0                  ? "training.epochs"
                           : k.name == "schedule.warmup_steps" && c.schedule.warmup_fraction > 0 ? "schedule.warmup_fraction"
                                                                                                 : nullptr;
    if (from_key != nullptr) {
      s << "# " << name << ": computed at launch from " << from_key << ": " << k.doc << "\n";
      continue;
    }
    s << name << " = " << value_str(k.get(c)) << "  # ";
    if (sources != nullptr) {
      const ValueSource src = sources->at(k.name);
      s << (src == ValueSource::kDefault    ? std::string("default")
            : src == ValueSource::kFile     ? std::string("file")
            : src == ValueSource::kOverride ? std::string("override")
                                            : "fine-tuning default (model.hf set; " + k.name + " not given)")
        << ": ";
    }
    s << k.doc << "\n";
  }
  return s.str();
}

}  // namespace

std::string describe(const LoadedConfig& loaded) { return config_text(loaded.config, &loaded.sources); }

std::string reference_table() {
  const JobConfig defaults;
  std::ostringstream s;
  s << "| key | type | default | meaning |\n| --- | --- | --- | --- |\n";
  for (const KeyDef& k : keys())
    s << "| `" << k.name << "` | " << std::string(type_name(k.type)).substr(std::string(type_name(k.type)).find(' ') + 1) << " | `" << value_str(k.get(defaults)) << "` | " << k.doc
      << " |\n";
  return s.str();
}

std::string config_toml(const JobConfig& config) { return config_text(config, nullptr); }

std::vector<KeyChange> changed_keys(const JobConfig& a, const JobConfig& b) {
  std::vector<KeyChange> out;
  for (const KeyDef& k : keys()) {
    const std::string before = value_str(k.get(a)), after = value_str(k.get(b));
    if (before != after) out.push_back({k.name, before, after});
  }
  return out;
}

LoadedConfig layer_config(const LoadedConfig& base, const LoadedConfig& top) {
  LoadedConfig out = base;
  for (const KeyDef& k : keys()) {
    const ValueSource from = top.sources.at(k.name);
    // a fine-tuning default is a default: the base (the checkpoint's config) knows what it became
    if (from == ValueSource::kDefault || from == ValueSource::kFineTuning) {
      out.sources[k.name] = ValueSource::kFile;
    } else {
      k.set(out.config, k.get(top.config));
      out.sources[k.name] = from;
    }
  }
  validate(out.config);
  return out;
}

std::string reference_markdown() {
  const JobConfig defaults;
  const auto cell = [](const std::string& text) {  // a '|' would end the cell, a '*' start emphasis
    std::string out;
    bool code = false;
    for (const char c : text) {
      code ^= c == '`';
      if (c == '|' || (c == '*' && !code)) out += '\\';
      out += c;
    }
    return out;
  };
  std::ostringstream s;
  s << "# Configuration reference\n\n"
       "<!-- Generated from the key table in src/train/config.cpp by\n"
       "     `shardtrain help config --markdown > docs/configuration.md`; edit the table, not this page. -->\n\n"
       "A job is a TOML file of the sections below; `--section.key=value` arguments override it. The whole\n"
       "config is checked before anything is built: an unknown key is rejected with the nearest valid one,\n"
       "and a wrong type or an impossible value with a message naming the key. "
       "`shardtrain print-config [JOB.toml] [--key=value ...]`\n"
       "prints the effective values and where each came from; `shardtrain help config` prints these tables.\n";
  std::string section;
  for (const KeyDef& k : keys()) {
    const std::string sec = k.name.substr(0, k.name.find('.'));
    if (sec != section) {
      s << "\n## `[" << sec << "]`\n\n| key | type | default | meaning |\n| --- | --- | --- | --- |\n";
      section = sec;
    }
    const std::string type = type_name(k.type);
    s << "| `" << k.name << "` | " << type.substr(type.find(' ') + 1) << " | `" << cell(value_str(k.get(defaults)))
      << "` | " << cell(k.doc) << " |\n";
  }
  return s.str();
}

}  // namespace shardtrain::train
