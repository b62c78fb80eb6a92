// Document loaders for the training data.
#include "data/corpus.h"

#include <fnmatch.h>

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/parallel.h"
#include "data/utf8.h"
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

const char* document_format_name(DocumentFormat format) {
  switch (format) {
    case DocumentFormat::kText: return "text";
    case DocumentFormat::kJsonl: return "jsonl";
    case DocumentFormat::kParquet: return "parquet";
  }
  return "?";
}

DocumentFormat parse_document_format(const std::string& name) {
  for (const DocumentFormat f : {DocumentFormat::kText, DocumentFormat::kJsonl, DocumentFormat::kParquet})
    if (name == document_format_name(f)) return f;
  ST_THROW("`", name, "` is not a document format (text, jsonl or parquet)");
}

// ---- DocumentReader ----

struct DocumentReader::State {
  size_t file = 0;                      // index into files_ of the file being read
  std::unique_ptr<io::InputFile> text;  // text and JSONL: the open file
  uint64_t file_bytes = 0;              // its size on disk
  int64_t line_no = 0;
  std::string line;
  std::string current;                  // text: the document being assembled
  std::unique_ptr<io::ParquetFile> parquet;
  int group = 0;                        // Parquet: the next row group
  std::vector<std::string> values;
  std::vector<uint8_t> present;
};

DocumentReader::DocumentReader(std::string source, DocumentFormat format, std::string field)
    : source_(std::move(source)), format_(format), field_(std::move(field)), state_(std::make_unique<State>()) {
  files_ = document_files(source_, format_);
  if (format_ != DocumentFormat::kParquet) open_text(0);
}

void DocumentReader::open_text(size_t file) {
  State& s = *state_;
  s.file = file;
  s.text.reset();
  s.line_no = 0;
  if (file >= files_.size()) return;
  s.text = std::make_unique<io::InputFile>(files_[file]);  // decompressed when it is a .gz or .zst file
  std::error_code ec;
  s.file_bytes = std::filesystem::file_size(files_[file], ec);
}

DocumentReader::~DocumentReader() = default;

bool DocumentReader::next(std::vector<std::string>& out, size_t max_bytes) {
  switch (format_) {
    case DocumentFormat::kText: return next_text(out, max_bytes);
    case DocumentFormat::kJsonl: return next_jsonl(out, max_bytes);
    case DocumentFormat::kParquet: return next_parquet(out, max_bytes);
  }
  return false;
}

bool DocumentReader::next_text(std::vector<std::string>& out, size_t max_bytes) {
  State& s = *state_;
  size_t bytes = 0;
  bool any = false;
  auto finish_document = [&] {
    if (s.current.empty() || blank(s.current)) return;
    bytes += s.current.size();
    text_bytes_ += s.current.size();
    ++documents_;
    out.push_back(std::move(s.current));
    s.current.clear();
    any = true;
  };
  while (bytes < max_bytes) {
    if (!s.text) break;
    if (!s.text->read_line(s.line)) {
      finish_document();  // a document ends with its file
      open_text(s.file + 1);
      continue;
    }
    if (blank(s.line)) {
      finish_document();
    } else {
      if (!s.current.empty()) s.current += '\n';
      s.current += s.line;
    }
  }
  return any;
}

bool DocumentReader::next_jsonl(std::vector<std::string>& out, size_t max_bytes) {
  // The block's lines are read on this thread and parsed on every core (the parse, not the
  // tokenizer, is what limits a fast tokenizer); errors name the lowest failing line.
  State& s = *state_;
  std::vector<std::string> lines;
  std::vector<int64_t> numbers;
  std::vector<size_t> file_of;  // the index in files_ of each line's file
  size_t bytes = 0;
  while (bytes < max_bytes && s.text) {
    if (!s.text->read_line(s.line)) {
      open_text(s.file + 1);
      continue;
    }
    ++s.line_no;
    if (blank(s.line)) continue;
    bytes += s.line.size();
    lines.push_back(std::move(s.line));
    numbers.push_back(s.line_no);
    file_of.push_back(s.file);
  }
  if (lines.empty()) return false;
  std::vector<std::string> docs(lines.size());
  parallel_for_lowest_error(static_cast<int64_t>(lines.size()), 0, [&](int64_t i) {
    const auto k = static_cast<size_t>(i);
    const std::string& file = files_[file_of[k]];
    nlohmann::json j = nlohmann::json::parse(lines[k], nullptr, false);
    if (j.is_discarded()) {
      const std::string bad_utf8 = utf8_problem(lines[k]);
      ST_CHECK(bad_utf8.empty(), "`", file, "` line ", numbers[k], ": ", bad_utf8);
    }
    ST_CHECK(!j.is_discarded() && j.is_object(), "`", file, "` line ", numbers[k], ": not a JSON object");
    auto it = j.find(field_);
    ST_CHECK(it != j.end(), "`", file, "` line ", numbers[k], ": no field `", field_,
             "` (set data.text_field to the field holding the text)");
    ST_CHECK(it->is_string(), "`", file, "` line ", numbers[k], ": field `", field_, "` is not a string");
    docs[k] = std::move(it->get_ref<std::string&>());
  });
  for (std::string& d : docs) {
    text_bytes_ += d.size();
    ++documents_;
    out.push_back(std::move(d));
  }
  return true;
}

bool DocumentReader::next_parquet(std::vector<std::string>& out, size_t max_bytes) {
  State& s = *state_;
  size_t bytes = 0;
  bool any = false;
  while (bytes < max_bytes && s.file < files_.size()) {
    if (!s.parquet) {
      const std::string& path = files_[s.file];
      s.parquet = std::make_unique<io::ParquetFile>(path);
      s.group = 0;
      ST_CHECK(s.parquet->has_field(field_), "`", path, "`: no field `", field_, "` (set data.text_field to the "
               "field holding the text; the file's fields are ", s.parquet->describe_fields(), ")");
    }
    if (s.group == s.parquet->num_row_groups()) {
      s.parquet.reset();
      ++s.file;
      continue;
    }
    s.parquet->read_strings(s.group++, field_, s.values, s.present);
    for (size_t i = 0; i < s.values.size(); ++i) {
      if (!s.present[i] || s.values[i].empty()) continue;
      bytes += s.values[i].size();
      text_bytes_ += s.values[i].size();
      ++documents_;
      out.push_back(std::move(s.values[i]));
      any = true;
    }
  }
  return any;
}

void DocumentReader::check_not_empty() const {
  if (documents_ > 0) return;
  switch (format_) {
    case DocumentFormat::kText:
    case DocumentFormat::kJsonl: {
      const char* kind = format_ == DocumentFormat::kText ? "text" : "JSONL";
      if (files_.size() > 1) ST_THROW("the ", files_.size(), " ", kind, " files of `", source_, "` hold no documents");
      ST_THROW(kind, " file `", source_, "` holds no documents");
    }
    case DocumentFormat::kParquet:
      ST_THROW("`", source_, "` holds no documents in Parquet field `", field_, "`");
  }
}

double DocumentReader::progress() const {
  const State& s = *state_;
  if (format_ == DocumentFormat::kParquet) {
    double within = 0;
    if (s.parquet && s.parquet->num_row_groups() > 0)
      within = static_cast<double>(s.group) / s.parquet->num_row_groups();
    return std::min(1.0, (static_cast<double>(s.file) + within) / static_cast<double>(files_.size()));
  }
  if (!s.text) return 1.0;
  const double files = static_cast<double>(files_.size());
  if (s.text->compression() != io::InputFile::Compression::kNone || s.file_bytes == 0)
    return files > 1 ? static_cast<double>(s.file) / files : -1;  // finished files only
  const double within = static_cast<double>(s.text->bytes_read()) / static_cast<double>(s.file_bytes);
  return std::min(1.0, (static_cast<double>(s.file) + within) / files);
}

namespace {

std::vector<std::string> drain(DocumentReader& reader) {
  std::vector<std::string> docs;
  while (reader.next(docs, size_t{64} << 20)) {
  }
  reader.check_not_empty();
  return docs;
}

}  // namespace

std::vector<std::string> load_text_documents(const std::string& path) {
  DocumentReader reader(path, DocumentFormat::kText, "");
  return drain(reader);
}

std::vector<std::string> load_jsonl_documents(const std::string& path, const std::string& field) {
  DocumentReader reader(path, DocumentFormat::kJsonl, field);
  return drain(reader);
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

bool is_jsonl_name(const std::string& path) {
  const std::string ext = io::inner_extension(path);
  return ext == ".jsonl" || ext == ".json";
}

bool is_text_name(const std::string& path) { return io::inner_extension(path) == ".txt"; }

std::vector<std::string> document_files(const std::string& source, DocumentFormat format) {
  if (format == DocumentFormat::kParquet) return parquet_files(source);
  if (!std::filesystem::is_directory(source) && !is_source_pattern(source)) return {source};
  // a pattern names its files; a folder's are taken by their extension (a dataset card, a
  // license or a Parquet file beside them are not documents)
  const bool pattern = is_source_pattern(source);
  const bool jsonl = format == DocumentFormat::kJsonl;
  std::vector<std::string> files;
  for (const std::string& f : source_files(source))
    if (pattern || (jsonl ? is_jsonl_name(f) : is_text_name(f))) files.push_back(f);
  ST_CHECK(!files.empty(), "`", source, "` holds no ", jsonl ? ".jsonl or .json" : ".txt", " files (also .gz, .zst)");
  return files;
}

std::vector<std::string> load_parquet_documents(const std::string& source, const std::string& field) {
  DocumentReader reader(source, DocumentFormat::kParquet, field);
  return drain(reader);
}

}  // namespace shardtrain::data
