#include "support/crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cstdio>
#include <initializer_list>

namespace dtrain::testing {
namespace {

int g_rank = -1;

void write_text(const char* text) {
  [[maybe_unused]] auto n = ::write(STDERR_FILENO, text, ::strlen(text));
}

void on_fatal_signal(int sig) {
  char line[96];
  std::snprintf(line, sizeof line, "[rank %d] died of signal %d (%s); its stack:\n", g_rank, sig,
                ::strsignal(sig));
  write_text(line);
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  write_text("(resolve a frame 'binary(+0xOFFSET)' with: addr2line -Cfe binary 0xOFFSET)\n");
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void report_crashes(int rank) {
  g_rank = rank;
  // backtrace() loads libgcc on its first call, which is not safe inside a signal handler.
  void* warm[1];
  ::backtrace(warm, 1);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::signal(sig, on_fatal_signal);
}

}  // namespace dtrain::testing
