// A job's set-up before its first step: the job a bench runs, the device and dtypes, the
// tokenizer and model shape, the mesh of ranks, the host threads, and the options of the
// sharded store and AdamW, each read from the job's config. Trainer's constructor puts them
// together (train/trainer.h); its memory-plan choices live in trainer_choices.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/device.h"
#include "core/dtype.h"
#include "data/tokenizer.h"
#include "dist/communicator.h"
#include "fsdp/sharded_store.h"
#include "fsdp/tensor_parallel.h"
#include "io/hf_folder.h"
#include "model/config.h"
#include "optim/adamw.h"
#include "train/config.h"
#include "train/export.h"
#include "train/generate.h"

namespace shardtrain::train {

// What `shardtrain bench` changes in a job: no corpus (random tokens, data.source =
// builtin:random), no weights read (model.hf gives the shape, the values are random), no
// evaluation, checkpoint, resume, export, sample or metrics files, and the first
// warmup_steps steps (plans, caches, a graph's capture) left out of the figures.
struct BenchMode {
  int64_t warmup_steps = 3;
};

// The job `shardtrain bench` runs instead of `config` (BenchMode).
JobConfig bench_job(JobConfig config, const BenchMode& bench);

// Where a launch's time goes, logged once it is ready: a large model's page-locked memory
// and weights take minutes, which a user should see named rather than wonder about.
// Phases under 0.05 s go unnamed, and a launch under a second is only timed.
class LaunchPhases {
 public:
  void done(const char* phase);
  std::string summary() const;

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_ = start_;
  std::string text_;
};

// This rank's index on its machine, as the launcher says (LOCAL_RANK, OpenMPI's or Slurm's); 0 unset.
int local_rank();
// training.device: "cpu", "cuda" (a GPU must be visible) or "auto" (a GPU when there is one,
// the local rank's modulo the visible GPUs, which is then initialised).
Device resolve_device(const std::string& wanted);
// model.dtype: the compute dtype on `device` ("auto": f32 on the CPU, bf16 on a GPU).
DType resolve_dtype(const std::string& wanted, Device device);
// Refuses packed documents (data.document_mask on) beside soft-capped attention scores (Gemma 2)
// in bf16 or f16 on a GPU, whose cuDNN attention takes documents only without a cap: at
// launch, naming the keys that help.
void check_documents_with_capped_scores(const JobConfig& config, bool document_mask, Device device, DType dtype,
                                        const model::LlamaConfig& model);

// The ranks as data-parallel x tensor-parallel, in replicas (parallel.tensor_parallel,
// parallel.replicate), checked against the world's size.
std::unique_ptr<fsdp::DeviceMesh> make_mesh(const JobConfig& config, dist::Communicator* world);

// Host threads (data, the host AdamW of parallel.offload, CPU kernels): training.threads, or
// on GPUs this machine's CPUs shared among its ranks. torchrun sets OMP_NUM_THREADS = 1 for
// each rank, which would leave a 405B's host AdamW one core per GPU; on the CPU, OpenMP's
// default (OMP_NUM_THREADS, else every core) as the MPI launch in docs/multi-gpu.md suggests.
void set_host_threads(const JobConfig& config, const dist::Communicator& world);

// The tokenizer and the model's shape, before the model is built.
struct JobModel {
  std::unique_ptr<data::Tokenizer> tokenizer;
  model::LlamaConfig config;
  // model.hf's weights, opened on the ranks that read them (none for a bench)
  std::unique_ptr<io::HfWeights> hf_weights;
};
// From model.hf's config.json or the model section (a preset, or the shape's keys), with the
// tokenizer data.tokenizer chooses (a bench of model.hf: bytes, unused; its tokens are random).
JobModel open_job_model(const JobConfig& config, bool bench, int rank);

// The sharded store's options: `compute` dtype, and master weights, gradients and reductions in
// `master` (parallel.reduce_dtype may make reductions bf16), with the parallel section's
// resharding, reductions in flight and offload, each checked against `device`.
fsdp::ShardingOptions sharding_options(const JobConfig& config, Device device, DType compute, DType master);

// The optimizer section as AdamW's options; `host_f32`: the update runs on the host (parallel.offload).
optim::AdamWConfig adamw_config(const OptimizerSection& optimizer, bool host_f32);

// The export section as export_hf's options; `tokenizer_source`: the tokenizer files to copy ("" if built in).
ExportOptions export_options_of(const JobConfig& config, const std::string& tokenizer_source);

// The sample section as generate's options; `cuda_graph`: the decode step may run as a CUDA graph.
SampleOptions sample_options_of(const SampleSection& sample, bool cuda_graph);

}  // namespace shardtrain::train
