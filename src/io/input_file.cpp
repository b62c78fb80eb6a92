// InputFile: plain, gzip (zlib's inflate, members one after another) or zstd (a decompression
// stream over every frame) read through one buffer of compressed input.
#include "io/input_file.h"

#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace shardtrain::io {

struct InputFile::Codec {
  z_stream z{};
  bool z_open = false;
  ZSTD_DStream* zstd = nullptr;
  ~Codec() {
    if (z_open) inflateEnd(&z);
    if (zstd != nullptr) ZSTD_freeDStream(zstd);
  }
};

namespace {
constexpr size_t kBufferBytes = size_t{1} << 20;
}

InputFile::InputFile(const std::string& path) : path_(path), in_(kBufferBytes) {
  file_ = std::fopen(path.c_str(), "rb");
  ST_CHECK(file_ != nullptr, "cannot open `", path, "`: ", std::strerror(errno));
  fill();
  const uint8_t* p = in_.data();
  const size_t n = in_end_;
  codec_ = std::make_unique<Codec>();
  if (n >= 2 && p[0] == 0x1f && p[1] == 0x8b) {
    compression_ = Compression::kGzip;
    ST_CHECK(inflateInit2(&codec_->z, 15 + 16) == Z_OK, "`", path, "`: zlib initialisation failed");  // gzip only
    codec_->z_open = true;
  } else if (n >= 4 && p[0] == 0x28 && p[1] == 0xb5 && p[2] == 0x2f && p[3] == 0xfd) {
    compression_ = Compression::kZstd;
    codec_->zstd = ZSTD_createDStream();
    ST_CHECK(codec_->zstd != nullptr, "`", path, "`: zstd initialisation failed");
  }
}

InputFile::~InputFile() {
  if (file_ != nullptr) std::fclose(file_);
}

size_t InputFile::fill() {
  if (eof_) return 0;
  if (in_pos_ > 0) {  // keep what is left at the front
    std::memmove(in_.data(), in_.data() + in_pos_, in_end_ - in_pos_);
    in_end_ -= in_pos_;
    in_pos_ = 0;
  }
  const size_t got = std::fread(in_.data() + in_end_, 1, in_.size() - in_end_, file_);
  ST_CHECK(!std::ferror(file_), "error reading `", path_, "`: ", std::strerror(errno));
  in_end_ += got;
  if (got == 0 || std::feof(file_)) eof_ = true;
  return got;
}

size_t InputFile::read(char* out, size_t n) {
  if (n == 0 || finished_) return 0;
  if (compression_ == Compression::kNone) {
    if (in_pos_ == in_end_) {
      in_pos_ = in_end_ = 0;
      fill();
    }
    const size_t k = std::min(n, in_end_ - in_pos_);
    std::memcpy(out, in_.data() + in_pos_, k);
    in_pos_ += k;
    produced_ += k;
    if (k == 0) finished_ = true;
    return k;
  }
  // named only when something goes wrong: not built on every read
  auto where = [&] {
    return "`" + path_ + "` (" + (compression_ == Compression::kGzip ? "gzip" : "zstd") + ", after " +
           std::to_string(produced_) + " decompressed bytes)";
  };
  bool stalled = false;
  while (true) {
    if (in_pos_ == in_end_ || stalled) {
      const size_t more = fill();
      ST_CHECK(!stalled || more > 0, where(), ": no progress decompressing (corrupt data?)");
    }
    const size_t available = in_end_ - in_pos_;
    size_t consumed = 0, got = 0;
    bool frame_end = false;
    if (compression_ == Compression::kGzip) {
      z_stream& z = codec_->z;
      z.next_in = in_.data() + in_pos_;
      z.avail_in = static_cast<uInt>(available);
      z.next_out = reinterpret_cast<Bytef*>(out);
      z.avail_out = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
      const uInt out_before = z.avail_out;
      const int rc = inflate(&z, Z_NO_FLUSH);
      consumed = available - z.avail_in;
      got = out_before - z.avail_out;
      ST_CHECK(rc == Z_OK || rc == Z_STREAM_END || rc == Z_BUF_ERROR, where(), ": corrupt gzip data (",
               z.msg != nullptr ? z.msg : std::to_string(rc), ")");
      if (rc == Z_STREAM_END) {
        frame_end = true;
        ST_CHECK(inflateReset(&z) == Z_OK, where(), ": zlib reset failed");
        // zero bytes after a member (block padding) are not another member, as gzip(1) and
        // Python's gzip module read them
        in_pos_ += consumed;
        consumed = 0;
        while (true) {
          while (in_pos_ < in_end_ && in_[in_pos_] == 0) ++in_pos_;
          if (in_pos_ < in_end_ || eof_) break;
          fill();
        }
      }
    } else {
      ZSTD_inBuffer in{in_.data() + in_pos_, available, 0};
      ZSTD_outBuffer o{out, n, 0};
      const size_t rc = ZSTD_decompressStream(codec_->zstd, &o, &in);
      ST_CHECK(!ZSTD_isError(rc), where(), ": corrupt zstd data (", ZSTD_getErrorName(rc), ")");
      consumed = in.pos;
      got = o.pos;
      frame_end = rc == 0;
    }
    in_pos_ += consumed;
    produced_ += got;
    if (consumed > 0 || got > 0) at_boundary_ = false;
    if (frame_end) at_boundary_ = true;  // a member or frame ended: the file may end here
    if (got > 0) return got;
    if (eof_ && in_pos_ == in_end_) {
      ST_CHECK(at_boundary_, where(), ": the file ends inside compressed data (truncated?)");
      finished_ = true;
      return 0;
    }
    stalled = consumed == 0 && !frame_end;
  }
}

std::string InputFile::read_all() {
  std::string s;
  std::vector<char> buffer(kBufferBytes);
  while (const size_t k = read(buffer.data(), buffer.size())) s.append(buffer.data(), k);
  return s;
}

bool InputFile::read_line(std::string& line) {
  while (true) {
    const size_t end = lines_.find('\n', line_pos_);
    if (end != std::string::npos) {
      line.assign(lines_, line_pos_, end - line_pos_);
      line_pos_ = end + 1;
      return true;
    }
    lines_.erase(0, line_pos_);  // keep the partial line, read more after it
    line_pos_ = 0;
    const size_t old = lines_.size();
    lines_.resize(old + kBufferBytes);
    const size_t k = read(lines_.data() + old, kBufferBytes);
    lines_.resize(old + k);
    if (k == 0) {
      if (lines_.empty()) return false;
      line = std::move(lines_);
      lines_.clear();
      return true;
    }
  }
}

std::string inner_extension(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string ext = p.extension().string();
  if (ext == ".gz" || ext == ".zst") return p.stem().extension().string();
  return ext;
}

}  // namespace shardtrain::io
