// A file mapped read-only into memory for as long as the object lives (an empty file maps to
// an empty span). Errors name the file and the system's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace shardtrain {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace shardtrain
