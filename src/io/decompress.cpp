// Page codecs: snappy and LZ4 blocks decoded here with every length and back-reference
// bounds-checked; gzip through zlib; zstd through libzstd.
#include "io/decompress.h"

#include <zlib.h>
#include <zstd.h>

#include <cstring>

#include "core/error.h"

namespace shardtrain::io {
namespace {

// Copies `length` bytes from `distance` bytes back in `out` to out[at, at + length); the two
// may overlap (a run), so byte by byte when they do.
void copy_back(std::span<uint8_t> out, size_t at, size_t distance, size_t length, const std::string& what,
               const char* codec) {
  ST_CHECK(distance > 0 && distance <= at, what, ": corrupt ", codec, " data (a back-reference ", distance,
           " bytes before output byte ", at, ")");
  ST_CHECK(length <= out.size() - at, what, ": corrupt ", codec, " data (decodes past the expected ", out.size(),
           " bytes)");
  uint8_t* dst = out.data() + at;
  const uint8_t* src = dst - distance;
  if (distance >= length) {
    std::memcpy(dst, src, length);
  } else {
    for (size_t i = 0; i < length; ++i) dst[i] = src[i];
  }
}

uint32_t load_le(const uint8_t* p, int bytes) {
  uint32_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint32_t{p[i]} << (8 * i);
  return v;
}

uint32_t load_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

void gzip_decompress(std::span<const uint8_t> in, std::span<uint8_t> out, const std::string& what) {
  z_stream z{};
  ST_CHECK(inflateInit2(&z, 15 + 32) == Z_OK, what, ": zlib initialisation failed");  // 15 + 32: gzip or zlib header
  z.next_in = const_cast<Bytef*>(in.data());
  z.next_out = out.data();
  size_t in_left = in.size(), out_left = out.size();
  int rc = Z_OK;
  // zlib counts in 32-bit units: feed at most 1 GiB at a time; concatenated gzip members decode
  // one after the other
  while (true) {
    const auto in_now = static_cast<uInt>(std::min<size_t>(in_left, size_t{1} << 30));
    const auto out_now = static_cast<uInt>(std::min<size_t>(out_left, size_t{1} << 30));
    z.avail_in = in_now;
    z.avail_out = out_now;
    rc = inflate(&z, Z_NO_FLUSH);
    in_left -= in_now - z.avail_in;
    out_left -= out_now - z.avail_out;
    if (rc == Z_STREAM_END) {
      if (in_left == 0 || out_left == 0) break;
      rc = inflateReset(&z);
      if (rc != Z_OK) break;
      continue;
    }
    if (rc != Z_OK) break;
    if (in_now - z.avail_in == 0 && out_now - z.avail_out == 0) {
      rc = Z_BUF_ERROR;  // no progress: truncated input or more output than expected
      break;
    }
  }
  const std::string message = z.msg != nullptr ? z.msg : "";
  inflateEnd(&z);
  ST_CHECK(rc == Z_STREAM_END || rc == Z_OK, what, ": corrupt GZIP data (zlib: ",
           message.empty() ? std::to_string(rc) : message, ")");
  ST_CHECK(out_left == 0 && rc == Z_STREAM_END, what, ": GZIP data decodes to ", out.size() - out_left,
           " bytes, expected ", out.size());
}

void zstd_decompress(std::span<const uint8_t> in, std::span<uint8_t> out, const std::string& what) {
  const size_t n = ZSTD_decompress(out.data(), out.size(), in.data(), in.size());
  ST_CHECK(!ZSTD_isError(n), what, ": corrupt ZSTD data (", ZSTD_getErrorName(n), ")");
  ST_CHECK(n == out.size(), what, ": ZSTD data decodes to ", n, " bytes, expected ", out.size());
}

// Hadoop's LZ4 framing: blocks of [4-byte big-endian decompressed size][4-byte big-endian
// compressed size][LZ4 block]. Writers that called it LZ4 also wrote bare blocks, so input
// whose framing does not add up is read as one bare block.
void lz4_hadoop_decompress(std::span<const uint8_t> in, std::span<uint8_t> out, const std::string& what) {
  size_t pos = 0, at = 0;
  bool framed = in.size() >= 8;
  while (framed && pos < in.size()) {
    if (in.size() - pos < 8) {
      framed = false;
      break;
    }
    const size_t raw = load_be32(in.data() + pos), packed = load_be32(in.data() + pos + 4);
    if (packed > in.size() - pos - 8 || raw > out.size() - at) {
      framed = false;
      break;
    }
    pos += 8 + packed;
    at += raw;
  }
  if (!framed || at != out.size()) {
    lz4_block_decompress(in, out, what);
    return;
  }
  pos = at = 0;
  while (pos < in.size()) {
    const size_t raw = load_be32(in.data() + pos), packed = load_be32(in.data() + pos + 4);
    lz4_block_decompress(in.subspan(pos + 8, packed), out.subspan(at, raw), what);
    pos += 8 + packed;
    at += raw;
  }
}

}  // namespace

std::string codec_name(int32_t codec) {
  switch (static_cast<Codec>(codec)) {
    case Codec::kUncompressed: return "UNCOMPRESSED";
    case Codec::kSnappy: return "SNAPPY";
    case Codec::kGzip: return "GZIP";
    case Codec::kLzo: return "LZO";
    case Codec::kBrotli: return "BROTLI";
    case Codec::kLz4Hadoop: return "LZ4";
    case Codec::kZstd: return "ZSTD";
    case Codec::kLz4Raw: return "LZ4_RAW";
  }
  return "codec " + std::to_string(codec);
}

void snappy_decompress(std::span<const uint8_t> in, std::span<uint8_t> out, const std::string& what) {
  size_t pos = 0;
  uint64_t declared = 0;
  for (int shift = 0;; shift += 7) {
    ST_CHECK(pos < in.size() && shift < 35, what, ": corrupt SNAPPY data (bad length prefix)");
    const uint8_t b = in[pos++];
    declared |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) break;
  }
  ST_CHECK(declared == out.size(), what, ": SNAPPY data declares ", declared, " bytes, expected ", out.size());
  size_t at = 0;
  while (pos < in.size()) {
    const uint8_t tag = in[pos++];
    size_t length = 0, distance = 0;
    switch (tag & 3) {
      case 0: {  // literal: length - 1 in the tag, or in the 1-4 bytes after it
        length = tag >> 2;
        if (length >= 60) {
          const int bytes = static_cast<int>(length) - 59;
          ST_CHECK(in.size() - pos >= static_cast<size_t>(bytes), what, ": corrupt SNAPPY data (truncated literal)");
          length = load_le(in.data() + pos, bytes);
          pos += bytes;
        }
        length += 1;
        ST_CHECK(length <= in.size() - pos && length <= out.size() - at, what,
                 ": corrupt SNAPPY data (a ", length, "-byte literal runs past the input or the expected ",
                 out.size(), " bytes)");
        std::memcpy(out.data() + at, in.data() + pos, length);
        pos += length;
        at += length;
        continue;
      }
      case 1:  // copy, 11-bit distance
        ST_CHECK(pos < in.size(), what, ": corrupt SNAPPY data (truncated copy)");
        length = 4 + ((tag >> 2) & 7);
        distance = (static_cast<size_t>(tag >> 5) << 8) | in[pos++];
        break;
      case 2:  // copy, 16-bit distance
        ST_CHECK(in.size() - pos >= 2, what, ": corrupt SNAPPY data (truncated copy)");
        length = 1 + (tag >> 2);
        distance = load_le(in.data() + pos, 2);
        pos += 2;
        break;
      default:  // copy, 32-bit distance
        ST_CHECK(in.size() - pos >= 4, what, ": corrupt SNAPPY data (truncated copy)");
        length = 1 + (tag >> 2);
        distance = load_le(in.data() + pos, 4);
        pos += 4;
        break;
    }
    copy_back(out, at, distance, length, what, "SNAPPY");
    at += length;
  }
  ST_CHECK(at == out.size(), what, ": SNAPPY data decodes to ", at, " bytes, expected ", out.size());
}

void lz4_block_decompress(std::span<const uint8_t> in, std::span<uint8_t> out, const std::string& what) {
  size_t pos = 0, at = 0;
  // a length of 15 continues in the following bytes, each adding up to 255
  auto extend = [&](size_t length) {
    if (length != 15) return length;
    while (true) {
      ST_CHECK(pos < in.size(), what, ": corrupt LZ4 data (truncated length)");
      const uint8_t b = in[pos++];
      length += b;
      ST_CHECK(length <= out.size(), what, ": corrupt LZ4 data (a length past the expected ", out.size(), " bytes)");
      if (b != 255) return length;
    }
  };
  while (pos < in.size()) {
    const uint8_t token = in[pos++];
    const size_t literals = extend(token >> 4);
    ST_CHECK(literals <= in.size() - pos && literals <= out.size() - at, what,
             ": corrupt LZ4 data (a literal run past the input or the expected ", out.size(), " bytes)");
    std::memcpy(out.data() + at, in.data() + pos, literals);
    pos += literals;
    at += literals;
    if (pos == in.size()) break;  // the last sequence has literals only
    ST_CHECK(in.size() - pos >= 2, what, ": corrupt LZ4 data (truncated match offset)");
    const size_t distance = load_le(in.data() + pos, 2);
    pos += 2;
    const size_t length = extend(token & 15) + 4;
    copy_back(out, at, distance, length, what, "LZ4");
    at += length;
  }
  ST_CHECK(at == out.size(), what, ": LZ4 data decodes to ", at, " bytes, expected ", out.size());
}

void decompress(Codec codec, std::span<const uint8_t> in, std::span<uint8_t> out, const std::string& what) {
  switch (codec) {
    case Codec::kUncompressed:
      ST_CHECK(in.size() == out.size(), what, ": uncompressed data of ", in.size(), " bytes, expected ", out.size());
      if (!in.empty()) std::memcpy(out.data(), in.data(), in.size());
      return;
    case Codec::kSnappy: snappy_decompress(in, out, what); return;
    case Codec::kGzip: gzip_decompress(in, out, what); return;
    case Codec::kZstd: zstd_decompress(in, out, what); return;
    case Codec::kLz4Raw: lz4_block_decompress(in, out, what); return;
    case Codec::kLz4Hadoop: lz4_hadoop_decompress(in, out, what); return;
    case Codec::kLzo:
    case Codec::kBrotli: break;
  }
  ST_THROW(what, ": compression ", codec_name(static_cast<int32_t>(codec)),
           " is not supported (shardtrain reads UNCOMPRESSED, SNAPPY, GZIP, ZSTD, LZ4 and LZ4_RAW); rewrite the file "
           "with one of those, e.g. pyarrow.parquet.write_table(table, path, compression=\"zstd\")");
}

}  // namespace shardtrain::io
