// A hang detector for runs of several ranks. When one rank fails, hangs or is stopped, the
// others wait for it in their next collective, forever: neither NCCL nor MPI has a deadline of
// its own. The watchdog, a thread of each rank, ends the process when the work it watches (a
// training step, an evaluation batch, a checkpoint's save, the export) makes no progress for
// that work's limit (progress: the work began, or this rank issued a collective, which sharded
// work does block by block, so a long step of many blocks is not taken for a hang; for saves
// also bytes written to files), or at once when a communicator reports
// an error of its own, with a message naming the work, the limit and the last collective this
// rank issued. The launcher (torchrun, mpirun, srun) then ends the other ranks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace shardtrain::dist {
struct CollectiveActivity;
}
namespace shardtrain::io {
struct WriteActivity;
}

namespace shardtrain::train {

class Watchdog {
 public:
  // What the watchdog does when it fires, on its own thread: by default (an empty Fire) the
  // message is logged as an error and the process exits with `exit_status` at once.
  using Fire = std::function<void(const std::string& message, int exit_status)>;
  // Polled about every poll_s: an error a communicator found (dist::Communicator::async_error), or empty.
  using PollError = std::function<std::string()>;

  static constexpr int kTimeoutExit = 124;  // timeout(1)'s status for a command that ran out of time
  static constexpr int kErrorExit = 1;

  explicit Watchdog(PollError poll_error, Fire fire = {}, double poll_s = 0.5);
  ~Watchdog() = default;  // thread_, destroyed first, asks its loop to stop (waking it) and joins it
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts watching `what` ("step 12"), replacing what was watched: the watchdog fires when,
  // still watched, it has gone `limit_s` seconds since it began and since the last collective
  // this process issued in it (and, with `writes`, since its last write to a file, io::write_activity()).
  // `setting` names the limit in the message ("parallel.timeout_s = 600").
  void watch(std::string what, double limit_s, std::string setting, bool writes = false);
  // Watches nothing (the sample at the end): only communicator errors fire.
  void idle();
  // Whether it has fired and its Fire has returned (with a Fire that returns).
  bool fired() const;

 private:
  void loop(std::stop_token stop);
  std::string timeout_message(const dist::CollectiveActivity& activity, const io::WriteActivity& writes,
                              double idle) const;  // with mutex_ held

  PollError poll_error_;
  Fire fire_;
  std::chrono::duration<double> poll_;
  mutable std::mutex mutex_;
  std::condition_variable_any wake_;
  std::string what_, setting_;  // what_ empty: idle
  double limit_s_ = 0;
  std::chrono::steady_clock::time_point since_;
  uint64_t issued_before_ = 0;  // collectives issued before `what` began
  bool writes_ = false;            // bytes written count as progress
  uint64_t written_before_ = 0;    // io::write_activity().bytes when `what` began
  bool fired_ = false;
  std::jthread thread_;  // last: starts once the rest is built
};

}  // namespace shardtrain::train
