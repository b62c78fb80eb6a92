// Reading a file's bytes in order, decompressing gzip (.gz) and zstd (.zst) files on the way,
// as corpora are shipped (C4's .json.gz, SlimPajama's .jsonl.zst). The format is known by the
// file's first bytes, not its name; concatenated gzip members and zstd frames read as one
// stream. Errors name the file and how far into its decompressed bytes they happened.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace shardtrain::io {

class InputFile {
 public:
  enum class Compression { kNone, kGzip, kZstd };

  explicit InputFile(const std::string& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // Up to n decompressed bytes into out; 0 only at the end of the stream.
  size_t read(char* out, size_t n);
  // Everything left, decompressed.
  std::string read_all();
  // The next line without its '\n' (a last line without one too); false at the end. Reads
  // through a buffer, so a file of any size goes line by line.
  bool read_line(std::string& line);

  Compression compression() const { return compression_; }
  const std::string& path() const { return path_; }
  uint64_t bytes_read() const { return produced_; }  // decompressed bytes handed out so far

 private:
  size_t fill();  // more compressed input; 0 at the file's end

  struct Codec;
  std::string path_;
  std::FILE* file_ = nullptr;
  Compression compression_ = Compression::kNone;
  std::vector<uint8_t> in_;  // compressed input not yet consumed: in_[in_pos_, in_end_)
  size_t in_pos_ = 0, in_end_ = 0;
  bool eof_ = false, finished_ = false;
  bool at_boundary_ = false;  // no byte of a gzip member or zstd frame is pending
  uint64_t produced_ = 0;
  std::string lines_;       // decompressed bytes read ahead for read_line: lines_[line_pos_, end)
  size_t line_pos_ = 0;
  std::unique_ptr<Codec> codec_;
};

// "name.jsonl.gz" -> ".jsonl": the extension under a .gz or .zst suffix, else the extension.
std::string inner_extension(const std::string& path);

}  // namespace shardtrain::io
