// The fatal-signal report (see the header). The handler calls only what is safe inside a
// signal handler: write(2), backtrace (its library is loaded at install, so its first call
// allocates nothing later), backtrace_symbols_fd, sigaction and raise; numbers are formatted
// by hand into a stack buffer.
#include "core/crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/build_info.h"

namespace shardtrain::crash_report {

#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer's own report of a fault says more: nothing is installed under it.
void install(const char*) {}
void set_rank(int) {}
#else
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
constexpr int kMaxFrames = 64;

std::atomic<int> g_rank{-1};
std::atomic<bool> g_installed{false};
std::atomic<bool> g_reporting{false};
const char* g_program = "shardtrain";
const char* g_commit = "";
char g_alt_stack[64 * 1024];  // a stack overflow's SIGSEGV still gets a stack to report on

// A line assembled in a fixed buffer (no allocation), written out at once.
struct Line {
  char text[1024];
  size_t n = 0;
  Line& add(const char* s) {
    while (*s != '\0' && n + 1 < sizeof text) text[n++] = *s++;
    return *this;
  }
  Line& add_int(long long v) {
    char digits[24];
    int k = 0;
    const bool negative = v < 0;
    unsigned long long u = negative ? 0ull - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
    do {
      digits[k++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u != 0);
    if (negative) add("-");
    while (k > 0 && n + 1 < sizeof text) text[n++] = digits[--k];
    return *this;
  }
  Line& add_hex(uintptr_t v) {
    char digits[20];
    int k = 0;
    do {
      digits[k++] = "0123456789abcdef"[v % 16];
      v /= 16;
    } while (v != 0);
    add("0x");
    while (k > 0 && n + 1 < sizeof text) text[n++] = digits[--k];
    return *this;
  }
  void write_to(int fd) {
    size_t done = 0;
    while (done < n) {
      const ssize_t w = ::write(fd, text + done, n - done);
      if (w <= 0) return;
      done += static_cast<size_t>(w);
    }
  }
};

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV (invalid memory access)";
    case SIGBUS: return "SIGBUS (bus error: a mapped file shrank, or a misaligned access)";
    case SIGFPE: return "SIGFPE (arithmetic error)";
    case SIGILL: return "SIGILL (illegal instruction: a build for another CPU?)";
    case SIGABRT: return "SIGABRT (aborted)";
    default: return "a fatal signal";
  }
}

void on_fatal_signal(int sig, siginfo_t* info, void*) {
  // a fault inside the report (or a second thread's) goes straight to the default action
  if (!g_reporting.exchange(true)) {
    Line head;
    head.add("\n").add(g_program).add(": fatal signal ").add(signal_name(sig));
    // si_code <= 0: sent by kill, raise or abort (si_pid the sender), not a fault (si_addr)
    const bool sent = info != nullptr && info->si_code <= 0;
    const bool sent_by_another = sent && info->si_pid != ::getpid();
    if (sent_by_another) head.add(" sent by process ").add_int(info->si_pid);
    if (!sent && info != nullptr) head.add(" at address ").add_hex(reinterpret_cast<uintptr_t>(info->si_addr));
    const int rank = g_rank.load();
    if (rank >= 0) head.add(" on rank ").add_int(rank);
    head.add(" (process ").add_int(::getpid()).add(", build ").add(g_commit).add(")\n");
    if (sent_by_another)
      head.add("Another process ended this one; where it stood:\n");
    else
      head.add("This is a bug in ").add(g_program).add(" or in a library it called; please report it with this text.\n");
    head.add("Stack, innermost first (c++filt reads the names; addr2line -f -C -e BINARY OFFSET names a frame ")
        .add("shown as binary(+OFFSET)):\n");
    head.write_to(STDERR_FILENO);
    void* frames[kMaxFrames];
    const int n = ::backtrace(frames, kMaxFrames);
    ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  }
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  ::sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);  // delivered when this handler returns (the signal is blocked inside it)
}

}  // namespace

void install(const char* program) {
  if (g_installed.exchange(true)) return;
  g_program = program;
  g_commit = build_commit();
  void* warm[1];
  (void)::backtrace(warm, 1);  // loads the unwinder now, not inside the handler
  stack_t ss;
  std::memset(&ss, 0, sizeof ss);
  ss.ss_sp = g_alt_stack;
  ss.ss_size = sizeof g_alt_stack;
  ::sigaltstack(&ss, nullptr);
  for (int sig : kSignals) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    ::sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

void set_rank(int rank) { g_rank.store(rank); }
#endif

}  // namespace shardtrain::crash_report
