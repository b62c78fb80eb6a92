// Every execution plan cuDNN offers for one attention problem, checked and timed: the plans
// its heuristics list (modes A, B and fallback; the forward through both of cuDNN's SDPA
// nodes, unified and composite), then each knob of the engine the engine path uses, one knob
// moved at a time over its range. The engine (ops::cuda::attention_*) runs the heuristics'
// first plan; this program tells whether another would be faster on the board at its power
// cap. Inputs are random normal bf16 (not constants: a board draws less power on repeated
// bits). Each plan's outputs are checked against the engine path's before it is timed
// (relative norm error under 1e-2: plans differ in summation order, and the backward's
// dq sums with atomics). Timing: bench_util.h's time_sustained_ms, every plan interleaved.
//   attention_plans_bench [B T N M H]      (default: the 1B shape, 8 4096 32 8 64)
#include <cudnn.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

#include "core/cuda/device.h"
#include "core/error.h"
#include "ops/attention.h"
#include "ops/cuda/attention_cudnn.h"
#include "bench_util.h"

namespace {

using namespace shardtrain;
using namespace shardtrain::bench;
namespace fe = cudnn_frontend;
namespace ca = shardtrain::ops::cuda::cudnn_attention;

using Impl = fe::AttentionImplementation_t;

struct Plan {
  Impl impl;
  std::string label;  // how it was found
  std::string name;   // cuDNN's name: engine and knob values
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t index = 0;  // in graph's plan list
  Tensor workspace;
};

struct Buffers {
  Tensor q, k, v, out, lse, dout, dq, dk, dv;
};

std::unordered_map<int64_t, void*> pointers(Buffers& b, bool backward) {
  std::unordered_map<int64_t, void*> p = {{ca::kQ, b.q.raw_data()},
                                          {ca::kK, b.k.raw_data()},
                                          {ca::kV, b.v.raw_data()},
                                          {ca::kO, b.out.raw_data()},
                                          {ca::kStats, b.lse.raw_data()}};
  if (backward) {
    p[ca::kDO] = b.dout.raw_data();
    p[ca::kDQ] = b.dq.raw_data();
    p[ca::kDK] = b.dk.raw_data();
    p[ca::kDV] = b.dv.raw_data();
  }
  return p;
}

std::string knobs_str(const std::unordered_map<fe::KnobType_t, int64_t>& knobs) {
  std::map<int64_t, int64_t> sorted;
  for (auto [t, v] : knobs) sorted[static_cast<int64_t>(t)] = v;
  std::string s;
  for (auto [t, v] : sorted) s += (s.empty() ? "" : " ") + std::to_string(t) + "=" + std::to_string(v);
  return s;
}

// Builds plan `index` of g; false (with cuDNN's reason printed) if cuDNN cannot.
bool try_build(Plan& p, cudnnHandle_t handle) {
  fe::error_t e = p.graph->build_plan_at_index(handle, p.index);
  if (e.is_good()) {
    int64_t ws = 0;
    e = p.graph->get_workspace_size_plan_at_index(p.index, ws);
    if (e.is_good() && ws > 0) p.workspace = Tensor::empty({ws}, DType::kU8, Device::cuda(0), "cuDNN workspace");
  }
  if (e.is_bad()) std::printf("#   %s %s: not built (%s)\n", p.label.c_str(), p.name.c_str(), e.get_message().c_str());
  return e.is_good();
}

void execute(Plan& p, cudnnHandle_t handle, Buffers& b, bool backward) {
  auto ptrs = pointers(b, backward);
  ca::check(p.graph->execute_plan_at_index(handle, ptrs, p.workspace.defined() ? p.workspace.raw_data() : nullptr,
                                           p.index),
            "attention_plans_bench", "execution");
}

void run(const ca::Problem& base, cudnnHandle_t handle) {
  const char* bench = "attention_plans_bench";
  const int64_t B = base.B, T = base.T, N = base.N, M = base.M, H = base.H;
  Buffers b{dev_normal({B, T, N, H}, DType::kBF16, 1), dev_normal({B, T, M, H}, DType::kBF16, 2),
            dev_normal({B, T, M, H}, DType::kBF16, 3), dev_normal({B, T, N, H}, DType::kBF16, 4),
            Tensor::empty({B, N, T}, DType::kF32, Device::cuda(0)), dev_normal({B, T, N, H}, DType::kBF16, 5),
            dev_normal({B, T, N, H}, DType::kBF16, 6), dev_normal({B, T, M, H}, DType::kBF16, 7),
            dev_normal({B, T, M, H}, DType::kBF16, 8)};
  // the engine path's results: the reference every plan is checked against
  ops::AttentionOptions options;
  ops::attention_forward(b.out, b.lse, b.q, b.k, b.v, options);
  ops::attention_backward(b.dq, b.dk, b.dv, b.dout, b.q, b.k, b.v, b.out, b.lse, options);
  const Tensor out_ref = host_of(b.out), lse_ref = host_of(b.lse), dq_ref = host_of(b.dq), dk_ref = host_of(b.dk),
               dv_ref = host_of(b.dv);
  const double flops = 4.0 * B * N * T * T * H / 2;

  for (bool backward : {false, true}) {
    ca::Problem problem = base;
    problem.backward = backward;
    std::vector<Plan> plans;
    std::set<std::string> seen;
    auto add_list = [&](const std::string& label, fe::AttentionImplementation_t impl, fe::HeurMode_t mode) {
      std::shared_ptr<fe::graph::Graph> g;
      try {
        g = ca::operation_graph(problem, handle, bench, impl);
      } catch (const std::exception& e) {
        std::printf("# %s: no graph (%s)\n", label.c_str(), e.what());
        return;
      }
      if (g->create_execution_plans({mode}).is_bad() || g->check_support(handle).is_bad()) {
        std::printf("# %s: no supported plan\n", label.c_str());
        return;
      }
      for (int64_t i = 0; i < g->get_execution_plan_count(); ++i) {
        Plan p{impl, label + " #" + std::to_string(i), "", g, i, {}};
        if (g->get_plan_name_at_index(i, p.name).is_bad() || !seen.insert(p.name).second) continue;
        if (try_build(p, handle)) plans.push_back(std::move(p));
      }
    };
    const std::vector<std::pair<std::string, Impl>> impls =
        backward ? std::vector<std::pair<std::string, Impl>>{{"", Impl::AUTO}}
                 : std::vector<std::pair<std::string, Impl>>{{"unified ", Impl::UNIFIED},
                                                             {"composite ", Impl::COMPOSITE}};
    for (const auto& [iname, impl] : impls) {
      add_list(iname + "heuristics A", impl, fe::HeurMode_t::A);
      add_list(iname + "heuristics B", impl, fe::HeurMode_t::B);
      add_list(iname + "fallback", impl, fe::HeurMode_t::FALLBACK);
    }
    ST_CHECK(!plans.empty(), bench, ": cuDNN offered no plan");
    // the first plan's engine, every knob moved alone across its range
    int64_t engine = -1;
    std::unordered_map<fe::KnobType_t, int64_t> knobs0;
    if (plans[0].graph->get_engine_and_knobs_at_index(plans[0].index, engine, knobs0).is_good()) {
      std::vector<fe::Knob> knobs;
      if (plans[0].graph->get_knobs_for_engine(engine, knobs).is_bad()) knobs.clear();
      std::printf("# %s: first plan %s = engine %lld, knobs {%s}; its knobs:", backward ? "backward" : "forward",
                  plans[0].name.c_str(), static_cast<long long>(engine), knobs_str(knobs0).c_str());
      for (const fe::Knob& k : knobs)
        std::printf(" %lld in [%lld, %lld] step %lld", static_cast<long long>(k.type),
                    static_cast<long long>(k.minValue), static_cast<long long>(k.maxValue),
                    static_cast<long long>(k.stride));
      std::printf("\n");
      for (const fe::Knob& k : knobs) {
        const int64_t step = std::max<int64_t>(k.stride, 1);
        for (int64_t value = k.minValue, n = 0; value <= k.maxValue && n < 16; value += step, ++n) {
          auto choice = knobs0;
          if (choice.count(k.type) && choice[k.type] == value) continue;
          choice[k.type] = value;
          auto g = ca::operation_graph(problem, handle, bench, plans[0].impl);
          if (g->create_execution_plan(engine, choice).is_bad() || g->get_execution_plan_count() == 0 ||
              g->check_support(handle).is_bad())
            continue;
          Plan p{plans[0].impl, "engine " + std::to_string(engine) + " {" + knobs_str(choice) + "}", "", g, 0, {}};
          if (g->get_plan_name_at_index(0, p.name).is_bad() || !seen.insert(p.name).second) continue;
          if (try_build(p, handle)) plans.push_back(std::move(p));
        }
      }
    }
    // check each plan against the engine path, drop the ones that disagree
    std::vector<Plan> good;
    for (Plan& p : plans) {
      try {
        ops::fill(backward ? b.dq : b.out, 0.0);
        execute(p, handle, b, backward);
        synchronize(Device::cuda(0));
        const double e = backward ? std::max({rel_err(b.dq, dq_ref), rel_err(b.dk, dk_ref), rel_err(b.dv, dv_ref)})
                                  : std::max(rel_err(b.out, out_ref), rel_err(b.lse, lse_ref));
        std::printf("# check %s (%s): relative error %.2e%s\n", p.label.c_str(), p.name.c_str(), e,
                    e < 1e-2 ? "" : ", dropped");
        if (e < 1e-2) good.push_back(std::move(p));
      } catch (const std::exception& ex) {
        std::printf("# %s (%s): failed to run (%s), dropped\n", p.label.c_str(), p.name.c_str(), ex.what());
      }
    }
    if (!backward) {  // the backward reads the engine path's forward results
      ops::attention_forward(b.out, b.lse, b.q, b.k, b.v, options);
      synchronize(Device::cuda(0));
    }
    std::vector<std::function<void()>> fns;
    for (Plan& p : good) fns.push_back([&, backward] { execute(p, handle, b, backward); });
    const std::vector<double> ms = time_sustained_ms(fns, 200, 2000);
    std::printf("\n%s, B%lld T%lld N%lld M%lld H%lld, sustained (median of 3 interleaved rounds)\n\n",
                backward ? "backward" : "forward", static_cast<long long>(B), static_cast<long long>(T),
                static_cast<long long>(N), static_cast<long long>(M), static_cast<long long>(H));
    std::printf("| plan | found by | ms | TFLOP/s |\n|---|---|---|---|\n");
    for (size_t i = 0; i < good.size(); ++i)
      std::printf("| %s | %s | %.3f | %.0f |\n", good[i].name.c_str(), good[i].label.c_str(), ms[i],
                  (backward ? 2.5 : 1.0) * flops / ms[i] / 1e9);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  ST_CHECK(argc == 1 || argc == 6, "usage: attention_plans_bench [B T N M H]");
  auto arg = [&](int i, int64_t d) { return argc > i ? std::stoll(argv[i]) : d; };
  ST_CHECK(cuda::device_count() > 0, "attention_plans_bench: no CUDA device");
  cuda::init_device(0);
  cudnnHandle_t handle = nullptr;
  ST_CHECK(cudnnCreate(&handle) == CUDNN_STATUS_SUCCESS, "attention_plans_bench: cudnnCreate failed");
  std::printf("# %s, cuDNN %zu\n", cuda::device_name(0).c_str(), cudnnGetVersion());
  const int64_t H = arg(5, 64);
  run(ca::Problem{false, arg(1, 8), arg(2, 4096), arg(3, 32), arg(4, 8), H, DType::kBF16, true,
                  1.0 / std::sqrt(static_cast<double>(H)), false, arg(3, 32) * H, arg(4, 8) * H, arg(4, 8) * H},
      handle);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "attention_plans_bench: %s\n", e.what());
  return 1;
}
