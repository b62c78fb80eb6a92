// Signal handlers that only record the signal (async-signal-safe: one lock-free atomic).
#include "train/stop_signals.h"

#include <atomic>
#include <csignal>

#include "core/error.h"

namespace shardtrain::train {
namespace {

std::atomic<int> g_received{0};
std::atomic<bool> g_installed{false};
struct sigaction g_previous[3];
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int signal) {
  int none = 0;
  if (!g_received.compare_exchange_strong(none, signal) && signal == SIGINT) {
    // a second Ctrl-C: the default action (the process ends now)
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
}

}  // namespace

StopSignals::StopSignals() {
  ST_CHECK(!g_installed.exchange(true), "StopSignals: the handlers are installed already");
  g_received = 0;
  struct sigaction action = {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and waits go on; the step loop looks at the flag
  for (int i = 0; i < 3; ++i) sigaction(kStopSignals[i], &action, &g_previous[i]);
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 3; ++i) sigaction(kStopSignals[i], &g_previous[i], nullptr);
  g_installed = false;
}

int StopSignals::received() const { return g_received.load(); }

bool StopSignals::installed() { return g_installed.load(); }

void write_stop_flags(double* flags, int received) {
  for (int k = 0; k < 3; ++k) flags[k] = received == kStopSignals[k] ? 1.0 : 0.0;
}

StopAgreement agreed_stop(const double* summed_flags) {
  StopAgreement a;
  for (int k = 2; k >= 0; --k) {
    if (summed_flags[k] > 0) a.signal = kStopSignals[k];
    a.ranks += static_cast<int64_t>(summed_flags[k]);
  }
  return a;
}

const char* stop_signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace shardtrain::train
