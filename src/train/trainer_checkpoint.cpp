// The trainer's checkpoints: a step saved now or copied to host memory and written on a
// thread while training goes on (checkpoint.async), and the ranks' agreement on when such a
// checkpoint is complete everywhere and becomes `latest`.
#include <chrono>
#include <filesystem>
#include <exception>
#include <utility>

#include <fmt/format.h>

#include "core/allocator.h"
#include "core/log.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/trainer.h"

namespace shardtrain::train {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

Trainer::SavedStep Trainer::save_step(int64_t step, bool async) {
  if (pending_checkpoint_) commit_pending_checkpoint();  // an earlier asynchronous one first
  const auto t0 = std::chrono::steady_clock::now();
  const int keep = static_cast<int>(config_.checkpoint.keep);
  if (!async) {
    const std::string dir = save_checkpoint(checkpoint_root(), step, model_->config(), tokenizer_source(), *store_,
                                            optimizer_.get(), *comm_, keep, &checkpoint_staging_, config_toml(config_));
    const double seconds = seconds_since(t0);
    return {fmt::format("checkpoint  step {:>5}  {} ({:.1f} s)", step, dir, seconds), seconds};
  }
  pending_checkpoint_ = begin_checkpoint(checkpoint_root(), step, model_->config(), tokenizer_source(), *store_,
                                         optimizer_.get(), *comm_, keep, &checkpoint_staging_, true,
                                         config_toml(config_));
  checkpoint_step_ = step;
  checkpoint_error_ = nullptr;
  checkpoint_written_ = false;
  PendingCheckpoint* c = pending_checkpoint_.get();
  checkpoint_writer_ = std::jthread([this, c] {
    try {
      c->write();
    } catch (...) {
      checkpoint_error_ = std::current_exception();
    }
    checkpoint_written_ = true;
  });
  return {fmt::format("checkpoint  step {:>5}  {} copied to host memory in {:.1f} s; writing while training goes on",
                      step, format_bytes(c->bytes()), seconds_since(t0)),
          -1.0};
}

bool Trainer::all_ranks_wrote_checkpoint() {
  Tensor done = Tensor::empty({1}, DType::kI64, Device::cpu(), "checkpoint written");
  done.data<int64_t>()[0] = checkpoint_written_ ? 1 : 0;
  comm_->all_reduce(done, dist::ReduceOp::kSum);
  return done.data<int64_t>()[0] == comm_->world_size();
}

void Trainer::commit_pending_checkpoint() {
  const auto t0 = std::chrono::steady_clock::now();
  if (checkpoint_writer_.joinable()) checkpoint_writer_.join();
  const double waited = seconds_since(t0);
  const std::unique_ptr<PendingCheckpoint> c = std::move(pending_checkpoint_);
  const std::string dir = c->commit(*comm_, std::exchange(checkpoint_error_, nullptr));
  log::info(fmt::format("checkpoint  step {:>5}  {} is `latest`{}", c->step(), dir,
                        waited >= 0.05 ? fmt::format(" (waited {:.1f} s for the writing)", waited) : std::string()));
}

void Trainer::export_finished_run() {
  namespace fs = std::filesystem;
  if (config_.export_.folder.empty()) return;
  const fs::path folder(config_.export_.folder);
  const fs::path saved = fs::path(complete_checkpoint_) / "metadata.json";
  std::error_code ec1, ec2;
  const auto exported = fs::last_write_time(folder / "config.json", ec1), checkpointed = fs::last_write_time(saved, ec2);
  if (!ec1 && !ec2 && exported >= checkpointed) return;  // exported after the last save
  if (comm_->rank() == 0)
    log::info(fmt::format("export.folder `{}` is {} the last checkpoint; exporting it again from `{}`",
                          config_.export_.folder, ec1 ? "missing, or not a whole export, beside" : "older than",
                          complete_checkpoint_));
  std::exception_ptr failed;
  if (comm_->rank() == 0) {
    try {
      ExportOptions eo;
      eo.folder = config_.export_.folder;
      eo.dtype = parse_dtype(config_.export_.dtype, "export.dtype");
      eo.max_shard_bytes = config_.export_.max_shard_mb * 1000 * 1000;
      eo.tokenizer_source = tokenizer_source();
      export_checkpoint(complete_checkpoint_, eo);
      log::info(fmt::format("exported a Hugging Face folder to {} ({})", eo.folder, config_.export_.dtype));
    } catch (...) {
      failed = std::current_exception();
    }
  }
  // every rank learns whether rank 0's export worked, and fails with it
  Tensor ok = Tensor::empty({1}, DType::kI64, Device::cpu(), "export written");
  ok.data<int64_t>()[0] = failed ? 0 : 1;
  comm_->broadcast(ok, 0);
  if (failed) std::rethrow_exception(failed);
  ST_CHECK(ok.data<int64_t>()[0] == 1, "rank 0 failed to export the finished run to `", config_.export_.folder, "`");
}

}  // namespace shardtrain::train
