// The training loop: each step (train/step.h) with its evaluation, checkpoint and stop, and
// the run's figures (train/report.h); at the end the export and a sample. The Trainer is
// built in trainer_setup.cpp.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <omp.h>

#include "core/allocator.h"
#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#endif
#include "core/log.h"
#include "core/profile.h"
#include "io/safetensors_writer.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "optim/clip.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/generate.h"
#include "train/launch_defaults.h"
#include "train/nonfinite.h"
#include "train/plan.h"
#include "train/run_folder.h"
#include "train/stop_signals.h"
#include "train/training_data.h"
#include "train/watchdog.h"

namespace shardtrain::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// training.time_limit counts from here: the process's start, as a job's wall-clock limit does
const Clock::time_point g_process_start = Clock::now();

// The last update's NaN and inf, flagged in AdamW's own pass and read once it is done: right
// after a step (parallel.offload: where the step waited for its host update, else at the next
// step, whose forward took every unit from it). A step with several ranks agrees on them in
// the next step's totals, or before a save or the export in a reduction of their own.
class UpdateFindings {
 public:
  UpdateFindings(fsdp::ShardedUnitStore& store, optim::AdamW& optimizer, dist::Communicator& world,
                 const optim::ScheduleConfig& schedule)
      : store_(store), optimizer_(optimizer), world_(world), schedule_(schedule) {}

  void updated(int64_t step) {
    updated_step_ = step;
    unread_ = true;
  }
  void read() {
    if (!unread_) return;
    store_.wait_for_host_update();
    nonfinite_state_ = optimizer_.nonfinite_parameters();
    unread_ = false;
  }
  bool found() const { return !nonfinite_state_.empty(); }
  // `ranks`: how many ranks found NaN or inf (0: none, and nothing happens)
  void stop_if_found(double ranks) const {
    if (ranks > 0)
      throw_nonfinite_update(updated_step_, nonfinite_state_, static_cast<int64_t>(ranks), world_.world_size(),
                             optim::learning_rate(schedule_, updated_step_));
  }
  // before a save or the export: every rank reads and agrees now
  void agree_finite() {
    read();
    Tensor found_here = Tensor::empty({1}, DType::kF64, Device::cpu(), "nonfinite state");
    found_here.data<double>()[0] = found() ? 1.0 : 0.0;
    if (world_.world_size() > 1) world_.all_reduce(found_here, dist::ReduceOp::kSum);
    stop_if_found(found_here.data<double>()[0]);
  }

 private:
  fsdp::ShardedUnitStore& store_;
  optim::AdamW& optimizer_;
  dist::Communicator& world_;
  const optim::ScheduleConfig& schedule_;
  int64_t updated_step_ = 0;  // the step of the last update this run (0: none yet)
  bool unread_ = false;
  std::vector<std::string> nonfinite_state_;  // this rank's findings (optim::AdamW::nonfinite_parameters)
};

}  // namespace

// run() leaves no host update in flight, however it ends; the run folder's log is closed
Trainer::~Trainer() {
  if (log_file_open_) log::set_file("", false);
}

void Trainer::watch_io(std::string what) {
  if (!watchdog_) return;
  watchdog_->watch(std::move(what), config_.parallel.timeout_s,
                   fmt::format("parallel.timeout_s = {:g}", config_.parallel.timeout_s), true);
}

std::unique_ptr<Watchdog> Trainer::make_watchdog() const {
  // every communicator of the mesh, once each, for errors NCCL finds on its own
  const std::initializer_list<const dist::Communicator*> all = {comm_,
                                                                &mesh_->world(),
                                                                &mesh_->tensor_parallel(),
                                                                &mesh_->data_parallel(),
                                                                &mesh_->replica(),
                                                                &mesh_->block_shards(),
                                                                mesh_->across_replicas(),
                                                                cp_groups_.group.get(),
                                                                cp_groups_.across.get()};
  std::vector<const dist::Communicator*> comms;
  for (const dist::Communicator* c : all)
    if (c != nullptr && std::find(comms.begin(), comms.end(), c) == comms.end()) comms.push_back(c);
  return std::make_unique<Watchdog>([comms] {
    for (const dist::Communicator* c : comms)
      if (std::string error = c->async_error(); !error.empty()) return error;
    return std::string();
  });
}

Tensor Trainer::positions_of(const Tensor& ids_BT) const {
  return document_mask_ ? ops::document_positions(ids_BT, tokenizer_->bos_id()) : Tensor();
}

// What run() keeps from step to step. Members are destroyed in reverse: the step (which waits
// for a host update still in flight) before the batches and the report.
struct Trainer::RunState {
  RunState(Trainer& trainer, const RunReport::Setup& report_setup)
      : report(report_setup),
        schedule(schedule_config(trainer.config_)),
        totals(Tensor::zeros({6}, DType::kF64, Device::cpu(), "step totals")),
        nonfinite_skips(trainer.config_.training.nonfinite_skips),
        findings(*trainer.store_, *trainer.optimizer_, *trainer.comm_, schedule),
        time_limit(parse_duration_seconds(trainer.config_.training.time_limit)),
        first_step(report_setup.first_step),
        timed_from(report_setup.timed_from) {}

  RunReport report;
  const optim::ScheduleConfig schedule;
  std::vector<Tensor> ids, targets;  // [micro-batch]: B x T, this rank's rows of the global batch
  // parallel.context_parallel: the rows drawn whole, B x T (ids and targets above then hold
  // this rank's chunks of them, B x T / n)
  Tensor whole_ids, whole_targets;
  // data.document_mask: [micro-batch] each token's position in its document (of the whole
  // rows, and with context parallelism this rank's chunks of them); empty without
  std::vector<Tensor> positions;
  std::unique_ptr<OptimizerStep> step;
  // [0]: counted tokens, then the loss sum; [1..3]: ranks that received SIGTERM, SIGUSR1, SIGINT;
  // [4]: ranks whose clock says training.time_limit leaves no room for another step and a save;
  // [5]: ranks whose last update left NaN or inf in their master weights or AdamW's state
  Tensor totals;
  NonfiniteSkips nonfinite_skips;
  UpdateFindings findings;
  const double time_limit;        // training.time_limit in seconds (0: none)
  double last_save_seconds = -1;  // the last checkpoint's save, for the time limit's margin
  // checkpoint.on_signal: SIGTERM, SIGUSR1 or SIGINT at any rank stops every rank after the
  // same step, which then saves a checkpoint
  std::optional<StopSignals> stop_signals;
  const int64_t first_step;
  // the steps the run's figures cover: all but the first (plans, caches, the graph's capture),
  // or all but a bench's warm-up
  const int64_t timed_from;
  int64_t last_step = 0;
  TrainSummary summary;
};

// One step's outcome, from its update to its figures and what follows it.
struct Trainer::StepResult {
  StepTimes times;
  double loss = 0, lr = 0, grad_norm = 0;
  bool skipped = false;  // training.nonfinite_skips: no update
  bool eval_now = false, checkpoint_now = false, stopping = false;
  StopAgreement stop;  // the signal every rank stops for (0: none)
};

OptimizerStepOptions Trainer::optimizer_step_options() {
  const TrainingSection& training = config_.training;
  OptimizerStepOptions options;
  options.batch_size = training.batch_size;
  options.seq_len = training.seq_len;
  options.micro_batches = training.grad_accum_steps;
  model::StepOptions& model_options = options.model;
  model_options.checkpointing = checkpointing_;
  model_options.deterministic = training.deterministic;
  store_->set_compute_shards(compute_shards_);
  model_options.offload_activations = offload_blocks_ > 0;  // a GPU's (checked at construction)
  model_options.offload_activation_blocks = offload_blocks_;
  model_options.loss_chunk_tokens = loss_chunk_tokens();
  const int64_t tokens = training.batch_size * training.seq_len;
  if (const int64_t piece = model_->mlp_chunk_tokens();
      piece > 0 && piece < tokens && model::mlp_recomputed(model_options.checkpointing))
    log::info(fmt::format("training.mlp_chunk_tokens: each block's MLP runs {} of a micro-batch's {} tokens at a time",
                          piece, tokens));
  // One rank on a GPU: each micro-batch is a CUDA graph replay after the first step. The
  // per-op profile synchronises around every op, which a graph capture forbids: it runs eagerly.
  bool graphed = training.cuda_graph && device_.is_cuda() && comm_->world_size() == 1;
  if (graphed && store_->offloaded()) {
    log::info("parallel.offload: the step runs eagerly, not as a CUDA graph (the host adds and clears gradients)");
    graphed = false;
  }
  if (graphed && document_mask_) {
    log::info("data.document_mask: the step runs eagerly, not as a CUDA graph (the documents differ per batch)");
    graphed = false;
  }
  if (graphed && profile::enabled()) {
    log::info("SHARDTRAIN_PROFILE=1: the step runs eagerly, not as a CUDA graph (training.cuda_graph)");
    graphed = false;
  }
  options.cuda_graph = graphed;
  return options;
}

void Trainer::log_training_plan(const optim::ScheduleConfig& schedule) const {
  const TrainingSection& training = config_.training;
  const int64_t global_sequences = training.batch_size * training.grad_accum_steps * data_ranks();
  std::string decay;  // warmup-stable-decay: where the decay starts
  if (config_.schedule.decay_fraction < 1.0 && schedule.type != optim::ScheduleType::kConstant) {
    int64_t start = training.steps;
    while (start > 0 && optim::learning_rate(schedule, start) < schedule.peak_lr) --start;
    decay = fmt::format(", stable until step {}, then decaying", start);
  }
  log::info(fmt::format("training: {} steps x {} sequences x {} tokens ({} tokens per step), lr {} {} with {} "
                        "warmup steps{}, {} thread{} per rank",
                        training.steps, global_sequences, training.seq_len, global_sequences * training.seq_len,
                        config_.optimizer.lr, config_.schedule.type, config_.schedule.warmup_steps, decay,
                        omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s"));
  if (config_.schedule.warmup_steps > training.steps)
    log::warn_shared(
        fmt::format("schedule.warmup_steps ({}) exceeds training.steps ({}): the learning rate never reaches "
                    "optimizer.lr",
                    config_.schedule.warmup_steps, training.steps));
}

Trainer::Evaluation Trainer::report_evaluation(int64_t step, const StopSignals* stop, RunState& run) {
  Evaluation evaluation = evaluate(stop);
  if (evaluation.stop.signal != 0) return evaluation;
  const double e = evaluation.loss;
  run.summary.evals.emplace_back(step, e);
  nlohmann::json record = {{"step", step}, {"eval_loss", e}};
  std::string parts;
  for (const auto& [name, loss] : evaluation.parts) {
    record["eval_loss/" + name] = loss;
    parts += fmt::format("{}{} {:.4f}", parts.empty() ? "  (" : ", ", name, loss);
  }
  if (!parts.empty()) parts += ")";
  log::info(fmt::format("eval  step {:>5}  held-out loss {:.4f}  perplexity {:.2f}{}", step, e, std::exp(e), parts));
  run.report.write_metrics(record);
  run.summary.last_eval_parts = std::move(evaluation.parts);
  return evaluation;
}

TrainSummary Trainer::run() {
  if (complete_at_step_ >= 0) {  // said when constructed
    TrainSummary done;
    done.already_complete_at = complete_at_step_;
    export_finished_run();
    return done;
  }
  const TrainingSection& training = config_.training;
  const int64_t B = training.batch_size, T = training.seq_len;
  if (!bench_) std::filesystem::create_directories(config_.run.output_dir);  // a bench writes no files
  RunReport::Setup report_setup;
  report_setup.device = device_;
  report_setup.world_size = comm_->world_size();
  report_setup.rank = comm_->rank();
  report_setup.output_dir = config_.run.output_dir;
  report_setup.metrics_file = config_.logging.metrics_file;
  report_setup.tensorboard_dir = config_.logging.tensorboard_dir;
  report_setup.progress = comm_->rank() == 0 ? config_.logging.progress : "off";
  report_setup.gpu_power = config_.logging.gpu_power;
  report_setup.log_interval_steps = config_.logging.interval_steps;
  report_setup.total_steps = training.steps;
  report_setup.first_step = start_step_;
  report_setup.timed_from = start_step_ + (bench_ ? bench_->warmup_steps : 1);
  report_setup.flops_per_token = model_->config().flops_per_token(T);
  report_setup.tokens_per_step = static_cast<double>(B * T * training.grad_accum_steps * data_ranks());
  RunState run(*this, report_setup);  // opens the metrics files
  run.step = std::make_unique<OptimizerStep>(*model_, *store_, *optimizer_, *mesh_, optimizer_step_options());
  run.report.set_offload_wait_shown(run.step->model_options().offload_activations && !run.step->graphed());
  for (int64_t m = 0; m < training.grad_accum_steps; ++m) {
    run.ids.push_back(Tensor::empty({B, T}, DType::kI32, Device::cpu(), "ids"));
    run.targets.push_back(Tensor::empty({B, T}, DType::kI32, Device::cpu(), "targets"));
  }
  if (context_degree() > 1) {
    run.whole_ids = Tensor::empty({B, T}, DType::kI32, Device::cpu(), "ids");
    run.whole_targets = Tensor::empty({B, T}, DType::kI32, Device::cpu(), "targets");
  }
  log_training_plan(run.schedule);
  run.report.open_device();
  // parallel.timeout_s: a step or evaluation batch of several ranks without progress for that long ends the run
  if (comm_->world_size() > 1 && config_.parallel.timeout_s > 0) watchdog_ = make_watchdog();
  struct Unwatch {
    std::unique_ptr<Watchdog>& watchdog;
    ~Unwatch() { watchdog.reset(); }
  } unwatch{watchdog_};
  if (config_.eval.enabled && config_.eval.at_start && !bench_ && training.steps > 0) {
    const profile::Region region("evaluation");
    report_evaluation(start_step_ - 1, nullptr, run);  // the loss the run starts from
  }
  if (config_.checkpoint.on_signal) run.stop_signals.emplace();
  run.last_step = start_step_ - 1;
  run.report.start_clock();
  for (int64_t step = run.first_step; step <= training.steps; ++step) {
    StepResult result = train_step(step, run);
    if (finish_step(step, result, run)) break;
  }
  return finish_run(run);
}

Trainer::StepResult Trainer::train_step(int64_t step, RunState& run) {
  const TrainingSection& training = config_.training;
  const int64_t B = training.batch_size, accum = training.grad_accum_steps;
  StepResult result;
  if (step == run.timed_from && profile::enabled()) profile::reset_totals();  // the per-op table covers the timed steps
  std::optional<profile::Region> step_region(std::in_place, "step", step);    // the step's own work
  if (watchdog_) {
    // the first step of a launch also plans, times GEMM algorithms and fills caches
    const bool first = step == run.first_step;
    const double limit = config_.parallel.timeout_s + (first ? config_.parallel.init_timeout_s : 0.0);
    watchdog_->watch(
        fmt::format("step {}", step), limit,
        first ? fmt::format("parallel.timeout_s + parallel.init_timeout_s = {:g} s for the first step", limit)
              : fmt::format("parallel.timeout_s = {:g}", limit));
  }
  const Clock::time_point t0 = Clock::now();
  // This rank draws sequences data_rank*B .. data_rank*B + B-1 of each micro-batch of the
  // global batch (the ranks of a tensor-parallel group draw the same ones; those of a context
  // group too, and each keeps its chunks of them).
  int64_t counted = 0;
  const int32_t ignore_index = run.step->model_options().ignore_index;
  const int cp = context_degree();
  for (int64_t m = 0; m < accum; ++m) {
    Tensor& ids = cp > 1 ? run.whole_ids : run.ids[m];
    Tensor& targets = cp > 1 ? run.whole_targets : run.targets[m];
    data_->fill_train(ids, targets, step, m, data_rank() * B);
    if (document_mask_) {  // from the whole rows: a document may span the context group's chunks
      if (run.positions.size() < static_cast<size_t>(accum)) run.positions.resize(static_cast<size_t>(accum));
      run.positions[static_cast<size_t>(m)] = cp > 1 ? model::context_shard(positions_of(ids), cp, context_parallel_->rank())
                                                     : positions_of(ids);
    }
    if (cp > 1) {
      run.ids[m] = model::context_shard(ids, cp, context_parallel_->rank());
      run.targets[m] = model::context_shard(targets, cp, context_parallel_->rank());
    }
    const int32_t* t = run.targets[m].data<int32_t>();
    for (int64_t i = 0; i < run.targets[m].numel(); ++i) counted += t[i] != ignore_index;
  }
  double* totals = run.totals.data<double>();
  totals[0] = static_cast<double>(counted);
  // a tensor-parallel group's ranks share the batch (the data-parallel group leaves them out);
  // a context group's ranks count each their own chunks (without tensor parallelism the
  // data-parallel group is every rank)
  mesh_->data_parallel().all_reduce(run.totals, dist::ReduceOp::kSum);
  const double global_counted = totals[0];
  result.times.data_s = seconds_since(t0);
  const Clock::time_point t1 = Clock::now();
  // the gradient of the mean loss over the global batch
  const ForwardBackward passes = run.step->forward_backward(run.ids, run.targets, 1.0 / global_counted, run.positions);
  result.times.forward_s = passes.forward_s;
  result.times.backward_s = passes.backward_s;
  if (after_backward_) after_backward_(step);
  run.findings.read();
  totals[0] = passes.loss_sum;  // of this rank's token rows
  totals[5] = run.findings.found() ? 1.0 : 0.0;
  write_stop_flags(totals + 1, run.stop_signals ? run.stop_signals->received() : 0);
  if (run.time_limit > 0) {
    // this step so far, and the steps before (the first alone before there are more)
    const TimedSteps& timed = run.report.timed();
    const double step_estimate =
        std::max(seconds_since(t0),
                 timed.steps > 0 ? timed.seconds / static_cast<double>(timed.steps) : run.report.train_seconds());
    const double save_estimate = run.last_save_seconds >= 0 ? run.last_save_seconds : step_estimate;
    totals[4] = seconds_since(g_process_start) + step_estimate + save_estimate > run.time_limit ? 1.0 : 0.0;
  }
  comm_->all_reduce(run.totals, dist::ReduceOp::kSum);
  run.findings.stop_if_found(totals[5]);
  result.stop = agreed_stop(totals + 1);  // the signal every rank stops for
  const bool time_up = result.stop.signal == 0 && totals[4] > 0 && step < training.steps;
  result.stopping = result.stop.signal != 0 || time_up;
  result.loss = totals[0] / global_counted;
  result.times.forward_backward_s = seconds_since(t1);
  const Clock::time_point t2 = Clock::now();
  std::optional<profile::Region> optimizer_region(std::in_place, "optimizer");
  result.grad_norm = run.step->gradient_norm();
  result.lr = optim::learning_rate(run.schedule, step);
  const double clip = optim::clip_coefficient(result.grad_norm, training.max_grad_norm);  // applied inside the update
  // the norm and the loss are all-reduced: every rank skips alike (training.nonfinite_skips)
  result.skipped = run.nonfinite_skips.skip(step, result.loss, result.grad_norm);
  result.eval_now =
      !bench_ && !result.stopping && config_.eval.enabled &&
      ((config_.eval.interval_steps > 0 && step % config_.eval.interval_steps == 0) || step == training.steps);
  const int64_t every = config_.checkpoint.interval_steps;
  result.checkpoint_now = (every > 0 && (step % every == 0 || step == training.steps)) || result.stopping;
  // complete within this step where an evaluation or a checkpoint follows
  run.step->update(result.lr, clip, result.skipped, result.eval_now || result.checkpoint_now);
  if (!result.skipped) {
    run.findings.updated(step);
    if (!store_->offloaded() || result.eval_now || result.checkpoint_now) run.findings.read();  // done already
    if (comm_->world_size() == 1) run.findings.stop_if_found(run.findings.found() ? 1.0 : 0.0);
  }
  optimizer_region.reset();
  step_region.reset();
  result.times.optimizer_s = seconds_since(t2);
  result.times.step_s = seconds_since(t0);
  result.times.comm_wait_s = store_->take_comm_wait_seconds();  // GPU: compute stood waiting on transfers
  // GPU, activation offload: compute stood waiting on the activations' copies (eager steps)
  result.times.offload_wait_s = model_->activation_offload() ? model_->activation_offload()->take_wait_seconds() : 0;
  return result;
}

bool Trainer::finish_step(int64_t step, StepResult& result, RunState& run) {
  const StepRecord record = run.report.add_step(step, result.times, result.loss, result.lr, result.grad_norm,
                                                result.skipped, run.nonfinite_skips.total());
  run.summary.steps.push_back(record);
  Progress& progress = run.report.progress();
  if (step == run.first_step && run.step->model_options().offload_activations && model_->activation_offload())
    log::info(fmt::format("training.offload_activations: {} per micro-batch to host memory and back ({} "
                          "page-locked)",
                          format_bytes(model_->activation_offload()->bytes_offloaded()),
                          format_bytes(model_->activation_offload()->host_bytes())));
  if (result.eval_now) {
    const profile::Region region("evaluation");
    progress.clear();
    const Evaluation e = report_evaluation(step, run.stop_signals ? &*run.stop_signals : nullptr, run);
    if (e.stop.signal != 0) {
      result.stop = e.stop;
      result.stopping = result.checkpoint_now = true;
      log::info(fmt::format("evaluation after step {} stopped before batch {} of {} by {}", step, e.batches_done + 1,
                            e.batches, stop_signal_name(result.stop.signal)));
    }
  }
  // a save, and the check of one being written while training goes on, are watched too,
  // with bytes written to files as progress: a rank stuck writing, or gone, would leave the
  // others in the save's collectives
  if (result.checkpoint_now)
    watch_io(fmt::format("the checkpoint of step {}", step));
  else if (pending_checkpoint_)
    watch_io(fmt::format("the check that the checkpoint of step {} is written", checkpoint_step_));
  else if (watchdog_)
    watchdog_->idle();
  if (result.checkpoint_now) {
    const profile::Region region("checkpoint");
    run.findings.agree_finite();  // a save never holds NaN or inf
    const SavedStep saved = save_step(step, config_.checkpoint.async && !result.stopping);
    if (saved.seconds >= 0) run.last_save_seconds = saved.seconds;
    progress.clear();
    log::info(saved.message);
  }
  if (pending_checkpoint_ && step > checkpoint_step_ && all_ranks_wrote_checkpoint()) {
    progress.clear();
    commit_pending_checkpoint();
  }
  run.last_step = step;
  if (result.stopping) {
    progress.clear();
    const int world = comm_->world_size();
    std::string why;
    if (result.stop.signal != 0) {
      run.summary.stopped_by_signal = result.stop.signal;
      why = fmt::format("by {}{} (checkpoint.on_signal)", stop_signal_name(result.stop.signal),
                        world > 1 ? fmt::format(" at {} of the {} ranks", result.stop.ranks, world) : std::string());
    } else {
      run.summary.stopped_by_time_limit = true;
      const double elapsed = seconds_since(g_process_start);
      why = fmt::format("{} into training.time_limit = {}: another step and a save would not fit",
                        elapsed < 100 ? fmt::format("{:.1f} s", elapsed) : format_duration(elapsed),
                        config_.training.time_limit);
    }
    log::info(fmt::format("stopped after step {} of {} {}; resume with --checkpoint.resume=auto", step,
                          config_.training.steps, why));
    return true;
  }
  run.report.update_progress(step, record.loss);
  return false;
}

TrainSummary Trainer::finish_run(RunState& run) {
  TrainSummary& summary = run.summary;
  run.stop_signals.reset();        // signals from here on (the evaluation, export, sample) end the process
  store_->wait_for_host_update();  // the last step's, where nothing after it waited (a bench run)
  summary.skipped_nonfinite = run.nonfinite_skips.total();
  run.findings.agree_finite();  // before the export, the sample and the summary
  run.report.progress().clear();
  if (pending_checkpoint_) {
    watch_io(fmt::format("the commit of the checkpoint of step {}", checkpoint_step_));
    commit_pending_checkpoint();
  }
  if (watchdog_) watchdog_->idle();
  const int64_t steps_done = run.last_step - run.first_step + 1;
  const int64_t timed_steps = run.report.timed().steps;
  const std::string timed_part =
      timed_steps == 0 ? std::string()
      : bench_ ? fmt::format(" (after {} warm-up step{})", bench_->warmup_steps, bench_->warmup_steps == 1 ? "" : "s")
               : std::string(" (after the first step)");
  TimedSteps& timed = summary.timed;
  timed.fp8 = std::string(ops::fp8_recipe_name(fp8_.recipe));
  timed.fp8_head = model_->fp8_head();
#ifdef SHARDTRAIN_WITH_CUDA
  if (device_.is_cuda() && fp8_.on()) timed.fp8_peak_flops = cuda::dense_fp8_peak_flops(device_.index);
#endif
  timed.device_total_bytes = gpu_memory_bytes();
  if (device_.is_cuda()) {  // the plan at the launch's choices
    timed.planned_peak_bytes = plan_memory(chosen_plan_input()).peak;
  }
  run.report.finish(summary, steps_done, timed_part, bench_.has_value());
  if (config_.training.steps == 0 && !bench_ && config_.eval.enabled) report_evaluation(0, nullptr, run);
  if (summary.stopped_by_signal != 0 || summary.stopped_by_time_limit)
    return std::move(summary);  // saved; the export and sample wait for the end
  export_and_sample(summary);
  return std::move(summary);
}

void Trainer::export_and_sample(TrainSummary& summary) {
  if (!config_.export_.folder.empty()) {
    const ExportOptions export_options = export_options_of(config_, tokenizer_source());
    watch_io(fmt::format("the export to {}", export_options.folder));
    export_hf(*store_, model_->config(), *comm_, export_options, &mesh_->tensor_parallel());
    log::info(fmt::format("exported a Hugging Face folder to {} ({})", export_options.folder, config_.export_.dtype));
  }
  watchdog_.reset();  // the sample is not timed
  if (config_.sample.tokens > 0) {
    // a graph of the decode step would capture the group's collectives: not with tensor parallelism
    const SampleOptions sample_options = sample_options_of(config_.sample, mesh_->shape().tensor_parallel == 1);
    // the sample decodes whole sequences over a KV cache: every rank of a context group
    // decodes the same one alone, the ring set aside meanwhile
    model_->set_context_parallel(nullptr);
    summary.sample = generate(*model_, *tokenizer_, sample_options);
    model_->set_context_parallel(context_parallel_.get());
    if (comm_->rank() == 0 && !bench_)
      io::write_file_atomic((std::filesystem::path(config_.run.output_dir) / kRunSampleFile).string(),
                            summary.sample + "\n");
  }
}

}  // namespace shardtrain::train
