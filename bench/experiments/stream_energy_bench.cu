// Does the path a streaming pass's bytes take through an SM change its energy? On a board at
// its power limit every joule of a step counts against its time, and the engine's streaming
// passes (AdamW, SwiGLU, RMSNorm, RoPE, the loss's softmax) move ~165 GB per 1B bs-8 step at
// ~230 pJ per byte (energy_bench). The engine's kernels move data with 16-byte loads and
// stores through registers; Hopper's TMA moves whole blocks between global and shared memory
// with one instruction from one thread. Each variant runs back to back for a few seconds
// while the GPU monitor reads the board's energy counter:
//   copy, 16-byte loads and stores through registers, 4 in flight per thread
//   copy, the same with evict-first cache hints (ld.global.cs / st.global.cs)
//   copy, TMA bulk copies through shared memory (one thread per CTA, 6 stages of 32 KiB)
//   SwiGLU forward, the engine's op (h = silu(gate) * up, bf16, 16-byte loads, a grid of
//   row pairs) on separate gate and up tensors, and on gate and up as the halves of one
//   [tokens, 2F] product (the engine's stacked layout)
//   SwiGLU forward, gate and up brought in and h sent out by TMA bulk copies, the math from
//   shared memory (4 stages of 3 x 16 KiB)
// Every variant's output is checked first: the copies byte for byte against the source, the
// engine's SwiGLU against the CPU twin on its first rows, the other SwiGLUs bit for bit against
// the engine's.
//   stream_energy_bench [seconds per variant = 4] [MiB per copy buffer = 1024]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "../ops/bench_util.h"
#include "core/cuda/device.h"
#include "core/gpu_monitor.h"
#include "energy_util.h"
#include "hopper_ptx.cuh"
#include "ops/swiglu.h"

namespace {

using namespace shardtrain;
using namespace shardtrain::bench;

__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

__device__ __forceinline__ void bulk_store(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_addr(src)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

__device__ __forceinline__ void init_barriers(uint64_t* bars, int n) {
  for (int s = 0; s < n; ++s) bar_init(&bars[s], 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  fence_async_smem();
}

template <bool kStreaming>
__global__ void copy_lsu_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = kStreaming ? __ldcs(src + i + k * stride) : src[i + k * stride];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (kStreaming) __stcs(dst + i + k * stride, v[k]);
      else dst[i + k * stride] = v[k];
    }
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

constexpr int kCopySegment = 32768, kCopyStages = 6;

// One thread per CTA: segment j of this CTA is loaded into stage j % stages, stored from
// there, and the stage is refilled once its store has read it.
__global__ void copy_tma_kernel(const char* src, char* dst, int64_t segments) {
  extern __shared__ __align__(128) char smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kCopyStages * kCopySegment);
  if (threadIdx.x != 0) return;
  init_barriers(bars, kCopyStages);
  const int64_t mine = (segments - blockIdx.x + gridDim.x - 1) / gridDim.x;
  auto at = [&](int64_t j) { return (blockIdx.x + j * int64_t{gridDim.x}) * kCopySegment; };
  auto load = [&](int64_t j) {
    const int st = static_cast<int>(j % kCopyStages);
    bar_expect_tx(&bars[st], kCopySegment);
    bulk_load(smem + st * kCopySegment, src + at(j), kCopySegment, &bars[st]);
  };
  for (int64_t j = 0; j < mine && j < kCopyStages; ++j) load(j);
  for (int64_t j = 0; j < mine; ++j) {
    const int st = static_cast<int>(j % kCopyStages);
    bar_wait(&bars[st], static_cast<uint32_t>((j / kCopyStages) & 1));
    bulk_store(dst + at(j), smem + st * kCopySegment, kCopySegment);
    tma_store_commit();
    if (j >= 1 && j - 1 + kCopyStages < mine) {
      tma_store_wait_read<1>();  // segment j - 1's store has read its stage
      load(j - 1 + kCopyStages);
    }
  }
  bulk_wait_all();
}

__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

constexpr int kSwigluElems = 8192, kSwigluStages = 4, kSwigluThreads = 256;
constexpr int kSwigluBytes = kSwigluElems * 2;

// Stage s holds gate, up and h segments of 16 KiB each. Thread 0 issues the bulk copies; all
// threads compute h from shared memory.
__global__ void __launch_bounds__(kSwigluThreads) swiglu_tma_kernel(const __nv_bfloat16* gate,
                                                                     const __nv_bfloat16* up, __nv_bfloat16* h,
                                                                     int64_t segments) {
  extern __shared__ __align__(128) char smem[];
  constexpr int kStageBytes = 3 * kSwigluBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kSwigluStages * kStageBytes);
  const bool leader = threadIdx.x == 0;
  if (leader) init_barriers(bars, kSwigluStages);
  __syncthreads();
  const int64_t mine = (segments - blockIdx.x + gridDim.x - 1) / gridDim.x;
  auto at = [&](int64_t j) { return (blockIdx.x + j * int64_t{gridDim.x}) * kSwigluElems; };
  auto load = [&](int64_t j) {
    const int st = static_cast<int>(j % kSwigluStages);
    char* stage = smem + st * kStageBytes;
    bar_expect_tx(&bars[st], 2 * kSwigluBytes);
    bulk_load(stage, gate + at(j), kSwigluBytes, &bars[st]);
    bulk_load(stage + kSwigluBytes, up + at(j), kSwigluBytes, &bars[st]);
  };
  if (leader)
    for (int64_t j = 0; j < mine && j < kSwigluStages; ++j) load(j);
  for (int64_t j = 0; j < mine; ++j) {
    const int st = static_cast<int>(j % kSwigluStages);
    char* stage = smem + st * kStageBytes;
    if (leader && j >= kSwigluStages) tma_store_wait_read<kSwigluStages - 1>();  // h of j - stages was read
    bar_wait(&bars[st], static_cast<uint32_t>((j / kSwigluStages) & 1));
    __syncthreads();
    const uint4* g4 = reinterpret_cast<const uint4*>(stage);
    const uint4* u4 = reinterpret_cast<const uint4*>(stage + kSwigluBytes);
    uint4* h4 = reinterpret_cast<uint4*>(stage + 2 * kSwigluBytes);
    for (int p = threadIdx.x; p < kSwigluBytes / 16; p += kSwigluThreads) {
      const uint4 gv = g4[p], uv = u4[p];
      const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
      const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&uv);
      uint4 out;
      __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 g = __bfloat1622float2(g2[k]), u = __bfloat1622float2(u2[k]);
        o2[k] = __floats2bfloat162_rn(silu_times(g.x, u.x), silu_times(g.y, u.y));
      }
      h4[p] = out;
    }
    fence_async_smem();
    __syncthreads();
    if (leader) {
      bulk_store(h + at(j), stage + 2 * kSwigluBytes, kSwigluBytes);
      tma_store_commit();
      if (j + kSwigluStages < mine) load(j + kSwigluStages);  // gate and up of this stage are consumed
    }
  }
  if (leader) bulk_wait_all();
}

__global__ void count_mismatches_kernel(const uint4* a, const uint4* b, int64_t n, unsigned long long* count) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 x = a[i], y = b[i];
    local += (x.x != y.x) + (x.y != y.y) + (x.z != y.z) + (x.w != y.w);
  }
  if (local) atomicAdd(count, local);
}

// 32-bit words that differ between two device buffers of `bytes` (a multiple of 16).
unsigned long long mismatches(const void* a, const void* b, int64_t bytes) {
  unsigned long long* d = nullptr;
  ST_BENCH_CUDA(cudaMalloc(&d, sizeof *d));
  ST_BENCH_CUDA(cudaMemset(d, 0, sizeof *d));
  count_mismatches_kernel<<<1024, 256>>>(static_cast<const uint4*>(a), static_cast<const uint4*>(b), bytes / 16, d);
  ST_BENCH_CUDA(cudaGetLastError());
  unsigned long long h = 0;
  ST_BENCH_CUDA(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
  ST_BENCH_CUDA(cudaFree(d));
  return h;
}

struct Variant {
  std::string name;
  double bytes;  // moved per call: read + written
  std::function<void()> run;
  std::function<void()> check;  // throws when the output is not what it should be; prints what it checked
};

// Fails the benchmark when `bad` words of `what` differ from their expected values.
void expect_equal_words(const char* what, unsigned long long bad) {
  ST_CHECK(bad == 0, "stream_energy_bench: ", what, ": ", bad, " words differ from the expected output");
  std::printf("# check %-38s 0 words differ\n", what);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const double seconds = argc > 1 ? std::stod(argv[1]) : 4.0;
    const int64_t mib = argc > 2 ? std::stoll(argv[2]) : 1024;
    ST_CHECK(seconds >= kMinPowerSeconds, "stream_energy_bench: each variant needs at least ", kMinPowerSeconds,
             " s for a mean power");
    ST_CHECK(mib >= 1 && mib <= 8192, "stream_energy_bench: MiB per copy buffer must be in [1, 8192], found ", mib);
    ST_CHECK(cuda::device_count() > 0, "stream_energy_bench: no CUDA device");
    cuda::init_device(0);
    const Device dev = Device::cuda(0);
    GpuMonitor board = GpuMonitor::open(cuda::pci_bus_id(0));
    ST_CHECK(board.available(), "stream_energy_bench: ", board.why_unavailable());
    int sms = 0;
    ST_BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

    // copies: a multiple of every CTA's segment
    const int64_t copy_bytes = mib * (int64_t{1} << 20) / (int64_t{kCopySegment} * sms) * kCopySegment * sms;
    Tensor src = dev_normal({copy_bytes / 2}, DType::kBF16, 1), dst = dev_normal({copy_bytes / 2}, DType::kBF16, 2);
    const int copy_smem = kCopyStages * kCopySegment + kCopyStages * 8;
    ST_BENCH_CUDA(cudaFuncSetAttribute(copy_tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, copy_smem));

    // SwiGLU: the 1B step's [32768, 8192] gate and up
    const int64_t R = 32768, F = 8192, elems = R * F;
    Tensor gate = dev_normal({R, F}, DType::kBF16, 3), up = dev_normal({R, F}, DType::kBF16, 4);
    Tensor h_engine = Tensor::empty({R, F}, DType::kBF16, dev, "h (engine)");
    Tensor gate_up = Tensor::empty({R, 2 * F}, DType::kBF16, dev, "gate|up");
    Tensor gate_half = gate_up.slice(1, 0, F), up_half = gate_up.slice(1, F, 2 * F);
    Tensor h_stacked = Tensor::empty({R, F}, DType::kBF16, dev, "h (stacked)");
    copy(gate_half, gate);
    copy(up_half, up);
    Tensor h_tma = Tensor::empty({R, F}, DType::kBF16, dev, "h (TMA)");
    const int swiglu_smem = kSwigluStages * 3 * kSwigluBytes + kSwigluStages * 8;
    ST_BENCH_CUDA(cudaFuncSetAttribute(swiglu_tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, swiglu_smem));
    ST_CHECK(elems % kSwigluElems == 0, "stream_energy_bench: SwiGLU size is not a multiple of a segment");

    auto same_as_src = [&](const char* what) {
      return [&, what] {
        expect_equal_words(what, mismatches(src.raw_data(), dst.raw_data(), copy_bytes));
        ST_BENCH_CUDA(cudaMemset(dst.raw_data(), 0, copy_bytes));  // the next variant must write every byte
      };
    };
    auto same_as_engine = [&](const char* what, const Tensor& h) {
      return [&, what, out = &h] {
        expect_equal_words(what, mismatches(out->raw_data(), h_engine.raw_data(), elems * 2));
      };
    };
    auto engine_vs_cpu = [&] {  // the first 64 rows against the f64 CPU twin
      const Tensor g64 = host_of(gate.slice(0, 0, 64)), u64 = host_of(up.slice(0, 0, 64));
      Tensor ref = Tensor::empty({64, F}, DType::kF64);
      ops::swiglu_forward(ref, g64, u64);
      expect_close("stream_energy_bench", "SwiGLU forward, the engine's op", h_engine.slice(0, 0, 64), ref, 1e-2);
    };
    const std::vector<Variant> variants = {
        {"copy, 16-byte loads and stores", 2.0 * copy_bytes,
         [&] {
           copy_lsu_kernel<false><<<sms * 8, 256>>>(static_cast<const uint4*>(src.raw_data()),
                                                    static_cast<uint4*>(dst.raw_data()), copy_bytes / 16);
         },
         same_as_src("copy through registers")},
        {"copy, 16-byte, evict-first hints", 2.0 * copy_bytes,
         [&] {
           copy_lsu_kernel<true><<<sms * 8, 256>>>(static_cast<const uint4*>(src.raw_data()),
                                                   static_cast<uint4*>(dst.raw_data()), copy_bytes / 16);
         },
         same_as_src("copy with evict-first hints")},
        {"copy, TMA bulk (1 thread per SM)", 2.0 * copy_bytes,
         [&] {
           copy_tma_kernel<<<sms, 32, copy_smem>>>(static_cast<const char*>(src.raw_data()),
                                                   static_cast<char*>(dst.raw_data()), copy_bytes / kCopySegment);
         },
         same_as_src("copy by TMA")},
        {"SwiGLU forward, the engine's op", 6.0 * elems, [&] { ops::swiglu_forward(h_engine, gate, up); },
         engine_vs_cpu},
        {"SwiGLU forward, the engine's op, stacked", 6.0 * elems,
         [&] { ops::swiglu_forward(h_stacked, gate_half, up_half); },
         same_as_engine("SwiGLU forward, stacked", h_stacked)},
        {"SwiGLU forward, TMA bulk in and out", 6.0 * elems,
         [&] {
           swiglu_tma_kernel<<<sms, kSwigluThreads, swiglu_smem>>>(
               static_cast<const __nv_bfloat16*>(gate.raw_data()), static_cast<const __nv_bfloat16*>(up.raw_data()),
               static_cast<__nv_bfloat16*>(h_tma.raw_data()), elems / kSwigluElems);
         },
         same_as_engine("SwiGLU forward, TMA", h_tma)},
    };

    std::printf("# %s, %d SMs; %.1f s per variant; copy buffers %.0f MiB; SwiGLU [%lld, %lld] bf16\n",
                cuda::device_name(0).c_str(), sms, seconds, copy_bytes / 1048576.0, static_cast<long long>(R),
                static_cast<long long>(F));
    for (const Variant& v : variants) {  // every output checked before anything is timed
      v.run();
      ST_BENCH_CUDA(cudaGetLastError());
      synchronize(dev);
      v.check();
    }
    std::printf("| variant | GB/s | W | SM MHz | power-capped | energy |\n|---|---|---|---|---|---|\n");
    for (int round = 0; round < 2; ++round)
      for (const Variant& v : variants) {
        const SustainedRun r = run_sustained(board, dev, seconds, v.run);
        const double bytes = static_cast<double>(r.calls) * v.bytes;
        std::printf("| %s | %.0f | %.0f | %.0f | %.0f %% | %.1f pJ/byte |\n", v.name.c_str(), bytes / r.seconds / 1e9,
                    r.board.mean_power_w, r.board.mean_sm_mhz, 100 * r.board.power_capped,
                    1e12 * r.board.energy_j / bytes);
        std::fflush(stdout);
      }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stream_energy_bench: %s\n", e.what());
    return 1;
  }
}
