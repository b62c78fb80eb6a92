// The fatal-signal report: a fault in a process that installed it prints the signal, the
// address, the rank, the build and a stack of named frames on stderr, and the process still
// dies of the signal itself (the exit status and core files stay what they were).
#include "core/crash_report.h"

#include <signal.h>
#include <unistd.h>

#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "core/build_info.h"

namespace shardtrain::crash_report {
namespace {

// Not inlined into the death test's statement, so that the stack shows a frame of this file.
[[gnu::noinline]] void write_through(volatile int* p) { *p = 7; }

// `text` matched literally by a death test's extended regular expression.
std::string literally(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// Each death test forks a process that installs the report and then dies.
class CrashReportDeathTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(__SANITIZE_ADDRESS__)
    GTEST_SKIP() << "AddressSanitizer reports faults itself; the report is not installed under it";
#endif
    GTEST_FLAG_SET(death_test_style, "threadsafe");
  }
};

TEST_F(CrashReportDeathTest, AFaultIsReportedAndTheProcessStillDiesOfIt) {
  const std::string expected = std::string("crash_report_test: fatal signal SIGSEGV \\(invalid memory access\\) at ") +
                               "address 0x0 on rank 3 \\(process [0-9]+, build " + literally(build_commit()) +
                               "\\).*Stack.*\\[0x[0-9a-f]+\\]";
  EXPECT_EXIT(
      {
        install("crash_report_test");
        set_rank(3);
        write_through(nullptr);
      },
      testing::KilledBySignal(SIGSEGV), expected);
}

TEST_F(CrashReportDeathTest, AnAbortIsReportedWithoutAnAddress) {
  EXPECT_EXIT(
      {
        install("crash_report_test");
        ::raise(SIGABRT);
      },
      testing::KilledBySignal(SIGABRT), "crash_report_test: fatal signal SIGABRT \\(aborted\\) \\(process");
}

// A fatal signal another process sends is no fault here: the report names the sender, and no
// address.
TEST_F(CrashReportDeathTest, ASignalSentByAnotherProcessNamesTheSender) {
  EXPECT_EXIT(
      {
        install("crash_report_test");
        const pid_t target = ::getpid();
        if (::fork() == 0) {
          ::kill(target, SIGSEGV);
          ::_exit(0);
        }
        for (;;) ::pause();
      },
      testing::KilledBySignal(SIGSEGV),
      "crash_report_test: fatal signal SIGSEGV \\(invalid memory access\\) sent by process [0-9]+ \\(process "
      "[0-9]+, build [^)]*\\)\nAnother process ended this one");
}

}  // namespace
}  // namespace shardtrain::crash_report
