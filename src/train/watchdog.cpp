// The watchdog's thread: wakes every poll interval, checks how long the watched work has gone
// without progress and the communicators' errors, and fires once.
#include "train/watchdog.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include <fmt/format.h>

#include "core/log.h"
#include "dist/communicator.h"
#include "io/safetensors_writer.h"

namespace shardtrain::train {

Watchdog::Watchdog(PollError poll_error, Fire fire, double poll_s)
    : poll_error_(std::move(poll_error)), fire_(std::move(fire)), poll_(poll_s) {
  if (!fire_)
    fire_ = [](const std::string& message, int exit_status) {
      log::error(message);
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(exit_status);  // the main thread waits in a collective that will not return
    };
  thread_ = std::jthread([this](std::stop_token stop) { loop(stop); });
}

void Watchdog::watch(std::string what, double limit_s, std::string setting, bool writes) {
  const uint64_t issued = dist::collective_activity().issued, written = io::write_activity().bytes;
  const std::lock_guard lock(mutex_);
  what_ = std::move(what);
  setting_ = std::move(setting);
  limit_s_ = limit_s;
  since_ = std::chrono::steady_clock::now();
  issued_before_ = issued;
  writes_ = writes;
  written_before_ = written;
}

void Watchdog::idle() {
  const std::lock_guard lock(mutex_);
  what_.clear();
}

bool Watchdog::fired() const {
  const std::lock_guard lock(mutex_);
  return fired_;
}

std::string Watchdog::timeout_message(const dist::CollectiveActivity& a, const io::WriteActivity& w,
                                      double idle) const {
  const uint64_t issued = a.issued - issued_before_, written = writes_ ? w.bytes - written_before_ : 0;
  const std::string collectives =
      issued == 0 ? std::string("this rank issued no collective in it")
                  : fmt::format("this rank issued {} collective{} in it, the last ({}) {:.1f} s ago", issued,
                                issued == 1 ? "" : "s", a.last, a.seconds_ago);
  std::string where;
  if (written > 0 && (issued == 0 || w.seconds_ago < a.seconds_ago))
    // its last progress was a write: likelier stuck in its filesystem than waiting for the others
    where = fmt::format("{}, and wrote {} bytes to files, the last {:.1f} s ago, since when it may be stuck in its "
                        "filesystem itself, or wait for another rank, which has then probably failed, hung or been "
                        "stopped",
                        collectives, written, w.seconds_ago);
  else if (issued == 0)
    where = collectives + ": it may be stuck itself, or wait for another rank, which has probably failed, hung or been "
                          "stopped";
  else
    where = collectives + ", and waits for another rank, which has probably failed, hung or been stopped" +
            (written > 0 ? fmt::format(" (it wrote {} bytes to files in it)", written) : std::string());
  return fmt::format("watchdog: {} has made no progress for {:.1f} s ({}): {}. Ending the run with exit status {}; "
                     "resume from the last checkpoint with --checkpoint.resume=auto",
                     what_, idle, setting_, where, kTimeoutExit);
}

void Watchdog::loop(std::stop_token stop) {
  std::unique_lock lock(mutex_);
  while (!stop.stop_requested() && !fired_) {
    wake_.wait_for(lock, stop, poll_, [] { return false; });
    if (stop.stop_requested()) return;
    lock.unlock();
    const std::string error = poll_error_ ? poll_error_() : std::string();
    lock.lock();
    std::string message;
    int status = 0;
    if (!error.empty()) {
      message = fmt::format("watchdog: a communicator reports an error{}: {}. Ending the run with exit status {}",
                            what_.empty() ? std::string() : " during " + what_, error, kErrorExit);
      status = kErrorExit;
    } else if (!what_.empty()) {
      // progress: the work began, or this rank issued a collective since (or wrote to a file)
      const dist::CollectiveActivity a = dist::collective_activity();
      const io::WriteActivity w = io::write_activity();
      const double idle = std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
      double quiet = a.issued > issued_before_ ? std::min(idle, a.seconds_ago) : idle;
      if (writes_ && w.bytes > written_before_) quiet = std::min(quiet, w.seconds_ago);
      if (quiet >= limit_s_) {
        message = timeout_message(a, w, quiet);
        status = kTimeoutExit;
      }
    }
    if (message.empty()) continue;
    what_.clear();
    lock.unlock();
    fire_(message, status);
    lock.lock();
    fired_ = true;  // once fire_ has returned: what it recorded is there for whoever sees this
    return;
  }
}

}  // namespace shardtrain::train
