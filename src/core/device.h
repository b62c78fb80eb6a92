// Where a tensor's bytes live, and the stream that orders work on them (CPU work ignores it).
#pragma once

#include <cstdint>
#include <string>

namespace shardtrain {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCUDA, index}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const;
};

// An opaque CUDA stream handle (cudaStream_t); null is the legacy default stream.
// Kept as void* so that CPU-only code never includes CUDA headers.
struct Stream {
  void* handle = nullptr;
};

// Waits until all work queued on `device` has finished (no-op for the CPU).
void synchronize(Device device);

}  // namespace shardtrain
