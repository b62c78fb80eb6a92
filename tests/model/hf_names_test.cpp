// The Hugging Face name table against the files transformers writes: every reference folder
// (tests/model/hf_reference, made by tools/make_hf_reference.py) holds exactly the tensors the
// table names for its config (the layout's parameters, Phi-3's fused tensors in place of their
// parts), and every name in the table is met in at least one of them.
#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/hf_folder.h"
#include "model/hf_config.h"
#include "model/hf_names.h"
#include "model/layout.h"
#include "testing/shared_data.h"

namespace shardtrain::model {
namespace {

namespace fs = std::filesystem;

// The reference folders with weights, sorted.
std::vector<fs::path> reference_folders() {
  std::vector<fs::path> out;
  for (const fs::directory_entry& e : fs::directory_iterator(testing::source_dir() + "/tests/model/hf_reference"))
    if (fs::exists(e.path() / "config.json") && fs::exists(e.path() / "model.safetensors")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The names of the tensors a Hugging Face folder of model `c` holds, by the table: every
// parameter of the layout, with Phi-3's fused tensors in place of their parts.
std::vector<std::string> names_by_table(const LlamaConfig& c) {
  std::set<std::string> names;
  const ModelLayout layout = ModelLayout::llama(c, 1);
  for (const UnitLayout& u : layout.units())
    for (const ParamSpec& p : u.params) names.insert(p.name);
  for (const FusedTensor& f : hf_fused_tensors(c)) {
    for (const std::string& part : f.parts) EXPECT_EQ(names.erase(part), 1u) << part << " is a part of " << f.name;
    names.insert(f.name);
  }
  return {names.begin(), names.end()};
}

// A block tensor's name inside its layer ("mlp.up_proj.weight" of
// "model.layers.3.mlp.up_proj.weight"); empty for a tensor outside the blocks.
std::string suffix_of(const std::string& name) {
  const std::string prefix = "model.layers.";
  if (!name.starts_with(prefix)) return "";
  const size_t dot = name.find('.', prefix.size());
  return dot == std::string::npos ? "" : name.substr(dot + 1);
}

TEST(HfNames, EveryReferenceFolderHoldsExactlyTheTensorsTheTableNames) {
  const std::vector<fs::path> folders = reference_folders();
  ASSERT_GE(folders.size(), 10u) << "the reference folders of tests/model/hf_reference";
  std::set<std::string> seen_names, seen_suffixes;
  for (const fs::path& folder : folders) {
    SCOPED_TRACE(folder.filename().string());
    const LlamaConfig c = load_hf_config((folder / "config.json").string());
    std::vector<std::string> in_files = io::HfWeights(folder.string()).names();
    std::sort(in_files.begin(), in_files.end());
    EXPECT_EQ(names_by_table(c), in_files);
    for (const std::string& name : in_files) {
      seen_names.insert(name);
      seen_suffixes.insert(suffix_of(name));
    }
  }
  // every name the table gives is checked against a file of transformers' above
  for (const BlockParamName& p : block_param_names())
    EXPECT_TRUE(seen_suffixes.contains(p.suffix)) << p.suffix << " is in no reference folder";
  for (const FusedBlockParam& f : phi3_fused_params())
    EXPECT_TRUE(seen_suffixes.contains(f.suffix)) << f.suffix << " is in no reference folder";
  for (const char* name : {kEmbeddingName, kFinalNormName, kHeadName})
    EXPECT_TRUE(seen_names.contains(name)) << name << " is in no reference folder";
}

TEST(HfNames, TheTableNamesEachParameterOnceAndInItsOwnLayer) {
  std::set<std::string> suffixes;
  for (const BlockParamName& p : block_param_names()) {
    EXPECT_TRUE(suffixes.insert(p.suffix).second) << p.suffix << " names two parameters";
    EXPECT_STREQ(block_param_suffix(p.param), p.suffix);
    EXPECT_EQ(block_param_name(7, p.param), std::string("model.layers.7.") + p.suffix);
  }
  for (const FusedBlockParam& f : phi3_fused_params()) {
    EXPECT_TRUE(suffixes.insert(f.suffix).second) << f.suffix << " is also a parameter's name";
    EXPECT_GE(f.parts.size(), 2u) << f.suffix;
  }
  EXPECT_EQ(block_param_name(0, BlockParam::kUp), "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(block_tensor_name(12, "self_attn.qkv_proj.weight"), "model.layers.12.self_attn.qkv_proj.weight");
}

}  // namespace
}  // namespace shardtrain::model
