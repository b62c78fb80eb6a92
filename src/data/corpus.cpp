// Document loaders for the training data.
#include "data/corpus.h"

#include <fnmatch.h>

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/input_file.h"
#include "io/parquet.h"

namespace shardtrain::data {
namespace {

// The file's text, decompressed when it is a .gz or .zst file.
std::string read_file(const std::string& path) { return io::InputFile(path).read_all(); }

bool blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

// Splits text into lines and groups lines into documents at separator lines.
template <typename IsSeparator>
std::vector<std::string> split_documents(const std::string& text, IsSeparator is_separator) {
  std::vector<std::string> docs;
  std::string current;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    if (is_separator(line)) {
      if (!current.empty()) docs.push_back(std::move(current));
      current.clear();
    } else {
      if (!current.empty()) current += '\n';
      current += line;
    }
    pos = end + 1;
  }
  if (!current.empty() && !blank(current)) docs.push_back(std::move(current));
  return docs;
}

}  // namespace

std::vector<std::string> load_fortunes(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  ST_CHECK(fs::is_directory(dir, ec), "built-in corpus: folder `", dir,
           "` not found; install Debian's `fortunes` package (scripts/setup.sh does) or set "
           "data.source to a text file");
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string ext = e.path().extension().string();
    if (!e.is_regular_file() || ext == ".dat" || ext == ".u8") continue;
    files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> docs;
  for (const std::string& f : files) {
    std::vector<std::string> d = split_documents(read_file(f), [](std::string_view l) { return l == "%"; });
    for (std::string& s : d)
      if (!blank(s)) docs.push_back(std::move(s));
  }
  ST_CHECK(!docs.empty(), "built-in corpus: no fortunes found in `", dir, "`");
  return docs;
}

std::vector<std::string> load_text_documents(const std::string& path) {
  std::vector<std::string> docs = split_documents(read_file(path), blank);
  ST_CHECK(!docs.empty(), "text file `", path, "` holds no documents");
  return docs;
}

std::vector<std::string> load_jsonl_documents(const std::string& path, const std::string& field) {
  io::InputFile in(path);  // line by line, decompressed when it is a .gz or .zst file
  std::vector<std::string> docs;
  std::string line;
  for (int64_t line_no = 1; in.read_line(line); ++line_no) {
    if (blank(line)) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ST_CHECK(!j.is_discarded() && j.is_object(), "`", path, "` line ", line_no, ": not a JSON object");
    auto it = j.find(field);
    ST_CHECK(it != j.end(), "`", path, "` line ", line_no, ": no field `", field,
             "` (set data.text_field to the field holding the text)");
    ST_CHECK(it->is_string(), "`", path, "` line ", line_no, ": field `", field, "` is not a string");
    docs.push_back(it->get<std::string>());
  }
  ST_CHECK(!docs.empty(), "JSONL file `", path, "` holds no documents");
  return docs;
}

bool is_source_pattern(const std::string& source) {
  const std::string name = std::filesystem::path(source).filename().string();
  return name.find_first_of("*?[") != std::string::npos;
}

std::vector<std::string> source_files(const std::string& source) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  if (is_source_pattern(source)) {
    const fs::path p(source);
    const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    const std::string pattern = p.filename().string();
    std::error_code ec;
    ST_CHECK(fs::is_directory(dir, ec), "`", source, "`: no folder `", dir.string(), "` to match `", pattern, "` in");
    for (const fs::directory_entry& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && ::fnmatch(pattern.c_str(), e.path().filename().c_str(), FNM_PERIOD) == 0)
        files.push_back(e.path().string());
    ST_CHECK(!files.empty(), "`", source, "` matches no file");
  } else if (fs::is_directory(source)) {
    for (const fs::directory_entry& e : fs::directory_iterator(source))
      if (e.is_regular_file()) files.push_back(e.path().string());
  } else {
    files.push_back(source);
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> parquet_files(const std::string& source) {
  std::vector<std::string> files;
  for (const std::string& f : source_files(source))
    if (io::is_parquet_file(f)) files.push_back(f);
  ST_CHECK(!files.empty(), "`", source, "` holds no Parquet file");
  return files;
}

std::vector<std::string> load_parquet_documents(const std::string& source, const std::string& field) {
  std::vector<std::string> docs;
  std::vector<std::string> values;
  std::vector<uint8_t> present;
  for (const std::string& path : parquet_files(source)) {
    const io::ParquetFile file(path);
    ST_CHECK(file.has_field(field), "`", path, "`: no field `", field, "` (set data.text_field to the field holding "
             "the text; the file's fields are ", file.describe_fields(), ")");
    for (int g = 0; g < file.num_row_groups(); ++g) {
      file.read_strings(g, field, values, present);
      for (size_t i = 0; i < values.size(); ++i)
        if (present[i] && !values[i].empty()) docs.push_back(std::move(values[i]));
    }
  }
  ST_CHECK(!docs.empty(), "`", source, "` holds no documents in Parquet field `", field, "`");
  return docs;
}

}  // namespace shardtrain::data
