// The Parquet reader against pyarrow: files pyarrow, polars and DuckDB write (every codec, v1 and v2 pages,
// dictionary / plain / delta / byte-stream-split encodings, nested lists, structs and maps,
// nulls at every level) must read back as the rows pyarrow itself reads from them. Corrupt
// files must fail with shardtrain's error, never crash; the codecs are checked on hand-made
// streams.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "core/error.h"
#include "io/decompress.h"
#include "io/parquet.h"
#include "testing/shared_data.h"

namespace shardtrain::io {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// pyarrow's cases, written once per test program into a temporary folder.
class ParquetCases : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (fs::temp_directory_path() / ("shardtrain_parquet_" + std::to_string(::getpid()))).string();
    if (std::system("python3 -c 'import pyarrow' > /dev/null 2>&1") != 0) return;
    const std::string script = testing::source_dir() + "/tests/io/make_parquet_cases.py";
    ok_ = std::system(("python3 " + script + " " + dir_).c_str()) == 0;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override {
    if (std::system("python3 -c 'import pyarrow' > /dev/null 2>&1") != 0)
      GTEST_SKIP() << "python3 cannot import pyarrow (pip install pyarrow; scripts/setup.sh --tests does)";
    ASSERT_TRUE(ok_) << "tests/io/make_parquet_cases.py failed";
  }
  static std::vector<std::string> cases() {
    std::ifstream in(dir_ + "/cases.txt");
    std::vector<std::string> names;
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) names.push_back(line);
    return names;
  }
  static std::string path(const std::string& name) { return dir_ + "/" + name + ".parquet"; }

  static inline std::string dir_;
  static inline bool ok_ = false;
};

std::vector<nlohmann::ordered_json> all_rows(const ParquetFile& f) {
  std::vector<nlohmann::ordered_json> rows;
  const std::vector<std::string> fields = f.field_names();
  for (int g = 0; g < f.num_row_groups(); ++g) {
    std::vector<nlohmann::ordered_json> part = f.read_rows(g, fields);
    rows.insert(rows.end(), part.begin(), part.end());
  }
  return rows;
}

TEST_F(ParquetCases, EveryCaseReadsAsPyarrowReadsIt) {
  const std::vector<std::string> names = cases();
  ASSERT_GE(names.size(), 18u);  // pyarrow's
  if (std::system("python3 -c 'import polars, duckdb' > /dev/null 2>&1") == 0)
    EXPECT_GE(names.size(), 34u) << "polars' and DuckDB's cases are missing";
  else
    std::printf("polars or duckdb not importable: pyarrow's cases only (scripts/setup.sh --tests installs both)\n");
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const ParquetFile f(path(name));
    const nlohmann::ordered_json expected = nlohmann::ordered_json::parse(read_file(dir_ + "/" + name + ".json"));
    const std::vector<nlohmann::ordered_json> rows = all_rows(f);
    ASSERT_EQ(rows.size(), expected.size());
    EXPECT_EQ(f.num_rows(), static_cast<int64_t>(rows.size()));
    size_t mismatches = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      if (rows[r] == expected[r]) continue;
      if (++mismatches <= 3)
        ADD_FAILURE() << "row " << r << ": read " << rows[r].dump().substr(0, 400) << "\n  pyarrow "
                      << expected[r].dump().substr(0, 400);
    }
    EXPECT_EQ(mismatches, 0u);
  }
}

TEST_F(ParquetCases, StringColumnsReadDirectly) {
  for (const std::string name : {"flat_snappy_v1", "flat_zstd_v2", "flat_delta", "long_values", "empty"}) {
    SCOPED_TRACE(name);
    const ParquetFile f(path(name));
    const nlohmann::ordered_json expected = nlohmann::ordered_json::parse(read_file(dir_ + "/" + name + ".json"));
    size_t row = 0;
    for (int g = 0; g < f.num_row_groups(); ++g) {
      std::vector<std::string> values;
      std::vector<uint8_t> present;
      f.read_strings(g, "text", values, present);
      ASSERT_EQ(values.size(), static_cast<size_t>(f.row_group_rows(g)));
      for (size_t i = 0; i < values.size(); ++i, ++row) {
        const nlohmann::ordered_json& e = expected[row]["text"];
        ASSERT_EQ(present[i] != 0, !e.is_null()) << "row " << row;
        if (present[i]) {
          ASSERT_EQ(values[i], e.get<std::string>()) << "row " << row;
        }
      }
    }
    EXPECT_EQ(row, expected.size());
  }
}

TEST_F(ParquetCases, FieldsAndTypesAndErrors) {
  const ParquetFile chat(path("chat_snappy_v1"));
  EXPECT_EQ(chat.field_names(), (std::vector<std::string>{"messages", "prompt", "tags", "grid", "meta", "counts"}));
  EXPECT_EQ(chat.field_type("messages"), "list<struct<role: string, content: string>>");
  EXPECT_EQ(chat.field_type("tags"), "list<string>");
  EXPECT_EQ(chat.field_type("grid"), "list<list<int64>>");
  EXPECT_EQ(chat.field_type("meta"), "struct<source: string, lengths: list<int32>>");
  EXPECT_EQ(chat.field_type("counts"), "map<string, int64>");
  EXPECT_EQ(chat.num_row_groups(), 3);
  std::vector<std::string> values;
  std::vector<uint8_t> present;
  try {
    chat.read_strings(0, "messages", values, present);
    FAIL() << "a list read as strings";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("field `messages` is list<struct<role: string, content: string>>, expected "
                                         "a string"), std::string::npos) << e.what();
  }
  try {
    chat.read_rows(0, std::vector<std::string>{"text"});
    FAIL() << "a missing field read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no field `text`; its fields are messages, prompt, tags"), std::string::npos)
        << e.what();
  }
  const std::string text = dir_ + "/cases.txt";
  EXPECT_FALSE(is_parquet_file(text));
  EXPECT_TRUE(is_parquet_file(path("empty")));
  try {
    ParquetFile f(text);
    FAIL() << "a text file opened";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cases.txt`: not a Parquet file"), std::string::npos) << e.what();
  }
}

// Truncations, flipped bytes and overwritten runs of bytes: every read either succeeds or
// throws shardtrain's Error naming the file.
TEST_F(ParquetCases, CorruptFilesFailCleanly) {
  std::mt19937 rng(7);
  for (const std::string name : {"flat_snappy_v1", "chat_zstd_v2", "flat_delta", "flat_gzip_v1", "flat_lz4_v2"}) {
    SCOPED_TRACE(name);
    const std::string original = read_file(path(name));
    int failures = 0;
    for (int trial = 0; trial < 300; ++trial) {
      std::string bytes = original;
      const int kind = trial % 3;
      if (kind == 0) {
        bytes.resize(rng() % bytes.size());
      } else if (kind == 1) {
        for (int k = 0; k < 4; ++k) bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
      } else {
        const size_t at = rng() % bytes.size();
        for (size_t k = at; k < std::min(bytes.size(), at + 16); ++k) bytes[k] = static_cast<char>(rng());
      }
      try {
        validate_parquet(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), "mutated.parquet");
      } catch (const Error& e) {
        ++failures;
        EXPECT_NE(std::string(e.what()).find("mutated.parquet"), std::string::npos) << e.what();
      }
    }
    EXPECT_GT(failures, 100);  // most mutations must be caught (truncations always are)
  }
}

std::vector<uint8_t> bytes_of(std::initializer_list<int> v) { return std::vector<uint8_t>(v.begin(), v.end()); }

TEST(Decompress, SnappyLiteralsAndOverlappingCopies) {
  // "abcabcabcabcX": literal "abc", a 9-byte copy from 3 back (overlapping), literal "X"
  const std::vector<uint8_t> in = bytes_of({13, 2 << 2, 'a', 'b', 'c', 0x01 | ((9 - 4) << 2), 3, 0, 'X'});
  std::string out(13, '\0');
  snappy_decompress(in, std::span(reinterpret_cast<uint8_t*>(out.data()), out.size()), "t");
  EXPECT_EQ(out, "abcabcabcabcX");
  // a copy reaching before the start, and a declared size that is not the expected one
  const std::vector<uint8_t> bad = bytes_of({5, 0, 'a', 0x01 | (0 << 2), 2});
  std::vector<uint8_t> five(5);
  EXPECT_THROW(snappy_decompress(bad, five, "t"), Error);
  std::vector<uint8_t> four(4);
  EXPECT_THROW(snappy_decompress(in, four, "t"), Error);
}

TEST(Decompress, Lz4BlockMatchesAndBounds) {
  // literals "abcd", a match of 8 from 4 back, then the last literals "!"
  const std::vector<uint8_t> in = bytes_of({(4 << 4) | (8 - 4), 'a', 'b', 'c', 'd', 4, 0, 1 << 4, '!'});
  std::string out(13, '\0');
  lz4_block_decompress(in, std::span(reinterpret_cast<uint8_t*>(out.data()), out.size()), "t");
  EXPECT_EQ(out, "abcdabcdabcd!");
  std::vector<uint8_t> twelve(12);
  EXPECT_THROW(lz4_block_decompress(in, twelve, "t"), Error);
  const std::vector<uint8_t> far = bytes_of({(1 << 4) | 0, 'a', 9, 0});  // a match 9 bytes back after 1 byte
  std::vector<uint8_t> five(5);
  EXPECT_THROW(lz4_block_decompress(far, five, "t"), Error);
}

TEST(Decompress, UnsupportedCodecsAreNamed) {
  std::vector<uint8_t> out(4);
  try {
    decompress(Codec::kBrotli, bytes_of({1, 2}), out, "`f.parquet` page 3");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("`f.parquet` page 3: compression BROTLI is not supported"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace shardtrain::io
