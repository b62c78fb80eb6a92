// Helpers shared by the GPU op benchmarks: device inputs from the counter-based generator,
// comparison with a CPU twin, and event timing with the L2 cache flushed before each call.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "core/cuda/stream.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/elementwise.h"

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

}  // namespace shardtrain::bench
