// End-to-end training throughput of one device: a Llama-shaped model (default: Llama 3.2
// 1B — 16 layers, width 2048, 32/8 heads, FFN 8192, vocab 128256, tied), random tokens,
// full steps (forward, fused head + loss, backward, grad-norm clipping, AdamW) through the
// trainer's own step (train/step.h): bf16 compute, f32 master weights, gradients and AdamW state.
// Validates before timing (the first loss of a random init is near ln V, every loss is
// finite), then reports tokens/s, MFU (torchtitan's FLOPs per token against the device's
// dense bf16 peak), the phase split and peak device memory, as a table row and a JSON line.
// On a GPU it also reads the board through NVML over the timed steps (core/gpu_monitor.h):
// mean power, SM clock, the share of time the power cap held the clock down, energy per token,
// and the dense peak at that clock, which bounds a power-capped step better than the datasheet's.
// With SHARDTRAIN_PROFILE=1 it also prints the time per op (core/profile.h).
// Several GPUs: start one process per GPU with a torchrun-style environment (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); the model is then sharded over them
// through NCCL exactly as in training, --batch is per data-parallel rank, tokens/s and MFU are
// per GPU, and the time the compute stream stood waiting on gathers and reductions is reported.
// --tp N: groups of N GPUs split each block's heads and FFN columns and each batch's token
// rows (the trainer's parallel.tensor_parallel); a group shares its --batch sequences.
// --replicate R: the data-parallel ranks form R replicas, each sharding the model over its own
// ranks, with the reduced gradient shards summed between replicas (the trainer's
// parallel.replicate, HSDP; R = the data-parallel ranks is DDP).
//
//   train_bench [--shape 1b|8b] [--batch 4] [--accum 1] [--seq 4096] [--steps 10] [--warmup 3]
//               [--ac none|pointwise|selective|full] [--layers 16] [--dim 2048] [--heads 32] [--kv-heads 8]
//               [--head-dim 0 (dim / heads)] [--ffn 8192] [--vocab 128256] [--untied] [--loss-chunk 0 (auto, as the
//               trainer)]
//               [--keep-gathered] [--compute-shards] [--reduce-bf16] [--gemm heuristic|timed] [--graph]
//               [--zero-fill] [--deterministic] [--separate-projections] [--offload] [--offload-sync]
//               [--offload-gpu-grads] [--offload-activations] [--offload-activation-blocks 0]
//               [--mlp-chunk -1 (auto, as the trainer; 0: at once)] [--documents 0] [--device cuda|cpu]
//               [--tp 1] [--replicate 1]
// --compute-shards: AdamW writes a bf16 copy of the master shards that the forward and
// backward use (one GPU: in place; several: gathered without a cast), as the trainer's
// parallel.compute_shards = on.
// --graph: one GPU, each step's forward + backward replayed as a CUDA graph after the first
// (model/captured_step.h), as the trainer does by default.
// --zero-fill: the gradients are cleared before each step and every micro-batch adds to them
// (for comparison: by default, as in the trainer, the first micro-batch overwrites them).
// --separate-projections: one product per projection (for comparison: by default, as in the
// trainer, one product makes q, k and v from their stacked weights, and one gate and up).
// --deterministic: the attention backward's bitwise-reproducible algorithm, as the trainer's
// training.deterministic = true.
// --offload: the shards and AdamW state in page-locked host memory, AdamW on the host's cores
// (the trainer's parallel.offload = true; no --graph); peak GPU memory then leaves them out. As
// in the trainer, the host AdamW of a step runs beside the next step's forward, which waits
// for each unit's update before copying it up: the forward column then includes those waits
// and the optimizer column only the norm and the update's launch. --offload-sync: the update
// runs before the next step starts instead (for comparison).
// --documents N: each row packed with documents of N tokens (the last shorter), each attending
// only to itself (the trainer's data.document_mask = on; no --graph), the FLOPs still counted
// by torchtitan's formula over the whole row, as for the peers.
// --mlp-chunk N: with --ac selective|full, each block's MLP runs N tokens at a time (the
// trainer's training.mlp_chunk_tokens; by default its automatic choice, 0 every token at once).
// --offload-gpu-grads: with --offload, the gradient shards stay on the GPU and the host holds
// only master weights and AdamW state (the trainer's parallel.offload_gradients = false; no
// bf16 copies on the host unless --compute-shards).
// --offload-activation-blocks N: with --offload-activations, only the first N blocks offload
// (the trainer's training.offload_activations_blocks; 0: all but the last two).
// --offload-activations: what each block keeps between forward and backward (with --ac full:
// its input) waits in page-locked host memory but for the last two blocks' (the trainer's
// training.offload_activations = true); works with --graph.
// --accum N: N micro-batches of --batch sequences per optimizer step (the trainer's
// training.grad_accum_steps): the global batch of --batch x N at the memory of --batch.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <omp.h>

#include "core/allocator.h"
#include "core/error.h"
#include "core/gpu_monitor.h"
#include "core/profile.h"
#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#endif
#include "core/random.h"
#include "dist/bootstrap.h"
#include "dist/communicator.h"
#ifdef SHARDTRAIN_WITH_CUDA
#include "dist/nccl_communicator.h"
#endif
#include "fsdp/sharded_store.h"
#include "fsdp/tensor_parallel.h"
#include "model/llama.h"
#include "ops/linear.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "train/plan.h"
#include "train/step.h"

namespace {

using namespace shardtrain;
using Clock = std::chrono::steady_clock;

struct Args {
  int64_t batch = 4, accum = 1, seq = 4096, steps = 10, warmup = 3;
  int64_t layers = 16, dim = 2048, heads = 32, kv_heads = 8, ffn = 8192, vocab = 128256;
  int64_t head_dim = 0;  // 0: dim / heads
  model::ActivationCheckpointing ac = model::ActivationCheckpointing::kNone;
  bool tied = true, keep_gathered = false, compute_shards = false, reduce_bf16 = false, graph = false;
  bool zero_fill = false, deterministic = false, separate_projections = false, offload = false;
  bool offload_activations = false, offload_sync = false, offload_gpu_grads = false;
  int64_t loss_chunk = 0;  // 0: the trainer's automatic choice
  int64_t mlp_chunk = -1;
  int64_t documents = 0;                  // tokens per packed document; 0: none
  int64_t offload_activation_blocks = 0;  // -1: the trainer's automatic choice; 0: every token at once
  int64_t tp = 1;                         // ranks per tensor-parallel group
  int64_t replicate = 1;                  // replicas of the sharded model (HSDP)
  std::string device = "cuda";
  std::string gemm = "heuristic";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      ST_CHECK(i + 1 < argc, "train_bench: ", k, " needs a value");
      return argv[++i];
    };
    if (k == "--batch")
      a.batch = std::stoll(next());
    else if (k == "--accum")
      a.accum = std::stoll(next());
    else if (k == "--seq")
      a.seq = std::stoll(next());
    else if (k == "--steps")
      a.steps = std::stoll(next());
    else if (k == "--warmup")
      a.warmup = std::stoll(next());
    else if (k == "--layers")
      a.layers = std::stoll(next());
    else if (k == "--dim")
      a.dim = std::stoll(next());
    else if (k == "--heads")
      a.heads = std::stoll(next());
    else if (k == "--kv-heads")
      a.kv_heads = std::stoll(next());
    else if (k == "--head-dim")
      a.head_dim = std::stoll(next());
    else if (k == "--ffn")
      a.ffn = std::stoll(next());
    else if (k == "--vocab")
      a.vocab = std::stoll(next());
    else if (k == "--loss-chunk")
      a.loss_chunk = std::stoll(next());
    else if (k == "--mlp-chunk")
      a.mlp_chunk = std::stoll(next());
    else if (k == "--offload-gpu-grads")
      a.offload_gpu_grads = true;
    else if (k == "--offload-activation-blocks")
      a.offload_activation_blocks = std::stoll(next());
    else if (k == "--untied")
      a.tied = false;
    else if (k == "--tp")
      a.tp = std::stoll(next());
    else if (k == "--replicate")
      a.replicate = std::stoll(next());
    else if (k == "--reduce-bf16")
      a.reduce_bf16 = true;
    else if (k == "--graph")
      a.graph = true;
    else if (k == "--documents")
      a.documents = std::stoll(next());
    else if (k == "--zero-fill")
      a.zero_fill = true;
    else if (k == "--deterministic")
      a.deterministic = true;
    else if (k == "--separate-projections")
      a.separate_projections = true;
    else if (k == "--gemm") {
      a.gemm = next();
      ST_CHECK(a.gemm == "timed" || a.gemm == "heuristic", "train_bench: --gemm timed|heuristic, found ", a.gemm);
    } else if (k == "--shape") {
      const std::string v = next();
      ST_CHECK(v == "1b" || v == "8b", "train_bench: --shape 1b|8b, found ", v);
      if (v == "8b") {  // Llama 3.1 8B: 32 layers, width 4096, FFN 14336, untied head
        a.layers = 32;
        a.dim = 4096;
        a.ffn = 14336;
        a.tied = false;
      }
    } else if (k == "--keep-gathered")
      a.keep_gathered = true;
    else if (k == "--compute-shards")
      a.compute_shards = true;
    else if (k == "--offload")
      a.offload = true;
    else if (k == "--offload-activations")
      a.offload_activations = true;
    else if (k == "--offload-sync")
      a.offload_sync = true;
    else if (k == "--ac") {
      a.ac = model::parse_checkpointing(next(), "train_bench: --ac");
    } else if (k == "--device")
      a.device = next();
    else
      ST_THROW("train_bench: unknown option ", k, " (see the comment at the top of bench/train/train_bench.cpp)");
  }
  ST_CHECK(a.batch > 0 && a.accum > 0 && a.seq > 0 && a.steps > 0 && a.warmup >= 0,
           "train_bench: --batch, --accum, --seq and --steps must be positive, --warmup not negative");
  return a;
}

// The device and the ranks: one GPU, several through NCCL (a torchrun-style launch), or the CPU.
struct BenchDevice {
  Device dev = Device::cpu();
  double peak_flops = 0;
  std::string device_name = "cpu";
  double flops_per_clock = 0;
  GpuMonitor power;  // the board's power and clock over the timed steps
  std::unique_ptr<dist::Communicator> comm;
};

BenchDevice open_device(const Args& a) {
  BenchDevice d;
  const std::optional<dist::LaunchEnv> env = dist::launch_from_env();
#ifdef SHARDTRAIN_WITH_CUDA
  if (a.device == "cuda") {
    ST_CHECK(cuda::device_count() > 0, "train_bench: no CUDA device");
    int gpu = 0;
    if (env && env->world_size > 1) {
      d.comm = dist::make_nccl_world(300, &gpu);
    } else {
      cuda::init_device(0);
    }
    d.dev = Device::cuda(gpu);
    d.peak_flops = cuda::dense_bf16_peak_flops(gpu);
    profile::set_roofline(d.peak_flops, cuda::memory_bandwidth(gpu));
    d.device_name = cuda::device_name(gpu);
    d.flops_per_clock = cuda::dense_bf16_flops_per_clock(gpu);
    d.power = GpuMonitor::open(cuda::pci_bus_id(gpu));
  }
#endif
  if (!d.comm) {
    ST_CHECK(!env || env->world_size == 1, "train_bench: several ranks need GPUs (NCCL)");
    d.comm = dist::make_single_rank();
  }
  return d;
}

model::LlamaConfig model_shape(const Args& a) {
  model::LlamaConfig c;
  c.vocab_size = a.vocab;
  c.dim = a.dim;
  c.n_layers = a.layers;
  c.n_heads = a.heads;
  c.n_kv_heads = a.kv_heads;
  c.head_dim_override = a.head_dim;
  c.ffn_dim = a.ffn;
  c.max_seq_len = a.seq;
  c.rope.theta = 500000.0;
  c.tie_embeddings = a.tied;
  c.validate("bench.");
  return c;
}

// The sharded store's options from the command line, as the trainer's parallel section sets them.
fsdp::ShardingOptions sharding_options(const Args& a, DType compute) {
  fsdp::ShardingOptions options;
  options.compute_dtype = compute;
  if (a.reduce_bf16) options.reduce_dtype = DType::kBF16;
  options.reshard_after_forward = !a.keep_gathered;
  options.compute_shards = a.compute_shards;
  options.offload = a.offload;
  options.offload_grads = !a.offload_gpu_grads;
  ST_CHECK(a.offload || !a.offload_gpu_grads, "train_bench: --offload-gpu-grads goes with --offload");
  ST_CHECK(!a.offload || !a.graph, "train_bench: --offload runs eagerly (no --graph)");
  return options;
}

// The first line of the output: the devices, the model, and the settings that change the step.
std::string describe_setup(const Args& a, const BenchDevice& device, const model::LlamaConfig& c,
                           const fsdp::DeviceMesh& mesh, const fsdp::ShardedUnitStore& store, const model::Llama& m,
                           const model::StepOptions& o, double init_seconds) {
  const int world = mesh.world().world_size();
  const int64_t dp = mesh.shape().data_parallel;
  return detail::concat(
      "# ", device.device_name, " x ", world,
      a.tp > 1 ? detail::concat(" (", dp, " data-parallel x ", a.tp, " tensor-parallel)") : "",
      a.replicate > 1 ? detail::concat(" in ", a.replicate, " replicas (HSDP)") : "", ", ", c.summary(), "; init ",
      init_seconds, " s; loss chunk ", o.loss_chunk_tokens, " tokens; MLP piece ",
      m.mlp_chunk_tokens() > 0 ? std::to_string(m.mlp_chunk_tokens()) + " tokens" : std::string("all"),
      " (with selective/full AC); GEMM algorithms ", a.gemm, a.graph ? "; CUDA graph" : "",
      a.compute_shards ? "; compute shards" : "", a.deterministic ? "; deterministic" : "",
      a.separate_projections ? "; separate q/k/v and gate/up products" : "",
      a.offload ? detail::concat("; offloaded", a.offload_gpu_grads ? " (gradients on the GPU)" : "", ": ",
                                 format_bytes(store.pinned_bytes()), " page-locked host memory, AdamW on ",
                                 omp_get_max_threads(), " host threads")
                : std::string(),
      a.offload_activations ? "; activations offloaded" : "", "\n");
}

// The timed steps' totals.
struct BenchTimes {
  double timed = 0, forward = 0, backward = 0, optimizer = 0, comm_wait = 0, offload_wait = 0, host_issue = 0;
  int64_t system_allocs_before = 0;  // the device's allocations before the timed steps
};

// The report after the timed steps: host issue time, activation offload, the per-op profile,
// the board's readings, and the result as a table row and a JSON line (rank 0).
void print_results(const Args& a, BenchDevice& device, const model::LlamaConfig& c, model::Llama& m,
                   const fsdp::DeviceMesh& mesh, const BenchTimes& times) {
  const Device dev = device.dev;
  const double peak_flops = device.peak_flops;
  const int world = mesh.world().world_size(), rank = mesh.world().rank();
  const int64_t dp = mesh.shape().data_parallel;
  const double timed = times.timed, fwd = times.forward, bwd = times.backward, optim_s = times.optimizer;
  const double comm_wait = times.comm_wait, offload_wait = times.offload_wait, host_issue = times.host_issue;
  auto say = [&](const std::string& s) {
    if (rank == 0) std::fputs(s.c_str(), stdout), std::fflush(stdout);
  };
  // per GPU and optimizer step (a tensor-parallel group's GPUs share their rank's tokens)
  const double tokens = static_cast<double>(a.batch * a.accum * a.seq) / static_cast<double>(a.tp);
  const GpuActivity board = device.power.take();
  const double n = static_cast<double>(a.steps);
  if (!dev.is_cpu())
    say(detail::concat("# host time issuing forward + backward: ", 1e3 * host_issue / n, " ms of ",
                       1e3 * (fwd + bwd) / n, " ms on the device; device allocations in the timed steps: ",
                       allocator_for(dev).stats().num_system_allocs - times.system_allocs_before, "\n"));
  if (model::ActivationOffload* ao = m.activation_offload())
    say(detail::concat("# activations offloaded: ", format_bytes(ao->bytes_offloaded()),
                       " per micro-batch down and back up; ", format_bytes(ao->host_bytes()), " page-locked",
                       a.graph ? ""
                               : detail::concat("; the compute stream waited for the copies ", 1e3 * offload_wait / n,
                                                " ms a timed step"),
                       "\n"));
  if (profile::enabled() && rank == 0)
    std::printf("# per-op time over %lld steps (SHARDTRAIN_PROFILE=1: synchronised per op, so slower); roofline: "
                "max(FLOPs / dense bf16 peak, bytes / memory bandwidth) as a share of the op's time\n%s",
                static_cast<long long>(a.steps), profile::report_and_reset().c_str());
  const double tps = tokens * n / timed;
  const double mfu = peak_flops > 0 ? c.flops_per_token(a.seq) * tps / peak_flops : 0.0;
  // per rank: energy per token, and the dense peak at the clock the board held
  const bool watts = board.samples > 0 && std::isfinite(board.mean_power_w);  // timed steps over kMinPowerSeconds
  const double mj_per_token = watts ? 1e3 * board.energy_j / (tokens * n) : 0.0;
  const double clock_peak = device.flops_per_clock * board.mean_sm_mhz * 1e6;
  if (board.samples > 0) {
    char line[512];
    int len = std::snprintf(line, sizeof line, "# GPU%s over the timed steps: %s", world > 1 ? " of rank 0" : "",
                            format_activity(board).c_str());
    if (watts)
      len += std::snprintf(line + len, sizeof line - static_cast<size_t>(len), "; %.2f mJ per token", mj_per_token);
    if (clock_peak > 0)
      std::snprintf(line + len, sizeof line - static_cast<size_t>(len),
                    "; dense bf16 peak at the mean SM clock %.0f TFLOP/s (datasheet %.0f): "
                    "model FLOPs at %.1f %% of it",
                    clock_peak / 1e12, peak_flops / 1e12, 100 * c.flops_per_token(a.seq) * tps / clock_peak);
    say(std::string(line) + "\n");
  } else if (!dev.is_cpu()) {
    say("# GPU power readings off: " + device.power.why_unavailable() + "\n");
  }
  const double peak_gib = static_cast<double>(allocator_for(dev).stats().peak_allocated_bytes) / (1u << 30);
  if (const std::string peak = describe_peak_breakdown(allocator_for(dev)); !peak.empty()) say("# " + peak);
  std::string label = world > 1 ? detail::concat("shardtrain, ", world, " GPUs") : "shardtrain";
  if (a.tp > 1) label += detail::concat(" (", dp, " x ", a.tp, " tensor-parallel)");
  if (a.replicate > 1) label += detail::concat(", ", a.replicate, " replicas");
  if (a.offload) label += ", ZeRO offload";
  if (a.offload_activations) label += ", activations offloaded";
  const std::string wait_part =
      world > 1 ? detail::concat(", comm wait ", 100 * comm_wait / timed, " % of the step") : std::string();
  const std::string batch_text =
      a.accum > 1 ? detail::concat(a.batch, " x ", a.accum, " micro-batches") : std::to_string(a.batch);
  char row[768];
  std::string gpu_fields;  // the board's readings, where there are some
  if (watts) {
    std::snprintf(row, sizeof row,
                  ", \"gpu_power_w\": %.1f, \"gpu_sm_mhz\": %.0f, \"gpu_power_capped\": %.3f, \"mj_per_token\": %.3f",
                  board.mean_power_w, board.mean_sm_mhz, board.power_capped, mj_per_token);
    gpu_fields = row;
  }
  std::snprintf(row, sizeof row, "| %s | %s | %s | %.0f | %.1f %% | %.1f | %.0f / %.0f / %.0f ms%s |\n", label.c_str(),
                model::checkpointing_name(a.ac), batch_text.c_str(), tps, 100 * mfu, peak_gib, 1e3 * fwd / n,
                1e3 * bwd / n, 1e3 * optim_s / n, wait_part.c_str());
  say(row);
  std::snprintf(
      row, sizeof row,
      "{\"engine\": \"shardtrain\", \"gpus\": %d, \"tp\": %lld, \"replicate\": %lld, \"ac\": \"%s\", \"batch\": %lld, "
      "\"accum\": %lld, \"seq\": %lld, "
      "\"tokens_per_s\": %.1f, \"mfu\": %.4f, \"peak_gib\": %.2f, \"forward_ms\": %.2f, "
      "\"backward_ms\": %.2f, \"optimizer_ms\": %.2f, \"comm_wait_fraction\": %.4f%s}\n",
      world, static_cast<long long>(a.tp), static_cast<long long>(a.replicate), model::checkpointing_name(a.ac),
      static_cast<long long>(a.batch), static_cast<long long>(a.accum), static_cast<long long>(a.seq), tps, mfu,
      peak_gib, 1e3 * fwd / n, 1e3 * bwd / n, 1e3 * optim_s / n, comm_wait / timed, gpu_fields.c_str());
  say(row);
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  BenchDevice device = open_device(a);
  const Device dev = device.dev;
  GpuMonitor& power = device.power;
  std::unique_ptr<dist::Communicator>& comm = device.comm;
  const int world = comm->world_size(), rank = comm->rank();
  auto say = [&](const std::string& s) {
    if (rank == 0) std::fputs(s.c_str(), stdout), std::fflush(stdout);
  };
  const DType compute = dev.is_cpu() ? DType::kF32 : DType::kBF16;

  const model::LlamaConfig c = model_shape(a);
  ST_CHECK(a.tp >= 1 && world % a.tp == 0, "train_bench: --tp ", a.tp, " must divide the ", world, " ranks");
  ST_CHECK(a.replicate >= 1 && (world / a.tp) % a.replicate == 0, "train_bench: --replicate ", a.replicate,
           " must divide the ", world / a.tp, " data-parallel ranks");
  const fsdp::DeviceMesh mesh(
      comm.get(), model::Mesh{world / static_cast<int>(a.tp), static_cast<int>(a.tp), static_cast<int>(a.replicate)});
  const int64_t dp = mesh.shape().data_parallel;
  const model::ModelLayout layout = model::ModelLayout::llama(c, mesh.shape(), mesh.tp_rank());
  fsdp::ShardedUnitStore store(layout, mesh, sharding_options(a, compute), dev);
  const Clock::time_point t_init = Clock::now();
  store.init_random(1234, c.init_std);
  model::Llama m(c, layout, &store, compute, dev);
  const std::unique_ptr<model::TensorParallel> tensor_parallel = fsdp::make_tensor_parallel(&mesh.tensor_parallel());
  if (a.tp > 1) m.set_tensor_parallel(tensor_parallel.get());
  m.set_separate_projections(a.separate_projections);
  m.set_mlp_chunk_tokens(a.mlp_chunk >= 0 ? a.mlp_chunk
                                          : train::auto_mlp_chunk_tokens(!dev.is_cpu(), a.ffn, a.batch * a.seq));
  optim::AdamWConfig adamw_options;
  adamw_options.host_f32 = a.offload;
  optim::AdamW opt(layout, rank, adamw_options, DType::kF32, store.shard_device());

  std::vector<Tensor> ids, targets;  // [micro-batch]
  for (int64_t i = 0; i < a.accum; ++i) {
    ids.push_back(Tensor::empty({a.batch, a.seq}, DType::kI32, Device::cpu(), "ids"));
    targets.push_back(Tensor::empty({a.batch, a.seq}, DType::kI32, Device::cpu(), "targets"));
  }
  // each data-parallel rank its own part of the global batch; a tensor-parallel group shares one
  CounterRng rng(7 + static_cast<uint64_t>(mesh.dp_rank()));
  train::OptimizerStepOptions step_options;
  step_options.batch_size = a.batch;
  step_options.seq_len = a.seq;
  step_options.micro_batches = a.accum;
  step_options.zero_fill = a.zero_fill;
  model::StepOptions& o = step_options.model;
  o.checkpointing = a.ac;
  o.deterministic = a.deterministic;
  o.offload_activations = a.offload_activations;
  o.offload_activation_blocks = a.offload_activation_blocks;
  o.loss_chunk_tokens = a.loss_chunk > 0 ? a.loss_chunk : train::auto_loss_chunk_tokens(!dev.is_cpu(), a.vocab);
  ops::set_gemm_selection(a.gemm == "timed" ? ops::GemmSelection::kTimed : ops::GemmSelection::kHeuristic);
  o.grad_scale = 1.0 / static_cast<double>(a.batch * a.accum * a.seq * dp);
  // per GPU and optimizer step (a tensor-parallel group's GPUs share their rank's tokens)
  const double tokens = static_cast<double>(a.batch * a.accum * a.seq) / static_cast<double>(a.tp);
  say(describe_setup(a, device, c, mesh, store, m, o, std::chrono::duration<double>(Clock::now() - t_init).count()));
  Tensor loss_total = Tensor::empty({1}, DType::kF64, Device::cpu(), "loss");

  if (a.graph) ST_CHECK(!dev.is_cpu() && world == 1, "train_bench: --graph needs one GPU");
  ST_CHECK(a.documents == 0 || !a.graph, "train_bench: --documents runs eagerly, without --graph");
  Tensor positions;
  if (a.documents > 0) {
    positions = Tensor::empty({a.batch, a.seq}, DType::kI32, Device::cpu(), "positions");
    for (int64_t i = 0; i < positions.numel(); ++i)
      positions.data<int32_t>()[i] = static_cast<int32_t>(i % a.seq % a.documents);
    say(detail::concat("# packed documents of ", a.documents, " tokens, each attending only to itself\n"));
  }
  bool graphed = a.graph;
  if (graphed && profile::enabled()) {  // its timers synchronise around every op, which a capture forbids
    say("# SHARDTRAIN_PROFILE=1: steps run eagerly, not as a CUDA graph\n");
    graphed = false;
  }
  // the trainer's step: the first micro-batch writes the gradients over the last step's
  // (--zero-fill: cleared before each step, every micro-batch adds)
  step_options.cuda_graph = graphed;
  // declared after `opt` and `store`: an update still in flight when an error leaves is waited for first
  train::OptimizerStep optimizer_step(m, store, opt, mesh, step_options);
  BenchTimes times;
  (void)power.take();
  for (int64_t step = 1; step <= a.warmup + a.steps; ++step) {
    for (int64_t mb = 0; mb < a.accum; ++mb) {
      for (int64_t i = 0; i < ids[mb].numel(); ++i) {
        ids[mb].data<int32_t>()[i] = static_cast<int32_t>(rng.next_below(static_cast<uint64_t>(a.vocab)));
        targets[mb].data<int32_t>()[i] = static_cast<int32_t>(rng.next_below(static_cast<uint64_t>(a.vocab)));
      }
    }
    const Clock::time_point t0 = Clock::now();
    const train::ForwardBackward passes = optimizer_step.forward_backward(
        ids, targets, o.grad_scale,
        positions.defined() ? std::vector<Tensor>(static_cast<size_t>(a.accum), positions) : std::vector<Tensor>());
    const double step_fwd = passes.forward_s, step_bwd = passes.backward_s, step_issue = passes.host_issue_s;
    const Clock::time_point t1 = Clock::now();
    // as the trainer: offloaded, the norm from the sums of squares the GPU took as the gradients
    // went down, and the host update beside the next step's forward (unless --offload-sync)
    const double clip = optim::clip_coefficient(optimizer_step.gradient_norm(), 1.0);
    optimizer_step.update(1e-5, clip, false, a.offload_sync);  // then waits for the device
    const Clock::time_point t2 = Clock::now();
    loss_total.data<double>()[0] = passes.loss_sum;
    comm->all_reduce(loss_total, dist::ReduceOp::kSum);
    const double loss = loss_total.data<double>()[0] / (tokens * world);
    const double waited = store.take_comm_wait_seconds();
    const double act_waited = m.activation_offload() ? m.activation_offload()->take_wait_seconds() : 0.0;
    ST_CHECK(std::isfinite(loss), "train_bench: loss is ", loss, " at step ", step);
    // random logits of spread s start near ln V + s^2/2: deep models (8B: 32 blocks of
    // std-0.02 weights) start up to ~1 above ln V; far outside that the model is broken
    const double ln_v = std::log(static_cast<double>(a.vocab));
    if (step == 1)
      ST_CHECK(loss > ln_v - 0.5 && loss < ln_v + 1.5, "train_bench: first loss ", loss, " is not near ln V = ", ln_v,
               ": the model is wrong");
    if (step == a.warmup) {  // profile and read the power of the timed steps only
      (void)profile::report_and_reset();
      (void)power.take();
    }
    if (step > a.warmup) {
      times.timed += std::chrono::duration<double>(t2 - t0).count();
      times.forward += step_fwd;
      times.backward += step_bwd;
      times.optimizer += std::chrono::duration<double>(t2 - t1).count();
      times.host_issue += step_issue;
      times.comm_wait += waited;
      times.offload_wait += act_waited;
    }
    if (step == a.warmup) times.system_allocs_before = allocator_for(dev).stats().num_system_allocs;
    char loss_text[32];  // every digit: two runs can be compared for bitwise repetition
    std::snprintf(loss_text, sizeof loss_text, "%.17g", loss);
    say(detail::concat("# step ", step, " loss ", loss_text, "  ", 1e3 * std::chrono::duration<double>(t2 - t0).count(),
                       " ms", world > 1 ? detail::concat("  comm wait ", 1e3 * waited, " ms") : "", "\n"));
  }
  // Offloaded and overlapped, each timed step's forward waits for the previous step's host
  // update (the first timed step for the last warm-up step's): one update per timed step, as
  // in a long run. The last one has no forward after it to overlap; it drains here, outside
  // the timing, as a run's last update does once at its end.
  store.wait_for_host_update();
  print_results(a, device, c, m, mesh, times);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_bench: %s\n", e.what());
  return 1;
}
