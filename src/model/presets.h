// Built-in shapes of published models (`model.preset`: Llama, Qwen3, Gemma 3): each is the shape-bearing part
// of the model's Hugging Face config.json, read by parse_hf_config, so a preset gives exactly
// the LlamaConfig that model.hf pointing at a download of that model would.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"

namespace shardtrain::model {

struct ModelPreset {
  std::string name;             // the model.preset value, e.g. "llama3.1-8b"
  std::string hf_repo;          // the Hugging Face repository the shape was published in
  std::vector<std::string> folder_names;  // its download folders' usual names (base and chat/instruct)
  std::string config_json;      // config.json's shape keys, as published
};

// Every preset, smallest family member first.
const std::vector<ModelPreset>& model_presets();
// "llama3.2-1b, llama3.2-3b, ...": for messages.
std::string preset_names();
// The preset called `name`, or nullptr.
const ModelPreset* find_preset(const std::string& name);
// The shape of preset `name`; an unknown name throws naming `key` and listing the valid names.
LlamaConfig preset_config(const std::string& name, const std::string& key = "model.preset");
// The preset whose download folder is usually called `folder_name` (the last part of a path,
// compared without regard to case: "Llama-3.1-8B", "Meta-Llama-3.1-8B-Instruct",
// "Llama-2-7b-hf", or the preset's own name), or nullptr.
const ModelPreset* preset_for_folder_name(const std::string& folder_name);

}  // namespace shardtrain::model
