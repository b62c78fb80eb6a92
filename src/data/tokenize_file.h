// Token files: a text or JSONL corpus tokenized once (multi-threaded, order preserved) into a
// flat file of ids that training reads back with mmap.
//
// Format, version 2 (all integers little-endian; the header is 48 bytes):
//   offset  size  field
//        0     8  magic "STTOK\0\0\0"
//        8     4  u32 version = 1
//       12     4  u32 token_bytes: 2 (ids stored as u16, when vocab_size <= 65536) or 4 (u32)
//       16     8  u64 token_count
//       24     8  u64 document_count
//       32     8  i64 vocab_size (every id is < vocab_size)
//       40     4  i32 eos_id (-1: the tokenizer has none)
//       44     4  i32 bos_id (-1: the tokenizer has none)
//       48        token_count ids of token_bytes each
// The file is exactly 48 + token_count * token_bytes bytes. Each document is stored as the
// training stream holds it: bos_id (when >= 0), its ids, eos_id (when >= 0), so training reads
// the file as it is and files concatenate cleanly. Version 1 (still read) had 4 reserved zero
// bytes at 44 and stored no BOS. Files are written to "<path>.tmp" and renamed when complete,
// so a file with the final name is never partial.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace shardtrain::data {

constexpr char kTokenFileMagic[8] = {'S', 'T', 'T', 'O', 'K', '\0', '\0', '\0'};
constexpr uint32_t kTokenFileVersion = 2;  // written; 1 and 2 are read
constexpr size_t kTokenFileHeaderBytes = 48;

struct TokenFileHeader {
  uint32_t version = kTokenFileVersion;
  uint32_t token_bytes = 4;
  uint64_t token_count = 0;
  uint64_t document_count = 0;
  int64_t vocab_size = 0;
  int32_t eos_id = -1;
  int32_t bos_id = -1;  // version 1 files: -1 (none stored)
};

// Streams ids into a token file. The header's counts are written by finish().
class TokenFileWriter {
 public:
  // Opens "<path>.tmp"; token_bytes is 2 when vocab_size <= 65536, else 4. bos_id / eos_id
  // -1: documents get no BOS / EOS.
  TokenFileWriter(std::string path, int64_t vocab_size, int32_t eos_id, int32_t bos_id = -1);
  // Removes the temporary file when finish() was not reached.
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  // Appends one document: bos_id when there is one, its ids, then eos_id when there is one.
  // Throws on an id outside [0, vocab_size).
  void append_document(std::span<const int32_t> ids);
  // Writes the header, syncs and renames "<path>.tmp" to `path`.
  void finish();
  const TokenFileHeader& header() const { return header_; }

 private:
  // The ids' bytes go to buffer_, written out once it holds kFlushBytes (one write per many
  // documents: a write per document's ids made writing the serial part of a parallel tokenize).
  void write_ids(std::span<const int32_t> ids);
  void flush();
  static constexpr size_t kFlushBytes = size_t{1} << 20;

  std::string path_;
  std::string tmp_path_;
  TokenFileHeader header_;
  std::FILE* file_ = nullptr;
  std::vector<unsigned char> buffer_;
};

// Whether `path` is a regular file that begins with the token file magic (its header is not
// checked further: TokenFile does that).
bool is_token_file(const std::string& path);

// A token file mapped read-only. The constructor validates the header (magic, version,
// token_bytes, vocab_size, eos_id and bos_id ranges, file length = 48 + count * token_bytes).
class TokenFile {
 public:
  explicit TokenFile(const std::string& path);
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const TokenFileHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return header_.token_count; }
  // Copies ids [first, first + out.size()); throws when the range passes the end or an id
  // is >= vocab_size (naming its index).
  void read(uint64_t first, std::span<int32_t> out) const;
  std::vector<int32_t> read_all() const;

 private:
  std::string path_;
  TokenFileHeader header_;
  const unsigned char* data_ = nullptr;  // the whole mapped file
  size_t mapped_bytes_ = 0;
};

enum class TextFormat {
  kLines,      // one document per line ('\n', a trailing '\r' is dropped); empty lines skipped
  kWholeFile,  // the whole file is one document (encoded by one thread)
  kJsonl,      // one JSON object per line, the document in string field `jsonl_field`
  kParquet,    // a Parquet file, the document in string column `jsonl_field` of each row (nulls skipped)
};

struct TokenizeFileOptions {
  TextFormat format = TextFormat::kLines;
  std::string jsonl_field = "text";       // kJsonl's field, kParquet's column
  int num_threads = 0;                    // 0: OpenMP's default (omp_get_max_threads)
  size_t block_bytes = size_t{16} << 20;  // input read and tokenized per parallel step
  // read (decompress, decode) the next block or row group on a thread of its own while this
  // one is encoded; false reads between blocks (the same output either way)
  bool read_ahead = true;
};

struct TokenizeFileStats {
  uint64_t documents = 0;
  uint64_t tokens = 0;  // including the EOS after each document
  uint64_t input_bytes = 0;
  double seconds = 0;
  double bytes_per_second() const { return seconds > 0 ? input_bytes / seconds : 0; }
};

// The format a file reads as when none is given: kParquet by its PAR1 marks, kJsonl for
// .jsonl / .json (also under .gz or .zst), else kLines.
TextFormat detect_text_format(const std::string& path);
// "c4-train.00000-of-01024.json.gz" -> "c4-train.00000-of-01024.tok": the file name without
// its compression and data suffixes (.gz, .zst; .parquet, .jsonl, .json, .txt), and ".tok".
std::string token_file_name(const std::string& input_path);
// A source's name for people: a file's name without its compression and data suffixes (and
// .tok), a folder's name, or for a pattern its folder's ("tokens/web.tok" -> "web",
// "books/part.jsonl.zst" -> "part", "c4/en/train-*.json.gz" -> "en"); "source" when it has none.
std::string source_name(const std::string& source);

// Tokenizes `input_path` into token file `output_path`. Documents are encoded in parallel
// (tokenizer.encode must be thread-safe; BpeTokenizer and ByteTokenizer are) and written in
// input order, so the result does not depend on num_threads. Documents whose text is empty
// are skipped. Errors name the file and line.
TokenizeFileStats tokenize_file(const Tokenizer& tokenizer, const std::string& input_path,
                                const std::string& output_path,
                                const TokenizeFileOptions& options = {});

// tokenize_file in `format`, or with none the file's own (detect_text_format, then logged),
// logging the result; `tag` ("[3/8] ") begins each line logged.
TokenizeFileStats tokenize_file_logged(const Tokenizer& tokenizer, const std::string& input_path,
                                       const std::string& output_path, TokenizeFileOptions options,
                                       std::optional<TextFormat> format, const std::string& tag = "");

struct TokenizeFilesOptions {
  TokenizeFileOptions file;          // its num_threads: all the files' threads together (0: every core)
  std::optional<TextFormat> format;  // none: each file's own (detect_text_format), logged
  // Files tokenized at once, each with num_threads / files_at_once threads: one thread each
  // decompresses and writes, so several files together scale further than one (0: one per 8
  // threads, at most the number of files)
  int files_at_once = 0;
  bool skip_existing = false;  // keep an output token file made with this tokenizer already
};

struct TokenizeFilesStats {
  uint64_t files = 0, skipped = 0, documents = 0, tokens = 0;
  double seconds = 0;
};

// Tokenizes each of `inputs` into out_dir/<token_file_name(input)>.tok, logging each file as it
// ends. Each token file is what tokenize_file writes, whatever files_at_once. On an error the
// files under way finish (they and those before stay complete), no other starts, and the error
// of the first input that failed is thrown.
TokenizeFilesStats tokenize_files(const Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                                  const std::string& out_dir, const TokenizeFilesOptions& options);

}  // namespace shardtrain::data
