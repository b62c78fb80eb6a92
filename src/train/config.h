// The job configuration: every key is declared once in config.cpp (name, type, default,
// one-line doc, validator). Values come from the defaults, then a TOML file, then
// `--section.key=value` overrides; the whole config is validated before anything is built.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardtrain::train {

struct ModelSection {
  std::string hf = "";     // HF folder to fine-tune; its config.json replaces the shape keys
  std::string preset = "";  // a published model's shape (model/presets.h); replaces the shape keys
  int64_t vocab_size = 0;  // 0: taken from the tokenizer
  int64_t dim = 256;
  int64_t n_layers = 4;
  int64_t n_heads = 8;
  int64_t n_kv_heads = 4;
  int64_t head_dim = 0;  // 0: dim / n_heads
  int64_t ffn_dim = 768;
  int64_t max_seq_len = 256;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  std::string rope_scaling = "none";
  double rope_scaling_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_positions = 8192;
  bool tie_embeddings = true;
  bool attention_bias = false;
  bool qk_norm = false;  // Qwen3's RMSNorm over each head's q and k
  int64_t sliding_window = 0;        // 0: every layer attends to all earlier positions
  int64_t full_attention_every = 0;  // with a window: 0 slides every layer; N: layers N-1, 2N-1, ... attend fully
  int64_t no_rope_every = 0;         // SmolLM3's NoPE layers: 0, none; N: layers N-1, 2N-1, ... have no rope
  double embedding_multiplier = 1.0;  // Granite's scalings (1, 1, 0, 1: plain Llama)
  double residual_multiplier = 1.0;
  double attention_multiplier = 0.0;  // 0: 1 / sqrt(head dim)
  double logits_scaling = 1.0;
  bool post_norms = false;     // OLMo 2's norms after each sublayer
  bool qk_norm_whole = false;  // OLMo 2's RMSNorm over all of q and all of k
  double norm_weight_offset = 0.0;     // Gemma's (1 + w) norms: 1; 0, plain weights
  bool sandwich_norms = false;         // Gemma's norms before and after each sublayer
  std::string mlp_activation = "silu";  // the MLP gate's activation: silu, or gelu_tanh (Gemma's GeGLU)
  bool scale_embeddings = false;       // Gemma's embeddings x sqrt(dim)
  double rope_local_theta = 0.0;       // Gemma 3's sliding layers' rope base; 0: model.rope_theta
  double attn_logit_softcapping = 0.0;   // Gemma 2's soft-capping of the attention scores; 0: none
  double final_logit_softcapping = 0.0;  // and of the logits; 0: none
  double rotary_fraction = 1.0;          // Phi-4-mini's partial rotary: the share of each head rope rotates
  int64_t extend_context = 0;            // model.hf / model.preset trained past its context; 0: its own
  double rope_theta_scale = 1.0;         // model.hf / model.preset's rope_theta multiplied by this
  double init_std = 0.02;
  std::string dtype = "auto";
};

struct DataSection {
  std::string source = "builtin:fortunes";
  std::string format = "auto";
  std::string text_field = "text";
  std::string prompt_field = "prompt";
  std::string response_field = "response";
  std::string messages_field = "messages";
  bool train_on_prompt = false;
  bool packing = true;
  std::string document_mask = "auto";
  std::string tokenizer = "auto";
  double val_fraction = 0.05;
  std::string eval_source;           // empty: the held-out split of `source`
  std::string mix;                   // "path=weight, ...": documents mixed from several sources
  std::string token_cache = "auto";  // auto | on | off
  std::string cache_dir;             // empty: data::default_token_cache_dir()
};

struct TrainingSection {
  int64_t steps = 800;
  double epochs = 0;  // > 0: passes over the training data, from which the steps are computed at launch
  int64_t batch_size = 8;
  int64_t seq_len = 128;  // 0: auto, chosen at launch from the model's context and the data
  int64_t grad_accum_steps = 1;
  uint64_t seed = 1234;
  double max_grad_norm = 1.0;
  int64_t nonfinite_skips = 3;  // steps in a row with a NaN/inf gradient norm or loss skipped before an error
  std::string activation_checkpointing = "none";
  std::string device = "auto";
  int64_t threads = 0;
  int64_t loss_chunk_tokens = 0;  // 0: auto
  int64_t mlp_chunk_tokens = 0;   // 0: auto
  std::string gemm_selection = "heuristic";  // timed | heuristic (ops::GemmSelection)
  std::string fp8 = "off";                   // off | tensorwise | rowwise | blockwise (ops::Fp8Recipe)
  std::string fp8_gradients = "auto";        // auto | e4m3 | e5m2: the format of dy in FP8 products
  bool fp8_head = false;                     // with fp8: the head's products in FP8 too
  bool fp8_attention = false;                // attention's products in FP8, forward and backward (GPU)
  bool cuda_graph = true;  // one GPU: replay each micro-batch as a CUDA graph
  std::string time_limit;  // "3h50m", "90m", ...: stop and save before it (empty: none)
  bool deterministic = false;  // GPU: bitwise-repeatable steps (model::StepOptions::deterministic)
  bool offload_activations = false;  // GPU: kept activations in host memory (model::StepOptions)
  int64_t offload_activations_blocks = 0;  // with offload_activations: only the first n blocks (0: auto)
};

struct OptimizerSection {
  double lr = 2e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  bool decay_1d = false;
};

struct ScheduleSection {
  std::string type = "cosine";
  int64_t warmup_steps = 30;
  double warmup_fraction = 0;  // > 0: the warm-up as this share of training.steps, in place of warmup_steps
  double min_lr_ratio = 0.1;
  double decay_fraction = 1.0;
};

struct EvalSection {
  bool enabled = true;  // false: no evaluation at all (and no held-out split needed)
  int64_t interval_steps = 100;
  int64_t batches = 8;
  bool at_start = false;  // also before the first step
};

struct LoggingSection {
  int64_t interval_steps = 10;
  std::string metrics_file = "metrics.jsonl";
  std::string tensorboard_dir;  // empty: none
  std::string level = "info";
  std::string progress = "auto";
  bool gpu_power = true;
};

struct ParallelSection {
  int64_t tensor_parallel = 1;
  int64_t replicate = 1;  // HSDP: data-parallel replicas, each sharding a whole copy of the model
  int64_t context_parallel = 1;  // ranks that split each sequence (ring attention); 1: off
  bool reshard_after_forward = true;
  bool keep_last_block_gathered = true;
  std::string compute_shards = "auto";
  bool offload = false;
  bool offload_gradients = true;  // with offload: false keeps the gradient shards on the GPU
  std::string reduce_dtype = "f32";
  int64_t reductions_in_flight = 1;  // GPUs: units' full gradients still reducing beside the backward
  std::string hf_load = "ranges";
  double init_timeout_s = 300;
  double timeout_s = 600;  // a step or evaluation batch of several ranks; 0: none
};

struct ExportSection {
  std::string folder = "";
  std::string dtype = "bf16";
  int64_t max_shard_mb = 5000;
};

struct RunSection {
  std::string output_dir = "runs/default";
  bool overwrite = false;  // start over in a folder that holds another run (its checkpoints and metrics removed)
};

struct CheckpointSection {
  int64_t interval_steps = 0;  // 0: no checkpoints
  int64_t keep = 2;
  std::string dir = "";        // "" = run.output_dir/checkpoints
  std::string resume = "";     // "", "auto" or a step directory
  bool async = false;          // write the files on a thread while training goes on
  bool on_signal = true;       // SIGTERM / SIGUSR1 / SIGINT: finish the step, save, exit (train/stop_signals.h)
};

struct SampleSection {
  std::string prompt = "";
  int64_t tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 40;
  double top_p = 1.0;
  uint64_t seed = 7;
};

struct JobConfig {
  ModelSection model;
  DataSection data;
  TrainingSection training;
  OptimizerSection optimizer;
  ScheduleSection schedule;
  EvalSection eval;
  LoggingSection logging;
  RunSection run;
  ExportSection export_;
  CheckpointSection checkpoint;
  ParallelSection parallel;
  SampleSection sample;
  // Not keys: the keys that took fine-tuning defaults (apply_fine_tuning_defaults), for the
  // launch's log line.
  std::vector<std::string> fine_tuning_defaults;
};

// kFineTuning: a default for fine-tuning, taken because model.hf is set and the key was not
// given (apply_fine_tuning_defaults).
enum class ValueSource { kDefault, kFile, kOverride, kFineTuning };

struct LoadedConfig {
  JobConfig config;
  std::map<std::string, ValueSource> sources;  // key -> where its value came from
  std::string file;                            // the TOML file, or "" for none
};

// The fine-tuning defaults, for a job with model.hf whose keys were not given (in a file or
// an override): optimizer.lr 2e-5; schedule.warmup_fraction 0.03 (unless schedule.warmup_steps
// is given); training.seq_len 0 (auto: train/launch_defaults.h); training.epochs 1 (unless
// training.steps is given); eval.enabled off where the held-out split is empty (the launch
// decides and logs it; the key's value stays true).
constexpr double kFineTuningLr = 2e-5;
constexpr double kFineTuningWarmupFraction = 0.03;
constexpr double kFineTuningEpochs = 1;
// Applies them to `loaded` (marking each kFineTuning and listing it in
// config.fine_tuning_defaults); nothing without model.hf. load_config calls it.
void apply_fine_tuning_defaults(LoadedConfig& loaded);

// Loads defaults, then `toml_path` (may be empty), then overrides of the form
// "--section.key=value" or "section.key=value", then the fine-tuning defaults. Throws Error
// naming the key on an unknown key (with the nearest valid one), a wrong type or an impossible
// value, and naming both keys where two given keys conflict (training.steps and
// training.epochs; schedule.warmup_steps and schedule.warmup_fraction).
LoadedConfig load_config(const std::string& toml_path, const std::vector<std::string>& overrides);

// Cross-key checks (e.g. model.n_heads divides model.dim); throws naming both keys.
void validate(const JobConfig& config);

// training.time_limit in seconds: a duration such as "3h50m", "90m", "1.5h", "600s" or "2h5m30s"
// (numbers with units h, m, s, in that order); 0 for an empty one. Errors name `key`.
double parse_duration_seconds(const std::string& text, const std::string& key = "training.time_limit");

// "key = value  # source: doc" lines for every key, in declaration order; a key whose value
// is computed at launch from another (training.steps from training.epochs,
// schedule.warmup_steps from schedule.warmup_fraction) is a comment line saying so.
std::string describe(const LoadedConfig& loaded);
// A Markdown table of every key with type, default and doc (`shardtrain help config`).
std::string reference_table();
// The same table as a Markdown page, a section per config section: docs/configuration.md.
std::string reference_markdown();

// Every key's value as TOML ("[section]" headers, "key = value  # doc" lines): what a run
// folder and each checkpoint keep, and what load_config reads back as the same config.
std::string config_toml(const JobConfig& config);

// The keys whose values differ between `a` and `b`, in declaration order, with both values as
// TOML text.
struct KeyChange {
  std::string key, before, after;
};
std::vector<KeyChange> changed_keys(const JobConfig& a, const JobConfig& b);

// `base` with each key `top` took from a file or the command line set to top's value (and
// top's source); the other keys keep base's values, their source kFile (base's file). Validated.
LoadedConfig layer_config(const LoadedConfig& base, const LoadedConfig& top);

}  // namespace shardtrain::train
