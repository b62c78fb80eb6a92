// One cuBLASLt product as ops::linear issues it, for the GEMM benchmarks: bf16 A and B, f32
// accumulation, bf16 or f32 C = D, column-major with optional transposes.
#pragma once

#include <cublasLt.h>

#include "bench_util.h"

namespace shardtrain::bench {

constexpr size_t kGemmWorkspace = size_t{32} << 20;  // ops::linear's workspace

// D[m, n] = op(A) op(B) (+ D when accumulate); A is [m, k] (stored [k, m] when ta), B is
// [k, n] (stored [n, k] when tb).
struct GemmProblem {
  int64_t m, n, k, lda, ldb, ldc;
  bool ta, tb, accumulate, f32_out;
};

// A problem's cuBLASLt descriptors, destroyed with the object. sm_count_target > 0 holds the
// product to that many SMs.
class GemmDescs {
 public:
  explicit GemmDescs(const GemmProblem& p, int sm_count_target = 0) : beta_(p.accumulate ? 1.0f : 0.0f) {
    ST_BENCH_CUBLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    ST_BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    ST_BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (sm_count_target > 0)
      ST_BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_count_target,
                                                     sizeof sm_count_target));
    ST_BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, p.ta ? p.k : p.m, p.ta ? p.m : p.k, p.lda));
    ST_BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, p.tb ? p.n : p.k, p.tb ? p.k : p.n, p.ldb));
    ST_BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&c, out_type(p), p.m, p.n, p.ldc));
  }
  ~GemmDescs() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
  }
  GemmDescs(const GemmDescs&) = delete;
  GemmDescs& operator=(const GemmDescs&) = delete;

  static cudaDataType_t out_type(const GemmProblem& p) { return p.f32_out ? CUDA_R_32F : CUDA_R_16BF; }

  // Fills `out` with up to `count` of the heuristic's candidates, asked for as ops::linear
  // asks (a workspace of at most kGemmWorkspace, split-K partial sums reduced in f32 only);
  // returns how many. (An array, not a vector: nvcc 13.0's front end crashes on a vector of
  // these structs in .cu files.)
  int heuristic(cublasLtHandle_t lt, int count, cublasLtMatmulHeuristicResult_t* out) const {
    cublasLtMatmulPreference_t pref;
    ST_BENCH_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kGemmWorkspace;
    ST_BENCH_CUBLAS(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    ST_BENCH_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                         sizeof schemes));
    int found = 0;
    ST_BENCH_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, count, out, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    ST_CHECK(found > 0, "no cuBLASLt algorithm for this product");
    return found;
  }

  // D = A B (+ D) with `algo`, on `stream`.
  cublasStatus_t run(cublasLtHandle_t lt, const cublasLtMatmulAlgo_t& algo, const void* a_data, const void* b_data,
                     void* d_data, void* workspace, cudaStream_t stream) const {
    const float alpha = 1;
    return cublasLtMatmul(lt, op, &alpha, a_data, a, b_data, b, &beta_, d_data, c, d_data, c, &algo, workspace,
                          kGemmWorkspace, stream);
  }

  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;

 private:
  float beta_;
};

}  // namespace shardtrain::bench
