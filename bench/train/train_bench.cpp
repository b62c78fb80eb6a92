// End-to-end training throughput of one device: a Llama-shaped model (default: Llama 3.2
// 1B — 16 layers, width 2048, 32/8 heads, FFN 8192, vocab 128256, tied), random tokens,
// full steps (forward, fused head + loss, backward, grad-norm clipping, AdamW) exactly as
// the trainer runs them: bf16 compute, f32 master weights, gradients and AdamW state.
// Validates before timing (the first loss of a random init is near ln V, every loss is
// finite), then reports tokens/s, MFU (torchtitan's FLOPs per token against the device's
// dense bf16 peak), the phase split and peak device memory, as a table row and a JSON line.
// With SHARDTRAIN_PROFILE=1 it also prints the time per op (core/profile.h).
//
//   train_bench [--batch 4] [--seq 4096] [--steps 10] [--warmup 3] [--ac none|full]
//               [--layers 16] [--dim 2048] [--heads 32] [--kv-heads 8] [--ffn 8192]
//               [--vocab 128256] [--untied] [--loss-chunk 4096] [--keep-gathered]
//               [--device cuda|cpu]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "core/profile.h"
#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#endif
#include "core/random.h"
#include "dist/communicator.h"
#include "fsdp/sharded_store.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/clip.h"

namespace {

using namespace shardtrain;
using Clock = std::chrono::steady_clock;

struct Args {
  int64_t batch = 4, seq = 4096, steps = 10, warmup = 3;
  int64_t layers = 16, dim = 2048, heads = 32, kv_heads = 8, ffn = 8192, vocab = 128256;
  bool tied = true, full_ac = false, keep_gathered = false;
  int64_t loss_chunk = 4096;
  std::string device = "cuda";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      ST_CHECK(i + 1 < argc, "train_bench: ", k, " needs a value");
      return argv[++i];
    };
    if (k == "--batch") a.batch = std::stoll(next());
    else if (k == "--seq") a.seq = std::stoll(next());
    else if (k == "--steps") a.steps = std::stoll(next());
    else if (k == "--warmup") a.warmup = std::stoll(next());
    else if (k == "--layers") a.layers = std::stoll(next());
    else if (k == "--dim") a.dim = std::stoll(next());
    else if (k == "--heads") a.heads = std::stoll(next());
    else if (k == "--kv-heads") a.kv_heads = std::stoll(next());
    else if (k == "--ffn") a.ffn = std::stoll(next());
    else if (k == "--vocab") a.vocab = std::stoll(next());
    else if (k == "--loss-chunk") a.loss_chunk = std::stoll(next());
    else if (k == "--untied") a.tied = false;
    else if (k == "--keep-gathered") a.keep_gathered = true;
    else if (k == "--ac") {
      const std::string v = next();
      ST_CHECK(v == "none" || v == "full", "train_bench: --ac none|full, found ", v);
      a.full_ac = v == "full";
    } else if (k == "--device") a.device = next();
    else ST_THROW("train_bench: unknown option ", k, " (see the comment at the top of bench/train/train_bench.cpp)");
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  Device dev = Device::cpu();
  double peak_flops = 0;
  std::string device_name = "cpu";
#ifdef SHARDTRAIN_WITH_CUDA
  if (a.device == "cuda") {
    ST_CHECK(cuda::device_count() > 0, "train_bench: no CUDA device");
    cuda::init_device(0);
    dev = Device::cuda(0);
    peak_flops = cuda::dense_bf16_peak_flops(0);
    device_name = cuda::device_name(0);
  }
#endif
  const DType compute = dev.is_cpu() ? DType::kF32 : DType::kBF16;

  model::LlamaConfig c;
  c.vocab_size = a.vocab;
  c.dim = a.dim;
  c.n_layers = a.layers;
  c.n_heads = a.heads;
  c.n_kv_heads = a.kv_heads;
  c.ffn_dim = a.ffn;
  c.max_seq_len = a.seq;
  c.rope.theta = 500000.0;
  c.tie_embeddings = a.tied;
  c.validate("bench.");
  const model::ModelLayout layout = model::ModelLayout::llama(c, 1);
  auto comm = dist::make_single_rank();
  fsdp::ShardingOptions so;
  so.compute_dtype = compute;
  so.reshard_after_forward = !a.keep_gathered;
  fsdp::ShardedUnitStore store(layout, comm.get(), so, dev);
  const Clock::time_point t_init = Clock::now();
  store.init_random(1234, c.init_std);
  model::Llama m(c, layout, &store, compute, dev);
  optim::AdamW opt(layout, 0, optim::AdamWConfig{}, DType::kF32, dev);
  std::vector<Tensor*> params;
  std::vector<const Tensor*> cgrads;
  for (size_t u = 0; u < layout.units().size(); ++u) {
    params.push_back(&store.master_shards()[u]);
    cgrads.push_back(&store.grad_shards()[u]);
  }
  std::printf("# %s, %s; init %.1f s\n", device_name.c_str(), c.summary().c_str(),
              std::chrono::duration<double>(Clock::now() - t_init).count());

  Tensor ids = Tensor::empty({a.batch, a.seq}, DType::kI32, Device::cpu(), "ids");
  Tensor targets = Tensor::empty({a.batch, a.seq}, DType::kI32, Device::cpu(), "targets");
  CounterRng rng(7);
  model::StepOptions o;
  o.checkpointing = a.full_ac ? model::ActivationCheckpointing::kFull : model::ActivationCheckpointing::kNone;
  o.loss_chunk_tokens = a.loss_chunk;
  o.grad_scale = 1.0 / static_cast<double>(a.batch * a.seq);
  const double tokens = static_cast<double>(a.batch * a.seq);

  double timed = 0, fwd = 0, bwd = 0, optim_s = 0;
  for (int64_t step = 1; step <= a.warmup + a.steps; ++step) {
    for (int64_t i = 0; i < ids.numel(); ++i) {
      ids.data<int32_t>()[i] = static_cast<int32_t>(rng.next_below(static_cast<uint64_t>(a.vocab)));
      targets.data<int32_t>()[i] = static_cast<int32_t>(rng.next_below(static_cast<uint64_t>(a.vocab)));
    }
    const Clock::time_point t0 = Clock::now();
    store.zero_grad_shards();
    const model::LossSum ls = m.forward_backward(ids, targets, o);
    const Clock::time_point t1 = Clock::now();
    const double norm = optim::global_grad_norm(cgrads, comm.get());
    opt.step(params, cgrads, 1e-5, optim::clip_coefficient(norm, 1.0));
    synchronize(dev);
    const Clock::time_point t2 = Clock::now();
    const double loss = ls.loss_sum / tokens;
    ST_CHECK(std::isfinite(loss), "train_bench: loss is ", loss, " at step ", step);
    if (step == 1)
      ST_CHECK(std::abs(loss - std::log(static_cast<double>(a.vocab))) < 0.5, "train_bench: first loss ", loss,
               " is not near ln V = ", std::log(static_cast<double>(a.vocab)), ": the model is wrong");
    if (step == a.warmup) (void)profile::report_and_reset();  // profile the timed steps only
    if (step > a.warmup) {
      timed += std::chrono::duration<double>(t2 - t0).count();
      fwd += m.last_phase_times().forward_s;
      bwd += m.last_phase_times().backward_s;
      optim_s += std::chrono::duration<double>(t2 - t1).count();
    }
    std::printf("# step %lld loss %.4f  %.1f ms\n", static_cast<long long>(step), loss,
                1e3 * std::chrono::duration<double>(t2 - t0).count());
  }
  const double n = static_cast<double>(a.steps);
  if (profile::enabled())
    std::printf("# per-op time over %lld steps (SHARDTRAIN_PROFILE=1: synchronised per op, so slower)\n%s",
                static_cast<long long>(a.steps), profile::report_and_reset().c_str());
  const double tps = tokens * n / timed;
  const double mfu = peak_flops > 0 ? c.flops_per_token(a.seq) * tps / peak_flops : 0.0;
  const double peak_gib = static_cast<double>(allocator_for(dev).stats().peak_allocated_bytes) / (1u << 30);
  std::printf("| shardtrain | %s | %lld | %.0f | %.1f %% | %.1f | %.0f / %.0f / %.0f ms |\n", a.full_ac ? "full" : "none",
              static_cast<long long>(a.batch), tps, 100 * mfu, peak_gib, 1e3 * fwd / n, 1e3 * bwd / n,
              1e3 * optim_s / n);
  std::printf("{\"engine\": \"shardtrain\", \"ac\": \"%s\", \"batch\": %lld, \"seq\": %lld, \"tokens_per_s\": %.1f, "
              "\"mfu\": %.4f, \"peak_gib\": %.2f, \"forward_ms\": %.2f, \"backward_ms\": %.2f, \"optimizer_ms\": %.2f}\n",
              a.full_ac ? "full" : "none", static_cast<long long>(a.batch), static_cast<long long>(a.seq), tps, mfu,
              peak_gib, 1e3 * fwd / n, 1e3 * bwd / n, 1e3 * optim_s / n);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_bench: %s\n", e.what());
  return 1;
}
