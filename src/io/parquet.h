// Reading Parquet files (the Hugging Face Hub's dataset format): the footer and schema are
// checked in full when the file opens; columns are read a row group at a time, pages
// decompressed (snappy, gzip, zstd, LZ4) and decoded (plain, dictionary, delta, byte-stream
// split encodings; v1 and v2 pages), and nested fields (lists, structs) assembled from their
// levels into JSON values. Every size, offset, level and dictionary index is checked; errors
// name the file, the row group, the column and the page.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"

namespace shardtrain::io {

namespace parquet {
struct FileMeta;
}

class ParquetFile {
 public:
  // Maps the file and reads its footer.
  explicit ParquetFile(const std::string& path);
  // A file held in memory (`bytes` must outlive this); `name` stands for its path in errors.
  ParquetFile(std::span<const uint8_t> bytes, std::string name);
  ~ParquetFile();
  ParquetFile(const ParquetFile&) = delete;
  ParquetFile& operator=(const ParquetFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t num_rows() const;
  int num_row_groups() const;
  int64_t row_group_rows(int group) const;
  // The top-level fields, in schema order.
  std::vector<std::string> field_names() const;
  bool has_field(const std::string& name) const;
  // A field's type as text: "string", "int64", "list<struct<content: string, role: string>>".
  std::string field_type(const std::string& name) const;
  // Every top-level field with its type, for messages: "text (string), id (int64)".
  std::string describe_fields() const;

  // Top-level field `name`, a string (or binary) column, for every row of row group `group`:
  // values[i] is row i's bytes, present[i] 0 where the row's value is null. Throws naming the
  // field and its type when it is not such a column.
  void read_strings(int group, const std::string& name, std::vector<std::string>& values,
                    std::vector<uint8_t>& present) const;

  // The rows of row group `group` as JSON objects holding the named top-level fields (objects in
  // the schema's field order): strings
  // (and binaries) as strings, integers, floating-point numbers, booleans, lists (LIST and bare
  // repeated fields) as arrays, structs as objects, maps with string keys as objects; null
  // where a value is null.
  std::vector<nlohmann::ordered_json> read_rows(int group, std::span<const std::string> names) const;

 private:
  void open(const std::string& where);
  int field_index(const std::string& name) const;  // schema index of a top-level field; throws

  std::string path_;
  std::unique_ptr<MappedFile> mapping_;  // the file; null for a borrowed buffer
  std::span<const uint8_t> bytes_;
  std::unique_ptr<parquet::FileMeta> meta_;
};

// "PAR1" at both ends of a file of at least 12 bytes.
bool is_parquet_file(const std::string& path);

// Opens a file held in memory and decodes every column of every row group into JSON rows;
// returns the number of rows. The fuzz target's entry point.
int64_t validate_parquet(std::span<const uint8_t> bytes, const std::string& name);

}  // namespace shardtrain::io
