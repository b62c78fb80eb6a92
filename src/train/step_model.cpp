// The step-time model of step_model.h. Every default figure below names the measurement it
// comes from: the per-op profiles (SHARDTRAIN_PROFILE=1) and device benchmarks recorded in
// docs/benchmarks/history.md, by entry title and date.
#include "train/step_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/block.h"
#include "model/layout.h"

namespace shardtrain::train {

namespace {

// ---- The attention's rate against the sequence length ------------------------------------
// cuDNN's flash attention runs further below its long-sequence rate the shorter the sequence
// (the causal diagonal's partial tiles, fewer tiles per CTA, the backward's dO.O and dQ
// passes): rate(T) = rate_long x T / (T + T0). T0 comes from two profiles of the 8B shape
// (head dim 128), bf16 attention:
//  - "One H100: the attention forward in FP8" (2026-11-28): at 131,072 tokens the forward ran
//    at 558 TFLOP/s, the backward at 533;
//  - "Two H200s: the Llama-3.1-8B shape, sharded" (2026-11-23): at 4,096 tokens the forward at
//    509 TFLOP/s, the backward at 400.
// T0 solves rate(4096) / rate(131072) = the measured ratio: ~408 tokens forward, ~1,421 backward.
constexpr double kShortT = 4096, kLongT = 131072;
constexpr double t0_from(double rate_short, double rate_long) {
  const double r = rate_short / rate_long;
  return kShortT * kLongT * (1 - r) / (r * kLongT - kShortT);
}
constexpr double kAttentionForwardT0 = t0_from(509, 558);
constexpr double kAttentionBackwardT0 = t0_from(400, 533);
double length_factor(double tokens, double t0) { return tokens / (tokens + t0); }

// ---- Default achieved rates ------------------------------------------------------------------
// Dense peaks: NVIDIA's datasheets (H100 SXM and H200: 989 TFLOP/s bf16, 1,979 FP8; HBM 3.35
// TB/s on the H100 SXM, 4.8 TB/s on the H200; H100 PCIe 756 TFLOP/s, 2.0 TB/s; A100 SXM
// 312 TFLOP/s, 2.04 TB/s).
//
// bf16 products: "One H100: the one-GPU step at the head, and where its time goes"
// (2026-11-26, 1B shape, batch 8): linear backward 708 TFLOP/s, forward 719 / 705, i.e. 72 %
// of 989 on the power-capped board. The H200 has the same die and 700 W cap: the same
// fraction ("Two H200s: the Llama-3.1-8B shape, sharded", 2026-11-23, measured 741-747 on the
// 8B's larger products, 75 %; the 1B shape ran within 2 % of the H100 on an H200).
constexpr double kMatmulFraction = 0.72;
// FP8 products: "H100s: the head in FP8 too" (2026-11-27): 1,307 TFLOP/s on the 1B shape and
// 1,303 on the 8B shape on two H100s, i.e. 66 % of the 1,979 FP8 peak.
constexpr double kMatmulFp8Fraction = 0.66;
// Streaming passes: the same 2026-11-26 one-H100 table: SwiGLU 89-90 % of 3.35 TB/s, AdamW
// 78 %, RMSNorm 75-80 %, RoPE 54-77 %: 80 % for them all.
constexpr double kMemoryFraction = 0.80;
// FP8 quantisation: 2.19 TB/s (1B, one H100) and 1.85 TB/s (8B, two H100s) in the
// 2026-11-27 entry's profiles: 60 % of 3.35 TB/s.
constexpr double kQuantizeFraction = 0.60;
// Attention at head dim 128, long-sequence rates from the 131,072-token profile above (H100);
// FP8 forward: 891 TFLOP/s in the same entry's FP8-attention run. The FP8 backward had no
// per-op figure: taken as the bf16 backward times the forward's FP8 gain (891 / 558).
constexpr double kAttentionForwardLong = 558, kAttentionBackwardLong = 533, kAttentionForwardFp8Long = 891;
// Head dim 64 (the 1B shape): 393 TFLOP/s forward and 295 backward at 4,096 tokens on one
// H100 (the 2026-11-26 table above).
constexpr double kAttentionForwardHd64At4096 = 393, kAttentionBackwardHd64At4096 = 295;
// Compute beside the collectives: "Two H200s: the Llama-3.1-8B shape, sharded" profiled the
// ops of a 2-rank step at 712 ms against the 801 ms step, the difference the GEMMs running
// slower beside NCCL's kernels (which take SMs and memory bandwidth): compute x 801 / 712
// wherever a step has FSDP or HSDP collectives.
constexpr double kContention = 801.0 / 712.0 - 1.0;
// Host AdamW bytes per parameter: f32 master read and written (8), m and v read and written
// (16), the f32 gradient read (4), the bf16 copy written (2): "One H100's host: the offloaded
// AdamW and gradient norm at memory speed" (2026-11-23), 30 explicit bytes per element.
constexpr double kHostAdamBytes = 30;
// The GPU's AdamW over the f32 shards: the same 30 bytes, and the gradient norm's read (4).
constexpr double kGpuOptimizerBytes = 34;

double tflops(double x) { return x * 1e12; }

}  // namespace

StepRates default_step_rates(const GpuSpec& gpu, int64_t head_dim) {
  StepRates r;
  r.gpu = gpu.name;
  r.peak_bf16_flops = gpu.bf16_flops;
  const double hbm = gpu.name == "h200"        ? 4.8e12
                     : gpu.name == "h100-sxm"  ? 3.35e12
                     : gpu.name == "h100-pcie" ? 2.0e12
                                               : 2.04e12;
  // the measured fractions are Hopper's; other GPUs are planned at the H100's
  r.matmul_bf16 = gpu.bf16_flops * kMatmulFraction;
  r.matmul_fp8 = gpu.fp8 ? 2 * gpu.bf16_flops * kMatmulFp8Fraction : 0;
  r.memory_bytes = hbm * kMemoryFraction;
  r.fp8_quantize_bytes = hbm * kQuantizeFraction;
  // attention: long-sequence rates brought to 4,096 tokens, the length the rates are stated at
  const double scale = gpu.bf16_flops / 989e12;
  const double fwd_4096 =
      kAttentionForwardLong / length_factor(kLongT, kAttentionForwardT0) * length_factor(kShortT, kAttentionForwardT0);
  const double bwd_4096 = kAttentionBackwardLong / length_factor(kLongT, kAttentionBackwardT0) *
                          length_factor(kShortT, kAttentionBackwardT0);
  double fwd = fwd_4096, bwd = bwd_4096;
  if (head_dim <= 64) fwd = kAttentionForwardHd64At4096, bwd = kAttentionBackwardHd64At4096;
  r.attention_seq_len = 4096;
  r.attention_forward_bf16 = tflops(fwd) * scale;
  r.attention_backward_bf16 = tflops(bwd) * scale;
  const double fp8_gain = kAttentionForwardFp8Long / kAttentionForwardLong;
  r.attention_forward_fp8 = gpu.fp8 ? r.attention_forward_bf16 * fp8_gain : 0;
  r.attention_backward_fp8 = gpu.fp8 ? r.attention_backward_bf16 * fp8_gain : 0;
  r.source = fmt::format("default rates of the {} (measured per-op profiles, head dim {})", gpu.label,
                         head_dim <= 64 ? 64 : 128);
  return r;
}

StepRates parse_calibration(const std::string& text, const std::string& path, const StepRates& defaults) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    ST_THROW("plan: --calibration `", path, "` is not valid JSON (", e.what(),
             "); write an object such as {\"gpu\": \"h100-sxm\", \"matmul_bf16_tflops\": 712}");
  }
  ST_CHECK(j.is_object(), "plan: --calibration `", path, "` must hold a JSON object of rates, found ", j.type_name());
  StepRates r = defaults;
  struct Field {
    const char* name;
    double* target;
    double unit;
  };
  double seq_len = static_cast<double>(r.attention_seq_len);
  const Field fields[] = {
      {"matmul_bf16_tflops", &r.matmul_bf16, 1e12},
      {"matmul_fp8_tflops", &r.matmul_fp8, 1e12},
      {"attention_forward_tflops", &r.attention_forward_bf16, 1e12},
      {"attention_backward_tflops", &r.attention_backward_bf16, 1e12},
      {"attention_forward_fp8_tflops", &r.attention_forward_fp8, 1e12},
      {"attention_backward_fp8_tflops", &r.attention_backward_fp8, 1e12},
      {"attention_seq_len", &seq_len, 1},
      {"memory_gbps", &r.memory_bytes, 1e9},
      {"fp8_quantize_gbps", &r.fp8_quantize_bytes, 1e9},
  };
  std::string names = "gpu";
  for (const Field& f : fields) names += std::string(", ") + f.name;
  for (const auto& [key, value] : j.items()) {
    if (key == "gpu") {
      ST_CHECK(value.is_string(), "plan: --calibration `", path, "`: \"gpu\" must be a string such as \"h100-sxm\"");
      ST_CHECK(value.get<std::string>() == defaults.gpu, "plan: --calibration `", path, "` is for GPU \"",
               value.get<std::string>(), "\" but the plan is for ", defaults.gpu, "; pass --gpu ",
               value.get<std::string>(), " or use a calibration of this GPU");
      continue;
    }
    const Field* f = nullptr;
    for (const Field& g : fields)
      if (key == g.name) f = &g;
    ST_CHECK(f != nullptr, "plan: --calibration `", path, "` has an unknown field \"", key, "\"; the fields are ",
             names);
    ST_CHECK(value.is_number() && value.get<double>() > 0 && std::isfinite(value.get<double>()),
             "plan: --calibration `", path, "`: \"", key, "\" must be a positive number, found ", value.dump());
    *f->target = value.get<double>() * f->unit;
  }
  r.attention_seq_len = std::llround(seq_len);
  ST_CHECK(r.attention_seq_len >= 1, "plan: --calibration `", path, "`: \"attention_seq_len\" must be at least 1");
  r.source = fmt::format("--calibration {} over the defaults of the {}", path, defaults.gpu);
  return r;
}

namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  ST_CHECK(f.good(), "plan: cannot read --calibration `", path,
           "`; give a JSON file of rates (see `shardtrain help plan`)");
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

StepRates read_calibration(const std::string& path, const StepRates& defaults) {
  return parse_calibration(read_text(path), path, defaults);
}

std::string calibration_from_profile(const std::vector<profile::OpTotal>& ops, const std::string& gpu, int64_t seq_len,
                                     bool fp8_linears) {
  // the summed cost and time of the rows named, where they ran
  auto rows = [&](std::initializer_list<const char*> names) {
    profile::OpTotal sum;
    for (const profile::OpTotal& op : ops)
      for (const char* n : names)
        if (op.name == n && op.seconds > 0) {
          sum.calls += op.calls;
          sum.seconds += op.seconds;
          sum.cost.flops += op.cost.flops;
          sum.cost.bytes += op.cost.bytes;
        }
    return sum;
  };
  nlohmann::ordered_json j;
  if (!gpu.empty()) j["gpu"] = gpu;
  // rates to three significant digits (a GPU's 708 TFLOP/s, a CPU's 0.00412)
  auto put = [&](const char* field, const profile::OpTotal& t, bool flops) {
    const double amount = flops ? t.cost.flops * 1e-12 : t.cost.bytes * 1e-9;
    if (t.calls == 0 || amount <= 0) return;
    j[field] = std::stod(fmt::format("{:.3g}", amount / t.seconds));
  };
  if (!fp8_linears) put("matmul_bf16_tflops", rows({"linear_backward"}), true);
  put("matmul_fp8_tflops", rows({"fp8_product"}), true);
  const size_t before = j.size();
  put("attention_forward_tflops", rows({"attention_forward"}), true);
  put("attention_backward_tflops", rows({"attention_backward"}), true);
  put("attention_forward_fp8_tflops", rows({"attention_forward_fp8"}), true);
  put("attention_backward_fp8_tflops", rows({"attention_backward_fp8"}), true);
  if (j.size() > before) j["attention_seq_len"] = seq_len;
  put("memory_gbps",
      rows({"swiglu_forward", "swiglu_backward", "rmsnorm_forward", "rmsnorm_backward", "adamw_step",
            "adamw_step_multi"}),
      false);
  put("fp8_quantize_gbps", rows({"fp8_quantize"}), false);
  ST_CHECK(j.size() > (gpu.empty() ? 0u : 1u), "bench --calibration: the profile holds none of the ops a calibration "
           "is made from (linear_backward, attention_forward, ...); was the run profiled (SHARDTRAIN_PROFILE=1)?");
  return j.dump(1) + "\n";
}

std::string calibration_gpu(const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(read_text(path), nullptr, false);
  if (!j.is_object() || !j.contains("gpu") || !j["gpu"].is_string()) return "";  // parse_calibration says what is wrong
  return j["gpu"].get<std::string>();
}

namespace {

// One unit of the step's pipeline: its compute in a pass, the link time of the gather it
// waits for, of the reduction it issues after its compute, and when its weights are ready
// on the host (the host AdamW, parallel.offload).
struct Pass {
  double compute = 0;
  double gather = 0;      // before the unit's compute
  double reduce = 0;      // after it (backward)
  double host_ready = 0;  // the unit's update done (0: nothing to wait for)
};

// A pass over units in order, as the engine issues it: a unit's gather starts when the unit
// before it starts computing (one unit prefetched) and its weights are updated, its compute
// when the gather has landed and the compute before it is done, and its reduction after its
// compute; the gathers and reductions share the unit's links in the order they are issued.
// So compute and communication overlap, but for the first gather and the last reduction.
double pipelined(const std::vector<Pass>& units) {
  double link_free = 0, compute_end = 0, gather_end = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    if (i == 0) {
      gather_end = std::max(link_free, units[0].host_ready) + units[0].gather;
      link_free = gather_end;
    }
    const double start = std::max(compute_end, gather_end);
    if (i + 1 < units.size()) {  // the next unit's gather, issued as this one starts
      gather_end = std::max({link_free, start, units[i + 1].host_ready}) + units[i + 1].gather;
      link_free = gather_end;
    }
    compute_end = start + units[i].compute;
    if (units[i].reduce > 0) link_free = std::max(link_free, compute_end) + units[i].reduce;
  }
  return std::max(compute_end, link_free);
}

}  // namespace

StepTime model_step_time(const PlanInput& in, const StepRates& rates, const MachineSpec& machine) {
  ST_CHECK(in.gpu, "the step-time model plans GPU runs only");
  ST_CHECK(machine.gpus_per_node >= 1, "plan: --gpus-per-node must be at least 1, found ", machine.gpus_per_node);
  const model::LlamaConfig& c = in.model;
  const int tp = in.tensor_parallel;
  ST_CHECK(tp >= 1 && in.world_size % tp == 0, "`parallel.tensor_parallel` (", tp, ") must divide the ", in.world_size,
           " ranks");
  const model::Mesh mesh = in.mesh();
  const model::ModelLayout layout = model::ModelLayout::llama(c, mesh, 0);
  const MemoryPlan memory = plan_memory(in);
  using model::ActivationCheckpointing;

  const double D = static_cast<double>(c.dim), Q = static_cast<double>(c.q_dim()), KV = static_cast<double>(c.kv_dim());
  const double F = static_cast<double>(c.ffn_dim), V = static_cast<double>(c.vocab_size);
  const double T = static_cast<double>(in.seq_len);
  // context parallelism: a rank holds 1/cp of each sequence's tokens, and its queries attend to
  // keys over the whole sequence (head-tail chunks: every rank 1/cp of the causal work)
  const int cp = std::max(1, in.context_parallel);
  const double tokens = static_cast<double>(in.micro_batch) * T / cp;  // a rank's (a tensor-parallel group's) tokens
  const double w = 1.0 / tp;                                      // a rank's share of a block's width
  const double micro = static_cast<double>(in.grad_accum_steps);
  const bool fp8 = in.fp8 && rates.matmul_fp8 > 0;
  const double mm_block = fp8 ? rates.matmul_fp8 : rates.matmul_bf16;
  const bool fp8_head = fp8 && in.fp8_head;
  const double mm_head = fp8_head ? rates.matmul_fp8 : rates.matmul_bf16;
  const bool fp8_attention = in.fp8_attention && rates.attention_forward_fp8 > 0;
  const double att_fwd_rate = fp8_attention ? rates.attention_forward_fp8 : rates.attention_forward_bf16;
  const double att_bwd_rate = fp8_attention ? rates.attention_backward_fp8 : rates.attention_backward_bf16;
  const double cal_t = static_cast<double>(rates.attention_seq_len);
  const ActivationCheckpointing ac = in.checkpointing;
  const bool full = ac == ActivationCheckpointing::kFull;
  const bool mlp_again = model::mlp_recomputed(ac);  // selective and full recompute gate|up and SwiGLU
  const bool norms_again = ac != ActivationCheckpointing::kNone;

  // FLOPs per token of each product (a rank's share), forward
  const double qkv = 2 * D * (Q + 2 * KV) * w, o = 2 * Q * D * w, gate_up = 2 * D * 2 * F * w, down = 2 * F * D * w;
  const double block_fwd = qkv + o + gate_up + down;
  const double block_recompute = full ? qkv + o + gate_up : mlp_again ? gate_up : 0;  // full: all but down
  // streaming bytes per token of a block (bf16): the two norms (read x, write the output:
  // 4D each; backward 8D each with the residual's gradient), RoPE on q and k (read, write),
  // SwiGLU (read gate and up, write h; backward read gate, up, dh, write their gradients)
  const double norms_fwd = 8 * D * w, norms_bwd = 16 * D * w;
  const double rope = 4 * (Q + KV) * w;
  const double swiglu_fwd = 6 * F * w, swiglu_bwd = 10 * F * w;
  const double mem_fwd = norms_fwd + rope + swiglu_fwd, mem_bwd = norms_bwd + rope + swiglu_bwd;
  const double mem_recompute = full ? mem_fwd : (norms_again ? norms_fwd : 0) + (norms_again ? swiglu_fwd : 0);
  // FP8 (tensorwise): each product's operands quantised, ~4 bytes an element (read bf16, write
  // the e4m3 rows and columns): the forward's inputs (xn1, the attention output, xn2, h) and the
  // backward's output gradients (q|k|v's, o's, gate|up's, down's); the block's weights each pass.
  const double quant_fwd = fp8 ? 4 * (2 * D + Q + F) * w : 0;
  const double quant_recompute = fp8 ? (full ? quant_fwd - 4 * F * w : mlp_again ? 4 * D * w : 0) : 0;
  const double quant_bwd = fp8 ? 4 * (Q + 2 * KV + 2 * D + 2 * F) * w : 0;

  int64_t block_numel = 0, head_numel = 0, embed_numel = 0;
  for (const model::UnitLayout& u : layout.units()) {
    if (u.kind == model::UnitKind::kBlock) block_numel = std::max(block_numel, u.numel);
    if (u.kind == model::UnitKind::kHead) head_numel = u.numel;
    if (u.kind == model::UnitKind::kEmbedding) embed_numel = u.numel;
  }
  const double quant_weights = fp8 ? 4 * static_cast<double>(block_numel) : 0;  // per pass over a block

  StepTime s;
  const int64_t data_parallel = in.world_size / (tp * cp);  // the groups that draw different sequences
  s.tokens_per_step = in.micro_batch * in.seq_len * in.grad_accum_steps * data_parallel;
  // the ring (context parallelism): cp - 1 exchanges of a rank's bf16 keys and values each
  // forward (again in a full recompute), and in the backward those and the travelling f32
  // dk and dv; on NVLink within a node, beside the attention of the block in hand
  const double ring_bytes = 2 * KV * w * tokens * 2;  // k and v of a rank's tokens, bf16
  const double ring_link = cp > 1 && cp <= machine.gpus_per_node ? machine.nvlink_bytes
                                                                 : std::min(machine.nvlink_bytes, machine.inter_node_bytes);
  const double ring_fwd_s = (cp - 1) * ring_bytes / ring_link;
  const double ring_bwd_s = (cp - 1) * 3 * ring_bytes / ring_link;  // k, v (bf16) and dk, dv (f32)

  // ---- compute, per block and micro-batch
  std::vector<double> block_fwd_s(c.n_layers), block_bwd_s(c.n_layers);
  double recompute = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const double keys = model::sliding_keys_per_token(c.window_of(l), in.seq_len);  // T, or T x the window's share
    const double att_fwd_flops = 2 * Q * w * keys * tokens;  // 4 Q per (query, key) pair, half the pairs causal
    const double att_bwd_flops = 2.5 * att_fwd_flops;        // five products against two
    // the kernels' rate at the length of the blocks they see: the ring's are a rank's tokens
    const double kernel_keys = keys / cp;
    const double fwd_rate =
        att_fwd_rate * length_factor(kernel_keys, kAttentionForwardT0) / length_factor(cal_t, kAttentionForwardT0);
    const double bwd_rate =
        att_bwd_rate * length_factor(kernel_keys, kAttentionBackwardT0) / length_factor(cal_t, kAttentionBackwardT0);
    const double att_fwd = std::max(att_fwd_flops / fwd_rate, ring_fwd_s);
    const double att_bwd = std::max(att_bwd_flops / bwd_rate, ring_bwd_s);
    const double mm_f = tokens * block_fwd / mm_block, mm_r = tokens * block_recompute / mm_block;
    const double mm_b = 2 * mm_f;
    const double mem_f = tokens * mem_fwd / rates.memory_bytes, mem_r = tokens * mem_recompute / rates.memory_bytes;
    const double mem_b = tokens * mem_bwd / rates.memory_bytes;
    double q_f = 0, q_r = 0, q_b = 0;
    if (fp8) {
      q_f = (tokens * quant_fwd + quant_weights) / rates.fp8_quantize_bytes;
      q_r = block_recompute > 0 ? (tokens * quant_recompute + quant_weights) / rates.fp8_quantize_bytes : 0;
      q_b = (tokens * quant_bwd + quant_weights) / rates.fp8_quantize_bytes;
    }
    const double att_r = full ? att_fwd : 0;
    block_fwd_s[l] = mm_f + att_fwd + mem_f + q_f;
    block_bwd_s[l] = mm_r + att_r + mem_r + q_r + mm_b + att_bwd + mem_b + q_b;
    recompute += mm_r + att_r + mem_r + q_r;
    (fp8 ? s.matmul_fp8_s : s.matmul_bf16_s) += micro * (mm_f + mm_r + mm_b);
    s.attention_s += micro * (att_fwd + att_r + att_bwd);
    s.memory_s += micro * (mem_f + mem_r + mem_b);
    s.fp8_quantize_s += micro * (q_f + q_r + q_b);
  }
  // the head (column-parallel under tensor parallelism) and the loss: 6 x D x V FLOPs a token,
  // and three passes over the bf16 logits (softmax's statistics, the gradient written in place)
  const double head_mm = 6 * D * V * w * tokens / mm_head;
  const double head_mem = 6 * V * w * tokens / rates.memory_bytes;
  const double head_quant =
      fp8_head ? (4 * (2 * V + D) * w * tokens + 3 * 4 * static_cast<double>(head_numel)) / rates.fp8_quantize_bytes
               : 0;
  (fp8_head ? s.matmul_fp8_s : s.matmul_bf16_s) += micro * head_mm;
  s.memory_s += micro * head_mem;
  s.fp8_quantize_s += micro * head_quant;
  const double head_s = head_mm + head_mem + head_quant;
  s.recompute_s = micro * recompute;

  // ---- communication
  const int shard_ranks = mesh.shard_groups();  // ranks a unit is sharded over (per tensor-parallel rank)
  const int replicas = in.replicate;
  const double n = shard_ranks;
  // a shard group spans shard_ranks x tp consecutive ranks. Within a node a ring runs on
  // NVLink; across nodes NCCL runs one ring per network card, each crossing a node's boundary
  // once, so a GPU's share of a collective moves at the node's network bandwidth (or NVLink's,
  // if lower): the ring cost (n-1)/n x bytes over min(NVLink, the node's network).
  auto link = [&](int64_t span) {
    return span <= machine.gpus_per_node ? machine.nvlink_bytes
                                         : std::min(machine.nvlink_bytes, machine.inter_node_bytes);
  };
  const double shard_link = link(static_cast<int64_t>(shard_ranks) * tp);
  const double replica_link = link(in.world_size);
  const double reduce_bytes = in.reduce_bf16 ? 2 : 4;
  const bool params_gathered = shard_ranks > 1;
  auto gather_s = [&](double numel) { return params_gathered ? 2 * numel * w * (n - 1) / n / shard_link : 0.0; };
  auto reduce_s = [&](double numel) {
    return shard_ranks > 1 ? reduce_bytes * numel * w * (n - 1) / n / shard_link : 0.0;
  };
  // the replicas' all-reduce of each shard, at the last micro-batch (every one when the
  // gradient shards are on the host)
  auto replica_s = [&](double numel) {
    return replicas > 1 ? 4 * numel * w / n * 2 * (replicas - 1) / replicas / replica_link : 0.0;
  };
  const double bn = static_cast<double>(block_numel), hn = static_cast<double>(head_numel);
  const double en = static_cast<double>(embed_numel);
  const bool collectives = shard_ranks > 1 || replicas > 1;
  const double slow = collectives ? 1 + kContention : 1;

  // tensor parallelism: per block and pass, the norm outputs gathered before q|k|v and gate|up
  // and the o and down outputs reduce-scattered into the rows (bf16, (tp-1)/tp of the
  // micro-batch's rows each); the backward mirrors them, recomputation repeats its share
  double tp_fwd = 0, tp_bwd = 0;
  if (tp > 1) {
    const double one = 2 * tokens * D * (tp - 1.0) / tp / link(tp);
    tp_fwd = 4 * one;
    tp_bwd = (4 + (full ? 4 : mlp_again ? 2 : 0)) * one;
  }
  const double tp_block = tp_fwd + tp_bwd;

  // ---- offload: the bus and the host
  const bool offload = in.offload;
  const double shard_numel = static_cast<double>(memory.shard_elements);
  // what comes up for a gather: the bf16 copies where the host keeps them, else the f32 masters
  const double up_bytes = in.offload_grads || in.compute_shards ? 2 : 4;
  auto pcie_up = [&](double numel) { return offload ? up_bytes * numel * w / n / machine.pcie_bytes : 0.0; };
  // a unit's reduced gradient shard goes down (with the gradient shards on the host)
  auto pcie_down = [&](double numel) {
    return offload && in.offload_grads ? 4 * numel * w / n / machine.pcie_bytes : 0.0;
  };
  const double act_block_s = memory.offloaded_blocks > 0
                                 ? static_cast<double>(memory.host_activations) /
                                       static_cast<double>(memory.offloaded_blocks) / machine.pcie_bytes
                                 : 0;
  auto act_s = [&](int64_t l) { return l < memory.offloaded_blocks ? act_block_s : 0.0; };

  // ---- one micro-batch's forward and backward as pipelines over the units; a unit's link
  // time is the slower of its gather (NVLink or network) and its copies on the bus
  const bool regather = in.reshard_after_forward || offload;
  std::vector<Pass> fwd, bwd;
  fwd.push_back({0, std::max(gather_s(en), pcie_up(en)), 0});
  for (int64_t l = 0; l < c.n_layers; ++l)
    fwd.push_back({block_fwd_s[l] * slow + tp_fwd, std::max(gather_s(bn), pcie_up(bn) + act_s(l)), 0});
  fwd.push_back({head_s * slow, std::max(gather_s(hn), pcie_up(hn)), 0});
  // backward: the head's gradient (its compute is the loss's, above), the blocks from the
  // last, then the embedding's
  bwd.push_back({0, 0, std::max(reduce_s(hn), pcie_down(hn))});
  for (int64_t l = c.n_layers - 1; l >= 0; --l)
    bwd.push_back({block_bwd_s[l] * slow + tp_bwd, regather ? std::max(gather_s(bn), pcie_up(bn) + act_s(l)) : act_s(l),
                   std::max(reduce_s(bn), pcie_down(bn))});
  bwd.push_back({0, 0, std::max(reduce_s(en), pcie_down(en))});
  const double fwd_s = pipelined(fwd), bwd_s = pipelined(bwd);
  // the host AdamW over this rank's shards, the node's ranks sharing its memory bandwidth,
  // unit by unit beside the next step's forward: a unit's gather waits for its own update
  const double node_ranks = std::min(in.world_size, machine.gpus_per_node);
  const double host_per_element = offload ? kHostAdamBytes * node_ranks / machine.host_memory_bytes : 0;
  s.host_update_s = host_per_element * static_cast<double>(memory.shard_elements);
  double first_fwd_s = fwd_s;
  if (offload) {
    std::vector<Pass> waiting = fwd;
    double done = 0;
    const double unit_numel[] = {en, bn, hn};
    for (size_t i = 0; i < waiting.size(); ++i) {
      const double numel = unit_numel[i == 0 ? 0 : i + 1 == waiting.size() ? 2 : 1];
      done += host_per_element * numel * w / n;
      waiting[i].host_ready = done;
    }
    first_fwd_s = pipelined(waiting);
  }

  double pure_compute = head_s;
  for (int64_t l = 0; l < c.n_layers; ++l) pure_compute += block_fwd_s[l] + block_bwd_s[l];
  const double layers = static_cast<double>(c.n_layers);
  s.contention_s = collectives ? micro * pure_compute * kContention : 0;
  s.tensor_parallel_s = micro * tp_block * layers;
  const double hidden = pure_compute * slow + tp_block * layers;  // a micro-batch without its links
  const double micro_batch_s = fwd_s + bwd_s;

  // the replicas' all-reduce after the last micro-batch's backward (beside it, but for the
  // last unit's) and the optimizer
  const double replica_total = replica_s(bn) * layers + replica_s(hn) + replica_s(en);
  const double replica_exposed = replicas > 1 ? replica_s(en) + std::max(0.0, replica_total - bwd_s) : 0;
  s.optimizer_s = offload ? 0 : kGpuOptimizerBytes * shard_numel / rates.memory_bytes;

  s.step_s = first_fwd_s + bwd_s + (micro - 1) * micro_batch_s + replica_exposed + s.optimizer_s;
  s.compute_s = s.matmul_bf16_s + s.matmul_fp8_s + s.attention_s + s.memory_s + s.fp8_quantize_s + s.contention_s;

  // the links' time, and what of it the compute does not hide, split between the collectives
  // and the bus by their shares
  const double collective_links = gather_s(en) + gather_s(hn) + layers * gather_s(bn) * (regather ? 2 : 1) +
                                  reduce_s(hn) + reduce_s(en) + layers * reduce_s(bn);
  double bus = pcie_up(en) + pcie_up(hn) + layers * pcie_up(bn) * (regather ? 2 : 1) + pcie_down(hn) + pcie_down(en) +
               layers * pcie_down(bn);
  for (int64_t l = 0; l < c.n_layers; ++l) bus += 2 * act_s(l);
  s.comm_total_s = micro * collective_links + replica_total;
  s.pcie_s = micro * bus;
  const double exposed_links = std::max(0.0, micro_batch_s - hidden);
  const double share = collective_links + bus > 0 ? collective_links / (collective_links + bus) : 1;
  s.comm_exposed_s = micro * exposed_links * share + replica_exposed;
  s.offload_exposed_s = micro * exposed_links * (1 - share) + (first_fwd_s - fwd_s);
  s.tokens_per_second_per_gpu = static_cast<double>(s.tokens_per_step) / s.step_s / in.world_size;
  s.mfu = c.flops_per_token(in.seq_len) * s.tokens_per_second_per_gpu / rates.peak_bf16_flops;
  return s;
}

std::string describe_step_time(const PlanInput& in, const StepRates& rates, const MachineSpec& machine,
                               const std::string& gpu_note) {
  const StepTime t = model_step_time(in, rates, machine);
  const int64_t data_parallel = in.world_size / (in.tensor_parallel * std::max(1, in.context_parallel));
  auto row = [](const std::string& what, const std::string& value) {
    return fmt::format("  {:<20} {}\n", what, value);
  };
  auto ms = [](double s) { return fmt::format("{:.1f} ms", 1e3 * s); };
  auto pct = [&](double s) { return fmt::format("{:.0f} %", 100 * s / t.step_s); };
  std::string s = "time (model: each op family at its measured rate, communication and offload overlapped as the "
                  "engine does; `--mfu X` gives the FLOPs / (ranks x peak x MFU) estimate instead):\n";
  s +=
      row("GPU", fmt::format("{}, {} GPU{}, {} per node{}; {}", rates.gpu, in.world_size, in.world_size == 1 ? "" : "s",
                             machine.gpus_per_node, gpu_note.empty() ? "" : " (" + gpu_note + ")", rates.source));
  s += row("tokens per step",
           fmt::format("{} ({} x {} tokens x {} micro-batch{} x {} data-parallel rank{})",
                       fmt::group_digits(t.tokens_per_step), in.micro_batch, in.seq_len, in.grad_accum_steps,
                       in.grad_accum_steps == 1 ? "" : "es", data_parallel, data_parallel == 1 ? "" : "s"));
  s += row("step",
           fmt::format("{} per step, {} tokens/s per GPU, MFU {:.1f} % of {:.0f} TFLOP/s dense bf16",
                       format_job_duration(t.step_s), fmt::group_digits(std::llround(t.tokens_per_second_per_gpu)),
                       100 * t.mfu, rates.peak_bf16_flops / 1e12));
  s += row("job",
           fmt::format("{} for {} steps (the steps alone: no evaluation, saves, loading or start-up)",
                       format_job_duration(static_cast<double>(in.steps) * t.step_s), fmt::group_digits(in.steps)));
  s += "  per step (one rank):\n";
  if (t.matmul_bf16_s > 0)
    s += row("  matmul bf16", fmt::format("{} ({}) at {:.0f} TFLOP/s", ms(t.matmul_bf16_s), pct(t.matmul_bf16_s),
                                          rates.matmul_bf16 / 1e12));
  if (t.matmul_fp8_s > 0)
    s += row("  matmul FP8", fmt::format("{} ({}) at {:.0f} TFLOP/s", ms(t.matmul_fp8_s), pct(t.matmul_fp8_s),
                                         rates.matmul_fp8 / 1e12));
  // the attention kernels' rates at this sequence length (a full layer's)
  const bool fp8_att = in.fp8_attention && rates.attention_forward_fp8 > 0;
  const double at = static_cast<double>(in.seq_len), cal = static_cast<double>(rates.attention_seq_len);
  const double att_fwd = (fp8_att ? rates.attention_forward_fp8 : rates.attention_forward_bf16) *
                         length_factor(at, kAttentionForwardT0) / length_factor(cal, kAttentionForwardT0);
  const double att_bwd = (fp8_att ? rates.attention_backward_fp8 : rates.attention_backward_bf16) *
                         length_factor(at, kAttentionBackwardT0) / length_factor(cal, kAttentionBackwardT0);
  s += row("  attention", fmt::format("{} ({}) at {:.0f} / {:.0f} TFLOP/s forward / backward{}", ms(t.attention_s),
                                      pct(t.attention_s), att_fwd / 1e12, att_bwd / 1e12, fp8_att ? " (FP8)" : ""));
  s += row("  memory-bound", fmt::format("{} ({}) at {:.0f} GB/s: norms, RoPE, SwiGLU, the loss's passes",
                                         ms(t.memory_s), pct(t.memory_s), rates.memory_bytes / 1e9));
  if (t.fp8_quantize_s > 0)
    s += row("  FP8 quantisation", fmt::format("{} ({}) at {:.0f} GB/s", ms(t.fp8_quantize_s), pct(t.fp8_quantize_s),
                                               rates.fp8_quantize_bytes / 1e9));
  if (t.recompute_s > 0)
    s += row("  of which recompute", fmt::format("{} (activation checkpointing)", ms(t.recompute_s)));
  if (t.contention_s > 0)
    s += row("  beside collectives", fmt::format("{} ({}): compute slowed by the collectives' kernels",
                                                 ms(t.contention_s), pct(t.contention_s)));
  if (t.optimizer_s > 0)
    s += row("  optimizer",
             fmt::format("{} ({}): AdamW and the gradient norm on the GPU", ms(t.optimizer_s), pct(t.optimizer_s)));
  if (t.comm_total_s > 0)
    s += row("  communication",
             fmt::format("{} exposed ({}) of {} on the links{}", ms(t.comm_exposed_s), pct(t.comm_exposed_s),
                         ms(t.comm_total_s),
                         machine.gpus_per_node < in.world_size
                             ? fmt::format(" (NVLink {:.0f} GB/s, network {:.0f} Gb/s per node)",
                                           machine.nvlink_bytes / 1e9, machine.inter_node_bytes * 8 / 1e9)
                             : fmt::format(" (NVLink {:.0f} GB/s)", machine.nvlink_bytes / 1e9)));
  if (t.tensor_parallel_s > 0)
    s += row("  tensor parallel", fmt::format("{} ({}): the group's exchanges between a block's products",
                                              ms(t.tensor_parallel_s), pct(t.tensor_parallel_s)));
  if (in.offload || t.pcie_s > 0)
    s += row("  offload",
             fmt::format("{} exposed ({}): host AdamW {} at {:.0f} GB/s per node, PCIe copies {} at {:.0f} GB/s",
                         ms(t.offload_exposed_s), pct(t.offload_exposed_s), ms(t.host_update_s),
                         machine.host_memory_bytes / 1e9, ms(t.pcie_s), machine.pcie_bytes / 1e9));
  if (in.fp8 && rates.matmul_fp8 <= 0)
    s += fmt::format("  training.fp8 needs FP8 tensor cores (H100, H200), which the {} lacks: planned at its bf16 "
                     "rate\n",
                     rates.gpu);
  if (in.fp8_attention && rates.attention_forward_fp8 <= 0)
    s += "  training.fp8_attention needs FP8 tensor cores: attention planned in bf16\n";
  return s;
}

}  // namespace shardtrain::train
