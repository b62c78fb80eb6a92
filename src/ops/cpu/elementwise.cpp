// CPU elementwise ops: fill, add, scale, cast (round to nearest even), sum of squares (f64).
#include "ops/elementwise.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/random_math.h"
#include "ops/cpu/common.h"

namespace shardtrain::ops::cpu {
namespace {

double load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF64: return static_cast<const double*>(p)[i];
    case DType::kBF16: return bf16_to_float(static_cast<const BFloat16*>(p)[i]);
    case DType::kF16: return f16_to_float(static_cast<const Float16*>(p)[i]);
    default: ST_ASSERT(false, "load of a non-float dtype");
  }
  return 0;
}

// Narrow types go through f32 (round to nearest even at each step): f64 -> bf16/f16 may
// round twice, which only matters for f64 values that are not f32 values.
void store(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DType::kF64: static_cast<double*>(p)[i] = v; return;
    case DType::kBF16: static_cast<BFloat16*>(p)[i] = float_to_bf16(static_cast<float>(v)); return;
    case DType::kF16: static_cast<Float16*>(p)[i] = float_to_f16(static_cast<float>(v)); return;
    default: ST_ASSERT(false, "store of a non-float dtype");
  }
}

// v into p[0, n) by every thread, each a contiguous share: a large fresh tensor's first touch
// (AdamW's state in host memory, tens of GiB for a 405B-wide rank) faults its pages in parallel.
template <typename T>
void fill_parallel(T* p, int64_t n, T v) {
  constexpr int64_t kPerThread = int64_t{1} << 20;
  const int64_t threads = std::clamp<int64_t>(n / kPerThread, 1, omp_get_max_threads());
#pragma omp parallel for schedule(static) num_threads(static_cast<int>(threads)) if (threads > 1)
  for (int64_t t = 0; t < threads; ++t) std::fill(p + n * t / threads, p + n * (t + 1) / threads, v);
}

}  // namespace

void fill(Tensor& x, double value) {
  check_arg(x, "fill", "x");
  const int64_t n = x.numel();
  switch (x.dtype()) {
    case DType::kI32: fill_parallel(x.data<int32_t>(), n, static_cast<int32_t>(value)); return;
    case DType::kI64: fill_parallel(x.data<int64_t>(), n, static_cast<int64_t>(value)); return;
    case DType::kU8: fill_parallel(x.data<uint8_t>(), n, static_cast<uint8_t>(value)); return;
    case DType::kF32: fill_parallel(x.data<float>(), n, static_cast<float>(value)); return;
    case DType::kF64: fill_parallel(x.data<double>(), n, value); return;
    default:
      for (int64_t i = 0; i < n; ++i) store(x.raw_data(), x.dtype(), i, value);
  }
}

void fill_normal(Tensor& x, uint64_t seed, uint64_t key, int64_t first, double std) {
  check_arg(x, "fill_normal", "x");
  ST_CHECK(is_floating(x.dtype()), "fill_normal: x must be a floating dtype, found ", x.str());
  const int64_t n = x.numel();
  void* p = x.raw_data();
  const DType t = x.dtype();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i)
    store(p, t, i, std * random_math::normal_at(seed, key, static_cast<uint64_t>(first + i)));
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  check_arg(out, "add", "out");
  check_arg(a, "add", "a", out.dtype(), out.shape());
  check_arg(b, "add", "b", out.dtype(), out.shape());
  const int64_t n = out.numel();
  dispatch_real(out, "add", "out", [&]<typename T>() {
    T* o = out.data<T>();
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) o[i] = pa[i] + pb[i];
  });
}

void scale(Tensor& x, double factor) {
  check_arg(x, "scale", "x");
  const int64_t n = x.numel();
  dispatch_real(x, "scale", "x", [&]<typename T>() {
    T* p = x.data<T>();
    const T f = static_cast<T>(factor);
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) p[i] *= f;
  });
}

void softcap(Tensor& x, double cap) {
  check_arg(x, "softcap", "x");
  ST_CHECK(cap > 0, "softcap: the cap must be > 0, found ", cap);
  const int64_t n = x.numel();
  dispatch_real(x, "softcap", "x", [&]<typename T>() {
    T* p = x.data<T>();
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(cap * std::tanh(static_cast<double>(p[i]) / cap));
  });
}

void cast(Tensor& out, const Tensor& in) {
  check_arg(out, "cast", "out");
  check_arg(in, "cast", "in");
  check_shape(in, out.shape(), "cast", "in");
  ST_CHECK(is_floating(out.dtype()) && is_floating(in.dtype()), "cast: floating dtypes only, found ",
           dtype_name(in.dtype()), " -> ", dtype_name(out.dtype()));
  const int64_t n = out.numel();
  if (out.dtype() == in.dtype()) {
    if (out.raw_data() != in.raw_data()) std::memcpy(out.raw_data(), in.raw_data(), out.nbytes());
    return;
  }
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) store(out.raw_data(), out.dtype(), i, load(in.raw_data(), in.dtype(), i));
}

void sum_squares(Tensor& out_1, const Tensor& x) {
  check_arg(out_1, "sum_squares", "out_1", DType::kF64, {1});
  check_arg(x, "sum_squares", "x");
  ST_CHECK(is_floating(x.dtype()), "sum_squares: `x` must be floating, found ", dtype_name(x.dtype()));
  const int64_t n = x.numel();
  double s = 0;
  // fixed chunking keeps the summation order independent of the thread count
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    double acc = 0;
    const int64_t end = std::min(n, (c + 1) * kChunk);
    if (x.dtype() == DType::kF32) {
      // the common case (f32 gradient shards): eight running sums, so the adds do not wait on
      // each other and the loop streams at memory speed; each square is exact in f64
      const float* f = x.data<float>();
      double lane[8] = {};
      int64_t i = c * kChunk;
      for (; i + 8 <= end; i += 8)
        for (int k = 0; k < 8; ++k) lane[k] += static_cast<double>(f[i + k]) * static_cast<double>(f[i + k]);
      for (; i < end; ++i) lane[0] += static_cast<double>(f[i]) * static_cast<double>(f[i]);
      acc = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    } else {
      for (int64_t i = c * kChunk; i < end; ++i) {
        const double v = load(x.raw_data(), x.dtype(), i);
        acc += v * v;
      }
    }
    partial[static_cast<size_t>(c)] = acc;
  }
  for (double p : partial) s += p;
  out_1.data<double>()[0] += s;
}

}  // namespace shardtrain::ops::cpu
