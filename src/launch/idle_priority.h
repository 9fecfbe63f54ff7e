// Spares wait at the lowest CPU priority (SCHED_IDLE): where the ranks fill a machine's cores, a
// spare getting ready (importing, building its model, touching its memory) takes only the cycles
// they leave, and once given a place it is raised to the normal policy, every thread of it.
// Raising needs CAP_SYS_NICE (or an RLIMIT_NICE of 20): a launcher without it starts its spares at
// the normal priority, since a spare left at the idle one would be every step's straggler.
#pragma once

#include <sys/types.h>

#include <string>

namespace dtrain::launch {

// Whether this process may take a thread from SCHED_IDLE back to SCHED_OTHER (tried on a thread
// of its own).
bool can_leave_idle_priority();

// Sets every thread of process `pid` to SCHED_OTHER, those it starts meanwhile included. Returns
// why it could not ("" when done).
std::string leave_idle_priority(pid_t pid);

}  // namespace dtrain::launch
