// The trainer's evaluation: the held-out loss over eval.batches global batches, each data-
// parallel rank its part (a context group's ranks each their chunks of it), and each source's of a mix (data.mix); with checkpoint.on_signal the
// ranks agree before every batch whether to stop. The last global batch may be partial (a
// rank's part past the split's end counts no token), so the loss is the sum over every counted
// token divided by their number, whatever the batches held.
#include <algorithm>

#include <fmt/format.h>

#include "train/stop_signals.h"
#include "train/trainer.h"
#include "train/training_data.h"
#include "train/watchdog.h"

namespace shardtrain::train {

Trainer::Evaluation Trainer::evaluate(const StopSignals* stop) {
  const int64_t B = config_.training.batch_size, T = config_.training.seq_len;
  Tensor ids = Tensor::empty({B, T}, DType::kI32, Device::cpu(), "eval ids");
  Tensor targets = Tensor::empty({B, T}, DType::kI32, Device::cpu(), "eval targets");
  model::StepOptions so;
  so.loss_chunk_tokens = loss_chunk_tokens();
  // Global eval batch i is W x B sequences over the W data-parallel ranks; rank r evaluates
  // its part i*W + r (a tensor-parallel group the same part, split by rows). Every rank runs
  // the same number of forwards, since units are gathered collectively.
  // A context group evaluates its part together, each rank its chunks of every sequence.
  const int64_t W = data_ranks();
  const int cp = context_degree();
  const int64_t available = data_->eval_batches(B, T);
  // totals [loss, tokens] of the whole, then of each source of a mix
  const std::vector<std::string> parts = data_->eval_part_names();
  Tensor totals = Tensor::zeros({2 * (1 + static_cast<int64_t>(parts.size()))}, DType::kF64, Device::cpu(),
                                "eval totals");
  double* sums = totals.data<double>();
  const int64_t wanted = config_.eval.batches > 0 ? config_.eval.batches : available;  // 0: all of them
  const int64_t batches = std::min(wanted, (available + W - 1) / W);
  Tensor stop_flags = stop != nullptr ? Tensor::empty({3}, DType::kF64, Device::cpu(), "stop flags") : Tensor();
  for (int64_t i = 0; i < batches; ++i) {
    if (stop != nullptr) {  // a long evaluation must not hold a preempted run past its grace period
      write_stop_flags(stop_flags.data<double>(), stop->received());
      comm_->all_reduce(stop_flags, dist::ReduceOp::kSum);
      if (const StopAgreement agreed = agreed_stop(stop_flags.data<double>()); agreed.signal != 0) {
        Evaluation stopped;
        stopped.stop = agreed;
        stopped.batches_done = i;
        stopped.batches = batches;
        return stopped;
      }
    }
    if (watchdog_)
      watchdog_->watch(fmt::format("evaluation batch {} of {}", i + 1, batches), config_.parallel.timeout_s,
                       fmt::format("parallel.timeout_s = {:g}", config_.parallel.timeout_s));
    const int64_t index = i * W + data_rank();
    if (index < available) {
      data_->fill_eval(ids, targets, index);
    } else {  // this rank's part of the last global batch is past the split: it runs the forward with the others
      std::fill_n(ids.data<int32_t>(), B * T, 0);
      std::fill_n(targets.data<int32_t>(), B * T, model::StepOptions{}.ignore_index);
    }
    const model::LossSum r =
        cp > 1 ? model_->evaluate(model::context_shard(ids, cp, context_parallel_->rank()),
                                  model::context_shard(targets, cp, context_parallel_->rank()), so,
                                  document_mask_ ? model::context_shard(positions_of(ids), cp, context_parallel_->rank())
                                                 : Tensor())
               : model_->evaluate(ids, targets, so, positions_of(ids));
    sums[0] += r.loss_sum;
    sums[1] += static_cast<double>(r.tokens);
    if (!parts.empty()) {
      const int64_t p = 1 + data_->eval_part(index);
      sums[2 * p] += r.loss_sum;
      sums[2 * p + 1] += static_cast<double>(r.tokens);
    }
  }
  comm_->all_reduce(totals, dist::ReduceOp::kSum);
  const double loss = sums[0];
  const auto tokens = static_cast<int64_t>(sums[1]);
  Evaluation result;
  for (size_t p = 0; p < parts.size(); ++p)
    if (sums[2 * (p + 1) + 1] > 0) result.parts.emplace_back(parts[p], sums[2 * (p + 1)] / sums[2 * (p + 1) + 1]);
  ST_CHECK(tokens > 0, "evaluation: the held-out split (", data_->held_out_size(), ") gave no counted token in ",
           batches, " batch(es) of `training.batch_size` x `training.seq_len` + 1; raise `data.val_fraction`, or "
           "turn evaluation off with `eval.enabled` = false");
  result.loss = loss / static_cast<double>(tokens);
  result.batches_done = result.batches = batches;
  return result;
}

}  // namespace shardtrain::train
