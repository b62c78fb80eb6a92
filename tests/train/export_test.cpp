// Export round trip: a Hugging Face folder loaded into the sharded store and exported in
// f32 gives back the same tensors bit for bit and an equivalent config.json. An export
// replaces an older one whole and never deletes files it did not write.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "io/hf_folder.h"
#include "model/hf_config.h"
#include "testing/shared_data.h"
#include "core/error.h"
#include "train/export.h"

namespace shardtrain::train {
namespace {

// Exports the HF reference `name` (tests/model/hf_reference) to `out` in f32 with shards of at
// most `max_shard_bytes`; returns its config.
model::LlamaConfig export_reference(const std::string& out, int64_t max_shard_bytes,
                                    const std::string& name = "gqa_untied") {
  const std::string src = testing::source_dir() + "/tests/model/hf_reference/" + name;
  const model::LlamaConfig c = model::load_hf_config(src + "/config.json");
  const io::HfWeights in(src);
  auto comm = dist::make_single_rank();
  const model::ModelLayout layout = model::ModelLayout::llama(c, 1);
  fsdp::ShardedUnitStore store(layout, comm.get(), {});
  store.load([&](const model::ParamSpec& p, int64_t first, Tensor& dst) { in.read_range(p.name, first, dst); });
  ExportOptions o;
  o.folder = out;
  o.dtype = DType::kF32;
  o.max_shard_bytes = max_shard_bytes;
  export_hf(store, c, *comm, o);
  return c;
}

class ExportRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(ExportRoundTrip, TensorsAndConfigSurvive) {
  const std::string src = testing::source_dir() + "/tests/model/hf_reference/" + GetParam();
  const std::string out =
      (std::filesystem::temp_directory_path() / ("shardtrain_export_" + std::to_string(::getpid()) + GetParam())).string();
  std::filesystem::remove_all(out);
  const model::LlamaConfig c = export_reference(out, 20000, GetParam());  // several shards for these ~50 KB models
  const io::HfWeights in(src);

  EXPECT_TRUE(std::filesystem::exists(out + "/model.safetensors.index.json"));
  const io::HfWeights back(out);
  EXPECT_EQ(back.names(), in.names()) << "same tensor names (a tied head is not written)";
  for (const std::string& name : in.names()) {
    const Tensor a = in.files().front()->read_as(name, DType::kF32);
    Tensor b = Tensor::empty(a.shape(), DType::kF32);
    back.read_range(name, 0, b);
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << name;
  }
  const model::LlamaConfig c2 = model::load_hf_config(out + "/config.json");
  EXPECT_EQ(c2.summary(), c.summary());
  EXPECT_EQ(c2.rope.theta, c.rope.theta);
  EXPECT_EQ(c2.rope.scaling.type, c.rope.scaling.type);
  EXPECT_EQ(c2.rope.scaling.original_max_positions, c.rope.scaling.original_max_positions);
  EXPECT_EQ(c2.norm_eps, c.norm_eps);
}

INSTANTIATE_TEST_SUITE_P(References, ExportRoundTrip,
                         ::testing::Values("gqa_untied", "mha_tied", "gqa4_llama3_rope", "qwen2_bias"));

namespace fs = std::filesystem;

std::string fresh_parent(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("shardtrain_export_swap_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::vector<std::string> names_in(const std::string& folder) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(folder)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(ExportSwap, AnExportReplacesAnOlderOneWhole_3ShardsThen1) {
  const std::string parent = fresh_parent("replace");
  const std::string out = parent + "/hf";
  export_reference(out, 20000);
  ASSERT_TRUE(fs::exists(out + "/model-00003-of-00003.safetensors")) << "the first export has three shards";
  export_reference(out, int64_t{1} << 30);
  EXPECT_EQ(names_in(out), (std::vector<std::string>{"config.json", "model.safetensors"}))
      << "no shard or index of the older export remains";
  EXPECT_EQ(names_in(parent), std::vector<std::string>{"hf"}) << "no staging or old folder remains beside it";
  const io::HfWeights back(out);
  EXPECT_FALSE(back.names().empty());
  fs::remove_all(parent);
}

TEST(ExportSwap, LeftoversOfAnInterruptedExportAreRemovedByTheNext) {
  const std::string parent = fresh_parent("interrupted");
  const std::string out = parent + "/hf";
  export_reference(out, int64_t{1} << 30);
  // killed while writing its staging folder, and another killed between its two renames
  fs::create_directories(out + ".tmp.4242");
  std::ofstream(out + ".tmp.4242/shard-0.partial.safetensors") << "partial";
  fs::create_directories(out + ".old.4243");
  std::ofstream(out + ".old.4243/model-00001-of-00002.safetensors") << "older";
  std::ofstream(parent + "/hf.tmp.notes") << "the user's";  // not digits: not an export's leftover
  export_reference(out, 20000);
  EXPECT_EQ(names_in(parent), (std::vector<std::string>{"hf", "hf.tmp.notes"}));
  EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(out + "/model.safetensors")) << "the single shard of the previous export is gone";
  fs::remove_all(parent);
}

TEST(ExportSwap, AForeignFileInTheFolderFailsNamingItAndIsKept) {
  const std::string parent = fresh_parent("foreign");
  const std::string out = parent + "/hf";
  export_reference(out, int64_t{1} << 30);
  std::ofstream(out + "/notes.txt") << "the user's";
  std::string error;
  try {
    export_reference(out, 20000);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("`export.folder` = \"" + out + "\" holds `notes.txt`, which an export does not write"),
            std::string::npos) << error;
  EXPECT_EQ(names_in(out), (std::vector<std::string>{"config.json", "model.safetensors", "notes.txt"}))
      << "the folder is left as it was";
  EXPECT_EQ(names_in(parent), std::vector<std::string>{"hf"}) << "the staging folder is removed";
  fs::remove_all(parent);
}

TEST(ExportSwap, ASymlinkOrAFileAsTheFolderFails) {
  const std::string parent = fresh_parent("symlink");
  fs::create_directories(parent + "/real");
  fs::create_directory_symlink(parent + "/real", parent + "/link");
  std::ofstream(parent + "/file") << "the user's";
  for (const auto& [target, expected] : {std::pair<std::string, std::string>{parent + "/link", "is a symbolic link"},
                                         {parent + "/file", "exists and is not a folder"}}) {
    std::string error;
    try {
      export_reference(target, 20000);
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("`export.folder` = \"" + target + "\" " + expected), std::string::npos) << error;
  }
  EXPECT_TRUE(fs::is_empty(parent + "/real"));
  EXPECT_EQ(names_in(parent), (std::vector<std::string>{"file", "link", "real"}));
  fs::remove_all(parent);
}

}  // namespace
}  // namespace shardtrain::train
