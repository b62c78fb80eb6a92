// Would one GEMM over the stacked projections beat one per projection? q, k and v share
// their input, as do gate and up, and their weights lie back to back in a block's unit (the
// layout adds them in that order), so each group could run as one product: forward with
// N = Q + 2K (or 2F) into one output, the input gradient as one product with K = Q + 2K (or
// 2F) instead of one per projection accumulating into dx, and the weight gradients as one
// product over the stacked rows. This times both ways at the Llama-3.2-1B block shape
// (sustained, as bench_util.h's time_sustained_ms), after checking that the stacked results
// match the separate ones. The engine runs the separate products today.
//   proj_fusion_bench [tokens = 32768]
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/cuda/device.h"
#include "ops/linear.h"

namespace {

using namespace shardtrain;
using namespace shardtrain::bench;

struct Case {
  std::string name;
  std::function<void()> separate, stacked;
  double flops;
};

// Projections of one input x [T, D] to outputs of widths `widths`, stacked in one weight.
// Checks the stacked products against the separate ones, then adds both ways to `cases`.
void add_group(std::vector<Case>& cases, const char* group, int64_t T, int64_t D, const std::vector<int64_t>& widths,
               uint64_t seed) {
  int64_t total = 0;
  for (int64_t w : widths) total += w;
  const Device gpu = Device::cuda(0);
  Tensor x = dev_normal({T, D}, DType::kBF16, seed), w = dev_normal({total, D}, DType::kBF16, seed + 1, 0.02);
  Tensor y = Tensor::empty({T, total}, DType::kBF16, gpu, "y stacked");
  Tensor dy = dev_normal({T, total}, DType::kBF16, seed + 2);
  Tensor dx_sep = Tensor::empty({T, D}, DType::kBF16, gpu, "dx separate");
  Tensor dx_st = Tensor::empty({T, D}, DType::kBF16, gpu, "dx stacked");
  Tensor dw_sep = dev_zeros({total, D}), dw_st = dev_zeros({total, D}), none;
  // The separate products see contiguous per-projection tensors, as the engine keeps them;
  // each output gradient is its column block of the stacked one.
  const Tensor hdy = host_of(dy, DType::kF32);
  std::vector<Tensor> ws, ys, dys, dws;
  int64_t row = 0;
  for (int64_t width : widths) {
    ws.push_back(w.slice(0, row, row + width));
    dws.push_back(dw_sep.slice(0, row, row + width));
    ys.push_back(Tensor::empty({T, width}, DType::kBF16, gpu, "y separate"));
    Tensor block = Tensor::empty({T, width}, DType::kF32);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < width; ++c) block.data<float>()[t * width + c] = hdy.data<float>()[t * total + row + c];
    dys.push_back(Tensor::empty({T, width}, DType::kBF16, gpu, "dy separate"));
    ops::cast(dys.back(), block);
    row += width;
  }
  const size_t n = widths.size();
  const double flops = 2.0 * static_cast<double>(T) * static_cast<double>(D) * static_cast<double>(total);
  const Case forward{
      std::string(group) + " forward",
      [=]() mutable {
        for (size_t i = 0; i < n; ++i) ops::cuda::linear_forward(ys[i], x, ws[i], none, Stream{});
      },
      [=]() mutable { ops::cuda::linear_forward(y, x, w, none, Stream{}); }, flops};
  const Case input{
      std::string(group) + " input gradient",
      [=]() mutable {
        for (size_t i = 0; i < n; ++i)
          ops::cuda::linear_backward(dx_sep, none, none, dys[i], none, ws[i], {.accumulate_dx = i > 0}, Stream{});
      },
      [=]() mutable { ops::cuda::linear_backward(dx_st, none, none, dy, none, w, {}, Stream{}); }, flops};
  const Case weight{
      std::string(group) + " weight gradient",
      [=]() mutable {
        for (size_t i = 0; i < n; ++i)
          ops::cuda::linear_backward(none, dws[i], none, dys[i], x, ws[i], {.overwrite_dweight = true}, Stream{});
      },
      [=]() mutable { ops::cuda::linear_backward(none, dw_st, none, dy, x, w, {.overwrite_dweight = true}, Stream{}); },
      flops};
  for (const Case* c : {&forward, &input, &weight}) {
    c->separate();
    c->stacked();
  }
  // The stacked forward equals the separate products block by block; the stacked input
  // gradient (one f32 sum, rounded once) the separate ones (each partial sum rounded to bf16
  // before the next adds) within that rounding; the f32 weight gradients to f32 summation order.
  const Tensor hy = host_of(y);
  int64_t differ = 0;
  row = 0;
  for (size_t i = 0; i < n; ++i) {
    const Tensor hyi = host_of(ys[i]);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < widths[i]; ++c)
        differ += hyi.data<double>()[t * widths[i] + c] != hy.data<double>()[t * total + row + c];
    row += widths[i];
  }
  ST_CHECK(differ == 0, "proj_fusion_bench: ", group, " stacked forward differs from the separate one in ", differ,
           " elements");
  const double dx_err = rel_err(dx_st, dx_sep), dw_err = rel_err(dw_st, dw_sep);
  std::printf("# check %s: forward equal per block; stacked vs separate: input gradient %.2e, weight gradient "
              "%.2e relative\n",
              group, dx_err, dw_err);
  ST_CHECK(dx_err < 1e-2, "proj_fusion_bench: ", group, " input gradients differ: ", dx_err);
  ST_CHECK(dw_err < f32_sum_tolerance(T), "proj_fusion_bench: ", group, " weight gradients differ: ", dw_err);
  cases.push_back(forward);
  cases.push_back(input);
  cases.push_back(weight);
}

}  // namespace

int main(int argc, char** argv) try {
  const int64_t T = argc > 1 ? std::stoll(argv[1]) : 32768, D = 2048;
  ST_CHECK(cuda::device_count() > 0, "proj_fusion_bench: no CUDA device");
  cuda::init_device(0);
  std::vector<Case> cases;
  add_group(cases, "q/k/v", T, D, {2048, 512, 512}, 100);
  add_group(cases, "gate/up", T, D, {8192, 8192}, 200);
  std::vector<std::function<void()>> fns;
  for (const Case& c : cases) {
    fns.push_back(c.separate);
    fns.push_back(c.stacked);
  }
  const std::vector<double> ms = time_sustained_ms(fns, 100, 2000);
  std::printf("# %s; T %lld, D %lld; sustained, median of 3 rounds\n", cuda::device_name(0).c_str(),
              static_cast<long long>(T), static_cast<long long>(D));
  std::printf("| product | separate | stacked | stacked / separate |\n|---|---|---|---|\n");
  for (size_t i = 0; i < cases.size(); ++i) {
    const double a = ms[2 * i], b = ms[2 * i + 1];
    std::printf("| %s | %.3f ms (%.0f TFLOP/s) | %.3f ms (%.0f TFLOP/s) | %.3f |\n", cases[i].name.c_str(), a,
                cases[i].flops / a / 1e9, b, cases[i].flops / b / 1e9, b / a);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "proj_fusion_bench: %s\n", e.what());
  return 1;
}
