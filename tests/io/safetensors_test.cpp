// The safetensors reader: the shared sample files read with the right values; malformed
// headers each give an error naming the problem (never a crash); range reads.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <gtest/gtest.h>

#include "io/safetensors.h"
#include "testing/shared_data.h"

namespace shardtrain::io {
namespace {

TEST(Safetensors, SharedSamplesHaveTheDocumentedValues) {
  ST_REQUIRE_SHARED_DATA(dir);
  const std::map<std::string, std::string> files = {{"B", "u8"},  {"H", "u16"}, {"I", "u32"}, {"b", "i8"},  {"d", "f64"},
                                                    {"e", "f16"}, {"f", "f32"}, {"h", "i16"}, {"i", "i32"}};
  const SafetensorsFile overall(dir + "/safetensors_samples/overall.safetensors");
  EXPECT_EQ(overall.tensors().size(), 9u);
  for (const auto& [letter, kind] : files) {
    (void)kind;
    const std::string path = dir + "/safetensors_samples/" + letter + ".safetensors";
    const SafetensorsFile f(std::filesystem::exists(path) ? path : overall.path());
    EXPECT_EQ(f.metadata().at("test"), "a") << path;
    const TensorInfo& t = f.get(letter);
    ASSERT_EQ(t.numel, 6) << letter;
    const bool is_float = letter == "d" || letter == "e" || letter == "f";
    const Tensor v = f.read_as(letter, is_float ? DType::kF64 : DType::kI64);
    for (int64_t i = 0; i < 6; ++i) {
      const int64_t signed_value = i - 3;  // -3 .. 2
      if (is_float) {
        EXPECT_EQ(v.data<double>()[i], static_cast<double>(signed_value)) << letter << "[" << i << "]";
      } else {
        const bool is_unsigned = letter == "B" || letter == "H" || letter == "I";
        const int64_t bits = letter == "B" ? 8 : letter == "H" ? 16 : 32;
        const int64_t expect = is_unsigned && signed_value < 0 ? signed_value + (int64_t{1} << bits) : signed_value;
        EXPECT_EQ(v.data<int64_t>()[i], expect) << letter << "[" << i << "]";
      }
    }
    // overall.safetensors holds every one of them with the same values
    const Tensor o = overall.read_as(letter, is_float ? DType::kF64 : DType::kI64);
    EXPECT_EQ(std::memcmp(o.raw_data(), v.raw_data(), v.nbytes()), 0) << letter;
  }
}

std::string write_file(const std::string& name, const std::string& header, size_t data_bytes, bool lie_length = false,
                       uint64_t length_override = 0) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("shardtrain_st_" + std::to_string(::getpid()) + "_" + name)).string();
  std::ofstream out(path, std::ios::binary);
  uint64_t n = lie_length ? length_override : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << std::string(data_bytes, '\x01');
  return path;
}

std::string error_of(const std::string& path) {
  try {
    SafetensorsFile f(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, MalformedFilesAreNamedErrors) {
  const std::string good = R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";
  EXPECT_EQ(error_of(write_file("good", good, 24)), "");
  struct Bad {
    std::string label, header, expect;
    size_t data;
  };
  const std::vector<Bad> cases = {
      {"json", "{\"a\":", "not valid JSON", 0},
      {"array", "[1,2]", "must be a JSON object", 0},
      {"dtype", R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", "unknown dtype `Q7`", 1},
      {"size", R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", "is 24 bytes but data_offsets span 20", 24},
      {"past", R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", "beyond the data section of 16", 16},
      {"order", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[5,4]}})", "begin 5 after end 4", 8},
      {"negative", R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", "non-negative integers", 1},
      {"float", R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", "non-negative integers", 1},
      {"overflow", R"({"a":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,4]}})", "overflows", 4},
      {"missing", R"({"a":{"dtype":"F32","shape":[1]}})", "`data_offsets` must be [begin, end]", 4},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       "overlap", 12},
      {"metadata", R"({"__metadata__":{"k":1}})", "`__metadata__.k` must be a string", 0},
  };
  for (const Bad& b : cases) {
    const std::string e = error_of(write_file(b.label, b.header, b.data));
    EXPECT_NE(e.find(b.expect), std::string::npos) << b.label << ": " << e;
    EXPECT_NE(e.find("shardtrain_st_"), std::string::npos) << b.label << ": the message names the file: " << e;
  }
  EXPECT_NE(error_of(write_file("short", "", 0, true, 0).substr(0) + "x").find("cannot open"), std::string::npos);
  const std::string tiny = (std::filesystem::temp_directory_path() / "shardtrain_st_tiny").string();
  std::ofstream(tiny) << "abc";
  EXPECT_NE(error_of(tiny).find("too short"), std::string::npos);
  EXPECT_NE(error_of(write_file("lying", good, 24, true, 1000)).find("runs past the end"), std::string::npos);
  EXPECT_NE(error_of(write_file("huge", good, 24, true, uint64_t{1} << 62)).find("exceeds"), std::string::npos);
}

TEST(Safetensors, RangeReadsAndConversions) {
  const std::string header = R"({"w":{"dtype":"BF16","shape":[3,4],"data_offsets":[0,24]}})";
  const std::string path = write_file("bf16", header, 0);
  {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    for (int i = 0; i < 12; ++i) {
      const uint16_t bits = float_to_bf16(static_cast<float>(i) * 0.5f - 1.0f).bits;
      out.put(static_cast<char>(bits & 0xff));
      out.put(static_cast<char>(bits >> 8));
    }
  }
  const SafetensorsFile f(path);
  Tensor part = Tensor::empty({5}, DType::kF32);
  f.read_range("w", 6, part);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(part.data<float>()[i], static_cast<float>(6 + i) * 0.5f - 1.0f);
  Tensor too_many = Tensor::empty({7}, DType::kF32);
  EXPECT_THROW(f.read_range("w", 6, too_many), Error);
  Tensor ints = Tensor::empty({12}, DType::kI32);
  EXPECT_THROW(f.read("w", ints), Error);
  EXPECT_THROW((void)f.get("nope"), Error);
}

// A NaN or inf is an error naming the file, the tensor and the element, found as the values
// are converted; ranges without one read as ever.
TEST(Safetensors, NonFiniteValuesAreNamedErrors) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})";
  const std::string path = write_file("nonfinite", header, 0);
  {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    const float values[6] = {0.5f, -1.25f, std::numeric_limits<float>::quiet_NaN(), 2.0f,
                             -std::numeric_limits<float>::infinity(), 3.0f};
    out.write(reinterpret_cast<const char*>(values), sizeof values);
  }
  const SafetensorsFile f(path);
  Tensor head = Tensor::empty({2}, DType::kF32);
  f.read_range("w", 0, head);
  EXPECT_EQ(head.data<float>()[1], -1.25f);
  for (const auto& [first, found] : {std::pair{int64_t{0}, "element 2 is nan"}, std::pair{int64_t{3}, "element 4 is -inf"}}) {
    Tensor part = Tensor::empty({3}, DType::kBF16);
    std::string e;
    try {
      f.read_range("w", first, part);
    } catch (const Error& x) {
      e = x.what();
    }
    EXPECT_NE(e.find(path + ": tensor `w` " + found + ", expected a finite value"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace shardtrain::io
