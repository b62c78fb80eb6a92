// Export round trip: a Hugging Face folder loaded into the sharded store and exported in
// f32 gives back the same tensors bit for bit and an equivalent config.json.
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include <gtest/gtest.h>

#include "io/hf_folder.h"
#include "model/hf_config.h"
#include "testing/shared_data.h"
#include "train/export.h"

namespace shardtrain::train {
namespace {

class ExportRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(ExportRoundTrip, TensorsAndConfigSurvive) {
  const std::string src = testing::source_dir() + "/tests/model/hf_reference/" + GetParam();
  const std::string out =
      (std::filesystem::temp_directory_path() / ("shardtrain_export_" + std::to_string(::getpid()) + GetParam())).string();
  std::filesystem::remove_all(out);
  const model::LlamaConfig c = model::load_hf_config(src + "/config.json");
  const io::HfWeights in(src);
  auto comm = dist::make_single_rank();
  const model::ModelLayout layout = model::ModelLayout::llama(c, 1);
  fsdp::ShardedUnitStore store(layout, comm.get(), {});
  store.load([&](const model::ParamSpec& p, int64_t first, Tensor& dst) { in.read_range(p.name, first, dst); });
  ExportOptions o;
  o.folder = out;
  o.dtype = DType::kF32;
  o.max_shard_bytes = 20000;  // several shards for these ~50 KB models
  export_hf(store, c, *comm, o);

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

}  // namespace
}  // namespace shardtrain::train
