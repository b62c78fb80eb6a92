// The model's shape a job asks for: its `model` section (or model.preset's shape) and the
// tokenizer's vocabulary. Shared by the trainer, the plan and `shardtrain batches`, before any
// model exists.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "train/config.h"

namespace shardtrain::train {

// Builds the model shape from the `model` section and the tokenizer's vocabulary, or takes
// model.preset's (whose vocabulary must hold the tokenizer's).
model::LlamaConfig llama_config(const ModelSection& section, int64_t tokenizer_vocab);

// model.sliding_window on the layers model.full_attention_every leaves sliding (with the shape
// keys or a preset; model.hf's config.json has its own), validated.
void set_sliding_window(const ModelSection& section, model::LlamaConfig& config);

// model.extend_context and model.rope_theta_scale applied to a model.hf or model.preset shape
// (`what` names it in errors): the context grows to model.extend_context positions and rope_theta
// is scaled. Refuses a context shorter than the model's own, and LongRoPE models, whose factors
// are tied to their context.
void extend_context(const ModelSection& section, model::LlamaConfig& config, const std::string& what);

}  // namespace shardtrain::train
