// libFuzzer target: arbitrary bytes as a whole safetensors file. Every input must either
// validate or raise shardtrain::Error; a crash, a sanitizer report or any other exception is
// a bug. For valid inputs every tensor's byte range must lie inside the data section.
#include <cstddef>
#include <cstdint>
#include <span>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    std::map<std::string, std::string> metadata;
    const auto tensors = shardtrain::io::validate_safetensors(std::span<const uint8_t>(data, size), "fuzz", &metadata);
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = (header << 8) | data[i];
    const int64_t data_bytes = static_cast<int64_t>(size - 8 - header);
    for (const auto& t : tensors)
      if (t.begin < 0 || t.end < t.begin || t.end > data_bytes ||
          t.end - t.begin != t.numel * static_cast<int64_t>(t.element_size))
        __builtin_trap();
  } catch (const shardtrain::Error&) {
  }
  return 0;
}
