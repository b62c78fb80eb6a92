// Does cuBLASLt hold GEMM configurations that beat its heuristic's candidates on a board at
// its power cap? ops::linear's timed selection tries the heuristic's first 8; this program
// walks the configuration space cuBLASLt reports for a product (every algorithm id, tile and
// stage count, seven cluster shapes up to 2x2 or 4x1, both CTA swizzles where supported,
// custom options 0-3; no split-K), keeping what cublasLtMatmulAlgoCheck accepts; it
// screens each configuration with one short burst of back-to-back calls (after 1 s of
// load), checks the 12 fastest of the screen and the heuristic's first 8 against the
// heuristic's first product, and times them sustained (three interleaved rounds of ~40 ms,
// the median round). Shapes of the Llama 3.2 1B block at 8 x 4096 tokens in ops::linear's
// column-major form (forward, dx, f32 dW). On an H100 with
// cuBLASLt 13.1 that is 3,745 configurations and about two minutes per product (each
// configuration's first call loads its kernel), so name the products wanted.
//   gemm_search_bench [products, comma-separated names; default all] [screen ms = 4]
//   products: gate_fwd down_fwd down_dx gate_dx gate_dw down_dw q_fwd head_fwd
#include <cublasLt.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "gemm_problem.h"
#include "core/cuda/device.h"

namespace {

using namespace shardtrain;
using namespace shardtrain::bench;

struct Named {
  const char* name;
  GemmProblem p;
};

template <typename T>
T config(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  ST_BENCH_CUBLAS(cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof v, &written));
  return v;
}

std::string describe(const cublasLtMatmulAlgo_t& a) {
  std::ostringstream s;
  s << "algo " << config<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID) << " tile "
    << config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID) << " stages "
    << config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID) << " cluster "
    << config<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID) << " swizzle "
    << config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING) << " option "
    << config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION) << " splitk "
    << config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
  return s.str();
}

template <typename T>
std::vector<T> cap_list(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&a, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0) return {};
  std::vector<T> v(bytes / sizeof(T));
  ST_BENCH_CUBLAS(cublasLtMatmulAlgoCapGetAttribute(&a, attr, v.data(), bytes, &bytes));
  return v;
}

template <typename T>
T cap(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoCapAttributes_t attr) {
  T v{};
  size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&a, attr, &v, sizeof v, &written) != CUBLAS_STATUS_SUCCESS) return T{};
  return v;
}

void search(cublasLtHandle_t lt, void* workspace, const Named& named, double screen_ms) {
  const GemmProblem& p = named.p;
  Tensor a = dev_normal({p.m * p.k}, DType::kBF16, 1, 0.05), b = dev_normal({p.n * p.k}, DType::kBF16, 2);
  Tensor c = dev_normal({p.m * p.n}, p.f32_out ? DType::kF32 : DType::kBF16, 3);
  const cudaDataType_t cd = GemmDescs::out_type(p);
  const GemmDescs descs(p);
  cublasLtMatmulHeuristicResult_t heur[8];  // what ops::linear's timed selection tries
  const int found = descs.heuristic(lt, 8, heur);

  // The whole space.
  int ids[256], n_ids = 0;
  ST_BENCH_CUBLAS(cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, cd, cd, 256,
                                           ids, &n_ids));
  std::vector<cublasLtMatmulAlgo_t> space;
  for (int i = 0; i < n_ids; ++i) {
    cublasLtMatmulAlgo_t base;
    if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, cd, cd, ids[i], &base) !=
        CUBLAS_STATUS_SUCCESS)
      continue;
    std::vector<uint32_t> tiles = cap_list<uint32_t>(base, CUBLASLT_ALGO_CAP_TILE_IDS);
    std::vector<uint32_t> stages = cap_list<uint32_t>(base, CUBLASLT_ALGO_CAP_STAGES_IDS);
    if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
    if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
    const uint32_t swizzle_max = cap<uint32_t>(base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT) ? 1 : 0;
    const int32_t option_max = cap<int32_t>(base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX);
    const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1,
                                 CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1,
                                 CUBLASLT_CLUSTER_SHAPE_4x1x1, CUBLASLT_CLUSTER_SHAPE_1x4x1,
                                 CUBLASLT_CLUSTER_SHAPE_2x2x1};
    for (uint32_t tile : tiles)
      for (uint32_t stage : stages)
        for (uint16_t cluster : clusters)
          for (uint32_t swizzle = 0; swizzle <= swizzle_max; ++swizzle)
            for (int32_t option = 0; option <= std::min(option_max, 3); ++option) {
              cublasLtMatmulAlgo_t algo = base;
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile);
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stage, sizeof stage);
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                                   sizeof cluster);
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof swizzle);
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &option, sizeof option);
              cublasLtMatmulHeuristicResult_t r;
              if (cublasLtMatmulAlgoCheck(lt, descs.op, descs.a, descs.b, descs.c, descs.c, &algo, &r) !=
                  CUBLAS_STATUS_SUCCESS)
                continue;
              if (r.workspaceSize > kGemmWorkspace) continue;
              space.push_back(algo);
            }
  }
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return descs.run(lt, algo, a.raw_data(), b.raw_data(), c.raw_data(), workspace, nullptr);
  };
  const double flops = 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);
  std::printf("## %s: m %lld n %lld k %lld; %d algorithm ids, %zu configurations accepted\n", named.name,
              static_cast<long long>(p.m), static_cast<long long>(p.n), static_cast<long long>(p.k), n_ids,
              space.size());
  // Load the board, then screen every configuration with one burst.
  ST_BENCH_CUBLAS(run(heur[0].algo));
  const double one = time_calls_ms([&] { ST_BENCH_CUBLAS(run(heur[0].algo)); }, 1);
  const int burst = std::max(1, static_cast<int>(screen_ms / one));
  time_calls_ms([&] { ST_BENCH_CUBLAS(run(heur[0].algo)); }, static_cast<int>(1000 / one));
  std::vector<std::pair<double, size_t>> screened;
  for (size_t i = 0; i < space.size(); ++i) {
    if (run(space[i]) != CUBLAS_STATUS_SUCCESS) continue;
    screened.emplace_back(time_calls_ms([&] { ST_BENCH_CUBLAS(run(space[i])); }, burst), i);
  }
  std::sort(screened.begin(), screened.end());
  // Sustained rounds: the heuristic's candidates and the screen's 12 best.
  std::vector<cublasLtMatmulAlgo_t> finalists;
  std::vector<std::string> labels;
  for (int i = 0; i < found; ++i) {
    finalists.push_back(heur[i].algo);
    labels.push_back("heuristic #" + std::to_string(i));
  }
  for (size_t i = 0; i < std::min<size_t>(12, screened.size()); ++i) {
    finalists.push_back(space[screened[i].second]);
    labels.push_back("screen #" + std::to_string(i));
  }
  // Every finalist's product against the heuristic's first choice before timing (the
  // first 2^24 outputs: many tiles, a host copy of bounded size).
  Tensor ref = Tensor::empty(c.shape(), c.dtype(), Device::cuda(0), "reference product");
  ST_BENCH_CUBLAS(descs.run(lt, heur[0].algo, a.raw_data(), b.raw_data(), ref.raw_data(), workspace, nullptr));
  const int64_t checked = std::min<int64_t>(c.numel(), int64_t{1} << 24);
  const Tensor ref_part = host_of(ref.flat_range(0, checked));
  for (size_t i = 0; i < finalists.size(); ++i) {
    ST_BENCH_CUBLAS(run(finalists[i]));
    const double e = rel_err(c.flat_range(0, checked), ref_part);
    ST_CHECK(e < 1e-2, "gemm_search_bench: ", named.name, " ", labels[i], " (", describe(finalists[i]),
             ") differs from the heuristic's product: relative error ", e);
  }
  std::vector<std::function<void()>> fns;
  for (const auto& f : finalists) fns.push_back([&] { ST_BENCH_CUBLAS(run(f)); });
  const std::vector<double> ms = time_sustained_ms(fns, 40, 0);  // the screen has loaded the board
  std::printf("| candidate | configuration | ms | TFLOP/s |\n|---|---|---|---|\n");
  for (size_t i = 0; i < finalists.size(); ++i)
    std::printf("| %s | %s | %.3f | %.0f |\n", labels[i].c_str(), describe(finalists[i]).c_str(), ms[i],
                flops / ms[i] / 1e9);
}

}  // namespace

int main(int argc, char** argv) try {
  std::set<std::string> wanted;
  if (argc > 1) {
    std::stringstream ss(argv[1]);
    for (std::string t; std::getline(ss, t, ',');) wanted.insert(t);
  }
  const double screen_ms = argc > 2 ? std::stod(argv[2]) : 4.0;
  ST_CHECK(cuda::device_count() > 0, "gemm_search_bench: no CUDA device");
  cuda::init_device(0);
  cublasLtHandle_t lt;
  ST_BENCH_CUBLAS(cublasLtCreate(&lt));
  Tensor workspace = Tensor::empty({static_cast<int64_t>(kGemmWorkspace)}, DType::kU8, Device::cuda(0), "workspace");
  std::printf("# %s; cuBLASLt %zu\n", cuda::device_name(0).c_str(), cublasLtGetVersion());
  const int64_t T = 8 * 4096, D = 2048, F = 8192, V = 128256, C = 8192;
  // name, m, n, k, lda, ldb, ldc, ta, tb, accumulate, f32 out (ops::linear's column-major keys)
  const std::vector<Named> problems = {
      {"gate_fwd", {F, T, D, D, D, F, true, false, false, false}},
      {"down_fwd", {D, T, F, F, F, D, true, false, true, false}},
      {"down_dx", {F, T, D, F, D, F, false, false, false, false}},
      {"gate_dx", {D, T, F, D, F, D, false, false, false, false}},
      {"gate_dw", {D, F, T, D, F, D, false, true, false, true}},
      {"down_dw", {F, D, T, F, D, F, false, true, false, true}},
      {"q_fwd", {D, T, D, D, D, D, true, false, false, false}},
      {"head_fwd", {V, C, D, D, D, V, true, false, false, false}},
  };
  for (const Named& p : problems)
    if (wanted.empty() || wanted.count(p.name)) search(lt, workspace.raw_data(), p, screen_ms);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gemm_search_bench: %s\n", e.what());
  return 1;
}
