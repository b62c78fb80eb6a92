// training.nonfinite_skips and the error for an update that left NaN or inf behind.
#include "train/nonfinite.h"

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"

namespace shardtrain::train {

bool NonfiniteSkips::skip(int64_t step, double loss, double grad_norm) {
  const bool loss_ok = std::isfinite(loss), norm_ok = std::isfinite(grad_norm);
  if (loss_ok && norm_ok) {
    in_a_row_ = 0;
    return false;
  }
  const std::string what = !loss_ok && !norm_ok ? fmt::format("the loss is {} and the gradient norm is {}", loss, grad_norm)
                           : !loss_ok           ? fmt::format("the loss is {}", loss)
                                                : fmt::format("the gradient norm is {}", grad_norm);
  ++in_a_row_;
  if (allowed_ == 0)
    detail::throw_error(__FILE__, __LINE__,
                        fmt::format("step {}: {}; lower optimizer.lr or check the data (training.nonfinite_skips = 0 "
                                    "stops at the first such step)",
                                    step, what));
  ST_CHECK(in_a_row_ <= allowed_, "step ", step, ": ", what, ", the ", in_a_row_,
           " steps in a row whose loss or gradient norm is not finite, more than training.nonfinite_skips = ",
           allowed_, " allows: the run diverged; lower optimizer.lr or check the data, then resume from the last "
           "checkpoint");
  ++total_;
  log::warn(fmt::format("step {}: {}; skipped (no optimizer update, the batch is used up): {} of at most {} in a row "
                        "(training.nonfinite_skips)",
                        step, what, in_a_row_, allowed_));
  return true;
}

void throw_nonfinite_update(int64_t step, const std::vector<std::string>& local, int64_t ranks, int64_t world,
                            double lr) {
  constexpr size_t kNamed = 4;
  std::string where;
  for (size_t i = 0; i < local.size() && i < kNamed; ++i) where += (i == 0 ? "" : ", ") + local[i];
  if (local.size() > kNamed) where += fmt::format(" and {} more parameters", local.size() - kNamed);
  if (local.empty()) where = "the shards of another rank (its error names them)";
  const std::string ranks_part = world > 1 ? fmt::format(" ({} of the {} ranks found some)", ranks, world) : "";
  detail::throw_error(__FILE__, __LINE__,
                      fmt::format("step {}: the AdamW update left NaN or inf in {}{}; stopped before saving it, so the "
                                  "checkpoints already written (and `latest`) are untouched; lower optimizer.lr (this "
                                  "step's learning rate: {:g}) or check the data, then resume from the last checkpoint",
                                  step, where, ranks_part, lr));
}

}  // namespace shardtrain::train
