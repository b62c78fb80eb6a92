// Opening a trained model to sample from, in one process on the CPU: a Hugging Face folder
// (config.json, model.safetensors or an index with shards) or a training checkpoint (a step_*
// directory, or the folder holding `latest`), and its tokenizer.
#pragma once

#include <memory>
#include <string>

#include "data/tokenizer.h"
#include "model/llama.h"
#include "model/unit_store.h"

namespace shardtrain::train {

enum class ModelSource { kHuggingFace, kCheckpoint };

struct OpenedModel {
  ModelSource source = ModelSource::kHuggingFace;
  std::string path;               // the HF folder, or the checkpoint's step directory
  int64_t step = 0;               // checkpoints: optimizer steps taken
  std::string tokenizer_source;   // folder of the model's tokenizer.json; "" for the byte tokenizer
  std::unique_ptr<model::ModelLayout> layout;
  std::unique_ptr<model::ResidentUnitStore> store;  // parameters only, no gradients
  std::unique_ptr<model::Llama> model;
  std::string describe() const;   // "Hugging Face folder X" / "checkpoint X (step N)"
};

// Reads `path`'s weights into a resident model of `dtype` (f32 or f64) on the CPU. Errors name
// the path and what was expected there.
OpenedModel open_model(const std::string& path, DType dtype = DType::kF32);

// The tokenizer for `opened`: `spec` = "" takes the model's own (an HF folder's tokenizer.json;
// the one a checkpoint recorded, or the byte-level tokenizer when it recorded none); else a
// tokenizer.json, its folder, or `byte`. Its vocabulary must fit in the model's.
std::unique_ptr<data::Tokenizer> open_tokenizer(const std::string& spec, const OpenedModel& opened);

}  // namespace shardtrain::train
