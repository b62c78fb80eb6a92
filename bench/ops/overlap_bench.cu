// Can a weight-gradient GEMM hide the block backward's streaming passes? On a board at
// its power cap a GEMM's speed follows its energy, so giving it fewer SMs may cost less
// than their share, and a memory-bound pass run beside it on the SMs left over uses the
// bandwidth the GEMM leaves idle. Shapes of the Llama 3.2 1B MLP at 8 x 4096 tokens:
//   GEMM: the down projection's weight gradient dW[D, F] = dy^T h (f32 out, K = 32768 tokens)
//   pass: the SwiGLU backward (dh, gate, up read; dgate, dup written over gate, up)
// Timed sustained (2 s of load first, then three interleaved rounds of ~100 ms of
// back-to-back repetitions, the median round), per repetition:
//   gemm(k)      the GEMM alone with cuBLASLt's SM count target k (0: all SMs)
//   pass         the SwiGLU backward alone
//   serial       GEMM then pass on one stream (what the engine does now)
//   overlap(k)   the GEMM on a low-priority stream limited to k SMs, the pass on a high-priority
//                stream, joined by events every repetition
// Every variant's weight gradient is checked against the all-SM product before timing.
//   overlap_bench [sm targets, comma-separated: default 0,128,124,120,116,112,104]
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "gemm_problem.h"
#include "core/cuda/device.h"
#include "ops/swiglu.h"

namespace {

using namespace shardtrain;
using namespace shardtrain::bench;

// dW'[m = F, n = D] = h'[F, T] dy'[D, T]^T, column-major as ops::linear issues it, with the
// heuristic's first algorithm for an SM count target (0: all SMs) and a workspace of its own.
struct WeightGrad {
  cublasLtHandle_t lt;
  GemmDescs descs;
  cublasLtMatmulAlgo_t algo;
  Tensor ws;

  WeightGrad(cublasLtHandle_t handle, int64_t m, int64_t n, int64_t k, int sms)
      : lt(handle), descs({m, n, k, m, n, m, false, true, false, true}, sms) {
    ws = Tensor::empty({static_cast<int64_t>(kGemmWorkspace)}, DType::kU8, Device::cuda(0), "workspace");
    cublasLtMatmulHeuristicResult_t first;
    descs.heuristic(lt, 1, &first);
    algo = first.algo;
  }
  void run(const Tensor& a, const Tensor& b, Tensor& c, cudaStream_t s) const {
    ST_BENCH_CUBLAS(descs.run(lt, algo, a.raw_data(), b.raw_data(), c.raw_data(), ws.raw_data(), s));
  }
};

}  // namespace

int main(int argc, char** argv) try {
  std::vector<int> targets{0, 128, 124, 120, 116, 112, 104};
  if (argc > 1) {
    targets.clear();
    std::stringstream ss(argv[1]);
    for (std::string t; std::getline(ss, t, ',');) targets.push_back(std::stoi(t));
  }
  ST_CHECK(cuda::device_count() > 0, "overlap_bench: no CUDA device");
  cuda::init_device(0);
  const int64_t T = 8 * 4096, D = 2048, F = 8192;
  cublasLtHandle_t lt;
  ST_BENCH_CUBLAS(cublasLtCreate(&lt));
  Tensor h = dev_normal({T, F}, DType::kBF16, 1), dy = dev_normal({T, D}, DType::kBF16, 2, 0.05);
  Tensor dw = Tensor::empty({D, F}, DType::kF32, Device::cuda(0), "dW");
  Tensor gate = dev_normal({T, F}, DType::kBF16, 3), up = dev_normal({T, F}, DType::kBF16, 4);
  Tensor dh = dev_normal({T, F}, DType::kBF16, 5, 0.01), none;

  int lo = 0, hi = 0;
  ST_BENCH_CUDA(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t main_s, side_s;
  ST_BENCH_CUDA(cudaStreamCreateWithPriority(&main_s, cudaStreamNonBlocking, hi));
  ST_BENCH_CUDA(cudaStreamCreateWithPriority(&side_s, cudaStreamNonBlocking, lo));
  cudaEvent_t fork, join;
  ST_BENCH_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  ST_BENCH_CUDA(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  // Every variant is issued on main_s, framed by the legacy stream's events: main_s waits
  // for the legacy stream first and the legacy stream for main_s after.
  cudaEvent_t enter, leave;
  ST_BENCH_CUDA(cudaEventCreateWithFlags(&enter, cudaEventDisableTiming));
  ST_BENCH_CUDA(cudaEventCreateWithFlags(&leave, cudaEventDisableTiming));
  auto framed = [&](const std::function<void()>& body) {
    return [&, body] {
      ST_BENCH_CUDA(cudaEventRecord(enter, nullptr));
      ST_BENCH_CUDA(cudaStreamWaitEvent(main_s, enter));
      body();
      ST_BENCH_CUDA(cudaEventRecord(leave, main_s));
      ST_BENCH_CUDA(cudaStreamWaitEvent(nullptr, leave));
    };
  };
  // The pass reads gate/up and writes dgate/dup in place: the data drifts, the traffic does not.
  auto pass = [&] { ops::cuda::swiglu_backward(gate, up, none, dh, gate, up, Tensor(), ops::GluActivation::kSilu, Stream{main_s}); };

  std::vector<std::unique_ptr<WeightGrad>> gemms;
  for (int k : targets) gemms.push_back(std::make_unique<WeightGrad>(lt, F, D, T, k));
  std::vector<std::function<void()>> fns;
  std::vector<std::string> names;
  for (size_t i = 0; i < targets.size(); ++i) {
    names.push_back("gemm(" + std::to_string(targets[i]) + ")");
    fns.push_back(framed([&, i] { gemms[i]->run(h, dy, dw, main_s); }));
  }
  names.push_back("pass");
  fns.push_back(framed(pass));
  names.push_back("serial");
  fns.push_back(framed([&] {
    gemms[0]->run(h, dy, dw, main_s);
    pass();
  }));
  for (size_t i = 0; i < targets.size(); ++i) {
    names.push_back("overlap(" + std::to_string(targets[i]) + ")");
    fns.push_back(framed([&, i] {
      ST_BENCH_CUDA(cudaEventRecord(fork, main_s));
      ST_BENCH_CUDA(cudaStreamWaitEvent(side_s, fork));
      gemms[i]->run(h, dy, dw, side_s);
      pass();
      ST_BENCH_CUDA(cudaEventRecord(join, side_s));
      ST_BENCH_CUDA(cudaStreamWaitEvent(main_s, join));
    }));
  }
  // Before timing: the GEMM of every variant (any SM target, alone or beside the pass)
  // writes the all-SM product (f32 sums of the same bf16 inputs, up to summation order).
  gemms[0]->run(h, dy, dw, main_s);
  ST_BENCH_CUDA(cudaStreamSynchronize(main_s));
  const Tensor reference = host_of(dw);
  for (size_t i = 0; i < fns.size(); ++i) {
    if (names[i] == "pass") continue;
    ops::fill(dw, 0.0);
    fns[i]();
    synchronize(Device::cuda(0));
    const double e = rel_err(dw, reference);
    ST_CHECK(e < f32_sum_tolerance(T), "overlap_bench: ", names[i], "'s weight gradient differs from the all-SM product: ", e);
  }
  std::printf("# check: every variant's weight gradient equals the all-SM product to within f32 summation\n");
  std::printf("# %s; dW[%lld, %lld] over %lld tokens (%.1f GFLOP) and a SwiGLU backward over [%lld, %lld]; "
              "sustained, median of 3 rounds\n",
              cuda::device_name(0).c_str(), static_cast<long long>(D), static_cast<long long>(F),
              static_cast<long long>(T), 2.0 * T * D * F / 1e9, static_cast<long long>(T), static_cast<long long>(F));
  const std::vector<double> ms = time_sustained_ms(fns, 100, 2000);
  const double flops = 2.0 * T * D * F;
  for (size_t i = 0; i < fns.size(); ++i)
    std::printf("| %-14s | %7.3f ms | %6.0f TFLOP/s of the GEMM |\n", names[i].c_str(), ms[i],
                flops / ms[i] / 1e9);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "overlap_bench: %s\n", e.what());
  return 1;
}
