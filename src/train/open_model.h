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
  // folder of the model's tokenizer.json (or the tokenizer.json a checkpoint recorded); "" for
  // the byte tokenizer
  std::string tokenizer_source;
  std::unique_ptr<model::ModelLayout> layout;
  std::unique_ptr<model::ResidentUnitStore> store;  // parameters only, no gradients
  std::unique_ptr<model::Llama> model;
  std::string describe() const;   // "Hugging Face folder X" / "checkpoint X (step N)"
};

// Reads `path`'s weights into a resident model of `dtype` on `device`: f32 or f64 on the CPU,
// bf16 or f32 on a GPU (read into host memory in f32, then cast unit by unit onto the GPU, so
// the host holds 4 bytes per parameter while it opens). Errors name the path and what was
// expected there.
OpenedModel open_model(const std::string& path, DType dtype = DType::kF32, Device device = Device::cpu());

// `generate --device`: auto (the first GPU when one is visible, else the CPU), cpu, or cuda;
// a GPU it returns is initialised for use. Errors name the flag.
Device generation_device(const std::string& wanted);

// The tokenizer for `opened`: `spec` = "" takes the model's own (an HF folder's tokenizer.json,
// where the byte-level one an export writes is the byte-level tokenizer; the one a checkpoint
// recorded, or the byte-level tokenizer when it recorded none); else a tokenizer.json, its
// folder, or `byte` (data::load_tokenizer). Its vocabulary must fit in the model's.
std::unique_ptr<data::Tokenizer> open_tokenizer(const std::string& spec, const OpenedModel& opened);

}  // namespace shardtrain::train
