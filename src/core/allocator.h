// Allocators with current / peak / reserved statistics. The CPU allocator hands out 64-byte
// aligned blocks; the CUDA caching allocator (core/cuda) implements the same interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"

namespace shardtrain {

struct MemoryStats {
  int64_t allocated_bytes = 0;       // handed out to tensors now
  int64_t peak_allocated_bytes = 0;  // max of allocated_bytes since the last reset
  int64_t reserved_bytes = 0;        // held from the system (>= allocated, includes caches)
  int64_t peak_reserved_bytes = 0;
  int64_t num_allocs = 0;            // calls to allocate since the start
  int64_t num_system_allocs = 0;     // of those, the ones that went to the system
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns `bytes` (> 0) of memory aligned to at least 64 bytes, usable in stream order on
  // `stream`. `what` names the use in an out-of-memory error.
  virtual void* allocate(size_t bytes, Stream stream, const char* what) = 0;
  virtual void deallocate(void* ptr, size_t bytes, Stream stream) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual Device device() const = 0;
  // What was allocated at the moment of the peak, bytes by the name each allocation gave
  // (`what`), largest first. Only the CUDA caching allocator keeps it, and only when
  // SHARDTRAIN_MEMORY_PEAK_REPORT=1 was in the environment when it was made (it costs a map
  // update per allocation); empty otherwise.
  virtual std::vector<std::pair<std::string, int64_t>> peak_breakdown() const { return {}; }
};

// peak_breakdown() as lines "  <bytes>  <name>" under a heading; empty when there is none.
std::string describe_peak_breakdown(const Allocator& allocator);

// The process-wide allocator of a device. CUDA allocators are registered by core/cuda
// when the CUDA backend is linked; asking for one without it throws.
Allocator& allocator_for(Device device);
void register_allocator(Device device, Allocator* allocator);

// Debugging: every new host allocation is filled with 0xFF bytes (NaN in every float dtype),
// so that reading memory nothing wrote shows in the results. Off by default;
// SHARDTRAIN_POISON_HOST_ALLOCATIONS=1 in the environment turns it on at start.
void set_host_allocation_poison(bool on);

// Formats bytes as "1.50 GiB" for messages and logs.
std::string format_bytes(int64_t bytes);

}  // namespace shardtrain
