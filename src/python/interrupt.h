// Ctrl-C during a blocking call of the Python modules.
//
// Python's SIGINT handler only sets a flag that the interpreter looks at between bytecodes, never
// while C++ waits with the GIL released, so a collective blocked on a stuck peer would ignore
// Ctrl-C until its timeout. While an InterruptibleWait is alive, a handler chained in front of
// Python's (installed at the first use, once Python's own is in place) wakes a thread that
// aborts the waiting group; the wait then fails with AbortedError, and raise_if_interrupted()
// turns that into Python's KeyboardInterrupt carrying dtrain's text. The group is unusable after
// (its peers may be mid-collective): the job stops, as Ctrl-C means.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include <pybind11/pybind11.h>

#include "python/python_site.h"

namespace dtrain {
class ProcessGroup;
}

namespace dtrain::python {

class InterruptibleWait {
 public:
  // `what` says what the call waits for ("allreduce of 4096 f32 on group world").
  InterruptibleWait(std::shared_ptr<ProcessGroup> group, std::string what);
  ~InterruptibleWait();
  InterruptibleWait(const InterruptibleWait&) = delete;
  InterruptibleWait& operator=(const InterruptibleWait&) = delete;

  // True when SIGINT aborted the group during this wait.
  bool interrupted() const;
  // Call with the GIL held after the wait failed: when SIGINT ended it, runs Python's signal
  // handlers and raises KeyboardInterrupt (pybind11::error_already_set) naming what was
  // interrupted; otherwise returns and the caller rethrows the wait's own error.
  void raise_if_interrupted() const;

  struct Entry;

 private:
  std::shared_ptr<Entry> entry_;
};

// Runs `call` (which blocks on `group`) with the GIL released, Ctrl-C aborting it, its calls
// recorded as the Python caller's (python_site.h). Call with the GIL held.
template <typename Call>
auto run_interruptibly(const std::shared_ptr<ProcessGroup>& group, std::string what, Call&& call) {
  const PythonCaller caller;
  InterruptibleWait wait(group, std::move(what));
  try {
    pybind11::gil_scoped_release release;
    return call();
  } catch (...) {
    wait.raise_if_interrupted();
    throw;
  }
}

}  // namespace dtrain::python
