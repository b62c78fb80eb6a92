// Page-locking host memory: cudaHostAlloc (what PyTorch's pinned host allocator calls by default)
// against the steps core/cuda/stream.h's PinnedBuffer takes (mmap, every page touched by 16
// threads, then cudaHostRegister), 4 GiB each, two rounds: the time to lock, and the H2D and D2H
// copy rates from each (2 warm-up copies, then 5 timed on one stream). The copies' rates show
// whether registered 4 KiB pages cost the copy engines anything.
//   .device-build/bin/pinned_bench
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
static double rate(void* host, void* dev, size_t bytes, bool h2d) {
  cudaStream_t s; cudaStreamCreate(&s);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int w = 0; w < 2; ++w) cudaMemcpyAsync(h2d ? dev : host, h2d ? host : dev, bytes, h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s);
  cudaEventRecord(a, s);
  for (int r = 0; r < 5; ++r) cudaMemcpyAsync(h2d ? dev : host, h2d ? host : dev, bytes, h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s);
  cudaEventRecord(b, s); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  return 5.0 * bytes / (ms * 1e-3) / 1e9;
}
int main() {
  const size_t bytes = size_t{4} << 30;
  void* dev; cudaMalloc(&dev, bytes);
  for (int round = 0; round < 2; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    void* h1; cudaHostAlloc(&h1, bytes, cudaHostAllocDefault);
    double alloc1 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    const size_t page = sysconf(_SC_PAGESIZE);
    void* h2 = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    { std::vector<std::jthread> ts; for (int t = 0; t < 16; ++t) ts.emplace_back([=] { for (size_t i = bytes / page * t / 16; i < bytes / page * (t + 1) / 16; ++i) static_cast<volatile char*>(h2)[i * page] = 0; }); }
    cudaHostRegister(h2, bytes, cudaHostRegisterDefault);
    double alloc2 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("4 GiB: hostalloc %.2f s, register %.2f s | H2D %.1f vs %.1f GB/s | D2H %.1f vs %.1f GB/s\n", alloc1, alloc2,
                rate(h1, dev, bytes, true), rate(h2, dev, bytes, true), rate(h1, dev, bytes, false), rate(h2, dev, bytes, false));
    cudaFreeHost(h1); cudaHostUnregister(h2); munmap(h2, bytes);
  }
  std::printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
