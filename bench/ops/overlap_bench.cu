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
//   overlap_bench [sm targets, comma-separated: default 0,128,124,120,116,112,104]
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/cuda/device.h"
#include "ops/swiglu.h"

namespace {

using namespace shardtrain;
using namespace shardtrain::bench;

#define CHECK_LT(expr)                                                              \
  do {                                                                              \
    const cublasStatus_t s_ = (expr);                                               \
    ST_CHECK(s_ == CUBLAS_STATUS_SUCCESS, "cuBLASLt error ", static_cast<int>(s_), \
             " in `", #expr, "`");                                                  \
  } while (0)
#define CHECK_RT(expr)                                                                         \
  do {                                                                                         \
    const cudaError_t e_ = (expr);                                                             \
    ST_CHECK(e_ == cudaSuccess, "CUDA error ", cudaGetErrorString(e_), " in `", #expr, "`"); \
  } while (0)

constexpr size_t kWorkspace = size_t{32} << 20;

// dW'[m = F, n = D] = h'[F, T] dy'[D, T]^T, column-major as ops::linear issues it.
struct WeightGrad {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
  Tensor ws;

  WeightGrad(cublasLtHandle_t handle, int64_t m, int64_t n, int64_t k, int sms) : lt(handle) {
    ws = Tensor::empty({static_cast<int64_t>(kWorkspace)}, DType::kU8, Device::cuda(0), "workspace");
    CHECK_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_T;
    CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (sms > 0) CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof sms));
    CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, m, k, m));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, n, k, n));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, m));
    cublasLtMatmulPreference_t pref;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    const size_t wsb = kWorkspace;
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                  sizeof schemes));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &result, &found));
    ST_CHECK(found > 0, "overlap_bench: no algorithm for SM target ", sms);
    algo = result.algo;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  void run(const Tensor& a, const Tensor& b, Tensor& c, cudaStream_t s) const {
    const float alpha = 1, beta = 0;
    CHECK_LT(cublasLtMatmul(lt, op, &alpha, a.raw_data(), la, b.raw_data(), lb, &beta, c.raw_data(), lc,
                            c.raw_data(), lc, &algo, ws.raw_data(), kWorkspace, s));
  }
};

double time_calls_ms(const std::function<void()>& fn, int calls) {
  cuda::Event start, stop;
  start.record(Stream{});
  for (int i = 0; i < calls; ++i) fn();
  stop.record(Stream{});
  stop.synchronize();
  return stop.elapsed_ms_since(start) / calls;
}

std::vector<double> time_sustained_ms(const std::vector<std::function<void()>>& fns) {
  std::vector<int> calls;
  for (const auto& fn : fns) {
    fn();
    calls.push_back(static_cast<int>(100 / time_calls_ms(fn, 1)) + 1);
  }
  time_calls_ms(fns[0], calls[0] * 20);
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
  CHECK_LT(cublasLtCreate(&lt));
  Tensor h = dev_normal({T, F}, DType::kBF16, 1), dy = dev_normal({T, D}, DType::kBF16, 2, 0.05);
  Tensor dw = Tensor::empty({D, F}, DType::kF32, Device::cuda(0), "dW");
  Tensor gate = dev_normal({T, F}, DType::kBF16, 3), up = dev_normal({T, F}, DType::kBF16, 4);
  Tensor dh = dev_normal({T, F}, DType::kBF16, 5, 0.01), none;

  int lo = 0, hi = 0;
  CHECK_RT(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t main_s, side_s;
  CHECK_RT(cudaStreamCreateWithPriority(&main_s, cudaStreamNonBlocking, hi));
  CHECK_RT(cudaStreamCreateWithPriority(&side_s, cudaStreamNonBlocking, lo));
  cudaEvent_t fork, join;
  CHECK_RT(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK_RT(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  // Every variant is issued on main_s, framed by the legacy stream's events: main_s waits
  // for the legacy stream first and the legacy stream for main_s after.
  cudaEvent_t enter, leave;
  CHECK_RT(cudaEventCreateWithFlags(&enter, cudaEventDisableTiming));
  CHECK_RT(cudaEventCreateWithFlags(&leave, cudaEventDisableTiming));
  auto framed = [&](const std::function<void()>& body) {
    return [&, body] {
      CHECK_RT(cudaEventRecord(enter, nullptr));
      CHECK_RT(cudaStreamWaitEvent(main_s, enter));
      body();
      CHECK_RT(cudaEventRecord(leave, main_s));
      CHECK_RT(cudaStreamWaitEvent(nullptr, leave));
    };
  };
  // The pass reads gate/up and writes dgate/dup in place: the data drifts, the traffic does not.
  auto pass = [&] { ops::cuda::swiglu_backward(gate, up, none, dh, gate, up, Stream{main_s}); };

  std::vector<WeightGrad> gemms;
  for (int k : targets) gemms.emplace_back(lt, F, D, T, k);
  std::vector<std::function<void()>> fns;
  std::vector<std::string> names;
  for (size_t i = 0; i < targets.size(); ++i) {
    names.push_back("gemm(" + std::to_string(targets[i]) + ")");
    fns.push_back(framed([&, i] { gemms[i].run(h, dy, dw, main_s); }));
  }
  names.push_back("pass");
  fns.push_back(framed(pass));
  names.push_back("serial");
  fns.push_back(framed([&] {
    gemms[0].run(h, dy, dw, main_s);
    pass();
  }));
  for (size_t i = 0; i < targets.size(); ++i) {
    names.push_back("overlap(" + std::to_string(targets[i]) + ")");
    fns.push_back(framed([&, i] {
      CHECK_RT(cudaEventRecord(fork, main_s));
      CHECK_RT(cudaStreamWaitEvent(side_s, fork));
      gemms[i].run(h, dy, dw, side_s);
      pass();
      CHECK_RT(cudaEventRecord(join, side_s));
      CHECK_RT(cudaStreamWaitEvent(main_s, join));
    }));
  }
  std::printf("# %s; dW[%lld, %lld] over %lld tokens (%.1f GFLOP) and a SwiGLU backward over [%lld, %lld]; "
              "sustained, median of 3 rounds\n",
              cuda::device_name(0).c_str(), static_cast<long long>(D), static_cast<long long>(F),
              static_cast<long long>(T), 2.0 * T * D * F / 1e9, static_cast<long long>(T), static_cast<long long>(F));
  const std::vector<double> ms = time_sustained_ms(fns);
  const double flops = 2.0 * T * D * F;
  for (size_t i = 0; i < fns.size(); ++i)
    std::printf("| %-14s | %7.3f ms | %6.0f TFLOP/s of the GEMM |\n", names[i].c_str(), ms[i],
                flops / ms[i] / 1e9);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "overlap_bench: %s\n", e.what());
  return 1;
}
