// The training loop: data, model, optimizer, schedule, evaluation, logs and metrics, and
// a sample at the end. The job's set-up is train/job.h, one optimizer step train/step.h, the
// figures train/report.h. Every run is sharded: one rank, or N ranks under mpirun, each
// holding 1/N of the master weights, gradients and optimizer state (fsdp/).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/gpu_monitor.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "dist/communicator.h"
#include "fsdp/context_parallel.h"
#include "fsdp/sharded_store.h"
#include "fsdp/tensor_parallel.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/job.h"
#include "train/plan.h"
#include "train/report.h"
#include "train/step.h"
#include "train/stop_signals.h"
#include "train/training_data.h"

namespace shardtrain::train {

class Watchdog;  // train/watchdog.h

class Trainer {
 public:
  // Loads the data and builds the model and optimizer; nothing is trained yet. Without a
  // communicator, makes the launch's (dist::make_world: NCCL between GPUs, MPI under
  // mpirun/srun, else a single rank).
  explicit Trainer(const JobConfig& config, dist::Communicator* comm = nullptr,
                   std::optional<BenchMode> bench = std::nullopt);
  ~Trainer();

  TrainSummary run();
  // Called by run() on every rank after each step's forward and backward, before the gradient
  // norm and the update: where a test poisons a gradient or the optimizer's state. Unset in
  // the `shardtrain` program.
  void set_after_backward(std::function<void(int64_t step)> hook) { after_backward_ = std::move(hook); }

  model::Llama& model() { return *model_; }
  fsdp::ShardedUnitStore& store() { return *store_; }
  dist::Communicator& comm() { return *comm_; }
  // The run's ranks as data-parallel x tensor-parallel (parallel.tensor_parallel).
  const fsdp::DeviceMesh& mesh() const { return *mesh_; }
  // The ranks that draw different sequences, and this rank's index among them: the mesh's
  // data-parallel ranks, or with parallel.context_parallel = n those over n (a context group
  // shares its sequences, each rank its chunks of them).
  int data_ranks() const { return cp_groups_.degree > 1 ? cp_groups_.data_ranks() : mesh_->shape().data_parallel; }
  int data_rank() const { return cp_groups_.degree > 1 ? cp_groups_.data_rank() : mesh_->dp_rank(); }
  int context_degree() const { return cp_groups_.degree; }
  const data::Tokenizer& tokenizer() const { return *tokenizer_; }
  Device device() const { return device_; }
  optim::AdamW& optimizer() { return *optimizer_; }
  // The folder of step_* checkpoints (checkpoint.dir, or run.output_dir/checkpoints).
  std::string checkpoint_root() const;
  // Mean held-out loss over eval.batches batches (or fewer if the split is small), and for a
  // mix (data.mix) each source's, by name. With `stop` (checkpoint.on_signal), the ranks agree
  // before each batch whether one of them received a stop signal, and all stop there.
  struct Evaluation {
    double loss = 0;
    std::vector<std::pair<std::string, double>> parts;
    StopAgreement stop;  // the signal the evaluation stopped for (no loss then; 0: none) and its ranks
    int64_t batches_done = 0, batches = 0;
  };
  Evaluation evaluate(const StopSignals* stop = nullptr);
  // The documents' positions in a batch's rows with data.document_mask; undefined without.
  Tensor positions_of(const Tensor& ids_BT) const;

 private:
  // The constructor's phases (trainer.cpp), in order.
  void open_communicator();
  // checkpoint.resume's checkpoint, checked against the model `shape` (nullopt: none, or auto
  // found none); `dir` receives its folder
  std::optional<CheckpointInfo> find_resume_checkpoint(const model::LlamaConfig& shape, std::string* dir) const;
  // the resumed checkpoint has done every step of training.steps: noted (complete_at_step_)
  // and logged; nothing more is built
  bool already_complete(const std::optional<CheckpointInfo>& resume_from, const std::string& dir);
  void open_data(const model::LlamaConfig& shape, int dp_size);
  void resolve_data_options();  // data.document_mask, and an evaluation batch where evaluation is on
  void load_weights(const io::HfWeights* hf_weights);  // or random ones (training.seed)
  void build_model(DType compute);                     // with its tensor parallelism, chunks and FP8
  void log_sharding() const;

  // run()'s pieces (trainer.cpp): what it keeps from step to step, one step, the end.
  struct RunState;
  struct StepResult;
  OptimizerStepOptions optimizer_step_options();  // logs what the run's steps leave out (a graph, ...)
  void log_training_plan(const optim::ScheduleConfig& schedule) const;
  // An evaluation: the log line, the metrics (a mix's sources' losses as eval_loss/<name>), the summary.
  Evaluation report_evaluation(int64_t step, const StopSignals* stop, RunState& run);
  StepResult train_step(int64_t step, RunState& run);
  // After a step's update: its figures, the evaluation and checkpoint due, the stop. True: stop now.
  bool finish_step(int64_t step, StepResult& result, RunState& run);
  TrainSummary finish_run(RunState& run);
  void export_and_sample(TrainSummary& summary);

  std::string tokenizer_source() const;  // the tokenizer.json or its folder an export copies ("" if built in)
  // Creates every folder the run writes (run.output_dir, the checkpoint folder, the metrics
  // file's and TensorBoard's, export.folder) and probes each for writing, on the ranks that
  // write there, so that an unwritable one fails at launch naming its key; then rank 0 removes
  // what interrupted saves and exports left in the checkpoint and export folders (logged).
  // Collective; before any save of this run.
  void prepare_output_folders();
  int64_t loss_chunk_tokens() const;  // training.loss_chunk_tokens, or its automatic value
  int64_t mlp_chunk_tokens() const;   // training.mlp_chunk_tokens, or its automatic value (0: at once)
  // training.fp8 with its gradient format, after checking the device and model_config_'s widths.
  ops::LinearFp8 fp8_choice() const;
  // training.fp8_head: the head's recipe (fp8_'s) and its logits' gradient format: the chosen
  // one, or with auto e5m2 unless blockwise (a row of that gradient spans the vocabulary, from
  // the target's -1 to probabilities far below e4m3's range under one scale); off otherwise.
  ops::LinearFp8 fp8_head_choice() const;
  // training.fp8_attention, checked against the device, the compute dtype and the head dim.
  bool fp8_attention_choice(DType compute) const;
  // training.activation_checkpointing, with "auto" decided by the plan and the GPU's memory.
  model::ActivationCheckpointing checkpointing() const;
  // parallel.compute_shards, with "auto" decided by the plan (at the checkpointing chosen) and
  // the GPU's memory.
  bool compute_shards(model::ActivationCheckpointing checkpointing) const;
  // With training.offload_activations (only then called): the blocks to offload (0: none),
  // training.offload_activations_blocks with 0 (auto) decided by the plan and the GPU's memory.
  int64_t offload_activation_blocks(model::ActivationCheckpointing checkpointing, bool compute_shards) const;
  int64_t gpu_memory_bytes() const;  // the training GPU's memory (0 on the CPU)
  // Once the data is open: training.seq_len = 0 as `seq_len` chose it, training.epochs as
  // steps, schedule.warmup_fraction as warm-up steps, in config_; logs what was chosen.
  void resolve_run_shape(const AutoSeqLen& seq_len);
  PlanInput launch_plan_input() const;  // the memory plan's input for this run, auto choices left open
  PlanInput chosen_plan_input() const;  // the same with the launch's choices made (after they are)

  JobConfig config_;
  std::optional<BenchMode> bench_;
  Device device_;
  model::LlamaConfig model_config_;  // the model's shape, known before the model is built
  ops::LinearFp8 fp8_;               // training.fp8 and training.fp8_gradients, checked against the shape
  // The launch's automatic choices (logged), made once in the constructor, before the shards
  // and any page-locked memory exist.
  model::ActivationCheckpointing checkpointing_ = model::ActivationCheckpointing::kNone;
  bool compute_shards_ = false;
  int64_t offload_blocks_ = 0;       // training.offload_activations: the blocks offloaded (0: none)
  int64_t start_step_ = 1;           // > 1 after resuming
  int64_t complete_at_step_ = -1;    // the resumed checkpoint's step when it finished the run (nothing built then)
  std::string complete_checkpoint_;  // and that checkpoint's directory
  bool log_file_open_ = false;       // this trainer writes the log to the run folder's train.log
  // A finished run's export, written again from its last checkpoint when export.folder is
  // missing or older than that checkpoint (a kill between the last save and the export's end).
  void export_finished_run();
  std::unique_ptr<dist::Communicator> owned_comm_;
  dist::Communicator* comm_;
  std::unique_ptr<fsdp::DeviceMesh> mesh_;
  std::unique_ptr<model::TensorParallel> tensor_parallel_;  // the model's group collectives (tp > 1)
  // parallel.context_parallel: this rank's context group and the ranks of its place in every
  // group (degree 1: groups of one, and every rank draws its own sequences)
  fsdp::ContextGroups cp_groups_;
  std::unique_ptr<model::ContextParallel> context_parallel_;  // the model's ring (degree > 1)
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::unique_ptr<data::TrainingData> data_;
  bool document_mask_ = false;  // data.document_mask resolved: batches carry their documents' positions
  std::unique_ptr<model::ModelLayout> layout_;
  std::unique_ptr<fsdp::ShardedUnitStore> store_;
  std::unique_ptr<model::Llama> model_;
  std::unique_ptr<optim::AdamW> optimizer_;
  std::function<void(int64_t step)> after_backward_;
  // checkpoint.async: the checkpoint whose files a thread is writing; from the step after the
  // save, the ranks ask each other every step whether all are done, and commit when they are
  CheckpointStaging checkpoint_staging_;  // host copies of the shards, kept from save to save
  std::unique_ptr<PendingCheckpoint> pending_checkpoint_;
  std::jthread checkpoint_writer_;
  std::exception_ptr checkpoint_error_;
  std::atomic<bool> checkpoint_written_{false};  // the thread has finished (written or failed)
  int64_t checkpoint_step_ = 0;
  bool all_ranks_wrote_checkpoint();  // collective
  void commit_pending_checkpoint();   // collective: waits for this rank's writing
  // Saves `step`'s checkpoint (an asynchronous one before is committed first): now, or with
  // `async` copied to host memory and written by checkpoint_writer_. The log line, and the
  // save's seconds (-1 when asynchronous).
  struct SavedStep {
    std::string message;
    double seconds = -1;
  };
  SavedStep save_step(int64_t step, bool async);
  // parallel.timeout_s: with several ranks, during run(), a thread that ends the process when a
  // step, an evaluation batch, a checkpoint's save or the export goes without progress past its
  // limit (declared last: it polls the communicators)
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<Watchdog> make_watchdog() const;
  void watch_io(std::string what);  // watchdog_ (if any) on `what`, with bytes written to files as progress too
};

}  // namespace shardtrain::train
