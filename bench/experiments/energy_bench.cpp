// Energy per unit of work of the kinds of work in a 1B training step (shape B 8, T 4096,
// D 2048, F 8192, 32 / 8 heads of 64), on a board at its power limit. Each workload runs back
// to back for a few seconds while the GPU monitor (core/gpu_monitor.h) reads the board's
// energy counter and SM clock, so each row gives the rate, mean power, SM clock, the share of
// the dense peak at that clock, and picojoules per FLOP (per byte for streaming passes). A
// step bounded by the board's energy spends its joules where this table says. Each workload
// is the engine's own op, checked against its CPU twin on a small problem before timing.
//
//   energy_bench [seconds per workload = 4]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda/device.h"
#include "core/error.h"
#include "core/gpu_monitor.h"
#include "energy_util.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/swiglu.h"

namespace {

using namespace shardtrain;
using bench::run_sustained;
using bench::SustainedRun;

Tensor device_normal(const Shape& s, uint64_t key) {
  Tensor t = Tensor::empty(s, DType::kBF16, Device::cuda(0), "energy_bench input");
  ops::fill_normal(t, 5, key, 0, 1);
  return t;
}

Tensor to_host_f64(const Tensor& d) {
  Tensor h = Tensor::empty(d.shape(), DType::kF64);
  ops::cast(h, d);
  return h;
}

void check(const char* what, const Tensor& dev, const Tensor& ref, double tol) {
  const Tensor h = to_host_f64(dev);
  double num = 0, den = 0;
  for (int64_t i = 0; i < h.numel(); ++i) {
    const double d = h.data<double>()[i] - ref.data<double>()[i];
    num += d * d;
    den += ref.data<double>()[i] * ref.data<double>()[i];
  }
  const double e = std::sqrt(num / den);
  ST_CHECK(e < tol, "energy_bench: ", what, " differs from the CPU twin: relative error ", e, " (tolerance ", tol, ")");
  std::printf("# check %-20s relative error %.2e\n", what, e);
}

// Each op on a small problem against its f64 CPU twin on the same bf16 inputs.
void validate() {
  Tensor x = device_normal({256, 512}, 1), w = device_normal({384, 512}, 2);
  Tensor y = Tensor::empty({256, 384}, DType::kBF16, Device::cuda(0));
  ops::linear_forward(y, x, w, Tensor());
  Tensor y_ref = Tensor::empty({256, 384}, DType::kF64);
  ops::linear_forward(y_ref, to_host_f64(x), to_host_f64(w), Tensor());
  check("linear forward", y, y_ref, 1e-2);

  const int64_t B = 1, T = 320, N = 8, M = 2, H = 64;
  Tensor q = device_normal({B, T, N, H}, 3), k = device_normal({B, T, M, H}, 4), v = device_normal({B, T, M, H}, 5);
  Tensor dout = device_normal({B, T, N, H}, 6);
  Tensor out = Tensor::empty({B, T, N, H}, DType::kBF16, Device::cuda(0)),
         lse = Tensor::empty({B, N, T}, DType::kF32, Device::cuda(0));
  ops::attention_forward(out, lse, q, k, v, {});
  Tensor dq = Tensor::empty(q.shape(), DType::kBF16, Device::cuda(0)),
         dk = Tensor::empty(k.shape(), DType::kBF16, Device::cuda(0)),
         dv = Tensor::empty(v.shape(), DType::kBF16, Device::cuda(0));
  ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, {});
  const Tensor q64 = to_host_f64(q), k64 = to_host_f64(k), v64 = to_host_f64(v), dout64 = to_host_f64(dout);
  Tensor out_ref = Tensor::empty({B, T, N, H}, DType::kF64), lse_ref = Tensor::empty({B, N, T}, DType::kF64);
  ops::attention_forward(out_ref, lse_ref, q64, k64, v64, {});
  Tensor dq_ref = Tensor::empty(q.shape(), DType::kF64), dk_ref = Tensor::empty(k.shape(), DType::kF64),
         dv_ref = Tensor::empty(v.shape(), DType::kF64);
  ops::attention_backward(dq_ref, dk_ref, dv_ref, dout64, q64, k64, v64, out_ref, lse_ref, {});
  check("attention forward", out, out_ref, 2e-2);
  check("attention dq", dq, dq_ref, 2e-2);
  check("attention dk", dk, dk_ref, 2e-2);

  Tensor gate = device_normal({64, 384}, 7), up = device_normal({64, 384}, 8);
  Tensor h = Tensor::empty({64, 384}, DType::kBF16, Device::cuda(0)), h_ref = Tensor::empty({64, 384}, DType::kF64);
  ops::swiglu_forward(h, gate, up);
  ops::swiglu_forward(h_ref, to_host_f64(gate), to_host_f64(up));
  check("swiglu forward", h, h_ref, 1e-2);
}

struct Workload {
  const char* name;
  double flops;  // per call (0 for a streaming pass)
  double bytes;  // per call, read + written once
  std::function<void()> run;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const double seconds = argc > 1 ? std::stod(argv[1]) : 4.0;
    ST_CHECK(seconds >= kMinPowerSeconds, "energy_bench: each workload needs at least ", kMinPowerSeconds,
             " s for a mean power");
    ST_CHECK(cuda::device_count() > 0, "energy_bench: no CUDA device");
    cuda::init_device(0);
    GpuMonitor board = GpuMonitor::open(cuda::pci_bus_id(0));
    ST_CHECK(board.available(), "energy_bench: ", board.why_unavailable());
    const double per_clock = cuda::dense_bf16_flops_per_clock(0);
    validate();

    const int64_t B = 8, T = 4096, D = 2048, F = 8192, N = 32, M = 8, H = 64, R = B * T;
    const Device dev = Device::cuda(0);
    Tensor x = device_normal({R, D}, 11), w_gate_up = device_normal({2 * F, D}, 12);
    Tensor gate_up = Tensor::empty({R, 2 * F}, DType::kBF16, dev, "gate|up");
    Tensor h = device_normal({R, F}, 13), w_down = device_normal({D, F}, 14);
    Tensor y = Tensor::empty({R, D}, DType::kBF16, dev, "y");
    Tensor q = device_normal({B, T, N, H}, 15), k = device_normal({B, T, M, H}, 16), v = device_normal({B, T, M, H}, 17);
    Tensor dout = device_normal({B, T, N, H}, 18);
    Tensor out = Tensor::empty({B, T, N, H}, DType::kBF16, dev), lse = Tensor::empty({B, N, T}, DType::kF32, dev);
    Tensor dq = Tensor::empty(q.shape(), DType::kBF16, dev), dk = Tensor::empty(k.shape(), DType::kBF16, dev),
           dv = Tensor::empty(v.shape(), DType::kBF16, dev);
    ops::attention_forward(out, lse, q, k, v, {});
    Tensor gate = gate_up.slice(1, 0, F), up = gate_up.slice(1, F, 2 * F);
    ops::linear_forward(gate_up, x, w_gate_up, Tensor());

    const double attn_fwd = 4.0 * B * N * static_cast<double>(T) * T * H / 2;  // causal half
    const double elem = static_cast<double>(R) * F;
    const std::vector<Workload> loads = {
        {"GEMM gate|up forward (32768 x 2048 x 16384)", 2.0 * R * D * 2 * F, 0,
         [&] { ops::linear_forward(gate_up, x, w_gate_up, Tensor()); }},
        {"GEMM down forward (32768 x 8192 x 2048)", 2.0 * R * F * D, 0,
         [&] { ops::linear_forward(y, h, w_down, Tensor()); }},
        {"attention forward (cuDNN)", attn_fwd, 0, [&] { ops::attention_forward(out, lse, q, k, v, {}); }},
        {"attention backward (cuDNN)", 2.5 * attn_fwd, 0,
         [&] { ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, {}); }},
        {"SwiGLU forward (streaming)", 0, 3.0 * elem * 2, [&] { ops::swiglu_forward(h, gate, up); }},
    };

    std::printf("# %s; %.1f s per workload, back to back; dense bf16 peak per clock %.0f FLOP\n",
                cuda::device_name(0).c_str(), seconds, per_clock);
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));  // the idle board first
    const GpuActivity idle = board.take();
    std::printf("# idle: %s\n", format_activity(idle).c_str());
    std::printf("| workload | rate | W | SM MHz | power-capped | of the peak at that clock | energy |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    for (const Workload& wl : loads) {
      const SustainedRun r = run_sustained(board, dev, seconds, wl.run);
      const GpuActivity& a = r.board;
      const double elapsed = r.seconds;
      const int64_t calls = r.calls;
      const double work = static_cast<double>(calls) * (wl.flops > 0 ? wl.flops : wl.bytes);
      const double rate = work / elapsed;
      char rate_text[64], share_text[32], energy_text[64];
      if (wl.flops > 0) {
        std::snprintf(rate_text, sizeof rate_text, "%.0f TFLOP/s", rate / 1e12);
        std::snprintf(share_text, sizeof share_text, "%.0f %%", 100 * rate / (per_clock * a.mean_sm_mhz * 1e6));
        std::snprintf(energy_text, sizeof energy_text, "%.2f pJ/FLOP", 1e12 * a.energy_j / work);
      } else {
        std::snprintf(rate_text, sizeof rate_text, "%.0f GB/s", rate / 1e9);
        std::snprintf(share_text, sizeof share_text, "-");
        std::snprintf(energy_text, sizeof energy_text, "%.1f pJ/byte", 1e12 * a.energy_j / work);
      }
      std::printf("| %s | %s | %.0f | %.0f | %.0f %% | %s | %s |\n", wl.name, rate_text, a.mean_power_w,
                  a.mean_sm_mhz, 100 * a.power_capped, share_text, energy_text);
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "energy_bench: %s\n", e.what());
    return 1;
  }
}
