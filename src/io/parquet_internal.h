// What parquet.cpp and parquet_meta.cpp share: a bounds-checked reader of Thrift's compact
// protocol (the encoding of Parquet's footer and page headers) and the parsed footer.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace shardtrain::io::parquet {

// Thrift compact protocol wire types.
enum class Wire : uint8_t {
  kStop = 0, kTrue = 1, kFalse = 2, kByte = 3, kI16 = 4, kI32 = 5, kI64 = 6, kDouble = 7, kBinary = 8,
  kList = 9, kSet = 10, kMap = 11, kStruct = 12,
};

// Reads values from [data, data + size); every read checks the bytes left and throws naming
// `what` when the input ends early or is malformed. Nesting deeper than kMaxDepth is refused
// (a hostile file cannot exhaust the stack).
class ThriftReader {
 public:
  static constexpr int kMaxDepth = 32;

  ThriftReader(std::span<const uint8_t> bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}

  size_t position() const { return pos_; }
  const std::string& what() const { return what_; }

  // Calls field(id, wire) for each field of a struct; `field` must consume the value (one of
  // the readers below, or skip(wire)).
  template <typename F>
  void read_struct(F&& field) {
    ST_CHECK(++depth_ <= kMaxDepth, what_, ": Thrift structures nested deeper than ", kMaxDepth);
    int16_t last = 0;
    while (true) {
      const uint8_t header = byte();
      const auto wire = static_cast<Wire>(header & 15);
      if (wire == Wire::kStop) break;
      const int delta = header >> 4;
      const int16_t id = delta != 0 ? static_cast<int16_t>(last + delta) : static_cast<int16_t>(zigzag());
      last = id;
      field(id, wire);
    }
    --depth_;
  }

  // A list's or set's element count and element wire type.
  std::pair<size_t, Wire> list_header() {
    const uint8_t header = byte();
    uint64_t n = header >> 4;
    if (n == 15) n = varint();
    // every element takes at least one byte (list booleans too): a bound that keeps a hostile
    // count from allocating
    ST_CHECK(n <= bytes_.size() - pos_, what_, ": a Thrift list of ", n, " elements in ", bytes_.size() - pos_,
             " bytes");
    return {static_cast<size_t>(n), static_cast<Wire>(header & 15)};
  }

  int64_t integer(Wire wire) {
    if (wire == Wire::kByte) return static_cast<int8_t>(byte());
    ST_CHECK(wire == Wire::kI16 || wire == Wire::kI32 || wire == Wire::kI64, what_, ": expected an integer, found "
             "Thrift wire type ", static_cast<int>(wire));
    return zigzag();
  }
  int32_t i32(Wire wire) {
    const int64_t v = integer(wire);
    ST_CHECK(v >= INT32_MIN && v <= INT32_MAX, what_, ": 32-bit field holds ", v);
    return static_cast<int32_t>(v);
  }
  bool boolean(Wire wire) {
    ST_CHECK(wire == Wire::kTrue || wire == Wire::kFalse, what_, ": expected a boolean, found Thrift wire type ",
             static_cast<int>(wire));
    return wire == Wire::kTrue;
  }
  std::string binary(Wire wire) {
    ST_CHECK(wire == Wire::kBinary, what_, ": expected a string, found Thrift wire type ", static_cast<int>(wire));
    const uint64_t n = varint();
    ST_CHECK(n <= bytes_.size() - pos_, what_, ": a ", n, "-byte string past the end (", bytes_.size() - pos_,
             " bytes left)");
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  void expect(Wire found, Wire wanted, const char* field) {
    ST_CHECK(found == wanted, what_, ": field `", field, "` has Thrift wire type ", static_cast<int>(found),
             ", expected ", static_cast<int>(wanted));
  }

  // Skips a value of any wire type.
  void skip(Wire wire) {
    ST_CHECK(++depth_ <= kMaxDepth, what_, ": Thrift values nested deeper than ", kMaxDepth);
    switch (wire) {
      case Wire::kTrue:
      case Wire::kFalse: break;
      case Wire::kByte: byte(); break;
      case Wire::kI16:
      case Wire::kI32:
      case Wire::kI64: varint(); break;
      case Wire::kDouble: advance(8); break;
      case Wire::kBinary: advance(varint()); break;
      case Wire::kList:
      case Wire::kSet: {
        const auto [n, element] = list_header();
        for (size_t i = 0; i < n; ++i) {
          if (element == Wire::kTrue || element == Wire::kFalse) byte();  // list booleans take a byte each
          else skip(element);
        }
        break;
      }
      case Wire::kMap: {
        const uint64_t n = varint();
        if (n == 0) break;
        ST_CHECK(n <= bytes_.size() - pos_, what_, ": a Thrift map of ", n, " entries past the end");
        const uint8_t types = byte();
        for (uint64_t i = 0; i < n; ++i) {
          skip(static_cast<Wire>(types >> 4));
          skip(static_cast<Wire>(types & 15));
        }
        break;
      }
      case Wire::kStruct: read_struct([&](int16_t, Wire w) { skip(w); }); break;
      default: ST_THROW(what_, ": unknown Thrift wire type ", static_cast<int>(wire));
    }
    --depth_;
  }

 private:
  uint8_t byte() {
    ST_CHECK(pos_ < bytes_.size(), what_, ": Thrift data ends early (", bytes_.size(), " bytes)");
    return bytes_[pos_++];
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = byte();
      v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return v;
    }
    ST_THROW(what_, ": a Thrift varint longer than 10 bytes");
  }
  int64_t zigzag() {
    const uint64_t v = varint();
    return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
  }
  void advance(uint64_t n) {
    ST_CHECK(n <= bytes_.size() - pos_, what_, ": Thrift data ends early (", n, " bytes wanted, ", bytes_.size() - pos_,
             " left)");
    pos_ += static_cast<size_t>(n);
  }

  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::string what_;
};

// Parquet's physical types and repetitions.
enum class Physical : int32_t {
  kGroup = -1, kBoolean = 0, kInt32 = 1, kInt64 = 2, kInt96 = 3, kFloat = 4, kDouble = 5, kByteArray = 6,
  kFixedLenByteArray = 7,
};
enum class Repetition : int32_t { kRequired = 0, kOptional = 1, kRepeated = 2 };

// One schema element, with what the tree gives it: the levels a value under it has when it
// is present, and the leaf columns it covers.
struct SchemaNode {
  std::string name;
  std::string path;  // dotted from the root's children: "messages.list.element.content"
  Physical physical = Physical::kGroup;
  int32_t type_length = 0;
  Repetition repetition = Repetition::kRequired;
  int32_t converted = -1;  // ConvertedType; -1 when absent (LIST = 3, MAP = 1, MAP_KEY_VALUE = 2)
  int32_t logical = 0;     // the LogicalType union's member id; 0 when absent (LIST = 3, MAP = 2)
  std::vector<int> children;  // indices into FileMeta::schema
  int max_def = 0, max_rep = 0;
  int first_leaf = 0, leaf_count = 0;  // leaf columns [first_leaf, first_leaf + leaf_count)
};

struct ColumnChunk {
  Physical physical = Physical::kBoolean;
  int32_t codec = 0;
  int64_t num_values = 0;  // level entries, nulls included
  int64_t total_compressed = 0;
  int64_t data_page_offset = -1;
  int64_t dictionary_page_offset = -1;
};

struct RowGroup {
  int64_t num_rows = 0;
  std::vector<ColumnChunk> columns;  // one per leaf, in leaf order
};

struct FileMeta {
  std::vector<SchemaNode> schema;  // [0] is the root
  std::vector<int> leaves;         // schema indices of the leaf columns, in column order
  int64_t num_rows = 0;
  std::vector<RowGroup> row_groups;
  std::string created_by;
};

// One leaf column of one row group, decoded: a definition and a repetition level per entry
// (empty where the column's maximum is 0, meaning every entry has that maximum), and the
// values of the entries that are present (definition level at the maximum), in order.
struct LeafData {
  Physical physical = Physical::kBoolean;
  size_t entries = 0;
  std::vector<uint8_t> def, rep;
  std::string bytes;          // byte arrays: value i is bytes[ends[i - 1], ends[i])
  std::vector<size_t> ends;
  std::vector<int64_t> ints;  // booleans, INT32, INT64
  std::vector<double> reals;  // FLOAT, DOUBLE
  size_t values() const;
};

// Reads and decodes leaf column `leaf` of row group `group` from the whole file `file`.
LeafData read_column(const FileMeta& meta, std::span<const uint8_t> file, int group, int leaf,
                     const std::string& where);

// Parses and checks the footer's FileMetaData (schema tree, levels, one column chunk per leaf
// in every row group with its path, offsets inside [4, data_end)). `where` names the file.
FileMeta parse_file_meta(std::span<const uint8_t> footer, int64_t data_end, const std::string& where);

}  // namespace shardtrain::io::parquet
