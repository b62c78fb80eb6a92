// The host side of ZeRO-3 with CPU offload (parallel.offload): the fused f32 host AdamW
// (30 bytes per element: read p, g, m, v; write p, m, v and the bf16 copy) and the gradient
// norm's sum of squares (4 bytes per element) in GB/s, against the host's streaming ceiling
// measured the same way: a threaded copy (8 bytes per element). Every buffer is first
// touched by the threads that later stream it. CPU only: run it on the
// machine whose host cores the offloaded step uses.
//   host_optimizer_bench [elements=1235814400 (the 1B shape)] [iterations=5]
// OMP_NUM_THREADS sets the threads (default: every core).
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/adamw.h"
#include "ops/elementwise.h"

namespace {

using namespace shardtrain;

// Fills `t` (f32) with small values, each thread the static share it will later stream.
void first_touch(Tensor& t, float scale) {
  float* p = t.data<float>();
  const int64_t n = t.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = scale * static_cast<float>((i * 2654435761u) % 1000) / 1000.0f;
}

template <typename F>
double best_ms(F&& f, int iterations) {
  f();  // warm-up
  double best = 1e300;
  for (int k = 0; k < iterations; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) try {
  const int64_t n = argc > 1 ? std::stoll(argv[1]) : 1235814400;
  const int iterations = argc > 2 ? std::stoi(argv[2]) : 5;
  ST_CHECK(n > 0 && iterations > 0, "host_optimizer_bench: expected elements > 0 and iterations > 0");
  std::printf("# %lld f32 elements, %d threads, best of %d\n", static_cast<long long>(n), omp_get_max_threads(),
              iterations);
  Tensor p = Tensor::empty({n}, DType::kF32), g = Tensor::empty({n}, DType::kF32);
  Tensor m = Tensor::empty({n}, DType::kF32), v = Tensor::empty({n}, DType::kF32);
  Tensor copy = Tensor::empty({n}, DType::kBF16);
  first_touch(p, 0.02f);
  first_touch(g, 1e-3f);
  first_touch(m, 0.0f);
  first_touch(v, 0.0f);
  {
    BFloat16* c = copy.data<BFloat16>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) c[i] = BFloat16{};
  }
  const double e = static_cast<double>(n);
  auto row = [&](const char* what, double ms, double bytes_per_element) {
    std::printf("| %s | %.1f ms | %.1f GB/s |\n", what, ms, bytes_per_element * e / ms / 1e6);
  };
  std::printf("| op | time | bandwidth |\n|---|---|---|\n");
  {
    const float* src = p.data<float>();
    float* dst = m.data<float>();
    row("copy (read 4 + write 4 bytes)", best_ms([&] {
#pragma omp parallel for schedule(static)
          for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
        }, iterations), 8);
    first_touch(m, 0.0f);
  }
  {
    Tensor out = Tensor::zeros({1}, DType::kF64);
    row("gradient sum of squares, ops::sum_squares (4 bytes)", best_ms([&] { ops::sum_squares(out, g); }, iterations),
        4);
  }
  {
    std::vector<ops::AdamWTensors> ts(1);
    ts[0] = {p, m, v, g, true, copy};
    ops::AdamWOptions o;
    o.host_f32 = true;
    o.weight_decay = 0.1;
    row("host AdamW writing the bf16 copy (30 bytes)", best_ms([&] {
          ++o.step;
          ops::adamw_step_multi(ts, o, 1.0);
        }, iterations), 30);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "host_optimizer_bench: %s\n", e.what());
  return 1;
}
