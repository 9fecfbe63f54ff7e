// A forked rank that dies of a signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) prints its
// stack to stderr before it dies, so that a crash on a machine without a debugger (a lent GPU
// machine) still says where; the test still sees the signal.
#pragma once

namespace dtrain::testing {

void report_crashes(int rank);

}  // namespace dtrain::testing
