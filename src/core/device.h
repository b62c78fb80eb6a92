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

// An opaque CUDA stream handle (cudaStream_t); null is the engine's compute stream: the
// legacy default stream, or the stream a CUDA graph capture has made current on this thread
// (model/captured_step.h). Kept as void* so that CPU-only code never includes CUDA headers.
struct Stream {
  void* handle = nullptr;
};

// The stream Stream{} stands for on this thread (null: the legacy default stream).
void* current_compute_stream();
// Makes `handle` what Stream{} stands for on this thread until reset with null.
void set_current_compute_stream(void* handle);
// s itself, or the current compute stream when s is Stream{}.
inline Stream resolve(Stream s) { return s.handle != nullptr ? s : Stream{current_compute_stream()}; }

// Waits until all work queued on `device` has finished (no-op for the CPU).
void synchronize(Device device);

}  // namespace shardtrain
