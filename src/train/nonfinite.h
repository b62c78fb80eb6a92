// NaN and inf in training: a step whose gradient norm or loss is not finite is skipped (no
// update), at most training.nonfinite_skips in a row; an update that leaves NaN or inf in the
// master weights or AdamW's state ends the run before anything of it is saved.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::train {

// training.nonfinite_skips over a run. Every rank passes the same all-reduced loss and norm,
// so all ranks decide alike.
class NonfiniteSkips {
 public:
  explicit NonfiniteSkips(int64_t allowed_in_a_row) : allowed_(allowed_in_a_row) {}

  // The step's loss and gradient norm (before clipping): false when both are finite (the count
  // in a row starts again); true when the step is to be skipped (a warning is logged); an
  // error naming the step, what was not finite and the key once more than the allowed number
  // of steps in a row were not finite.
  bool skip(int64_t step, double loss, double grad_norm);
  int64_t total() const { return total_; }  // steps skipped so far

 private:
  int64_t allowed_;
  int64_t in_a_row_ = 0, total_ = 0;
};

// The error for step `step`'s update, which left NaN or inf behind: `local` names this rank's
// parameters (optim::AdamW::nonfinite_parameters), `ranks` of the `world` ranks found some;
// `lr` is the step's learning rate.
[[noreturn]] void throw_nonfinite_update(int64_t step, const std::vector<std::string>& local, int64_t ranks,
                                         int64_t world, double lr);

}  // namespace shardtrain::train
