// CUDA linear layer through cuBLASLt. Row-major [rows, cols] tensors are column-major
// [cols, rows] matrices to cuBLAS, so every product is written transposed:
//   forward   Y'[O,T]  = W'^T X'          (y = x W^T)
//   dx        dX'[I,T] = W' dY'           (dx = dy W)
//   dweight   dW'[I,O] += X' dY'^T        (dW += dy^T x)
// Accumulation is f32 (CUBLAS_COMPUTE_32F, no TF32); the algorithm for each shape is
// chosen once (the heuristic's first, or the fastest of its candidates on a timed first
// call: ops::set_gemm_selection) and cached. The bias rides in the GEMM epilogue (one
// rounding); its gradient is a deterministic column sum. With a bf16/f16 dx, accumulate_dx
// adds the product rounded to that dtype (as `dx += dy @ W` does in PyTorch). FP8 products
// (fp8_product) take both operands K-major (cuBLASLt's only FP8 layout on Hopper: transposed
// A, plain B) with their scales as device pointers, so a captured step replays them.
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/cuda/stream.h"
#include "ops/cuda/common.cuh"
#include "ops/linear.h"

namespace shardtrain::ops::cuda {
namespace {

#define ST_CUBLAS_CHECK(expr)                                                                            \
  do {                                                                                                   \
    const cublasStatus_t st_cublas_status_ = (expr);                                                     \
    if (st_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                                      \
      ST_THROW("cuBLAS error ", static_cast<int>(st_cublas_status_), " (", cublasGetStatusName(st_cublas_status_), \
               ") in `", #expr, "` at ", __FILE__, ":", __LINE__);                                       \
  } while (0)

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kCandidates = 8;                        // timed selection: candidates tried
constexpr int64_t kScratchLimit = int64_t{256} << 20;  // timed selection: largest scratch output

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    case DType::kF8E4M3: return CUDA_R_8F_E4M3;
    case DType::kF8E5M2: return CUDA_R_8F_E5M2;
    default: ST_THROW("linear: no cuBLASLt path for dtype ", dtype_name(t), " (use f32, bf16 or f16)");
  }
}

struct GemmKey {
  int device;
  int64_t m, n, k, lda, ldb, ldc;
  bool ta, tb, accumulate;
  DType ab, cd;
  bool bias = false;  // bias epilogue: D += bias broadcast over columns (one rounding)
  bool timed = false;  // chosen by timing (GemmSelection::kTimed)
  int sm_target = 0;   // SMs planned for (cuBLASLt's SM count target; 0: the device's), ops::GemmSmReserve
  // FP8 (ab an FP8 format): B's format, each operand's scale mode, fast accumulation
  DType b_fp8 = DType::kF8E4M3;
  Fp8Scaling a_scaling = Fp8Scaling::kTensor, b_scaling = Fp8Scaling::kTensor;
  bool fast_accumulation = false;
  auto tie() const {
    return std::tie(device, m, n, k, lda, ldb, ldc, ta, tb, accumulate, ab, cd, bias, timed, sm_target, b_fp8,
                    a_scaling, b_scaling, fast_accumulation);
  }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

std::atomic<size_t> g_cached_algorithms{0};  // entries of every device's Lt::algos

// One handle and workspace per device; algorithms cached per problem.
struct Lt {
  cublasLtHandle_t handle = nullptr;
  Tensor workspace;
  std::map<GemmKey, cublasLtMatmulAlgo_t> algos;
};

Lt& lt_for_device(int device) {
  static std::mutex m;
  static std::map<int, Lt*> table;  // leaked: lives for the process
  std::lock_guard<std::mutex> lock(m);
  Lt*& lt = table[device];
  if (lt == nullptr) {
    lt = new Lt();
    ST_CUBLAS_CHECK(cublasLtCreate(&lt->handle));
    lt->workspace = Tensor::empty({static_cast<int64_t>(kWorkspaceBytes)}, DType::kU8, Device::cuda(device),
                                  "cuBLASLt workspace");
  }
  return *lt;
}

// Index of the fastest of `results` for this call, timed the way a training step runs them:
// back to back on a board at its power cap, where the clock sits far below its boost value
// and an algorithm's energy per FLOP decides its speed. Each candidate runs once untimed
// and once timed (to size its trial); the process's first selection then loads the board
// for kHeatMs; three rounds follow, each timing every candidate over back-to-back calls
// lasting about kTrialMs, interleaved so the drifting clock treats them alike; a
// candidate's time is its median round. `d` receives the trial products (the caller's
// output or scratch).
constexpr float kTrialMs = 20, kHeatMs = 300;
constexpr int kRounds = 3;

int fastest(Lt& lt, cublasLtMatmulDesc_t op_desc, const cublasLtMatmulHeuristicResult_t* results, int found,
            const void* a, cublasLtMatrixLayout_t la, const void* b, cublasLtMatrixLayout_t lb, float beta,
            const void* c, void* d, cublasLtMatrixLayout_t lc, cudaStream_t stream) {
  static bool heated = false;  // callers hold the algorithm cache's lock
  cudaEvent_t start, stop;
  ST_CUDA_CHECK(cudaEventCreate(&start));
  ST_CUDA_CHECK(cudaEventCreate(&stop));
  const float alpha = 1.0f;
  auto run = [&](int i) {
    return cublasLtMatmul(lt.handle, op_desc, &alpha, a, la, b, lb, &beta, c, lc, d, lc, &results[i].algo,
                          lt.workspace.raw_data(), kWorkspaceBytes, stream);
  };
  // Mean ms per call of `calls` back-to-back calls of candidate i.
  auto timed = [&](int i, int calls) {
    ST_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < calls; ++r) ST_CUBLAS_CHECK(run(i));
    ST_CUDA_CHECK(cudaEventRecord(stop, stream));
    ST_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    ST_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms / calls;
  };
  auto calls_for = [](float target_ms, float one_ms) {
    return static_cast<int>(std::clamp(target_ms / std::max(one_ms, 1e-3f), 1.0f, 10000.0f));
  };
  std::vector<int> usable, calls(found, 0);
  for (int i = 0; i < found; ++i) {
    if (run(i) != CUBLAS_STATUS_SUCCESS) continue;  // a candidate that refuses this call is skipped
    usable.push_back(i);
    calls[i] = calls_for(kTrialMs, timed(i, 1));
  }
  int best = usable.empty() ? 0 : usable[0];
  if (usable.size() > 1) {
    if (!heated) {
      timed(best, calls[best] * static_cast<int>(kHeatMs / kTrialMs));
      heated = true;
    }
    std::vector<std::array<float, kRounds>> ms(found);
    for (int round = 0; round < kRounds; ++round)
      for (int i : usable) ms[i][round] = timed(i, calls[i]);
    float best_ms = INFINITY;
    for (int i : usable) {
      std::sort(ms[i].begin(), ms[i].end());
      if (ms[i][kRounds / 2] < best_ms) {
        best_ms = ms[i][kRounds / 2];
        best = i;
      }
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

cublasLtMatmulMatrixScale_t scale_mode(Fp8Scaling scaling) {
  switch (scaling) {
    case Fp8Scaling::kTensor: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case Fp8Scaling::kRow: return CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    case Fp8Scaling::kBlock1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case Fp8Scaling::kBlock128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  }
  ST_THROW("linear: unknown FP8 scaling");
}

// D = A op B (+ C when accumulate) (+ bias per row of D), column-major. C is D itself, or
// `c_in` (same layout) when given. FP8 operands (key.ab an FP8 format) dequantise with the
// f32 scales at a_scale and b_scale (device memory, laid out per the key's scalings).
void gemm(GemmKey key, const void* a, const void* b, void* c, cudaStream_t stream, const void* bias = nullptr,
          const void* c_in = nullptr, const void* a_scale = nullptr, const void* b_scale = nullptr) {
  // A graph captured after an eager step replays the eager step's timed picks; a shape first
  // met during capture keeps the heuristic's choice (no trials inside a capture).
  key.timed = gemm_selection() == GemmSelection::kTimed;
  if (const int reserve = gemm_sm_reserve(); reserve > 0)
    key.sm_target = std::max(1, sm_count(key.device) - reserve);
  const bool capturing = shardtrain::cuda::is_capturing(Stream{stream});
  Lt& lt = lt_for_device(key.device);
  cublasLtMatmulDesc_t op_desc;
  ST_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // the descriptors live to the end of the call, also when a check below throws
  const std::unique_ptr<cublasLtMatmulDescOpaque_t, decltype(&cublasLtMatmulDescDestroy)> own_desc(
      op_desc, &cublasLtMatmulDescDestroy);
  if (key.sm_target > 0) {
    const int32_t sms = key.sm_target;
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof sms));
  }
  const bool fp8 = is_fp8(key.ab);
  if (fp8) {
    const int32_t a_mode = scale_mode(key.a_scaling), b_mode = scale_mode(key.b_scaling);
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof a_mode));
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof b_mode));
    ST_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof a_scale));
    ST_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof b_scale));
    const int8_t fast = key.fast_accumulation ? 1 : 0;
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  }
  const cublasOperation_t ta = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (key.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    const cudaDataType_t bias_type = cuda_type(key.cd);
    ST_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
  }
  cublasLtMatrixLayout_t la, lb, lc;
  const cudaDataType_t ab = cuda_type(key.ab), cd = cuda_type(key.cd), b_type = fp8 ? cuda_type(key.b_fp8) : ab;
  ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, ab, key.ta ? key.k : key.m, key.ta ? key.m : key.k, key.lda));
  ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, b_type, key.tb ? key.n : key.k, key.tb ? key.k : key.n, key.ldb));
  ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, cd, key.m, key.n, key.ldc));
  using OwnedLayout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, decltype(&cublasLtMatrixLayoutDestroy)>;
  const OwnedLayout own_la(la, &cublasLtMatrixLayoutDestroy), own_lb(lb, &cublasLtMatrixLayoutDestroy),
      own_lc(lc, &cublasLtMatrixLayoutDestroy);
  cublasLtMatmulAlgo_t algo;
  {
    static std::mutex m;
    std::lock_guard<std::mutex> lock(m);
    auto it = lt.algos.find(key);
    if (it == lt.algos.end()) {
      cublasLtMatmulPreference_t pref;
      ST_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, decltype(&cublasLtMatmulPreferenceDestroy)> own_pref(
          pref, &cublasLtMatmulPreferenceDestroy);
      const size_t ws = kWorkspaceBytes;
      ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
      // Split-K partial sums must be reduced in f32, never in a bf16/f16 output buffer.
      const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                           sizeof schemes));
      cublasLtMatmulHeuristicResult_t results[kCandidates];
      int found = 0;
      ST_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt.handle, op_desc, la, lb, lc, lc, pref,
                                                     key.timed ? kCandidates : 1, results, &found));
      ST_CHECK(found > 0, "linear: cuBLASLt has no algorithm for m=", key.m, " n=", key.n, " k=", key.k, " (",
               dtype_name(key.ab), fp8 ? std::string(" x ") + std::string(dtype_name(key.b_fp8)) : std::string(),
               " -> ", dtype_name(key.cd),
               fp8 ? std::string(", scales ") + std::string(fp8_scaling_name(key.a_scaling)) + " x " +
                         std::string(fp8_scaling_name(key.b_scaling))
                   : std::string(),
               ")");
      int pick = 0;
      if (key.timed && found > 1 && !capturing) {
        // Trials must not touch a result that accumulates in place: they write the call's
        // own output only when the real call overwrites it afterwards.
        const bool in_place = key.accumulate && c_in == nullptr;
        const int64_t out_bytes = key.m * key.n * static_cast<int64_t>(dtype_size(key.cd));
        if (!in_place) {
          pick = fastest(lt, op_desc, results, found, a, la, b, lb, key.accumulate ? 1.0f : 0.0f,
                         c_in ? c_in : c, c, lc, stream);
        } else if (out_bytes <= kScratchLimit) {
          Tensor scratch = Tensor::empty({out_bytes}, DType::kU8, Device::cuda(key.device), "GEMM trial output",
                                         Stream{stream});
          pick = fastest(lt, op_desc, results, found, a, la, b, lb, 1.0f, scratch.raw_data(), scratch.raw_data(), lc,
                         stream);
        }
      }
      it = lt.algos.emplace(key, results[pick].algo).first;
      ++g_cached_algorithms;
    }
    algo = it->second;
  }
  const float alpha = 1.0f, beta = key.accumulate ? 1.0f : 0.0f;
  ST_CUBLAS_CHECK(cublasLtMatmul(lt.handle, op_desc, &alpha, a, la, b, lb, &beta, c_in ? c_in : c, lc, c, lc, &algo,
                                 lt.workspace.raw_data(), kWorkspaceBytes, stream));
}

}  // namespace

size_t cached_gemm_algorithms() { return g_cached_algorithms.load(); }

namespace {

int current_device() {
  int d = 0;
  ST_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

// dbias[o] += sum_t dy[t, o] (or = with overwrite): one thread per column, rows in order
// (deterministic).
template <typename T, typename G>
__global__ void bias_grad_kernel(G* dbias, const T* dy, int64_t rows, int64_t cols, bool overwrite) {
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < cols; o += int64_t{gridDim.x} * blockDim.x) {
    float acc = 0;
    for (int64_t t = 0; t < rows; ++t) acc += to_f32(dy[t * cols + o]);
    dbias[o] = from_f32<G>(overwrite ? acc : to_f32(dbias[o]) + acc);
  }
}

void check_common(const Tensor& x, const Tensor& w, const char* op, int64_t& T, int64_t& I, int64_t& O) {
  check_cuda_tensor(x, op, "x_TI");
  check_cuda_tensor(w, op, "weight_OI");
  ST_CHECK(x.ndim() == 2 && w.ndim() == 2, op, ": `x_TI` and `weight_OI` must be 2-D, found ", x.str(), " and ",
           w.str());
  T = x.size(0);
  I = x.size(1);
  O = w.size(0);
  check_shape(w, {O, I}, op, "weight_OI");
  check_dtype(w, x.dtype(), op, "weight_OI");
}

}  // namespace

namespace {

// out[n, m] += bias[m] for a narrow or f32 out: the product rounded to out's dtype first, then
// the bias added and rounded again (fp8_product's contract where cuBLASLt has no bias epilogue).
template <typename T>
__global__ void add_bias_rows_kernel(T* out, const T* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_f32<T>(to_f32(out[i]) + to_f32(bias[i % cols]));
}

// FP8 problems whose bias epilogue cuBLASLt refused (CUBLAS_STATUS_NOT_SUPPORTED): their bias
// is added by add_bias_rows_kernel after the product, from the second call on without asking.
std::mutex g_refused_mutex;
std::set<GemmKey> g_refused_bias;

// `q` (1x128 scales) with its rows padded to `rows` by zero rows, their scales 1: cuBLASLt reads
// 1x128 scales as rows of the operand's row count, each 16-byte aligned.
Fp8Operand rows_padded(const Fp8Operand& q, int64_t rows, Stream s) {
  const int64_t R = q.rows(), P = q.padded_cols(), groups = q.scale.size(0);
  const Device dev = q.data_RP.device();
  const cudaStream_t stream = stream_of(s);
  Fp8Operand p;
  p.scaling = q.scaling;
  p.cols = q.cols;
  p.data_RP = Tensor::empty({rows, P}, q.data_RP.dtype(), dev, "FP8 operand (rows padded)", s);
  ST_CUDA_CHECK(cudaMemcpyAsync(p.data_RP.raw_data(), q.data_RP.raw_data(), q.data_RP.nbytes(),
                                cudaMemcpyDeviceToDevice, stream));
  ST_CUDA_CHECK(cudaMemsetAsync(static_cast<uint8_t*>(p.data_RP.raw_data()) + q.data_RP.nbytes(), 0,
                                p.data_RP.nbytes() - q.data_RP.nbytes(), stream));
  p.scale = Tensor::empty({groups, rows}, DType::kF32, dev, "FP8 scales (rows padded)", s);
  fill(p.scale, 1.0, s);
  ST_CUDA_CHECK(cudaMemcpy2DAsync(p.scale.raw_data(), rows * sizeof(float), q.scale.raw_data(), R * sizeof(float),
                                  R * sizeof(float), groups, cudaMemcpyDeviceToDevice, stream));
  return p;
}

}  // namespace

void fp8_product(Tensor& out_NM, const Fp8Operand& a_MK, const Fp8Operand& b_NK, const Tensor& bias_M,
                 const Tensor& c_NM, const Fp8ProductOptions& options, Stream s) {
  const char* op = "fp8_product";
  const int64_t M = a_MK.rows(), N = b_NK.rows(), K = a_MK.padded_cols();
  check_cuda_tensor(a_MK.data_RP, op, "a_MK");
  check_cuda_tensor(b_NK.data_RP, op, "b_NK");
  ST_CHECK(is_fp8(a_MK.data_RP.dtype()) && is_fp8(b_NK.data_RP.dtype()), op, ": operands must be FP8, found ",
           a_MK.data_RP.str(), " and ", b_NK.data_RP.str());
  ST_CHECK(a_MK.data_RP.dtype() == DType::kF8E4M3 || b_NK.data_RP.dtype() == DType::kF8E4M3, op,
           ": cuBLASLt multiplies e5m2 only by e4m3, found two e5m2 operands");
  ST_CHECK(a_MK.cols == b_NK.cols && b_NK.padded_cols() == K, op, ": the operands' columns differ: ", a_MK.cols,
           " and ", b_NK.cols);
  check_cuda_tensor(out_NM, op, "out_NM");
  check_shape(out_NM, {N, M}, op, "out_NM");
  ST_CHECK(out_NM.dtype() == DType::kBF16 || out_NM.dtype() == DType::kF16 || out_NM.dtype() == DType::kF32, op,
           ": `out_NM` must be bf16, f16 or f32, found ", dtype_name(out_NM.dtype()));
  if (N == 0 || M == 0) return;
  GemmKey key{current_device(), M, N, K, K, K, M, true, false, options.accumulate || c_NM.defined(),
              a_MK.data_RP.dtype(), out_NM.dtype()};
  key.b_fp8 = b_NK.data_RP.dtype();
  key.a_scaling = a_MK.scaling;
  key.b_scaling = b_NK.scaling;
  key.fast_accumulation = options.fast_accumulation;
  if (bias_M.defined()) {
    check_cuda_tensor(bias_M, op, "bias_M");
    check_shape(bias_M, {M}, op, "bias_M");
    check_dtype(bias_M, out_NM.dtype(), op, "bias_M");
    key.bias = true;
  }
  if (c_NM.defined()) {
    check_cuda_tensor(c_NM, op, "c_NM");
    check_shape(c_NM, {N, M}, op, "c_NM");
    check_dtype(c_NM, out_NM.dtype(), op, "c_NM");
  }
  ST_CHECK(a_MK.scaling != Fp8Scaling::kBlock1x128 || M % 4 == 0, op, ": with 1x128 scales `a_MK` needs a multiple "
           "of 4 rows (cuBLASLt reads its scales in 16-byte rows), found ", M);
  if (b_NK.scaling == Fp8Scaling::kBlock1x128 && N % 4 != 0 && K > 0) {
    // b's rows padded to a multiple of 4, into an output with as many rows; the first N rows
    // (a contiguous prefix, row-major) are the product's
    const int64_t N4 = (N + 3) / 4 * 4;
    const Fp8Operand b4 = rows_padded(b_NK, N4, s);
    Tensor out4 = Tensor::empty({N4, M}, out_NM.dtype(), out_NM.device(), "FP8 product (rows padded)", s);
    Tensor out4_rows = out4.slice(0, 0, N);
    const bool start = options.accumulate || c_NM.defined();
    if (start) copy(out4_rows, c_NM.defined() ? c_NM : out_NM, s);
    Fp8ProductOptions o = options;
    o.accumulate = start;
    cuda::fp8_product(out4, a_MK, b4, bias_M, Tensor(), o, s);
    copy(out_NM, out4_rows, s);
    return;
  }
  if (K == 0) {  // nothing to sum: the product is zero
    ST_CHECK(!bias_M.defined(), op, ": a bias with no columns to sum is not supported");
    if (c_NM.defined()) {
      copy(out_NM, c_NM, s);
    } else if (!options.accumulate) {
      fill(out_NM, 0.0, s);
    }
    return;
  }
  auto product = [&](const GemmKey& k) {
    gemm(k, a_MK.data_RP.raw_data(), b_NK.data_RP.raw_data(), out_NM.raw_data(), stream_of(s),
         k.bias ? bias_M.raw_data() : nullptr, c_NM.defined() ? c_NM.raw_data() : nullptr, a_MK.scale.raw_data(),
         b_NK.scale.raw_data());
  };
  if (key.bias) {
    bool refused;
    {
      std::lock_guard<std::mutex> lock(g_refused_mutex);
      refused = g_refused_bias.count(key) > 0;
    }
    if (!refused) {
      try {
        product(key);
        return;
      } catch (const Error& e) {
        if (std::string(e.what()).find("CUBLAS_STATUS_NOT_SUPPORTED") == std::string::npos) throw;
        std::lock_guard<std::mutex> lock(g_refused_mutex);
        g_refused_bias.insert(key);
      }
    }
    GemmKey plain = key;
    plain.bias = false;
    product(plain);
    dispatch_float(out_NM.dtype(), op, [&]<typename T>() {
      add_bias_rows_kernel<T><<<grid_for(N * M, 256), 256, 0, stream_of(s)>>>(
          static_cast<T*>(out_NM.raw_data()), static_cast<const T*>(bias_M.raw_data()), N, M);
    });
    ST_CUDA_CHECK_LAUNCH();
    return;
  }
  product(key);
}

void linear_forward(Tensor& y_TO, const Tensor& x_TI, const Tensor& weight_OI, const Tensor& bias_O, Stream s) {
  const char* op = "linear_forward";
  int64_t T, I, O;
  check_common(x_TI, weight_OI, op, T, I, O);
  check_cuda_tensor(y_TO, op, "y_TO");
  check_shape(y_TO, {T, O}, op, "y_TO");
  ST_CHECK(y_TO.dtype() == x_TI.dtype() || y_TO.dtype() == DType::kF32, op, ": `y_TO` must be ",
           dtype_name(x_TI.dtype()), " or f32, found ", dtype_name(y_TO.dtype()));
  if (T == 0 || O == 0) return;
  GemmKey key{current_device(), O, T, I, I, I, O, true, false, false, x_TI.dtype(), y_TO.dtype()};
  if (bias_O.defined()) {
    check_cuda_tensor(bias_O, op, "bias_O");
    check_shape(bias_O, {O}, op, "bias_O");
    check_dtype(bias_O, y_TO.dtype(), op, "bias_O");
    key.bias = true;
  }
  gemm(key, weight_OI.raw_data(), x_TI.raw_data(), y_TO.raw_data(), stream_of(s),
       bias_O.defined() ? bias_O.raw_data() : nullptr);
}

void linear_forward_add(Tensor& y_TO, const Tensor& x_TI, const Tensor& weight_OI, const Tensor& residual_TO,
                        Stream s) {
  const char* op = "linear_forward_add";
  int64_t T, I, O;
  check_common(x_TI, weight_OI, op, T, I, O);
  check_cuda_tensor(y_TO, op, "y_TO");
  check_shape(y_TO, {T, O}, op, "y_TO");
  check_dtype(y_TO, x_TI.dtype(), op, "y_TO");
  check_cuda_tensor(residual_TO, op, "residual_TO");
  check_shape(residual_TO, {T, O}, op, "residual_TO");
  check_dtype(residual_TO, y_TO.dtype(), op, "residual_TO");
  if (T == 0 || O == 0) return;
  // the residual rides in as the GEMM's C with beta = 1: one pass instead of a product and an add
  GemmKey key{current_device(), O, T, I, I, I, O, true, false, true, x_TI.dtype(), y_TO.dtype()};
  gemm(key, weight_OI.raw_data(), x_TI.raw_data(), y_TO.raw_data(), stream_of(s), nullptr, residual_TO.raw_data());
}

void linear_backward(Tensor& dx_TI, Tensor& dweight_OI, Tensor& dbias_O, const Tensor& dy_TO, const Tensor& x_TI,
                     const Tensor& weight_OI, const LinearBackwardOptions& options, Stream s) {
  const char* op = "linear_backward";
  ST_CHECK(x_TI.defined() || (dx_TI.defined() && !dweight_OI.defined()), op,
           ": `x_TI` may be undefined only in a call for `dx_TI` alone");
  const Tensor& shape_TI = x_TI.defined() ? x_TI : dx_TI;
  int64_t T, I, O;
  check_common(shape_TI, weight_OI, op, T, I, O);
  const DType in = weight_OI.dtype();
  check_cuda_tensor(dy_TO, op, "dy_TO");
  check_shape(dy_TO, {T, O}, op, "dy_TO");
  check_dtype(dy_TO, in, op, "dy_TO");
  if (dweight_OI.defined()) {
    check_cuda_tensor(dweight_OI, op, "dweight_OI");
    check_shape(dweight_OI, {O, I}, op, "dweight_OI");
    ST_CHECK(dweight_OI.dtype() == in || dweight_OI.dtype() == DType::kF32, op, ": `dweight_OI` must be ",
             dtype_name(in), " or f32, found ", dtype_name(dweight_OI.dtype()));
  }
  const int dev = current_device();
  if (dx_TI.defined() && T > 0 && I > 0) {
    check_cuda_tensor(dx_TI, op, "dx_TI");
    check_shape(dx_TI, {T, I}, op, "dx_TI");
    ST_CHECK(O > 0, op, ": zero output features");
    GemmKey key{dev, I, T, O, I, O, I, false, false, options.accumulate_dx, in, dx_TI.dtype()};
    gemm(key, weight_OI.raw_data(), dy_TO.raw_data(), dx_TI.raw_data(), stream_of(s));
  }
  const bool overwrite = options.overwrite_dweight;
  if (dweight_OI.defined() && T > 0 && I > 0 && O > 0) {
    GemmKey key{dev, I, O, T, I, O, I, false, true, !overwrite, x_TI.dtype(), dweight_OI.dtype()};
    gemm(key, x_TI.raw_data(), dy_TO.raw_data(), dweight_OI.raw_data(), stream_of(s));
  } else if (dweight_OI.defined() && overwrite) {
    fill(dweight_OI, 0.0, s);  // no tokens: the gradient is zero
  }
  if (dbias_O.defined() && (T > 0 || overwrite)) {
    check_cuda_tensor(dbias_O, op, "dbias_O");
    check_shape(dbias_O, {O}, op, "dbias_O");
    dispatch_float(dy_TO.dtype(), op, [&]<typename F>() {
      dispatch_float(dbias_O.dtype(), op, [&]<typename G>() {
        bias_grad_kernel<F, G><<<grid_for(O, 128), 128, 0, stream_of(s)>>>(
            static_cast<G*>(dbias_O.raw_data()), static_cast<const F*>(dy_TO.raw_data()), T, O, overwrite);
      });
    });
    ST_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace shardtrain::ops::cuda
