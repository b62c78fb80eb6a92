// Stopping a run cleanly on a signal: SIGTERM (a scheduler's preemption, `kill`), SIGUSR1
// (Slurm's `--signal=USR1@SECONDS` warning) and SIGINT (Ctrl-C) set a flag that the trainer
// reads once a step; the ranks agree on it, finish the step, save a checkpoint and exit. A
// second SIGINT ends the process at once, as if no handler were there.
#pragma once

#include <csignal>
#include <cstdint>

namespace shardtrain::train {

// The signals handled. Where ranks received different ones, the run names the first listed.
inline constexpr int kStopSignals[3] = {SIGTERM, SIGUSR1, SIGINT};

// Installs the handlers for its lifetime and restores the previous ones after; the flag
// starts clear. One at a time per process.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The first signal received since construction, or 0.
  int received() const;
  // Whether a StopSignals exists now (the handlers are in place).
  static bool installed();
};

// The ranks' agreement on a stop, through a sum over the ranks of 3 flags per rank: each rank
// writes its flags (1 at k where it received kStopSignals[k], the others 0), the flags are
// summed, and every rank stops for the first signal listed that some rank received.
void write_stop_flags(double* flags, int received);
struct StopAgreement {
  int signal = 0;      // 0: none
  int64_t ranks = 0;   // the ranks that received one
};
StopAgreement agreed_stop(const double* summed_flags);

// "SIGTERM", "SIGINT", "SIGUSR1", or "a signal".
const char* stop_signal_name(int signal);

}  // namespace shardtrain::train
