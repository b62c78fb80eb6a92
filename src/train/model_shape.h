// The model's shape a job asks for: its `model` section (or model.preset's shape) and the
// tokenizer's vocabulary. Shared by the trainer, the plan and `shardtrain batches`, before any
// model exists.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "train/config.h"

namespace shardtrain::train {

// Builds the model shape from the `model` section and the tokenizer's vocabulary, or takes
// model.preset's (whose vocabulary must hold the tokenizer's).
model::LlamaConfig llama_config(const ModelSection& section, int64_t tokenizer_vocab);

}  // namespace shardtrain::train
