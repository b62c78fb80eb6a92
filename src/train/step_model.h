// `shardtrain plan`'s step-time model: a training step's time from the model's shape, the
// batch, the parallel layout and the machine, op family by op family, instead of a step's
// FLOPs over an assumed MFU.
//
// What it counts, per micro-batch and rank:
//  - compute: each block product (q|k|v, o, gate|up, down) and the head's at the matmul rate
//    of their dtype (bf16, or FP8 with training.fp8 / training.fp8_head), the attention's
//    products (causal: half the T x T scores; a sliding layer: the pairs inside its window)
//    at the attention rate for the sequence length, and the streaming passes (norms, RoPE,
//    SwiGLU, the loss's passes over the logits, FP8 quantisation, AdamW) as bytes over the
//    achieved HBM bandwidth; activation checkpointing's recomputation adds its forward work;
//  - communication: per block the all-gather of its bf16 parameters in the forward (again in
//    the backward when resharded) and the reduce-scatter of its gradients (f32, or bf16 with
//    parallel.reduce_dtype), ring cost (n-1)/n x bytes / link bandwidth each, the replicas'
//    all-reduce (HSDP) 2(r-1)/r, on NVLink inside a node and the network across nodes; the
//    tensor-parallel group's gathers and reduce-scatters of the residual stream's rows;
//  - overlap: a unit's gathers (and the previous unit's reduce-scatter) run beside the
//    compute of the unit before it, so a pass takes max(compute, communication) per block plus
//    the ends that nothing hides (the first gather, the last reduce-scatter); the
//    tensor-parallel exchanges sit between a block's products and are counted as exposed;
//  - host offload (parallel.offload): the host AdamW (bytes per parameter over the host's
//    memory bandwidth, shared by the node's ranks) runs beside the next step's forward, the
//    PCIe copies (units up, gradients and offloaded activations down) beside the blocks.
//
// Every default rate names the measurement it comes from (step_model.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/profile.h"

#include "train/plan.h"

namespace shardtrain::train {

// Achieved rates of one GPU, per op family.
struct StepRates {
  std::string gpu;             // the --gpu name: h100-sxm, h100-pcie, h200, a100
  double peak_bf16_flops = 0;  // the datasheet's dense bf16 peak (for MFU), FLOP/s
  double matmul_bf16 = 0;      // FLOP/s of the bf16 products (cuBLASLt)
  double matmul_fp8 = 0;       // FLOP/s of the FP8 products; 0: no FP8 tensor cores (bf16's rate)
  // The attention kernels' FLOP/s (cuDNN; the backward's FLOPs 2.5 x the forward's), as
  // measured at `attention_seq_len` tokens; other lengths scale by T / (T + T0) (step_model.cpp).
  double attention_forward_bf16 = 0;
  double attention_backward_bf16 = 0;
  double attention_forward_fp8 = 0;  // training.fp8_attention
  double attention_backward_fp8 = 0;
  int64_t attention_seq_len = 4096;
  double memory_bytes = 0;        // bytes/s of the streaming passes (norms, RoPE, SwiGLU, AdamW, the loss's)
  double fp8_quantize_bytes = 0;  // bytes/s of FP8 quantisation passes
  std::string source;             // where the figures come from, for the printout
};

// The links and the host around the GPUs.
struct MachineSpec {
  int gpus_per_node = 8;             // --gpus-per-node: ranks sharing one node's NVLink and host memory
  double nvlink_bytes = 360e9;       // bytes/s per GPU and direction, achieved (--nvlink-gbps, in GB/s)
  double inter_node_bytes = 400e9;   // bytes/s per node and direction (--inter-node-gbps, in Gb/s per node)
  double host_memory_bytes = 100e9;  // bytes/s of one node's host memory (--host-gbps, in GB/s)
  double pcie_bytes = 50e9;          // bytes/s per GPU and direction (--pcie-gbps, in GB/s)
};

// The default rates of `gpu` for a model of head dimension `head_dim` (cuDNN's attention runs
// slower at head dim 64 than at 128).
StepRates default_step_rates(const GpuSpec& gpu, int64_t head_dim);

// The rates of a calibration file (`plan --calibration FILE`, JSON): the fields it sets over
// `defaults`. Format (every field optional but "gpu"'s type; rates as the profile prints them):
//   {"gpu": "h100-sxm", "matmul_bf16_tflops": 712, "matmul_fp8_tflops": 1305,
//    "attention_forward_tflops": 393, "attention_backward_tflops": 295, "attention_seq_len": 4096,
//    "attention_forward_fp8_tflops": 891, "attention_backward_fp8_tflops": 851,
//    "memory_gbps": 2680, "fp8_quantize_gbps": 2020}
// An unknown field, a value that is not a positive number, or a "gpu" other than `defaults.gpu`
// throws naming the file and the field.
StepRates read_calibration(const std::string& path, const StepRates& defaults);
// The file's "gpu" field ("" without one), for `plan` to plan that GPU when --gpu is not given.
std::string calibration_gpu(const std::string& path);
// The same as read_calibration from the file's text (`path` only names it in errors).
StepRates parse_calibration(const std::string& text, const std::string& path, const StepRates& defaults);

// A calibration file's text (the format above) from a profiled run's per-op totals
// (profile::op_totals(), SHARDTRAIN_PROFILE=1): each field from the rows plan's rates come from
// (matmul_bf16_tflops from linear_backward, unless FP8 linears ran; matmul_fp8_tflops from
// fp8_product; the attention fields from attention_forward, attention_backward and their _fp8
// rows, at `seq_len`; memory_gbps from the SwiGLU, RMSNorm and AdamW rows together;
// fp8_quantize_gbps from fp8_quantize). A field whose rows did not run is left out, so plan
// keeps its default; "gpu" is left out when `gpu` is empty. Throws when no field can be made.
std::string calibration_from_profile(const std::vector<profile::OpTotal>& ops, const std::string& gpu, int64_t seq_len,
                                     bool fp8_linears);

// A step's predicted time, with its parts (seconds per step, every micro-batch counted).
struct StepTime {
  int64_t tokens_per_step = 0;   // all data-parallel ranks
  double matmul_bf16_s = 0;      // the bf16 products (blocks and head), recomputation included
  double matmul_fp8_s = 0;       // the FP8 products
  double attention_s = 0;        // the attention kernels, forward, recompute and backward
  double memory_s = 0;           // streaming passes: norms, RoPE, SwiGLU, the loss's passes
  double fp8_quantize_s = 0;     // FP8 quantisation passes
  double optimizer_s = 0;        // the GPU's AdamW and gradient norm (0 with parallel.offload)
  double recompute_s = 0;        // of the compute above: what activation checkpointing adds
  double contention_s = 0;       // compute slowed by the collectives' kernels running beside it
  double compute_s = 0;          // the sum of the compute parts above (contention included)
  double comm_total_s = 0;       // the collectives' time on their links, overlapped or not
  double comm_exposed_s = 0;     // of it, what the compute does not hide (the ends, the excess)
  double tensor_parallel_s = 0;  // the tensor-parallel group's exchanges (exposed)
  double pcie_s = 0;             // parallel.offload's and activation offload's copies on the bus
  double host_update_s = 0;      // the host AdamW (parallel.offload)
  double offload_exposed_s = 0;  // what the copies and the host update add to the step
  double step_s = 0;
  double tokens_per_second_per_gpu = 0;
  double mfu = 0;  // model FLOPs (6N + 12 L H Q T per token) over the bf16 peak
};

StepTime model_step_time(const PlanInput& in, const StepRates& rates, const MachineSpec& machine);

// The prediction as `plan` prints it; `gpu_note` says where the GPU came from.
std::string describe_step_time(const PlanInput& in, const StepRates& rates, const MachineSpec& machine,
                               const std::string& gpu_note);

}  // namespace shardtrain::train
