// Comparison and random-fill helpers for tests; values are read through f64.
#include "testing/compare.h"

#include <cmath>
#include <sstream>
#include <cstring>
#include <vector>

#include "core/random.h"

namespace shardtrain::testing {
namespace {

double read_at(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32: return t.data<float>()[i];
    case DType::kF64: return t.data<double>()[i];
    case DType::kBF16: return bf16_to_float(t.data<BFloat16>()[i]);
    case DType::kF16: return f16_to_float(t.data<Float16>()[i]);
    case DType::kI32: return t.data<int32_t>()[i];
    case DType::kI64: return static_cast<double>(t.data<int64_t>()[i]);
    case DType::kU8: return t.data<uint8_t>()[i];
  }
  return 0;
}

void write_at(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::kF32: t.data<float>()[i] = static_cast<float>(v); return;
    case DType::kF64: t.data<double>()[i] = v; return;
    case DType::kBF16: t.data<BFloat16>()[i] = float_to_bf16(static_cast<float>(v)); return;
    case DType::kF16: t.data<Float16>()[i] = float_to_f16(static_cast<float>(v)); return;
    case DType::kI32: t.data<int32_t>()[i] = static_cast<int32_t>(v); return;
    case DType::kI64: t.data<int64_t>()[i] = static_cast<int64_t>(v); return;
    case DType::kU8: t.data<uint8_t>()[i] = static_cast<uint8_t>(v); return;
  }
}

}  // namespace

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& reference, const Tolerance& tol) {
  if (!(actual.shape() == reference.shape())) {
    return ::testing::AssertionFailure() << "shape " << actual.shape().str() << " vs reference "
                                         << reference.shape().str();
  }
  const Tensor a = to_f64(actual);
  const Tensor r = to_f64(reference);
  const double* pa = a.data<double>();
  const double* pr = r.data<double>();
  double diff2 = 0, ref2 = 0, worst_excess = -1;
  int64_t worst = -1, bad = 0;
  bool nan = false;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = pa[i] - pr[i];
    if (std::isnan(pa[i]) != std::isnan(pr[i])) nan = true;
    diff2 += d * d;
    ref2 += pr[i] * pr[i];
    const double excess = std::fabs(d) - (tol.atol + tol.rtol * std::fabs(pr[i]));
    if (excess > 0 || std::isnan(d)) ++bad;
    if (worst < 0 || excess > worst_excess || std::isnan(d)) {
      worst_excess = std::isnan(d) ? INFINITY : excess;
      worst = i;
    }
  }
  const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  std::ostringstream msg;
  msg.precision(9);
  msg << actual.str() << ": rel-norm " << rel << " (limit " << tol.rel_norm << "), " << bad
      << " elements over atol " << tol.atol << " + rtol " << tol.rtol << "·|ref|";
  if (worst >= 0) msg << "; worst at flat index " << worst << ": " << pa[worst] << " vs ref " << pr[worst];
  if (nan || !(rel <= tol.rel_norm) || bad > 0) return ::testing::AssertionFailure() << msg.str();
  return ::testing::AssertionSuccess() << msg.str();
}

void fill_random(Tensor& x, uint64_t seed, double mean, double scale) {
  const uint64_t key = name_key("fill_random");
  for (int64_t i = 0; i < x.numel(); ++i)
    write_at(x, i, mean + scale * normal_at(seed, key, static_cast<uint64_t>(i)));
}

void fill_random_ints(Tensor& x, uint64_t seed, int64_t low, int64_t high) {
  CounterRng rng(seed);
  for (int64_t i = 0; i < x.numel(); ++i)
    write_at(x, i, static_cast<double>(low + static_cast<int64_t>(rng.next_below(static_cast<uint64_t>(high - low)))));
}

Tensor to_dtype(const Tensor& x, DType dtype) {
  ST_CHECK(x.device().is_cpu(), "to_dtype: host tensors only, found ", x.str());
  Tensor src = x;
  if (!src.is_contiguous()) {
    // gather a strided view element by element (tests only)
    Tensor c = Tensor::empty(x.shape(), x.dtype());
    std::vector<int64_t> idx(static_cast<size_t>(x.ndim()), 0);
    const size_t es = dtype_size(x.dtype());
    for (int64_t n = 0; n < x.numel(); ++n) {
      int64_t off = 0;
      for (int d = 0; d < x.ndim(); ++d) off += idx[static_cast<size_t>(d)] * x.stride(d);
      std::memcpy(static_cast<char*>(c.raw_data()) + n * static_cast<int64_t>(es),
                  static_cast<const char*>(x.raw_data()) + off * static_cast<int64_t>(es), es);
      for (int d = x.ndim() - 1; d >= 0; --d) {
        if (++idx[static_cast<size_t>(d)] < x.size(d)) break;
        idx[static_cast<size_t>(d)] = 0;
      }
    }
    src = c;
  }
  Tensor out = Tensor::empty(x.shape(), dtype);
  for (int64_t i = 0; i < x.numel(); ++i) write_at(out, i, read_at(src, i));
  return out;
}

Tensor to_f64(const Tensor& x) { return to_dtype(x, DType::kF64); }

Tensor rounded_f32(const Shape& shape, DType dtype, uint64_t seed, double mean, double scale) {
  Tensor h = Tensor::empty(shape, DType::kF64);
  fill_random(h, seed, mean, scale);
  return to_dtype(to_dtype(h, dtype), DType::kF32);
}

}  // namespace shardtrain::testing
