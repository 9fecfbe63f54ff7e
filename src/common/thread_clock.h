// The monotonic clock as the waits read it, remembering each thread's last reading.
//
// A wait reads the clock anyway (for its spin budget and its deadline) whenever it does not end
// at its first look, and after every sleep. What dates an event that follows a wait, the flight
// recorder's end of a small call, takes that reading instead of paying for one more: on the
// smallest collective a clock read is a visible part of the call (docs/performance.md).
#pragma once

#include "common/deadline.h"

namespace dtrain::thread_clock {

// Constant-initialized, so that reading it needs no guard.
inline thread_local Clock::time_point last_reading{};

// Reads the clock and remembers the reading as this thread's last.
inline Clock::time_point now() { return last_reading = Clock::now(); }

// This thread's last reading through now() (the clock's epoch if it never read one).
inline Clock::time_point last() { return last_reading; }

}  // namespace dtrain::thread_clock
