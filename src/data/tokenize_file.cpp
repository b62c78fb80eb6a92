// Token file writer and reader, and the parallel corpus tokenizer. Input is read in blocks of
// whole lines (or Parquet row groups), the next one on a thread of its own while each block's
// documents are encoded in parallel into per-document vectors and written in input order, so
// output is identical for any thread count.
#include "data/tokenize_file.h"

#include <fcntl.h>
#include <omp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "data/corpus.h"
#include "data/parallel.h"
#include "data/utf8.h"
#include "io/input_file.h"
#include "io/parquet.h"

namespace shardtrain::data {
namespace {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian; add byte swapping for big-endian hosts");

template <typename T>
void put(unsigned char* bytes, size_t offset, T value) {
  std::memcpy(bytes + offset, &value, sizeof(T));
}

template <typename T>
T get(const unsigned char* bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes + offset, sizeof(T));
  return value;
}

std::array<unsigned char, kTokenFileHeaderBytes> encode_header(const TokenFileHeader& h) {
  std::array<unsigned char, kTokenFileHeaderBytes> bytes{};
  std::memcpy(bytes.data(), kTokenFileMagic, sizeof(kTokenFileMagic));
  put(bytes.data(), 8, h.version);
  put(bytes.data(), 12, h.token_bytes);
  put(bytes.data(), 16, h.token_count);
  put(bytes.data(), 24, h.document_count);
  put(bytes.data(), 32, h.vocab_size);
  put(bytes.data(), 40, h.eos_id);
  put(bytes.data(), 44, h.bos_id);
  return bytes;
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

// ---- TokenFileWriter ----

TokenFileWriter::TokenFileWriter(std::string path, int64_t vocab_size, int32_t eos_id, int32_t bos_id)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
  ST_CHECK(vocab_size > 0 && vocab_size <= (int64_t{1} << 32), "token file `", path_,
           "`: vocab size ", vocab_size, " outside [1, 2^32]");
  ST_CHECK(eos_id >= -1 && eos_id < vocab_size, "token file `", path_, "`: eos id ", eos_id,
           " outside [-1, vocab size ", vocab_size, ")");
  ST_CHECK(bos_id >= -1 && bos_id < vocab_size, "token file `", path_, "`: bos id ", bos_id,
           " outside [-1, vocab size ", vocab_size, ")");
  header_.vocab_size = vocab_size;
  header_.eos_id = eos_id;
  header_.bos_id = bos_id;
  header_.token_bytes = vocab_size <= 65536 ? 2 : 4;
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  ST_CHECK(file_ != nullptr, "cannot create `", tmp_path_, "`: ", errno_text());
  const auto bytes = encode_header(header_);  // counts are filled in by finish()
  ST_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), file_) == bytes.size(), "writing `",
           tmp_path_, "`: ", errno_text());
}

TokenFileWriter::~TokenFileWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(tmp_path_.c_str());
  }
}

void TokenFileWriter::write_ids(std::span<const int32_t> ids) {
  ST_CHECK(file_ != nullptr, "token file `", path_, "`: append after finish()");
  const size_t at = buffer_.size(), width = header_.token_bytes;
  buffer_.resize(at + ids.size() * width);
  unsigned char* out = buffer_.data() + at;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    ST_CHECK(id >= 0 && id < header_.vocab_size, "token file `", path_, "`: id ", id,
             " outside [0, vocab size ", header_.vocab_size, ")");
    if (width == 2) {
      put(out, 2 * i, static_cast<uint16_t>(id));
    } else {
      put(out, 4 * i, static_cast<uint32_t>(id));
    }
  }
  header_.token_count += ids.size();
  if (buffer_.size() >= kFlushBytes) flush();
}

void TokenFileWriter::flush() {
  if (buffer_.empty()) return;
  ST_CHECK(std::fwrite(buffer_.data(), 1, buffer_.size(), file_) == buffer_.size(), "writing `", tmp_path_, "`: ",
           errno_text());
  buffer_.clear();
}

void TokenFileWriter::append_document(std::span<const int32_t> ids) {
  if (header_.bos_id >= 0) write_ids(std::span<const int32_t>(&header_.bos_id, 1));
  write_ids(ids);
  if (header_.eos_id >= 0) write_ids(std::span<const int32_t>(&header_.eos_id, 1));
  ++header_.document_count;
}

void TokenFileWriter::finish() {
  ST_CHECK(file_ != nullptr, "token file `", path_, "`: finish() called twice");
  flush();
  const auto bytes = encode_header(header_);
  const bool ok = std::fseek(file_, 0, SEEK_SET) == 0 &&
                  std::fwrite(bytes.data(), 1, bytes.size(), file_) == bytes.size() &&
                  std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  const std::string error = ok ? std::string() : errno_text();
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok || !closed) {
    std::remove(tmp_path_.c_str());
    ST_THROW("writing `", tmp_path_, "`: ", ok ? errno_text() : error);
  }
  std::error_code ec;
  std::filesystem::rename(tmp_path_, path_, ec);
  ST_CHECK(!ec, "renaming `", tmp_path_, "` to `", path_, "`: ", ec.message());
}

// ---- TokenFile ----

bool is_token_file(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[sizeof(kTokenFileMagic)] = {};
  return in.read(magic, sizeof(magic)) && std::memcmp(magic, kTokenFileMagic, sizeof(magic)) == 0;
}

TokenFile::TokenFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ST_CHECK(fd >= 0, "cannot open token file `", path, "`: ", errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string error = errno_text();
    ::close(fd);
    ST_THROW("token file `", path, "`: fstat failed: ", error);
  }
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < kTokenFileHeaderBytes) {
    ::close(fd);
    ST_THROW("token file `", path, "`: ", file_bytes, " bytes, shorter than the ",
             kTokenFileHeaderBytes, "-byte header");
  }
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string map_error = map == MAP_FAILED ? errno_text() : std::string();
  ::close(fd);
  ST_CHECK(map != MAP_FAILED, "token file `", path, "`: mmap failed: ", map_error);
  data_ = static_cast<const unsigned char*>(map);
  mapped_bytes_ = file_bytes;

  // From here a failed check must unmap: the destructor does not run for a throwing constructor.
  try {
    const auto fail = [&](const auto&... what) { ST_THROW("token file `", path, "`: ", what...); };
    if (std::memcmp(data_, kTokenFileMagic, sizeof(kTokenFileMagic)) != 0) {
      fail("bad magic (expected \"STTOK\\0\\0\\0\"); not a shardtrain token file");
    }
    header_.version = get<uint32_t>(data_, 8);
    header_.token_bytes = get<uint32_t>(data_, 12);
    header_.token_count = get<uint64_t>(data_, 16);
    header_.document_count = get<uint64_t>(data_, 24);
    header_.vocab_size = get<int64_t>(data_, 32);
    header_.eos_id = get<int32_t>(data_, 40);
    header_.bos_id = header_.version == 1 ? -1 : get<int32_t>(data_, 44);
    if (header_.version != 1 && header_.version != 2) {
      fail("version ", header_.version, ", this build reads versions 1 and 2");
    }
    if (header_.token_bytes != 2 && header_.token_bytes != 4) {
      fail("token_bytes ", header_.token_bytes, ", expected 2 or 4");
    }
    const int64_t max_vocab = header_.token_bytes == 2 ? 65536 : int64_t{1} << 32;
    if (header_.vocab_size <= 0 || header_.vocab_size > max_vocab) {
      fail("vocab_size ", header_.vocab_size, " outside [1, ", max_vocab, "] for ",
           header_.token_bytes, "-byte ids");
    }
    if (header_.eos_id < -1 || header_.eos_id >= header_.vocab_size) {
      fail("eos_id ", header_.eos_id, " outside [-1, vocab_size ", header_.vocab_size, ")");
    }
    if (header_.bos_id < -1 || header_.bos_id >= header_.vocab_size) {
      fail("bos_id ", header_.bos_id, " outside [-1, vocab_size ", header_.vocab_size, ")");
    }
    const uint64_t max_count =
        (std::numeric_limits<uint64_t>::max() - kTokenFileHeaderBytes) / header_.token_bytes;
    if (header_.token_count > max_count ||
        kTokenFileHeaderBytes + header_.token_count * header_.token_bytes != file_bytes) {
      fail("header says ", header_.token_count, " tokens of ", header_.token_bytes,
           " bytes, which needs ", kTokenFileHeaderBytes, " + count * ", header_.token_bytes,
           " bytes, but the file has ", file_bytes, " (truncated or corrupt)");
    }
  } catch (...) {
    ::munmap(const_cast<unsigned char*>(data_), mapped_bytes_);
    throw;
  }
}

TokenFile::~TokenFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), mapped_bytes_);
}

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)),
      header_(other.header_),
      data_(std::exchange(other.data_, nullptr)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), mapped_bytes_);
    path_ = std::move(other.path_);
    header_ = other.header_;
    data_ = std::exchange(other.data_, nullptr);
    mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
  }
  return *this;
}

void TokenFile::read(uint64_t first, std::span<int32_t> out) const {
  ST_CHECK(first <= header_.token_count && out.size() <= header_.token_count - first,
           "token file `", path_, "`: reading ids [", first, ", ", first + out.size(),
           ") past its ", header_.token_count, " tokens");
  const unsigned char* ids = data_ + kTokenFileHeaderBytes;
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t index = first + i;
    const int64_t id = header_.token_bytes == 2 ? int64_t{get<uint16_t>(ids, 2 * index)}
                                                : int64_t{get<uint32_t>(ids, 4 * index)};
    ST_CHECK(id < header_.vocab_size, "token file `", path_, "`: id ", id, " at index ", index,
             " is not below vocab_size ", header_.vocab_size, " (corrupt file)");
    out[i] = static_cast<int32_t>(id);
  }
}

std::vector<int32_t> TokenFile::read_all() const {
  std::vector<int32_t> ids(header_.token_count);
  read(0, ids);
  return ids;
}

// ---- tokenize_file ----

namespace {

// The document in one input line (1-based `line_number`) for options.format; empty: skip it.
std::string_view document_text(std::string_view line, const TokenizeFileOptions& options,
                               const std::string& path, uint64_t line_number,
                               std::string& storage) {
  if (options.format == TextFormat::kParquet) return line;  // a row's text, as it is
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (options.format != TextFormat::kJsonl) return line;
  if (line.find_first_not_of(" \t") == std::string_view::npos) return {};
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    const std::string bad_utf8 = utf8_problem(line);
    ST_CHECK(bad_utf8.empty(), "`", path, "` line ", line_number, ": ", bad_utf8);
    ST_THROW("`", path, "` line ", line_number, ": malformed JSON: ", e.what());
  }
  ST_CHECK(j.is_object(), "`", path, "` line ", line_number, ": expected a JSON object");
  const auto it = j.find(options.jsonl_field);
  ST_CHECK(it != j.end(), "`", path, "` line ", line_number, ": no field `", options.jsonl_field,
           "`");
  ST_CHECK(it->is_string(), "`", path, "` line ", line_number, ": field `", options.jsonl_field,
           "` is ", it->type_name(), ", expected a string");
  storage = it->get<std::string>();
  return storage;
}

// Encodes the documents of `lines` (line numbers first_line, first_line + 1, ...) in parallel
// and writes them in order.
void tokenize_block(const Tokenizer& tokenizer, const std::vector<std::string_view>& lines,
                    uint64_t first_line, const TokenizeFileOptions& options, int threads,
                    const std::string& path, TokenFileWriter& writer, TokenizeFileStats& stats) {
  const auto n = static_cast<int64_t>(lines.size());
  std::vector<std::vector<int32_t>> ids(lines.size());
  std::vector<unsigned char> present(lines.size(), 0);
  parallel_for_lowest_error(n, threads, [&](int64_t i) {
    std::string storage;
    const std::string_view text = document_text(lines[i], options, path, first_line + i, storage);
    if (!text.empty()) {
      ids[i] = with_context(
          [&] {
            return std::string("tokenizing ") + (options.format == TextFormat::kParquet ? "row " : "line ") +
                   std::to_string(first_line + i) + " of `" + path + "`";
          },
          [&] { return tokenizer.encode(text); });
      present[i] = 1;
    }
  });
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!present[i]) continue;
    writer.append_document(ids[i]);
    ++stats.documents;
  }
}

}  // namespace

TextFormat detect_text_format(const std::string& path) {
  if (io::is_parquet_file(path)) return TextFormat::kParquet;
  const std::string ext = io::inner_extension(path);
  return ext == ".jsonl" || ext == ".json" ? TextFormat::kJsonl : TextFormat::kLines;
}

std::string token_file_name(const std::string& input_path) {
  std::string name = std::filesystem::path(input_path).filename().string();
  auto strip = [&](const char* suffix) {
    const std::string x(suffix);
    if (name.size() > x.size() && name.compare(name.size() - x.size(), x.size(), x) == 0) {
      name.resize(name.size() - x.size());
      return true;
    }
    return false;
  };
  if (!strip(".gz")) strip(".zst");
  for (const char* ext : {".parquet", ".jsonl", ".json", ".txt"})
    if (strip(ext)) break;
  return name + ".tok";
}

std::string source_name(const std::string& source) {
  std::filesystem::path p = std::filesystem::path(source).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "folder/"
  if (is_source_pattern(source)) p = p.parent_path();
  std::string name = p.filename().string();
  if (name.empty() || name == "." || name == "..") return "source";
  name = token_file_name(name);
  name.resize(name.size() - 4);  // the ".tok" token_file_name adds
  if (name.size() > 4 && name.ends_with(".tok")) name.resize(name.size() - 4);
  return name;
}

TokenizeFileStats tokenize_file(const Tokenizer& tokenizer, const std::string& input_path,
                                const std::string& output_path,
                                const TokenizeFileOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  ST_CHECK(options.block_bytes > 0, "tokenize_file: block_bytes must be > 0");
  ST_CHECK(options.format != TextFormat::kJsonl || !options.jsonl_field.empty(),
           "tokenize_file: jsonl_field must not be empty");
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();
  // the input opens (and a Parquet footer checks) before the output is started
  std::unique_ptr<io::ParquetFile> parquet;
  std::unique_ptr<io::InputFile> in;  // text, decompressed when it is a .gz or .zst file
  if (options.format == TextFormat::kParquet) parquet = std::make_unique<io::ParquetFile>(input_path);
  else in = std::make_unique<io::InputFile>(input_path);
  TokenFileWriter writer(output_path, tokenizer.vocab_size(), tokenizer.eos_id(), tokenizer.bos_id());
  TokenizeFileStats stats;

  if (parquet) {
    // a row group at a time: its texts, encoded in parallel, written in row order; the next
    // group is read (decompressed) on a thread of its own meanwhile
    const io::ParquetFile& file = *parquet;
    struct Group {
      std::vector<std::string> values;
      std::vector<uint8_t> present;
    };
    auto read_group = [&](int g) {
      Group out;
      file.read_strings(g, options.jsonl_field, out.values, out.present);
      return out;
    };
    std::vector<std::string_view> rows;
    uint64_t next_row = 1;
    auto last_report = std::chrono::steady_clock::now();
    Group group = file.num_row_groups() > 0 ? read_group(0) : Group();
    for (int g = 0; g < file.num_row_groups(); ++g) {
      std::future<Group> next;
      if (g + 1 < file.num_row_groups())
        next = std::async(options.read_ahead ? std::launch::async : std::launch::deferred, read_group, g + 1);
      rows.assign(group.values.size(), std::string_view());
      for (size_t i = 0; i < group.values.size(); ++i) {
        if (group.present[i]) rows[i] = group.values[i];
        stats.input_bytes += group.values[i].size();
      }
      tokenize_block(tokenizer, rows, next_row, options, threads, input_path, writer, stats);
      next_row += rows.size();
      const auto now = std::chrono::steady_clock::now();
      if (now - last_report > std::chrono::seconds(10) && g + 1 < file.num_row_groups()) {
        log::info(fmt::format("tokenize: row group {}/{} of `{}`: {} documents, {} tokens so far", g + 1,
                              file.num_row_groups(), input_path, stats.documents, writer.header().token_count));
        last_report = now;
      }
      if (next.valid()) group = next.get();
    }
  } else if (options.format == TextFormat::kWholeFile) {
    const std::string text = in->read_all();
    stats.input_bytes = text.size();
    if (!text.empty()) {
      writer.append_document(with_context([&] { return "tokenizing `" + input_path + "`"; },
                                          [&] { return tokenizer.encode(text); }));
      stats.documents = 1;
    }
  } else {
    // Blocks of whole lines. Each holds the previous block's unfinished last line, then
    // block_bytes more (read again while it holds no line end), cut after its last '\n'; at
    // the end of the file a block is all that is left. The next block is read (decompressed)
    // on a thread of its own while this one's documents are encoded.
    struct LineBlock {
      std::string text;
      size_t end = 0;  // the whole lines: [0, end)
      size_t bytes_read = 0;
      bool eof = false;
    };
    auto read_block = [&](std::string carry) {
      LineBlock b;
      b.text = std::move(carry);
      // what was carried has no '\n', so the search only ever finds new ones
      size_t last_newline = std::string::npos;
      while (!b.eof && last_newline == std::string::npos) {
        const size_t old = b.text.size();
        b.text.resize(old + options.block_bytes);
        size_t got = 0;  // a decompressing read may return less than asked: fill the block
        while (got < options.block_bytes) {
          const size_t k = in->read(b.text.data() + old + got, options.block_bytes - got);
          if (k == 0) {
            b.eof = true;
            break;
          }
          got += k;
        }
        b.text.resize(old + got);
        b.bytes_read += got;
        last_newline = b.text.rfind('\n');
      }
      b.end = b.eof ? b.text.size() : last_newline + 1;
      return b;
    };
    uint64_t next_line = 1;
    std::vector<std::string_view> lines;
    for (LineBlock block = read_block({});;) {
      stats.input_bytes += block.bytes_read;
      std::future<LineBlock> next;
      if (!block.eof)
        next = std::async(options.read_ahead ? std::launch::async : std::launch::deferred, read_block,
                          block.text.substr(block.end));
      lines.clear();
      for (size_t pos = 0; pos < block.end;) {
        size_t end = block.text.find('\n', pos);
        if (end == std::string::npos || end > block.end) end = block.end;
        lines.emplace_back(block.text.data() + pos, end - pos);
        pos = end + 1;
      }
      tokenize_block(tokenizer, lines, next_line, options, threads, input_path, writer, stats);
      next_line += lines.size();
      if (!next.valid()) break;
      block = next.get();
    }
  }
  writer.finish();
  stats.tokens = writer.header().token_count;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace shardtrain::data
