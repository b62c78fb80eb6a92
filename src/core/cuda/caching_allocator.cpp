// A stream-ordered caching allocator for device memory. Freed blocks go to a free list
// keyed by (stream, rounded size) and are handed out again on that same stream without a
// device synchronisation; memory returns to the driver only on out-of-memory or
// empty_cache. Blocks are not split: training steps repeat the same sizes, so exact size
// classes hit after the first step.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/cuda/cuda_check.h"
#include "core/cuda/device.h"

namespace shardtrain {
namespace detail {

void throw_cuda_error(cudaError_t status, const char* expression, const char* file, int line) {
  int dev = -1;
  cudaGetDevice(&dev);
  throw Error(concat("CUDA error ", static_cast<int>(status), " (", cudaGetErrorName(status), ": ",
                     cudaGetErrorString(status), ") in `", expression, "` at ", file, ":", line, " on cuda:", dev));
}

}  // namespace detail

namespace cuda {
namespace {

constexpr size_t kSmallRound = 512;                // sizes below kLargeThreshold round to this
constexpr size_t kLargeThreshold = 1 << 20;
constexpr size_t kLargeRound = 2 << 20;            // large sizes round to 2 MiB

size_t round_size(size_t bytes) {
  const size_t r = bytes < kLargeThreshold ? kSmallRound : kLargeRound;
  return (bytes + r - 1) / r * r;
}

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(int device) : device_(device) {
    const char* v = std::getenv("SHARDTRAIN_MEMORY_PEAK_REPORT");
    track_names_ = v != nullptr && std::string(v) == "1";
  }

  void* allocate(size_t bytes, Stream stream, const char* what) override {
    const size_t size = round_size(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.num_allocs;
    auto& bin = free_[stream.handle];
    auto it = bin.find(size);
    void* ptr = nullptr;
    if (it != bin.end()) {
      ptr = it->second;
      bin.erase(it);
    } else {
      ptr = system_alloc(size, bytes, what);
    }
    live_[ptr] = size;
    stats_.allocated_bytes += static_cast<int64_t>(size);
    const bool new_peak = stats_.allocated_bytes > stats_.peak_allocated_bytes;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    if (track_names_) {
      std::string name = what != nullptr ? what : "(unnamed)";
      by_name_[name] += static_cast<int64_t>(size);
      live_names_[ptr] = std::move(name);
      if (new_peak) at_peak_ = by_name_;
    }
    return ptr;
  }

  void deallocate(void* ptr, size_t, Stream stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    ST_ASSERT(it != live_.end(), "freeing a pointer this allocator does not own");
    stats_.allocated_bytes -= static_cast<int64_t>(it->second);
    if (track_names_) {
      auto named = live_names_.find(ptr);
      auto total = by_name_.find(named->second);
      if ((total->second -= static_cast<int64_t>(it->second)) == 0) by_name_.erase(total);
      live_names_.erase(named);
    }
    free_[stream.handle].emplace(it->second, ptr);
    live_.erase(it);
  }

  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
    stats_.peak_reserved_bytes = stats_.reserved_bytes;
    at_peak_ = by_name_;
  }
  Device device() const override { return Device::cuda(device_); }

  std::vector<std::pair<std::string, int64_t>> peak_breakdown() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::pair<std::string, int64_t>> parts(at_peak_.begin(), at_peak_.end());
    std::stable_sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    return parts;
  }

  void release_cached() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached_locked();
  }

 private:
  void release_cached_locked() {
    ST_CUDA_CHECK(cudaDeviceSynchronize());
    for (auto& [stream, bin] : free_) {
      for (auto& [size, ptr] : bin) {
        ST_CUDA_CHECK(cudaFree(ptr));
        stats_.reserved_bytes -= static_cast<int64_t>(size);
      }
    }
    free_.clear();
  }

  void* system_alloc(size_t size, size_t requested, const char* what) {
    void* ptr = nullptr;
    cudaError_t st = cudaMalloc(&ptr, size);
    if (st == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky error before retrying
      release_cached_locked();
      st = cudaMalloc(&ptr, size);
    }
    if (st == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      ST_THROW("CUDA out of memory on cuda:", device_, " allocating ", format_bytes(static_cast<int64_t>(requested)),
               " for ", what, ": ", format_bytes(stats_.allocated_bytes), " allocated by shardtrain, ",
               format_bytes(stats_.reserved_bytes), " reserved, ", format_bytes(static_cast<int64_t>(free_b)),
               " free of ", format_bytes(static_cast<int64_t>(total_b)),
               " (lower training.batch_size, turn on training.activation_checkpointing, move activations or "
               "weights to host memory with training.offload_activations or parallel.offload; `shardtrain plan` "
               "shows where the memory goes)");
    }
    ST_CUDA_CHECK(st);
    ++stats_.num_system_allocs;
    stats_.reserved_bytes += static_cast<int64_t>(size);
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    return ptr;
  }

  int device_;
  mutable std::mutex mutex_;
  MemoryStats stats_;
  std::unordered_map<void*, size_t> live_;
  std::unordered_map<void*, std::multimap<size_t, void*>> free_;  // stream -> size -> block
  // SHARDTRAIN_MEMORY_PEAK_REPORT=1: bytes live by allocation name, now and at the peak
  bool track_names_ = false;
  std::unordered_map<void*, std::string> live_names_;
  std::map<std::string, int64_t> by_name_, at_peak_;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::map<int, CachingAllocator*>& allocators() {
  // Leaked on purpose: tensors freed during static destruction must still find them.
  static auto* table = new std::map<int, CachingAllocator*>();
  return *table;
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string device_name(int index) {
  cudaDeviceProp prop{};
  ST_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return prop.name;
}

double memory_bandwidth(int index) {
  int khz = 0, bits = 0;
  ST_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, index));
  ST_CUDA_CHECK(cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, index));
  return 2.0 * 1e3 * khz * bits / 8;
}

double dense_bf16_flops_per_clock(int index) {
  cudaDeviceProp prop{};
  ST_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  const double per_sm = prop.major == 9 ? 4096.0 : prop.major == 8 && prop.minor == 0 ? 2048.0 : 0.0;
  return per_sm * prop.multiProcessorCount;
}

std::string pci_bus_id(int index) {
  char id[32] = {};
  ST_CUDA_CHECK(cudaDeviceGetPCIBusId(id, sizeof id, index));
  return id;
}

int64_t total_memory_bytes(int index) {
  cudaDeviceProp prop{};
  ST_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return static_cast<int64_t>(prop.totalGlobalMem);
}

double dense_bf16_peak_flops(int index) {
  const std::string name = device_name(index);
  if (name.find("H100") != std::string::npos && name.find("PCIe") != std::string::npos) return 756e12;
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989e12;
  if (name.find("A100") != std::string::npos) return 312e12;
  return 0;
}

int compute_capability(int index) {
  cudaDeviceProp prop{};
  ST_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return prop.major * 10 + prop.minor;
}

double dense_fp8_peak_flops(int index) {
  return compute_capability(index) >= 89 ? 2 * dense_bf16_peak_flops(index) : 0.0;
}

void init_device(int index) {
  const int n = device_count();
  ST_CHECK(index >= 0 && index < n, "CUDA device ", index, " requested but ", n, " device(s) are visible");
  ST_CUDA_CHECK(cudaSetDevice(index));
  check_kernel_image(index);
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& table = allocators();
  if (table.count(index) == 0) {
    table[index] = new CachingAllocator(index);
    register_allocator(Device::cuda(index), table[index]);
  }
}

std::string no_kernel_image_message(const std::string& archs, int major, int minor, const std::string& name,
                                    int index) {
  const std::string cap = std::to_string(major) + std::to_string(minor);
  return detail::concat("this build of shardtrain has CUDA kernels for sm_", archs, " only, and cuda:", index, " (",
                        name, ") is compute capability ", major, ".", minor,
                        ": rebuild for it with `cmake -DCMAKE_CUDA_ARCHITECTURES=", cap == "90" ? "90a" : cap,
                        " ...` (a build on a machine with this GPU picks it by itself; "
                        "-DCMAKE_CUDA_ARCHITECTURES=\"80;90a\" builds for A100s and H100s at once)");
}

void empty_cache(int index) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = allocators().find(index);
  if (it != allocators().end()) it->second->release_cached();
}

}  // namespace cuda
}  // namespace shardtrain
