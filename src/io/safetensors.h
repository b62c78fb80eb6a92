// Reading safetensors files (the Hugging Face weight format): the header is validated in
// full before any data is touched (length, JSON, dtypes, shapes x dtype size == byte range,
// ranges inside the data section and disjoint, no integer overflow); data is memory-mapped
// and any element range of a tensor can be read and converted, which is what a rank that
// loads only its shard needs. Files shardtrain writes carry a CRC32C of each tensor's bytes in
// the header's metadata (key "crc32c": a JSON object of tensor name -> 8 hex digits); a tensor
// is checked against it the first time any of its elements is read.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/tensor.h"

namespace shardtrain::io {

// The metadata key holding the tensors' checksums.
inline constexpr const char* kChecksumMetadataKey = "crc32c";

struct TensorInfo {
  std::string name;
  std::string dtype;      // as written in the file: "BF16", "F32", ...
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t begin = 0;      // byte range inside the data section
  int64_t end = 0;
  size_t element_size = 0;
};

// Parses a header (the JSON after the 8-byte length) of a file whose data section has
// `data_bytes` bytes; `source` names the file in errors. Exposed for the fuzz target.
std::vector<TensorInfo> parse_safetensors_header(std::string_view json, int64_t data_bytes, const std::string& source,
                                                 std::map<std::string, std::string>* metadata);

// Validates a whole file held in memory (8-byte length, header, every tensor entry) and
// returns its tensors; `source` names the file in errors. The fuzz target's entry point.
std::vector<TensorInfo> validate_safetensors(std::span<const uint8_t> file, const std::string& source,
                                             std::map<std::string, std::string>* metadata);

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Whether the file carries checksums (files of other writers do not; their tensors are read
  // unchecked). A file whose checksum list is malformed, or does not name each tensor once,
  // fails to open.
  bool has_checksums() const { return has_checksums_; }
  // Checks tensor `name`'s bytes against its checksum now (and remembers the answer): true when
  // they match or the file has none, false when they differ.
  bool checksum_matches(const std::string& name) const;
  // The stored checksum (nothing when the file has none) and the checksum of the bytes as they are.
  std::optional<uint32_t> stored_checksum(const std::string& name) const;
  uint32_t computed_checksum(const std::string& name) const;
  // The NaN and inf elements of a float tensor (none for other dtypes): how many, and the
  // index of the first (-1: none). A scan of the raw bits, on every thread for a large tensor.
  struct NonFinite {
    int64_t count = 0;
    int64_t first = -1;
  };
  NonFinite nonfinite(const std::string& name) const;
  // The data section of tensor `name` as it is in the file.
  std::span<const uint8_t> raw_bytes(const std::string& name) const;

  // nullptr when absent.
  const TensorInfo* find(const std::string& name) const;
  const TensorInfo& get(const std::string& name) const;  // throws naming file and tensor

  // Reads out.numel() consecutive elements (row-major) of tensor `name` starting at element
  // `first` into the host tensor `out`, converting from the file's dtype to out's (float
  // types among themselves, integer types among themselves). A float element that is NaN or
  // inf is an error naming the file, the tensor and the element (found while converting). The
  // first read of a tensor with a checksum checks all of its bytes; a mismatch is an error
  // naming the file and the tensor.
  void read_range(const std::string& name, int64_t first, Tensor& out) const;
  // The whole tensor into `out`, which must hold exactly its number of elements.
  void read(const std::string& name, Tensor& out) const;
  // The whole tensor as a new host tensor of `dtype` with the file's shape.
  Tensor read_as(const std::string& name, DType dtype) const;

 private:
  std::string path_;
  MappedFile map_;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  bool has_checksums_ = false;
  std::vector<uint32_t> checksums_;                     // per tensor, in tensors_' order; empty: none
  std::unique_ptr<std::atomic<uint8_t>[]> checked_;    // per tensor: 0 not yet, 1 matches, 2 differs
};

}  // namespace shardtrain::io
