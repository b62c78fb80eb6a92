// safetensors header validation, memory mapping and converting range reads.
#include "io/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "io/checksum.h"

namespace shardtrain::io {
namespace {

constexpr int64_t kMaxHeaderBytes = int64_t{100} << 20;

struct DTypeEntry {
  const char* name;
  size_t size;
  bool is_float;
};
constexpr DTypeEntry kDTypes[] = {{"BOOL", 1, false}, {"U8", 1, false},  {"I8", 1, false},   {"U16", 2, false},
                                  {"I16", 2, false},  {"U32", 4, false}, {"I32", 4, false},  {"U64", 8, false},
                                  {"I64", 8, false},  {"F16", 2, true},  {"BF16", 2, true},  {"F32", 4, true},
                                  {"F64", 8, true},   {"F8_E4M3", 1, true}, {"F8_E5M2", 1, true}};

const DTypeEntry* find_dtype(const std::string& name) {
  for (const DTypeEntry& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

// a * b, or false on overflow past INT64_MAX
bool checked_mul(int64_t a, int64_t b, int64_t& out) {
  if (a != 0 && b > INT64_MAX / a) return false;
  out = a * b;
  return true;
}

double load_float(const uint8_t* p, const std::string& dt) {
  if (dt == "F32") {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  if (dt == "F64") {
    double d;
    std::memcpy(&d, p, 8);
    return d;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dt == "BF16" ? bf16_to_float(BFloat16{h}) : f16_to_float(Float16{h});
}

int64_t load_int(const uint8_t* p, const std::string& dt) {
  if (dt == "U8" || dt == "BOOL") return *p;
  if (dt == "I8") return static_cast<int8_t>(*p);
  if (dt == "U16" || dt == "I16") {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return dt == "I16" ? int64_t{static_cast<int16_t>(v)} : int64_t{v};
  }
  if (dt == "U32" || dt == "I32") {
    uint32_t v;
    std::memcpy(&v, p, 4);
    // both arms int64_t: a ternary of int32_t and uint32_t would be unsigned
    return dt == "I32" ? int64_t{static_cast<int32_t>(v)} : int64_t{v};
  }
  int64_t v;
  std::memcpy(&v, p, 8);
  return v;  // U64 values above INT64_MAX wrap; no model tensor stores them
}

// Decoders of a file's float element, and stores into an output element.
struct DecodeF32 {
  static constexpr size_t kSize = 4;
  static double get(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
};
struct DecodeF64 {
  static constexpr size_t kSize = 8;
  static double get(const uint8_t* p) {
    double d;
    std::memcpy(&d, p, 8);
    return d;
  }
};
struct DecodeBF16 {
  static constexpr size_t kSize = 2;
  static double get(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return bf16_to_float(BFloat16{h});
  }
};
struct DecodeF16 {
  static constexpr size_t kSize = 2;
  static double get(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return f16_to_float(Float16{h});
  }
};

template <typename T>
void store_float(T* out, double v) {
  if constexpr (std::is_same_v<T, float>) *out = static_cast<float>(v);
  else if constexpr (std::is_same_v<T, double>) *out = v;
  else if constexpr (std::is_same_v<T, BFloat16>) *out = float_to_bf16(static_cast<float>(v));
  else *out = float_to_f16(static_cast<float>(v));
}

// Converts n elements, a chunk per thread for large ranges; returns the index of the first
// element that is not finite (the elements from it on in its chunk are left unwritten), or -1.
template <typename Decode, typename T>
int64_t convert_range(const uint8_t* src, T* out, int64_t n) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  int64_t first_bad = std::numeric_limits<int64_t>::max();
#pragma omp parallel for schedule(static) reduction(min : first_bad) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; ++i) {
      const double v = Decode::get(src + static_cast<size_t>(i) * Decode::kSize);
      if (!std::isfinite(v)) {
        first_bad = std::min(first_bad, i);
        break;
      }
      store_float(out + i, v);
    }
  }
  return first_bad == std::numeric_limits<int64_t>::max() ? -1 : first_bad;
}

template <typename Decode>
int64_t convert_into(const uint8_t* src, Tensor& out, int64_t n) {
  switch (out.dtype()) {
    case DType::kF32: return convert_range<Decode>(src, out.data<float>(), n);
    case DType::kF64: return convert_range<Decode>(src, out.data<double>(), n);
    case DType::kBF16: return convert_range<Decode>(src, out.data<BFloat16>(), n);
    case DType::kF16: return convert_range<Decode>(src, out.data<Float16>(), n);
    default: ST_THROW("safetensors: cannot convert floats into ", dtype_name(out.dtype()));
  }
}

int64_t convert_floats(const uint8_t* src, const std::string& dt, Tensor& out, int64_t n) {
  if (dt == "F32") return convert_into<DecodeF32>(src, out, n);
  if (dt == "F64") return convert_into<DecodeF64>(src, out, n);
  if (dt == "BF16") return convert_into<DecodeBF16>(src, out, n);
  return convert_into<DecodeF16>(src, out, n);
}

}  // namespace

std::vector<TensorInfo> parse_safetensors_header(std::string_view json, int64_t data_bytes, const std::string& src,
                                                 std::map<std::string, std::string>* metadata) {
  const nlohmann::json h = nlohmann::json::parse(json.begin(), json.end(), nullptr, false);
  ST_CHECK(!h.is_discarded(), src, ": header is not valid JSON");
  ST_CHECK(h.is_object(), src, ": header must be a JSON object, found ", h.type_name());
  std::vector<TensorInfo> out;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& e = it.value();
    if (name == "__metadata__") {
      ST_CHECK(e.is_object(), src, ": `__metadata__` must be an object of strings");
      for (auto m = e.begin(); m != e.end(); ++m) {
        ST_CHECK(m.value().is_string(), src, ": `__metadata__.", m.key(), "` must be a string, found ", m.value().dump());
        if (metadata) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = src + ": tensor `" + name + "`";
    ST_CHECK(e.is_object(), where, ": entry must be an object");
    ST_CHECK(e.contains("dtype") && e["dtype"].is_string(), where, ": missing string `dtype`");
    ST_CHECK(e.contains("shape") && e["shape"].is_array(), where, ": missing array `shape`");
    ST_CHECK(e.contains("data_offsets") && e["data_offsets"].is_array() && e["data_offsets"].size() == 2, where,
             ": `data_offsets` must be [begin, end]");
    TensorInfo t;
    t.name = name;
    t.dtype = e["dtype"].get<std::string>();
    const DTypeEntry* d = find_dtype(t.dtype);
    ST_CHECK(d != nullptr, where, ": unknown dtype `", t.dtype, "`");
    t.element_size = d->size;
    t.numel = 1;
    for (const nlohmann::json& dim : e["shape"]) {
      ST_CHECK(dim.is_number_unsigned() || (dim.is_number_integer() && dim.get<int64_t>() >= 0), where,
               ": shape entries must be non-negative integers, found ", dim.dump());
      ST_CHECK(!dim.is_number_unsigned() || dim.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), where,
               ": shape entry ", dim.dump(), " too large");
      const int64_t v = dim.get<int64_t>();
      t.shape.push_back(v);
      ST_CHECK(checked_mul(t.numel, v, t.numel), where, ": shape ", e["shape"].dump(), " overflows 64 bits");
    }
    int64_t bytes = 0;
    ST_CHECK(checked_mul(t.numel, static_cast<int64_t>(d->size), bytes), where, ": byte size overflows 64 bits");
    for (const nlohmann::json& o : e["data_offsets"])
      ST_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0), where,
               ": data_offsets must be non-negative integers, found ", e["data_offsets"].dump());
    const uint64_t b = e["data_offsets"][0].get<uint64_t>(), en = e["data_offsets"][1].get<uint64_t>();
    ST_CHECK(b <= en, where, ": data_offsets begin ", b, " after end ", en);
    ST_CHECK(en <= static_cast<uint64_t>(data_bytes), where, ": data_offsets end ", en, " beyond the data section of ",
             data_bytes, " bytes");
    t.begin = static_cast<int64_t>(b);
    t.end = static_cast<int64_t>(en);
    ST_CHECK(t.end - t.begin == bytes, where, ": shape ", e["shape"].dump(), " x ", t.dtype, " is ", bytes,
             " bytes but data_offsets span ", t.end - t.begin);
    out.push_back(std::move(t));
  }
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : out) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    ST_CHECK(by_offset[i]->begin >= by_offset[i - 1]->end || by_offset[i - 1]->begin == by_offset[i - 1]->end, src,
             ": tensors `", by_offset[i - 1]->name, "` [", by_offset[i - 1]->begin, ", ", by_offset[i - 1]->end,
             ") and `", by_offset[i]->name, "` [", by_offset[i]->begin, ", ", by_offset[i]->end, ") overlap");
  return out;
}

std::vector<TensorInfo> validate_safetensors(std::span<const uint8_t> file, const std::string& source,
                                             std::map<std::string, std::string>* metadata) {
  ST_CHECK(file.size() >= 8, source, ": file of ", file.size(), " bytes is too short for a safetensors header");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[static_cast<size_t>(i)];  // little-endian
  ST_CHECK(n <= static_cast<uint64_t>(kMaxHeaderBytes), source, ": header length ", n, " exceeds the ",
           kMaxHeaderBytes, "-byte limit");
  ST_CHECK(n <= file.size() - 8, source, ": header length ", n, " runs past the end of the ", file.size(),
           "-byte file");
  const int64_t data_bytes = static_cast<int64_t>(file.size() - 8 - n);
  return parse_safetensors_header(std::string_view(reinterpret_cast<const char*>(file.data() + 8), static_cast<size_t>(n)),
                                  data_bytes, source, metadata);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), map_(path) {
  const std::span<const uint8_t> file = map_.bytes();
  tensors_ = validate_safetensors(file, path, &metadata_);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[static_cast<size_t>(i)];
  data_ = file.data() + 8 + n;
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  checked_ = std::make_unique<std::atomic<uint8_t>[]>(tensors_.size());
  const auto sums = metadata_.find(kChecksumMetadataKey);
  if (sums == metadata_.end()) return;
  has_checksums_ = true;
  const std::string where = path + ": metadata `" + kChecksumMetadataKey + "`";
  nlohmann::json list;
  try {
    list = nlohmann::json::parse(sums->second);
  } catch (const nlohmann::json::exception&) {
    ST_THROW(where, " is not a JSON object of tensor name -> checksum (the header is damaged)");
  }
  ST_CHECK(list.is_object() && list.size() == tensors_.size(), where, " must name each of the file's ",
           tensors_.size(), " tensors once, found ", list.is_object() ? std::to_string(list.size()) + " entries" : list.dump(),
           " (the header is damaged)");
  checksums_.assign(tensors_.size(), 0);
  for (const auto& item : list.items()) {
    const auto it = index_.find(item.key());
    ST_CHECK(it != index_.end(), where, " names `", item.key(), "`, which is not a tensor of the file (the header is damaged)");
    const std::optional<uint32_t> crc =
        item.value().is_string() ? parse_crc32c(item.value().get<std::string>()) : std::nullopt;
    ST_CHECK(crc.has_value(), where, ": the checksum of `", item.key(), "` must be 8 hex digits, found ",
             item.value().dump());
    checksums_[it->second] = *crc;
  }
}

std::span<const uint8_t> SafetensorsFile::raw_bytes(const std::string& name) const {
  const TensorInfo& t = get(name);
  return {data_ + t.begin, static_cast<size_t>(t.end - t.begin)};
}

std::optional<uint32_t> SafetensorsFile::stored_checksum(const std::string& name) const {
  const TensorInfo& t = get(name);
  if (!has_checksums_) return std::nullopt;
  return checksums_[static_cast<size_t>(&t - tensors_.data())];
}

uint32_t SafetensorsFile::computed_checksum(const std::string& name) const {
  const std::span<const uint8_t> bytes = raw_bytes(name);
  return crc32c_parallel(bytes.data(), bytes.size());
}

namespace {
// counts elements whose exponent bits (mask) are all set: NaN or inf
template <typename Bits>
SafetensorsFile::NonFinite scan_nonfinite(const uint8_t* data, int64_t n, Bits mask) {
  int64_t count = 0, first = std::numeric_limits<int64_t>::max();
#pragma omp parallel for schedule(static) reduction(+ : count) reduction(min : first) if (n > (int64_t{1} << 20))
  for (int64_t i = 0; i < n; ++i) {
    Bits v;
    std::memcpy(&v, data + static_cast<size_t>(i) * sizeof(Bits), sizeof(Bits));
    if ((v & mask) == mask) {
      ++count;
      first = std::min(first, i);
    }
  }
  return {count, count == 0 ? -1 : first};
}
}  // namespace

SafetensorsFile::NonFinite SafetensorsFile::nonfinite(const std::string& name) const {
  const TensorInfo& t = get(name);
  const uint8_t* p = data_ + t.begin;
  if (t.dtype == "F32") return scan_nonfinite<uint32_t>(p, t.numel, 0x7F800000u);
  if (t.dtype == "F64") return scan_nonfinite<uint64_t>(p, t.numel, 0x7FF0000000000000ull);
  if (t.dtype == "BF16") return scan_nonfinite<uint16_t>(p, t.numel, uint16_t{0x7F80});
  if (t.dtype == "F16") return scan_nonfinite<uint16_t>(p, t.numel, uint16_t{0x7C00});
  if (t.dtype == "F8_E5M2") return scan_nonfinite<uint8_t>(p, t.numel, uint8_t{0x7C});
  if (t.dtype == "F8_E4M3") {  // e4m3fn has no inf; NaN is S.1111.111
    NonFinite r;
    for (int64_t i = 0; i < t.numel; ++i)
      if ((p[i] & 0x7F) == 0x7F) {
        if (r.count++ == 0) r.first = i;
      }
    return r;
  }
  return {};
}

bool SafetensorsFile::checksum_matches(const std::string& name) const {
  const TensorInfo& t = get(name);
  if (!has_checksums_) return true;
  const size_t i = static_cast<size_t>(&t - tensors_.data());
  uint8_t state = checked_[i].load(std::memory_order_acquire);
  if (state == 0) {
    state = computed_checksum(name) == checksums_[i] ? 1 : 2;
    checked_[i].store(state, std::memory_order_release);
  }
  return state == 1;
}

SafetensorsFile::~SafetensorsFile() = default;

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsFile::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  ST_CHECK(t != nullptr, path_, ": no tensor named `", name, "`");
  return *t;
}

void SafetensorsFile::read_range(const std::string& name, int64_t first, Tensor& out) const {
  const TensorInfo& t = get(name);
  ST_CHECK(out.device().is_cpu() && out.is_contiguous(), path_, ": reading `", name,
           "` needs a contiguous host tensor, found ", out.str());
  const int64_t n = out.numel();
  ST_CHECK(first >= 0 && n >= 0 && first <= t.numel && n <= t.numel - first, path_, ": tensor `", name,
           "`: elements [", first, ", ", first + n, ") outside its ", t.numel, " elements");
  ST_CHECK(checksum_matches(name), path_, ": tensor `", name, "` does not match its checksum (crc32c ",
           format_crc32c(*stored_checksum(name)), " written, ", format_crc32c(computed_checksum(name)),
           " now): the file is damaged; copy it again, or use another checkpoint");
  const uint8_t* src = data_ + t.begin + first * static_cast<int64_t>(t.element_size);
  const bool file_float = find_dtype(t.dtype)->is_float;
  ST_CHECK(t.dtype != "F8_E4M3" && t.dtype != "F8_E5M2", path_, ": tensor `", name, "` is ", t.dtype,
           ", which shardtrain does not convert");
  if (is_floating(out.dtype())) {
    ST_CHECK(file_float, path_, ": tensor `", name, "` is ", t.dtype, ", cannot read it as ", dtype_name(out.dtype()));
    // weights and optimizer state are finite: a NaN or inf is damage, or a diverged run's
    // save, and would surface only later as a NaN loss
    const int64_t bad = convert_floats(src, t.dtype, out, n);
    ST_CHECK(bad < 0, path_, ": tensor `", name, "` element ", first + bad, " is ",
             bad < 0 ? 0.0 : load_float(src + bad * static_cast<int64_t>(t.element_size), t.dtype),
             ", expected a finite value (the file is damaged, or was saved from a run whose weights diverged)");
  } else {
    ST_CHECK(!file_float, path_, ": tensor `", name, "` is ", t.dtype, ", cannot read it as ", dtype_name(out.dtype()));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = load_int(src + i * static_cast<int64_t>(t.element_size), t.dtype);
      switch (out.dtype()) {
        case DType::kI32:
          ST_CHECK(v >= INT32_MIN && v <= INT32_MAX, path_, ": tensor `", name, "` element ", first + i, " = ", v,
                   " does not fit i32");
          out.data<int32_t>()[i] = static_cast<int32_t>(v);
          break;
        case DType::kI64: out.data<int64_t>()[i] = v; break;
        case DType::kU8: out.data<uint8_t>()[i] = static_cast<uint8_t>(v); break;
        default: break;
      }
    }
  }
}

void SafetensorsFile::read(const std::string& name, Tensor& out) const {
  const TensorInfo& t = get(name);
  ST_CHECK(out.numel() == t.numel, path_, ": tensor `", name, "` has ", t.numel, " elements (shape ",
           Shape(t.shape.begin(), t.shape.end()).str(), "), the destination ", out.str(), " has ", out.numel());
  read_range(name, 0, out);
}

Tensor SafetensorsFile::read_as(const std::string& name, DType dtype) const {
  const TensorInfo& t = get(name);
  Tensor out = Tensor::empty(Shape(t.shape.begin(), t.shape.end()), dtype, Device::cpu(), "safetensors read");
  read_range(name, 0, out);
  return out;
}

}  // namespace shardtrain::io
