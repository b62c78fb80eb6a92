// libFuzzer target: arbitrary bytes as a whole Parquet file, every column of every row group
// decoded and assembled into rows. Every input must either read or raise shardtrain::Error; a
// crash, a sanitizer report or any other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/error.h"
#include "io/parquet.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    shardtrain::io::validate_parquet(std::span<const uint8_t>(data, size), "fuzz.parquet");
  } catch (const shardtrain::Error&) {
  }
  return 0;
}
