// Writing safetensors: round trips through our reader, aligned data, sharded folders with
// an index, and files that PyPI's safetensors (with numpy) loads with the same values.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include <gtest/gtest.h>

#include "io/checksum.h"
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

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Flips one bit of the byte at `offset` of the file.
void flip_bit(const std::string& path, int64_t offset) {
  std::fstream io(path, std::ios::binary | std::ios::in | std::ios::out);
  io.seekg(offset);
  char c = 0;
  io.get(c);
  io.seekp(offset);
  io.put(static_cast<char>(c ^ 0x10));
}

// The file offset of tensor `name`'s first data byte.
int64_t data_offset(const std::string& path, const std::string& name) {
  const SafetensorsFile f(path);
  std::ifstream in(path, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  return 8 + static_cast<int64_t>(header_len) + f.get(name).begin;
}

// Every file we write carries each tensor's CRC32C; one flipped bit in a tensor's data is an
// error naming the file and the tensor when any of it is read, and the other tensors read as ever.
TEST(SafetensorsWriter, ChecksumsFindAFlippedBit) {
  const std::string path = temp_path("sums.safetensors");
  const auto ts = sample_tensors();
  write_safetensors(path, ts);
  {
    const SafetensorsFile f(path);
    EXPECT_TRUE(f.has_checksums());
    for (const auto& [name, t] : ts) {
      EXPECT_TRUE(f.checksum_matches(name)) << name;
      EXPECT_EQ(f.stored_checksum(name), f.computed_checksum(name)) << name;
    }
  }
  flip_bit(path, data_offset(path, "w.bf16") + 17);
  const SafetensorsFile f(path);
  EXPECT_FALSE(f.checksum_matches("w.bf16"));
  Tensor one = Tensor::empty({1}, DType::kF32);
  const std::string e = error_of([&] { f.read_range("w.bf16", 100, one); });  // far from the flipped byte
  EXPECT_NE(e.find(path + ": tensor `w.bf16` does not match its checksum (crc32c "), std::string::npos) << e;
  EXPECT_NE(e.find("the file is damaged"), std::string::npos) << e;
  Tensor ok = Tensor::empty({3, 37}, DType::kF32);
  EXPECT_NO_THROW(f.read("w.f32", ok));
}

// A tensor larger than a checksum block (checksummed on every thread and joined) is checked
// the same way; so is the conversion of a range larger than one thread's chunk, which names
// the first non-finite element of the range whichever thread met it.
TEST(SafetensorsWriter, LargeTensorsAreCheckedWhole) {
  const std::string path = temp_path("large.safetensors");
  Tensor big = Tensor::empty({int64_t{3} << 21}, DType::kF32);  // 24 MiB
  for (int64_t i = 0; i < big.numel(); ++i) big.data<float>()[i] = static_cast<float>(i % 1000) * 0.001f;
  write_safetensors(path, {{"big", big}});
  {
    const SafetensorsFile f(path);
    Tensor back = Tensor::empty({big.numel()}, DType::kBF16);
    f.read("big", back);
    EXPECT_EQ(bf16_to_float(back.data<BFloat16>()[123457]), bf16_to_float(float_to_bf16(0.457f)));
  }
  big.data<float>()[(int64_t{5} << 20) + 3] = std::numeric_limits<float>::infinity();
  big.data<float>()[(int64_t{3} << 20) + 1] = std::numeric_limits<float>::quiet_NaN();
  write_safetensors(path, {{"big", big}});
  {
    const SafetensorsFile f(path);
    Tensor back = Tensor::empty({big.numel()}, DType::kF32);
    const std::string e = error_of([&] { f.read("big", back); });
    EXPECT_NE(e.find("tensor `big` element " + std::to_string((int64_t{3} << 20) + 1) + " is nan"), std::string::npos)
        << e;
  }
  flip_bit(path, data_offset(path, "big") + (int64_t{20} << 20));
  const SafetensorsFile f(path);
  EXPECT_FALSE(f.checksum_matches("big"));
}

// Files of other writers have no checksums and read as ever; a checksum list that does not
// name each tensor once, or holds something other than 8 hex digits, fails to open.
TEST(SafetensorsWriter, ForeignAndMalformedChecksumLists) {
  auto write_raw = [&](const std::string& name, const std::string& metadata) {
    const std::string header = "{\"__metadata__\":" + metadata +
                               ",\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    const std::string path = temp_path(name);
    std::ofstream out(path, std::ios::binary);
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header;
    const float values[2] = {1.5f, -2.0f};
    out.write(reinterpret_cast<const char*>(values), sizeof values);
    return path;
  };
  {
    const SafetensorsFile f(write_raw("foreign.safetensors", R"({"format":"pt"})"));
    EXPECT_FALSE(f.has_checksums());
    EXPECT_TRUE(f.checksum_matches("a"));
    EXPECT_FALSE(f.stored_checksum("a").has_value());
    Tensor a = Tensor::empty({2}, DType::kF32);
    f.read("a", a);
    EXPECT_EQ(a.data<float>()[1], -2.0f);
  }
  const float values[2] = {1.5f, -2.0f};
  const std::string good = format_crc32c(crc32c(0, values, sizeof values));
  {
    const SafetensorsFile f(write_raw("good.safetensors", R"({"crc32c":"{\"a\":\")" + good + R"(\"}"})"));
    EXPECT_TRUE(f.has_checksums());
    EXPECT_TRUE(f.checksum_matches("a"));
  }
  for (const auto& [metadata, expected] : std::vector<std::pair<std::string, std::string>>{
           {R"({"crc32c":"not json"})", "is not a JSON object"},
           {R"({"crc32c":"{}"})", "must name each of the file's 1 tensors once, found 0 entries"},
           {R"({"crc32c":"{\"b\":\")" + good + R"(\"}"})", "names `b`, which is not a tensor of the file"},
           {R"({"crc32c":"{\"a\":\"xyz\"}"})", "the checksum of `a` must be 8 hex digits, found \"xyz\""}}) {
    const std::string path = write_raw("bad.safetensors", metadata);
    const std::string e = error_of([&] { SafetensorsFile f(path); });
    EXPECT_NE(e.find(path + ": metadata `crc32c`"), std::string::npos) << e;
    EXPECT_NE(e.find(expected), std::string::npos) << e;
  }
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
