// Helpers shared by the GPU op benchmarks: device inputs from the counter-based generator,
// comparison with a CPU twin, and event timing with the L2 cache flushed before each call.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "core/cuda/stream.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/elementwise.h"

// Status checks for benchmarks that call cuBLASLt or the CUDA runtime themselves (the
// including file includes their headers).
#define ST_BENCH_CUBLAS(expr)                                                        \
  do {                                                                              \
    const cublasStatus_t s_ = (expr);                                               \
    ST_CHECK(s_ == CUBLAS_STATUS_SUCCESS, "cuBLASLt error ", static_cast<int>(s_), \
             " in `", #expr, "`");                                                  \
  } while (0)
#define ST_BENCH_CUDA(expr)                                                                    \
  do {                                                                                         \
    const cudaError_t e_ = (expr);                                                             \
    ST_CHECK(e_ == cudaSuccess, "CUDA error ", cudaGetErrorString(e_), " in `", #expr, "`"); \
  } while (0)

namespace shardtrain::bench {

inline Tensor dev_normal(const Shape& s, DType t, uint64_t key, double std = 1.0) {
  Tensor x = Tensor::empty(s, t, Device::cuda(0), "bench input");
  ops::fill_normal(x, 99, key, 0, std);
  return x;
}

inline Tensor dev_zeros(const Shape& s) {
  Tensor x = Tensor::empty(s, DType::kF32, Device::cuda(0), "bench zeros");
  ops::fill(x, 0.0);
  return x;
}

inline Tensor host_of(const Tensor& d, DType t = DType::kF64) {
  Tensor h = Tensor::empty(d.shape(), t);
  ops::cast(h, d);
  return h;
}

// ||dev - ref|| / ||ref|| in f64.
inline double rel_err(const Tensor& dev, const Tensor& ref) {
  const Tensor h = host_of(dev), r = host_of(ref);
  double num = 0, den = 0;
  for (int64_t i = 0; i < h.numel(); ++i) {
    const double d = h.data<double>()[i] - r.data<double>()[i];
    num += d * d;
    den += r.data<double>()[i] * r.data<double>()[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Relative difference allowed between two f32 sums of the same `terms` products taken in
// different orders (different GEMM algorithms): round-off grows as sqrt(terms) * 2^-24.
inline double f32_sum_tolerance(int64_t terms) { return 4.0 * std::sqrt(static_cast<double>(terms)) * 0x1p-24; }

// Fails the benchmark (before any timing) when the device result strays from the CPU twin.
inline void expect_close(const char* bench, const char* what, const Tensor& dev, const Tensor& ref, double tol) {
  const double e = rel_err(dev, ref);
  ST_CHECK(e < tol, bench, ": ", what, " differs from the CPU twin: relative error ", e, " (tolerance ", tol, ")");
  std::printf("# check %-28s relative error %.2e\n", what, e);
}

// Mean milliseconds of fn over `iterations` calls after two untimed ones; before each timed
// call a 256 MiB write evicts the 50 MB L2, so no call starts with its inputs cached.
inline double time_ms(const std::function<void()>& fn, int iterations) {
  static Tensor flush = Tensor::empty({int64_t{64} << 20}, DType::kF32, Device::cuda(0), "L2 flush");
  fn();
  fn();
  double total = 0;
  cuda::Event start, stop;
  for (int i = 0; i < iterations; ++i) {
    ops::fill(flush, static_cast<double>(i));
    start.record(Stream{});
    fn();
    stop.record(Stream{});
    stop.synchronize();
    total += stop.elapsed_ms_since(start);
  }
  return total / iterations;
}

// Read + write bandwidth of a device-to-device copy of 2 GiB: the ceiling for streaming ops.
inline double copy_ceiling_gbs(int iterations) {
  const int64_t n = int64_t{1} << 29;
  Tensor src = dev_zeros({n}), dst = Tensor::empty({n}, DType::kF32, Device::cuda(0), "copy target");
  const double ms = time_ms([&] { copy(dst, src); }, iterations);
  return 2.0 * 4 * static_cast<double>(n) / ms / 1e6;
}

// Mean milliseconds per call of `calls` back-to-back calls of fn (no L2 flush).
inline double time_calls_ms(const std::function<void()>& fn, int calls) {
  cuda::Event start, stop;
  start.record(Stream{});
  for (int i = 0; i < calls; ++i) fn();
  stop.record(Stream{});
  stop.synchronize();
  return stop.elapsed_ms_since(start) / calls;
}

// Sustained timing, as a training step runs on a board at its power cap: fns[0] loads the
// board for about load_ms (none when 0); then three rounds, each running every fn back to
// back for about round_ms, interleaved so a drifting clock treats them alike; each fn's
// time is its median round (ms per call).
inline std::vector<double> time_sustained_ms(const std::vector<std::function<void()>>& fns, double round_ms,
                                             double load_ms) {
  std::vector<int> calls;
  for (const auto& fn : fns) {
    fn();
    calls.push_back(static_cast<int>(round_ms / time_calls_ms(fn, 1)) + 1);
  }
  if (load_ms > 0) time_calls_ms(fns[0], static_cast<int>(calls[0] * load_ms / round_ms));
  std::vector<std::array<double, 3>> ms(fns.size());
  for (int round = 0; round < 3; ++round)
    for (size_t i = 0; i < fns.size(); ++i) ms[i][round] = time_calls_ms(fns[i], calls[i]);
  std::vector<double> median;
  for (auto& m : ms) {
    std::sort(m.begin(), m.end());
    median.push_back(m[1]);
  }
  return median;
}

}  // namespace shardtrain::bench
