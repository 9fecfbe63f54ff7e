// Who in Python called dtrain, for the flight record (comm/flight_recorder.h): each binding
// through which a Python program calls a collective or a send holds a PythonCaller while it
// calls, and the calls recorded meanwhile name the program's innermost two frames of its own
// ("train.py:42 in step <- train.py:88 in main"), not torch's, dtrain's or the standard
// library's (common/python_library.h).
//
// Taking the frames needs the GIL: a binding that holds it pays a walk of a few frames and a
// table lookup; one that torch calls with the GIL released (the c10d backend) takes it back for
// that long, as torch's own flight recorder does. A thread Python never ran on (autograd's, a
// group's) records no frames.
#pragma once

#include <cstdint>

#include "comm/flight_recorder.h"

namespace dtrain::python {

// The flight recorder's site of this thread's Python caller; 0 when there is none.
uint32_t python_call_site();

class PythonCaller {
 public:
  PythonCaller() : site_(python_call_site()) {}

 private:
  comm::FlightRecorder::PythonSite site_;
};

}  // namespace dtrain::python
