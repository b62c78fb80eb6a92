// Parquet's footer: the FileMetaData struct (Thrift compact protocol) turned into a schema
// tree with each node's definition and repetition levels, and per row group one column chunk
// per leaf whose path, type and byte range are checked against the schema and the file.
#include <algorithm>
#include <functional>

#include "io/parquet_internal.h"

namespace shardtrain::io::parquet {
namespace {

struct RawElement {
  std::string name;
  int32_t type = -1;
  int32_t type_length = 0;
  int32_t repetition = 0;
  int32_t num_children = -1;  // -1: absent (a leaf)
  int32_t converted = -1;
  int32_t logical = 0;
};

RawElement read_element(ThriftReader& r) {
  RawElement e;
  r.read_struct([&](int16_t id, Wire w) {
    switch (id) {
      case 1: e.type = r.i32(w); break;
      case 2: e.type_length = r.i32(w); break;
      case 3: e.repetition = r.i32(w); break;
      case 4: e.name = r.binary(w); break;
      case 5: e.num_children = r.i32(w); break;
      case 6: e.converted = r.i32(w); break;
      case 10:  // LogicalType: a union, the member's field id names the type
        r.expect(w, Wire::kStruct, "logicalType");
        r.read_struct([&](int16_t member, Wire mw) {
          e.logical = member;
          r.skip(mw);
        });
        break;
      default: r.skip(w);
    }
  });
  return e;
}

struct RawChunk {
  ColumnChunk chunk;
  std::vector<std::string> path;
  std::string file_path;
  bool has_meta = false;
};

RawChunk read_chunk(ThriftReader& r) {
  RawChunk c;
  r.read_struct([&](int16_t id, Wire w) {
    if (id == 1) {
      c.file_path = r.binary(w);
    } else if (id == 3) {
      r.expect(w, Wire::kStruct, "meta_data");
      c.has_meta = true;
      r.read_struct([&](int16_t mid, Wire mw) {
        switch (mid) {
          case 1: c.chunk.physical = static_cast<Physical>(r.i32(mw)); break;
          case 3: {
            r.expect(mw, Wire::kList, "path_in_schema");
            const auto [n, element] = r.list_header();
            for (size_t i = 0; i < n; ++i) c.path.push_back(r.binary(element));
            break;
          }
          case 4: c.chunk.codec = r.i32(mw); break;
          case 5: c.chunk.num_values = r.integer(mw); break;
          case 7: c.chunk.total_compressed = r.integer(mw); break;
          case 9: c.chunk.data_page_offset = r.integer(mw); break;
          case 11: c.chunk.dictionary_page_offset = r.integer(mw); break;
          default: r.skip(mw);
        }
      });
    } else {
      r.skip(w);
    }
  });
  return c;
}

std::string joined(const std::vector<std::string>& path) {
  std::string s;
  for (const std::string& p : path) s += (s.empty() ? "" : ".") + p;
  return s;
}

}  // namespace

FileMeta parse_file_meta(std::span<const uint8_t> footer, int64_t data_end, const std::string& where) {
  ThriftReader r(footer, where + ": footer");
  FileMeta meta;
  std::vector<RawElement> elements;
  std::vector<std::vector<RawChunk>> chunks;
  std::vector<int64_t> group_rows;
  bool have_schema = false, have_rows = false;
  r.read_struct([&](int16_t id, Wire w) {
    switch (id) {
      case 2: {
        r.expect(w, Wire::kList, "schema");
        const auto [n, element] = r.list_header();
        r.expect(element, Wire::kStruct, "schema element");
        for (size_t i = 0; i < n; ++i) elements.push_back(read_element(r));
        have_schema = true;
        break;
      }
      case 3: meta.num_rows = r.integer(w); have_rows = true; break;
      case 4: {
        r.expect(w, Wire::kList, "row_groups");
        const auto [n, element] = r.list_header();
        r.expect(element, Wire::kStruct, "row group");
        for (size_t i = 0; i < n; ++i) {
          std::vector<RawChunk> columns;
          int64_t rows = -1;
          r.read_struct([&](int16_t gid, Wire gw) {
            if (gid == 1) {
              r.expect(gw, Wire::kList, "columns");
              const auto [m, ce] = r.list_header();
              r.expect(ce, Wire::kStruct, "column chunk");
              for (size_t j = 0; j < m; ++j) columns.push_back(read_chunk(r));
            } else if (gid == 3) {
              rows = r.integer(gw);
            } else {
              r.skip(gw);
            }
          });
          chunks.push_back(std::move(columns));
          group_rows.push_back(rows);
        }
        break;
      }
      case 6: meta.created_by = r.binary(w); break;
      default: r.skip(w);
    }
  });
  ST_CHECK(have_schema && !elements.empty(), where, ": the footer has no schema");
  ST_CHECK(have_rows && meta.num_rows >= 0, where, ": the footer has no valid num_rows");

  // The schema is the tree in depth-first order; element 0 is the root.
  meta.schema.resize(elements.size());
  size_t next = 0;
  std::function<int(int, int)> build = [&](int parent, int depth) -> int {
    ST_CHECK(next < elements.size(), where, ": the schema's child counts exceed its ", elements.size(), " elements");
    ST_CHECK(depth <= ThriftReader::kMaxDepth, where, ": schema nested deeper than ", ThriftReader::kMaxDepth);
    const int index = static_cast<int>(next++);
    const RawElement& e = elements[static_cast<size_t>(index)];
    SchemaNode& node = meta.schema[static_cast<size_t>(index)];
    node.name = e.name;
    node.type_length = e.type_length;
    node.converted = e.converted;
    node.logical = e.logical;
    if (parent >= 0) {
      const SchemaNode& up = meta.schema[static_cast<size_t>(parent)];
      ST_CHECK(e.repetition >= 0 && e.repetition <= 2, where, ": schema element `", e.name, "` has repetition ",
               e.repetition);
      node.repetition = static_cast<Repetition>(e.repetition);
      node.path = up.path.empty() ? e.name : up.path + "." + e.name;
      node.max_def = up.max_def + (node.repetition != Repetition::kRequired ? 1 : 0);
      node.max_rep = up.max_rep + (node.repetition == Repetition::kRepeated ? 1 : 0);
    }
    node.first_leaf = static_cast<int>(meta.leaves.size());
    if (e.num_children <= 0 && parent >= 0) {  // a leaf column
      ST_CHECK(e.type >= 0 && e.type <= 7, where, ": leaf column `", node.path, "` has physical type ", e.type);
      ST_CHECK(e.type != 7 || e.type_length > 0, where, ": FIXED_LEN_BYTE_ARRAY column `", node.path,
               "` has type_length ", e.type_length);
      node.physical = static_cast<Physical>(e.type);
      meta.leaves.push_back(index);
    } else {
      ST_CHECK(e.num_children > 0, where, ": the schema root has no columns");
      for (int32_t c = 0; c < e.num_children; ++c) {
        const int child = build(index, depth + 1);
        meta.schema[static_cast<size_t>(index)].children.push_back(child);
      }
    }
    SchemaNode& done = meta.schema[static_cast<size_t>(index)];
    done.leaf_count = static_cast<int>(meta.leaves.size()) - done.first_leaf;
    return index;
  };
  build(-1, 0);
  ST_CHECK(next == elements.size(), where, ": the schema has ", elements.size(), " elements, its tree covers ", next);

  int64_t rows = 0;
  for (size_t g = 0; g < chunks.size(); ++g) {
    const std::string at = where + ": row group " + std::to_string(g);
    ST_CHECK(group_rows[g] >= 0 && group_rows[g] <= meta.num_rows - rows, at, ": num_rows ", group_rows[g],
             " is negative or past the file's ", meta.num_rows);
    ST_CHECK(chunks[g].size() == meta.leaves.size(), at, ": ", chunks[g].size(), " column chunks for ",
             meta.leaves.size(), " leaf columns");
    RowGroup group;
    group.num_rows = group_rows[g];
    rows += group.num_rows;
    for (size_t c = 0; c < chunks[g].size(); ++c) {
      const RawChunk& raw = chunks[g][c];
      const SchemaNode& leaf = meta.schema[static_cast<size_t>(meta.leaves[c])];
      const std::string col = at + ", column `" + leaf.path + "`";
      ST_CHECK(raw.file_path.empty(), col, ": the data is in another file (`", raw.file_path,
               "`), which is not supported");
      ST_CHECK(raw.has_meta, col, ": no column metadata");
      ST_CHECK(joined(raw.path) == leaf.path, col, ": the chunk's path is `", joined(raw.path), "`");
      ST_CHECK(raw.chunk.physical == leaf.physical, col, ": the chunk's type ", static_cast<int>(raw.chunk.physical),
               " differs from the schema's ", static_cast<int>(leaf.physical));
      ColumnChunk chunk = raw.chunk;
      ST_CHECK(chunk.num_values >= 0 && chunk.total_compressed >= 0, col, ": negative sizes");
      if (chunk.num_values == 0) {  // nothing to read (writers leave its offsets unset)
        chunk.total_compressed = 0;
        chunk.dictionary_page_offset = -1;
        chunk.data_page_offset = 4;
        group.columns.push_back(chunk);
        continue;
      }
      const int64_t start = chunk.dictionary_page_offset > 0 && chunk.dictionary_page_offset < chunk.data_page_offset
                                ? chunk.dictionary_page_offset
                                : chunk.data_page_offset;
      if (chunk.dictionary_page_offset >= chunk.data_page_offset || chunk.dictionary_page_offset <= 0)
        chunk.dictionary_page_offset = -1;
      ST_CHECK(start >= 4 && start <= data_end && chunk.total_compressed <= data_end - start, col, ": ", chunk.total_compressed,
               " bytes at offset ", start, " are outside the data section [4, ", data_end, ")");
      group.columns.push_back(chunk);
    }
    meta.row_groups.push_back(std::move(group));
  }
  ST_CHECK(rows == meta.num_rows, where, ": the row groups hold ", rows, " rows, the footer says ", meta.num_rows);
  return meta;
}

}  // namespace shardtrain::io::parquet
