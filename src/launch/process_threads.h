// Changing every thread of another process (its scheduling policy, its CPUs): Linux applies both
// per thread, so a process already running is changed through /proc/PID/task, one thread at a
// time, while it may be starting more.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <string_view>

namespace dtrain::launch {

enum class ThreadChange {
  kNone,     // the thread was as wanted already, or is gone
  kChanged,  // it is now
  kFailed,   // errno says why
};

// Calls `change` on every thread of process `pid`, the threads it starts meanwhile included:
// passes over its threads until one finds nothing to change (a thread started during a pass
// takes the settings of its parent, which may not have been changed yet). Returns why it could
// not ("" when done), naming `what` it did.
std::string change_every_thread(pid_t pid, std::string_view what,
                                const std::function<ThreadChange(pid_t tid)>& change);

}  // namespace dtrain::launch
