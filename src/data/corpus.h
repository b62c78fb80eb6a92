// Reading documents: the built-in corpus (Debian's `fortunes` package, plain English text
// installed by scripts/setup.sh) and user text / JSONL / Parquet files.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shardtrain::data {

// Where Debian installs the fortune files.
constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// Every fortune (the text between lines holding only "%") of every plain fortune file in
// `dir` (files without the .dat / .u8 suffixes), in file-name order. Throws, naming the
// folder and how to install it, when it is missing or empty.
std::vector<std::string> load_fortunes(const std::string& dir = kFortunesDir);

// How a source's documents are written.
enum class DocumentFormat {
  kText,     // a text file (plain, .gz or .zst): documents separated by one or more blank lines
  kJsonl,    // a JSONL file (plain, .gz or .zst): one JSON object per line, the document in a string field
  kParquet,  // Parquet files (a file, a folder or a pattern): the document in a string column of each row
};

// "text", "jsonl", "parquet" (data.format's names), and back; another name is an error.
const char* document_format_name(DocumentFormat format);
DocumentFormat parse_document_format(const std::string& name);

// The documents of a source, a block at a time, in order, holding only the block in memory.
// The load_*_documents functions below are this reader drained, so anything built from it
// block by block (a token cache, streams) equals what the loaders give. Errors name the file
// and the line (JSONL) or the row group and column (Parquet).
class DocumentReader {
 public:
  // `source`: a file, or a folder or pattern of files (document_files), read one after another
  // in name order; a text document ends with its file. `field`: JSONL's field or Parquet's
  // column (unused for text). Throws when a file cannot be opened, and naming the source when
  // it holds no file of the format.
  DocumentReader(std::string source, DocumentFormat format, std::string field);
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  // Appends the next documents to `out` until they, or the lines holding them, reach
  // `max_bytes` (at least one document) or the source ends. False when no document was left.
  // JSONL lines are parsed on every OpenMP thread.
  bool next(std::vector<std::string>& out, size_t max_bytes);
  // Throws, naming the source, when it has held no document (call once next() returned false).
  void check_not_empty() const;

  const std::string& source() const { return source_; }
  const std::vector<std::string>& files() const { return files_; }
  int64_t documents() const { return documents_; }  // handed out so far
  uint64_t text_bytes() const { return text_bytes_; }
  // How far through the input it is, in [0, 1]: finished files, and the current file's
  // share read (its bytes, or its row groups); -1 when unknown (a compressed file).
  double progress() const;

 private:
  void open_text(size_t file);  // text and JSONL: starts files_[file] (none past the last)
  bool next_text(std::vector<std::string>& out, size_t max_bytes);
  bool next_jsonl(std::vector<std::string>& out, size_t max_bytes);
  bool next_parquet(std::vector<std::string>& out, size_t max_bytes);

  struct State;
  std::string source_;
  DocumentFormat format_;
  std::string field_;
  std::vector<std::string> files_;
  int64_t documents_ = 0;
  uint64_t text_bytes_ = 0;
  std::unique_ptr<State> state_;
};

// A plain text file: documents separated by one or more blank lines.
std::vector<std::string> load_text_documents(const std::string& path);

// A JSONL file: one JSON object per line, the document in string field `field`.
// Errors name the file, the line number and the field.
std::vector<std::string> load_jsonl_documents(const std::string& path, const std::string& field);

// The files `source` names, in name order: the file itself, the files of a folder, or the
// files matching a pattern in its last component (`*`, `?`, `[...]`, as a shell matches them:
// "data/train-*.parquet"). A pattern that matches nothing is an error naming it.
std::vector<std::string> source_files(const std::string& source);
bool is_source_pattern(const std::string& source);  // wildcards in the last component

// The Parquet files among source_files(source); an error naming `source` when there are none.
std::vector<std::string> parquet_files(const std::string& source);

// The files a document source of `format` reads, in name order: a file itself; a pattern's
// matches; a folder's files of the format (Parquet by their marks, JSONL by .jsonl or .json,
// text by .txt, each also .gz or .zst). An error naming `source` when there are none.
std::vector<std::string> document_files(const std::string& source, DocumentFormat format);
bool is_jsonl_name(const std::string& path);  // .jsonl or .json, also compressed
bool is_text_name(const std::string& path);   // .txt, also compressed

// Parquet files (a file, a folder or a pattern: parquet_files): the document in string column
// `field` of each row, files in name order and row groups in order; rows where it is null or
// empty are skipped. Errors name the file, row group and column, and list the file's fields
// when `field` is not one of them.
std::vector<std::string> load_parquet_documents(const std::string& source, const std::string& field);

}  // namespace shardtrain::data
