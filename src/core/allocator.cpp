// The CPU allocator (aligned malloc with counters) and the registry of device allocators.
#include "core/allocator.h"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>

#include "core/error.h"

namespace shardtrain {
namespace {

constexpr size_t kCpuAlignment = 64;
constexpr int kMaxCudaDevices = 64;

std::atomic<bool>& host_poison() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("SHARDTRAIN_POISON_HOST_ALLOCATIONS");
    return v != nullptr && std::string_view(v) == "1";
  }()};
  return on;
}

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, Stream, const char* what) override {
    const size_t rounded = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded);
    ST_CHECK(p != nullptr, "out of host memory allocating ", format_bytes(static_cast<int64_t>(bytes)),
             " for ", what, " (", format_bytes(allocated_.load()), " already allocated)");
    const int64_t now = allocated_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    ++num_allocs_;
    if (host_poison().load(std::memory_order_relaxed)) std::memset(p, 0xFF, rounded);
    return p;
  }
  void deallocate(void* ptr, size_t bytes, Stream) override {
    std::free(ptr);
    allocated_.fetch_sub(static_cast<int64_t>(bytes));
  }
  MemoryStats stats() const override {
    MemoryStats s;
    s.allocated_bytes = allocated_.load();
    s.peak_allocated_bytes = peak_.load();
    s.reserved_bytes = s.allocated_bytes;  // malloc returns memory to the system on free
    s.peak_reserved_bytes = s.peak_allocated_bytes;
    s.num_allocs = num_allocs_.load();
    s.num_system_allocs = s.num_allocs;
    return s;
  }
  void reset_peak() override { peak_.store(allocated_.load()); }
  Device device() const override { return Device::cpu(); }

 private:
  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> num_allocs_{0};
};

std::array<Allocator*, kMaxCudaDevices>& cuda_allocators() {
  static std::array<Allocator*, kMaxCudaDevices> table{};
  return table;
}

}  // namespace

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) {
    static CpuAllocator cpu;
    return cpu;
  }
  ST_CHECK(device.index >= 0 && device.index < kMaxCudaDevices, "CUDA device index ", device.index,
           " out of range [0, ", kMaxCudaDevices, ")");
  Allocator* a = cuda_allocators()[device.index];
  ST_CHECK(a != nullptr, "no allocator for ", device.str(),
           ": this build of shardtrain has no CUDA backend, or the device was not initialised");
  return *a;
}

void set_host_allocation_poison(bool on) { host_poison().store(on); }

void register_allocator(Device device, Allocator* allocator) {
  ST_ASSERT(device.is_cuda() && device.index >= 0 && device.index < kMaxCudaDevices);
  cuda_allocators()[device.index] = allocator;
}

std::string format_bytes(int64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  } else if (b < 1024.0 * 1024) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024);
  } else if (b < 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024));
  } else if (b < 1024.0 * 1024 * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f TiB", b / (1024.0 * 1024 * 1024 * 1024));
  }
  return buf;
}

std::string describe_peak_breakdown(const Allocator& allocator) {
  const std::vector<std::pair<std::string, int64_t>> parts = allocator.peak_breakdown();
  if (parts.empty()) return "";
  int64_t total = 0;
  for (const auto& [what, bytes] : parts) total += bytes;
  std::string s = "allocated on " + allocator.device().str() + " at the peak (" + format_bytes(total) + "), by name:\n";
  for (const auto& [what, bytes] : parts) {
    char line[64];
    std::snprintf(line, sizeof line, "  %12s  ", format_bytes(bytes).c_str());
    s += line + what + "\n";
  }
  return s;
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

}  // namespace shardtrain
