// ParquetFile: the mapped file and its footer, and rows assembled from decoded leaf columns.
// Assembly follows the levels (Dremel's record shredding, undone): a field is absent where
// its first leaf's definition level stops short of the field's, and a repeated field takes
// entries while their repetition level says they continue it.
#include "io/parquet.h"

#include <cstring>
#include <fstream>

#include "io/parquet_internal.h"

namespace shardtrain::io {

using parquet::FileMeta;
using parquet::LeafData;
using parquet::Physical;
using parquet::Repetition;
using parquet::SchemaNode;

namespace {

constexpr int32_t kConvertedMap = 1, kConvertedMapKeyValue = 2, kConvertedList = 3;
constexpr int32_t kLogicalMap = 2, kLogicalList = 3;

bool is_list(const SchemaNode& n) { return n.converted == kConvertedList || n.logical == kLogicalList; }
bool is_map(const SchemaNode& n) {
  return n.converted == kConvertedMap || n.converted == kConvertedMapKeyValue || n.logical == kLogicalMap;
}

std::string leaf_type(const SchemaNode& n) {
  switch (n.physical) {
    case Physical::kBoolean: return "bool";
    case Physical::kInt32: return "int32";
    case Physical::kInt64: return "int64";
    case Physical::kInt96: return "int96";
    case Physical::kFloat: return "float";
    case Physical::kDouble: return "double";
    case Physical::kByteArray: return "string";
    case Physical::kFixedLenByteArray: return "fixed_len_byte_array(" + std::to_string(n.type_length) + ")";
    default: return "group";
  }
}

// A list's element node: the repeated child, or its only child where the repeated group is
// the standard three-level wrapper (not a legacy two-level list's element struct).
struct ListShape {
  int repeated = -1;
  bool unwrap = false;
};
ListShape list_shape(const FileMeta& m, const SchemaNode& list) {
  ListShape s;
  if (list.children.size() != 1) return s;
  const SchemaNode& r = m.schema[static_cast<size_t>(list.children[0])];
  if (r.repetition != Repetition::kRepeated) return s;
  s.repeated = list.children[0];
  s.unwrap = r.physical == Physical::kGroup && r.children.size() == 1 && r.name != "array" &&
             r.name != list.name + "_tuple";
  return s;
}

// A map's repeated key/value group, or nullptr when `n` is not a map of that shape.
const SchemaNode* map_entries(const FileMeta& m, const SchemaNode& n) {
  if (!is_map(n) || n.children.size() != 1) return nullptr;
  const SchemaNode& kv = m.schema[static_cast<size_t>(n.children[0])];
  return kv.repetition == Repetition::kRepeated && kv.children.size() == 2 ? &kv : nullptr;
}

std::string type_text(const FileMeta& m, int index, bool as_element = false) {
  const SchemaNode& n = m.schema[static_cast<size_t>(index)];
  std::string t;
  if (n.physical != Physical::kGroup) {
    t = leaf_type(n);
  } else if (const ListShape s = list_shape(m, n); is_list(n) && s.repeated >= 0) {
    const SchemaNode& r = m.schema[static_cast<size_t>(s.repeated)];
    t = "list<" + type_text(m, s.unwrap ? r.children[0] : s.repeated, true) + ">";
  } else if (const SchemaNode* kv = map_entries(m, n)) {
    t = "map<" + type_text(m, kv->children[0]) + ", " + type_text(m, kv->children[1]) + ">";
  } else {
    t = "struct<";
    for (size_t i = 0; i < n.children.size(); ++i) {
      const SchemaNode& c = m.schema[static_cast<size_t>(n.children[i])];
      t += (i ? ", " : "") + c.name + ": " + type_text(m, n.children[i]);
    }
    t += ">";
  }
  if (n.repetition == Repetition::kRepeated && !as_element) t = "list<" + t + ">";
  return t;
}

// Walks the leaves of one top-level field, row by row.
class Assembler {
 public:
  Assembler(const FileMeta& m, std::vector<LeafData> leaves, int first_leaf, std::string where)
      : m_(m), leaves_(std::move(leaves)), first_leaf_(first_leaf), entry_(leaves_.size(), 0),
        value_(leaves_.size(), 0), where_(std::move(where)) {}

  // The field's value in the next row.
  nlohmann::ordered_json next_row(int field) {
    const SchemaNode& n = node(field);
    for (int l = n.first_leaf; l < n.first_leaf + n.leaf_count; ++l)
      ST_CHECK(has_entry(l) && rep(l) == 0, where_, ": column `", leaf_node(l).path, "` ",
               has_entry(l) ? "continues a record where a new one should start" : "ends before the row groups' rows");
    return read_field(field);
  }

  // Every leaf used up: no entries beyond the rows.
  void finish() const {
    for (size_t l = 0; l < leaves_.size(); ++l)
      ST_CHECK(entry_[l] == leaves_[l].entries, where_, ": column `", leaf_node(first_leaf_ + static_cast<int>(l)).path,
               "` holds ", leaves_[l].entries, " entries, its rows use ", entry_[l]);
  }

 private:
  const SchemaNode& node(int index) const { return m_.schema[static_cast<size_t>(index)]; }
  const SchemaNode& leaf_node(int l) const { return node(m_.leaves[static_cast<size_t>(l)]); }
  LeafData& leaf(int l) { return leaves_[static_cast<size_t>(l - first_leaf_)]; }
  bool has_entry(int l) const {
    const size_t i = static_cast<size_t>(l - first_leaf_);
    return entry_[i] < leaves_[i].entries;
  }
  int def(int l) {
    const LeafData& d = leaf(l);
    return d.def.empty() ? leaf_node(l).max_def : d.def[entry_[static_cast<size_t>(l - first_leaf_)]];
  }
  int rep(int l) {
    const LeafData& d = leaf(l);
    return d.rep.empty() ? 0 : d.rep[entry_[static_cast<size_t>(l - first_leaf_)]];
  }

  // One occurrence of `index` in its parent's current instance; a repeated field's occurrence
  // is its whole list.
  nlohmann::ordered_json read_field(int index) {
    const SchemaNode& n = node(index);
    const int first = n.first_leaf;
    ST_CHECK(has_entry(first), where_, ": column `", leaf_node(first).path, "` ends inside a row");
    if (n.repetition == Repetition::kRepeated) {
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      if (def(first) < n.max_def) {  // empty
        skip_absent(n);
        return list;
      }
      do {
        list.push_back(read_instance(index));
      } while (has_entry(first) && rep(first) == n.max_rep);
      return list;
    }
    if (def(first) < n.max_def) {  // null (or inside a null or empty ancestor, which its caller skips)
      skip_absent(n);
      return nullptr;
    }
    return read_instance(index);
  }

  // Where a field is absent, each of its leaves has one entry saying so.
  void skip_absent(const SchemaNode& n) {
    for (int l = n.first_leaf; l < n.first_leaf + n.leaf_count; ++l) {
      ST_CHECK(has_entry(l), where_, ": column `", leaf_node(l).path, "` ends inside a row");
      ST_CHECK(def(l) < n.max_def, where_, ": column `", leaf_node(l).path, "` has a value where `", n.path,
               "` is absent");
      ++entry_[static_cast<size_t>(l - first_leaf_)];
    }
  }

  nlohmann::ordered_json read_instance(int index) {
    const SchemaNode& n = node(index);
    if (n.physical != Physical::kGroup) return take_value(n.first_leaf);
    if (is_list(n)) {
      const ListShape s = list_shape(m_, n);
      if (s.repeated >= 0) {
        nlohmann::ordered_json list = read_field(s.repeated);
        if (s.unwrap)
          for (nlohmann::ordered_json& e : list) e = nlohmann::ordered_json(std::move(e.begin().value()));
        return list;
      }
    }
    nlohmann::ordered_json object = nlohmann::ordered_json::object();
    for (const int c : n.children) object[node(c).name] = read_field(c);
    if (is_map(n) && n.children.size() == 1) return map_of(std::move(object.begin().value()));
    return object;
  }

  // A map's key/value entries as an object when every key is a string.
  static nlohmann::ordered_json map_of(nlohmann::ordered_json entries) {
    nlohmann::ordered_json object = nlohmann::ordered_json::object();
    for (const nlohmann::ordered_json& e : entries) {
      if (!e.is_object() || !e.contains("key") || !e["key"].is_string()) return entries;
      object[e["key"].get<std::string>()] = e.contains("value") ? e["value"] : nlohmann::ordered_json();
    }
    return object;
  }

  nlohmann::ordered_json take_value(int l) {
    const size_t i = static_cast<size_t>(l - first_leaf_);
    LeafData& d = leaves_[i];
    const size_t v = value_[i]++;
    ++entry_[i];
    ST_CHECK(v < d.values(), where_, ": column `", leaf_node(l).path, "` has fewer values than present entries");
    switch (d.physical) {
      case Physical::kBoolean: return d.ints[v] != 0;
      case Physical::kInt32:
      case Physical::kInt64: return d.ints[v];
      case Physical::kFloat:
      case Physical::kDouble: return d.reals[v];
      default: {
        const size_t begin = v == 0 ? 0 : d.ends[v - 1];
        return d.bytes.substr(begin, d.ends[v] - begin);
      }
    }
  }

  const FileMeta& m_;
  std::vector<LeafData> leaves_;
  int first_leaf_;
  std::vector<size_t> entry_, value_;
  std::string where_;
};

}  // namespace

ParquetFile::ParquetFile(const std::string& path)
    : path_(path), mapping_(std::make_unique<MappedFile>(path)), bytes_(mapping_->bytes()) {
  open("`" + path + "`");
}

ParquetFile::ParquetFile(std::span<const uint8_t> bytes, std::string name) : path_(std::move(name)), bytes_(bytes) {
  open("`" + path_ + "`");
}

ParquetFile::~ParquetFile() = default;

void ParquetFile::open(const std::string& where) {
  const size_t n = bytes_.size();
  ST_CHECK(n >= 12 && std::memcmp(bytes_.data(), "PAR1", 4) == 0 && std::memcmp(bytes_.data() + n - 4, "PAR1", 4) == 0,
           where, ": not a Parquet file (expected \"PAR1\" at its start and end; ", n, " bytes)");
  uint32_t footer = 0;
  for (int i = 0; i < 4; ++i) footer |= uint32_t{bytes_[n - 8 + static_cast<size_t>(i)]} << (8 * i);
  ST_CHECK(footer <= n - 12, where, ": footer of ", footer, " bytes in a ", n, "-byte file");
  const size_t footer_start = n - 8 - footer;
  meta_ = std::make_unique<FileMeta>(
      parquet::parse_file_meta(bytes_.subspan(footer_start, footer), static_cast<int64_t>(footer_start), where));
}

int64_t ParquetFile::num_rows() const { return meta_->num_rows; }
int ParquetFile::num_row_groups() const { return static_cast<int>(meta_->row_groups.size()); }
int64_t ParquetFile::row_group_rows(int group) const {
  ST_CHECK(group >= 0 && group < num_row_groups(), "`", path_, "`: no row group ", group);
  return meta_->row_groups[static_cast<size_t>(group)].num_rows;
}

std::vector<std::string> ParquetFile::field_names() const {
  std::vector<std::string> names;
  for (const int c : meta_->schema[0].children) names.push_back(meta_->schema[static_cast<size_t>(c)].name);
  return names;
}

bool ParquetFile::has_field(const std::string& name) const {
  for (const int c : meta_->schema[0].children)
    if (meta_->schema[static_cast<size_t>(c)].name == name) return true;
  return false;
}

int ParquetFile::field_index(const std::string& name) const {
  for (const int c : meta_->schema[0].children)
    if (meta_->schema[static_cast<size_t>(c)].name == name) return c;
  std::string names;
  for (const std::string& f : field_names()) names += (names.empty() ? "" : ", ") + f;
  ST_THROW("`", path_, "`: no field `", name, "`; its fields are ", names);
}

std::string ParquetFile::field_type(const std::string& name) const { return type_text(*meta_, field_index(name)); }

std::string ParquetFile::describe_fields() const {
  std::string s;
  for (const int c : meta_->schema[0].children)
    s += (s.empty() ? "" : ", ") + meta_->schema[static_cast<size_t>(c)].name + " (" + type_text(*meta_, c) + ")";
  return s;
}

void ParquetFile::read_strings(int group, const std::string& name, std::vector<std::string>& values,
                               std::vector<uint8_t>& present) const {
  row_group_rows(group);
  const int index = field_index(name);
  const SchemaNode& n = meta_->schema[static_cast<size_t>(index)];
  ST_CHECK((n.physical == Physical::kByteArray || n.physical == Physical::kFixedLenByteArray) && n.max_rep == 0,
           "`", path_, "`: field `", name, "` is ", field_type(name), ", expected a string");
  const LeafData d = parquet::read_column(*meta_, bytes_, group, n.first_leaf, "`" + path_ + "`");
  const auto rows = static_cast<size_t>(meta_->row_groups[static_cast<size_t>(group)].num_rows);
  ST_CHECK(d.entries == rows, "`", path_, "`: row group ", group, ", column `", name, "` holds ", d.entries,
           " values for ", rows, " rows");
  values.assign(rows, std::string());
  present.assign(rows, 0);
  size_t v = 0;
  for (size_t i = 0; i < rows; ++i) {
    if (!d.def.empty() && d.def[i] < n.max_def) continue;
    const size_t begin = v == 0 ? 0 : d.ends[v - 1];
    values[i].assign(d.bytes, begin, d.ends[v] - begin);
    present[i] = 1;
    ++v;
  }
}

std::vector<nlohmann::ordered_json> ParquetFile::read_rows(int group, std::span<const std::string> names) const {
  const auto rows = static_cast<size_t>(row_group_rows(group));
  std::vector<nlohmann::ordered_json> out(rows, nlohmann::ordered_json::object());
  for (const std::string& name : names) {
    const int index = field_index(name);
    const SchemaNode& n = meta_->schema[static_cast<size_t>(index)];
    std::vector<LeafData> leaves;
    for (int l = n.first_leaf; l < n.first_leaf + n.leaf_count; ++l)
      leaves.push_back(parquet::read_column(*meta_, bytes_, group, l, "`" + path_ + "`"));
    Assembler a(*meta_, std::move(leaves), n.first_leaf,
                "`" + path_ + "`: row group " + std::to_string(group) + ", field `" + name + "`");
    for (size_t r = 0; r < rows; ++r) out[r][name] = a.next_row(index);
    a.finish();
  }
  return out;
}

bool is_parquet_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in.good()) return false;
  const std::streamoff size = in.tellg();
  if (size < 12) return false;
  char head[4], tail[4];
  in.seekg(0);
  in.read(head, 4);
  in.seekg(size - 4);
  in.read(tail, 4);
  return in.good() && std::memcmp(head, "PAR1", 4) == 0 && std::memcmp(tail, "PAR1", 4) == 0;
}

int64_t validate_parquet(std::span<const uint8_t> bytes, const std::string& name) {
  const ParquetFile file(bytes, name);
  const std::vector<std::string> fields = file.field_names();
  for (int g = 0; g < file.num_row_groups(); ++g) file.read_rows(g, fields);
  return file.num_rows();
}

}  // namespace shardtrain::io
