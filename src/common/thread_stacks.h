// The C++ stack of every thread of this process, for a flight record's dump: which thread is
// stuck where. Each thread is asked by a real-time signal (kStackSignal) to write its own return
// addresses (glibc's backtrace()); the caller symbolizes them. A thread that blocks the signal,
// or does not run within the limit, is listed without a stack, and says so.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace dtrain {

struct ThreadStack {
  int tid = 0;
  std::string name;                 // /proc/self/task/TID/comm
  std::vector<std::string> frames;  // innermost first: "dtrain::comm::Pair::wait(...) +0x4c"
  std::string missing;              // why there is no stack, when there is none
};

// Every thread but the caller's, whose own stack is first in the list. Not from a signal
// handler; one call at a time (they serialize).
std::vector<ThreadStack> all_thread_stacks(
    std::chrono::milliseconds per_thread = std::chrono::milliseconds(200));

// "dtrain::DistributedDataParallel::finish_step() +0x4c (libdtrain_core.so)" for a code address.
std::string code_address_name(const void* address);

}  // namespace dtrain
