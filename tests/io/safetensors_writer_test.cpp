// Writing safetensors: round trips through our reader, aligned data, sharded folders with
// an index, and files that PyPI's safetensors (with numpy) loads with the same values.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "io/hf_folder.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "testing/compare.h"

namespace shardtrain::io {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("shardtrain_stw_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::vector<std::pair<std::string, Tensor>> sample_tensors() {
  std::vector<std::pair<std::string, Tensor>> ts;
  uint64_t seed = 1;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
    Tensor t = Tensor::empty({3, 37}, dt);
    testing::fill_random(t, seed++, 0.1, 2.0);
    ts.emplace_back(std::string("w.") + std::string(dtype_name(dt)), t);
  }
  Tensor i = Tensor::empty({5}, DType::kI64);
  testing::fill_random_ints(i, 9, -1000, 1000);
  ts.emplace_back("ids", i);
  ts.emplace_back("scalar", Tensor::zeros({}, DType::kF32));
  ts.emplace_back("empty", Tensor::zeros({0, 4}, DType::kF32));
  return ts;
}

TEST(SafetensorsWriter, RoundTripsEveryDtypeAndAligns) {
  const std::string path = temp_path("round.safetensors");
  const auto ts = sample_tensors();
  write_safetensors(path, ts, {{"note", "shardtrain test"}});
  const SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "shardtrain test");
  std::ifstream in(path, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u) << "data must start 8-byte aligned";
  for (const auto& [name, t] : ts) {
    const Tensor back = f.read_as(name, t.dtype());
    ASSERT_EQ(back.shape(), t.shape()) << name;
    if (t.nbytes() > 0) {  // an empty tensor has no bytes to compare
      EXPECT_EQ(std::memcmp(back.raw_data(), t.raw_data(), t.nbytes()), 0) << name;
    }
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));
}

TEST(SafetensorsWriter, ShardedFolderWithIndex) {
  const std::string dir = temp_path("sharded");
  std::filesystem::remove_all(dir);
  ShardedWriter w(dir, 1000);  // 444+222+222 bytes, then 888+40+4+0: two shards
  const auto ts = sample_tensors();
  for (const auto& [name, t] : ts) w.add(name, t);
  w.finish();
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/model-00002-of-00002.safetensors"));
  const HfWeights hf(dir);
  EXPECT_EQ(hf.files().size(), 2u);
  for (const auto& [name, t] : ts) {
    Tensor back = Tensor::empty(t.shape(), t.dtype());
    hf.read_range(name, 0, back);
    if (t.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(back.raw_data(), t.raw_data(), t.nbytes()), 0) << name;
    }
  }
  const std::string single = temp_path("single");
  std::filesystem::remove_all(single);
  ShardedWriter one(single, int64_t{1} << 30);
  for (const auto& [name, t] : ts) one.add(name, t);
  one.finish();
  EXPECT_TRUE(std::filesystem::exists(single + "/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(single + "/model.safetensors.index.json"));
}

// An export that fails on the way (the writer gone before finish) leaves no shard behind.
TEST(SafetensorsWriter, AnUnfinishedFolderRemovesItsShards) {
  const std::string dir = temp_path("unfinished");
  std::filesystem::remove_all(dir);
  {
    ShardedWriter w(dir, 1000);
    for (const auto& [name, t] : sample_tensors()) w.add(name, t);  // the first shard is written
    EXPECT_TRUE(std::filesystem::exists(dir + "/shard-0.partial.safetensors"));
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

TEST(SafetensorsWriter, PypiSafetensorsLoadsOurFiles) {
  if (std::system("python3 -c 'import safetensors.numpy, numpy' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 cannot import safetensors and numpy (pip install safetensors numpy)";
  const std::string path = temp_path("pypi.safetensors");
  Tensor f = Tensor::empty({2, 3}, DType::kF32), h = Tensor::empty({4}, DType::kF16), i = Tensor::empty({3}, DType::kI32);
  for (int k = 0; k < 6; ++k) f.data<float>()[k] = 0.5f * static_cast<float>(k) - 1.0f;
  for (int k = 0; k < 4; ++k) h.data<Float16>()[k] = float_to_f16(static_cast<float>(k) * 0.25f);
  for (int k = 0; k < 3; ++k) i.data<int32_t>()[k] = -7 + k;
  write_safetensors(path, {{"f", f}, {"h", h}, {"i", i}});
  const std::string script =
      "import sys, numpy as np\n"
      "from safetensors.numpy import load_file\n"
      "t = load_file(sys.argv[1])\n"
      "assert t['f'].shape == (2, 3) and t['f'].dtype == np.float32, t['f']\n"
      "assert np.array_equal(t['f'].ravel(), 0.5 * np.arange(6, dtype=np.float32) - 1)\n"
      "assert t['h'].dtype == np.float16 and np.array_equal(t['h'], 0.25 * np.arange(4))\n"
      "assert t['i'].dtype == np.int32 and list(t['i']) == [-7, -6, -5]\n";
  const std::string script_path = temp_path("check.py");
  std::ofstream(script_path) << script;
  EXPECT_EQ(std::system(("python3 " + script_path + " " + path).c_str()), 0);
}

}  // namespace
}  // namespace shardtrain::io
