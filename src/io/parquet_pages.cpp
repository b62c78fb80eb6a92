// Parquet pages: one column chunk's page headers walked in order, each page decompressed and
// its levels (RLE / bit-packed hybrid) and values (plain, dictionary, delta, byte-stream split)
// decoded into a LeafData. Every count is bounded by the bytes that hold it before anything is
// allocated for it.
#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "io/decompress.h"
#include "io/parquet_internal.h"

namespace shardtrain::io::parquet {
namespace {

enum class PageType : int32_t { kData = 0, kIndex = 1, kDictionary = 2, kDataV2 = 3 };
enum class Encoding : int32_t {
  kPlain = 0, kPlainDictionary = 2, kRle = 3, kBitPacked = 4, kDeltaBinaryPacked = 5, kDeltaLengthByteArray = 6,
  kDeltaByteArray = 7, kRleDictionary = 8, kByteStreamSplit = 9,
};
// No writer puts this many entries in one page; the cap keeps a hostile header's count from
// allocating gigabytes of levels.
constexpr int64_t kMaxPageEntries = int64_t{1} << 26;

std::string encoding_name(int32_t e) {
  switch (static_cast<Encoding>(e)) {
    case Encoding::kPlain: return "PLAIN";
    case Encoding::kPlainDictionary: return "PLAIN_DICTIONARY";
    case Encoding::kRle: return "RLE";
    case Encoding::kBitPacked: return "BIT_PACKED";
    case Encoding::kDeltaBinaryPacked: return "DELTA_BINARY_PACKED";
    case Encoding::kDeltaLengthByteArray: return "DELTA_LENGTH_BYTE_ARRAY";
    case Encoding::kDeltaByteArray: return "DELTA_BYTE_ARRAY";
    case Encoding::kRleDictionary: return "RLE_DICTIONARY";
    case Encoding::kByteStreamSplit: return "BYTE_STREAM_SPLIT";
  }
  return "encoding " + std::to_string(e);
}

struct PageHeader {
  int32_t type = -1;
  int32_t uncompressed = -1, compressed = -1;
  int32_t num_values = -1;
  int32_t encoding = 0;
  int32_t def_bytes = 0, rep_bytes = 0;  // v2: the levels' sizes, stored uncompressed before the values
  bool values_compressed = true;          // v2
};

PageHeader read_page_header(ThriftReader& r) {
  PageHeader h;
  auto sub = [&](Wire w, const char* name, auto&& field) {
    r.expect(w, Wire::kStruct, name);
    r.read_struct(field);
  };
  r.read_struct([&](int16_t id, Wire w) {
    switch (id) {
      case 1: h.type = r.i32(w); break;
      case 2: h.uncompressed = r.i32(w); break;
      case 3: h.compressed = r.i32(w); break;
      case 5:  // DataPageHeader and DictionaryPageHeader both begin num_values, encoding
      case 7:
        sub(w, id == 5 ? "data_page_header" : "dictionary_page_header", [&](int16_t f, Wire fw) {
          if (f == 1) h.num_values = r.i32(fw);
          else if (f == 2) h.encoding = r.i32(fw);
          else r.skip(fw);
        });
        break;
      case 8:
        sub(w, "data_page_header_v2", [&](int16_t f, Wire fw) {
          switch (f) {
            case 1: h.num_values = r.i32(fw); break;
            case 4: h.encoding = r.i32(fw); break;
            case 5: h.def_bytes = r.i32(fw); break;
            case 6: h.rep_bytes = r.i32(fw); break;
            case 7: h.values_compressed = r.boolean(fw); break;
            default: r.skip(fw);
          }
        });
        break;
      default: r.skip(w);
    }
  });
  return h;
}

int bit_width(int max_level) {
  int w = 0;
  while ((1 << w) <= max_level) ++w;
  return w;
}

uint64_t read_varint(std::span<const uint8_t> in, size_t& pos, const std::string& what) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    ST_CHECK(pos < in.size(), what, ": data ends inside a varint");
    const uint8_t b = in[pos++];
    v |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) return v;
  }
  ST_THROW(what, ": a varint longer than 10 bytes");
}

int64_t read_zigzag(std::span<const uint8_t> in, size_t& pos, const std::string& what) {
  const uint64_t v = read_varint(in, pos, what);
  return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
}

// `width` bits (at most 64) starting at bit `bit` of p, least significant bit first; the
// caller has checked that the bytes exist.
uint64_t unpack(const uint8_t* p, uint64_t bit, int width) {
  uint64_t v = 0;
  int got = 0;
  while (got < width) {
    const int shift = static_cast<int>(bit & 7);
    const int take = std::min(8 - shift, width - got);
    v |= static_cast<uint64_t>((p[bit >> 3] >> shift) & ((1u << take) - 1)) << got;
    got += take;
    bit += static_cast<uint64_t>(take);
  }
  return v;
}

uint64_t load_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// `count` values of `width` bits from RLE / bit-packed hybrid runs in `in`; returns the bytes
// read. A last bit-packed run may stop short of its declared groups.
size_t decode_hybrid(std::span<const uint8_t> in, int width, size_t count, std::vector<uint32_t>& out,
                     const std::string& what) {
  ST_CHECK(width >= 0 && width <= 32, what, ": bit width ", width, " (at most 32)");
  out.clear();
  out.reserve(count);
  size_t pos = 0;
  while (out.size() < count) {
    const uint64_t header = read_varint(in, pos, what);
    const size_t wanted = count - out.size();
    if (header & 1) {
      const uint64_t groups = std::min<uint64_t>(header >> 1, count);  // more than `count` are never read
      const uint64_t bytes = groups * static_cast<uint64_t>(width);
      const size_t available = static_cast<size_t>(std::min<uint64_t>(bytes, in.size() - pos));
      const uint64_t usable = width == 0 ? groups * 8 : available * 8 / static_cast<uint64_t>(width);
      const size_t take = static_cast<size_t>(std::min<uint64_t>(std::min<uint64_t>(groups * 8, usable), wanted));
      ST_CHECK(take == std::min<uint64_t>(groups * 8, wanted), what, ": a bit-packed run ends past the data");
      for (size_t i = 0; i < take; ++i)
        out.push_back(static_cast<uint32_t>(unpack(in.data() + pos, i * static_cast<uint64_t>(width), width)));
      pos += available;
    } else {
      const int value_bytes = (width + 7) / 8;
      ST_CHECK(in.size() - pos >= static_cast<size_t>(value_bytes), what, ": an RLE run ends past the data");
      const uint64_t value = load_le(in.data() + pos, value_bytes);
      pos += static_cast<size_t>(value_bytes);
      ST_CHECK(width == 32 || value < (uint64_t{1} << width), what, ": RLE value ", value, " wider than ", width,
               " bits");
      out.insert(out.end(), static_cast<size_t>(std::min<uint64_t>(header >> 1, wanted)),
                 static_cast<uint32_t>(value));
    }
  }
  return pos;
}

// Levels of `count` entries at most `max_level`.
void decode_levels(std::span<const uint8_t> in, int max_level, size_t count, std::vector<uint8_t>& out,
                   const std::string& what) {
  std::vector<uint32_t> v;
  decode_hybrid(in, bit_width(max_level), count, v, what);
  for (const uint32_t level : v)
    ST_CHECK(level <= static_cast<uint32_t>(max_level), what, ": level ", level, " above the column's maximum ",
             max_level);
  out.insert(out.end(), v.begin(), v.end());
}

size_t plain_size(Physical p, int32_t type_length) {
  switch (p) {
    case Physical::kInt32:
    case Physical::kFloat: return 4;
    case Physical::kInt64:
    case Physical::kDouble: return 8;
    case Physical::kFixedLenByteArray: return static_cast<size_t>(type_length);
    default: return 0;
  }
}

void append_bytes(LeafData& d, const uint8_t* p, size_t n) {
  d.bytes.append(reinterpret_cast<const char*>(p), n);
  d.ends.push_back(d.bytes.size());
}

// A fixed-size little-endian value of p's physical type.
void append_fixed(LeafData& d, const uint8_t* p, int32_t type_length) {
  switch (d.physical) {
    case Physical::kInt32: d.ints.push_back(static_cast<int32_t>(load_le(p, 4))); break;
    case Physical::kInt64: d.ints.push_back(static_cast<int64_t>(load_le(p, 8))); break;
    case Physical::kFloat: {
      float f;
      std::memcpy(&f, p, 4);
      d.reals.push_back(f);
      break;
    }
    case Physical::kDouble: {
      double f;
      std::memcpy(&f, p, 8);
      d.reals.push_back(f);
      break;
    }
    default: append_bytes(d, p, static_cast<size_t>(type_length));
  }
}

// PLAIN values; returns the bytes read.
size_t decode_plain(std::span<const uint8_t> in, size_t count, int32_t type_length, LeafData& d,
                    const std::string& what) {
  switch (d.physical) {
    case Physical::kBoolean:
      ST_CHECK(count <= in.size() * 8, what, ": ", count, " PLAIN booleans in ", in.size(), " bytes");
      for (size_t i = 0; i < count; ++i) d.ints.push_back((in[i / 8] >> (i % 8)) & 1);
      return (count + 7) / 8;
    case Physical::kByteArray: {
      ST_CHECK(count <= in.size() / 4, what, ": ", count, " PLAIN byte arrays in ", in.size(), " bytes");
      size_t pos = 0;
      for (size_t i = 0; i < count; ++i) {
        ST_CHECK(in.size() - pos >= 4, what, ": PLAIN byte array ", i, " of ", count, " starts past the data");
        const size_t n = load_le(in.data() + pos, 4);
        pos += 4;
        ST_CHECK(n <= in.size() - pos, what, ": PLAIN byte array ", i, " of ", n, " bytes runs past the data");
        append_bytes(d, in.data() + pos, n);
        pos += n;
      }
      return pos;
    }
    case Physical::kInt96: ST_THROW(what, ": INT96 values (legacy timestamps) are not supported");
    default: {
      const size_t size = plain_size(d.physical, type_length);
      ST_CHECK(size > 0 && count <= in.size() / size, what, ": ", count, " PLAIN values of ", size, " bytes in ",
               in.size(), " bytes");
      for (size_t i = 0; i < count; ++i) append_fixed(d, in.data() + i * size, type_length);
      return count * size;
    }
  }
}

// DELTA_BINARY_PACKED integers: a header (block size, miniblocks per block, value count, first
// value), then blocks of a minimum delta, one bit width per miniblock and the packed deltas.
// Exactly `count` values are expected; returns the bytes read.
size_t decode_delta_binary(std::span<const uint8_t> in, size_t count, std::vector<int64_t>& out,
                           const std::string& what) {
  size_t pos = 0;
  const uint64_t block = read_varint(in, pos, what), miniblocks = read_varint(in, pos, what);
  const uint64_t total = read_varint(in, pos, what);
  int64_t value = read_zigzag(in, pos, what);
  ST_CHECK(block > 0 && block % 128 == 0 && block <= (uint64_t{1} << 20) && miniblocks > 0 &&
               block % miniblocks == 0 && (block / miniblocks) % 32 == 0,
           what, ": DELTA_BINARY_PACKED block of ", block, " values in ", miniblocks, " miniblocks");
  ST_CHECK(total == count, what, ": ", total, " DELTA_BINARY_PACKED values for ", count, " entries");
  const uint64_t per = block / miniblocks;
  out.clear();
  out.reserve(static_cast<size_t>(total));
  if (total > 0) out.push_back(value);
  while (out.size() < total) {
    const int64_t min_delta = read_zigzag(in, pos, what);
    ST_CHECK(in.size() - pos >= miniblocks, what, ": DELTA_BINARY_PACKED bit widths past the data");
    const uint8_t* widths = in.data() + pos;
    pos += static_cast<size_t>(miniblocks);
    for (uint64_t m = 0; m < miniblocks && out.size() < total; ++m) {
      const int width = widths[m];
      ST_CHECK(width <= 64, what, ": DELTA_BINARY_PACKED bit width ", width);
      const uint64_t bytes = per * static_cast<uint64_t>(width) / 8;
      ST_CHECK(in.size() - pos >= bytes, what, ": a DELTA_BINARY_PACKED miniblock runs past the data");
      for (uint64_t i = 0; i < per && out.size() < total; ++i) {
        // two's-complement wrap-around, as the encoder's
        const uint64_t delta = static_cast<uint64_t>(min_delta) + unpack(in.data() + pos, i * width, width);
        value = static_cast<int64_t>(static_cast<uint64_t>(value) + delta);
        out.push_back(value);
      }
      pos += static_cast<size_t>(bytes);
    }
  }
  return pos;
}

// DELTA_LENGTH_BYTE_ARRAY: the lengths delta-encoded, then the bytes back to back.
size_t decode_delta_length(std::span<const uint8_t> in, size_t count, LeafData& d, const std::string& what) {
  std::vector<int64_t> lengths;
  size_t pos = decode_delta_binary(in, count, lengths, what);
  for (const int64_t n : lengths) {
    ST_CHECK(n >= 0 && static_cast<uint64_t>(n) <= in.size() - pos, what, ": a byte array of ", n,
             " bytes runs past the data");
    append_bytes(d, in.data() + pos, static_cast<size_t>(n));
    pos += static_cast<size_t>(n);
  }
  return pos;
}

// DELTA_BYTE_ARRAY: each value the previous one's first prefix[i] bytes and a suffix.
void decode_delta_byte_array(std::span<const uint8_t> in, size_t count, LeafData& d, const std::string& what) {
  std::vector<int64_t> prefixes;
  const size_t pos = decode_delta_binary(in, count, prefixes, what);
  LeafData suffixes;
  suffixes.physical = Physical::kByteArray;
  decode_delta_length(in.subspan(pos), count, suffixes, what);
  std::string previous;
  for (size_t i = 0; i < count; ++i) {
    ST_CHECK(prefixes[i] >= 0 && static_cast<uint64_t>(prefixes[i]) <= previous.size(), what, ": value ", i,
             " takes a prefix of ", prefixes[i], " bytes from a ", previous.size(), "-byte value");
    const size_t begin = i == 0 ? 0 : suffixes.ends[i - 1];
    previous.resize(static_cast<size_t>(prefixes[i]));
    previous.append(suffixes.bytes, begin, suffixes.ends[i] - begin);
    append_bytes(d, reinterpret_cast<const uint8_t*>(previous.data()), previous.size());
  }
}

// BYTE_STREAM_SPLIT: byte k of value i at in[k * count + i].
void decode_byte_stream_split(std::span<const uint8_t> in, size_t count, int32_t type_length, LeafData& d,
                              const std::string& what) {
  const size_t size = plain_size(d.physical, type_length);
  ST_CHECK(size > 0, what, ": BYTE_STREAM_SPLIT does not apply to this column's type");
  ST_CHECK(count <= in.size() / size, what, ": ", count, " BYTE_STREAM_SPLIT values of ", size, " bytes in ",
           in.size(), " bytes");
  std::vector<uint8_t> value(size);
  for (size_t i = 0; i < count; ++i) {
    for (size_t k = 0; k < size; ++k) value[k] = in[k * count + i];
    append_fixed(d, value.data(), type_length);
  }
}

// Copies dictionary entry `index` onto the end of d.
void append_entry(LeafData& d, const LeafData& dict, size_t index) {
  if (dict.physical == Physical::kByteArray || dict.physical == Physical::kFixedLenByteArray) {
    const size_t begin = index == 0 ? 0 : dict.ends[index - 1];
    append_bytes(d, reinterpret_cast<const uint8_t*>(dict.bytes.data()) + begin, dict.ends[index] - begin);
  } else if (dict.physical == Physical::kFloat || dict.physical == Physical::kDouble) {
    d.reals.push_back(dict.reals[index]);
  } else {
    d.ints.push_back(dict.ints[index]);
  }
}

void decode_values(std::span<const uint8_t> in, int32_t encoding, size_t count, int32_t type_length,
                   const LeafData* dict, LeafData& d, const std::string& what) {
  switch (static_cast<Encoding>(encoding)) {
    case Encoding::kPlain: decode_plain(in, count, type_length, d, what); return;
    case Encoding::kPlainDictionary:
    case Encoding::kRleDictionary: {
      ST_CHECK(dict != nullptr, what, ": dictionary-encoded values without a dictionary page");
      if (count == 0) return;
      ST_CHECK(!in.empty(), what, ": dictionary indices without their bit width");
      std::vector<uint32_t> indices;
      decode_hybrid(in.subspan(1), in[0], count, indices, what);
      const size_t n = dict->values();
      for (const uint32_t i : indices) {
        ST_CHECK(i < n, what, ": dictionary index ", i, " past the dictionary's ", n, " entries");
        append_entry(d, *dict, i);
      }
      return;
    }
    case Encoding::kRle: {
      ST_CHECK(d.physical == Physical::kBoolean, what, ": RLE values in a column that is not boolean");
      ST_CHECK(in.size() >= 4, what, ": RLE booleans without their length");
      const size_t n = load_le(in.data(), 4);
      ST_CHECK(n <= in.size() - 4, what, ": RLE booleans of ", n, " bytes past the data");
      std::vector<uint32_t> bits;
      decode_hybrid(in.subspan(4, n), 1, count, bits, what);
      d.ints.insert(d.ints.end(), bits.begin(), bits.end());
      return;
    }
    case Encoding::kDeltaBinaryPacked: {
      ST_CHECK(d.physical == Physical::kInt32 || d.physical == Physical::kInt64, what,
               ": DELTA_BINARY_PACKED values in a column that is not INT32 or INT64");
      std::vector<int64_t> v;
      decode_delta_binary(in, count, v, what);
      for (const int64_t x : v) d.ints.push_back(d.physical == Physical::kInt32 ? static_cast<int32_t>(x) : x);
      return;
    }
    case Encoding::kDeltaLengthByteArray:
      ST_CHECK(d.physical == Physical::kByteArray, what, ": DELTA_LENGTH_BYTE_ARRAY in a column that is not BYTE_ARRAY");
      decode_delta_length(in, count, d, what);
      return;
    case Encoding::kDeltaByteArray:
      ST_CHECK(d.physical == Physical::kByteArray || d.physical == Physical::kFixedLenByteArray, what,
               ": DELTA_BYTE_ARRAY in a column that holds no byte arrays");
      decode_delta_byte_array(in, count, d, what);
      return;
    case Encoding::kByteStreamSplit: decode_byte_stream_split(in, count, type_length, d, what); return;
    default: break;
  }
  ST_THROW(what, ": values encoded as ", encoding_name(encoding), " are not supported");
}

// Whether `size` is a size compressed data `in` of `codec` could decode to, checked before
// anything of that size is allocated.
void check_plausible_size(Codec codec, std::span<const uint8_t> in, size_t size, const std::string& what) {
  size_t most = size_t{1} << 30;
  switch (codec) {
    case Codec::kUncompressed: most = in.size(); break;
    case Codec::kSnappy: most = in.size() * 22 + 64; break;  // a 2-byte copy yields at most 64 bytes
    case Codec::kGzip: most = in.size() * 1032 + 64; break;  // deflate's largest ratio
    case Codec::kLz4Raw:
    case Codec::kLz4Hadoop: most = in.size() * 256 + 64; break;
    case Codec::kZstd: {
      // a frame that states its size (writers' usual single frame) bounds it; else 1 GiB
      const unsigned long long first = ZSTD_getFrameContentSize(in.data(), in.size());
      if (first == size) most = size;
      break;
    }
    default: break;
  }
  ST_CHECK(size <= most, what, ": a page of ", in.size(), " ", codec_name(static_cast<int32_t>(codec)),
           " bytes cannot hold the ", size, " bytes its header declares");
}

std::vector<uint8_t> decompressed(Codec codec, std::span<const uint8_t> in, int64_t size, const std::string& what) {
  ST_CHECK(size >= 0, what, ": negative uncompressed size ", size);
  check_plausible_size(codec, in, static_cast<size_t>(size), what);
  std::vector<uint8_t> out(static_cast<size_t>(size));
  decompress(codec, in, out, what);
  return out;
}

}  // namespace

size_t LeafData::values() const {
  if (physical == Physical::kByteArray || physical == Physical::kFixedLenByteArray) return ends.size();
  if (physical == Physical::kFloat || physical == Physical::kDouble) return reals.size();
  return ints.size();
}

LeafData read_column(const FileMeta& meta, std::span<const uint8_t> file, int group, int leaf,
                     const std::string& where) {
  const ColumnChunk& cc = meta.row_groups.at(static_cast<size_t>(group)).columns.at(static_cast<size_t>(leaf));
  const SchemaNode& node = meta.schema[static_cast<size_t>(meta.leaves[static_cast<size_t>(leaf)])];
  const std::string column = where + ": row group " + std::to_string(group) + ", column `" + node.path + "`";
  const int64_t start = cc.dictionary_page_offset > 0 ? cc.dictionary_page_offset : cc.data_page_offset;
  const std::span<const uint8_t> chunk = file.subspan(static_cast<size_t>(start), static_cast<size_t>(cc.total_compressed));
  const auto codec = static_cast<Codec>(cc.codec);

  LeafData d;
  d.physical = node.physical;
  LeafData dict;
  dict.physical = node.physical;
  bool have_dict = false;
  size_t pos = 0, entries = 0;
  const auto total = static_cast<size_t>(cc.num_values);
  while (entries < total) {
    const std::string page = column + ", page at byte " + std::to_string(static_cast<size_t>(start) + pos);
    ST_CHECK(pos < chunk.size(), column, ": the column chunk's ", chunk.size(), " bytes end after ", entries, " of ",
             total, " values");
    ThriftReader r(chunk.subspan(pos), page + " (header)");
    const PageHeader h = read_page_header(r);
    pos += r.position();
    ST_CHECK(h.compressed >= 0 && static_cast<size_t>(h.compressed) <= chunk.size() - pos, page, ": ", h.compressed,
             " bytes past the column chunk's end");
    const std::span<const uint8_t> body = chunk.subspan(pos, static_cast<size_t>(h.compressed));
    pos += static_cast<size_t>(h.compressed);
    const auto type = static_cast<PageType>(h.type);
    if (type == PageType::kDictionary) {
      ST_CHECK(!have_dict && entries == 0, page, ": a dictionary page after ",
               have_dict ? "another dictionary page" : "data pages");
      ST_CHECK(h.encoding == static_cast<int32_t>(Encoding::kPlain) ||
                   h.encoding == static_cast<int32_t>(Encoding::kPlainDictionary),
               page, ": a dictionary encoded as ", encoding_name(h.encoding), " (expected PLAIN)");
      ST_CHECK(h.num_values >= 0 && h.num_values <= kMaxPageEntries, page, ": ", h.num_values, " dictionary entries");
      const std::vector<uint8_t> bytes = decompressed(codec, body, h.uncompressed, page);
      decode_plain(bytes, static_cast<size_t>(h.num_values), node.type_length, dict, page);
      have_dict = true;
      continue;
    }
    if (type != PageType::kData && type != PageType::kDataV2) continue;  // index pages and unknown kinds
    ST_CHECK(h.num_values >= 0 && static_cast<size_t>(h.num_values) <= total - entries &&
                 h.num_values <= kMaxPageEntries,
             page, ": ", h.num_values, " values, but ", total - entries, " of the column chunk's ", total, " are left");
    const auto n = static_cast<size_t>(h.num_values);
    std::vector<uint8_t> storage;
    std::span<const uint8_t> values;
    if (type == PageType::kData) {
      storage = decompressed(codec, body, h.uncompressed, page);
      std::span<const uint8_t> rest(storage);
      auto levels = [&](int max_level, std::vector<uint8_t>& out, const char* kind) {
        if (max_level == 0) return;
        ST_CHECK(rest.size() >= 4, page, ": no ", kind, " levels");
        const size_t bytes = load_le(rest.data(), 4);
        ST_CHECK(bytes <= rest.size() - 4, page, ": ", kind, " levels of ", bytes, " bytes past the page");
        decode_levels(rest.subspan(4, bytes), max_level, n, out, page + " (" + kind + " levels)");
        rest = rest.subspan(4 + bytes);
      };
      levels(node.max_rep, d.rep, "repetition");
      levels(node.max_def, d.def, "definition");
      values = rest;
    } else {
      ST_CHECK(h.rep_bytes >= 0 && h.def_bytes >= 0 && h.rep_bytes <= h.compressed - h.def_bytes, page,
               ": levels of ", h.rep_bytes, " + ", h.def_bytes, " bytes in a ", h.compressed, "-byte page");
      const auto rep_bytes = static_cast<size_t>(h.rep_bytes), def_bytes = static_cast<size_t>(h.def_bytes);
      if (node.max_rep > 0)
        decode_levels(body.subspan(0, rep_bytes), node.max_rep, n, d.rep, page + " (repetition levels)");
      if (node.max_def > 0)
        decode_levels(body.subspan(rep_bytes, def_bytes), node.max_def, n, d.def, page + " (definition levels)");
      const std::span<const uint8_t> packed = body.subspan(rep_bytes + def_bytes);
      if (h.values_compressed && codec != Codec::kUncompressed) {
        storage = decompressed(codec, packed, int64_t{h.uncompressed} - h.rep_bytes - h.def_bytes, page);
        values = storage;
      } else {
        values = packed;
      }
    }
    size_t present = n;
    if (node.max_def > 0)
      present = static_cast<size_t>(std::count(d.def.end() - static_cast<std::ptrdiff_t>(n), d.def.end(),
                                               static_cast<uint8_t>(node.max_def)));
    decode_values(values, h.encoding, present, node.type_length, have_dict ? &dict : nullptr, d, page);
    entries += n;
  }
  const size_t present = d.def.empty() ? entries
                                       : static_cast<size_t>(std::count(d.def.begin(), d.def.end(),
                                                                        static_cast<uint8_t>(node.max_def)));
  ST_ASSERT(d.values() == present, column, ": ", d.values(), " values decoded for ", present, " present entries");
  d.entries = entries;
  return d;
}

}  // namespace shardtrain::io::parquet
